//! Generates the CSI v1 and kubelet plugin-registration gRPC code from the vendored protos with
//! protox (a pure-Rust protobuf compiler: no `protoc` needed on the build machine).

/// CSI messages with a `secrets` field.
const SECRET_CARRIERS: &[&str] = &[
    "CreateVolumeRequest",
    "DeleteVolumeRequest",
    "ControllerPublishVolumeRequest",
    "ControllerUnpublishVolumeRequest",
    "ValidateVolumeCapabilitiesRequest",
    "ControllerExpandVolumeRequest",
    "NodeStageVolumeRequest",
    "NodePublishVolumeRequest",
    "NodeExpandVolumeRequest",
    "CreateSnapshotRequest",
    "DeleteSnapshotRequest",
    "ListSnapshotsRequest",
    "ControllerModifyVolumeRequest",
    "CreateVolumeGroupSnapshotRequest",
    "DeleteVolumeGroupSnapshotRequest",
    "GetVolumeGroupSnapshotRequest",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/csi.proto", "proto/pluginregistration.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        // Requests carrying `secrets` get a hand-written, redacting Debug (src/proto.rs).
        .skip_debug(SECRET_CARRIERS.iter().map(|m| format!(".csi.v1.{m}")))
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
