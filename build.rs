//! With the `torch` feature: compile the small C++ shims (`src/backend/torch/shim.cpp`: autocast;
//! `src/dist/c10d_shim.cpp`: TCPStore and Gloo collectives) against libtorch's headers, and give every
//! linked target (the `train` binary, tests, examples) an rpath to libtorch's `lib/`, so they run without
//! LD_LIBRARY_PATH. libtorch is found as torch-sys finds it: `LIBTORCH=<dir>` or `LIBTORCH_USE_PYTORCH=1`
//! (the Python interpreter's torch package).
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_LIB");
    println!("cargo:rerun-if-changed=src/backend/torch/shim.cpp");
    println!("cargo:rerun-if-changed=src/dist/c10d_shim.cpp");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        return;
    }
    let root = if let Ok(dir) = std::env::var("LIBTORCH_LIB") {
        Some(PathBuf::from(dir))
    } else if let Ok(dir) = std::env::var("LIBTORCH") {
        Some(PathBuf::from(dir))
    } else if std::env::var_os("LIBTORCH_USE_PYTORCH").is_some() {
        let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python3".into());
        std::process::Command::new(python)
            .args([
                "-c",
                "import os, torch; print(os.path.dirname(torch.__file__))",
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
    } else {
        None
    };
    let Some(root) = root else {
        return; // torch-sys stops the build with its own message on where to find libtorch
    };
    println!(
        "cargo:rustc-link-arg=-Wl,-rpath,{}",
        root.join("lib").display()
    );
    println!("cargo:rerun-if-env-changed=LIBTORCH_INCLUDE");
    let include = std::env::var("LIBTORCH_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or(root)
        .join("include");
    cc::Build::new()
        .cpp(true)
        .file("src/backend/torch/shim.cpp")
        .file("src/dist/c10d_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        // c10d's Gloo header includes gloo's own headers: Debian's libgloo-dev (/usr/include/gloo).
        .flag("-DUSE_C10D_GLOO")
        .warnings(false)
        .compile("trainyard_torch_shim");
}
