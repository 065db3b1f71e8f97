//! Two network namespaces joined by a veth pair: two "nodes" on this machine that reach each other only
//! over that link, whose packets a test can drop (root only: `ip netns` needs CAP_SYS_ADMIN).

use std::process::{Command, Stdio};

pub struct TwoNodes {
    pub ns: [String; 2],
    veth: [String; 2],
    /// Each node's address on the link.
    pub addr: [String; 2],
}

fn ip(args: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
}

impl TwoNodes {
    /// The two namespaces, on `10.231.<subnet>.1` and `.2`; None (the test says SKIPPED, or fails where
    /// TRAINYARD_REQUIRE names `netns`) where namespaces cannot be made.
    pub fn create(test: &str, subnet: u8) -> Option<TwoNodes> {
        let tag = format!("ty{}s{subnet}", std::process::id() % 100000);
        let ns = [format!("{tag}a"), format!("{tag}b")];
        let created = ip(&["netns", "add", &ns[0]]);
        if !matches!(&created, Ok(o) if o.status.success()) {
            super::skip(
                "netns",
                &format!(
                    "{test}: `ip netns add` is not permitted here (needs root and CAP_SYS_ADMIN): {:?}",
                    created.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                ),
            );
            return None;
        }
        let nodes = TwoNodes {
            veth: [format!("{tag}v0"), format!("{tag}v1")],
            addr: [format!("10.231.{subnet}.1"), format!("10.231.{subnet}.2")],
            ns,
        };
        let (ns, v, a) = (&nodes.ns, &nodes.veth, &nodes.addr);
        let (a0, a1) = (format!("{}/24", a[0]), format!("{}/24", a[1]));
        for cmd in [
            vec!["netns", "add", &ns[1]],
            vec!["link", "add", &v[0], "type", "veth", "peer", "name", &v[1]],
            vec!["link", "set", &v[0], "netns", &ns[0]],
            vec!["link", "set", &v[1], "netns", &ns[1]],
            vec!["-n", &ns[0], "addr", "add", &a0, "dev", &v[0]],
            vec!["-n", &ns[1], "addr", "add", &a1, "dev", &v[1]],
            vec!["-n", &ns[0], "link", "set", &v[0], "up"],
            vec!["-n", &ns[1], "link", "set", &v[1], "up"],
            vec!["-n", &ns[0], "link", "set", "lo", "up"],
            vec!["-n", &ns[1], "link", "set", "lo", "up"],
        ] {
            let out = ip(&cmd).unwrap();
            assert!(
                out.status.success(),
                "ip {}: {}",
                cmd.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Some(nodes)
    }

    /// `program` to run inside node `n`'s namespace.
    pub fn command(&self, n: usize, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns[n], program]);
        cmd
    }

    /// Drop every packet on the link, both ways, or stop dropping. The link stays up and its routes and
    /// connections stay open, so the peers hear nothing rather than an error: a queue of length zero on
    /// each end (`pfifo limit 0`, in every kernel, where netem may be missing).
    pub fn drop_packets(&self, drop: bool) {
        for n in 0..2 {
            let (ns, dev) = (self.ns[n].as_str(), self.veth[n].as_str());
            let args: Vec<&str> = match drop {
                true => vec![
                    "-n", ns, "qdisc", "add", "dev", dev, "root", "pfifo", "limit", "0",
                ],
                false => vec!["-n", ns, "qdisc", "del", "dev", dev, "root"],
            };
            let out = Command::new("tc").args(&args).output().unwrap();
            assert!(
                out.status.success(),
                "tc {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}
