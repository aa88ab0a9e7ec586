//! `rbd-provisioner gc`: images that carry our owner record but whose PV no longer exists.
//!
//! For every StorageClass of this provisioner, the pool it provisions into is listed with the
//! class's admin credentials. An image is an orphan when
//! - its owner record (made by our `--id`) names a PV that does not exist,
//! - no PV refers to it (in-tree `rbd` or `csi` source), and
//! - it is older than `--min-age` (default 10 min): a younger one may belong to a volume whose
//!   PV is being saved right now.
//!
//! With `--include-unrecorded`, images named with our prefix that have no owner record at all
//! (a crash between image create and owner record, then the claim deleted) and that no PV
//! refers to are candidates too.
//!
//! Dry run by default. `--delete` checks each orphan's PV once more right before removing it,
//! and refuses (and reports) images still mapped somewhere; it never forces.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use ceph_rbd::{ClusterConfig, ConnectionPool};
use clap::Args;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::cli::KubeArgs;
use crate::image::{META_CLAIM, META_PROVISIONER, Owner};
use crate::params::Parameters;

#[derive(Args, Debug, Clone)]
pub struct GcArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Provisioner name whose classes are scanned.
    #[arg(long, env = "PROVISIONER_NAME", default_value = "ceph.com/rbd")]
    pub provisioner_name: String,
    /// Only images recorded as made by this identity. Default: the provisioner name.
    #[arg(long)]
    pub id: Option<String>,
    /// Remove the orphans (default: only list them).
    #[arg(long)]
    pub delete: bool,
    /// Leave images younger than this alone (their PV may be being saved right now).
    #[arg(long, default_value = "10m", value_parser = crate::duration::parse)]
    pub min_age: Duration,
    /// Also list (and with --delete remove) images named with --image-name-prefix that have no
    /// owner record and that no PV refers to.
    #[arg(long)]
    pub include_unrecorded: bool,
    /// Image name prefix, for --include-unrecorded.
    #[arg(long, default_value = crate::image::DEFAULT_PREFIX)]
    pub image_name_prefix: String,
    /// Bound for each Ceph operation.
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
    pub command_timeout: Duration,
}

/// What one image is, as far as gc is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFacts {
    pub meta: BTreeMap<String, String>,
    pub created: SystemTime,
}

/// An image gc would remove.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    pub pool: String,
    pub image: String,
    /// `None` for an image without an owner record (`--include-unrecorded`).
    pub owner: Option<Owner>,
}

/// The rules gc applies.
#[derive(Clone, Debug)]
pub struct Rules<'a> {
    pub identity: &'a str,
    pub min_age: Duration,
    pub now: SystemTime,
    /// `Some(prefix)` with `--include-unrecorded`.
    pub unrecorded_prefix: Option<&'a str>,
}

/// Pure: the orphans of `pool` among `images`, given the existing PV names and the images PVs
/// refer to.
pub fn orphans(
    pool: &str,
    images: &BTreeMap<String, ImageFacts>,
    pvs: &BTreeSet<String>,
    referenced: &BTreeSet<(String, String)>,
    rules: &Rules<'_>,
) -> Vec<Orphan> {
    images
        .iter()
        .filter(|(image, _)| !referenced.contains(&(pool.to_string(), (*image).clone())))
        .filter(|(_, facts)| {
            rules
                .now
                .duration_since(facts.created)
                .is_ok_and(|age| age >= rules.min_age)
        })
        .filter_map(|(image, facts)| {
            let owner = match Owner::from_metadata(&facts.meta) {
                Some(owner) if owner.provisioner == rules.identity && !pvs.contains(&owner.pv) => {
                    Some(owner)
                }
                Some(_) => return None,
                // A record cut short before its PV key (written last): the provisioner crashed
                // before the PV could be saved, and no PV refers to the image.
                None if facts.meta.get(META_PROVISIONER).map(String::as_str)
                    == Some(rules.identity) =>
                {
                    Some(Owner {
                        pv: String::new(),
                        claim: facts.meta.get(META_CLAIM).cloned().unwrap_or_default(),
                        provisioner: rules.identity.to_string(),
                    })
                }
                None if rules
                    .unrecorded_prefix
                    .is_some_and(|p| image.starts_with(p)) =>
                {
                    None
                }
                None => return None,
            };
            Some(Orphan {
                pool: pool.to_string(),
                image: image.clone(),
                owner,
            })
        })
        .collect()
}

/// `(pool, image)` of every PV with an RBD image source (in-tree, or CSI of any driver that
/// names a pool and an image).
pub fn referenced_images(volumes: &[PersistentVolume]) -> BTreeSet<(String, String)> {
    volumes
        .iter()
        .filter_map(|pv| {
            let spec = pv.spec.as_ref()?;
            if let Some(rbd) = &spec.rbd {
                return Some((
                    rbd.pool.clone().unwrap_or_else(|| "rbd".into()),
                    rbd.image.clone(),
                ));
            }
            let csi = spec.csi.as_ref()?;
            if let Ok(id) = rbd_csi::volume::VolumeId::parse(&csi.volume_handle) {
                return Some((id.pool, id.image));
            }
            let attrs = csi.volume_attributes.as_ref()?;
            Some((attrs.get("pool")?.clone(), attrs.get("imageName")?.clone()))
        })
        .collect()
}

pub async fn run(args: GcArgs) -> anyhow::Result<()> {
    let client = crate::kube_client::client(&args.kube).await?;
    let identity = args
        .id
        .clone()
        .unwrap_or_else(|| args.provisioner_name.clone());
    let rules = Rules {
        identity: &identity,
        min_age: args.min_age,
        now: SystemTime::now(),
        unrecorded_prefix: args
            .include_unrecorded
            .then_some(args.image_name_prefix.as_str()),
    };
    let found = scan(
        &client,
        &args.provisioner_name,
        &rules,
        args.command_timeout,
    )
    .await?;
    if found.is_empty() {
        println!("no orphaned images");
        return Ok(());
    }
    println!("{:<20} {:<50} {:<45} CLAIM", "POOL", "IMAGE", "PV (gone)");
    for (o, _) in &found {
        let (pv, claim) = match &o.owner {
            None => ("<no owner record>", ""),
            Some(w) if w.pv.is_empty() => ("<record cut short>", w.claim.as_str()),
            Some(w) => (w.pv.as_str(), w.claim.as_str()),
        };
        println!("{:<20} {:<50} {:<45} {claim}", o.pool, o.image, pv);
    }
    if !args.delete {
        println!(
            "{} orphaned image(s); run with --delete to remove them",
            found.len()
        );
        return Ok(());
    }
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let mut failed = 0;
    for (o, cluster) in &found {
        // the PV may have been saved since the scan (a provisioning that was in flight)
        if let Some(owner) = o.owner.as_ref().filter(|w| !w.pv.is_empty())
            && volumes.get_opt(&owner.pv).await?.is_some()
        {
            println!(
                "kept {}/{}: its PV {} exists now",
                o.pool, o.image, owner.pv
            );
            continue;
        }
        match cluster.remove_image(&o.pool, &o.image).await {
            Ok(()) => println!("removed {}/{}", o.pool, o.image),
            Err(e) => {
                failed += 1;
                eprintln!("not removed: {e}");
            }
        }
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} orphaned image(s) could not be removed"
    );
    Ok(())
}

type Found = Vec<(Orphan, std::sync::Arc<ceph_rbd::Cluster>)>;

async fn scan(
    client: &Client,
    provisioner_name: &str,
    rules: &Rules<'_>,
    timeout: Duration,
) -> anyhow::Result<Found> {
    let classes: Api<StorageClass> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let all_volumes = volumes.list(&ListParams::default()).await?.items;
    let referenced = referenced_images(&all_volumes);
    let pvs: BTreeSet<String> = all_volumes
        .into_iter()
        .filter_map(|pv| pv.metadata.name)
        .collect();
    let ceph = ConnectionPool::default();
    let mut seen = BTreeSet::new();
    let mut found = Vec::new();
    for class in classes.list(&ListParams::default()).await?.items {
        if class.provisioner != provisioner_name {
            continue;
        }
        let class_name = class.metadata.name.clone().unwrap_or_default();
        let params = match Parameters::parse(&class.parameters.clone().unwrap_or_default()) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("skipping StorageClass {class_name}: {e}");
                continue;
            }
        };
        if !seen.insert((params.monitors_string(), params.pool.clone())) {
            continue;
        }
        let key = crate::secrets::read_key(
            client,
            &params.admin_secret_namespace,
            &params.admin_secret_name,
        )
        .await?;
        let monitors = crate::monitors::resolve(&params.monitors_string()).await?;
        let cfg = ClusterConfig::new(monitors, &params.admin_id, key)
            .with_op_timeout(timeout)
            .with_connect_timeout(timeout);
        let cluster = ceph.get(&cfg).await?;
        let mut images = BTreeMap::new();
        for image in cluster.list_images(&params.pool).await? {
            if referenced.contains(&(params.pool.clone(), image.clone())) {
                continue;
            }
            let facts = async {
                let meta = cluster.metadata_list(&params.pool, &image).await?;
                let created = cluster.image_info(&params.pool, &image).await?.created;
                Ok::<_, ceph_rbd::Error>(ImageFacts { meta, created })
            };
            match facts.await {
                Ok(facts) => {
                    images.insert(image, facts);
                }
                // gone meanwhile, or a partial image nobody can open
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        for orphan in orphans(&params.pool, &images, &pvs, &referenced, rules) {
            found.push((orphan, cluster.clone()));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(pv: &str, by: &str, age: Duration, now: SystemTime) -> ImageFacts {
        ImageFacts {
            meta: Owner {
                pv: pv.into(),
                claim: "ns/c".into(),
                provisioner: by.into(),
            }
            .entries()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            created: now - age,
        }
    }

    #[test]
    fn an_orphan_is_ours_old_enough_unreferenced_and_names_a_missing_pv() {
        let now = SystemTime::now();
        let old = Duration::from_secs(3600);
        let images = BTreeMap::from([
            (
                "live".to_string(),
                owned("pvc-live", "ceph.com/rbd", old, now),
            ),
            (
                "gone".to_string(),
                owned("pvc-gone", "ceph.com/rbd", old, now),
            ),
            (
                "young".to_string(),
                owned("pvc-young", "ceph.com/rbd", Duration::from_secs(5), now),
            ),
            (
                "theirs".to_string(),
                owned("pvc-gone", "someone-else", old, now),
            ),
            (
                "used".to_string(),
                owned("pvc-renamed", "ceph.com/rbd", old, now),
            ),
            (
                "kubernetes-dynamic-pvc-x".to_string(),
                ImageFacts {
                    meta: BTreeMap::new(),
                    created: now - old,
                },
            ),
            (
                "other".to_string(),
                ImageFacts {
                    meta: BTreeMap::new(),
                    created: now - old,
                },
            ),
            (
                "cut-short".to_string(),
                ImageFacts {
                    meta: BTreeMap::from([(
                        META_PROVISIONER.to_string(),
                        "ceph.com/rbd".to_string(),
                    )]),
                    created: now - old,
                },
            ),
        ]);
        let pvs = BTreeSet::from(["pvc-live".to_string()]);
        let referenced = BTreeSet::from([("rbd".to_string(), "used".to_string())]);
        let mut rules = Rules {
            identity: "ceph.com/rbd",
            min_age: Duration::from_secs(600),
            now,
            unrecorded_prefix: None,
        };
        let names = |found: Vec<Orphan>| found.into_iter().map(|o| o.image).collect::<Vec<_>>();
        assert_eq!(
            names(orphans("rbd", &images, &pvs, &referenced, &rules)),
            vec!["cut-short", "gone"]
        );
        rules.unrecorded_prefix = Some("kubernetes-dynamic-pvc-");
        assert_eq!(
            names(orphans("rbd", &images, &pvs, &referenced, &rules)),
            vec!["cut-short", "gone", "kubernetes-dynamic-pvc-x"]
        );
        rules.min_age = Duration::ZERO;
        assert!(
            names(orphans("rbd", &images, &pvs, &referenced, &rules))
                .contains(&"young".to_string())
        );
    }
}
