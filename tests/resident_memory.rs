//! The batch-size finder's resident-memory meter (tch on the CPU), alone in its own test process: it reads
//! the whole process's resident memory, so unit tests allocating and freeing beside it (the library's
//! run in parallel threads of one process) moved its reading, and it failed now and then.

use trainyard::platform::memory::Meter;

#[test]
fn a_tch_cpu_run_is_measured_on_resident_memory() {
    let text = "task_name: t\nseed: 3\nbackend: tch\nmodel: {name: mlp, num_classes: 4, hidden: [8]}\n\
                data: {name: synthetic, num_classes: 4, image_size: 8, batch_size: 4}\n\
                optimizer: {name: sgd, lr: 0.1}\nscheduler: {name: constant}\n\
                trainer: {strategy: single, devices: 1, accelerator: cpu, precision: 32, max_epochs: 1}\n\
                paths: {root_dir: ., data_dir: d, log_dir: l, output_dir: o}\n";
    let node = trainyard::config::yaml::parse(text, "t.yaml")
        .unwrap()
        .unwrap();
    let exp = trainyard::schema::extract(&node).unwrap();
    let meter = Meter::start(&exp).unwrap();
    assert!(matches!(meter, Meter::Resident { .. }));
    let held = vec![1u8; 64 << 20];
    std::hint::black_box(&held);
    let peak = meter.peak_above_start().unwrap();
    drop(held);
    assert!(peak >= 60 << 20, "{peak}");
}
