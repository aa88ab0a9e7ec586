//! The I/O of one PV's migration: checks against the API and Ceph, then the replacement.
//!
//! The replacement is crash-safe (see the parent module). Each step is a crash point
//! (`RBD_PROVISIONER_CRASH_AT`, `crashpoint.rs`):
//!
//! - `migrate-after-key-salt`: an encrypted volume's wrapped key records ceph-csi's ID as its
//!   salt (ceph-csi reads it as before), nothing else changed;
//! - `migrate-after-owner-record`: the image has our owner record, nothing else changed;
//! - `migrate-after-record`: the original PV is recorded in its ConfigMap;
//! - `migrate-after-retain`: the old PV's reclaim policy is `Retain`;
//! - `migrate-after-delete`: the old PV is deleted but held by its finalizers (Terminating);
//! - `migrate-after-finalizers`: its finalizers are removed (it is gone or going);
//! - `migrate-after-create`: the CSI PV exists with policy `Retain`;
//! - `migrate-after-policy`: its reclaim policy is the original one;
//! - `migrate-after-claim-update`: the claim carries `provisioner.ceph.com/migrated-at`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use ceph_rbd::{ClusterConfig, ConnectionPool};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::json;

use super::plan::{self, AdminAccess, Legacy, SecretName};
use super::{Outcome, Row, record_name};
use crate::backend::image::{Owner, Ownership, ownership};
use crate::backend::params::Parameters;
use crate::cli::crashpoint;

/// Label on migration records.
pub const RECORD_LABEL: &str = "provisioner.ceph.com/migration-record";
/// Selector of migration records.
pub const RECORD_LABEL_SELECTOR: &str = "provisioner.ceph.com/migration-record=true";
/// Record data keys.
const KEY_PV: &str = "pv";
const KEY_UID: &str = "uid";
const KEY_POLICY: &str = "reclaimPolicy";
const KEY_STATE: &str = "state";
/// Record states.
pub const STATE_STARTED: &str = "started";
pub const STATE_DONE: &str = "done";

/// What every PV's migration shares.
pub struct Context {
    pub client: Client,
    pub driver: String,
    pub identity: String,
    /// The Kubernetes cluster's identity, recorded on the images.
    pub kube_cluster: String,
    pub record_namespace: String,
    pub dry_run: bool,
    pub command_timeout: Duration,
    pub wait: Duration,
    pub driver_present: bool,
    pub ceph: ConnectionPool,
    /// ceph-csi's RBD driver name: its PVs are migrated too.
    pub from_driver: String,
    /// Our provisioner's name (`pv.kubernetes.io/provisioned-by` of migrated ceph-csi PVs).
    pub provisioner_name: String,
    /// The cluster config (ceph-csi's `config.json`) naming ceph-csi's cluster IDs.
    pub cluster_config: Option<std::sync::Arc<rbd_volume::ClusterConfigFile>>,
    /// The KMS configuration that opens the keys of encrypted volumes (`--kms-config`).
    pub kms_config: std::path::PathBuf,
}

/// A record's state.
pub fn record_state(cm: &ConfigMap) -> Option<&str> {
    cm.data.as_ref()?.get(KEY_STATE).map(String::as_str)
}

/// The original PV a record holds.
pub fn recorded_pv(cm: &ConfigMap) -> Option<PersistentVolume> {
    serde_json::from_str(cm.data.as_ref()?.get(KEY_PV)?).ok()
}

fn recorded_policy(cm: &ConfigMap) -> Option<String> {
    cm.data.as_ref()?.get(KEY_POLICY).cloned()
}

fn recorded_uid(cm: &ConfigMap) -> Option<&str> {
    cm.data.as_ref()?.get(KEY_UID).map(String::as_str)
}

/// The original PV as recorded: without managedFields (noise), everything else kept.
fn record_for(pv: &PersistentVolume, namespace: &str) -> Result<ConfigMap, String> {
    let mut original = pv.clone();
    original.metadata.managed_fields = None;
    let name = pv.metadata.name.clone().unwrap_or_default();
    let text = serde_json::to_string(&original).map_err(|e| e.to_string())?;
    let policy = policy_of(pv);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": record_name(&name),
            "namespace": namespace,
            "labels": {RECORD_LABEL: "true"},
        },
        "data": {
            KEY_PV: text,
            KEY_UID: pv.metadata.uid.clone().unwrap_or_default(),
            KEY_POLICY: policy,
            KEY_STATE: STATE_STARTED,
        },
    }))
    .map_err(|e| e.to_string())?;
    Ok(cm)
}

fn policy_of(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.clone())
        .unwrap_or_else(|| "Retain".into())
}

fn claim_text(legacy: &Legacy) -> String {
    legacy
        .claim
        .as_ref()
        .map(|(ns, n)| format!("{ns}/{n}"))
        .unwrap_or_default()
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Migrates (or checks, in a dry run) PV `name`; never panics, never removes an image.
pub async fn migrate_one(ctx: &Context, name: &str) -> Row {
    match migrate_inner(ctx, name).await {
        Ok(row) => row,
        Err(e) => Row::new(name, Outcome::Failed, e),
    }
}

async fn migrate_inner(ctx: &Context, name: &str) -> Result<Row, String> {
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let records: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.record_namespace);
    let pv = volumes
        .get_opt(name)
        .await
        .map_err(|e| format!("reading PV {name}: {e}"))?;
    let record = records
        .get_opt(&record_name(name))
        .await
        .map_err(|e| format!("reading migration record {}: {e}", record_name(name)))?;
    let unfinished = record
        .as_ref()
        .filter(|r| record_state(r) != Some(STATE_DONE));
    match pv {
        None => match unfinished.and_then(|r| recorded_pv(r).map(|pv| (r, pv))) {
            // killed between the old PV's removal and the new one's creation
            Some((record, original)) => resume_from_record(ctx, name, record, &original).await,
            None => Ok(Row::new(name, Outcome::Refused, "no PV with this name")),
        },
        Some(pv) if pv.spec.as_ref().is_some_and(|s| s.rbd.is_some()) => {
            let record = record.filter(|r| recorded_uid(r) == pv.metadata.uid.as_deref());
            migrate_legacy(ctx, name, pv, record).await
        }
        Some(pv) if is_ceph_csi(&pv, &ctx.from_driver) => {
            let record = record.filter(|r| recorded_uid(r) == pv.metadata.uid.as_deref());
            migrate_ceph_csi(ctx, name, pv, record).await
        }
        Some(pv) => {
            let original = unfinished.and_then(recorded_pv);
            let replaced = original
                .as_ref()
                .and_then(|o| plan::original(o, &ctx.from_driver).ok())
                .filter(|l| plan::is_replacement_of(&pv, &ctx.driver, &l.pool, &l.image));
            match (unfinished, replaced) {
                (Some(record), Some(legacy)) if !ctx.dry_run => {
                    let mut row = finish(ctx, name, record, &legacy).await?;
                    row.image = format!("{}/{}", legacy.pool, legacy.image);
                    Ok(row)
                }
                (Some(_), Some(legacy)) => {
                    let mut row = Row::new(
                        name,
                        Outcome::WouldMigrate,
                        "the CSI PV exists; its reclaim policy and claim update are left to do",
                    );
                    row.claim = claim_text(&legacy);
                    row.image = format!("{}/{}", legacy.pool, legacy.image);
                    Ok(row)
                }
                _ if pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_some() => Ok(Row::new(
                    name,
                    Outcome::AlreadyMigrated,
                    "already a CSI PV; nothing to do",
                )),
                _ => Ok(Row::new(
                    name,
                    Outcome::Refused,
                    "the PV has no spec.rbd source (not an in-tree RBD volume)",
                )),
            }
        }
    }
}

/// Admin credentials for the PV's image: its deletion-secret annotations, else its class's.
async fn admin_for(ctx: &Context, pv: &PersistentVolume) -> Option<AdminAccess> {
    if let Some(a) = plan::recorded_admin(pv) {
        return Some(a);
    }
    let class = pv.spec.as_ref()?.storage_class_name.clone()?;
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    let class = classes.get_opt(&class).await.ok()??;
    let params = Parameters::parse(&class.parameters.unwrap_or_default()).ok()?;
    Some(AdminAccess {
        secret: SecretName {
            namespace: params.admin_secret_namespace,
            name: params.admin_secret_name,
        },
        user: params.admin_id,
    })
}

/// Pods that are not Succeeded or Failed and use claim `ns/name`, as `ns/pod (phase)`.
async fn pods_using(ctx: &Context, ns: &str, claim: &str) -> Result<Vec<String>, String> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing pods in {ns}: {e}"))?;
    Ok(list
        .items
        .iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| {
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == claim)
                })
        })
        .map(|p| {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Pending".into());
            format!(
                "{ns}/{} ({phase})",
                p.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect())
}

/// Why the API's state forbids replacing `pv` now, if it does: no CSIDriver of ours, finalizers
/// of other controllers, pods using its claim.
async fn api_refusal(
    ctx: &Context,
    pv: &PersistentVolume,
    claim: Option<&(String, String)>,
) -> Result<Option<String>, String> {
    if !ctx.driver_present {
        return Ok(Some(format!(
            "CSIDriver {} not found: install the CSI driver (deploy/csi) first",
            ctx.driver
        )));
    }
    let foreign = plan::foreign_finalizers(pv);
    if !foreign.is_empty() {
        return Ok(Some(format!(
            "the PV has finalizers of other controllers ({}); they must finish first",
            foreign.join(", ")
        )));
    }
    if let Some((ns, claim)) = claim {
        let users = pods_using(ctx, ns, claim).await?;
        if !users.is_empty() {
            return Ok(Some(format!(
                "claim {ns}/{claim} is used by pod(s) {}: stop them first (the old PV's \
                 kubernetes.io/pv-protection finalizer is only removed when no pod uses the \
                 claim, and a node plugin does not hand over a volume it has staged)",
                users.join(", ")
            )));
        }
    }
    Ok(None)
}

/// The checks, then (unless a dry run) the replacement of a PV that still has its rbd source.
async fn migrate_legacy(
    ctx: &Context,
    name: &str,
    pv: PersistentVolume,
    record: Option<ConfigMap>,
) -> Result<Row, String> {
    let refuse = |row: &Row, why: String| Row {
        outcome: Outcome::Refused,
        detail: why,
        ..row.clone()
    };
    let mut row = Row::new(name, Outcome::WouldMigrate, "");
    (row.claim, row.image) = plan::describe(&pv);
    let legacy = match plan::legacy(&pv) {
        Ok(l) => l,
        Err(e) => return Ok(refuse(&row, e)),
    };
    if let Some(why) = api_refusal(ctx, &pv, legacy.claim.as_ref()).await? {
        return Ok(refuse(&row, why));
    }
    // the node-stage secret must be readable and hold a key (its value is never shown)
    let user_key = match crate::backend::secrets::read_key(
        &ctx.client,
        &legacy.user_secret.namespace,
        &legacy.user_secret.name,
    )
    .await
    {
        Ok(k) => k,
        Err(e) => {
            return Ok(refuse(
                &row,
                format!("spec.rbd.secretRef: {e} (nodes could not stage the volume)"),
            ));
        }
    };
    let admin = admin_for(ctx, &pv).await;
    let (ceph_user, key) = match &admin {
        Some(a) => {
            match crate::backend::secrets::read_key(
                &ctx.client,
                &a.secret.namespace,
                &a.secret.name,
            )
            .await
            {
                Ok(k) => (a.user.clone(), k),
                Err(e) => return Ok(refuse(&row, format!("admin secret: {e}"))),
            }
        }
        None => (legacy.user.clone(), user_key),
    };
    let monitors = match crate::backend::monitors::resolve(&legacy.monitors).await {
        Ok(m) => m,
        Err(e) => return Ok(refuse(&row, format!("spec.rbd.monitors: {e}"))),
    };
    let cluster = connect(ctx, monitors, &ceph_user, key).await?;
    let (pool, image) = (&legacy.pool, &legacy.image);
    let meta = match image_refusal(
        ctx,
        &cluster,
        pool,
        image,
        "spec.rbd.image",
        name,
        legacy.capacity,
    )
    .await?
    {
        Ok(meta) => meta,
        Err(why) => return Ok(refuse(&row, why)),
    };
    let original_policy = record
        .as_ref()
        .and_then(recorded_policy)
        .unwrap_or_else(|| policy_of(&pv));
    let new_pv =
        match plan::replacement(&pv, &legacy, &ctx.driver, admin.as_ref(), &original_policy) {
            Ok(p) => p,
            Err(e) => return Ok(refuse(&row, e)),
        };
    if ctx.dry_run {
        row.detail = "checks passed".into();
        row.new_pv = Some(new_pv);
        return Ok(row);
    }

    // 1. the owner record, so gc and deletes treat the image as ours (missing keys only)
    let owner = Owner {
        pv: name.to_string(),
        claim: claim_text(&legacy),
        provisioner: plan::owner_identity(&pv, &ctx.identity),
        kube_cluster: ctx.kube_cluster.clone(),
    };
    record_entries(&cluster, pool, image, &meta, &owner.entries()).await?;
    crashpoint::hit("migrate-after-owner-record");

    replace(ctx, name, &pv, record, &new_pv, &legacy, row.image).await
}

/// The image's metadata, or why the image cannot be the PV's: missing (`field` names it),
/// smaller than the PV's `capacity`, or recorded as another PV's.
async fn image_refusal(
    ctx: &Context,
    cluster: &ceph_rbd::Cluster,
    pool: &str,
    image: &str,
    field: &str,
    name: &str,
    capacity: u64,
) -> Result<Result<BTreeMap<String, String>, String>, String> {
    let size = match cluster.image_info(pool, image).await {
        Ok(info) => info.size,
        Err(e) if e.is_not_found() => {
            return Ok(Err(format!(
                "image {pool}/{image} ({field}) does not exist"
            )));
        }
        Err(e) => return Err(format!("reading image {pool}/{image}: {e}")),
    };
    if size < capacity {
        return Ok(Err(format!(
            "image {pool}/{image} has {size} bytes, less than the PV's capacity ({capacity} bytes)"
        )));
    }
    let meta = cluster
        .metadata_list(pool, image)
        .await
        .map_err(|e| format!("reading metadata of image {pool}/{image}: {e}"))?;
    if let Ownership::Foreign(owner) = ownership(&meta, name, &ctx.kube_cluster) {
        return Ok(Err(format!(
            "image {pool}/{image} is recorded as belonging to {owner}, not PV {name}"
        )));
    }
    Ok(Ok(meta))
}

/// Writes the `entries` (an owner record) that `meta` (the image's metadata) lacks.
pub(super) async fn record_entries(
    cluster: &ceph_rbd::Cluster,
    pool: &str,
    image: &str,
    meta: &BTreeMap<String, String>,
    entries: &[(&str, &str)],
) -> Result<(), String> {
    let missing: Vec<(String, String)> = entries
        .iter()
        .filter(|(k, v)| meta.get(*k).map(String::as_str) != Some(*v))
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    if !missing.is_empty() {
        cluster
            .metadata_set_many(pool, image, missing, None)
            .await
            .map_err(|e| format!("writing the owner record of {pool}/{image}: {e}"))?;
    }
    Ok(())
}

/// Whether `pv` is a CSI volume of ceph-csi's driver `from_driver`.
fn is_ceph_csi(pv: &PersistentVolume, from_driver: &str) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|c| c.driver == from_driver)
}

/// The Ceph user (`userID`, `adminID`; default `admin`) and key of a ceph-csi secret.
pub(super) async fn ceph_csi_credentials(
    ctx: &Context,
    secret: &SecretName,
) -> Result<(String, ceph_rbd::Secret), String> {
    let api: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(ctx.client.clone(), &secret.namespace);
    let object = api
        .get_opt(&secret.name)
        .await
        .map_err(|e| format!("reading secret {secret}: {e}"))?
        .ok_or_else(|| format!("secret {secret} not found"))?;
    crate::backend::secrets::user_and_key(&object)
}

/// Connects to the cluster `cluster_id` of ceph-csi's cluster config as the Ceph user of
/// `secret` (`field` names it in a refusal). `Ok(Err(why))` is a refusal (an unknown cluster ID,
/// an unusable secret), `Err` a failure (Ceph unreachable).
pub(super) async fn connect_ceph_csi(
    ctx: &Context,
    cluster_id: &str,
    secret: &SecretName,
    field: &str,
) -> Result<
    Result<
        (
            std::sync::Arc<ceph_rbd::Cluster>,
            rbd_volume::clusters::ClusterInfo,
        ),
        String,
    >,
    String,
> {
    let info = match ctx.cluster_config.as_deref() {
        Some(config) => config.lookup(cluster_id),
        None => {
            return Ok(Err(format!(
                "cluster ID {cluster_id:?}: no cluster config (give ceph-csi's config.json with \
                 --cluster-config)"
            )));
        }
    };
    let info = match info {
        Ok(info) => info,
        Err(e) => return Ok(Err(format!("cluster ID {cluster_id:?}: {e}"))),
    };
    let (ceph_user, key) = match ceph_csi_credentials(ctx, secret).await {
        Ok(c) => c,
        Err(e) => return Ok(Err(format!("{field}: {e}"))),
    };
    let monitors = match crate::backend::monitors::resolve(&info.monitor_list()).await {
        Ok(m) => m,
        Err(e) => return Ok(Err(format!("monitors of cluster {cluster_id}: {e}"))),
    };
    let cluster = connect(ctx, monitors, &ceph_user, key).await?;
    Ok(Ok((cluster, info)))
}

/// A connection to `monitors` as `user`, bounded by `--command-timeout`.
async fn connect(
    ctx: &Context,
    monitors: String,
    user: &str,
    key: ceph_rbd::Secret,
) -> Result<std::sync::Arc<ceph_rbd::Cluster>, String> {
    let cfg = ClusterConfig::new(monitors, user, key)
        .with_op_timeout(ctx.command_timeout)
        .with_connect_timeout(ctx.command_timeout);
    ctx.ceph
        .get(&cfg)
        .await
        .map_err(|e| format!("connecting to Ceph as {user}: {e}"))
}

/// Nodes a VolumeAttachment of PV `name` names, as `node (attacher)`.
async fn attachments_of(ctx: &Context, name: &str) -> Result<Vec<String>, String> {
    let api: Api<k8s_openapi::api::storage::v1::VolumeAttachment> = Api::all(ctx.client.clone());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing VolumeAttachments: {e}"))?;
    Ok(list
        .items
        .into_iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name))
        .map(|va| format!("{} ({})", va.spec.node_name, va.spec.attacher))
        .collect())
}

/// The checks, then (unless a dry run) the replacement of a PV of ceph-csi's RBD driver: its
/// handle, the journal entry ceph-csi keeps for it and the image must agree; the journal and
/// the image's metadata are left as they are (the way back), our owner record is added.
async fn migrate_ceph_csi(
    ctx: &Context,
    name: &str,
    pv: PersistentVolume,
    record: Option<ConfigMap>,
) -> Result<Row, String> {
    let refuse = |row: &Row, why: String| Row {
        outcome: Outcome::Refused,
        detail: why,
        ..row.clone()
    };
    let mut row = Row::new(name, Outcome::WouldMigrate, "");
    let volume = match plan::ceph_csi(&pv, &ctx.from_driver) {
        Ok(v) => v,
        Err(e) => return Ok(refuse(&row, e)),
    };
    row.claim = claim_text(&volume.as_legacy());
    row.image = format!("{}/{}", volume.pool_spec(), volume.image);
    if let Some(why) = api_refusal(ctx, &pv, volume.claim.as_ref()).await? {
        return Ok(refuse(&row, why));
    }
    let attached = attachments_of(ctx, name).await?;
    if !attached.is_empty() {
        return Ok(refuse(
            &row,
            format!(
                "the volume is still attached to {}: wait until the VolumeAttachment is gone \
                 (its node has unstaged it)",
                attached.join(", ")
            ),
        ));
    }
    if let Err(e) = ceph_csi_credentials(ctx, &volume.node_secret).await {
        return Ok(refuse(
            &row,
            format!("spec.csi.nodeStageSecretRef: {e} (nodes could not stage the volume)"),
        ));
    }
    let admin = volume
        .admin_secret
        .clone()
        .unwrap_or_else(|| volume.node_secret.clone());
    let cluster =
        match connect_ceph_csi(ctx, &volume.handle.cluster_id, &admin, "admin secret").await? {
            Ok((cluster, _)) => cluster,
            Err(why) => return Ok(refuse(&row, why)),
        };
    match cluster.pool_name(volume.handle.pool_id).await {
        Ok(pool) if pool == volume.pool => {}
        Ok(pool) => {
            return Ok(refuse(
                &row,
                format!(
                    "the volume handle names pool {pool} (ID {}), its attributes pool {}",
                    volume.handle.pool_id, volume.pool
                ),
            ));
        }
        Err(e) if e.is_not_found() => {
            return Ok(refuse(
                &row,
                format!(
                    "no pool has the ID {} of the volume handle",
                    volume.handle.pool_id
                ),
            ));
        }
        Err(e) => return Err(format!("looking up pool {}: {e}", volume.handle.pool_id)),
    }
    let pool = volume.pool_spec();
    let image = volume.image.clone();
    let entry = rbd_volume::ceph_csi::volume_entry(&cluster, &pool, &volume.handle.uuid)
        .await
        .map_err(|e| format!("reading ceph-csi's journal in {pool}: {e}"))?;
    let Some(entry) = entry else {
        return Ok(refuse(
            &row,
            format!(
                "ceph-csi's journal has no entry {}{} in {pool}",
                rbd_volume::ceph_csi::VOLUME_OBJECT_PREFIX,
                volume.handle.uuid
            ),
        ));
    };
    if entry.image != image {
        return Ok(refuse(
            &row,
            format!(
                "ceph-csi's journal names image {}, the PV's attributes {image}",
                entry.image
            ),
        ));
    }
    let old_id = volume.handle.encode();
    let encrypted = match &entry.encrypt_kms {
        None => None,
        Some(kms) => {
            if let Some(why) = encryption_context_refusal(&pv, kms) {
                return Ok(refuse(&row, why));
            }
            let tenant = plan::csi_attribute(&pv, rbd_volume::encryption::PARAM_TENANT)
                .or(entry.owner.clone());
            match super::encrypted::check(
                ctx,
                &cluster,
                (&pool, &image),
                (kms, entry.encryption_type.as_deref()),
                &old_id,
                tenant.as_deref(),
            )
            .await?
            {
                Ok(encrypted) => Some(encrypted),
                Err(why) => return Ok(refuse(&row, why)),
            }
        }
    };
    let meta = match image_refusal(
        ctx,
        &cluster,
        &pool,
        &image,
        "spec.csi.volumeAttributes.imageName",
        name,
        volume.capacity,
    )
    .await?
    {
        Ok(meta) => meta,
        Err(why) => return Ok(refuse(&row, why)),
    };
    let policy = record
        .as_ref()
        .and_then(recorded_policy)
        .unwrap_or_else(|| policy_of(&pv));
    let mut new_pv =
        match plan::ceph_csi_replacement(&pv, &volume, &ctx.driver, &ctx.provisioner_name, &policy)
        {
            Ok(p) => p,
            Err(e) => return Ok(refuse(&row, e)),
        };
    if let Some(tenant) = encrypted.as_ref().and_then(|e| e.tenant.as_deref()) {
        plan::add_attribute(&mut new_pv, rbd_volume::encryption::PARAM_TENANT, tenant);
    }
    if ctx.dry_run {
        row.detail = "checks passed".into();
        row.new_pv = Some(new_pv);
        return Ok(row);
    }
    let legacy = volume.as_legacy();
    let owner = Owner {
        pv: name.to_string(),
        claim: claim_text(&legacy),
        provisioner: ctx.identity.clone(),
        kube_cluster: ctx.kube_cluster.clone(),
    };
    let mut entries = owner.entries();
    if let Some(encrypted) = &encrypted {
        let new_id = plan::volume_handle(&new_pv).unwrap_or_default();
        super::encrypted::take_over_key(&cluster, (&pool, &image), encrypted, &old_id, &new_id)
            .await?;
        crashpoint::hit("migrate-after-key-salt");
        entries.extend(encrypted.entries());
    }
    record_entries(&cluster, &pool, &image, &meta, &entries).await?;
    crashpoint::hit("migrate-after-owner-record");
    replace(ctx, name, &pv, record, &new_pv, &legacy, row.image).await
}

/// Why ceph-csi's volume context on `pv` does not name the volume's KMS entry `kms` (its
/// journal's) as our node reads it: `encrypted: "true"` and `encryptionKMSID`.
fn encryption_context_refusal(pv: &PersistentVolume, kms: &str) -> Option<String> {
    use rbd_volume::encryption::{PARAM_ENCRYPTED, PARAM_KMS_ID};
    let get = |key: &str| plan::csi_attribute(pv, key);
    if !get(PARAM_ENCRYPTED).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Some(format!(
            "ceph-csi's journal says the volume is encrypted (KMS {kms:?}), its \
             spec.csi.volumeAttributes.{PARAM_ENCRYPTED} does not say \"true\""
        ));
    }
    match get(PARAM_KMS_ID) {
        Some(id) if id == kms => None,
        None if kms == "default" => None,
        other => Some(format!(
            "ceph-csi's journal gives the volume KMS {kms:?}, its \
             spec.csi.volumeAttributes.{PARAM_KMS_ID} {:?}",
            other.unwrap_or_default()
        )),
    }
}

/// Steps 2 to 6 (see the parent module): the original PV recorded, replaced by `new_pv`, the
/// claim bound again.
async fn replace(
    ctx: &Context,
    name: &str,
    pv: &PersistentVolume,
    record: Option<ConfigMap>,
    new_pv: &PersistentVolume,
    legacy: &Legacy,
    image: String,
) -> Result<Row, String> {
    // 2. the original PV, before anything is deleted
    let records: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.record_namespace);
    let record = match record {
        Some(r) => r,
        None => save_record(&records, pv, &ctx.record_namespace).await?,
    };
    crashpoint::hit("migrate-after-record");

    // 3.-4. Retain, delete, drop the finalizers, wait until it is gone
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let uid = pv.metadata.uid.clone().unwrap_or_default();
    if pv.metadata.deletion_timestamp.is_none() {
        if policy_of(pv) != "Retain" {
            volumes
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
                )
                .await
                .map_err(|e| format!("setting reclaim policy Retain: {e}"))?;
        }
        crashpoint::hit("migrate-after-retain");
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match volumes.delete(name, &dp).await {
            Ok(_) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(format!("deleting the old PV: {e}")),
        }
        crashpoint::hit("migrate-after-delete");
    }
    remove_finalizers(&volumes, name, &uid).await?;
    crashpoint::hit("migrate-after-finalizers");
    wait_gone(&volumes, name, &uid, ctx.wait).await?;

    // 5.-6.
    create_new(ctx, name, new_pv).await?;
    let mut done = finish(ctx, name, &record, legacy).await?;
    done.image = image;
    Ok(done)
}

async fn save_record(
    records: &Api<ConfigMap>,
    pv: &PersistentVolume,
    namespace: &str,
) -> Result<ConfigMap, String> {
    let cm = record_for(pv, namespace)?;
    let name = cm.metadata.name.clone().unwrap_or_default();
    match records.create(&PostParams::default(), &cm).await {
        Ok(cm) => Ok(cm),
        // a record of another (earlier) PV object of this name, finished or not: this PV is
        // the one that is here now
        Err(e) if conflict(&e) => records
            .replace(&name, &PostParams::default(), &cm)
            .await
            .map_err(|e| format!("saving migration record {namespace}/{name}: {e}")),
        Err(e) => Err(format!("saving migration record {namespace}/{name}: {e}")),
    }
}

/// Drops pv-protection (and our provisioner's finalizer) from the deleted old PV `uid`.
async fn remove_finalizers(
    volumes: &Api<PersistentVolume>,
    name: &str,
    uid: &str,
) -> Result<(), String> {
    for _ in 0..10 {
        let Some(mut pv) = volumes
            .get_opt(name)
            .await
            .map_err(|e| format!("reading PV {name}: {e}"))?
        else {
            return Ok(());
        };
        if pv.metadata.uid.as_deref() != Some(uid) || pv.metadata.deletion_timestamp.is_none() {
            return Ok(());
        }
        let before = pv.metadata.finalizers.clone().unwrap_or_default();
        let rest: Vec<String> = before
            .iter()
            .filter(|f| *f != plan::PV_PROTECTION && *f != provisioner::pv::FINALIZER)
            .cloned()
            .collect();
        if rest.len() == before.len() {
            return Ok(());
        }
        pv.metadata.finalizers = Some(rest);
        // replace with the resourceVersion read: a conflict means someone else wrote; read again
        match volumes.replace(name, &PostParams::default(), &pv).await {
            Ok(_) => return Ok(()),
            Err(e) if not_found(&e) => return Ok(()),
            Err(e) if conflict(&e) => continue,
            Err(e) => return Err(format!("removing the old PV's finalizers: {e}")),
        }
    }
    Err("removing the old PV's finalizers: conflicting writes, try again".into())
}

async fn wait_gone(
    volumes: &Api<PersistentVolume>,
    name: &str,
    uid: &str,
    timeout: Duration,
) -> Result<(), String> {
    let end = Instant::now() + timeout;
    loop {
        match volumes.get_opt(name).await {
            Ok(None) => return Ok(()),
            Ok(Some(pv)) if pv.metadata.uid.as_deref() != Some(uid) => return Ok(()),
            Ok(Some(pv)) if Instant::now() >= end => {
                return Err(format!(
                    "the old PV is still there after {timeout:?} (finalizers: {:?}); run again",
                    pv.metadata.finalizers.unwrap_or_default()
                ));
            }
            Ok(Some(_)) => {}
            Err(e) => return Err(format!("reading PV {name}: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates the CSI PV with policy `Retain` (a Delete policy is restored only once it is there
/// and bound, see [`finish`]). An existing PV of this name is accepted only if it is the
/// replacement (a run killed after the create).
async fn create_new(ctx: &Context, name: &str, new_pv: &PersistentVolume) -> Result<(), String> {
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let mut retained = new_pv.clone();
    if let Some(spec) = retained.spec.as_mut() {
        spec.persistent_volume_reclaim_policy = Some("Retain".into());
    }
    match volumes.create(&PostParams::default(), &retained).await {
        Ok(_) => {}
        Err(e) if conflict(&e) => {
            let existing = volumes
                .get_opt(name)
                .await
                .map_err(|e| format!("reading PV {name}: {e}"))?;
            let handle = |pv: &PersistentVolume| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .map(|c| (c.driver.clone(), c.volume_handle.clone()))
            };
            if existing.as_ref().and_then(handle) != handle(new_pv) {
                return Err(format!(
                    "a PV named {name} was created meanwhile that is not the replacement; \
                     the original is recorded in ConfigMap {}/{}",
                    ctx.record_namespace,
                    record_name(name)
                ));
            }
        }
        Err(e) => return Err(format!("creating the CSI PV: {e}")),
    }
    crashpoint::hit("migrate-after-create");
    Ok(())
}

/// The PV is gone and not replaced: build the replacement from the record and go on.
async fn resume_from_record(
    ctx: &Context,
    name: &str,
    record: &ConfigMap,
    original: &PersistentVolume,
) -> Result<Row, String> {
    let policy = recorded_policy(record).unwrap_or_else(|| policy_of(original));
    let (legacy, new_pv) = if is_ceph_csi(original, &ctx.from_driver) {
        let volume =
            plan::ceph_csi(original, &ctx.from_driver).map_err(|e| format!("recorded PV: {e}"))?;
        let new_pv = plan::ceph_csi_replacement(
            original,
            &volume,
            &ctx.driver,
            &ctx.provisioner_name,
            &policy,
        )?;
        (volume.as_legacy(), new_pv)
    } else {
        let legacy = plan::legacy(original).map_err(|e| format!("recorded PV: {e}"))?;
        let admin = admin_for(ctx, original).await;
        let new_pv = plan::replacement(original, &legacy, &ctx.driver, admin.as_ref(), &policy)?;
        (legacy, new_pv)
    };
    if ctx.dry_run {
        let mut row = Row::new(
            name,
            Outcome::WouldMigrate,
            "the old PV is gone (an interrupted run); the CSI PV would be created from the record",
        );
        row.claim = claim_text(&legacy);
        row.image = format!("{}/{}", legacy.pool, legacy.image);
        row.new_pv = Some(new_pv);
        return Ok(row);
    }
    create_new(ctx, name, &new_pv).await?;
    let mut row = finish(ctx, name, record, &legacy).await?;
    row.image = format!("{}/{}", legacy.pool, legacy.image);
    Ok(row)
}

/// The CSI PV exists: check the claim is still the one the PV was bound to, restore the
/// reclaim policy (only then: a claim deleted or replaced meanwhile leaves a Released PV, which
/// keeps `Retain` so that its image is never reclaimed), update the claim, mark the record done,
/// and wait (bounded) for the claim to be Bound again.
async fn finish(
    ctx: &Context,
    name: &str,
    record: &ConfigMap,
    legacy: &Legacy,
) -> Result<Row, String> {
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let mut policy = recorded_policy(record).unwrap_or_else(|| "Retain".into());
    let current = volumes
        .get_opt(name)
        .await
        .map_err(|e| format!("reading PV {name}: {e}"))?
        .ok_or_else(|| format!("the CSI PV {name} disappeared"))?;
    let claim_gone = match &legacy.claim {
        Some((ns, claim)) => {
            let claims = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), ns);
            match claims.get_opt(claim).await {
                Ok(Some(c)) => c.metadata.uid != legacy.claim_uid,
                Ok(None) => true,
                Err(e) => return Err(format!("reading claim {ns}/{claim}: {e}")),
            }
        }
        None => false,
    };
    if claim_gone && policy != "Retain" {
        tracing::warn!(
            pv = name,
            policy,
            "the claim is gone or replaced: the PV keeps reclaim policy Retain"
        );
        policy = "Retain".into();
    }
    if policy_of(&current) != policy {
        volumes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": policy}})),
            )
            .await
            .map_err(|e| format!("restoring reclaim policy {policy}: {e}"))?;
    }
    crashpoint::hit("migrate-after-policy");

    let mut row = Row::new(name, Outcome::Migrated, "");
    row.claim = claim_text(legacy);
    let claim_api = legacy.claim.as_ref().map(|(ns, n)| {
        (
            Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), ns),
            n,
        )
    });
    let mut detail = "no claim".to_string();
    if let Some((claims, claim)) = &claim_api {
        // an update of the claim: kube-controller-manager syncs it and binds it again now
        // rather than on its next resync
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let annotations = BTreeMap::from([(plan::ANN_CLAIM_MIGRATED_AT, now.to_string())]);
        match claims.get_opt(claim).await {
            Ok(Some(c)) if c.metadata.uid == legacy.claim_uid => {
                // the resourceVersion read makes it a write to this very object; a conflict
                // means it was just updated by someone else, which syncs it just as well
                let patch = json!({"metadata": {
                    "resourceVersion": c.metadata.resource_version,
                    "annotations": annotations,
                }});
                match claims
                    .patch(claim, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if conflict(&e) => {}
                    Err(e) if not_found(&e) => {
                        detail = "the claim is gone; the PV is Released".into();
                    }
                    Err(e) => return Err(format!("updating claim {}: {e}", row.claim)),
                }
            }
            Ok(Some(_)) => {
                detail = "the claim was replaced by another object; the PV is Released".into();
            }
            Ok(None) => detail = "the claim is gone; the PV is Released".into(),
            Err(e) => return Err(format!("reading claim {}: {e}", row.claim)),
        }
        crashpoint::hit("migrate-after-claim-update");
    }

    let records: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.record_namespace);
    records
        .patch(
            &record_name(name),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {KEY_STATE: STATE_DONE}})),
        )
        .await
        .map_err(|e| format!("marking the migration record done: {e}"))?;

    if let Some((claims, claim)) = &claim_api
        && detail == "no claim"
    {
        detail = wait_claim_bound(claims, claim, legacy, name, ctx.wait).await;
    }
    row.detail = detail;
    Ok(row)
}

/// Waits for the claim to be Bound to `pv` with its old uid; says how it ended.
async fn wait_claim_bound(
    claims: &Api<PersistentVolumeClaim>,
    claim: &str,
    legacy: &Legacy,
    pv: &str,
    timeout: Duration,
) -> String {
    let end = Instant::now() + timeout;
    loop {
        let last = match claims.get_opt(claim).await {
            Ok(Some(c)) => {
                let phase = c
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                let same = c.metadata.uid == legacy.claim_uid
                    && c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(pv);
                if !same {
                    return "the claim was replaced by another object; the PV is Released".into();
                }
                if phase == "Bound" {
                    return "claim Bound".into();
                }
                phase
            }
            Ok(None) => return "the claim is gone; the PV is Released".into(),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= end {
            return format!(
                "claim not Bound yet after {timeout:?} ({last}); kube-controller-manager binds it \
                 on its next sync"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
