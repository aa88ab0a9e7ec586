//! `rbd-provisioner gc`: images that carry our owner record but whose PV no longer exists.
//!
//! For every StorageClass of this provisioner, the pool it provisions into is listed with the
//! class's admin credentials; an image is an orphan when its metadata names a PV (made by our
//! provisioner identity) that does not exist. Dry run by default; `--delete` removes orphans
//! (an orphan still mapped somewhere is refused and reported, never forced).

use std::collections::{BTreeMap, BTreeSet};

use ceph_rbd::{ClusterConfig, ConnectionPool};
use clap::Args;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::cli::KubeArgs;
use crate::image::Owner;
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
    /// Bound for each Ceph operation.
    #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
    pub command_timeout: std::time::Duration,
}

/// An image whose PV is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    pub pool: String,
    pub image: String,
    pub owner: Owner,
}

/// Pure: the orphans among `images` (name -> metadata) given the existing PV names.
pub fn orphans(
    pool: &str,
    images: &BTreeMap<String, BTreeMap<String, String>>,
    pvs: &BTreeSet<String>,
    identity: &str,
) -> Vec<Orphan> {
    images
        .iter()
        .filter_map(|(image, meta)| {
            let owner = Owner::from_metadata(meta)?;
            (owner.provisioner == identity && !pvs.contains(&owner.pv)).then(|| Orphan {
                pool: pool.to_string(),
                image: image.clone(),
                owner,
            })
        })
        .collect()
}

pub async fn run(args: GcArgs) -> anyhow::Result<()> {
    let client = crate::kube_client::client(&args.kube).await?;
    let identity = args
        .id
        .clone()
        .unwrap_or_else(|| args.provisioner_name.clone());
    let found = scan(
        &client,
        &args.provisioner_name,
        &identity,
        args.command_timeout,
    )
    .await?;
    if found.is_empty() {
        println!("no orphaned images");
        return Ok(());
    }
    println!("{:<20} {:<50} {:<45} CLAIM", "POOL", "IMAGE", "PV (gone)");
    for (o, _) in &found {
        println!(
            "{:<20} {:<50} {:<45} {}",
            o.pool, o.image, o.owner.pv, o.owner.claim
        );
    }
    if !args.delete {
        println!(
            "{} orphaned image(s); run with --delete to remove them",
            found.len()
        );
        return Ok(());
    }
    let mut failed = 0;
    for (o, cluster) in &found {
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
    identity: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<Found> {
    let classes: Api<StorageClass> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let pvs: BTreeSet<String> = volumes
        .list(&ListParams::default())
        .await?
        .items
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
            match cluster.metadata_list(&params.pool, &image).await {
                Ok(meta) => {
                    images.insert(image, meta);
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        for orphan in orphans(&params.pool, &images, &pvs, identity) {
            found.push((orphan, cluster.clone()));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orphan_is_ours_and_names_a_missing_pv() {
        let owned = |pv: &str, by: &str| -> BTreeMap<String, String> {
            Owner {
                pv: pv.into(),
                claim: "ns/c".into(),
                provisioner: by.into(),
            }
            .entries()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
        };
        let images = BTreeMap::from([
            ("live".to_string(), owned("pvc-live", "ceph.com/rbd")),
            ("gone".to_string(), owned("pvc-gone", "ceph.com/rbd")),
            ("theirs".to_string(), owned("pvc-gone", "someone-else")),
            ("unowned".to_string(), BTreeMap::new()),
        ]);
        let pvs = BTreeSet::from(["pvc-live".to_string()]);
        let found = orphans("rbd", &images, &pvs, "ceph.com/rbd");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].image, "gone");
        assert_eq!(found[0].owner.pv, "pvc-gone");
    }
}
