//! A stand-in for kube-controller-manager's attach/detach controller, for CSI drivers whose
//! CSIDriver says `attachRequired: true`:
//!
//! - a pod with `spec.nodeName` that uses a claim bound to a CSI PV of such a driver needs the
//!   volume on that node: the VolumeAttachment `csi-<sha256(volumeHandle + driver + node)>`
//!   (upstream's name) is created, `spec.attacher` the driver, `spec.source.persistentVolumeName`
//!   the PV;
//! - a PV with a `ReadWriteOnce` or `ReadWriteOncePod` access mode that has a VolumeAttachment
//!   for another node is not attached: each pod waiting for it gets upstream's Multi-Attach event
//!   (Warning `FailedAttachVolume`, `Multi-Attach error for volume "<pv>" Volume is already used
//!   by pod(s) <pods in the pod's namespace>` / `... by N pod(s) in different namespaces`, or
//!   `... Volume is already exclusively attached to one node and can't be attached to another`
//!   when no pod uses it there any more);
//! - a VolumeAttachment of that name whose volume no pod on its node uses any more is deleted
//!   (its attacher's finalizer keeps it until the detach is done).
//!
//! Unlike upstream, it does not wait for the kubelet to report the volume unmounted
//! (`volumesInUse`): the emulator has no kubelet. VolumeAttachments with other names (made by
//! hand) are left alone. The whole state is reconciled on every change of a pod, claim, volume,
//! CSIDriver or VolumeAttachment.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Client, Controller, PVCS, PVS};
use crate::store::{Action, Origin};
use crate::util::{self, str_at};

pub(crate) const VOLUME_ATTACHMENTS: &str = "volumeattachments";
const COMPONENT: &str = "attachdetach-controller";

/// Upstream's VolumeAttachment name for a volume handle, driver and node.
pub(crate) fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    let digest = Sha256::digest(format!("{handle}{driver}{node}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// Whether a PV may be attached to several nodes (upstream's `isMultiAttachAllowed`).
fn multi_attach_allowed(pv: &Value) -> bool {
    let modes = util::at(pv, "/spec/accessModes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    !modes
        .iter()
        .any(|m| m == "ReadWriteOnce" || m == "ReadWriteOncePod")
}

/// A volume a node needs: the PV, its driver and handle, and the pods that use it there.
struct Wanted {
    pv: Arc<Value>,
    driver: String,
    handle: String,
    pods: Vec<Arc<Value>>,
}

/// The Multi-Attach message for `pod`, given the pods using the volume on the other nodes.
pub(crate) fn multi_attach_message(
    pv: &str,
    pod_namespace: &str,
    others: &[(String, String)],
) -> String {
    let suffix = if others.is_empty() {
        "Volume is already exclusively attached to one node and can't be attached to another"
            .to_owned()
    } else {
        let local: Vec<&str> = others
            .iter()
            .filter(|(ns, _)| ns == pod_namespace)
            .map(|(_, name)| name.as_str())
            .collect();
        let elsewhere = others.len() - local.len();
        if local.is_empty() {
            format!("Volume is already used by {elsewhere} pod(s) in different namespaces")
        } else if elsewhere > 0 {
            format!(
                "Volume is already used by pod(s) {} and {elsewhere} pod(s) in different namespaces",
                local.join(", ")
            )
        } else {
            format!("Volume is already used by pod(s) {}", local.join(", "))
        }
    };
    format!("Multi-Attach error for volume {pv:?} {suffix}")
}

impl Controller {
    /// The CSI PV a pod's claim is bound to, with its driver and handle, if that driver
    /// requires attach.
    fn attachable_volume(&self, ns: &str, claim: &str) -> Option<(Arc<Value>, String, String)> {
        let pvc = self.store.get(PVCS, ns, claim)?;
        let pv_name = str_at(&pvc, "/spec/volumeName")?;
        let pv = self.store.get(PVS, "", pv_name)?;
        let driver = str_at(&pv, "/spec/csi/driver")?.to_string();
        let handle = str_at(&pv, "/spec/csi/volumeHandle")?.to_string();
        let csi_driver = self.store.get("csidrivers", "", &driver)?;
        let required = util::at(&csi_driver, "/spec/attachRequired")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        required.then_some((pv, driver, handle))
    }

    /// Every (PV, node) some running pod needs.
    fn wanted_attachments(&self) -> BTreeMap<(String, String), Wanted> {
        let mut wanted: BTreeMap<(String, String), Wanted> = BTreeMap::new();
        let (pods, _) = self.store.list("pods", None);
        for pod in pods {
            let Some(node) = str_at(&pod, "/spec/nodeName").filter(|n| !n.is_empty()) else {
                continue;
            };
            if matches!(str_at(&pod, "/status/phase"), Some("Succeeded" | "Failed")) {
                continue;
            }
            let ns = util::ns_of(&pod).to_string();
            for claim in super::claims::pod_claims(&pod) {
                let Some((pv, driver, handle)) = self.attachable_volume(&ns, &claim) else {
                    continue;
                };
                let key = (util::name_of(&pv).to_string(), node.to_string());
                wanted
                    .entry(key)
                    .or_insert_with(|| Wanted {
                        pv,
                        driver,
                        handle,
                        pods: Vec::new(),
                    })
                    .pods
                    .push(pod.clone());
            }
        }
        wanted
    }

    /// Creates and deletes VolumeAttachments so that they match what pods need.
    pub(super) async fn sync_attachments(&mut self) {
        let wanted = self.wanted_attachments();
        let (existing, _) = self.store.list(VOLUME_ATTACHMENTS, None);
        // (PV, node) of every VolumeAttachment
        let mut attached: BTreeSet<(String, String)> = existing
            .iter()
            .filter_map(|va| {
                Some((
                    str_at(va, "/spec/source/persistentVolumeName")?.to_string(),
                    str_at(va, "/spec/nodeName")?.to_string(),
                ))
            })
            .collect();

        // detach: ours (by name) that no pod needs
        for va in &existing {
            let (Some(pv), Some(node), Some(driver)) = (
                str_at(va, "/spec/source/persistentVolumeName"),
                str_at(va, "/spec/nodeName"),
                str_at(va, "/spec/attacher"),
            ) else {
                continue;
            };
            let key = (pv.to_string(), node.to_string());
            let handle = self
                .store
                .get(PVS, "", pv)
                .and_then(|p| str_at(&p, "/spec/csi/volumeHandle").map(str::to_string));
            let ours = handle
                .as_deref()
                .is_some_and(|h| attachment_name(h, driver, node) == util::name_of(va));
            if ours
                && !wanted.contains_key(&key)
                && util::at(va, "/metadata/deletionTimestamp").is_none()
            {
                self.delete_attachment(util::name_of(va));
                attached.remove(&key);
            }
        }

        // attach, or report Multi-Attach
        for ((pv_name, node), want) in &wanted {
            if attached.contains(&(pv_name.clone(), node.clone())) {
                continue;
            }
            let other_nodes: Vec<&String> = attached
                .iter()
                .filter(|(pv, n)| pv == pv_name && n != node)
                .map(|(_, n)| n)
                .collect();
            if !other_nodes.is_empty() && !multi_attach_allowed(&want.pv) {
                let others: Vec<(String, String)> = wanted
                    .iter()
                    .filter(|((pv, n), _)| pv == pv_name && other_nodes.contains(&n))
                    .flat_map(|(_, w)| w.pods.iter())
                    .map(|p| (util::ns_of(p).to_string(), util::name_of(p).to_string()))
                    .collect();
                for pod in &want.pods {
                    let message = multi_attach_message(pv_name, util::ns_of(pod), &others);
                    self.emit(
                        Client::AttachDetach,
                        pod,
                        "Warning",
                        "FailedAttachVolume",
                        &message,
                        COMPONENT,
                    )
                    .await;
                }
                continue;
            }
            self.create_attachment(&want.handle, &want.driver, pv_name, node);
            attached.insert((pv_name.clone(), node.clone()));
        }
    }

    fn create_attachment(&self, handle: &str, driver: &str, pv: &str, node: &str) {
        let name = attachment_name(handle, driver, node);
        let va = json!({
            "kind": "VolumeAttachment",
            "apiVersion": "storage.k8s.io/v1",
            "metadata": {
                "name": name,
                "uid": uuid::Uuid::new_v4().to_string(),
                "creationTimestamp": util::now_time(),
            },
            "spec": {
                "attacher": driver,
                "nodeName": node,
                "source": {"persistentVolumeName": pv},
            },
        });
        let key = (String::new(), name.clone());
        let result = self.store.write(
            VOLUME_ATTACHMENTS,
            &key,
            Origin::Controller,
            |_, existing| {
                Ok(if existing.is_some() {
                    Action::Keep
                } else {
                    Action::Put(va)
                })
            },
        );
        if let Err(e) = result {
            tracing::warn!(name, error = %e, "creating the VolumeAttachment failed");
        }
    }

    /// Deletes a VolumeAttachment: at once without finalizers, else marked for deletion.
    fn delete_attachment(&self, name: &str) {
        let key = (String::new(), name.to_string());
        let result = self.store.write(
            VOLUME_ATTACHMENTS,
            &key,
            Origin::Controller,
            |_, existing| {
                let Some(old) = existing else {
                    return Ok(Action::Abort);
                };
                let finalizers = util::at(old, "/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| !f.is_empty());
                if !finalizers {
                    return Ok(Action::Remove);
                }
                let mut next = (**old).clone();
                next["metadata"]["deletionTimestamp"] = json!(util::now_time());
                next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                Ok(Action::Put(next))
            },
        );
        if let Err(e) = result {
            tracing::warn!(name, error = %e, "deleting the VolumeAttachment failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_upstreams() {
        // sha256("handle" + "driver" + "node")
        let name = attachment_name("handle", "driver", "node");
        assert!(name.starts_with("csi-") && name.len() == 4 + 64, "{name}");
        assert_eq!(name, attachment_name("handle", "driver", "node"));
        assert_ne!(name, attachment_name("handle", "driver", "node2"));
    }

    #[test]
    fn multi_attach_messages_are_upstreams() {
        let same = [("apps".to_owned(), "web-0".to_owned())];
        assert_eq!(
            multi_attach_message("pv-1", "apps", &same),
            "Multi-Attach error for volume \"pv-1\" Volume is already used by pod(s) web-0"
        );
        assert_eq!(
            multi_attach_message("pv-1", "other", &same),
            "Multi-Attach error for volume \"pv-1\" Volume is already used by 1 pod(s) in different namespaces"
        );
        assert_eq!(
            multi_attach_message("pv-1", "apps", &[]),
            "Multi-Attach error for volume \"pv-1\" Volume is already exclusively attached to one node and can't be attached to another"
        );
    }

    #[test]
    fn rwo_volumes_allow_one_node() {
        assert!(!multi_attach_allowed(
            &json!({"spec": {"accessModes": ["ReadWriteOnce"]}})
        ));
        assert!(!multi_attach_allowed(
            &json!({"spec": {"accessModes": ["ReadWriteOncePod"]}})
        ));
        assert!(multi_attach_allowed(
            &json!({"spec": {"accessModes": ["ReadOnlyMany"]}})
        ));
        assert!(multi_attach_allowed(&json!({"spec": {}})));
    }
}
