//! A minimal backend: "volumes" are entries in a map. Shows everything a backend writes.
//!
//! Run against a cluster (or the kube-emulator) with `cargo run -p provisioner --example
//! memory_backend`; it provisions claims whose class names `example.com/memory`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
};
use provisioner::{
    Config, Controller, DeleteError, ProvisionError, ProvisionOptions, Provisioned, Provisioner,
    quantity,
};

#[derive(Default)]
struct MemoryBackend {
    /// Volume name -> size in bytes.
    volumes: Mutex<BTreeMap<String, u64>>,
}

#[async_trait]
impl Provisioner for MemoryBackend {
    async fn provision(&self, options: ProvisionOptions) -> Result<Provisioned, ProvisionError> {
        let size = options.requested_bytes().ok_or_else(|| {
            ProvisionError::final_error("spec.resources.requests.storage is missing")
        })?;
        // Deterministic name: a retry finds the same volume instead of creating a second one.
        self.volumes
            .lock()
            .map_err(|_| ProvisionError::final_error("backend state poisoned"))?
            .entry(options.pv_name.clone())
            .or_insert(size);
        let volume = PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                capacity: Some([("storage".to_owned(), quantity::quantity(size))].into()),
                csi: Some(CSIPersistentVolumeSource {
                    driver: "memory.example.com".to_owned(),
                    volume_handle: options.pv_name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        // The library adds name, claimRef, class, reclaim policy, annotations.
        Ok(Provisioned {
            volume,
            deletion_secret: None,
        })
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let name = volume.metadata.name.clone().unwrap_or_default();
        // Already gone is a success.
        self.volumes
            .lock()
            .map_err(|_| DeleteError::failed("backend state poisoned"))?
            .remove(&name);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = kube::Client::try_default().await?;
    let controller = Controller::new(
        client,
        Config::new("example.com/memory"),
        Arc::new(MemoryBackend::default()),
    );
    controller
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
