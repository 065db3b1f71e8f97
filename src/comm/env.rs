//! Where this process sits in a run: which launcher started it (torchrun, SLURM, Lightning-style
//! `MASTER_ADDR`/`NODE_RANK`, or nobody), its rank, and the rendezvous address. Detection order, first match
//! wins: torchrun's `RANK`/`LOCAL_RANK`/`WORLD_SIZE` (our own launcher sets these too) > SLURM
//! (`SLURM_PROCID`, `SLURM_NTASKS`, ...) > Lightning-style (`MASTER_ADDR`, `MASTER_PORT`, `NODE_RANK`,
//! `WORLD_SIZE` with `trainer.devices` × `trainer.num_nodes`) > a single node. A pure function of the
//! environment, so every case is a unit test.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterSource {
    /// torchrun, or our own node launcher (which sets the same variables).
    Torchrun,
    Slurm,
    /// `MASTER_ADDR`/`NODE_RANK` set by hand on each node, as Lightning reads them.
    Lightning,
    /// Nothing set: one node, this process spawns the workers.
    Local,
}

impl fmt::Display for ClusterSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClusterSource::Torchrun => "torchrun-style environment (RANK, LOCAL_RANK, WORLD_SIZE)",
            ClusterSource::Slurm => "SLURM",
            ClusterSource::Lightning => "MASTER_ADDR / NODE_RANK",
            ClusterSource::Local => "single node",
        })
    }
}

/// This process's place, when it is one of the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Worker {
    pub rank: usize,
    pub local_rank: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub launcher: ClusterSource,
    pub node_rank: usize,
    pub num_nodes: usize,
    /// Workers per node.
    pub local_world_size: usize,
    pub world_size: usize,
    pub master_addr: String,
    /// `None`: pick a free port (single node only).
    pub master_port: Option<u16>,
    /// `Some`: this process is a worker already; `None`: it must start this node's workers.
    pub worker: Option<Worker>,
}

fn parse<T: std::str::FromStr>(
    get: &dyn Fn(&str) -> Option<String>,
    key: &str,
) -> anyhow::Result<Option<T>> {
    match get(key) {
        None => Ok(None),
        Some(v) => {
            v.trim().parse().map(Some).map_err(|_| {
                anyhow::anyhow!("environment variable {key}='{v}' is not a valid number")
            })
        }
    }
}

fn required<T: std::str::FromStr>(
    get: &dyn Fn(&str) -> Option<String>,
    key: &str,
    why: &str,
) -> anyhow::Result<T> {
    parse(get, key)?.ok_or_else(|| anyhow::anyhow!("{why} but {key} is not set"))
}

/// The first host of a SLURM node list: `node[003-005,7],gpu1` → `node003`.
fn first_slurm_host(list: &str) -> String {
    let first = match list.find(['[', ',']) {
        Some(i) if list.as_bytes()[i] == b'[' => {
            let prefix = &list[..i];
            let inner = &list[i + 1..];
            let token: String = inner
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            format!("{prefix}{token}")
        }
        Some(i) => list[..i].to_string(),
        None => list.to_string(),
    };
    first.trim().to_string()
}

/// Work out the cluster from environment variables (`get`) and the config's `devices` (per node) and
/// `num_nodes`.
pub fn detect(
    get: &dyn Fn(&str) -> Option<String>,
    devices: usize,
    num_nodes: usize,
) -> anyhow::Result<Cluster> {
    let master_port = parse::<u16>(get, "MASTER_PORT")?;
    if get("RANK").is_some() && get("WORLD_SIZE").is_some() {
        let why = "RANK and WORLD_SIZE are set (torchrun-style launch)";
        let rank: usize = required(get, "RANK", why)?;
        let world: usize = required(get, "WORLD_SIZE", why)?;
        let local_rank: usize = required(get, "LOCAL_RANK", why)?;
        let local_world: usize = parse(get, "LOCAL_WORLD_SIZE")?.unwrap_or(devices);
        anyhow::ensure!(rank < world, "RANK={rank} is not below WORLD_SIZE={world}");
        let master_addr = get("MASTER_ADDR").ok_or_else(|| {
            anyhow::anyhow!("{why} but MASTER_ADDR is not set: set it to rank 0's address")
        })?;
        let master_port =
            master_port.ok_or_else(|| anyhow::anyhow!("{why} but MASTER_PORT is not set"))?;
        return Ok(Cluster {
            launcher: ClusterSource::Torchrun,
            node_rank: parse(get, "GROUP_RANK")?
                .or(parse(get, "NODE_RANK")?)
                .unwrap_or(rank / local_world.max(1)),
            num_nodes: world.div_ceil(local_world.max(1)),
            local_world_size: local_world,
            world_size: world,
            master_addr,
            master_port: Some(master_port),
            worker: Some(Worker { rank, local_rank }),
        });
    }
    // An interactive allocation (`salloc`, `srun --pty bash`) is not a SLURM launch of the workers (as
    // Lightning decides): the node launcher starts them.
    let interactive = matches!(
        get("SLURM_JOB_NAME").as_deref(),
        Some("bash" | "interactive")
    );
    let slurm_tasks = if interactive {
        None
    } else {
        parse::<usize>(get, "SLURM_NTASKS")?
    };
    if let Some(ntasks) = slurm_tasks {
        let why = "SLURM_NTASKS is set (a SLURM job)";
        let procid: usize = required(get, "SLURM_PROCID", why)?;
        let node_id: usize = required(get, "SLURM_NODEID", why)?;
        let local_id: usize = parse(get, "SLURM_LOCALID")?.unwrap_or(0);
        let master_addr = match get("MASTER_ADDR") {
            Some(a) => a,
            None => first_slurm_host(
                &get("SLURM_JOB_NODELIST")
                    .or(get("SLURM_NODELIST"))
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "{why} but neither MASTER_ADDR nor SLURM_JOB_NODELIST is set"
                        )
                    })?,
            ),
        };
        // Lightning's choice when MASTER_PORT is not set: derived from the job id, same on every node.
        let port = match master_port {
            Some(p) => p,
            None => {
                let job: String = get("SLURM_JOB_ID").unwrap_or_default();
                let tail: u16 = job
                    .get(job.len().saturating_sub(4)..)
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                15000 + tail
            }
        };
        let expected = devices * num_nodes;
        anyhow::ensure!(
            ntasks == expected,
            "SLURM started {ntasks} tasks but trainer.devices={devices} × trainer.num_nodes={num_nodes} = {expected}: \
             run with `srun --ntasks-per-node={devices}` on {num_nodes} node(s), or set trainer.devices/num_nodes to match"
        );
        return Ok(Cluster {
            launcher: ClusterSource::Slurm,
            node_rank: node_id,
            num_nodes,
            local_world_size: devices,
            world_size: ntasks,
            master_addr,
            master_port: Some(port),
            worker: Some(Worker {
                rank: procid,
                local_rank: local_id,
            }),
        });
    }
    let world = devices * num_nodes;
    if let Some(w) = parse::<usize>(get, "WORLD_SIZE")? {
        anyhow::ensure!(
            w == world,
            "WORLD_SIZE={w} but trainer.devices={devices} × trainer.num_nodes={num_nodes} = {world}: \
             unset WORLD_SIZE or make them agree"
        );
    }
    let node_rank = parse::<usize>(get, "NODE_RANK")?;
    if get("MASTER_ADDR").is_some() || node_rank.is_some() || num_nodes > 1 {
        let node_rank = node_rank.unwrap_or(0);
        anyhow::ensure!(
            node_rank < num_nodes,
            "NODE_RANK={node_rank} but trainer.num_nodes={num_nodes}: node ranks are 0..{}",
            num_nodes - 1
        );
        let master_addr = match get("MASTER_ADDR") {
            Some(a) => a,
            None if num_nodes == 1 => "127.0.0.1".to_string(),
            None => anyhow::bail!(
                "trainer.num_nodes={num_nodes}: set MASTER_ADDR (node 0's address), MASTER_PORT and NODE_RANK \
                 (0..{}) on every node",
                num_nodes - 1
            ),
        };
        anyhow::ensure!(
            num_nodes == 1 || master_port.is_some(),
            "trainer.num_nodes={num_nodes}: set MASTER_PORT (the same free port on every node)"
        );
        return Ok(Cluster {
            launcher: ClusterSource::Lightning,
            node_rank,
            num_nodes,
            local_world_size: devices,
            world_size: world,
            master_addr,
            master_port,
            worker: None,
        });
    }
    Ok(Cluster {
        launcher: ClusterSource::Local,
        node_rank: 0,
        num_nodes: 1,
        local_world_size: devices,
        world_size: devices,
        master_addr: "127.0.0.1".into(),
        master_port,
        worker: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use std::collections::HashMap;

    fn run(vars: &[(&str, &str)], devices: usize, nodes: usize) -> anyhow::Result<Cluster> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect(&|k| env.get(k).cloned(), devices, nodes)
    }

    #[rstest]
    #[case::nothing(&[], 2, 1, ClusterSource::Local, 0, 2, None)]
    #[case::torchrun(&[("RANK", "3"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")], 1, 1, ClusterSource::Torchrun, 1, 4,
        Some(Worker { rank: 3, local_rank: 1 }))]
    #[case::slurm(&[("SLURM_NTASKS", "4"), ("SLURM_PROCID", "2"), ("SLURM_NODEID", "1"), ("SLURM_LOCALID", "0"),
        ("SLURM_JOB_NODELIST", "gpu[07-08]"), ("SLURM_JOB_ID", "123456")], 2, 2, ClusterSource::Slurm, 1, 4,
        Some(Worker { rank: 2, local_rank: 0 }))]
    #[case::lightning(&[("MASTER_ADDR", "10.1.1.1"), ("MASTER_PORT", "1234"), ("NODE_RANK", "1"),
        ("WORLD_SIZE", "2")], 1, 2, ClusterSource::Lightning, 1, 2, None)]
    fn detects(
        #[case] vars: &[(&str, &str)],
        #[case] devices: usize,
        #[case] nodes: usize,
        #[case] launcher: ClusterSource,
        #[case] node_rank: usize,
        #[case] world: usize,
        #[case] worker: Option<Worker>,
    ) {
        let c = run(vars, devices, nodes).unwrap();
        assert_eq!(
            (c.launcher, c.node_rank, c.world_size, c.worker),
            (launcher, node_rank, world, worker)
        );
    }

    #[test]
    fn slurm_master_is_the_first_host_and_the_port_follows_the_job_id() {
        let c = run(
            &[
                ("SLURM_NTASKS", "2"),
                ("SLURM_PROCID", "0"),
                ("SLURM_NODEID", "0"),
                ("SLURM_JOB_NODELIST", "node[003-004]"),
                ("SLURM_JOB_ID", "98761234"),
            ],
            1,
            2,
        )
        .unwrap();
        assert_eq!(c.master_addr, "node003");
        assert_eq!(c.master_port, Some(15000 + 1234));
    }

    #[test]
    fn an_interactive_slurm_shell_is_not_a_slurm_launch() {
        let c = run(
            &[
                ("SLURM_NTASKS", "1"),
                ("SLURM_PROCID", "0"),
                ("SLURM_NODEID", "0"),
                ("SLURM_JOB_NAME", "bash"),
            ],
            2,
            1,
        )
        .unwrap();
        assert_eq!((c.launcher, c.worker), (ClusterSource::Local, None));
    }

    #[rstest]
    #[case("node[003-005,7],gpu1", "node003")]
    #[case("gpu1,gpu2", "gpu1")]
    #[case("single", "single")]
    fn slurm_host_lists(#[case] list: &str, #[case] first: &str) {
        assert_eq!(first_slurm_host(list), first);
    }

    #[rstest]
    #[case::no_master(&[("NODE_RANK", "1")], 1, 2, "set MASTER_ADDR")]
    #[case::no_port(&[("NODE_RANK", "1"), ("MASTER_ADDR", "10.0.0.1")], 1, 2, "set MASTER_PORT")]
    #[case::node_rank_too_big(&[("NODE_RANK", "2"), ("MASTER_ADDR", "a"), ("MASTER_PORT", "1")], 1, 2,
        "NODE_RANK=2 but trainer.num_nodes=2")]
    #[case::world_disagrees(&[("WORLD_SIZE", "3")], 2, 1, "WORLD_SIZE=3 but trainer.devices=2")]
    #[case::slurm_tasks(&[("SLURM_NTASKS", "3"), ("SLURM_PROCID", "0"), ("SLURM_NODEID", "0"),
        ("SLURM_JOB_NODELIST", "a")], 2, 1, "SLURM started 3 tasks")]
    #[case::bad_number(&[("NODE_RANK", "one")], 1, 2, "NODE_RANK='one' is not a valid number")]
    #[case::torchrun_without_master(&[("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")], 1, 1,
        "MASTER_ADDR is not set")]
    fn explains_what_is_missing(
        #[case] vars: &[(&str, &str)],
        #[case] devices: usize,
        #[case] nodes: usize,
        #[case] expected: &str,
    ) {
        let e = run(vars, devices, nodes).unwrap_err().to_string();
        assert!(e.contains(expected), "{e}");
    }
}
