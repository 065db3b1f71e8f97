//! FSDP against one engine: the same steps on two ranks, every sharding strategy, both backends.

use super::*;
use rstest::rstest;

/// The slice's optimizer arithmetic is the rules' own: a momentum SGD step on the flat slice equals
/// the hand-computed PyTorch update element by element, on the host and on a tch device alike.
#[rstest]
#[case::host(FlatHome::Host)]
#[cfg_attr(
    feature = "torch",
    case::tch(FlatHome::Tch(tch::Device::Cpu, tch::Kind::Float))
)]
fn flat_slices_follow_the_optimizer_rules(#[case] home: FlatHome) {
    let node = crate::config::yaml::parse("{name: sgd, lr: 0.1, momentum: 0.9}", "<test>")
        .unwrap()
        .unwrap();
    let mut o = Optimizer::new(serde_json::from_value(node.to_json()).unwrap());
    let p = home.place(vec![1.0, -2.0]).unwrap();
    let g = home.place(vec![0.5, 0.25]).unwrap();
    let p1 = o.update(&unit_key(0), &p, &g, 0.1, None).unwrap();
    assert_eq!(p1.home(), home);
    assert_eq!(p1.to_vec().unwrap(), vec![1.0 - 0.05, -2.0 - 0.025]);
    assert!(o.state.contains_key("flat0.momentum_buffer"));
}

/// Parameters in one ViT-tiny block (dim 192, MLP 768: qkv, projection, two MLP layers, two norms).
const BLOCK: usize =
    192 * 576 + 576 + 192 * 192 + 192 + 192 * 768 + 768 + 768 * 192 + 192 + 4 * 192;

fn experiment(model: &str, sharding: &str, min_num_params: Option<usize>) -> Experiment {
    let min = min_num_params.map_or("null".to_string(), |n| n.to_string());
    let trainer = format!(
        "{{strategy: fsdp, devices: 2, \
         fsdp: {{sharding_strategy: {sharding}, state_dict_type: full, min_num_params: {min}}}}}"
    );
    let optimizer = "{name: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.01}";
    crate::testing::experiment(model, optimizer, &trainer, 4)
}

/// Rows `rows` of a fixed batch of 8 random images.
fn batch(step: u64, rows: std::ops::Range<usize>) -> Batch {
    let mut rng = crate::platform::rng::Rng::new(step);
    let images: Vec<f32> = (0..8 * 3 * 8 * 8).map(|_| rng.normal() as f32).collect();
    let labels: Vec<u32> = (0..8u32).map(|i| (i * 7 + step as u32) % 4).collect();
    let px = 3 * 8 * 8;
    Batch {
        images: images[rows.start * px..rows.end * px].to_vec(),
        labels: labels[rows].to_vec(),
        channels: 3,
        height: 8,
        width: 8,
        staged: None,
        tensors: None,
    }
}

/// How the two ranks of a test talk: Candle's host slices over the in-process collective, tch's
/// device slices over a real 2-rank Gloo group (c10d, tensors passed as they are).
#[derive(Clone, Copy, Debug)]
enum TwoRanks {
    CandleInProcess,
    #[cfg(feature = "torch")]
    TchGloo,
}

impl TwoRanks {
    fn run<T: Send>(self, job: impl Fn(usize, Arc<dyn Collective>) -> T + Sync) -> Vec<T> {
        match self {
            TwoRanks::CandleInProcess => {
                let comms: Vec<Arc<dyn Collective>> = crate::comm::local::group(2)
                    .into_iter()
                    .map(|c| Arc::new(c) as Arc<dyn Collective>)
                    .collect();
                let job = &job;
                std::thread::scope(|s| {
                    let handles: Vec<_> = comms
                        .into_iter()
                        .enumerate()
                        .map(|(rank, comm)| s.spawn(move || job(rank, comm)))
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                })
            }
            #[cfg(feature = "torch")]
            TwoRanks::TchGloo => crate::testing::on_two_shared_ranks(job),
        }
    }

    fn experiment(self, sharding: &str, min_num_params: Option<usize>) -> Experiment {
        let model = "{name: vit, variant: tiny, patch_size: 4, num_classes: 4}";
        let mut exp = experiment(model, sharding, min_num_params);
        exp.backend = match self {
            TwoRanks::CandleInProcess => crate::schema::Backend::Candle,
            #[cfg(feature = "torch")]
            TwoRanks::TchGloo => crate::schema::Backend::Tch,
        };
        exp
    }
}

/// 2 ranks × 2 accumulated micro-batches × 2 rows, sharded, take the steps one engine takes on all 8
/// rows: same gradient norms, and same weights and momentum after 3 steps of momentum SGD with weight
/// decay and clipping, for every sharding strategy, on Candle (host slices) and tch (slices on the
/// engine's device, gathered and reduce-scattered by c10d in place). `FULL_SHARD` holds at most one
/// unit's parameters whole (a ViT block: a small part of the model; two blocks when the size policy
/// groups them); the other strategies the whole model.
#[rstest]
#[case::full_shard("FULL_SHARD", None)]
#[case::full_shard_two_blocks_a_unit("FULL_SHARD", Some(BLOCK + 1))]
#[case::shard_grad_op("SHARD_GRAD_OP", None)]
#[case::shard_grad_op_grouped("SHARD_GRAD_OP", Some(BLOCK + 1))]
#[case::no_shard("NO_SHARD", None)]
fn two_ranks_take_the_single_engine_steps(
    #[case] sharding: &str,
    #[case] min_num_params: Option<usize>,
) {
    let all = [
        TwoRanks::CandleInProcess,
        #[cfg(feature = "torch")]
        TwoRanks::TchGloo,
    ];
    for ranks in all {
        two_ranks_against_one(ranks, sharding, min_num_params);
    }
}

fn two_ranks_against_one(ranks: TwoRanks, sharding: &str, min_num_params: Option<usize>) {
    let exp = ranks.experiment(sharding, min_num_params);
    let mut single = crate::backend::build(&exp, &Placement::single()).unwrap();
    // Clipping hides a wrong scale of the reduced gradients from the weights: the steps' norms
    // (before clipping) show it.
    let mut norms = Vec::new();
    for step in 0..3 {
        single.forward_backward(&batch(step, 0..8), 1.0).unwrap();
        norms.push(
            single
                .optimizer_step(0.1, None, Some(GradClip::Norm(1.0)))
                .unwrap(),
        );
    }
    let want = single.state_dict().unwrap();
    let home = single.sharding().unwrap().flat_home();
    let results: Vec<(StateDict, StateBytes)> = ranks.run(|rank, comm| {
        let inner = crate::backend::build(&exp, &Placement::single()).unwrap();
        let mut e = Fsdp::new(&exp, inner, Ranks::over(comm)).unwrap();
        for step in 0..3 {
            // Two accumulated micro-batches of 2 rows: this rank's 4.
            for half in 0..2 {
                let start = 4 * rank + 2 * half;
                e.forward_backward(&batch(step, start..start + 2), 0.5, half == 1)
                    .unwrap();
            }
            let norm = e
                .optimizer_step(0.1, None, Some(GradClip::Norm(1.0)))
                .unwrap();
            let want = norms[step as usize];
            assert!(
                (norm - want).abs() < 1e-5 * want,
                "{ranks:?} rank {rank}, step {step}: gradient norm {norm}, one engine's {want}"
            );
        }
        e.evaluate(&batch(9, 0..8)).unwrap();
        // The slices and the optimizer's slots stayed where the engine computes.
        assert!(e.units.iter().all(|u| u.shard.home() == home));
        assert!(e.optimizer.state.values().all(|v| v.home() == home));
        (e.state_dict().unwrap(), e.state_bytes())
    });
    let total = 4 * crate::backend::num_parameters(single.as_ref()) as u64;
    for (rank, (state, bytes)) in results.iter().enumerate() {
        let mut checked = 0;
        let counters = ["optimizer.step", "optimizer.forward_calls"];
        for (name, t) in want.iter().filter(|(k, _)| !counters.contains(&k.as_str())) {
            let got = &state[name];
            let worst = got
                .data
                .iter()
                .zip(&t.data)
                .map(|(a, b)| (a - b).abs() / b.abs().max(1e-2))
                .fold(0.0f32, f32::max);
            assert!(
                worst < 1e-5,
                "{ranks:?} rank {rank}, {name}: differs by {worst:e}"
            );
            checked += usize::from(name.ends_with("momentum_buffer"));
        }
        assert!(checked > 10, "momentum buffers compared: {checked}");
        let block = 4 * BLOCK as u64;
        match (sharding, min_num_params) {
            ("FULL_SHARD", None) => assert!(
                bytes.unsharded_peak >= block && bytes.unsharded_peak < block + 4096,
                "rank {rank}: {} bytes whole at once, one block is {block}",
                bytes.unsharded_peak
            ),
            ("FULL_SHARD", Some(_)) => assert!(
                bytes.unsharded_peak >= 2 * block && bytes.unsharded_peak < 3 * block,
                "rank {rank}: {} bytes whole at once, two blocks are {}",
                bytes.unsharded_peak,
                2 * block
            ),
            _ => assert_eq!(bytes.unsharded_peak, total, "rank {rank}"),
        }
    }
}
