//! Shared unit-test fixtures, so each module's tests state only what differs: a small experiment over
//! synthetic 8x8 RGB images.

use crate::schema::Experiment;

/// An experiment over synthetic 8x8 RGB images of `classes` classes (batch 4, one epoch, constant
/// schedule, seed 3); `model`, `optimizer` and `trainer` are YAML flow maps (the trainer's `accelerator`,
/// `precision` and `max_epochs` are set here).
pub fn experiment(model: &str, optimizer: &str, trainer: &str, classes: usize) -> Experiment {
    let trainer = trainer
        .strip_suffix('}')
        .expect("the trainer is a YAML flow map");
    let text = format!(
        "task_name: t\nseed: 3\nmodel: {model}\n\
         data: {{name: synthetic, num_classes: {classes}, image_size: 8, batch_size: 4}}\n\
         optimizer: {optimizer}\nscheduler: {{name: constant}}\n\
         trainer: {trainer}, accelerator: cpu, precision: 32, max_epochs: 1}}\n\
         paths: {{root_dir: ., data_dir: d, log_dir: l, output_dir: o}}\n"
    );
    let node = crate::config::yaml::parse(&text, "t.yaml")
        .unwrap()
        .unwrap();
    crate::schema::extract(&node).unwrap()
}

/// Four random 8x8 RGB images (seeded), labelled 0..4.
pub fn batch(seed: u64) -> crate::data::loader::Batch {
    batch_of(4, 8, seed)
}

/// `images` random `size`x`size` RGB images (seeded, standard normal), image i labelled i mod 4.
pub fn batch_of(images: usize, size: usize, seed: u64) -> crate::data::loader::Batch {
    let mut rng = crate::platform::rng::Rng::new(seed);
    crate::data::loader::Batch {
        images: (0..images * 3 * size * size)
            .map(|_| rng.normal() as f32)
            .collect(),
        labels: (0..images as u32).map(|i| i % 4).collect(),
        channels: 3,
        height: size,
        width: size,
        staged: None,
        tensors: None,
    }
}

/// A loopback port free right now, for a test's TCPStore.
#[cfg(feature = "torch")]
pub fn loopback_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Run `job(rank, group)` on the two ranks of a real Gloo group, each in a thread of this process over
/// loopback; the results in rank order. A panic on either rank fails the test.
#[cfg(feature = "torch")]
pub fn on_two_ranks<T: Send>(
    job: impl Fn(usize, &crate::comm::c10d::ProcessGroup) -> T + Sync,
) -> Vec<T> {
    on_two_shared_ranks(|rank, group| {
        let pg = crate::comm::c10d::ProcessGroup::of(group.as_ref()).expect("a c10d group");
        job(rank, pg)
    })
}

/// `on_two_ranks` with the group as a shared collective, for what keeps one (a strategy).
#[cfg(feature = "torch")]
pub fn on_two_shared_ranks<T: Send>(
    job: impl Fn(usize, std::sync::Arc<dyn crate::comm::collective::Collective>) -> T + Sync,
) -> Vec<T> {
    use crate::comm::c10d::{ProcessGroup, Store};
    let port = loopback_port();
    let timeout = std::time::Duration::from_secs(30);
    let job = &job;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2usize)
            .map(|rank| {
                s.spawn(move || {
                    let store = Store::connect("127.0.0.1", port, rank == 0, 2, timeout).unwrap();
                    let group =
                        ProcessGroup::gloo(&store, "test", rank, 2, "127.0.0.1", timeout, None)
                            .unwrap();
                    job(rank, std::sync::Arc::new(group))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
