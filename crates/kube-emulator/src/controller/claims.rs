//! Claim sync: pvc-protection, external-provisioning annotations and events, binding, the
//! expand controller's `ExternalExpanding` event, and lost claims.
//!
//! Binding writes exactly what the recordings show: PV `claimRef` (+ `bound-by-controller`)
//! only when the PV was not pre-bound with the claim's uid, PV status `Bound`, then the claim
//! (`volumeName`, `bind-completed`, and `bound-by-controller` when the controller chose the
//! volume), then the claim status `{phase: Bound, accessModes, capacity}`. No events.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Client, Controller, PVCS, PVS};
use crate::admission::PVC_PROTECTION;
use crate::util::{self, annotation, finalizers, is_terminating, now_time, set_annotation, str_at};
use kube_quantity::Quantity;

const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
const ANN_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_PROVISIONER_BETA: &str = "volume.beta.kubernetes.io/storage-provisioner";
const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const PV_CONTROLLER: &str = "persistentvolume-controller";

/// The claims a pod uses (`spec.volumes[].persistentVolumeClaim.claimName`).
pub(crate) fn pod_claims(pod: &Value) -> Vec<String> {
    crate::util::at(pod, "/spec/volumes")
        .and_then(Value::as_array)
        .map(|vols| {
            vols.iter()
                .filter_map(|v| str_at(v, "/persistentVolumeClaim/claimName"))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn storage_request(obj: &Value, ptr: &str) -> Option<Quantity> {
    str_at(obj, ptr).and_then(|s| kube_quantity::parse(s).ok())
}

/// Whether `pv` is pre-bound to `claim` (name, namespace, and uid when set).
fn prebound_to(pv: &Value, claim: &Value) -> bool {
    str_at(pv, "/spec/claimRef/name") == Some(util::name_of(claim))
        && str_at(pv, "/spec/claimRef/namespace") == Some(util::ns_of(claim))
        && str_at(pv, "/spec/claimRef/uid")
            .is_none_or(|u| u.is_empty() || Some(u) == util::meta_str(claim, "uid"))
}

impl Controller {
    pub(super) async fn sync_claim(&mut self, ns: &str, name: &str) {
        let Some(claim) = self.store.get(PVCS, ns, name) else {
            return;
        };
        if is_terminating(&claim) {
            self.release_claim_protection(&claim).await;
            return;
        }
        let claim = if finalizers(&claim).iter().any(|f| f == PVC_PROTECTION) {
            claim
        } else {
            match self
                .modify(Client::PvcProtection, PVCS, ns, name, |c| {
                    let mut f = finalizers(c);
                    if !f.iter().any(|f| f == PVC_PROTECTION) {
                        f.push(PVC_PROTECTION.to_string());
                    }
                    util::set_finalizers(c, f);
                })
                .await
            {
                Some(c) => c,
                None => return,
            }
        };
        // As kube-controller-manager's syncClaim: a claim that was ever bound (it carries
        // `bind-completed`) takes the bound path whatever its phase, so a `Lost` claim whose
        // volume is back (same name, claimRef with its uid) becomes `Bound` again.
        if annotation(&claim, ANN_BIND_COMPLETED).is_some() {
            self.sync_bound_claim(&claim).await;
        } else {
            self.sync_unbound_claim(&claim).await;
        }
    }

    /// The claim `Lost` (as updateClaimStatusWithEvent with no volume: access modes and
    /// capacity cleared), with a Warning.
    async fn lose_claim(&mut self, claim: &Value, reason: &str, message: &str) {
        let ns = util::ns_of(claim).to_string();
        let name = util::name_of(claim).to_string();
        if str_at(claim, "/status/phase") == Some("Lost") {
            return;
        }
        if let Some(lost) = self
            .modify(Client::Binder, PVCS, &ns, &name, |c| {
                c["status"]["phase"] = json!("Lost");
                if let Some(status) = c["status"].as_object_mut() {
                    status.remove("accessModes");
                    status.remove("capacity");
                }
            })
            .await
        {
            self.emit(
                Client::Binder,
                &lost,
                "Warning",
                reason,
                message,
                PV_CONTROLLER,
            )
            .await;
        }
    }

    /// pvc-protection: drop the finalizer once no running pod uses the claim.
    async fn release_claim_protection(&mut self, claim: &Value) {
        if !finalizers(claim).iter().any(|f| f == PVC_PROTECTION) {
            return;
        }
        let ns = util::ns_of(claim);
        let name = util::name_of(claim);
        let (pods, _) = self.store.list("pods", Some(ns));
        let in_use = pods.iter().any(|p| {
            !matches!(str_at(p, "/status/phase"), Some("Succeeded" | "Failed"))
                && pod_claims(p).iter().any(|c| c == name)
        });
        if in_use {
            return;
        }
        self.modify(Client::PvcProtection, PVCS, ns, name, |c| {
            let rest: Vec<String> = finalizers(c)
                .into_iter()
                .filter(|f| f != PVC_PROTECTION)
                .collect();
            util::set_finalizers(c, rest);
        })
        .await;
    }

    /// kube-controller-manager's syncBoundClaim: no volume name or no such volume -> `Lost`
    /// (`ClaimLost`); a volume whose claimRef is empty or carries this claim's uid -> bind again
    /// (nothing is written when all is set; a `Lost` claim becomes `Bound`); a volume of another
    /// claim -> `Lost` (`ClaimMisbound`).
    async fn sync_bound_claim(&mut self, claim: &Arc<Value>) {
        let volume = str_at(claim, "/spec/volumeName").unwrap_or_default();
        if volume.is_empty() {
            self.lose_claim(
                claim,
                "ClaimLost",
                "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
            )
            .await;
            return;
        }
        let Some(pv) = self.store.get(PVS, "", volume) else {
            self.lose_claim(
                claim,
                "ClaimLost",
                "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
            )
            .await;
            return;
        };
        let ref_uid = crate::util::at(&pv, "/spec/claimRef")
            .filter(|r| !r.is_null())
            .map(|r| str_at(r, "/uid").unwrap_or_default());
        match ref_uid {
            Some(uid) if Some(uid) != util::meta_str(claim, "uid") => {
                self.lose_claim(
                    claim,
                    "ClaimMisbound",
                    "Two claims are bound to the same volume, this one is bound incorrectly",
                )
                .await;
                return;
            }
            None => {
                self.bind(claim, &pv, false).await;
                return;
            }
            _ if str_at(claim, "/status/phase") != Some("Bound") => {
                self.bind(claim, &pv, false).await;
                return;
            }
            _ => {}
        }
        // Expand controller: for CSI (and every other) volume it only waits for the external
        // resizer, saying so once.
        let requested = storage_request(claim, "/spec/resources/requests/storage");
        let capacity = storage_request(claim, "/status/capacity/storage");
        if let (Some(r), Some(c)) = (requested, capacity)
            && r > c
        {
            let uid = util::meta_str(claim, "uid").unwrap_or_default().to_string();
            let size = str_at(claim, "/spec/resources/requests/storage")
                .unwrap_or_default()
                .to_string();
            if self.expanding_reported.insert((uid, size)) {
                self.emit(
                    Client::Expand,
                    claim,
                    "Normal",
                    "ExternalExpanding",
                    "waiting for an external controller to expand this PVC",
                    "volume_expand",
                )
                .await;
            }
        }
    }

    async fn sync_unbound_claim(&mut self, claim: &Arc<Value>) {
        let volume_name = str_at(claim, "/spec/volumeName")
            .unwrap_or_default()
            .to_string();
        if volume_name.is_empty() {
            let requested = storage_request(claim, "/spec/resources/requests/storage")
                .unwrap_or_else(|| Quantity::from_bytes(0));
            let fits = |pv: &Arc<Value>| {
                prebound_to(pv, claim)
                    && !is_terminating(pv)
                    && storage_request(pv, "/spec/capacity/storage").is_some_and(|c| c >= requested)
            };
            // Provisioners name the volume `pvc-<claim uid>`: look there before the index.
            let uid = util::meta_str(claim, "uid").unwrap_or_default();
            let prebound = match self.store.get(PVS, "", &format!("pvc-{uid}")).filter(fits) {
                Some(pv) => Some(pv),
                None => self
                    .index
                    .volumes_of_claim(util::ns_of(claim), util::name_of(claim))
                    .iter()
                    .filter_map(|n| self.store.get(PVS, "", n))
                    .find(fits),
            };
            if let Some(pv) = prebound {
                self.bind(claim, &pv, true).await;
            } else if let Some(pv) = self.static_match(claim) {
                self.bind(claim, &pv, true).await;
            } else {
                self.provision(claim).await;
            }
            return;
        }
        let Some(pv) = self.store.get(PVS, "", &volume_name) else {
            return;
        };
        let free = crate::util::at(&pv, "/spec/claimRef").is_none_or(Value::is_null);
        if free || prebound_to(&pv, claim) {
            self.bind(claim, &pv, false).await;
        }
    }

    /// An unclaimed volume for `claim` (static binding). WaitForFirstConsumer claims are left to
    /// the scheduler, which the emulator does not have.
    fn static_match(&self, claim: &Arc<Value>) -> Option<Arc<Value>> {
        let class = str_at(claim, "/spec/storageClassName").unwrap_or_default();
        let delayed = self
            .store
            .get("storageclasses", "", class)
            .is_some_and(|sc| str_at(&sc, "/volumeBindingMode") == Some("WaitForFirstConsumer"));
        if delayed {
            return None;
        }
        let candidates = self
            .index
            .unclaimed_volumes(class)
            .iter()
            .filter_map(|n| self.store.get(PVS, "", n))
            .collect();
        super::matching::best_static_match(claim, candidates)
    }

    /// Binds `claim` and `pv`; `chosen_by_controller` when the claim had no `volumeName`.
    async fn bind(&mut self, claim: &Arc<Value>, pv: &Arc<Value>, chosen_by_controller: bool) {
        let pv_name = util::name_of(pv).to_string();
        let claim_uid = util::meta_str(claim, "uid").unwrap_or_default().to_string();
        let needs_ref = str_at(pv, "/spec/claimRef/uid") != Some(claim_uid.as_str());
        if needs_ref {
            let claim_ref = json!({
                "kind": "PersistentVolumeClaim",
                "namespace": util::ns_of(claim),
                "name": util::name_of(claim),
                "uid": claim_uid,
                "apiVersion": "v1",
                "resourceVersion": util::meta_str(claim, "resourceVersion").unwrap_or_default(),
            });
            if self
                .modify(Client::Binder, PVS, "", &pv_name, |v| {
                    v["spec"]["claimRef"] = claim_ref.clone();
                    set_annotation(v, ANN_BOUND_BY_CONTROLLER, "yes");
                })
                .await
                .is_none()
            {
                return;
            }
        }
        let now = now_time();
        self.modify(Client::Binder, PVS, "", &pv_name, |v| {
            if str_at(v, "/status/phase") != Some("Bound") {
                v["status"]["phase"] = json!("Bound");
                v["status"]["lastPhaseTransitionTime"] = json!(now);
            }
        })
        .await;
        let ns = util::ns_of(claim).to_string();
        let name = util::name_of(claim).to_string();
        let Some(claim) = self
            .modify(Client::Binder, PVCS, &ns, &name, |c| {
                c["spec"]["volumeName"] = json!(pv_name);
                set_annotation(c, ANN_BIND_COMPLETED, "yes");
                if chosen_by_controller {
                    set_annotation(c, ANN_BOUND_BY_CONTROLLER, "yes");
                }
            })
            .await
        else {
            return;
        };
        let access_modes = pv
            .pointer("/spec/accessModes")
            .cloned()
            .unwrap_or(json!([]));
        let capacity = crate::util::at(pv, "/spec/capacity")
            .cloned()
            .unwrap_or(json!({}));
        self.modify(
            Client::Binder,
            PVCS,
            util::ns_of(&claim),
            util::name_of(&claim),
            |c| {
                c["status"]["phase"] = json!("Bound");
                c["status"]["accessModes"] = access_modes.clone();
                c["status"]["capacity"] = capacity.clone();
            },
        )
        .await;
    }

    /// Dynamic provisioning by an external provisioner: annotate, then wait (and say so).
    async fn provision(&mut self, claim: &Arc<Value>) {
        let class_name = str_at(claim, "/spec/storageClassName").unwrap_or_default();
        if class_name.is_empty() {
            self.emit(
                Client::Binder,
                claim,
                "Normal",
                "FailedBinding",
                "no persistent volumes available for this claim and no storage class is set",
                PV_CONTROLLER,
            )
            .await;
            return;
        }
        let Some(class) = self.store.get("storageclasses", "", class_name) else {
            self.emit(
                Client::Binder,
                claim,
                "Warning",
                "ProvisioningFailed",
                &format!("storageclass.storage.k8s.io \"{class_name}\" not found"),
                PV_CONTROLLER,
            )
            .await;
            return;
        };
        let provisioner = str_at(&class, "/provisioner")
            .unwrap_or_default()
            .to_string();
        if str_at(&class, "/volumeBindingMode") == Some("WaitForFirstConsumer")
            && annotation(claim, ANN_SELECTED_NODE).is_none_or(str::is_empty)
        {
            self.emit(
                Client::Binder,
                claim,
                "Normal",
                "WaitForFirstConsumer",
                "waiting for first consumer to be created before binding",
                PV_CONTROLLER,
            )
            .await;
            return;
        }
        let ns = util::ns_of(claim).to_string();
        let name = util::name_of(claim).to_string();
        let Some(claim) = self
            .modify(Client::Binder, PVCS, &ns, &name, |c| {
                set_annotation(c, ANN_PROVISIONER_BETA, &provisioner);
                set_annotation(c, ANN_PROVISIONER, &provisioner);
            })
            .await
        else {
            return;
        };
        self.emit(
            Client::Binder,
            &claim,
            "Normal",
            "ExternalProvisioning",
            &format!(
                "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
            ),
            PV_CONTROLLER,
        )
        .await;
    }
}
