//! Compiles the vendored Kubernetes `generated.proto` files (see `proto/README.md`) into a
//! descriptor set with protox (pure Rust, no `protoc`), for the protobuf request decoder.

const PROTOS: &[&str] = &[
    "k8s.io/api/core/v1/generated.proto",
    "k8s.io/api/storage/v1/generated.proto",
    "k8s.io/api/coordination/v1/generated.proto",
    "k8s.io/api/events/v1/generated.proto",
    "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files: Vec<String> = PROTOS.iter().map(|p| format!("proto/{p}")).collect();
    // Without source info: the comments would triple the size of the embedded descriptors.
    let fds = protox::Compiler::new(["proto"])?
        .include_source_info(false)
        .include_imports(true)
        .open_files(&files)?
        .file_descriptor_set();
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("k8s-protos.bin");
    std::fs::write(out, prost::Message::encode_to_vec(&fds))?;
    Ok(())
}
