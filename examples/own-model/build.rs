//! With `--features torch`: an rpath to libtorch's `lib/` (found as trainyard's build finds it:
//! `LIBTORCH=<dir>`), so this crate's `train` and its tests run without LD_LIBRARY_PATH. A link argument
//! from a build script reaches only its own package's targets, so each crate that links libtorch says it.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_LIB");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        return;
    }
    let lib = std::env::var("LIBTORCH_LIB")
        .or_else(|_| std::env::var("LIBTORCH"))
        .map(|dir| std::path::PathBuf::from(dir).join("lib"));
    if let Ok(lib) = lib {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    }
}
