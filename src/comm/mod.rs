//! Distributed training's plumbing: where this process sits (`env`), starting a node's workers (`launch`),
//! the collectives strategies use (`collective`) and their implementations: on PyTorch's c10d across
//! processes (`c10d`, feature `torch`, with DDP's `reducer` that overlaps gradient averaging with the
//! backward pass, and `nccl` for CUDA tensors), and between the threads of one process (`local`,
//! DataParallel).
//! `join` turns a worker's environment into a live process group.

pub mod collective;
pub mod env;

pub mod local;

#[cfg(feature = "torch")]
pub mod c10d;
#[cfg(feature = "torch")]
pub mod nccl;
#[cfg(feature = "torch")]
pub mod reducer;

use crate::schema::Experiment;
use collective::Collective;

/// The launch time the node launcher hands its workers, so every rank resolves `${now:...}` (and so the
/// run directory) the same way.
pub const NOW_ENV: &str = "TRAINYARD_NOW";

/// A worker inside a process group.
pub struct Distributed {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub node_rank: usize,
    pub num_nodes: usize,
    pub comm: std::sync::Arc<dyn Collective>,
    /// Keeps the rendezvous open (rank 0 hosts it) for as long as the group lives.
    #[cfg(feature = "torch")]
    _store: c10d::Store,
}

impl Distributed {
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }
}

static LOCAL_RANK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// This process's device index on its node: its local rank in a distributed run (cuda:<local_rank>, as
/// Lightning places workers), else 0.
pub fn local_device_index() -> usize {
    LOCAL_RANK.get().copied().unwrap_or(0)
}

/// Local devices per node (DDP's processes, DataParallel's replicas): `trainer.devices`, or with `auto`
/// the visible GPUs of a tch run (one on the CPU, as Lightning does; Candle runs on the CPU here).
pub fn devices_per_node(exp: &Experiment) -> usize {
    match exp.trainer.devices {
        crate::schema::Devices::Count(n) => n,
        crate::schema::Devices::Auto => {
            #[cfg(feature = "torch")]
            if exp.backend == crate::schema::Backend::Tch
                && exp.trainer.accelerator != crate::schema::Accelerator::Cpu
            {
                return crate::backend::torch::cuda_runtime::device_count().max(1);
            }
            1
        }
    }
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
/// rank 0's wins; returned), and form the Gloo group. Every wait is bounded by the config's timeouts.
#[cfg(feature = "torch")]
pub fn join(
    cluster: &env::Cluster,
    exp: &Experiment,
    now: &str,
) -> anyhow::Result<(Distributed, String)> {
    use std::time::Duration;
    let worker = cluster
        .worker
        .ok_or_else(|| anyhow::anyhow!("join is for workers; this process launches them"))?;
    let port = cluster
        .master_port
        .ok_or_else(|| anyhow::anyhow!("MASTER_PORT is not set"))?;
    let t = &exp.trainer;
    let use_nccl = wants_nccl(exp)?;
    let rendezvous = Duration::from_secs(t.rendezvous_timeout_s.max(1));
    // Under torchrun (elastic agent) the agent already hosts the store on MASTER_PORT: every rank is a client.
    let agent_hosts_store =
        std::env::var("TORCHELASTIC_USE_AGENT_STORE").is_ok_and(|v| v == "True");
    let store = c10d::Store::connect(
        &cluster.master_addr,
        port,
        worker.rank == 0 && !agent_hosts_store,
        cluster.world_size,
        rendezvous,
    )
    .map_err(|e| {
        e.context(format!(
            "rank {} could not reach the rendezvous within trainer.rendezvous_timeout_s={}s \
             (is node 0 started, and MASTER_ADDR/MASTER_PORT the same on every node?)",
            worker.rank, t.rendezvous_timeout_s
        ))
    })?;
    if worker.rank == 0 {
        store.set("trainyard/now", now.as_bytes())?;
    }
    let agreed = String::from_utf8(store.get("trainyard/now")?)?;
    let me = local_address_towards(&cluster.master_addr, port)?;
    let _ = LOCAL_RANK.set(worker.local_rank);
    let collective_timeout = Duration::from_secs(t.collective_timeout_s.max(1));
    let nccl = if use_nccl {
        Some(nccl::NcclBackend::new(
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
            _store: store,
        },
        agreed,
    ))
}

/// Does this run's process group take NCCL for its CUDA tensors? `trainer.process_group_backend=nccl`
/// must be able to (tch on a CUDA device, with the NCCL shim built in); unset, NCCL is taken where it
/// can be, as Lightning picks nccl on GPUs (a run that asks for a GPU and has none fails in the engine,
/// with its own message). Host-side collectives always stay on Gloo.
#[cfg(feature = "torch")]
fn wants_nccl(exp: &Experiment) -> anyhow::Result<bool> {
    use crate::backend::torch::cuda_runtime;
    use crate::schema::{Accelerator, Backend, ProcessGroupBackend};
    let t = &exp.trainer;
    // gpu, cuda and auto all need a device libtorch can see.
    let on_cuda = exp.backend == Backend::Tch
        && t.accelerator != Accelerator::Cpu
        && cuda_runtime::is_available();
    match t.process_group_backend {
        Some(ProcessGroupBackend::Gloo) => Ok(false),
        Some(ProcessGroupBackend::Nccl) => {
            anyhow::ensure!(
                exp.backend == Backend::Tch,
                "trainer.process_group_backend=nccl needs backend=tch (Candle runs on the CPU here); \
                 use trainer.process_group_backend=gloo (or null)"
            );
            anyhow::ensure!(
                on_cuda,
                "trainer.process_group_backend=nccl needs a run on CUDA, and trainer.accelerator={} {}; \
                 use trainer.accelerator=gpu on a GPU machine, or trainer.process_group_backend=gloo \
                 (or null)",
                format!("{:?}", t.accelerator).to_lowercase(),
                if t.accelerator == Accelerator::Cpu {
                    "is the CPU".to_string()
                } else {
                    format!("finds no GPU: {}", cuda_runtime::why_unavailable())
                }
            );
            anyhow::ensure!(
                nccl::built(),
                "trainer.process_group_backend=nccl: this build has no NCCL shim (build.rs found no \
                 CUDA/NCCL headers; scripts/install-libtorch.sh fetches them); rebuild, or use \
                 trainer.process_group_backend=gloo"
            );
            Ok(true)
        }
        None if !on_cuda => Ok(false),
        None if !nccl::built() => {
            tracing::warn!(
                "this build has no NCCL shim: CUDA tensors are reduced through Gloo (host copies, slow); \
                 rebuild with the CUDA/NCCL headers (scripts/install-libtorch.sh) for NCCL"
            );
            Ok(false)
        }
        None => Ok(true),
    }
}

#[cfg(not(feature = "torch"))]
pub fn join(
    _cluster: &env::Cluster,
    exp: &Experiment,
    _now: &str,
) -> anyhow::Result<(Distributed, String)> {
    anyhow::bail!(
        "trainer.strategy={} runs its collectives on libtorch's c10d (Gloo), which this build does not have: \
         rebuild with --features torch (scripts/install-libtorch.sh installs libtorch), or use trainer=single",
        exp.trainer.strategy
    )
}
