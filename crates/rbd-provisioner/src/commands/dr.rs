//! `rbd-provisioner dr`: the peer site's side of disaster recovery.
//!
//! On the Kubernetes cluster of the site that holds the mirrored copies (see
//! docs/disaster-recovery.md), with a StorageClass of this provisioner for the site's Ceph
//! cluster and pool:
//!
//! - `dr list`: the pool's mirrored images with the claim and PV their owner record names
//!   (mirrored with the image), whether this copy is primary, the last sync, and whether a PV
//!   of this cluster refers to the image. A copy left after its claim was deleted on the other
//!   site is listed too.
//! - `dr adopt --namespace NS`: for each mirrored image whose claim is in namespace NS, the PV
//!   (the recorded name, this site's cluster in its volume handle, reclaim policy `Retain`) and
//!   the claim (the recorded name, bound to that PV). With `--replication-class`, a
//!   VolumeReplication for each claim: `secondary`, or with `--promote` `primary` (the
//!   provisioner's replication controller promotes the copy once the other site's demotion has
//!   arrived; with `--force`, at once: for a lost site). Existing objects are left as they are:
//!   the command can be run again.
//!
//! Encrypted images are listed but not adopted: their key is the other site's KMS's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ceph_rbd::{ClusterConfig, ConnectionPool, MirrorImageState};
use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use provisioner::replication::{FORCE_PROMOTE_ANNOTATION, VolumeReplication};
use provisioner::volume::{ProvisionOptions, Provisioned, SecretRef};
use rbd_volume::ClusterConfigFile;
use serde_json::json;

use crate::backend::params::{Parameters, PvSource};
use crate::backend::pv_build::{VolumeInputs, build_volume, image_location};
use crate::cli::KubeArgs;

#[derive(Args, Debug, Clone)]
pub struct DrArgs {
    #[command(subcommand)]
    pub action: DrAction,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The StorageClass whose Ceph cluster and pool hold the copies (a class of this
    /// provisioner on this site).
    #[arg(long, global = true)]
    pub storage_class: Option<String>,
    /// CSI driver name of the PVs made (and recognised).
    #[arg(long, global = true, default_value = rbd_csi::DEFAULT_DRIVER_NAME)]
    pub csi_driver_name: String,
    /// Cluster config (ceph-csi's `config.json`), for a class that names `clusterID`.
    #[arg(long, global = true, env = "CLUSTER_CONFIG")]
    pub cluster_config: Option<std::path::PathBuf>,
    /// Bound for each Ceph operation.
    #[arg(long, global = true, default_value = "10s", value_parser = crate::cli::duration::parse)]
    pub command_timeout: Duration,
}

#[derive(Subcommand, Debug, Clone)]
pub enum DrAction {
    /// List the pool's mirrored images with their recorded claim, role, last sync and PV.
    List {
        /// Only the images whose recorded claim is in this namespace.
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Make the PVs and claims of the mirrored images whose recorded claim is in a namespace.
    Adopt {
        /// The namespace whose claims are made.
        #[arg(long)]
        namespace: String,
        /// Also make a VolumeReplication of this class for each claim.
        #[arg(long)]
        replication_class: Option<String>,
        /// The VolumeReplications ask for `primary` (failover) instead of `secondary`.
        #[arg(long, requires = "replication_class")]
        promote: bool,
        /// Promote even while the other site's copy is primary (that site is lost).
        #[arg(long, requires = "promote")]
        force: bool,
        /// Access mode of the claims and PVs.
        #[arg(long, default_value = "ReadWriteOnce")]
        access_mode: String,
        /// Volume mode of the claims and PVs (Filesystem or Block).
        #[arg(long, default_value = "Filesystem")]
        volume_mode: String,
    },
}

/// A mirrored image of the pool.
#[derive(Clone, Debug)]
struct Copy {
    image: String,
    size: u64,
    primary: bool,
    /// `namespace/name` of the claim the owner record names; empty without a record.
    claim: String,
    pv: String,
    encrypted: bool,
    sync: String,
}

/// The class's cluster and pool, connected with its admin credentials.
struct Site {
    class: StorageClass,
    params: Parameters,
    monitors: String,
    namespace: String,
    cluster: Arc<ceph_rbd::Cluster>,
}

impl Site {
    fn pool_spec(&self) -> String {
        ceph_rbd::pool_spec(&self.params.pool, &self.namespace)
    }
}

async fn site(client: &Client, args: &DrArgs) -> anyhow::Result<Site> {
    let name = args
        .storage_class
        .as_deref()
        .context("--storage-class: required (a class of this provisioner for this site's pool)")?;
    let class = Api::<StorageClass>::all(client.clone())
        .get(name)
        .await
        .with_context(|| format!("--storage-class: reading StorageClass {name}"))?;
    let params = Parameters::parse(&class.parameters.clone().unwrap_or_default())
        .map_err(|e| anyhow::anyhow!("--storage-class: StorageClass {name}: {e}"))?;
    let clusters = match &args.cluster_config {
        Some(path) => Some(
            ClusterConfigFile::open(path.clone())
                .map_err(|e| anyhow::anyhow!("--cluster-config: {e}"))?,
        ),
        None => None,
    };
    let (monitors, namespace) = crate::commands::class_location(&params, clusters.as_ref())
        .map_err(|e| anyhow::anyhow!("--storage-class: StorageClass {name}: {e}"))?;
    let resolved = crate::backend::monitors::resolve(&monitors).await?;
    let key = crate::backend::secrets::read_key(
        client,
        &params.admin_secret_namespace,
        &params.admin_secret_name,
    )
    .await?;
    let cfg = ClusterConfig::new(resolved, &params.admin_id, key)
        .with_op_timeout(args.command_timeout)
        .with_connect_timeout(args.command_timeout);
    let cluster = ConnectionPool::default().get(&cfg).await?;
    Ok(Site {
        class,
        params,
        monitors,
        namespace,
        cluster,
    })
}

/// The pool's mirrored images.
async fn copies(site: &Site) -> anyhow::Result<Vec<Copy>> {
    let pool = site.pool_spec();
    let mut found = Vec::new();
    for image in site.cluster.list_images(&pool).await? {
        let info = match site.cluster.mirror_image_info(&pool, &image).await {
            Ok(info) => info,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        if info.state != MirrorImageState::Enabled {
            continue;
        }
        let meta = site.cluster.metadata_list_unopened(&pool, &image).await?;
        let owner = rbd_volume::owner::Owner::from_metadata(&meta).unwrap_or_default();
        let replication = rbd_volume::mirror::replication(&site.cluster, &pool, &image).await?;
        let sync = match replication.last_sync {
            Some(s) => k8s_openapi::jiff::Timestamp::from_second(s.time)
                .map_or_else(|_| s.time.to_string(), |t| t.to_string()),
            None => "-".into(),
        };
        found.push(Copy {
            size: site.cluster.image_info(&pool, &image).await?.size,
            primary: info.primary,
            claim: owner.claim,
            pv: owner.pv,
            encrypted: meta.contains_key(rbd_volume::encryption::kms::META_DEK),
            sync,
            image,
        });
    }
    Ok(found)
}

fn in_namespace(copy: &Copy, namespace: &str) -> bool {
    copy.claim
        .split_once('/')
        .is_some_and(|(ns, _)| ns == namespace)
}

pub async fn run(args: DrArgs) -> anyhow::Result<()> {
    let client = crate::cli::kube_client::client(&args.kube).await?;
    let site = site(&client, &args).await?;
    let copies = copies(&site).await?;
    match &args.action {
        DrAction::List { namespace } => {
            let volumes = Api::<PersistentVolume>::all(client.clone())
                .list(&ListParams::default())
                .await?
                .items;
            let pool = site.pool_spec();
            println!("IMAGE\tCLAIM\tPV\tROLE\tLAST SYNC\tPV HERE");
            for copy in copies
                .iter()
                .filter(|c| namespace.as_deref().is_none_or(|ns| in_namespace(c, ns)))
            {
                let here = volumes.iter().any(|pv| {
                    image_location(pv, &args.csi_driver_name)
                        .is_some_and(|l| l.pool_spec() == pool && l.image == copy.image)
                });
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    copy.image,
                    if copy.claim.is_empty() {
                        "-"
                    } else {
                        &copy.claim
                    },
                    if copy.pv.is_empty() { "-" } else { &copy.pv },
                    if copy.primary { "primary" } else { "secondary" },
                    copy.sync,
                    if here { "yes" } else { "no" },
                );
            }
            Ok(())
        }
        DrAction::Adopt {
            namespace,
            replication_class,
            promote,
            force,
            access_mode,
            volume_mode,
        } => {
            let mut refused = 0;
            for copy in copies.iter().filter(|c| in_namespace(c, namespace)) {
                let settings = Adoption {
                    access_mode,
                    volume_mode,
                    replication_class: replication_class.as_deref(),
                    promote: *promote,
                    force: *force,
                };
                if let Err(e) = adopt(&client, &args, &site, copy, &settings).await {
                    eprintln!("{}: not adopted: {e:#}", copy.image);
                    refused += 1;
                }
            }
            anyhow::ensure!(refused == 0, "{refused} image(s) not adopted");
            Ok(())
        }
    }
}

struct Adoption<'a> {
    access_mode: &'a str,
    volume_mode: &'a str,
    replication_class: Option<&'a str>,
    promote: bool,
    force: bool,
}

async fn adopt(
    client: &Client,
    args: &DrArgs,
    site: &Site,
    copy: &Copy,
    settings: &Adoption<'_>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !copy.encrypted,
        "encrypted: its key is wrapped by the other site's KMS"
    );
    anyhow::ensure!(
        !copy.pv.is_empty(),
        "no owner record names its PV and claim"
    );
    let (namespace, claim_name) = copy
        .claim
        .split_once('/')
        .context("no owner record names its claim")?;
    let class_name = site.class.metadata.name.clone().unwrap_or_default();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim_name, "namespace": namespace},
        "spec": {
            "storageClassName": class_name,
            "accessModes": [settings.access_mode],
            "volumeMode": settings.volume_mode,
            "resources": {"requests": {"storage": format!("{}Mi", copy.size >> 20)}},
            "volumeName": copy.pv,
        },
    }))?;
    let source = site.params.pv_source.unwrap_or(PvSource::Csi);
    let volume = build_volume(&VolumeInputs {
        params: &site.params,
        claim: &claim,
        monitors: site.monitors.clone(),
        cluster_id: site.params.cluster_id.as_deref(),
        pool: &site.params.pool,
        namespace: &site.namespace,
        node_affinity: None,
        image: copy.image.clone(),
        size_bytes: copy.size,
        source,
        csi_driver: &args.csi_driver_name,
        identity: &site.class.provisioner,
        encryption: None,
    })
    .map_err(|e| anyhow::anyhow!(e))?;
    let mut volume = provisioner::pv::finish_volume(
        Provisioned {
            volume,
            deletion_secret: Some(SecretRef {
                namespace: site.params.admin_secret_namespace.clone(),
                name: site.params.admin_secret_name.clone(),
            }),
        },
        &ProvisionOptions {
            storage_class: site.class.clone(),
            pv_name: copy.pv.clone(),
            claim: claim.clone(),
            selected_node: None,
        },
        &site.class.provisioner,
        false,
    );
    // kept until the copy is promoted and in use: then the class's policy may be set
    if let Some(spec) = volume.spec.as_mut() {
        spec.persistent_volume_reclaim_policy = Some("Retain".into());
    }
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    match volumes.get_opt(&copy.pv).await? {
        Some(existing) => {
            let same = image_location(&existing, &args.csi_driver_name)
                .is_some_and(|l| l.pool_spec() == site.pool_spec() && l.image == copy.image);
            anyhow::ensure!(
                same,
                "PV {} exists and refers to another image: left alone",
                copy.pv
            );
            println!("PV {} exists", copy.pv);
        }
        None => {
            volumes.create(&PostParams::default(), &volume).await?;
            println!("PV {} made (Retain)", copy.pv);
        }
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    if claims.get_opt(claim_name).await?.is_some() {
        println!("claim {namespace}/{claim_name} exists");
    } else {
        claims.create(&PostParams::default(), &claim).await?;
        println!("claim {namespace}/{claim_name} made");
    }
    if let Some(class) = settings.replication_class {
        replication(client, namespace, claim_name, class, settings).await?;
    }
    Ok(())
}

async fn replication(
    client: &Client,
    namespace: &str,
    claim: &str,
    class: &str,
    settings: &Adoption<'_>,
) -> anyhow::Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<VolumeReplication>(&()),
    );
    if api.get_opt(claim).await?.is_some() {
        println!(
            "VolumeReplication {namespace}/{claim} exists (its replicationState is left as it is)"
        );
        return Ok(());
    }
    let mut annotations = BTreeMap::new();
    if settings.force {
        annotations.insert(FORCE_PROMOTE_ANNOTATION, "true");
    }
    let state = if settings.promote {
        "primary"
    } else {
        "secondary"
    };
    let object = serde_json::from_value(json!({
        "apiVersion": "replication.storage.openshift.io/v1alpha1",
        "kind": "VolumeReplication",
        "metadata": {"name": claim, "namespace": namespace, "annotations": annotations},
        "spec": {
            "volumeReplicationClass": class,
            "replicationState": state,
            "dataSource": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": claim},
            "autoResync": false,
        },
    }))?;
    api.create(&PostParams::default(), &object).await?;
    println!("VolumeReplication {namespace}/{claim} made ({state})");
    Ok(())
}
