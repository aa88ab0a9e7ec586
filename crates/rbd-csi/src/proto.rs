//! Generated gRPC code: CSI v1 (`csi`) and kubelet plugin registration (`pluginregistration`).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// CSI v1 messages and the Identity, Controller and Node services (server and client).
pub mod csi {
    tonic::include_proto!("csi.v1");
}

/// Kubelet plugin registration v1 (`Registration` service, server and client).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}
