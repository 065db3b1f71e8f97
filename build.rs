//! Always: the shipped config groups (`conf/`, `experiments/` as the `experiment` group) embedded as a
//! table of `include_str!`s (`src/project/shipped.rs`), W&B's record types from `proto/wandb_internal.proto` (prost, compiled with protox: no `protoc`),
//! and the small C shim through which the JPEG entropy decoder reaches libjpeg's scan.
//! With the `torch` feature: compile the small C++ shims (`src/backend/torch/shim.cpp`: autocast;
//! `src/comm/c10d_shim.cpp`: TCPStore and Gloo collectives) against libtorch's headers, and give every
//! linked target (the `train` binary, tests, examples) an rpath to libtorch's `lib/`, so they run without
//! LD_LIBRARY_PATH. libtorch is found as torch-sys finds it: `LIBTORCH=<dir>` or `LIBTORCH_USE_PYTORCH=1`
//! (the Python interpreter's torch package).
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_LIB");
    println!("cargo:rerun-if-changed=src/backend/torch/shim.cpp");
    println!("cargo:rerun-if-changed=src/backend/torch/jit_shim.cpp");
    println!("cargo:rerun-if-changed=src/comm/c10d_shim.cpp");
    println!("cargo:rerun-if-changed=src/comm/nccl_shim.cpp");
    println!("cargo:rerun-if-env-changed=TRAINYARD_CUDA_HEADERS");
    println!("cargo:rerun-if-env-changed=TRAINYARD_NCCL");
    println!("cargo:rerun-if-env-changed=TRAINYARD_GLOO_INCLUDE");
    println!("cargo::rustc-check-cfg=cfg(trainyard_nccl)");
    wandb_records();
    jpeg_scan_shim();
    shipped_configs();
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
        .unwrap_or_else(|_| root.clone())
        .join("include");
    let Some(gloo) = gloo_include() else {
        // One line instead of a page of C++ errors from c10d's ProcessGroupGloo.hpp.
        println!(
            "cargo::error=the torch build needs gloo's headers (gloo/config.h), which libtorch's wheel \
             does not ship: install Debian's libgloo-dev (apt-get install libgloo-dev), or set \
             TRAINYARD_GLOO_INCLUDE=<folder holding gloo/>"
        );
        return;
    };
    let mut shim = cc::Build::new();
    if let Some(dir) = gloo {
        shim.include(dir);
    }
    shim.cpp(true)
        .file("src/backend/torch/shim.cpp")
        .file("src/backend/torch/jit_shim.cpp")
        .file("src/comm/c10d_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        // c10d's Gloo header includes gloo's own headers: Debian's libgloo-dev (/usr/include/gloo).
        .flag("-DUSE_C10D_GLOO")
        .warnings(false)
        .compile("trainyard_torch_shim");
    build_nccl_shim(&root, &include);
}

/// Where gloo's headers are: `Some(None)` in the compiler's own search path (Debian's libgloo-dev puts
/// them in /usr/include), `Some(Some(dir))` under TRAINYARD_GLOO_INCLUDE, `None` nowhere.
fn gloo_include() -> Option<Option<PathBuf>> {
    if let Ok(dir) = std::env::var("TRAINYARD_GLOO_INCLUDE") {
        let dir = PathBuf::from(dir);
        return dir.join("gloo/config.h").is_file().then_some(Some(dir));
    }
    let standard = ["/usr/include", "/usr/local/include"];
    standard
        .iter()
        .any(|d| std::path::Path::new(d).join("gloo/config.h").is_file())
        .then_some(None)
}

/// The folders of CUDA's and NCCL's headers that ProcessGroupNCCL's header includes, laid out as NVIDIA's
/// wheels install them (`nvidia/cu13/include`, its `cccl`, `nvidia/nccl/include`): under
/// TRAINYARD_CUDA_HEADERS, else beside libtorch (scripts/install-libtorch.sh puts them there).
fn cuda_header_dirs(torch_root: &std::path::Path) -> Result<Vec<PathBuf>, String> {
    let base = match std::env::var("TRAINYARD_CUDA_HEADERS") {
        Ok(dir) => PathBuf::from(dir),
        Err(_) => torch_root
            .parent()
            .map(PathBuf::from)
            .ok_or("libtorch has no parent folder")?,
    };
    let cuda = base.join("nvidia/cu13/include");
    let dirs = vec![
        cuda.clone(),
        cuda.join("cccl"),
        base.join("nvidia/nccl/include"),
    ];
    for needed in [
        cuda.join("cuda_runtime_api.h"),
        cuda.join("crt/host_config.h"),
        cuda.join("cublas_v2.h"),
        cuda.join("cusparse.h"),
        cuda.join("cusolverDn.h"),
        cuda.join("cccl/nv/target"),
        base.join("nvidia/nccl/include/nccl.h"),
    ] {
        if !needed.exists() {
            return Err(format!("{} is missing", needed.display()));
        }
    }
    Ok(dirs)
}

/// Build `src/comm/nccl_shim.cpp` into `$OUT_DIR/libtrainyard_nccl.so` (src/comm/nccl.rs embeds it and sets
/// cfg `trainyard_nccl`) when libtorch has its CUDA library. Its CUDA and NCCL headers must then be there
/// (one line naming the wheels that carry them stops the build otherwise), unless `TRAINYARD_NCCL=off`
/// asks for a build without NCCL. A libtorch without CUDA builds without it, saying so.
fn build_nccl_shim(torch_root: &std::path::Path, include: &std::path::Path) {
    let lib = torch_root.join("lib");
    if !lib.join("libtorch_cuda.so").exists() {
        println!(
            "cargo:warning=no NCCL in this build: this libtorch has no CUDA library ({} is missing)",
            lib.join("libtorch_cuda.so").display()
        );
        return;
    }
    if std::env::var("TRAINYARD_NCCL").is_ok_and(|v| v == "off") {
        println!("cargo:warning=no NCCL in this build (TRAINYARD_NCCL=off)");
        return;
    }
    let headers = match cuda_header_dirs(torch_root) {
        Ok(dirs) => dirs,
        Err(why) => {
            println!(
                "cargo::error=the NCCL shim needs the CUDA and NCCL headers ({why}): `eval \"$(scripts/install-libtorch.sh)\"` \
                 fetches them from PyPI's nvidia-cuda-runtime, nvidia-cuda-crt, nvidia-cuda-cccl, nvidia-cublas, \
                 nvidia-cusparse, nvidia-cusolver and nvidia-nccl-cu13 wheels (TRAINYARD_CUDA_HEADERS=<folder> points \
                 elsewhere); or build without NCCL with TRAINYARD_NCCL=off"
            );
            return;
        }
    };
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("libtrainyard_nccl.so");
    let mut cmd = cc::Build::new().cpp(true).get_compiler().to_command();
    cmd.args(["-std=c++17", "-shared", "-fPIC", "-O2", "-g0", "-w"])
        .args([
            "-D_GLIBCXX_USE_CXX11_ABI=1",
            "-DGLOG_USE_GLOG_EXPORT",
            "-DUSE_C10D_NCCL",
            "-DUSE_CUDA",
        ])
        .arg(format!("-I{}", include.display()))
        .arg(format!(
            "-I{}",
            include.join("torch/csrc/api/include").display()
        ));
    for dir in &headers {
        cmd.arg(format!("-I{}", dir.display()));
    }
    // libtorch_cuda.so's own CUDA libraries need not be here: the shim is loaded only where they are.
    cmd.arg("src/comm/nccl_shim.cpp")
        .arg("-o")
        .arg(&out)
        .arg(format!("-L{}", lib.display()))
        .args([
            "-ltorch_cuda",
            "-lc10_cuda",
            "-ltorch_cpu",
            "-lc10",
            "-Wl,--allow-shlib-undefined",
        ]);
    let status = cmd
        .status()
        .expect("running the C++ compiler for the NCCL shim");
    assert!(
        status.success(),
        "compiling src/comm/nccl_shim.cpp failed: {cmd:?}"
    );
    println!("cargo:rustc-cfg=trainyard_nccl");
}

/// W&B's record types (`proto/wandb_internal.proto`, the part trainyard writes) as prost structs in
/// `OUT_DIR`, compiled with protox (pure Rust: no `protoc` on the build machine).
fn wandb_records() {
    println!("cargo:rerun-if-changed=proto/wandb_internal.proto");
    let descriptors = protox::compile(["wandb_internal.proto"], ["proto"])
        .expect("proto/wandb_internal.proto does not compile");
    prost_build::Config::new()
        .compile_fds(descriptors)
        .expect("prost could not generate W&B's record types");
}

/// `src/data/jpeg/scan_shim.c`, which reads libjpeg's scan layout for the entropy decoder, compiled
/// against the headers mozjpeg-sys built libjpeg with (its `links = "jpeg"` hands them over).
fn jpeg_scan_shim() {
    println!("cargo:rerun-if-changed=src/data/jpeg/scan_shim.c");
    let include =
        std::env::var_os("DEP_JPEG_INCLUDE").expect("mozjpeg-sys names its include folders");
    let mut build = cc::Build::new();
    build.file("src/data/jpeg/scan_shim.c").warnings(true);
    for dir in std::env::split_paths(&include) {
        build.include(dir);
    }
    build.compile("trainyard_jpeg_scan");
}

/// `$OUT_DIR/shipped_configs.rs`: every YAML file of `conf/` (config path = its path there, without
/// `.yaml`) and of `experiments/` (as `experiment/<name>`), sorted, each a `BuiltinConfig` whose text is an
/// `include_str!` of the file, so the binary carries the shipped groups and needs none of these files.
fn shipped_configs() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let mut entries = Vec::new();
    for (dir, mount) in [("conf", ""), ("experiments", "experiment")] {
        println!("cargo:rerun-if-changed={dir}");
        collect_yaml(&root.join(dir), &root.join(dir), mount, &mut entries);
    }
    entries.sort();
    let mut out = String::from("&[\n");
    for (config_path, file) in entries {
        out.push_str(&format!(
            "    BuiltinConfig {{ config_path: {config_path:?}, source: &TRAINYARD_CONF, text: include_str!({:?}) }},\n",
            file.display().to_string()
        ));
    }
    out.push_str("]\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("shipped_configs.rs");
    std::fs::write(dest, out).expect("writing shipped_configs.rs");
}

fn collect_yaml(
    base: &std::path::Path,
    dir: &std::path::Path,
    mount: &str,
    out: &mut Vec<(String, PathBuf)>,
) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in read.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_yaml(base, &path, mount, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            let rel = path
                .strip_prefix(base)
                .expect("below base")
                .with_extension("")
                .to_string_lossy()
                .replace('\\', "/");
            let config_path = if mount.is_empty() {
                rel
            } else {
                format!("{mount}/{rel}")
            };
            out.push((config_path, path));
        }
    }
}
