//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod pv_env;

use std::time::Duration;

use axum::body::Body;
use http::Request;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube_emulator::Emulator;
use serde_json::{Value, json};
use tower::ServiceExt;

pub fn pvc(name: &str, class: Option<&str>, size: &str) -> PersistentVolumeClaim {
    let mut v = json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    });
    if let Some(c) = class {
        v["spec"]["storageClassName"] = json!(c);
    }
    serde_json::from_value(v).unwrap()
}

pub fn storage_class(name: &str, wffc: bool, expand: bool) -> StorageClass {
    let mut v = json!({
        "metadata": {"name": name},
        "provisioner": "ceph.com/rbd",
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": expand,
    });
    if wffc {
        v["volumeBindingMode"] = json!("WaitForFirstConsumer");
    }
    serde_json::from_value(v).unwrap()
}

/// A CSI PV pre-bound to `claim` (as a provisioner creates it).
pub fn prebound_pv(claim: &PersistentVolumeClaim, class: &str, size: &str) -> PersistentVolume {
    let uid = claim.metadata.uid.clone().unwrap();
    serde_json::from_value(json!({
        "metadata": {"name": format!("pvc-{uid}"), "annotations": {"pv.kubernetes.io/provisioned-by": "ceph.com/rbd"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": class,
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "default",
                         "name": claim.metadata.name.clone().unwrap(), "uid": uid},
            "csi": {"driver": "rbd.example.com", "volumeHandle": "rbd/img1", "fsType": "ext4"}
        }
    }))
    .unwrap()
}

/// Polls `f` until it returns `Some` or the deadline passes.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub struct Raw {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Value,
    pub text: String,
}

/// One raw HTTP request against the router (no socket).
pub async fn raw(
    emu: &Emulator,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> Raw {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let req = req.body(Body::from(body.to_string())).unwrap();
    let resp = emu.router().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Raw {
        status,
        headers,
        body,
        text,
    }
}

/// Reads a recorded step's response body from the traces.
pub fn recorded(file: &str, step: u64) -> Value {
    let path = format!("{}/tests/traces/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap();
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step"] == step)
        .unwrap_or_else(|| panic!("step {step} in {file}"))
        .clone()
}

/// The Status of an API error.
pub fn api_err(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub fn pvcs(emu: &kube_emulator::Emulator) -> kube::Api<PersistentVolumeClaim> {
    kube::Api::default_namespaced(emu.client())
}

pub fn no_controller() -> kube_emulator::Emulator {
    kube_emulator::Emulator::builder()
        .pv_controller(false)
        .build()
}
