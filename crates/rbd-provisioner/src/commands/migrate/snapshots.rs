//! VolumeSnapshotContents of ceph-csi's RBD driver become ours, in place.
//!
//! ceph-csi lays a snapshot out as we do: the image `csi-snap-<uuid>`, a clone of a temporary
//! snapshot of its source, with the snapshot `csi-snap-<uuid>@csi-snap-<uuid>` that restores
//! clone. So the snapshot stays where it is; what changes is who serves the content. A content's
//! `spec.source` is immutable, its `spec.driver` and status are not: the content keeps its name,
//! its binding to the VolumeSnapshot and its `spec.source.volumeHandle` (the volume it was taken
//! of, as ceph-csi named it); the snapshot-controller never sees it missing or unready.
//!
//! Per content, after the checks (ready, not being created or deleted, its handle, ceph-csi's
//! journal entry `csi.snap.<uuid>` and the snapshot image agree):
//!
//! 1. the snapshot image gets our snapshot record (request name, source volume, driver), missing
//!    keys only; ceph-csi's journal and metadata are left as they are;
//! 2. the content is annotated with ceph-csi's handle (the way back) and `migrated-from`;
//! 3. its `status.snapshotHandle` becomes our snapshot ID;
//! 4. its `spec.driver` becomes ours.
//!
//! A snapshot of an encrypted volume has, first, its key's salt recorded (see
//! [`super::encrypted`]; crash point `migrate-snapshot-after-key-salt`).
//!
//! Each step is a crash point (`migrate-snapshot-after-owner-record`, `-after-annotations`,
//! `-after-status`); a run killed anywhere is finished by the next one (the handle is then read
//! from the annotation). A pre-provisioned content (`spec.source.snapshotHandle`, immutable)
//! is refused with the handle a new content of ours would name.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use provisioner::snapshot::VolumeSnapshotContent;
use rbd_volume::snapshot::{SnapshotId, SnapshotOwner};
use rbd_volume::{ClusterRef, VolumeId, ceph_csi};
use serde_json::json;

use super::apply::{Context, connect_ceph_csi};
use super::plan::{ANN_MIGRATED_FROM, SecretName};
use super::{Outcome, Row};
use crate::cli::crashpoint;

/// Annotation on a content taken over from ceph-csi: its ceph-csi snapshot handle.
pub const ANN_CEPH_CSI_SNAPSHOT_HANDLE: &str = "provisioner.ceph.com/ceph-csi-snapshot-handle";
/// The csi-snapshotter's mark of a CreateSnapshot call without an answer yet.
const ANN_BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";
/// The snapshot-controller's copy of the class's snapshotter secret.
const ANN_SECRET_NAME: &str = "snapshot.storage.kubernetes.io/deletion-secret-name";
const ANN_SECRET_NAMESPACE: &str = "snapshot.storage.kubernetes.io/deletion-secret-namespace";

fn contents(ctx: &Context) -> Api<VolumeSnapshotContent> {
    Api::all(ctx.client.clone())
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// The contents a run takes: the ones named, or (`all`) every content of `from_driver`. Without
/// the snapshot CRDs there are none.
///
/// # Errors
/// The API's, but a missing CRD.
pub async fn select(ctx: &Context, names: &[String], all: bool) -> Result<Vec<String>, String> {
    if !names.is_empty() {
        let mut seen = std::collections::BTreeSet::new();
        return Ok(names
            .iter()
            .filter(|n| seen.insert((*n).clone()))
            .cloned()
            .collect());
    }
    if !all {
        return Ok(Vec::new());
    }
    match contents(ctx).list(&ListParams::default()).await {
        Ok(list) => Ok(list
            .items
            .into_iter()
            .filter(|c| c.spec.driver == ctx.from_driver)
            .filter_map(|c| c.metadata.name)
            .collect()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(format!("listing VolumeSnapshotContents: {e}")),
    }
}

/// Takes over (or checks, in a dry run) content `name`; never panics, never removes anything.
pub async fn migrate_content(ctx: &Context, name: &str) -> Row {
    match inner(ctx, name).await {
        Ok(row) => row,
        Err(e) => Row::new(name, Outcome::Failed, e),
    }
}

async fn inner(ctx: &Context, name: &str) -> Result<Row, String> {
    let Some(content) = contents(ctx)
        .get_opt(name)
        .await
        .map_err(|e| format!("reading VolumeSnapshotContent {name}: {e}"))?
    else {
        return Ok(Row::new(
            name,
            Outcome::Refused,
            "no VolumeSnapshotContent with this name",
        ));
    };
    let mut row = Row::new(name, Outcome::WouldMigrate, "");
    let r = &content.spec.volume_snapshot_ref;
    if let (Some(ns), Some(vs)) = (&r.namespace, &r.name) {
        row.claim = format!("{ns}/{vs}");
    }
    let refuse = |row: &Row, why: String| Row {
        outcome: Outcome::Refused,
        detail: why,
        ..row.clone()
    };
    let status_handle = content.status_handle().map(str::to_owned);
    let taken = annotation(&content.metadata, ANN_CEPH_CSI_SNAPSHOT_HANDLE).map(str::to_owned);
    if content.spec.driver == ctx.driver && taken.is_some() {
        let mut done = row.clone();
        done.outcome = Outcome::AlreadyMigrated;
        done.detail = format!(
            "snapshot handle {}",
            status_handle.as_deref().unwrap_or("-")
        );
        return Ok(done);
    }
    if content.spec.driver != ctx.from_driver {
        return Ok(refuse(
            &row,
            format!(
                "spec.driver is {:?}, not ceph-csi's {:?}",
                content.spec.driver, ctx.from_driver
            ),
        ));
    }
    if content.metadata.deletion_timestamp.is_some() {
        return Ok(refuse(
            &row,
            "the content is being deleted: ceph-csi finishes that".into(),
        ));
    }
    if annotation(&content.metadata, ANN_BEING_CREATED).is_some() {
        return Ok(refuse(
            &row,
            format!(
                "ceph-csi is still creating the snapshot ({ANN_BEING_CREATED}): run again once it \
                 is ready"
            ),
        ));
    }
    let ready = content.status.as_ref().and_then(|s| s.ready_to_use) == Some(true);
    let Some(old_handle) = taken.clone().or_else(|| status_handle.clone()) else {
        return Ok(refuse(
            &row,
            "status.snapshotHandle is empty: the snapshot is not made yet".into(),
        ));
    };
    if !ready {
        return Ok(refuse(
            &row,
            "status.readyToUse is not true: run again once the snapshot is ready".into(),
        ));
    }
    let handle = match ceph_csi::Handle::parse(&old_handle) {
        Ok(h) => h,
        Err(e) => return Ok(refuse(&row, format!("status.snapshotHandle: {e}"))),
    };
    let secret = match (
        annotation(&content.metadata, ANN_SECRET_NAME),
        annotation(&content.metadata, ANN_SECRET_NAMESPACE),
    ) {
        (Some(name), Some(namespace)) => SecretName {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        },
        _ => {
            return Ok(refuse(
                &row,
                format!(
                    "no {ANN_SECRET_NAME}/{ANN_SECRET_NAMESPACE} annotations (the class's \
                     csi.storage.k8s.io/snapshotter-secret-*): nothing could delete the snapshot"
                ),
            ));
        }
    };
    let cluster_id = handle.cluster_id.clone();
    let (cluster, info) = match connect_ceph_csi(
        ctx,
        &cluster_id,
        &secret,
        &format!("the snapshotter secret {secret}"),
    )
    .await?
    {
        Ok(c) => c,
        Err(why) => return Ok(refuse(&row, why)),
    };
    let pool = match cluster.pool_name(handle.pool_id).await {
        Ok(pool) => pool,
        Err(e) if e.is_not_found() => {
            return Ok(refuse(
                &row,
                format!(
                    "no pool has the ID {} of the snapshot handle",
                    handle.pool_id
                ),
            ));
        }
        Err(e) => return Err(format!("looking up pool {}: {e}", handle.pool_id)),
    };
    let namespace = info.rados_namespace.clone().unwrap_or_default();
    let pool_spec = ceph_rbd::pool_spec(&pool, &namespace);
    let Some(entry) = ceph_csi::snapshot_entry(&cluster, &pool_spec, &handle.uuid)
        .await
        .map_err(|e| format!("reading ceph-csi's journal in {pool_spec}: {e}"))?
    else {
        return Ok(refuse(
            &row,
            format!(
                "ceph-csi's journal has no entry {}{} in {pool_spec}",
                ceph_csi::SNAPSHOT_OBJECT_PREFIX,
                handle.uuid
            ),
        ));
    };
    row.image = format!("{pool_spec}/{}", entry.image);
    if !ceph_csi::is_snapshot_image(&entry.image) {
        return Ok(refuse(
            &row,
            format!(
                "snapshot image {}: only ceph-csi's default name csi-snap-<uuid> is taken over \
                 (a class's snapshotNamePrefix is not)",
                entry.image
            ),
        ));
    }
    let (Some(request), Some(source)) = (entry.request.clone(), entry.source.clone()) else {
        return Ok(refuse(
            &row,
            format!(
                "ceph-csi's journal entry {}{} lacks {} or {}",
                ceph_csi::SNAPSHOT_OBJECT_PREFIX,
                handle.uuid,
                ceph_csi::KEY_SNAPSHOT_NAME,
                ceph_csi::KEY_SOURCE
            ),
        ));
    };
    let image = entry.image.clone();
    let snaps = match cluster.snap_list(&pool_spec, &image).await {
        Ok(snaps) => snaps,
        Err(e) if e.is_not_found() => {
            return Ok(refuse(
                &row,
                format!("snapshot image {pool_spec}/{image} does not exist"),
            ));
        }
        Err(e) => return Err(format!("listing the snapshots of {pool_spec}/{image}: {e}")),
    };
    if !snaps.iter().any(|s| s.name == image) {
        return Ok(refuse(
            &row,
            format!("image {pool_spec}/{image} has no snapshot {image}"),
        ));
    }
    let meta = cluster
        .metadata_list(&pool_spec, &image)
        .await
        .map_err(|e| format!("reading metadata of {pool_spec}/{image}: {e}"))?;
    if let Some(existing) = SnapshotOwner::from_metadata(&meta)
        && existing.name != request
    {
        return Ok(refuse(
            &row,
            format!(
                "image {pool_spec}/{image} is recorded as snapshot {:?}, not {request:?}",
                existing.name
            ),
        ));
    }
    let cluster_ref = ClusterRef::Named(cluster_id);
    let source_id = VolumeId::located(cluster_ref.clone(), &pool, &namespace, &source).encode()?;
    let new_handle = SnapshotId::located(cluster_ref, &pool, &namespace, &image).encode()?;
    if content.spec.source.snapshot_handle.is_some() {
        return Ok(refuse(
            &row,
            format!(
                "a pre-provisioned content (spec.source.snapshotHandle is immutable): make a \
                 VolumeSnapshotContent of {} with snapshotHandle {new_handle} instead",
                ctx.driver
            ),
        ));
    }
    // a snapshot of an encrypted volume: its image holds the volume's key, wrapped by ceph-csi
    // with the snapshot's ID as the salt; the claim's namespace is ceph-csi's tenant
    let encrypted = match &entry.encrypt_kms {
        None => None,
        Some(kms) => {
            match super::encrypted::check(
                ctx,
                &cluster,
                (&pool_spec, &image),
                (kms, None),
                &old_handle,
                r.namespace.as_deref(),
            )
            .await?
            {
                Ok(encrypted) => Some(encrypted),
                Err(why) => return Ok(refuse(&row, why)),
            }
        }
    };
    if ctx.dry_run {
        row.detail = "checks passed".into();
        row.new_object = Some(json!({
            "spec": {"driver": ctx.driver},
            "status": {"snapshotHandle": new_handle},
        }));
        return Ok(row);
    }

    // 1. our snapshot record beside ceph-csi's metadata
    let owner = SnapshotOwner {
        name: request,
        source: source_id,
        driver: ctx.driver.clone(),
        kube_cluster: ctx.kube_cluster.clone(),
    };
    let mut entries = owner.entries();
    if let Some(encrypted) = &encrypted {
        super::encrypted::take_over_key(
            &cluster,
            (&pool_spec, &image),
            encrypted,
            &old_handle,
            &new_handle,
        )
        .await?;
        crashpoint::hit("migrate-snapshot-after-key-salt");
        entries.extend(encrypted.entries());
    }
    super::apply::record_entries(&cluster, &pool_spec, &image, &meta, &entries).await?;
    crashpoint::hit("migrate-snapshot-after-owner-record");
    // 2. the way back, on the content
    let api = contents(ctx);
    if taken.is_none() {
        let annotations: BTreeMap<&str, &str> = [
            (ANN_CEPH_CSI_SNAPSHOT_HANDLE, old_handle.as_str()),
            (ANN_MIGRATED_FROM, ctx.from_driver.as_str()),
        ]
        .into();
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
        )
        .await
        .map_err(|e| format!("annotating VolumeSnapshotContent {name}: {e}"))?;
    }
    crashpoint::hit("migrate-snapshot-after-annotations");
    // 3. our handle
    if status_handle.as_deref() != Some(new_handle.as_str()) {
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"snapshotHandle": new_handle}})),
        )
        .await
        .map_err(|e| format!("writing the status of VolumeSnapshotContent {name}: {e}"))?;
    }
    crashpoint::hit("migrate-snapshot-after-status");
    // 4. our driver
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"driver": ctx.driver}})),
    )
    .await
    .map_err(|e| format!("setting the driver of VolumeSnapshotContent {name}: {e}"))?;
    row.outcome = Outcome::Migrated;
    row.detail = format!("snapshot handle {new_handle}");
    Ok(row)
}
