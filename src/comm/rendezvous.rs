//! Every rank's arrival at the rendezvous, counted in the store before the process group forms, so a
//! node that does not come (its launcher killed, its machine gone) is named: the ranks that came wait for
//! it up to `trainer.rendezvous_timeout_s`, then stop with [`NodeMissing`], which ends them with
//! [`super::EXIT_NODE_MISSING`] (their launchers report it and do not restart). A node that comes back
//! within the timeout (the same command started there again) completes the group. The ranks also agree
//! whether this is a restart: if any of them was restarted, all resume from the run's newest checkpoint,
//! a node started afresh included.

use super::c10d::Store;
use super::env::Cluster;
use std::time::{Duration, Instant};

pub use super::NodeMissing;

/// The keys of the rendezvous (each round's store is new: rank 0 hosts it afresh).
const PREFIX: &str = "trainyard/rendezvous";

/// This store is an earlier round's (its group formed already, or this rank was counted in it): the
/// rank reconnects, as a restarted rank may reach the old rank 0's store before it is gone.
#[derive(Debug)]
pub struct Stale;

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the rendezvous store is an earlier round's")
    }
}

impl std::error::Error for Stale {}

/// Count this rank in, wait for the others until `deadline`, and return whether any rank is a restart.
/// On a timeout rank 0 (`hosts`) leaves the message in the store for the others, so every rank names
/// the same missing nodes and none mistakes the closing store for node 0's loss.
pub fn arrive(
    store: &Store,
    cluster: &Cluster,
    rank: usize,
    restarting: bool,
    deadline: Instant,
    timeout_s: u64,
) -> anyhow::Result<bool> {
    let p = PREFIX;
    let hosts = rank == 0;
    if store.check(&format!("{p}/formed"))? || store.add(&format!("{p}/rank/{rank}/n"), 1)? != 1 {
        return Err(Stale.into());
    }
    // The restart flag first: once every rank has arrived, the flag's count is final.
    store.add(&format!("{p}/restarting"), i64::from(restarting))?;
    store.set(
        &format!("{p}/rank/{rank}"),
        cluster.node_rank.to_string().as_bytes(),
    )?;
    let (arrived, missing_key) = (format!("{p}/arrived"), format!("{p}/missing"));
    let host_gone = |e: anyhow::Error| -> anyhow::Error {
        NodeMissing(format!(
            "{}\n    (rank {rank}: {e:#})",
            missing_message(cluster, &[0], timeout_s)
        ))
        .into()
    };
    let mut count = store.add(&arrived, 1)?;
    while count < cluster.world_size as i64 {
        if !hosts && store.check(&missing_key).map_err(host_gone)? {
            let said = store.get(&missing_key).map_err(host_gone)?;
            return Err(NodeMissing(String::from_utf8_lossy(&said).into_owned()).into());
        }
        if Instant::now() >= deadline {
            let missing = missing_ranks(store, p, cluster.world_size)?;
            let message = missing_message(cluster, &missing, timeout_s);
            if hosts {
                store.set(&missing_key, message.as_bytes())?;
                // Long enough for the others (polling every 50 ms) to read it before the store closes.
                std::thread::sleep(Duration::from_secs(1));
            }
            return Err(NodeMissing(message).into());
        }
        std::thread::sleep(Duration::from_millis(50));
        count = store.add(&arrived, 0).map_err(host_gone)?;
    }
    if hosts {
        store.set(&format!("{p}/formed"), b"1")?;
    }
    Ok(store.add(&format!("{p}/restarting"), 0)? > 0)
}

fn missing_ranks(store: &Store, prefix: &str, world_size: usize) -> anyhow::Result<Vec<usize>> {
    let mut missing = Vec::new();
    for r in 0..world_size {
        if !store.check(&format!("{prefix}/rank/{r}"))? {
            missing.push(r);
        }
    }
    Ok(missing)
}

/// "node 1 (ranks 2, 3)" for each node with a missing rank, and what to do.
pub fn missing_message(cluster: &Cluster, missing: &[usize], timeout_s: u64) -> String {
    let per_node = cluster.local_world_size.max(1);
    let mut nodes: Vec<(usize, Vec<usize>)> = Vec::new();
    for &r in missing {
        match nodes.last_mut() {
            Some((n, ranks)) if *n == r / per_node => ranks.push(r),
            _ => nodes.push((r / per_node, vec![r])),
        }
    }
    let named: Vec<String> = nodes
        .iter()
        .map(|(n, ranks)| {
            let ranks: Vec<String> = ranks.iter().map(usize::to_string).collect();
            format!(
                "node {n} (rank{} {})",
                if ranks.len() == 1 { "" } else { "s" },
                ranks.join(", ")
            )
        })
        .collect();
    let which = nodes
        .iter()
        .map(|(n, _)| format!("NODE_RANK={n}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{} did not come to the rendezvous at {}:{} within trainer.rendezvous_timeout_s={timeout_s}s; \
         the others waited for it. It was not started, or its launcher is gone (killed, or its machine \
         lost).\n    To go on: start the same command on that node ({which}) and on the others, with \
         ckpt_path=auto (a run resumes from its newest checkpoint); or raise trainer.rendezvous_timeout_s \
         to wait longer",
        named.join(" and "),
        cluster.master_addr,
        cluster.master_port.unwrap_or(0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::env::{ClusterSource, Worker};

    fn free_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }

    fn cluster(nodes: usize, per_node: usize) -> Cluster {
        Cluster {
            launcher: ClusterSource::Lightning,
            node_rank: 0,
            num_nodes: nodes,
            local_world_size: per_node,
            world_size: nodes * per_node,
            master_addr: "127.0.0.1".into(),
            master_port: Some(0),
            worker: Some(Worker {
                rank: 0,
                local_rank: 0,
            }),
        }
    }

    /// Two ranks of a three-rank group arrive; the third's node is named when the wait ends.
    #[test]
    fn the_ranks_that_came_wait_then_name_the_node_that_did_not() {
        let port = free_port();
        let mut c = cluster(3, 1);
        c.master_port = Some(port);
        let timeout = Duration::from_millis(800);
        let host = Store::connect("127.0.0.1", port, true, 3, Duration::from_secs(5)).unwrap();
        let c1 = c.clone();
        let other = std::thread::spawn(move || {
            let store =
                Store::connect("127.0.0.1", port, false, 3, Duration::from_secs(5)).unwrap();
            let mut c1 = c1;
            c1.node_rank = 1;
            arrive(&store, &c1, 1, true, Instant::now() + 4 * timeout, 1)
        });
        // Rank 1 waits longer than rank 0: it still names the node rank 0 found missing, read from the
        // store before it closes, not node 0.
        let started = Instant::now();
        let mine = arrive(&host, &c, 0, false, Instant::now() + timeout, 1);
        assert!(started.elapsed() >= timeout);
        drop(host);
        for result in [mine, other.join().unwrap()] {
            let e = result.unwrap_err();
            let missing = e.downcast_ref::<NodeMissing>().expect("a NodeMissing");
            assert!(
                missing.0.starts_with("node 2 (rank 2) did not come"),
                "{missing}"
            );
            assert!(missing.0.contains("NODE_RANK=2"), "{missing}");
        }
    }

    /// When every rank comes, each learns whether any of them is a restart (rank 1's flag here), and a
    /// rank counted in again (a restarted rank on the old store) is sent to reconnect.
    #[rstest::rstest]
    #[case::one_restarted(true)]
    #[case::none_restarted(false)]
    fn every_rank_learns_whether_one_of_them_restarted(#[case] restarted: bool) {
        let port = free_port();
        let mut c = cluster(2, 1);
        c.master_port = Some(port);
        let deadline = Instant::now() + Duration::from_secs(20);
        let host = Store::connect("127.0.0.1", port, true, 2, Duration::from_secs(5)).unwrap();
        let c1 = c.clone();
        let other = std::thread::spawn(move || {
            let store =
                Store::connect("127.0.0.1", port, false, 2, Duration::from_secs(5)).unwrap();
            arrive(&store, &c1, 1, restarted, deadline, 20)
        });
        assert_eq!(
            arrive(&host, &c, 0, false, deadline, 20).unwrap(),
            restarted
        );
        assert_eq!(other.join().unwrap().unwrap(), restarted);
        let e = arrive(&host, &c, 0, false, deadline, 20).unwrap_err();
        assert!(e.downcast_ref::<Stale>().is_some(), "{e:#}");
    }

    #[test]
    fn missing_ranks_are_grouped_by_node() {
        let m = missing_message(&cluster(3, 2), &[2, 3, 5], 30);
        assert!(
            m.starts_with("node 1 (ranks 2, 3) and node 2 (rank 5) did not come"),
            "{m}"
        );
        assert!(m.contains("NODE_RANK=1, NODE_RANK=2"), "{m}");
    }
}
