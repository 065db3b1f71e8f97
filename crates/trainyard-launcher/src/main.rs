//! `train` as the trainyard-torch wheel installs it: a small program that finds the PyTorch installed in
//! the same Python environment, refuses any version but the one trainyard was built against (libtorch's
//! C++ interface changes with every release, and a mismatch would fail in the dynamic loader with a
//! symbol name, or worse, run), and then becomes trainyard's own libtorch build (`exec`), which the wheel
//! keeps in its Python package, `trainyard_torch/libexec/train`. That binary finds libtorch through its
//! RUNPATH, `$ORIGIN/../../torch/lib`: the `torch` package beside `trainyard_torch`. Where torch lives in
//! another site-packages (a `--user` install beside a system torch), its `lib/` is named to the loader in
//! `LD_LIBRARY_PATH` for that process.
//!
//! Where nothing is found by looking at the installed files (an unusual layout), the environment's own
//! `python3` is asked where `torch` is.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The PyTorch release (major.minor) whose libtorch trainyard's build links.
const TORCH: &str = env!("TRAINYARD_TORCH_VERSION");
const PACKAGE: &str = "trainyard_torch";

fn main() -> ExitCode {
    match launch() {
        Ok(never) => match never {},
        Err(message) => {
            eprintln!("Error: {message}");
            ExitCode::from(1)
        }
    }
}

enum Never {}

fn launch() -> Result<Never, String> {
    let exe = std::env::current_exe().map_err(|e| format!("where is this program? {e}"))?;
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    let dirs = site_dirs(&exe);
    let package = dirs
        .iter()
        .map(|d| d.join(PACKAGE))
        .find(|p| p.join("libexec/train").is_file())
        .ok_or_else(|| {
            format!(
                "trainyard-torch's program (`{PACKAGE}/libexec/train`) is not in the site-packages beside \
                 {} (looked in: {}); reinstall it: pip install --force-reinstall trainyard-torch",
                exe.display(),
                shown(&dirs)
            )
        })?;
    let site = package
        .parent()
        .expect("a package has a parent")
        .to_path_buf();
    let torch = find_torch(&site, &dirs).or_else(|| ask_python(&exe));
    let torch = torch.ok_or_else(|| {
        format!(
            "trainyard-torch runs on PyTorch {TORCH}, which is not installed in this environment: \
             pip install torch=={TORCH}.*"
        )
    })?;
    if !same_release(&torch.version, TORCH) {
        return Err(format!(
            "trainyard-torch {} was built against PyTorch {TORCH} (libtorch's C++ interface changes with \
             every release); this environment has torch {} ({}). Install the matching one: \
             pip install torch=={TORCH}.*",
            env!("CARGO_PKG_VERSION"),
            torch.version,
            torch.dir.display()
        ));
    }
    let mut command = Command::new(package.join("libexec/train"));
    command.args(std::env::args_os().skip(1));
    command.arg0(
        std::env::args_os()
            .next()
            .unwrap_or_else(|| OsString::from("train")),
    );
    if torch.dir.parent() != Some(site.as_path()) {
        // Not where the program's RUNPATH looks: name torch's libraries to the loader.
        let lib = torch.dir.join("lib");
        let mut paths = vec![lib];
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            paths.extend(std::env::split_paths(&old));
        }
        let joined = std::env::join_paths(paths).map_err(|e| e.to_string())?;
        command.env("LD_LIBRARY_PATH", joined);
    }
    let err = command.exec();
    Err(format!(
        "could not start {}: {err}",
        package.join("libexec/train").display()
    ))
}

/// The site-packages (and Debian's dist-packages) folders of the environment this program is installed
/// in: `<prefix>/lib/python3.*/{site,dist}-packages` for `<prefix>/bin/train` (venvs, conda, `--user`,
/// system installs).
fn site_dirs(exe: &Path) -> Vec<PathBuf> {
    let Some(prefix) = exe.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for python in pythons {
            for kind in ["site-packages", "dist-packages"] {
                let dir = python.join(kind);
                if dir.is_dir() {
                    out.push(dir);
                }
            }
        }
    }
    out
}

fn shown(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "nothing: no lib/python3.*/site-packages there".into();
    }
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// An installed `torch`: its package folder and version.
struct Torch {
    dir: PathBuf,
    version: String,
}

/// `torch` in `site` first, then in the other folders, from its `torch-<version>.dist-info`.
fn find_torch(site: &Path, dirs: &[PathBuf]) -> Option<Torch> {
    let order = std::iter::once(site.to_path_buf()).chain(dirs.iter().cloned());
    for dir in order {
        if !dir.join("torch/lib").is_dir() {
            continue;
        }
        let version = std::fs::read_dir(&dir).ok()?.flatten().find_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.strip_prefix("torch-")
                .and_then(|rest| rest.strip_suffix(".dist-info"))
                .map(str::to_string)
        });
        if let Some(version) = version {
            return Some(Torch {
                dir: dir.join("torch"),
                version,
            });
        }
    }
    None
}

/// Asks the environment's `python3` (beside this program, else on PATH) where `torch` is and which
/// version it is, without importing it. `None`: there is no Python, or it knows of no torch.
fn ask_python(exe: &Path) -> Option<Torch> {
    let beside = exe.with_file_name("python3");
    let python = if beside.is_file() {
        beside
    } else {
        PathBuf::from("python3")
    };
    let script = "import importlib.metadata as m, importlib.util as u\n\
                  s = u.find_spec('torch')\n\
                  print(m.version('torch') if s else '')\n\
                  print(s.submodule_search_locations[0] if s else '')";
    // No Python to ask is no torch to find.
    let Ok(out) = Command::new(&python).args(["-c", script]).output() else {
        return None;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let (version, dir) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    if !out.status.success() || version.is_empty() || dir.is_empty() {
        return None;
    }
    Some(Torch {
        dir: PathBuf::from(dir),
        version: version.to_string(),
    })
}

/// Whether `version` (`2.11.0`, `2.11.0+cpu`, `2.11.1`) is release `release` (`2.11`).
fn same_release(version: &str, release: &str) -> bool {
    let mut parts = version.split(['.', '+']);
    let want: Vec<&str> = release.split('.').collect();
    want.iter().all(|w| parts.next() == Some(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_compare_by_major_and_minor() {
        assert!(same_release("2.11.0", "2.11"));
        assert!(same_release("2.11.0+cpu", "2.11"));
        assert!(same_release("2.11.3", "2.11"));
        assert!(!same_release("2.10.0", "2.11"));
        assert!(!same_release("2.1.0", "2.11"));
        assert!(!same_release("12.11.0", "2.11"));
    }

    #[test]
    fn finds_torch_and_its_version_beside_the_package() {
        let tmp = std::env::temp_dir().join(format!("launcher-test-{}", std::process::id()));
        let site = tmp.join("lib/python3.11/site-packages");
        std::fs::create_dir_all(site.join("torch/lib")).unwrap();
        std::fs::create_dir_all(site.join("torch-2.10.0.dist-info")).unwrap();
        let exe = tmp.join("bin/train");
        assert_eq!(site_dirs(&exe), vec![site.clone()]);
        let torch = find_torch(&site, std::slice::from_ref(&site)).unwrap();
        assert_eq!(torch.version, "2.10.0");
        assert_eq!(torch.dir, site.join("torch"));
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
