//! Volume sync: pv-protection, `Pending -> Available`, `Bound`, `Released` (keeping the
//! claimRef with its uid), and handing pre-bound volumes to the claim sync.

use serde_json::{Value, json};

use super::{Controller, PVCS, PVS};
use crate::admission::PV_PROTECTION;
use crate::util::{self, finalizers, is_terminating, now_time, str_at};

fn set_phase(pv: &mut Value, phase: &str) {
    if str_at(pv, "/status/phase") != Some(phase) {
        pv["status"]["phase"] = json!(phase);
        pv["status"]["lastPhaseTransitionTime"] = json!(now_time());
    }
}

impl Controller {
    pub(super) fn sync_volume(&mut self, name: &str) {
        let Some(pv) = self.store.get(PVS, "", name) else {
            return;
        };
        let has_protection = finalizers(&pv).iter().any(|f| f == PV_PROTECTION);
        if is_terminating(&pv) {
            // pv-protection: a volume that is not bound may go.
            if has_protection && str_at(&pv, "/status/phase") != Some("Bound") {
                self.modify(PVS, "", name, |v| {
                    let rest: Vec<String> = finalizers(v)
                        .into_iter()
                        .filter(|f| f != PV_PROTECTION)
                        .collect();
                    util::set_finalizers(v, rest);
                });
            }
            return;
        }
        if !has_protection {
            self.modify(PVS, "", name, |v| {
                let mut f = finalizers(v);
                f.push(PV_PROTECTION.to_string());
                util::set_finalizers(v, f);
            });
        }
        let claim_ref = crate::util::at(&pv, "/spec/claimRef").filter(|c| !c.is_null());
        let Some(claim_ref) = claim_ref else {
            if matches!(str_at(&pv, "/status/phase"), None | Some("Pending")) {
                self.modify(PVS, "", name, |v| set_phase(v, "Available"));
            }
            return;
        };
        let cns = str_at(claim_ref, "/namespace")
            .unwrap_or_default()
            .to_string();
        let cname = str_at(claim_ref, "/name").unwrap_or_default().to_string();
        let cuid = str_at(claim_ref, "/uid").unwrap_or_default().to_string();
        let claim = self.store.get(PVCS, &cns, &cname);
        match claim {
            Some(c) if cuid.is_empty() || util::meta_str(&c, "uid") == Some(cuid.as_str()) => {
                let bound_here = str_at(&c, "/spec/volumeName") == Some(name);
                let was_bound = util::annotation(&c, "pv.kubernetes.io/bind-completed").is_some();
                if bound_here && (was_bound || str_at(&c, "/status/phase") == Some("Bound")) {
                    // syncVolume's "all is bound": the volume's phase only. A claim that went
                    // `Lost` while its volume was deleted and created again is not synced from
                    // here; its own next sync (an update of it, or the resync) binds it again.
                    self.modify(PVS, "", name, |v| set_phase(v, "Bound"));
                } else if str_at(&c, "/spec/volumeName").is_none_or(str::is_empty) || bound_here {
                    // Pre-bound volume, claim not bound yet: the claim sync binds them.
                    self.sync_claim(&cns, &cname);
                }
            }
            _ if cuid.is_empty() => {
                if matches!(str_at(&pv, "/status/phase"), None | Some("Pending")) {
                    self.modify(PVS, "", name, |v| set_phase(v, "Available"));
                }
            }
            _ => {
                // The claim is gone (or replaced): the volume is released; claimRef stays.
                if !matches!(str_at(&pv, "/status/phase"), Some("Released" | "Failed")) {
                    self.modify(PVS, "", name, |v| set_phase(v, "Released"));
                }
            }
        }
    }

    /// After a claim is deleted: every volume that refers to it.
    pub(super) fn sync_volumes_of_claim(&mut self, ns: &str, name: &str) {
        let (volumes, _) = self.store.list(PVS, None);
        for pv in volumes.iter().filter(|pv| {
            str_at(pv, "/spec/claimRef/namespace") == Some(ns)
                && str_at(pv, "/spec/claimRef/name") == Some(name)
        }) {
            self.sync_volume(util::name_of(pv));
        }
    }
}
