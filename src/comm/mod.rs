//! Collectives and where this process sits among its peers; knows nothing of engines or strategies.
//! `env` reads the launcher's environment (torchrun > SLURM > MASTER_ADDR/NODE_RANK > single node);
//! `collective` is the trait strategies use, over host buffers and `tensor::Flat` vectors; `buckets` is
//! DDP's bucketing. Implementations: PyTorch's c10d across processes (`c10d`, feature `torch`: TCPStore
//! and Gloo through a C++ shim, `nccl` for CUDA tensors, and `reducer`, libtorch's DDP reducer that
//! averages during the backward pass), and between the threads of one process (`local`, DataParallel).
//! `join` turns a worker's environment into a live process group.

pub mod buckets;
pub mod collective;
pub mod env;
pub mod local;

#[cfg(feature = "torch")]
pub mod c10d;
#[cfg(feature = "torch")]
pub mod nccl;
#[cfg(feature = "torch")]
pub mod reducer;
#[cfg(feature = "torch")]
pub mod rendezvous;

/// A worker's exit code when a node did not come to the rendezvous in time (sysexits' EX_UNAVAILABLE):
/// its launcher reports the worker's message and does not restart it.
pub const EXIT_NODE_MISSING: u8 = 69;

/// A worker's exit code when a collective timed out (sysexits' EX_PROTOCOL): a peer took no part in it for
/// `trainer.collective_timeout_s`. Its node launcher names the rank still running (stopped, or stuck
/// outside the collective) as the one that stalled.
pub const EXIT_COLLECTIVE_TIMEOUT: u8 = 76;

/// Does this error say a collective timed out, rather than failed because a peer's connection closed?
/// Gloo says "Timed out waiting …ms for recv" when the peer is silent, "Read error [peer]: Connection
/// timed out" when the network stopped carrying its packets (the socket's own timeout is the
/// collective's; an S3 or store connection timing out is not this); NCCL's watchdog has its own words.
pub fn is_collective_timeout(message: &str) -> bool {
    message.contains("Timed out waiting")
        || (message.contains("gloo") && message.contains("Connection timed out"))
        || message.contains("Watchdog caught collective operation timeout")
}

/// Nodes that did not reach the rendezvous in time (`rendezvous::arrive`), or, said by a node launcher,
/// a worker that ended with [`EXIT_NODE_MISSING`].
#[derive(Debug)]
pub struct NodeMissing(pub String);

impl std::fmt::Display for NodeMissing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NodeMissing {}

pub use buckets::GradSync;
use collective::Collective;

/// The launch time the node launcher hands its workers, so every rank resolves `${now:...}` (and so the
/// run directory) the same way.
pub const NOW_ENV: &str = "TRAINYARD_NOW";

/// Set for workers started again after a failure: they resume from their run directory's newest
/// checkpoint (as a resumed sweep job does). Its value is the restart's number.
pub const RESTART_ENV: &str = "TRAINYARD_RESTART";

/// A worker inside a process group.
pub struct Distributed {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub node_rank: usize,
    pub num_nodes: usize,
    pub comm: std::sync::Arc<dyn Collective>,
    /// Some rank of this group was restarted (`trainer.max_restarts`): every rank resumes from the run's
    /// newest checkpoint, a node started afresh to rejoin it included.
    pub restarting: bool,
    /// Keeps the rendezvous open (rank 0 hosts it) for as long as the group lives (none: the ranks are
    /// threads of one process, `in_process`).
    #[cfg(feature = "torch")]
    _store: Option<c10d::Store>,
}

impl Distributed {
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }

    /// Rank `rank` of `comm`'s ranks, all threads of this process on one node (the in-process collective
    /// of `local`: a strategy's distributed path, exercised in any build).
    pub fn in_process(
        comm: std::sync::Arc<dyn Collective>,
        rank: usize,
        world_size: usize,
    ) -> Self {
        Distributed {
            rank,
            local_rank: rank,
            world_size,
            node_rank: 0,
            num_nodes: 1,
            comm,
            restarting: false,
            #[cfg(feature = "torch")]
            _store: None,
        }
    }
}

/// How to form the group: the run plan's choices.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JoinOptions {
    /// CUDA tensors go to NCCL (host buffers stay on Gloo).
    pub nccl: bool,
    /// `trainer.rendezvous_timeout_s`: how long to wait for every rank to arrive.
    pub rendezvous_timeout_s: u64,
    /// `trainer.collective_timeout_s`: how long one collective may take.
    pub collective_timeout_s: u64,
}

/// This node's address as the master sees it: the local end of a route to `MASTER_ADDR`. Gloo binds to it,
/// so two nodes on a private link (or two network namespaces) reach each other on that link.
pub fn local_address_towards(master: &str, port: u16) -> anyhow::Result<String> {
    use std::net::ToSocketAddrs;
    let target = (master, port)
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("MASTER_ADDR={master} does not resolve: {e}"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("MASTER_ADDR={master} does not resolve to an address"))?;
    let socket = std::net::UdpSocket::bind(if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })?;
    socket
        .connect(target)
        .map_err(|e| anyhow::anyhow!("no route to MASTER_ADDR={master}: {e}"))?;
    Ok(socket.local_addr()?.ip().to_string())
}

/// Join the run as `worker`: connect to the TCPStore (rank 0 hosts it), agree on the launch time (`now`,
/// rank 0's wins; returned), and form the Gloo group (with NCCL for CUDA tensors when `options.nccl`).
/// Every wait is bounded by the options' timeouts.
#[cfg(feature = "torch")]
pub fn join(
    cluster: &env::Cluster,
    options: &JoinOptions,
    now: &str,
) -> anyhow::Result<(Distributed, String)> {
    use std::time::Duration;
    let worker = cluster
        .worker
        .ok_or_else(|| anyhow::anyhow!("join is for workers; this process launches them"))?;
    let port = cluster
        .master_port
        .ok_or_else(|| anyhow::anyhow!("MASTER_PORT is not set"))?;
    let rendezvous = Duration::from_secs(options.rendezvous_timeout_s.max(1));
    let deadline = std::time::Instant::now() + rendezvous;
    // First, as its own error: a MASTER_ADDR that does not resolve or has no route.
    let me = local_address_towards(&cluster.master_addr, port)?;
    let (store, restarting) = connect_and_arrive(cluster, worker, port, options, deadline)?;
    if worker.rank == 0 {
        store.set("trainyard/now", now.as_bytes())?;
    }
    let agreed = String::from_utf8(store.get("trainyard/now")?)?;
    let collective_timeout = Duration::from_secs(options.collective_timeout_s.max(1));
    let nccl = if options.nccl {
        Some(c10d::NcclBackend::new(
            &store,
            "trainyard/default_pg/cuda",
            worker.rank,
            cluster.world_size,
            worker.local_rank,
            collective_timeout,
        )?)
    } else {
        None
    };
    let group = c10d::ProcessGroup::gloo(
        &store,
        "trainyard/default_pg",
        worker.rank,
        cluster.world_size,
        &me,
        collective_timeout,
        nccl,
    )?;
    Ok((
        Distributed {
            rank: worker.rank,
            local_rank: worker.local_rank,
            world_size: cluster.world_size,
            node_rank: cluster.node_rank,
            num_nodes: cluster.num_nodes,
            comm: std::sync::Arc::new(group),
            restarting,
            _store: Some(store),
        },
        agreed,
    ))
}

/// Connect to the rendezvous store (rank 0 hosts it) and count in (`rendezvous::arrive`), reconnecting
/// while the store reached is an earlier round's. Returns the store and whether the group is a restart.
/// Under torchrun the agents' own rendezvous has every node present: the ranks connect, and a worker
/// the agent restarted (`TORCHELASTIC_RESTART_COUNT` > 0) resumes.
#[cfg(feature = "torch")]
fn connect_and_arrive(
    cluster: &env::Cluster,
    worker: env::Worker,
    port: u16,
    options: &JoinOptions,
    deadline: std::time::Instant,
) -> anyhow::Result<(c10d::Store, bool)> {
    use std::time::{Duration, Instant};
    let agent_hosts_store =
        std::env::var("TORCHELASTIC_USE_AGENT_STORE").is_ok_and(|v| v == "True");
    let hosts = worker.rank == 0 && !agent_hosts_store;
    let restarted = std::env::var_os(RESTART_ENV).is_some()
        || std::env::var("TORCHELASTIC_RESTART_COUNT")
            .ok()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n > 0);
    let timeout_s = options.rendezvous_timeout_s;
    loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        let store =
            match c10d::Store::connect(&cluster.master_addr, port, hosts, cluster.world_size, left)
            {
                Ok(store) => store,
                Err(e) if hosts => {
                    return Err(e.context(format!(
                        "rank 0 could not host the rendezvous at {}:{port} (is the port in use?)",
                        cluster.master_addr
                    )))
                }
                // Nothing answered at MASTER_ADDR:MASTER_PORT until the deadline: node 0 did not come.
                Err(e) => {
                    return Err(NodeMissing(format!(
                    "{}\n    (rank {}: {e:#}; are MASTER_ADDR/MASTER_PORT the same on every node?)",
                    rendezvous::missing_message(cluster, &[0], timeout_s).replacen(
                        "node 0 (rank 0)",
                        "node 0 (rank 0, which hosts the rendezvous)",
                        1
                    ),
                    worker.rank
                ))
                    .into())
                }
            };
        if agent_hosts_store {
            return Ok((store, restarted));
        }
        match rendezvous::arrive(&store, cluster, worker.rank, restarted, deadline, timeout_s) {
            Ok(restarting) => return Ok((store, restarting)),
            Err(e) if e.is::<rendezvous::Stale>() && Instant::now() < deadline => {
                drop(store);
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) if e.is::<rendezvous::Stale>() => {
                return Err(NodeMissing(format!(
                    "{}\n    (rank {}: only an earlier round's store answered)",
                    rendezvous::missing_message(cluster, &[0], timeout_s),
                    worker.rank
                ))
                .into())
            }
            Err(e) => return Err(e),
        }
    }
}

/// Without libtorch there is no process group to join (the run plan refuses distributed strategies in such
/// a build before anything gets here).
#[cfg(not(feature = "torch"))]
pub fn join(
    _cluster: &env::Cluster,
    _options: &JoinOptions,
    _now: &str,
) -> anyhow::Result<(Distributed, String)> {
    anyhow::bail!(
        "a process group runs its collectives on libtorch's c10d (Gloo), which this build does not have: \
         rebuild with --features torch (scripts/install-libtorch.sh installs libtorch), or use trainer=single"
    )
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    /// Gloo's own words (from runs of tests/stalled_rank.rs) and errors that are not a timeout.
    #[rstest]
    #[case::silent_peer("Internal torch error: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 8000ms for recv operation to complete", true)]
    #[case::dropped_packets("Internal torch error: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error [10.231.8.2]:19073: Connection timed out", true)]
    #[case::dead_peer("Internal torch error: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:41234: Connection reset by peer", false)]
    #[case::s3("callbacks.model_checkpoint.dirpath=s3://b/p: the checkpoint could not be uploaded: Connection timed out", false)]
    fn a_collective_timeout_is_told_from_other_failures(#[case] message: &str, #[case] is: bool) {
        assert_eq!(super::is_collective_timeout(message), is);
    }
}
