//! The Rust half of `bench/allreduce_bench.py`: one rank of an all-reduce bandwidth test through our c10d
//! shim (TCPStore rendezvous + ProcessGroupGloo), launched like torchrun's workers (RANK, WORLD_SIZE,
//! MASTER_ADDR, MASTER_PORT). Rank 0 prints one JSON line: the median seconds per all-reduce and the bus
//! bandwidth, computed as torch.distributed's benchmarks do (2(n-1)/n × bytes / time).
//!
//! usage: allreduce_bench <megabytes> <iterations>   (feature `torch`)

#[cfg(feature = "torch")]
fn main() -> anyhow::Result<()> {
    use std::time::{Duration, Instant};
    use trainyard::comm::c10d::{ProcessGroup, Store};
    use trainyard::comm::collective::ReduceOp;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let megabytes: f64 = args.first().map_or(Ok(100.0), |s| s.parse())?;
    let iterations: usize = args.get(1).map_or(Ok(10), |s| s.parse())?;
    let var = |k: &str| std::env::var(k).map_err(|_| anyhow::anyhow!("{k} is not set"));
    let rank: usize = var("RANK")?.parse()?;
    let world: usize = var("WORLD_SIZE")?.parse()?;
    let addr = var("MASTER_ADDR")?;
    let port: u16 = var("MASTER_PORT")?.parse()?;
    let timeout = Duration::from_secs(120);
    let store = Store::connect(&addr, port, rank == 0, world, timeout)?;
    let me = trainyard::comm::local_address_towards(&addr, port)?;
    let pg = ProcessGroup::gloo(&store, "bench", rank, world, &me, timeout, None)?;
    let numel = (megabytes * 1e6 / 4.0) as i64;
    let t = tch::Tensor::ones([numel], (tch::Kind::Float, tch::Device::Cpu));
    pg.all_reduce(&[&t], ReduceOp::Sum)?.wait()?; // warm-up: connections, buffers
    let mut times = Vec::new();
    for _ in 0..iterations {
        let start = Instant::now();
        pg.all_reduce(&[&t], ReduceOp::Sum)?.wait()?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    if rank == 0 {
        let bytes = numel as f64 * 4.0;
        let busbw = 2.0 * (world as f64 - 1.0) / world as f64 * bytes / median / 1e9;
        println!(
            "{{\"impl\": \"trainyard\", \"megabytes\": {megabytes}, \"world\": {world}, \"median_s\": {median:.6}, \"busbw_gbps\": {busbw:.4}}}"
        );
    }
    Ok(())
}

#[cfg(not(feature = "torch"))]
fn main() {
    eprintln!("allreduce_bench needs --features torch (libtorch's c10d)");
    std::process::exit(2);
}
