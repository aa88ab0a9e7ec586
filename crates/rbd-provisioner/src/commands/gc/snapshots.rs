//! gc of snapshot images (`csi-snap-...`) and clone intermediates (`csi-clone-...`).
//!
//! Both are the volume core's internal images ([`rbd_volume::snapshot`]).
//!
//! - A **snapshot image** is live while a `VolumeSnapshotContent` refers to it: its
//!   `status.snapshotHandle` or (pre-provisioned) `spec.source.snapshotHandle` parses as a
//!   snapshot ID naming it, or the content has no handle yet and the image is the one its
//!   snapshot is being created as (`csi-snap-` of `snapshot-<VolumeSnapshot uid>`, the name the
//!   csi-snapshotter sidecar and the built-in controller give it). One that no content refers
//!   to, whose record names one of our drivers and that is older than `--min-age` is an orphan.
//!   When the cluster does not serve `snapshot.storage.k8s.io/v1` (no snapshot CRDs), nothing
//!   can say whether a snapshot is still wanted: snapshot images are then **unknown**, counted
//!   and never reported as orphans.
//! - A **clone intermediate** belongs to the volume cloned through it. It is never reported on
//!   its own while that clone exists (any image of the scanned pools whose intermediate name it
//!   is, or whose `clone-intermediate` metadata names it); the clone's own deletion removes it.
//!   Only one whose clone is gone (a crash between the two removals) is an orphan.
//!
//! Removal goes through [`rbd_volume::snapshot::delete_snapshot`]: an image that restored or
//! cloned volumes still hang off is flattened and moved to the RBD trash instead (purged once
//! its last child is gone), so a clone's parent is never removed while a child needs it.

use std::collections::{BTreeMap, BTreeSet};

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use rbd_volume::snapshot::{
    META_CLONE_INTERMEDIATE, META_SNAPSHOT_DRIVER, SnapshotId, SnapshotOwner,
    clone_intermediate_name, is_internal_image, is_snapshot_image, snapshot_image_name,
};
use serde_json::Value;

use super::{ImageFacts, Orphan, Rules, What};

/// The CSI snapshot name prefix of the csi-snapshotter sidecar (`--snapshot-name-prefix`
/// default), followed by `-<VolumeSnapshot uid>`.
const SNAPSHOT_NAME_PREFIX: &str = "snapshot";

/// What the cluster's `VolumeSnapshotContent`s say about snapshot images.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contents {
    /// `(pool spec, image)` of every content's snapshot handle: the pool spec is `pool/namespace`
    /// for a snapshot in a RADOS namespace, as the scanned pools are named.
    pub handles: BTreeSet<(String, String)>,
    /// Snapshot images of contents that have no handle yet (being created).
    pub pending: BTreeSet<String>,
}

impl Contents {
    /// From the contents' JSON.
    #[must_use]
    pub fn from_objects<'a>(items: impl IntoIterator<Item = &'a Value>) -> Contents {
        let mut contents = Contents::default();
        for item in items {
            let handle = ["/status/snapshotHandle", "/spec/source/snapshotHandle"]
                .iter()
                .find_map(|p| item.pointer(p).and_then(Value::as_str));
            match handle {
                Some(handle) => {
                    if let Ok(id) = SnapshotId::parse(handle) {
                        contents.handles.insert((id.pool_spec(), id.image));
                    }
                }
                None => {
                    if let Some(uid) = item
                        .pointer("/spec/volumeSnapshotRef/uid")
                        .and_then(Value::as_str)
                    {
                        contents.pending.insert(snapshot_image_name(&format!(
                            "{SNAPSHOT_NAME_PREFIX}-{uid}"
                        )));
                    }
                }
            }
        }
        contents
    }

    /// Whether a content refers to the snapshot image `image` of the pool spec `pool`
    /// (`pool/namespace` in a RADOS namespace).
    #[must_use]
    pub fn refers_to(&self, pool: &str, image: &str) -> bool {
        self.pending.contains(image) || self.handles.contains(&(pool.to_owned(), image.to_owned()))
    }
}

/// Every `VolumeSnapshotContent`; `None` when the cluster does not serve
/// `snapshot.storage.k8s.io/v1` (404: the snapshot CRDs are not installed).
///
/// # Errors
/// Other API errors.
pub async fn list_contents(client: &Client) -> Result<Option<Contents>, kube::Error> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent"),
        "volumesnapshotcontents",
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(Some(Contents::from_objects(
            list.items.iter().map(|o| &o.data),
        ))),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// Clone intermediates `(pool, image)` whose clone exists: for every image of the scanned
/// pools (`names`, pool -> all its images), the intermediate its clone would have been made
/// through (in its source's pool, which may be any scanned pool), and the one its
/// `clone-intermediate` metadata names (`facts`, where read).
#[must_use]
pub fn live_intermediates(
    names: &BTreeMap<String, BTreeSet<String>>,
    facts: &BTreeMap<String, BTreeMap<String, ImageFacts>>,
) -> BTreeSet<(String, String)> {
    let mut live = BTreeSet::new();
    for (pool, images) in names {
        for image in images.iter().filter(|i| !is_internal_image(i)) {
            let name = clone_intermediate_name(pool, image);
            live.extend(
                names
                    .keys()
                    .map(|source_pool| (source_pool.clone(), name.clone())),
            );
        }
    }
    for recorded in facts.values().flat_map(BTreeMap::values) {
        if let Some((pool, image)) = recorded
            .meta
            .get(META_CLONE_INTERMEDIATE)
            .and_then(|i| i.rsplit_once('/'))
        {
            live.insert((pool.to_owned(), image.to_owned()));
        }
    }
    live
}

/// What the scan of one pool's internal images found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub orphans: Vec<Orphan>,
    /// Snapshot images of our drivers not judged (no snapshot API).
    pub unknown: usize,
}

/// Pure: the orphaned internal images of `pool` among `images`.
#[must_use]
pub fn orphans(
    pool: &str,
    images: &BTreeMap<String, ImageFacts>,
    contents: Option<&Contents>,
    live_intermediates: &BTreeSet<(String, String)>,
    rules: &Rules<'_>,
) -> Found {
    let mut found = Found::default();
    for (image, facts) in images {
        if !is_internal_image(image) {
            continue;
        }
        let driver = facts.meta.get(META_SNAPSHOT_DRIVER).map(String::as_str);
        if !driver.is_some_and(|d| rules.snapshot_drivers.contains(&d)) {
            continue;
        }
        let old_enough = rules
            .now
            .duration_since(facts.created)
            .is_ok_and(|age| age >= rules.min_age);
        // A record cut before its name key (written last) reads as an empty name.
        let owner = SnapshotOwner::from_metadata(&facts.meta).unwrap_or_else(|| SnapshotOwner {
            name: String::new(),
            source: String::new(),
            driver: driver.unwrap_or_default().to_owned(),
            ..SnapshotOwner::default()
        });
        let what = if is_snapshot_image(image) {
            let Some(contents) = contents else {
                found.unknown += 1;
                continue;
            };
            if contents.refers_to(pool, image) {
                continue;
            }
            What::Snapshot(owner)
        } else {
            if live_intermediates.contains(&(pool.to_owned(), image.clone())) {
                continue;
            }
            What::CloneIntermediate(owner)
        };
        if old_enough {
            found.orphans.push(Orphan {
                pool: pool.to_owned(),
                image: image.clone(),
                what,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use serde_json::json;

    use super::*;

    const DRIVER: &str = "rbd.provisioner.ceph.io";

    fn record(name: &str, driver: &str, age: Duration, now: SystemTime) -> ImageFacts {
        let owner = SnapshotOwner {
            name: name.into(),
            source: "v1/m/rbd/pvc-1".into(),
            driver: driver.into(),
            kube_cluster: String::new(),
        };
        ImageFacts {
            meta: owner
                .entries()
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            created: now - age,
        }
    }

    fn rules(now: SystemTime) -> Rules<'static> {
        Rules {
            identity: "ceph.com/rbd",
            snapshot_drivers: &[DRIVER, "ceph.com/rbd"],
            min_age: Duration::from_secs(600),
            now,
            unrecorded_prefix: None,
            kube_cluster: "uid-a",
        }
    }

    fn names_of(found: &Found) -> Vec<&str> {
        found.orphans.iter().map(|o| o.image.as_str()).collect()
    }

    #[test]
    fn a_snapshot_image_is_orphaned_when_no_content_refers_to_it() {
        let now = SystemTime::now();
        let old = Duration::from_secs(3600);
        let bound = snapshot_image_name("snapshot-bound");
        let gone = snapshot_image_name("snapshot-gone");
        let being_made = snapshot_image_name("snapshot-uid-3");
        let young = snapshot_image_name("snapshot-young");
        let theirs = snapshot_image_name("snapshot-theirs");
        let pre = snapshot_image_name("pre-provisioned");
        let images = BTreeMap::from([
            (bound.clone(), record("snapshot-bound", DRIVER, old, now)),
            (gone.clone(), record("snapshot-gone", DRIVER, old, now)),
            (being_made.clone(), record("", DRIVER, old, now)),
            (
                young.clone(),
                record("snapshot-young", DRIVER, Duration::ZERO, now),
            ),
            (
                theirs.clone(),
                record("snapshot-theirs", "other.csi", old, now),
            ),
            (pre.clone(), record("pre-provisioned", DRIVER, old, now)),
        ]);
        let objects = [
            json!({"status": {"snapshotHandle": format!("s1/m/rbd/{bound}")}}),
            json!({"spec": {"source": {"snapshotHandle": format!("s1/m/rbd/{pre}")}}}),
            json!({"spec": {"volumeSnapshotRef": {"uid": "uid-3"}}}),
            json!({"status": {"snapshotHandle": "not-ours"}}),
        ];
        let contents = Contents::from_objects(objects.iter());
        let found = orphans(
            "rbd",
            &images,
            Some(&contents),
            &BTreeSet::new(),
            &rules(now),
        );
        assert_eq!(names_of(&found), vec![gone.as_str()]);
        assert!(matches!(&found.orphans[0].what, What::Snapshot(o) if o.name == "snapshot-gone"));
        // the same handle in another pool does not protect it
        let other_pool = orphans(
            "kube",
            &images,
            Some(&contents),
            &BTreeSet::new(),
            &rules(now),
        );
        assert!(names_of(&other_pool).contains(&bound.as_str()));
    }

    #[test]
    fn a_handle_in_a_rados_namespace_protects_the_image_of_that_namespace_only() {
        let now = SystemTime::now();
        let old = Duration::from_secs(3600);
        let image = snapshot_image_name("snapshot-ns");
        let images = BTreeMap::from([(image.clone(), record("snapshot-ns", DRIVER, old, now))]);
        let objects =
            [json!({"status": {"snapshotHandle": format!("s2/site-a/rbd/tenant-1/{image}")}})];
        let contents = Contents::from_objects(objects.iter());
        assert!(contents.refers_to("rbd/tenant-1", &image));
        let live = |pool: &str| {
            orphans(
                pool,
                &images,
                Some(&contents),
                &BTreeSet::new(),
                &rules(now),
            )
            .orphans
            .is_empty()
        };
        assert!(live("rbd/tenant-1"), "a live snapshot in a namespace");
        // the same name in the default namespace or another namespace is not that snapshot
        assert!(!live("rbd"));
        assert!(!live("rbd/tenant-2"));
    }

    #[test]
    fn without_the_snapshot_api_snapshot_images_are_unknown_not_orphans() {
        let now = SystemTime::now();
        let old = Duration::from_secs(3600);
        let image = snapshot_image_name("snapshot-x");
        let images = BTreeMap::from([(image, record("snapshot-x", DRIVER, old, now))]);
        let found = orphans("rbd", &images, None, &BTreeSet::new(), &rules(now));
        assert!(found.orphans.is_empty());
        assert_eq!(found.unknown, 1);
    }

    #[test]
    fn a_clone_intermediate_is_an_orphan_only_once_its_clone_is_gone() {
        let now = SystemTime::now();
        let old = Duration::from_secs(3600);
        let intermediate = |name: &str| {
            (
                name.to_owned(),
                record("clone of v1/m/rbd/pvc-1", DRIVER, old, now),
            )
        };
        // the clone is a live volume in another pool (its PV refers to it: no facts read)
        let by_name = clone_intermediate_name("kube", "pvc-clone");
        // the clone's metadata names it
        let by_record = clone_intermediate_name("rbd", "pvc-renamed");
        let lost = clone_intermediate_name("rbd", "pvc-deleted");
        let facts = BTreeMap::from([
            (
                "rbd".to_owned(),
                BTreeMap::from([
                    intermediate(&by_name),
                    intermediate(&by_record),
                    intermediate(&lost),
                ]),
            ),
            (
                "kube".to_owned(),
                BTreeMap::from([(
                    "unbound".to_owned(),
                    ImageFacts {
                        meta: BTreeMap::from([(
                            META_CLONE_INTERMEDIATE.to_owned(),
                            format!("rbd/{by_record}"),
                        )]),
                        created: now,
                    },
                )]),
            ),
        ]);
        let names = BTreeMap::from([
            (
                "rbd".to_owned(),
                BTreeSet::from([by_name.clone(), by_record.clone(), lost.clone()]),
            ),
            (
                "kube".to_owned(),
                BTreeSet::from(["pvc-clone".to_owned(), "unbound".to_owned()]),
            ),
        ]);
        let live = live_intermediates(&names, &facts);
        let found = orphans("rbd", &facts["rbd"], None, &live, &rules(now));
        assert_eq!(names_of(&found), vec![lost.as_str()]);
        assert!(matches!(found.orphans[0].what, What::CloneIntermediate(_)));
        assert_eq!(
            found.unknown, 0,
            "intermediates are judged without the snapshot API"
        );
    }
}
