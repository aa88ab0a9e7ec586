//! Volume sync: pv-protection, `Pending -> Available`, `Bound`, `Released` (keeping the
//! claimRef with its uid), and handing pre-bound volumes to the claim sync.

use serde_json::{Value, json};

use super::{Client, Controller, PVCS, PVS};
use crate::admission::PV_PROTECTION;
use crate::util::{self, finalizers, is_terminating, now_time, str_at};

fn set_phase(pv: &mut Value, phase: &str) {
    if str_at(pv, "/status/phase") != Some(phase) {
        pv["status"]["phase"] = json!(phase);
        pv["status"]["lastPhaseTransitionTime"] = json!(now_time());
    }
}

impl Controller {
    pub(super) async fn sync_volume(&mut self, name: &str) {
        let Some(pv) = self.store.get(PVS, "", name) else {
            return;
        };
        let has_protection = finalizers(&pv).iter().any(|f| f == PV_PROTECTION);
        if is_terminating(&pv) {
            // pv-protection: a volume that is not bound may go.
            if has_protection && str_at(&pv, "/status/phase") != Some("Bound") {
                self.modify(Client::PvProtection, PVS, "", name, |v| {
                    let rest: Vec<String> = finalizers(v)
                        .into_iter()
                        .filter(|f| f != PV_PROTECTION)
                        .collect();
                    util::set_finalizers(v, rest);
                })
                .await;
            }
            return;
        }
        if !has_protection {
            self.modify(Client::PvProtection, PVS, "", name, |v| {
                let mut f = finalizers(v);
                if !f.iter().any(|f| f == PV_PROTECTION) {
                    f.push(PV_PROTECTION.to_string());
                }
                util::set_finalizers(v, f);
            })
            .await;
        }
        let claim_ref = crate::util::at(&pv, "/spec/claimRef").filter(|c| !c.is_null());
        let Some(claim_ref) = claim_ref else {
            if matches!(str_at(&pv, "/status/phase"), None | Some("Pending")) {
                self.modify(Client::Binder, PVS, "", name, |v| set_phase(v, "Available"))
                    .await;
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
                    self.modify(Client::Binder, PVS, "", name, |v| set_phase(v, "Bound"))
                        .await;
                } else if str_at(&c, "/spec/volumeName").is_none_or(str::is_empty) || bound_here {
                    // Pre-bound volume, claim not bound yet: the claim sync binds them.
                    self.sync_claim(&cns, &cname).await;
                }
            }
            _ if cuid.is_empty() => {
                if matches!(str_at(&pv, "/status/phase"), None | Some("Pending")) {
                    self.modify(Client::Binder, PVS, "", name, |v| set_phase(v, "Available"))
                        .await;
                }
            }
            _ => {
                // The claim is gone (or replaced): the volume is released; claimRef stays.
                if !matches!(str_at(&pv, "/status/phase"), Some("Released" | "Failed")) {
                    self.modify(Client::Binder, PVS, "", name, |v| set_phase(v, "Released"))
                        .await;
                }
            }
        }
    }
}
