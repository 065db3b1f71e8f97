//! The logbook end to end: a batch-size sweep (what `just sweep batch_size` runs), a failed run and a run
//! killed mid-training, then `train logbook`: one row per job with the numbers of its summary.json, the sweep
//! section, unfinished runs marked, SVG plots that parse as SVG.

mod common;
use common::{real_project, summary, train, TRAIN};
use std::path::{Path, PathBuf};
use std::process::Command;

const SHORT: &[&str] = &[
    "experiment=quickstart",
    "trainer.max_epochs=1",
    "data.train_size=256",
    "data.val_size=64",
    "model.channels=[8,16]",
    "data.num_workers=0",
];

fn dirs_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}

fn assert_svg(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg", "{}", path.display());
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    assert!(
        root.descendants()
            .any(|n| matches!(n.tag_name().name(), "polyline" | "rect" | "circle")),
        "{} draws nothing",
        path.display()
    );
}

#[test]
fn sweep_then_logbook() {
    let p = real_project();
    let root = p.path();

    // `just sweep batch_size` = `train -m sweep=batch_size ...`: three batch sizes, one short epoch each.
    let mut args = vec!["-m", "sweep=batch_size"];
    args.extend_from_slice(SHORT);
    let out = train(root, &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sweep_dir = dirs_in(&root.join("logs/sweep_batch_size/multiruns"))
        .pop()
        .unwrap();
    let jobs = dirs_in(&sweep_dir);
    assert_eq!(jobs.len(), 3);
    // The sweep wrote its own section when it ended.
    let section = std::fs::read_to_string(sweep_dir.join("logbook.md")).unwrap();
    assert!(section.contains("swept: `data.batch_size`"), "{section}");
    assert!(stdout.contains("Logbook section:"), "{stdout}");

    // A run that fails (no data where it looks) and one killed with SIGKILL mid-training.
    let mut failing: Vec<&str> = SHORT.to_vec();
    failing.extend(["data=mnist", "data.train_size=null", "data.val_size=null"]);
    assert!(!train(root, &failing).status.success());
    let mut long: Vec<&str> = SHORT.to_vec();
    long.extend([
        "trainer.max_epochs=1000",
        "task_name=killed",
        "tags=[long,sigkill]",
    ]);
    let mut child = Command::new(TRAIN)
        .args(&long)
        .current_dir(root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let killed_runs = root.join("logs/killed/runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let logged = killed_runs.is_dir()
            && dirs_in(&killed_runs).iter().any(|d| {
                std::fs::read_to_string(d.join("metrics.csv"))
                    .map(|t| t.lines().count() >= 3)
                    .unwrap_or(false)
            });
        if logged {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the long run never logged two epochs"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child.kill().unwrap(); // SIGKILL: no chance to write anything more
    child.wait().unwrap();

    // Single against distributed: the same run on one device and data-parallel on two (`dp_sim`, any
    // backend), compared in one experiment.
    for strategy in ["single", "dp_sim"] {
        let mut args: Vec<String> = SHORT.iter().map(|s| s.to_string()).collect();
        args.extend([
            "task_name=compare".to_string(),
            format!("trainer={strategy}"),
            format!("hydra.run.dir=logs/compare/runs/{strategy}"),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = train(root, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let out = train(root, &["logbook"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let book = std::fs::read_to_string(root.join("logs/logbook.md")).unwrap();
    let compare: String = book
        .lines()
        .skip_while(|l| !l.starts_with("## Experiment `compare`"))
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect::<Vec<_>>()
        .join("\n");
    let header = compare
        .lines()
        .find(|l| l.starts_with("| run |"))
        .unwrap_or_default();
    assert!(header.contains("speed-up"), "{compare}");
    let rows: Vec<&str> = compare.lines().filter(|l| l.starts_with("| [")).collect();
    assert_eq!(rows.len(), 2, "{compare}");
    assert!(rows.iter().any(|r| r.contains("dp")), "{compare}");

    // One row per sweep job in the experiment table, with the job's measured numbers.
    for job in &jobs {
        let s = summary(job);
        let name = format!(
            "{}#{}",
            sweep_dir.file_name().unwrap().to_string_lossy(),
            job.file_name().unwrap().to_string_lossy()
        );
        let row = book
            .lines()
            .find(|l| l.starts_with(&format!("| [{name}]")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{book}"));
        let throughput = format!("{:.1} img/s", s["train_samples_per_s"].as_f64().unwrap());
        let acc = format!("{:.4}", s["final_metrics"]["val/acc1"].as_f64().unwrap());
        // One epoch: best val top-1/top-5 are the final ones, side by side with them.
        let acc5 = format!("{:.4}", s["final_metrics"]["val/acc5"].as_f64().unwrap());
        let best = format!("| {acc} | {acc5} |");
        let batch = format!("| {} |", s["global_batch_size"]);
        // Parameters + gradients + optimizer state of the (only) rank.
        let state = &s["state_bytes_per_rank"][0];
        let state_bytes: u64 = ["parameters", "gradients", "optimizer_state"]
            .iter()
            .map(|k| state[k].as_u64().unwrap())
            .sum();
        assert!(state_bytes > 0, "{s}");
        // The jobs differ in batch, not in what they hold per rank: said once, above the table.
        let shared = format!(
            "train state per rank {:.0} KiB",
            state_bytes as f64 / 1024.0
        );
        assert!(book.contains(&shared), "{shared} not in\n{book}");
        for want in [&throughput, &best, &batch, &"| completed |".to_string()] {
            assert!(row.contains(want.as_str()), "{want} not in {row}");
        }
        // Paths are under the table, linked from the run's name.
        assert!(
            book.lines()
                .any(|l| l.starts_with(&format!("- [{name}](")) && l.contains("checkpoint `")),
            "no checkpoint line for {name}:\n{book}"
        );
        // And one row in the sweep section, with its batch size.
        let num = job.file_name().unwrap().to_string_lossy().into_owned();
        let sweep_row = book
            .lines()
            .find(|l| l.starts_with(&format!("| [{num}](")))
            .unwrap_or_else(|| panic!("no sweep row for job {num}:\n{book}"));
        assert!(
            sweep_row.contains(&format!("| {} |", s["batch_size"]))
                && sweep_row.contains(&throughput)
                && sweep_row.contains(&acc),
            "{sweep_row}"
        );
    }
    const BEST: &str = "- Best val/acc1 (higher is better):";
    assert!(
        book.contains(BEST) && book.contains("- Highest throughput:"),
        "{book}"
    );
    // The sweep leads with its answer; its rows run best first; its metric is plotted by batch size.
    let sweep_part = &book[book.find("## Sweep `").unwrap()..];
    assert!(
        sweep_part.find(BEST).unwrap() < sweep_part.find("| job |").unwrap(),
        "{sweep_part}"
    );
    let header = sweep_part
        .lines()
        .find(|l| l.starts_with("| job |"))
        .unwrap();
    let column = header
        .split('|')
        .map(str::trim)
        .position(|h| h == "val top-1")
        .unwrap_or_else(|| panic!("no val top-1 column: {header}"));
    let top1: Vec<f64> = sweep_part
        .lines()
        .skip_while(|l| !l.starts_with("| job |"))
        .skip(2)
        .take_while(|l| l.starts_with("| ["))
        .map(|l| {
            l.split('|')
                .map(str::trim)
                .nth(column)
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(
        top1.len() >= 2 && top1.windows(2).all(|w| w[0] >= w[1]),
        "{top1:?}"
    );
    assert!(
        sweep_part.contains("val/acc1 by data.batch_size"),
        "{sweep_part}"
    );
    // What every run of the experiment shares is one line; no table is wider than a screen.
    assert!(book.contains("tags quickstart, synthetic, cnn"), "{book}");
    for header in book.lines().filter(|l| l.starts_with("| run |")) {
        assert!(header.matches(" | ").count() < 14, "{header}");
    }
    assert!(book.contains("train data.batch_size=32 sweep=batch_size experiment=quickstart"));

    // Unfinished runs are listed and marked, never dropped.
    assert!(book.contains("## Experiment `killed`"), "{book}");
    let killed_row = book
        .lines()
        .skip_while(|l| !l.starts_with("## Experiment `killed`"))
        .find(|l| l.starts_with("| ["))
        .unwrap();
    assert!(killed_row.contains("CRASHED"), "{killed_row}");
    assert!(book.contains("Every run: tags long, sigkill"), "{book}");
    assert!(
        book.lines()
            .any(|l| l.starts_with("| [") && l.contains("FAILED: mnist not found")),
        "{book}"
    );

    // Every linked SVG exists beside the markdown and parses as SVG.
    let svgs: Vec<&str> = book
        .lines()
        .filter_map(|l| l.strip_prefix("![")?.split_once("](")?.1.strip_suffix(')'))
        .collect();
    assert!(svgs.len() >= 6, "{svgs:?}");
    for svg in &svgs {
        assert_svg(&root.join("logs").join(svg));
    }
    example_in_the_guide(&book, &root.join("logs"), &svgs);
    rendered_as_a_person_sees_it(&book, &root.join("logs"));
}

/// The logbook as a person sees it: rendered to HTML (pulldown-cmark, as a Markdown viewer does) and each
/// plot to a PNG (resvg), written to `target/tmp/logbook-render/` to look at. Every table of the page is at
/// most 14 columns wide, every image it shows exists, and every plot draws something (not a blank image).
fn rendered_as_a_person_sees_it(book: &str, logs: &Path) {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("logbook-render");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let parser = pulldown_cmark::Parser::new_ext(book, pulldown_cmark::Options::ENABLE_TABLES);
    let mut html = String::new();
    pulldown_cmark::html::push_html(&mut html, parser);
    std::fs::write(out.join("logbook.html"), &html).unwrap();
    let tables: Vec<&str> = html.split("<table>").skip(1).collect();
    assert!(
        tables.len() >= 3,
        "{} tables in the rendered logbook",
        tables.len()
    );
    for table in &tables {
        let header = table.split("</tr>").next().unwrap();
        // `<th>` or `<th style=...>`, not the `<thead>` the header row sits in.
        let columns = header.matches("<th>").count() + header.matches("<th ").count();
        assert!(
            (2..=14).contains(&columns),
            "a table {columns} columns wide:\n{header}"
        );
    }
    let images: Vec<&str> = html
        .split("<img src=\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap())
        .collect();
    assert!(images.len() >= 6, "{images:?}");
    let fonts = {
        let mut db = resvg::usvg::fontdb::Database::new();
        db.load_system_fonts();
        // The plots ask for `sans-serif`: the machine's sans face (DejaVu Sans on Debian), else any.
        let family = |db: &resvg::usvg::fontdb::Database, want: &str| {
            db.faces()
                .flat_map(|f| f.families.iter().map(|(name, _)| name.clone()))
                .find(|name| name.contains(want))
        };
        if let Some(sans) = family(&db, "Sans").or_else(|| family(&db, "")) {
            db.set_sans_serif_family(sans);
        }
        std::sync::Arc::new(db)
    };
    for image in images {
        let svg = std::fs::read(logs.join(image)).unwrap_or_else(|e| panic!("{image}: {e}"));
        let options = resvg::usvg::Options {
            fontdb: fonts.clone(),
            ..Default::default()
        };
        let tree =
            resvg::usvg::Tree::from_data(&svg, &options).unwrap_or_else(|e| panic!("{image}: {e}"));
        let size = tree.size().to_int_size();
        let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
        pixmap.fill(resvg::tiny_skia::Color::WHITE);
        resvg::render(
            &tree,
            resvg::tiny_skia::Transform::default(),
            &mut pixmap.as_mut(),
        );
        let drawn = pixmap
            .pixels()
            .iter()
            .filter(|p| (p.red(), p.green(), p.blue()) != (255, 255, 255))
            .count();
        let share = drawn as f64 / (size.width() * size.height()) as f64;
        assert!(
            share > 0.002,
            "{image}: {drawn} drawn pixels of {size:?}: a blank plot"
        );
        let png = out.join(Path::new(image).with_extension("png").file_name().unwrap());
        pixmap.save_png(&png).unwrap();
    }
}

/// The guide's example logbook (`docs/src/example-logbook.md`, its plots in `docs/src/example-logbook/`) is
/// this test's: `TRAINYARD_WRITE_EXAMPLE_LOGBOOK=1` writes it from the run above; otherwise the committed one
/// must have the same sections and table columns as the one just generated (its numbers are a run's and
/// differ), so it cannot drift from what `train logbook` writes.
fn example_in_the_guide(book: &str, logs: &Path, svgs: &[&str]) {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src");
    let page = docs.join("example-logbook.md");
    let example = as_guide_page(book);
    if std::env::var_os("TRAINYARD_WRITE_EXAMPLE_LOGBOOK").is_some() {
        let plots = docs.join("example-logbook");
        let _ = std::fs::remove_dir_all(&plots);
        std::fs::create_dir_all(&plots).unwrap();
        for svg in svgs {
            std::fs::copy(logs.join(svg), plots.join(svg)).unwrap();
        }
        std::fs::write(&page, &example).unwrap();
    }
    let shape = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with('#') || l.starts_with("| run |") || l.starts_with("| job |"))
            // A sweep's heading names its time.
            .map(|l| l.replace(|c: char| c.is_ascii_digit(), "0"))
            // Whether a run waited for its data a fifth of the time depends on the machine's speed.
            .map(|l| l.replace(" waiting for data |", ""))
            .collect()
    };
    let committed = std::fs::read_to_string(&page).unwrap();
    assert_eq!(
        shape(&committed),
        shape(&example),
        "docs/src/example-logbook.md no longer has the logbook's shape: rerun this test with \
         TRAINYARD_WRITE_EXAMPLE_LOGBOOK=1 and commit the result"
    );
}

/// The logbook as a guide page: a title and where it comes from; links to run directories (which exist only
/// where the runs are) become their text; plots point into `example-logbook/`.
fn as_guide_page(book: &str) -> String {
    let mut out = String::from(
        "# An example logbook\n\nWhat `train logbook` wrote after the runs of `tests/logbook.rs` (a `just sweep \
         batch_size` sweep, a run that failed, one killed with SIGKILL); regenerated by that test with \
         `TRAINYARD_WRITE_EXAMPLE_LOGBOOK=1`. Links to run directories are plain text here.\n\n",
    );
    for line in book.lines() {
        // Where the runs were (a temporary directory of the test).
        if let Some((generated, _)) = line.split_once(" under `") {
            out.push_str(&format!("{generated} under `logs/`.\n"));
            continue;
        }
        if let Some(image) = line.strip_prefix("![") {
            if let Some((alt, target)) = image.split_once("](") {
                out.push_str(&format!("![{alt}](example-logbook/{}\n", target));
                continue;
            }
        }
        let mut rest = line;
        while let Some(open) = rest.find('[') {
            let Some(mid) = rest[open..].find("](").map(|m| open + m) else {
                break;
            };
            let Some(close) = rest[mid..].find(')').map(|c| mid + c) else {
                break;
            };
            out.push_str(&rest[..open]);
            out.push_str(&rest[open + 1..mid]);
            rest = &rest[close + 1..];
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// `-o` puts the page (and its plots) elsewhere; a path that does not exist is an error naming it.
#[test]
fn logbook_output_and_bad_paths() {
    let p = real_project();
    let root = p.path();
    assert!(train(root, SHORT).status.success());
    let out_file = root.join("reports/book.md");
    let out = train(root, &["logbook", "logs", "-o", out_file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let book = std::fs::read_to_string(&out_file).unwrap();
    assert!(book.contains("](../logs/quickstart/runs/"), "{book}");
    assert!(root.join("reports/book-quickstart-loss.svg").is_file());
    let out = train(root, &["logbook", "no/such/dir"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no/such/dir"),
        "{err}"
    );
}

/// Every job a sweep planned is in the logbook: one that failed before its run directory existed (a bad
/// value caught by the schema) is FAILED with its error, and the jobs `--fail-fast` never started are
/// marked "not started" with the reason — in the sweep's own section and in `train logbook`.
#[test]
fn sweep_jobs_without_a_run_directory_are_listed() {
    let p = real_project();
    let root = p.path();
    let mut args = vec!["-m", "--fail-fast", "data.batch_size=32,0,16,8"];
    args.extend_from_slice(SHORT);
    let out = train(root, &args);
    assert!(!out.status.success());
    let sweep_dir = dirs_in(&root.join("logs/quickstart/multiruns"))
        .pop()
        .unwrap();
    assert_eq!(dirs_in(&sweep_dir).len(), 1, "only job 0 made a directory");
    let section = std::fs::read_to_string(sweep_dir.join("logbook.md")).unwrap();
    assert!(train(root, &["logbook"]).status.success());
    let book = std::fs::read_to_string(root.join("logs/logbook.md")).unwrap();
    for page in [&section, &book] {
        let row = |job: &str| {
            page.lines()
                .find(|l| l.starts_with(&format!("| {job}")))
                .unwrap_or_else(|| panic!("no row for job {job}:\n{page}"))
                .to_string()
        };
        assert!(row("[0](").contains("| 32 | completed |"), "{page}");
        let failed = row("1 (no run directory)");
        assert!(
            failed.contains("| 0 | FAILED: ") && failed.contains("batch size must be at least 1"),
            "{failed}"
        );
        for (job, batch) in [("2", "16"), ("3", "8")] {
            let r = row(&format!("{job} (no run directory)"));
            assert!(
                r.contains(&format!(
                    "| {batch} | not started (sweep stopped: --fail-fast: job #1 failed) |"
                )),
                "{r}"
            );
        }
        assert!(page.contains("- 3 job(s) did not finish"), "{page}");
    }
    // The experiment table lists the four jobs too, and the command that reruns the one never started.
    let name = sweep_dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(book.contains(&format!("| {name}#3 (no run directory) | not started")));
    let rerun = book
        .lines()
        .find(|l| l.ends_with(&format!("# {name}#3")))
        .unwrap_or_else(|| panic!("no command for job 3:\n{book}"));
    assert!(rerun.starts_with("train data.batch_size=8 "), "{rerun}");
}

/// A run whose steps mostly wait for their batches (a tiny MLP on large generated images made on the
/// training thread) is told it is input-bound at its end, records both times in summary.json, and the
/// logbook's "waiting for data" column says so; a run that measured no waiting would show none of it.
#[test]
fn an_input_bound_run_is_said_so() {
    let p = real_project();
    let out = train(
        p.path(),
        &[
            "experiment=quickstart",
            "model=mlp",
            "model.hidden=[8]",
            "~model.channels",
            "data.image_size=96",
            "data.train_size=512",
            "data.val_size=64",
            "data.batch_size=64",
            "data.num_workers=0",
            "trainer.max_epochs=1",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Input-bound: the training steps waited"),
        "{stdout}"
    );
    let run = dirs_in(&p.path().join("logs/quickstart/runs"))
        .pop()
        .unwrap();
    let s = summary(&run);
    let (waiting, computing) = (
        s["input"]["waiting_s"].as_f64().unwrap(),
        s["input"]["computing_s"].as_f64().unwrap(),
    );
    assert!(waiting / (waiting + computing) >= 0.2, "{s}");
    let book = p.path().join("logbook.md");
    let made = Command::new(TRAIN)
        .args(["logbook", p.path().join("logs").to_str().unwrap(), "-o"])
        .arg(&book)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let text = std::fs::read_to_string(&book).unwrap();
    assert!(
        text.contains("waiting for data") && text.contains("(input-bound)"),
        "{text}"
    );
}
