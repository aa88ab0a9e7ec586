//! Generates the librados/librbd FFI declarations from the system headers (Debian:
//! librados-dev, librbd-dev; bindgen needs libclang-dev) and links both libraries.
//! Only the `rados_*` and `rbd_*` items are kept.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rustc-link-lib=rbd");
    println!("cargo:rustc-link-lib=rados");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("rados_.*")
        .allowlist_function("rbd_.*")
        .allowlist_type("rados_.*")
        .allowlist_type("rbd_.*")
        .allowlist_var("RBD_.*")
        .allowlist_var("LIBRADOS_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .layout_tests(false)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen failed on librbd/librados headers (install librbd-dev librados-dev libclang-dev): {e}"));
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into()));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .unwrap_or_else(|e| panic!("writing bindings: {e}"));
}
