//! An in-memory test backend that records calls and can be told to fail.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
};
use provisioner::{
    DeleteError, ExpandError, ExpandOutcome, Expander, ProvisionError, ProvisionOptions,
    Provisioned, Provisioner, SecretRef, quantity,
};
use tokio::sync::Semaphore;

/// What the next `provision` call does instead of succeeding.
#[derive(Clone, Debug)]
#[allow(dead_code)]
pub enum Scripted {
    Final(&'static str),
    /// Creates the volume, then reports it as still in progress.
    InBackground(&'static str),
    Reschedule(&'static str),
    Ignored,
}

#[derive(Default)]
pub struct FakeBackend {
    /// Volume name -> size in bytes.
    pub volumes: Mutex<BTreeMap<String, u64>>,
    pub provision_calls: AtomicUsize,
    pub delete_calls: AtomicUsize,
    pub expand_calls: AtomicUsize,
    pub selected_nodes: Mutex<Vec<Option<String>>>,
    pub script: Mutex<VecDeque<Scripted>>,
    pub delete_failures: AtomicUsize,
    pub expand_failures: AtomicUsize,
    /// When set, `provision` creates the volume and then waits for a permit (never, if 0).
    pub gate: Mutex<Option<Arc<Semaphore>>>,
    pub node_expansion_required: bool,
    /// When set, sizes are rounded up to a multiple of this (as a real backend rounds to MiB).
    pub round_to: Option<u64>,
    /// Identity stamped on created volumes (to tell which controller created them).
    pub created_by: Mutex<BTreeMap<String, usize>>,
}

#[allow(dead_code)]
impl FakeBackend {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn script(&self, steps: impl IntoIterator<Item = Scripted>) {
        self.script.lock().unwrap().extend(steps);
    }

    pub fn fail_deletes(&self, count: usize) {
        self.delete_failures.store(count, Ordering::SeqCst);
    }

    pub fn fail_expands(&self, count: usize) {
        self.expand_failures.store(count, Ordering::SeqCst);
    }

    pub fn has_volume(&self, name: &str) -> bool {
        self.volumes.lock().unwrap().contains_key(name)
    }

    pub fn volume_count(&self) -> usize {
        self.volumes.lock().unwrap().len()
    }

    pub fn provisions(&self) -> usize {
        self.provision_calls.load(Ordering::SeqCst)
    }

    pub fn deletes(&self) -> usize {
        self.delete_calls.load(Ordering::SeqCst)
    }

    pub fn expands(&self) -> usize {
        self.expand_calls.load(Ordering::SeqCst)
    }

    fn rounded(&self, bytes: u64) -> u64 {
        self.round_to
            .map_or(bytes, |unit| bytes.next_multiple_of(unit))
    }

    fn create(&self, options: &ProvisionOptions) -> u64 {
        let size = self.rounded(options.requested_bytes().unwrap_or(1 << 30));
        let mut volumes = self.volumes.lock().unwrap();
        let mut created = self.created_by.lock().unwrap();
        if !volumes.contains_key(&options.pv_name) {
            *created.entry(options.pv_name.clone()).or_insert(0) += 1;
        }
        *volumes.entry(options.pv_name.clone()).or_insert(size)
    }
}

#[async_trait]
impl Provisioner for FakeBackend {
    async fn provision(&self, options: ProvisionOptions) -> Result<Provisioned, ProvisionError> {
        self.provision_calls.fetch_add(1, Ordering::SeqCst);
        self.selected_nodes.lock().unwrap().push(
            options
                .selected_node
                .as_ref()
                .and_then(|n| n.metadata.name.clone()),
        );
        let step = self.script.lock().unwrap().pop_front();
        match step {
            Some(Scripted::Final(why)) => return Err(ProvisionError::final_error(why)),
            Some(Scripted::InBackground(why)) => {
                self.create(&options);
                return Err(ProvisionError::in_background(why));
            }
            Some(Scripted::Reschedule(why)) => return Err(ProvisionError::reschedule(why)),
            Some(Scripted::Ignored) => return Err(ProvisionError::ignored("not mine")),
            None => {}
        }
        let size = self.create(&options);
        let gate = self.gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            let _permit = gate.acquire().await;
        }
        Ok(Provisioned {
            volume: PersistentVolume {
                spec: Some(PersistentVolumeSpec {
                    capacity: Some([("storage".to_owned(), quantity::quantity(size))].into()),
                    csi: Some(CSIPersistentVolumeSource {
                        driver: "fake.example.com".to_owned(),
                        volume_handle: options.pv_name.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            deletion_secret: Some(SecretRef {
                namespace: "storage".to_owned(),
                name: "admin-secret".to_owned(),
            }),
        })
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        self.delete_calls.fetch_add(1, Ordering::SeqCst);
        let failures = self.delete_failures.load(Ordering::SeqCst);
        if failures > 0 {
            self.delete_failures.store(failures - 1, Ordering::SeqCst);
            return Err(DeleteError::failed(
                "volume is in use by 1 watcher: unmap it on the node",
            ));
        }
        // The deletion secret must come from the PV, never from the class.
        if provisioner::volume::deletion_secret(volume).is_none() {
            return Err(DeleteError::failed("no deletion secret recorded on the PV"));
        }
        let name = volume.metadata.name.clone().unwrap_or_default();
        self.volumes.lock().unwrap().remove(&name);
        Ok(())
    }

    fn supports_block(&self) -> bool {
        true
    }
}

#[async_trait]
impl Expander for FakeBackend {
    async fn expand(
        &self,
        volume: &PersistentVolume,
        new_size_bytes: u64,
    ) -> Result<ExpandOutcome, ExpandError> {
        self.expand_calls.fetch_add(1, Ordering::SeqCst);
        let failures = self.expand_failures.load(Ordering::SeqCst);
        if failures > 0 {
            self.expand_failures.store(failures - 1, Ordering::SeqCst);
            return Err(ExpandError::new("pool is full"));
        }
        let name = volume.metadata.name.clone().unwrap_or_default();
        let mut volumes = self.volumes.lock().unwrap();
        let size = volumes.entry(name).or_insert(0);
        *size = (*size).max(self.rounded(new_size_bytes));
        Ok(ExpandOutcome {
            capacity_bytes: *size,
            node_expansion_required: self.node_expansion_required,
        })
    }
}
