//! The controller's indexes over its informer-like view of the store (kube-controller-manager
//! keeps the same kind of index in its PV cache): volumes by the claim they refer to, unclaimed
//! volumes by class, claims by class. Without them a claim sync scanned every PV (and a class
//! change every PVC), which made a burst of N claims cost O(N^2).
//!
//! The index is fed with the store's change notifications, in order, so it can lag the store by
//! the changes not yet received: lookups give candidate names, which the caller re-reads from the
//! store and re-checks.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use super::{PVCS, PVS};
use crate::store::{EventType, Key};
use crate::util::{self, str_at};

#[derive(Default)]
pub(super) struct Index {
    /// (claim namespace, claim name) -> PVs whose `spec.claimRef` names it.
    volumes_by_claim: HashMap<Key, BTreeSet<String>>,
    claim_of_volume: HashMap<String, Key>,
    /// class -> PVs without a `claimRef` (static binding candidates).
    unclaimed_by_class: HashMap<String, BTreeSet<String>>,
    class_of_unclaimed: HashMap<String, String>,
    /// class -> claims.
    claims_by_class: HashMap<String, BTreeSet<Key>>,
    class_of_claim: HashMap<Key, String>,
}

fn class_of(obj: &Value) -> String {
    str_at(obj, "/spec/storageClassName")
        .unwrap_or_default()
        .to_string()
}

fn remove_from<K, V>(map: &mut HashMap<K, BTreeSet<V>>, key: &K, value: &V)
where
    K: std::hash::Hash + Eq,
    V: Ord,
{
    if let Some(set) = map.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

impl Index {
    /// Applies one store change.
    pub fn observe(&mut self, storage: &str, kind: EventType, obj: &Value) {
        match storage {
            PVS => self.observe_volume(kind, obj),
            PVCS => self.observe_claim(kind, obj),
            _ => {}
        }
    }

    fn observe_volume(&mut self, kind: EventType, pv: &Value) {
        let name = util::name_of(pv).to_string();
        if let Some(old) = self.claim_of_volume.remove(&name) {
            remove_from(&mut self.volumes_by_claim, &old, &name);
        }
        if let Some(old) = self.class_of_unclaimed.remove(&name) {
            remove_from(&mut self.unclaimed_by_class, &old, &name);
        }
        if kind == EventType::Deleted {
            return;
        }
        let claim_ref = util::at(pv, "/spec/claimRef").filter(|c| !c.is_null());
        match claim_ref {
            Some(r) => {
                let key = (
                    str_at(r, "/namespace").unwrap_or_default().to_string(),
                    str_at(r, "/name").unwrap_or_default().to_string(),
                );
                self.volumes_by_claim
                    .entry(key.clone())
                    .or_default()
                    .insert(name.clone());
                self.claim_of_volume.insert(name, key);
            }
            None => {
                let class = class_of(pv);
                self.unclaimed_by_class
                    .entry(class.clone())
                    .or_default()
                    .insert(name.clone());
                self.class_of_unclaimed.insert(name, class);
            }
        }
    }

    fn observe_claim(&mut self, kind: EventType, claim: &Value) {
        let key = (
            util::ns_of(claim).to_string(),
            util::name_of(claim).to_string(),
        );
        if let Some(old) = self.class_of_claim.remove(&key) {
            remove_from(&mut self.claims_by_class, &old, &key);
        }
        if kind == EventType::Deleted {
            return;
        }
        let class = class_of(claim);
        self.claims_by_class
            .entry(class.clone())
            .or_default()
            .insert(key.clone());
        self.class_of_claim.insert(key, class);
    }

    /// Names of the PVs whose claimRef names `ns/name`, in name order.
    pub fn volumes_of_claim(&self, ns: &str, name: &str) -> Vec<String> {
        self.volumes_by_claim
            .get(&(ns.to_string(), name.to_string()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Names of the PVs of `class` without a claimRef, in name order.
    pub fn unclaimed_volumes(&self, class: &str) -> Vec<String> {
        self.unclaimed_by_class
            .get(class)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The claims of `class`, in key order.
    pub fn claims_of_class(&self, class: &str) -> Vec<Key> {
        self.claims_by_class
            .get(class)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(name: &str, class: &str, claim: Option<(&str, &str)>) -> Value {
        let mut v = json!({"metadata": {"name": name}, "spec": {"storageClassName": class}});
        if let Some((ns, n)) = claim {
            v["spec"]["claimRef"] = json!({"namespace": ns, "name": n});
        }
        v
    }

    #[test]
    fn follows_claim_refs_and_classes_through_updates_and_deletes() {
        let mut ix = Index::default();
        ix.observe(PVS, EventType::Added, &pv("a", "fast", None));
        ix.observe(PVS, EventType::Added, &pv("b", "fast", Some(("ns", "c1"))));
        assert_eq!(ix.unclaimed_volumes("fast"), vec!["a"]);
        assert_eq!(ix.volumes_of_claim("ns", "c1"), vec!["b"]);
        // a is claimed by c1 too (static binding): no longer unclaimed
        ix.observe(
            PVS,
            EventType::Modified,
            &pv("a", "fast", Some(("ns", "c1"))),
        );
        assert!(ix.unclaimed_volumes("fast").is_empty());
        assert_eq!(ix.volumes_of_claim("ns", "c1"), vec!["a", "b"]);
        ix.observe(
            PVS,
            EventType::Deleted,
            &pv("b", "fast", Some(("ns", "c1"))),
        );
        assert_eq!(ix.volumes_of_claim("ns", "c1"), vec!["a"]);
        assert!(ix.volumes_of_claim("ns", "c2").is_empty());

        let claim = json!({"metadata": {"namespace": "ns", "name": "c1"}, "spec": {"storageClassName": "fast"}});
        ix.observe(PVCS, EventType::Added, &claim);
        assert_eq!(
            ix.claims_of_class("fast"),
            vec![("ns".to_string(), "c1".to_string())]
        );
        ix.observe(PVCS, EventType::Deleted, &claim);
        assert!(ix.claims_of_class("fast").is_empty());
        assert!(ix.claims_by_class.is_empty(), "empty sets are dropped");
    }
}
