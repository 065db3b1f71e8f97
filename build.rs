//! With the `torch` feature, give every linked target (the `train` binary, tests, examples) an rpath to
//! libtorch's `lib/`, so they run without LD_LIBRARY_PATH. libtorch is found as torch-sys finds it:
//! `LIBTORCH=<dir>` or `LIBTORCH_USE_PYTORCH=1` (the Python interpreter's torch package).
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_LIB");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        return;
    }
    let lib = if let Ok(dir) = std::env::var("LIBTORCH_LIB") {
        Some(PathBuf::from(dir).join("lib"))
    } else if let Ok(dir) = std::env::var("LIBTORCH") {
        Some(PathBuf::from(dir).join("lib"))
    } else if std::env::var_os("LIBTORCH_USE_PYTORCH").is_some() {
        let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python3".into());
        std::process::Command::new(python)
            .args([
                "-c",
                "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))",
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
    } else {
        None // torch-sys stops the build with its own message on where to find libtorch
    };
    if let Some(lib) = lib {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    }
}
