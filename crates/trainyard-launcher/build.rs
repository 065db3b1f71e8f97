//! The PyTorch release the launcher accepts: `TRAINYARD_TORCH_VERSION` (major.minor) when the wheel's build
//! names it, else 2.11, the libtorch that tch 0.24 binds.
fn main() {
    println!("cargo:rerun-if-env-changed=TRAINYARD_TORCH_VERSION");
    let version = std::env::var("TRAINYARD_TORCH_VERSION").unwrap_or_else(|_| "2.11".into());
    println!("cargo:rustc-env=TRAINYARD_TORCH_VERSION={version}");
}
