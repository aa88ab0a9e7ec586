//! `rbd-provisioner gc`: images that carry our owner record but whose PV no longer exists.
//!
//! For every StorageClass of this provisioner, the pools it provisions into (its `pool` and the
//! pools of its `topologyConstrainedPools`, inside its RADOS namespace when it has one) are
//! listed with the class's admin credentials, on the cluster its `monitors` or `clusterID`
//! (`--cluster-config`) names. An image is an orphan when
//! - its owner record (made by our `--id`) names a PV that does not exist,
//! - no PV refers to it (in-tree `rbd` or `csi` source), and
//! - it is older than `--min-age` (default 10 min): a younger one may belong to a volume whose
//!   PV is being saved right now.
//!
//! With `--include-unrecorded`, images named with our prefix that have no owner record at all
//! (a crash between image create and owner record, then the claim deleted) and that no PV
//! refers to are candidates too.
//!
//! Snapshot images and clone intermediates (the volume core's internal images) are judged by
//! [`snapshots`]: a snapshot image is an orphan when no `VolumeSnapshotContent` refers to it
//! (unknown, never an orphan, on clusters without the snapshot CRDs), a clone intermediate only
//! once its clone is gone. Their records name a driver: `--csi-driver-name` or the provisioner
//! name count as ours.
//!
//! Every candidate must also be recorded for this Kubernetes cluster (`--kube-cluster-id`,
//! default the uid of `kube-system`): several clusters may share a pool, and another's PVs and
//! contents are not in our lists. A record made before the cluster was recorded names none: such
//! images are reported as "owner cluster unknown" and never removed ([`by_kube_cluster`]).
//!
//! **Stale publications.** An image's publication record
//! ([`rbd_volume::publish::META_PUBLISHED`]) naming a node that no VolumeAttachment of the
//! image's PV names is listed too: left by a detach that could not unpublish (its PV deleted
//! first), it would refuse the volume to every other node. Judged only for images a PV of this
//! Kubernetes cluster refers to or whose owner record names this cluster (another cluster's
//! VolumeAttachments are not in our list). The records are read before the VolumeAttachments
//! are listed, so a publish that raced the scan has its VolumeAttachment in the list. `--delete`
//! lists the VolumeAttachments again and removes each stale node from the record (a
//! compare-and-swap, as the attacher's own unpublish).
//!
//! Dry run by default. `--delete` checks each orphan's PV and whether any PV refers to it now
//! (for a snapshot image: the contents) once more right before removing it, and refuses (and
//! reports) images still mapped somewhere; it never forces. Volumes are removed with the volume core's
//! [`rbd_volume::snapshot::delete_volume`] (snapshot images and clone intermediates made from
//! them are flattened first and survive), internal images with
//! [`rbd_volume::snapshot::delete_snapshot`] (one that restored or cloned volumes still hang off
//! is flattened and moved to the RBD trash until its last child is gone).

pub mod snapshots;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use ceph_rbd::{ClusterConfig, ConnectionPool};
use clap::Args;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::{Api, Client};

use k8s_openapi::api::storage::v1::VolumeAttachment;
use rbd_volume::publish::{self, META_PUBLISHED, Publication};
use rbd_volume::snapshot::{SnapshotDeleted, SnapshotOwner, is_internal_image};
use rbd_volume::{Claimant, ClusterConfigFile, Deleted, Hooks};

use crate::backend::image::{META_CLAIM, META_PROVISIONER, Owner};
use crate::backend::params::Parameters;
use crate::cli::KubeArgs;
use rbd_volume::META_KUBE_CLUSTER;
pub use snapshots::Contents;

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
    /// CSI driver name: snapshot images and clone intermediates recorded as made by it (or by
    /// the provisioner name) are ours.
    #[arg(long, default_value = rbd_csi::DEFAULT_DRIVER_NAME)]
    pub csi_driver_name: String,
    /// Remove the orphans (default: only list them).
    #[arg(long)]
    pub delete: bool,
    /// Leave images younger than this alone (their PV may be being saved right now).
    #[arg(long, default_value = "10m", value_parser = crate::cli::duration::parse)]
    pub min_age: Duration,
    /// Also list (and with --delete remove) images named with --image-name-prefix that have no
    /// owner record and that no PV refers to.
    #[arg(long)]
    pub include_unrecorded: bool,
    /// Image name prefix, for --include-unrecorded.
    #[arg(long, default_value = crate::backend::image::DEFAULT_PREFIX)]
    pub image_name_prefix: String,
    /// Bound for each Ceph operation.
    #[arg(long, default_value = "10s", value_parser = crate::cli::duration::parse)]
    pub command_timeout: Duration,
    /// Cluster config (ceph-csi's `config.json`), for classes that name `clusterID`.
    #[arg(long, env = "CLUSTER_CONFIG")]
    pub cluster_config: Option<std::path::PathBuf>,
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
    pub what: What,
}

/// What kind of image an orphan is, with its record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum What {
    /// A volume whose PV is gone; `None` for an image without an owner record
    /// (`--include-unrecorded`).
    Volume(Option<Owner>),
    /// A snapshot image no `VolumeSnapshotContent` refers to.
    Snapshot(SnapshotOwner),
    /// A clone intermediate whose clone is gone.
    CloneIntermediate(SnapshotOwner),
}

/// The rules gc applies.
#[derive(Clone, Debug)]
pub struct Rules<'a> {
    pub identity: &'a str,
    /// This Kubernetes cluster's identity: only images recorded for it are orphans
    /// ([`by_kube_cluster`]).
    pub kube_cluster: &'a str,
    /// Drivers whose snapshot images and clone intermediates are ours.
    pub snapshot_drivers: &'a [&'a str],
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
        .filter(|(image, _)| !is_internal_image(image))
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
                        kube_cluster: facts
                            .meta
                            .get(META_KUBE_CLUSTER)
                            .cloned()
                            .unwrap_or_default(),
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
                what: What::Volume(owner),
            })
        })
        .collect()
}

/// What [`by_kube_cluster`] made of the candidates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Judged {
    /// Recorded for our Kubernetes cluster (or, with `--include-unrecorded`, with no record):
    /// orphans.
    pub orphans: Vec<Orphan>,
    /// Records made before the Kubernetes cluster was recorded: reported, never removed (the
    /// image may be another cluster's sharing the pool).
    pub unknown_cluster: Vec<Orphan>,
}

/// Pure: keeps the candidates (of one pool, with their `images` facts) whose record names our
/// Kubernetes cluster `ours`; those whose record names none go to `unknown_cluster`; those of
/// another cluster are dropped (its PVs and contents are not in our lists). An image with no
/// record at all (`--include-unrecorded`) stays a candidate.
#[must_use]
pub fn by_kube_cluster(
    candidates: Vec<Orphan>,
    images: &BTreeMap<String, ImageFacts>,
    ours: &str,
) -> Judged {
    let mut judged = Judged::default();
    for candidate in candidates {
        if matches!(candidate.what, What::Volume(None)) {
            judged.orphans.push(candidate);
            continue;
        }
        let recorded = images
            .get(&candidate.image)
            .and_then(|facts| facts.meta.get(META_KUBE_CLUSTER))
            .map_or("", String::as_str);
        if recorded.is_empty() {
            judged.unknown_cluster.push(candidate);
        } else if recorded == ours {
            judged.orphans.push(candidate);
        }
    }
    judged
}

/// `(pool spec, image)` of every PV with an RBD image source (in-tree, or CSI of any driver that
/// names a pool and an image); the pool spec is `pool/namespace` for a volume in a RADOS
/// namespace, so a name in one namespace never stands for the same name in another.
pub fn referenced_images(volumes: &[PersistentVolume]) -> BTreeSet<(String, String)> {
    volumes.iter().filter_map(image_of).collect()
}

/// `(pool spec, image)` of a PV with an RBD image source (see [`referenced_images`]).
fn image_of(pv: &PersistentVolume) -> Option<(String, String)> {
    let spec = pv.spec.as_ref()?;
    if let Some(rbd) = &spec.rbd {
        return Some((
            rbd.pool.clone().unwrap_or_else(|| "rbd".into()),
            rbd.image.clone(),
        ));
    }
    let csi = spec.csi.as_ref()?;
    if let Ok(id) = rbd_csi::volume::VolumeId::parse(&csi.volume_handle) {
        return Some((id.pool_spec(), id.image));
    }
    let attrs = csi.volume_attributes.as_ref()?;
    let namespace = attrs
        .get(crate::backend::pv_build::ATTR_NAMESPACE)
        .map_or("", String::as_str);
    Some((
        ceph_rbd::pool_spec(attrs.get("pool")?, namespace),
        attrs.get("imageName")?.clone(),
    ))
}

/// `(pool spec, image, node)` for every VolumeAttachment of a PV in `volumes`: the node as
/// Kubernetes names it and, when the attacher recorded one, its CSI node ID.
pub fn attached_images(
    attachments: &[VolumeAttachment],
    volumes: &[PersistentVolume],
) -> BTreeSet<(String, String, String)> {
    let images: BTreeMap<&str, (String, String)> = volumes
        .iter()
        .filter_map(|pv| Some((pv.metadata.name.as_deref()?, image_of(pv)?)))
        .collect();
    let mut attached = BTreeSet::new();
    for va in attachments {
        let Some((pool, image)) = va
            .spec
            .source
            .persistent_volume_name
            .as_deref()
            .and_then(|pv| images.get(pv))
        else {
            continue;
        };
        let node_id = va
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(provisioner::attach::ANN_NODE_ID));
        for node in std::iter::once(&va.spec.node_name).chain(node_id) {
            attached.insert((pool.clone(), image.clone(), node.clone()));
        }
    }
    attached
}

/// An image published to nodes no VolumeAttachment names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stale {
    pub pool: String,
    pub image: String,
    /// The nodes of its record that have no VolumeAttachment for it.
    pub nodes: Vec<String>,
}

/// Pure: the stale entries of `published` ((pool spec, image) -> its publications), given
/// `attached` ([`attached_images`]).
#[must_use]
pub fn stale_publications(
    published: &BTreeMap<(String, String), Vec<Publication>>,
    attached: &BTreeSet<(String, String, String)>,
) -> Vec<Stale> {
    published
        .iter()
        .filter_map(|((pool, image), publications)| {
            let nodes: Vec<String> = publications
                .iter()
                .filter(|p| !attached.contains(&(pool.clone(), image.clone(), p.node.clone())))
                .map(|p| p.node.clone())
                .collect();
            (!nodes.is_empty()).then(|| Stale {
                pool: pool.clone(),
                image: image.clone(),
                nodes,
            })
        })
        .collect()
}

/// The stale publications of `scanned` (read before this lists the VolumeAttachments).
async fn find_stale(client: &Client, published: &Published) -> anyhow::Result<Vec<Stale>> {
    let records = published
        .iter()
        .map(|(key, (list, _))| (key.clone(), list.clone()))
        .collect();
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let attachments = attachments.list(&ListParams::default()).await?.items;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let volumes = volumes.list(&ListParams::default()).await?.items;
    Ok(stale_publications(
        &records,
        &attached_images(&attachments, &volumes),
    ))
}

/// Lists the stale publications; with `delete`, removes each node that still has no
/// VolumeAttachment (listed again) from its record. Returns how many could not be removed.
async fn repair_stale(
    client: &Client,
    published: &Published,
    delete: bool,
) -> anyhow::Result<usize> {
    let stale = find_stale(client, published).await?;
    if stale.is_empty() {
        return Ok(0);
    }
    println!(
        "published to nodes that no VolumeAttachment names (a detach that could not unpublish):"
    );
    println!("{:<20} {:<50} NODES", "POOL", "IMAGE");
    for s in &stale {
        println!("{:<20} {:<50} {}", s.pool, s.image, s.nodes.join(","));
    }
    if !delete {
        println!(
            "{} image(s) with stale publications; run with --delete to remove those nodes from their records",
            stale.len()
        );
        return Ok(0);
    }
    // the same judgement on a fresh list: a node attached since is kept
    let again = find_stale(client, published).await?;
    let mut failed = 0;
    for s in &again {
        let Some((_, cluster)) = published.get(&(s.pool.clone(), s.image.clone())) else {
            continue;
        };
        for node in &s.nodes {
            match publish::unpublish(cluster, &s.pool, &s.image, Some(node)).await {
                Ok(publish::Unpublished::Removed) => {
                    println!("unpublished {}/{} from node {node}", s.pool, s.image);
                }
                Ok(_) => println!("{}/{} no longer published to node {node}", s.pool, s.image),
                Err(e) => {
                    failed += 1;
                    eprintln!(
                        "not unpublished {}/{} from node {node}: {e}",
                        s.pool, s.image
                    );
                }
            }
        }
    }
    Ok(failed)
}

pub async fn run(args: GcArgs) -> anyhow::Result<()> {
    let client = crate::cli::kube_client::client(&args.kube).await?;
    let kube_cluster = crate::cli::kube_client::kube_cluster_id(&client, &args.kube).await?;
    let identity = args
        .id
        .clone()
        .unwrap_or_else(|| args.provisioner_name.clone());
    let drivers = [
        args.csi_driver_name.as_str(),
        args.provisioner_name.as_str(),
    ];
    let rules = Rules {
        identity: &identity,
        kube_cluster: &kube_cluster,
        snapshot_drivers: &drivers,
        min_age: args.min_age,
        now: SystemTime::now(),
        unrecorded_prefix: args
            .include_unrecorded
            .then_some(args.image_name_prefix.as_str()),
    };
    let clusters = match &args.cluster_config {
        Some(path) => Some(
            ClusterConfigFile::open(path.clone())
                .map_err(|e| anyhow::anyhow!("--cluster-config: {e}"))?,
        ),
        None => None,
    };
    let scanned = scan(
        &client,
        &args.provisioner_name,
        &rules,
        args.command_timeout,
        clusters.as_ref(),
    )
    .await?;
    if scanned.unknown > 0 {
        println!(
            "{} snapshot image(s) not checked: the cluster serves no snapshot.storage.k8s.io/v1 VolumeSnapshotContents (snapshot CRDs not installed)",
            scanned.unknown
        );
    }
    for (o, _) in &scanned.unknown_cluster {
        println!(
            "left alone (owner cluster unknown: recorded before the Kubernetes cluster was, may be another cluster's): {}/{}",
            o.pool, o.image
        );
    }
    if !scanned.unknown_cluster.is_empty() {
        println!(
            "{} image(s) of unknown owner cluster not judged; see docs/provisioner.md (gc) to adopt them",
            scanned.unknown_cluster.len()
        );
    }
    let unpublish_failed = repair_stale(&client, &scanned.published, args.delete).await?;
    let remove_failed =
        report_orphans(&client, &scanned.orphans, args.delete, &kube_cluster).await?;
    let mut failures = Vec::new();
    if remove_failed > 0 {
        failures.push(format!("{remove_failed} orphaned image(s)"));
    }
    if unpublish_failed > 0 {
        failures.push(format!("{unpublish_failed} stale publication(s)"));
    }
    anyhow::ensure!(
        failures.is_empty(),
        "{} could not be removed",
        failures.join(" and ")
    );
    Ok(())
}

/// Lists the orphans; with `delete`, removes them. Returns how many could not be removed.
async fn report_orphans(
    client: &Client,
    found: &Found,
    delete: bool,
    kube_cluster: &str,
) -> anyhow::Result<usize> {
    if found.is_empty() {
        println!("no orphaned images");
        return Ok(0);
    }
    println!("{:<20} {:<50} {:<45} CLAIM", "POOL", "IMAGE", "PV (gone)");
    for (o, _) in found {
        let (pv, claim) = match &o.what {
            What::Volume(None) => ("<no owner record>", String::new()),
            What::Volume(Some(w)) if w.pv.is_empty() => ("<record cut short>", w.claim.clone()),
            What::Volume(Some(w)) => (w.pv.as_str(), w.claim.clone()),
            What::Snapshot(s) => (
                "<snapshot: no VolumeSnapshotContent>",
                format!("snapshot {:?} of {}", s.name, s.source),
            ),
            What::CloneIntermediate(s) => (
                "<clone intermediate: clone gone>",
                format!("{} (source)", s.source),
            ),
        };
        println!("{:<20} {:<50} {:<45} {claim}", o.pool, o.image, pv);
    }
    if !delete {
        println!(
            "{} orphaned image(s); run with --delete to remove them",
            found.len()
        );
        return Ok(0);
    }
    remove(client, found, kube_cluster).await
}

/// Removes the orphans, each checked once more; returns how many could not be removed.
async fn remove(client: &Client, found: &Found, kube_cluster: &str) -> anyhow::Result<usize> {
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    // snapshots taken since the scan refer to their images now
    let contents = snapshots::list_contents(client).await?;
    // and PVs saved since the scan (of any record, or none) to theirs
    let referenced = referenced_images(&volumes.list(&ListParams::default()).await?.items);
    let mut failed = 0;
    for (o, cluster) in found {
        let result = match &o.what {
            What::Volume(owner) => {
                if referenced.contains(&(o.pool.clone(), o.image.clone())) {
                    println!("kept {}/{}: a PV refers to it now", o.pool, o.image);
                    continue;
                }
                // the PV may have been saved since the scan (a provisioning that was in flight)
                if let Some(owner) = owner.as_ref().filter(|w| !w.pv.is_empty())
                    && volumes.get_opt(&owner.pv).await?.is_some()
                {
                    println!(
                        "kept {}/{}: its PV {} exists now",
                        o.pool, o.image, owner.pv
                    );
                    continue;
                }
                // the record is read again by the removal: one naming another Kubernetes
                // cluster is refused
                let claimant = match owner.as_ref().filter(|w| !w.pv.is_empty()) {
                    Some(w) => Claimant::volume(w.pv.clone()),
                    None => Claimant::image(),
                }
                .in_kube_cluster(kube_cluster);
                rbd_volume::snapshot::delete_volume(
                    cluster,
                    &o.pool,
                    &o.image,
                    &claimant,
                    &Hooks::default(),
                )
                .await
                .map(|d| match d {
                    Deleted::Removed => "removed",
                    Deleted::AlreadyGone => "already gone",
                })
            }
            What::Snapshot(_) | What::CloneIntermediate(_) => {
                if let What::Snapshot(_) = o.what
                    && contents
                        .as_ref()
                        .is_none_or(|c| c.refers_to(&o.pool, &o.image))
                {
                    println!(
                        "kept {}/{}: a VolumeSnapshotContent refers to it now",
                        o.pool, o.image
                    );
                    continue;
                }
                rbd_volume::snapshot::delete_snapshot(cluster, &o.pool, &o.image)
                    .await
                    .map(|d| match d {
                        SnapshotDeleted::Removed => "removed",
                        SnapshotDeleted::Trashed => {
                            "moved to the trash (volumes cloned from it still need it; purged once they are gone)"
                        }
                        SnapshotDeleted::AlreadyGone => "already gone",
                    })
            }
        };
        match result {
            Ok(done) => println!("{done} {}/{}", o.pool, o.image),
            Err(e) => {
                failed += 1;
                eprintln!("not removed {}/{}: {e}", o.pool, o.image);
            }
        }
    }
    Ok(failed)
}

type Found = Vec<(Orphan, std::sync::Arc<ceph_rbd::Cluster>)>;

/// (pool spec, image) -> its publications (non-empty) and its cluster's connection.
type Published = BTreeMap<(String, String), (Vec<Publication>, std::sync::Arc<ceph_rbd::Cluster>)>;

/// What [`scan`] found.
struct Scanned {
    orphans: Found,
    /// Images of this Kubernetes cluster with a publication record.
    published: Published,
    /// Candidates whose record names no Kubernetes cluster: reported, left alone.
    unknown_cluster: Found,
    /// Snapshot images not judged (no snapshot API).
    unknown: usize,
}

/// One scanned pool (a pool spec: `pool` or `pool/namespace`; a namespace is listed on its own,
/// so gc never sees, let alone removes, an image of another namespace): its connection, every
/// image name, the facts of those no PV refers to.
struct PoolScan {
    pool: String,
    cluster: std::sync::Arc<ceph_rbd::Cluster>,
    names: BTreeSet<String>,
    images: BTreeMap<String, ImageFacts>,
    /// The publications of images a PV refers to or recorded for this Kubernetes cluster.
    published: BTreeMap<String, Vec<Publication>>,
}

async fn scan(
    client: &Client,
    provisioner_name: &str,
    rules: &Rules<'_>,
    timeout: Duration,
    clusters: Option<&ClusterConfigFile>,
) -> anyhow::Result<Scanned> {
    let classes: Api<StorageClass> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let all_volumes = volumes.list(&ListParams::default()).await?.items;
    let contents = snapshots::list_contents(client).await?;
    let referenced = referenced_images(&all_volumes);
    let pvs: BTreeSet<String> = all_volumes
        .into_iter()
        .filter_map(|pv| pv.metadata.name)
        .collect();
    let ceph = ConnectionPool::default();
    let mut seen = BTreeSet::new();
    let mut pools = Vec::new();
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
        let (monitors, namespace) = match crate::commands::class_location(&params, clusters) {
            Ok(location) => location,
            Err(e) => {
                eprintln!("skipping StorageClass {class_name}: {e}");
                continue;
            }
        };
        // every pool the class can put volumes in: its pool and its per-topology pools
        let mut class_pools = vec![params.pool.clone()];
        for p in params.topology_pools.iter().flatten() {
            class_pools.push(p.pool.clone());
        }
        // a cluster named by a class (clusterID) and given by monitors in another is scanned
        // once: the key is the resolved monitors
        let monitors = crate::backend::monitors::resolve(&monitors).await?;
        let specs: Vec<String> = class_pools
            .iter()
            .map(|pool| ceph_rbd::pool_spec(pool, &namespace))
            .filter(|spec| seen.insert((monitors.clone(), spec.clone())))
            .collect();
        if specs.is_empty() {
            continue;
        }
        let key = crate::backend::secrets::read_key(
            client,
            &params.admin_secret_namespace,
            &params.admin_secret_name,
        )
        .await?;
        let cfg = ClusterConfig::new(monitors, &params.admin_id, key)
            .with_op_timeout(timeout)
            .with_connect_timeout(timeout);
        let cluster = ceph.get(&cfg).await?;
        for spec in specs {
            pools.push(scan_pool(cluster.clone(), spec, &referenced, rules.kube_cluster).await?);
        }
    }
    let names = pools
        .iter()
        .map(|p| (p.pool.clone(), p.names.clone()))
        .collect();
    let facts = pools
        .iter()
        .map(|p| (p.pool.clone(), p.images.clone()))
        .collect();
    let live = snapshots::live_intermediates(&names, &facts);
    let mut scanned = Scanned {
        orphans: Vec::new(),
        published: BTreeMap::new(),
        unknown_cluster: Vec::new(),
        unknown: 0,
    };
    for p in &pools {
        for (image, list) in &p.published {
            scanned.published.insert(
                (p.pool.clone(), image.clone()),
                (list.clone(), p.cluster.clone()),
            );
        }
        let mut candidates = orphans(&p.pool, &p.images, &pvs, &referenced, rules);
        let internal = snapshots::orphans(&p.pool, &p.images, contents.as_ref(), &live, rules);
        scanned.unknown += internal.unknown;
        candidates.extend(internal.orphans);
        let judged = by_kube_cluster(candidates, &p.images, rules.kube_cluster);
        for orphan in judged.orphans {
            scanned.orphans.push((orphan, p.cluster.clone()));
        }
        for unknown in judged.unknown_cluster {
            scanned.unknown_cluster.push((unknown, p.cluster.clone()));
        }
    }
    Ok(scanned)
}

/// Lists `pool`, reads the facts of the images no PV refers to and the publication records of
/// those a PV refers to or recorded for Kubernetes cluster `kube_cluster`.
async fn scan_pool(
    cluster: std::sync::Arc<ceph_rbd::Cluster>,
    pool: String,
    referenced: &BTreeSet<(String, String)>,
    kube_cluster: &str,
) -> anyhow::Result<PoolScan> {
    let names: BTreeSet<String> = cluster.list_images(&pool).await?.into_iter().collect();
    let mut images = BTreeMap::new();
    let mut published = BTreeMap::new();
    let mut keep_record =
        |image: &str, value: Option<&str>| match publish::parse_record(image, value) {
            Ok(list) if !list.is_empty() => {
                published.insert(image.to_owned(), list);
            }
            Ok(_) => {}
            Err(e) => eprintln!("{pool}/{image}: {e}"),
        };
    for image in &names {
        if referenced.contains(&(pool.clone(), image.clone())) {
            match cluster.metadata_get(&pool, image, META_PUBLISHED).await {
                Ok(value) => keep_record(image, value.as_deref()),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
            continue;
        }
        let facts = async {
            let meta = cluster.metadata_list(&pool, image).await?;
            let created = cluster.image_info(&pool, image).await?.created;
            Ok::<_, ceph_rbd::Error>(ImageFacts { meta, created })
        };
        match facts.await {
            Ok(facts) => {
                if facts.meta.get(META_KUBE_CLUSTER).map(String::as_str) == Some(kube_cluster) {
                    keep_record(image, facts.meta.get(META_PUBLISHED).map(String::as_str));
                }
                images.insert(image.clone(), facts);
            }
            // gone meanwhile, or a partial image nobody can open
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(PoolScan {
        pool,
        cluster,
        names,
        images,
        published,
    })
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
                kube_cluster: String::new(),
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
            snapshot_drivers: &["rbd.provisioner.ceph.io"],
            min_age: Duration::from_secs(600),
            now,
            unrecorded_prefix: None,
            kube_cluster: "uid-a",
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

    #[test]
    fn a_publication_is_stale_when_no_volume_attachment_of_its_pv_names_the_node() {
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pvc-1"},
            "spec": {"rbd": {"pool": "rbd", "image": "img-1", "monitors": ["m"]}},
        }))
        .unwrap();
        let va = |node: &str, node_id: Option<&str>, pv: &str| -> VolumeAttachment {
            let annotations =
                node_id.map(|id| serde_json::json!({"csi.alpha.kubernetes.io/node-id": id}));
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("va-{node}"), "annotations": annotations},
                "spec": {"attacher": "d", "nodeName": node, "source": {"persistentVolumeName": pv}},
            }))
            .unwrap()
        };
        let attachments = [
            va("node-a", None, "pvc-1"),
            va("node-b", Some("id-b"), "pvc-1"),
            // a VolumeAttachment of another PV says nothing about img-1
            va("node-c", None, "pvc-other"),
        ];
        let attached = attached_images(&attachments, &[pv]);
        let p = |node: &str| Publication {
            node: node.to_owned(),
            sharing: rbd_volume::publish::Sharing::MultiNode,
            readonly: true,
        };
        let key = |image: &str| ("rbd".to_owned(), image.to_owned());
        let published = BTreeMap::from([
            (
                key("img-1"),
                vec![p("node-a"), p("id-b"), p("node-c"), p("dead")],
            ),
            (key("img-2"), vec![p("node-a")]),
        ]);
        assert_eq!(
            stale_publications(&published, &attached),
            [
                Stale {
                    pool: "rbd".into(),
                    image: "img-1".into(),
                    nodes: vec!["node-c".into(), "dead".into()],
                },
                Stale {
                    pool: "rbd".into(),
                    image: "img-2".into(),
                    nodes: vec!["node-a".into()],
                },
            ]
        );
    }

    #[test]
    fn only_images_recorded_for_our_kubernetes_cluster_are_orphans() {
        let now = SystemTime::now();
        let old = Duration::from_secs(3600);
        let of = |cluster: &str| {
            let mut facts = owned("pvc-gone", "ceph.com/rbd", old, now);
            if !cluster.is_empty() {
                facts
                    .meta
                    .insert(META_KUBE_CLUSTER.to_string(), cluster.to_string());
            }
            facts
        };
        let images = BTreeMap::from([
            ("ours".to_string(), of("uid-a")),
            ("theirs".to_string(), of("uid-b")),
            ("before".to_string(), of("")),
            (
                "kubernetes-dynamic-pvc-x".to_string(),
                ImageFacts {
                    meta: BTreeMap::new(),
                    created: now - old,
                },
            ),
        ]);
        let rules = Rules {
            identity: "ceph.com/rbd",
            kube_cluster: "uid-a",
            snapshot_drivers: &[],
            min_age: Duration::ZERO,
            now,
            unrecorded_prefix: Some("kubernetes-dynamic-pvc-"),
        };
        let candidates = orphans("rbd", &images, &BTreeSet::new(), &BTreeSet::new(), &rules);
        assert_eq!(candidates.len(), 4);
        let judged = by_kube_cluster(candidates, &images, "uid-a");
        let names = |found: &[Orphan]| found.iter().map(|o| o.image.clone()).collect::<Vec<_>>();
        assert_eq!(names(&judged.orphans), ["kubernetes-dynamic-pvc-x", "ours"]);
        assert_eq!(names(&judged.unknown_cluster), ["before"]);
    }
}
