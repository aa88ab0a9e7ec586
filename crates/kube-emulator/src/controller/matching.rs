//! Static binding: the best `Available` volume for a pending claim, as the PV binder's
//! `findMatchingVolume` picks it (same class, access modes, volume mode, selector, and the
//! smallest capacity that fits).

use std::sync::Arc;

use serde_json::Value;

use crate::selectors::LabelSelector;
use crate::util::{is_terminating, str_at};

fn class_of(obj: &Value) -> &str {
    str_at(obj, "/spec/storageClassName").unwrap_or_default()
}

fn mode_of(obj: &Value) -> &str {
    str_at(obj, "/spec/volumeMode").unwrap_or("Filesystem")
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The claim's `spec.selector` as a label selector (`None`: matches nothing, e.g. bad syntax).
fn claim_selector(claim: &Value) -> Option<LabelSelector> {
    let Some(sel) = crate::util::at(claim, "/spec/selector").filter(|s| !s.is_null()) else {
        return Some(LabelSelector::default());
    };
    let mut parts = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            parts.push(format!("{k}={}", v.as_str().unwrap_or_default()));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = str_at(e, "/key").unwrap_or_default();
        let values = strings(e.get("values")).join(",");
        parts.push(match str_at(e, "/operator").unwrap_or_default() {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => return None,
        });
    }
    LabelSelector::parse(&parts.join(",")).ok()
}

/// The smallest unclaimed volume that satisfies `claim`, if any.
pub(super) fn best_static_match(claim: &Value, volumes: Vec<Arc<Value>>) -> Option<Arc<Value>> {
    let requested = str_at(claim, "/spec/resources/requests/storage")
        .and_then(|s| kube_quantity::parse(s).ok())?;
    let selector = claim_selector(claim)?;
    let wanted_modes = strings(crate::util::at(claim, "/spec/accessModes"));
    volumes
        .into_iter()
        .filter(|pv| crate::util::at(pv, "/spec/claimRef").is_none_or(Value::is_null))
        .filter(|pv| !is_terminating(pv))
        .filter(|pv| !matches!(str_at(pv, "/status/phase"), Some("Released" | "Failed")))
        .filter(|pv| class_of(pv) == class_of(claim) && mode_of(pv) == mode_of(claim))
        .filter(|pv| {
            let have = strings(crate::util::at(pv, "/spec/accessModes"));
            wanted_modes.iter().all(|m| have.contains(m))
        })
        .filter(|pv| selector.is_empty() || selector.matches(pv))
        .filter_map(|pv| {
            let cap =
                str_at(&pv, "/spec/capacity/storage").and_then(|s| kube_quantity::parse(s).ok())?;
            (cap >= requested).then_some((cap, pv))
        })
        .min_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, pv)| pv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(name: &str, size: &str, class: &str, labels: Value) -> Arc<Value> {
        Arc::new(
            json!({"metadata": {"name": name, "labels": labels}, "spec": {"capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"], "storageClassName": class}, "status": {"phase": "Available"}}),
        )
    }

    #[test]
    fn picks_the_smallest_fitting_volume_of_the_same_class() {
        let claim = json!({"spec": {"storageClassName": "a", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
        let vols = vec![
            pv("big", "10Gi", "a", json!({})),
            pv("small", "2Gi", "a", json!({})),
            pv("tiny", "512Mi", "a", json!({})),
            pv("other", "1Gi", "b", json!({})),
        ];
        assert_eq!(
            best_static_match(&claim, vols).map(|p| p["metadata"]["name"].clone()),
            Some(json!("small"))
        );
    }

    #[test]
    fn honours_the_claim_selector() {
        let claim = json!({"spec": {"storageClassName": "", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
            "selector": {"matchLabels": {"tier": "gold"}}}});
        let vols = vec![
            pv("plain", "1Gi", "", json!({})),
            pv("gold", "5Gi", "", json!({"tier": "gold"})),
        ];
        assert_eq!(
            best_static_match(&claim, vols).map(|p| p["metadata"]["name"].clone()),
            Some(json!("gold"))
        );
    }
}
