//! `rbd-provisioner migrate`: in-tree `rbd` PVs and PVs of ceph-csi's RBD driver become CSI PVs
//! of our driver, in place.
//!
//! Replaces PVs with an in-tree `spec.rbd` source (the old `ceph.com/rbd` provisioner's, or an
//! admin's), and PVs of `rbd.csi.ceph.com` (`--from-driver`), by PVs of our CSI driver with the
//! same name, the same image and the same `claimRef`, without touching the data. ceph-csi's
//! journal and image metadata are left as they are. See docs/migration.md.
//!
//! Per PV, after the checks ([`plan`] and the I/O ones in [`apply`]):
//!
//! 1. the image gets our owner record (PV, claim, provisioner) if it has none;
//! 2. the original PV is recorded in a ConfigMap `rbd-migrate-<pv>` (`--record-namespace`);
//! 3. its reclaim policy is set to `Retain`;
//! 4. it is deleted (precondition: its uid), then its `kubernetes.io/pv-protection` finalizer
//!    (and our provisioner's) is removed: no pod uses the claim, and the image stays;
//! 5. the CSI PV is created (policy `Retain`), then its policy restored from the record;
//! 6. the claim is annotated (an update makes kube-controller-manager bind it again at once),
//!    the record marked `done`, and the claim awaited `Bound`.
//!
//! Killed anywhere, the next run reads the PV and the record and goes on from there; a PV that
//! is migrated is left alone. Nothing here removes an image.
//!
//! ceph-csi's VolumeSnapshotContents are taken over in place ([`snapshots`]), and its
//! StorageClasses and VolumeSnapshotClasses are printed translated ([`classes`]).

pub mod apply;
pub mod classes;
pub mod encrypted;
pub mod plan;
pub mod snapshots;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

use crate::cli::KubeArgs;

#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("selection").required(true).args(["all", "pv", "storage_class", "snapshot_content"])))]
pub struct MigrateArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Every PV with an in-tree rbd source or of ceph-csi's driver (and every migration left
    /// unfinished), and every VolumeSnapshotContent of ceph-csi's driver.
    #[arg(long)]
    pub all: bool,
    /// These PVs (repeatable).
    #[arg(long, value_name = "NAME", num_args = 1..)]
    pub pv: Vec<String>,
    /// PVs of these StorageClasses (repeatable).
    #[arg(long, value_name = "NAME", num_args = 1..)]
    pub storage_class: Vec<String>,
    /// These VolumeSnapshotContents of ceph-csi's driver (repeatable).
    #[arg(long, value_name = "NAME", num_args = 1..)]
    pub snapshot_content: Vec<String>,
    /// Check and print the new PVs and every refusal; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Report format.
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    pub output: Output,
    /// CSI driver the new PVs name (its CSIDriver object must exist).
    #[arg(long, default_value = rbd_csi::DEFAULT_DRIVER_NAME)]
    pub csi_driver_name: String,
    /// Provisioner name (the owner record's provisioner when the PV has no
    /// rbdProvisionerIdentity annotation, unless --id is given).
    #[arg(long, env = "PROVISIONER_NAME", default_value = "ceph.com/rbd")]
    pub provisioner_name: String,
    /// Provisioner identity for owner records of PVs without rbdProvisionerIdentity.
    #[arg(long)]
    pub id: Option<String>,
    /// ceph-csi's RBD driver name: its PVs are migrated too.
    #[arg(long, default_value = rbd_volume::ceph_csi::DRIVER)]
    pub from_driver: String,
    /// Cluster config (ceph-csi's `config.json`) naming the cluster IDs of ceph-csi's volume
    /// handles. Default: /etc/ceph-csi-config/config.json if that file exists.
    #[arg(long, env = "CLUSTER_CONFIG")]
    pub cluster_config: Option<std::path::PathBuf>,
    /// KMS configuration (ceph-csi's `config.json` of the ConfigMap
    /// `ceph-csi-encryption-kms-config`): the entries that open the keys of ceph-csi's encrypted
    /// volumes and snapshots, as the node plugin will.
    #[arg(long, env = "KMS_CONFIG", default_value = rbd_volume::encryption::DEFAULT_KMS_CONFIG)]
    pub kms_config: std::path::PathBuf,
    /// Namespace of the ConfigMaps recording each original PV.
    #[arg(long, default_value = "kube-system")]
    pub record_namespace: String,
    /// Bound for each Ceph operation.
    #[arg(long, default_value = "10s", value_parser = crate::cli::duration::parse)]
    pub command_timeout: Duration,
    /// How long to wait for the old PV object to go and for the claim to be Bound again.
    #[arg(long, default_value = "60s", value_parser = crate::cli::duration::parse)]
    pub wait: Duration,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

/// What happened to one PV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Migrated,
    WouldMigrate,
    AlreadyMigrated,
    Refused,
    Failed,
}

impl Outcome {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Migrated => "migrated",
            Outcome::WouldMigrate => "would-migrate",
            Outcome::AlreadyMigrated => "already-migrated",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }

    /// Whether the run fails because of this PV.
    #[must_use]
    pub fn is_error(self) -> bool {
        matches!(self, Outcome::Refused | Outcome::Failed)
    }
}

/// One line of the report.
#[derive(Clone, Debug)]
pub struct Row {
    pub pv: String,
    /// `namespace/name`, or empty.
    pub claim: String,
    /// `pool/image`, or empty when unknown.
    pub image: String,
    pub outcome: Outcome,
    pub detail: String,
    /// The new PV (dry run: what would be created).
    pub new_pv: Option<PersistentVolume>,
    /// What a taken-over VolumeSnapshotContent's fields would become (dry run).
    pub new_object: Option<Value>,
}

impl Row {
    fn new(pv: &str, outcome: Outcome, detail: impl Into<String>) -> Row {
        Row {
            pv: pv.to_string(),
            claim: String::new(),
            image: String::new(),
            outcome,
            detail: detail.into(),
            new_pv: None,
            new_object: None,
        }
    }
}

/// The name of the ConfigMap recording PV `pv`.
#[must_use]
pub fn record_name(pv: &str) -> String {
    format!("rbd-migrate-{pv}")
}

/// The PV names a run works on: the ones named, or those with an rbd source or of ceph-csi's
/// driver `from_driver` (of the classes), plus unfinished migrations (from their records) for
/// `--all` and `--storage-class`.
#[must_use]
pub fn select(
    args_pv: &[String],
    all: bool,
    classes: &[String],
    from_driver: &str,
    volumes: &[PersistentVolume],
    unfinished: &[PersistentVolume],
) -> Vec<String> {
    if !args_pv.is_empty() {
        let mut seen = BTreeSet::new();
        return args_pv
            .iter()
            .filter(|n| seen.insert((*n).clone()))
            .cloned()
            .collect();
    }
    let wanted = |pv: &PersistentVolume| {
        all || pv
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_ref())
            .is_some_and(|c| classes.contains(c))
    };
    let legacy = volumes.iter().filter(|pv| {
        pv.spec.as_ref().is_some_and(|s| {
            s.rbd.is_some() || s.csi.as_ref().is_some_and(|c| c.driver == from_driver)
        })
    });
    legacy
        .chain(unfinished.iter())
        .filter(|pv| wanted(pv))
        .filter_map(|pv| pv.metadata.name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The report as a table (stdout), the dry run's new PVs first.
#[must_use]
pub fn render_table(rows: &[Row], dry_run: bool) -> String {
    let mut out = String::new();
    if dry_run {
        for row in rows {
            if let Some(pv) = &row.new_pv {
                let text = serde_json::to_string_pretty(pv).unwrap_or_default();
                out.push_str(&format!("# PV {} would become:\n{text}\n", row.pv));
            }
        }
    }
    out.push_str(&table(["PV", "CLAIM", "IMAGE", "RESULT", "DETAIL"], rows));
    if rows.is_empty() {
        out.push_str("(no PV with an rbd source selected: nothing to do)\n");
    }
    out
}

/// The VolumeSnapshotContents' part of the report as a table, the dry run's changes first.
#[must_use]
pub fn render_contents_table(rows: &[Row], dry_run: bool) -> String {
    let mut out = String::new();
    if dry_run {
        for row in rows {
            if let Some(change) = &row.new_object {
                let text = serde_json::to_string_pretty(change).unwrap_or_default();
                out.push_str(&format!(
                    "# VolumeSnapshotContent {} would get:\n{text}\n",
                    row.pv
                ));
            }
        }
    }
    out.push_str(&table(
        [
            "VOLUMESNAPSHOTCONTENT",
            "SNAPSHOT",
            "IMAGE",
            "RESULT",
            "DETAIL",
        ],
        rows,
    ));
    out
}

fn table(header: [&str; 5], rows: &[Row]) -> String {
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.pv.clone(),
                dash(&r.claim),
                dash(&r.image),
                r.outcome.as_str().to_string(),
                r.detail.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row.iter()).take(4) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cols: [&str; 5]| {
        let mut l = String::new();
        for (i, c) in cols.iter().enumerate() {
            if i < 4 {
                l.push_str(&format!("{c:<w$}  ", w = widths[i]));
            } else {
                l.push_str(c);
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut out = line(header);
    for row in &cells {
        out.push_str(&line([&row[0], &row[1], &row[2], &row[3], &row[4]]));
    }
    out
}

fn dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

/// The report as JSON: the PVs' rows under `volumes`, the contents' under `snapshotContents`,
/// the translated classes under `classes`.
#[must_use]
pub fn render_json(
    rows: &[Row],
    content_rows: &[Row],
    translated: &[classes::Translated],
    dry_run: bool,
) -> Value {
    json!({
        "dryRun": dry_run,
        "snapshotContents": content_rows.iter().map(|r| {
            let mut v = json!({
                "content": r.pv,
                "snapshot": r.claim,
                "image": r.image,
                "result": r.outcome.as_str(),
                "detail": r.detail,
            });
            if let Some(change) = &r.new_object {
                v["change"] = change.clone();
            }
            v
        }).collect::<Vec<_>>(),
        "classes": classes::to_json(translated),
        "volumes": rows.iter().map(|r| {
            let mut v = json!({
                "pv": r.pv,
                "claim": r.claim,
                "image": r.image,
                "result": r.outcome.as_str(),
                "detail": r.detail,
            });
            if let Some(pv) = &r.new_pv {
                v["newPV"] = serde_json::to_value(pv).unwrap_or(Value::Null);
            }
            v
        }).collect::<Vec<_>>(),
    })
}

/// Runs the subcommand: prints the report, fails when any selected PV was refused or failed.
pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    let client = crate::cli::kube_client::client(&args.kube).await?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let all_volumes = volumes
        .list(&ListParams::default())
        .await
        .context("listing PersistentVolumes")?
        .items;
    let records: Api<ConfigMap> = Api::namespaced(client.clone(), &args.record_namespace);
    let unfinished: Vec<PersistentVolume> = if args.pv.is_empty() {
        records
            .list(&ListParams::default().labels(apply::RECORD_LABEL_SELECTOR))
            .await
            .with_context(|| format!("listing migration records in {}", args.record_namespace))?
            .items
            .iter()
            .filter(|cm| apply::record_state(cm) != Some(apply::STATE_DONE))
            .filter_map(apply::recorded_pv)
            .collect()
    } else {
        Vec::new()
    };
    let names = select(
        &args.pv,
        args.all,
        &args.storage_class,
        &args.from_driver,
        &all_volumes,
        &unfinished,
    );
    let cluster_config = match &args.cluster_config {
        Some(path) => Some(path.clone()),
        None => {
            let default = std::path::Path::new(rbd_volume::clusters::DEFAULT_PATH);
            default.exists().then(|| default.to_path_buf())
        }
    }
    .map(|path| {
        rbd_volume::ClusterConfigFile::open(&path)
            .map(std::sync::Arc::new)
            .map_err(|e| anyhow::anyhow!("--cluster-config: {e}"))
    })
    .transpose()?;
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    let driver_present = drivers
        .get_opt(&args.csi_driver_name)
        .await
        .context("reading CSIDriver objects")?
        .is_some();
    let kube_cluster = crate::cli::kube_client::kube_cluster_id(&client, &args.kube).await?;
    let ctx = apply::Context {
        client,
        kube_cluster,
        driver: args.csi_driver_name.clone(),
        identity: args.id.clone().unwrap_or(args.provisioner_name.clone()),
        record_namespace: args.record_namespace.clone(),
        dry_run: args.dry_run,
        command_timeout: args.command_timeout,
        wait: args.wait,
        driver_present,
        ceph: ceph_rbd::ConnectionPool::default(),
        from_driver: args.from_driver.clone(),
        provisioner_name: args.provisioner_name.clone(),
        cluster_config,
        kms_config: args.kms_config.clone(),
    };
    let mut rows = Vec::new();
    for name in &names {
        let row = apply::migrate_one(&ctx, name).await;
        tracing::info!(
            pv = %row.pv,
            result = row.outcome.as_str(),
            detail = %row.detail,
            "migrate"
        );
        rows.push(row);
    }
    let content_names = snapshots::select(&ctx, &args.snapshot_content, args.all)
        .await
        .map_err(anyhow::Error::msg)?;
    let mut content_rows = Vec::new();
    for name in &content_names {
        let row = snapshots::migrate_content(&ctx, name).await;
        tracing::info!(
            content = %row.pv,
            result = row.outcome.as_str(),
            detail = %row.detail,
            "migrate"
        );
        content_rows.push(row);
    }
    let translated = translate_classes(&ctx, &args, &all_volumes, &names, &content_names).await?;
    match args.output {
        Output::Table => {
            print!("{}", render_table(&rows, args.dry_run));
            if !content_rows.is_empty() {
                print!("{}", render_contents_table(&content_rows, args.dry_run));
            }
            print!("{}", classes::render(&translated));
        }
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&render_json(
                &rows,
                &content_rows,
                &translated,
                args.dry_run
            ))?
        ),
    }
    let bad = rows.iter().filter(|r| r.outcome.is_error()).count();
    let bad_contents = content_rows.iter().filter(|r| r.outcome.is_error()).count();
    anyhow::ensure!(
        bad == 0 && bad_contents == 0,
        "{bad} of {} selected PV(s) and {bad_contents} of {} VolumeSnapshotContent(s) were \
         refused or failed (see the report)",
        rows.len(),
        content_rows.len()
    );
    Ok(())
}

/// ceph-csi's classes the run concerns, translated: the StorageClasses of `from_driver` that
/// are selected (`--all`, `--storage-class`) or hold a selected PV, and its
/// VolumeSnapshotClasses for `--all` or of the selected contents.
async fn translate_classes(
    ctx: &apply::Context,
    args: &MigrateArgs,
    volumes: &[PersistentVolume],
    names: &[String],
    content_names: &[String],
) -> anyhow::Result<Vec<classes::Translated>> {
    let mut out = Vec::new();
    let used: BTreeSet<&str> = volumes
        .iter()
        .filter(|pv| pv.metadata.name.as_ref().is_some_and(|n| names.contains(n)))
        .filter_map(|pv| pv.spec.as_ref()?.storage_class_name.as_deref())
        .collect();
    let storage_classes: Api<k8s_openapi::api::storage::v1::StorageClass> =
        Api::all(ctx.client.clone());
    let list = storage_classes
        .list(&ListParams::default())
        .await
        .context("listing StorageClasses")?;
    for class in list
        .items
        .iter()
        .filter(|c| c.provisioner == args.from_driver)
    {
        let name = class.metadata.name.as_deref().unwrap_or_default();
        if !(args.all || args.storage_class.iter().any(|c| c == name) || used.contains(name)) {
            continue;
        }
        let users = class_users(ctx, class).await;
        out.push(classes::storage_class(
            class,
            &args.provisioner_name,
            &users,
        ));
    }
    if !args.all && content_names.is_empty() {
        return Ok(out);
    }
    let snapshot_classes: Api<provisioner::snapshot::VolumeSnapshotClass> =
        Api::all(ctx.client.clone());
    let list = match snapshot_classes.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(anyhow::anyhow!("listing VolumeSnapshotClasses: {e}")),
    };
    for class in list.iter().filter(|c| c.driver == args.from_driver) {
        out.push(classes::snapshot_class(class, &args.csi_driver_name));
    }
    Ok(out)
}

/// The Ceph users in the secrets a ceph-csi class names (ceph-csi reads `userID` there; our
/// class names it). Unknown when a secret cannot be read.
async fn class_users(
    ctx: &apply::Context,
    class: &k8s_openapi::api::storage::v1::StorageClass,
) -> classes::SecretUsers {
    let params = class.parameters.clone().unwrap_or_default();
    let secret = |prefix: &str| {
        Some(plan::SecretName {
            name: params.get(&format!("{prefix}-name"))?.clone(),
            namespace: params.get(&format!("{prefix}-namespace"))?.clone(),
        })
    };
    let mut users = classes::SecretUsers::default();
    if let Some(s) = secret("csi.storage.k8s.io/provisioner-secret") {
        users.admin = apply::ceph_csi_credentials(ctx, &s)
            .await
            .ok()
            .map(|(u, _)| u);
    }
    if let Some(s) = secret("csi.storage.k8s.io/node-stage-secret") {
        users.node = apply::ceph_csi_credentials(ctx, &s)
            .await
            .ok()
            .map(|(u, _)| u);
    }
    users
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(name: &str, class: &str, rbd: bool) -> PersistentVolume {
        let mut v = json!({"metadata": {"name": name}, "spec": {"storageClassName": class}});
        if rbd {
            v["spec"]["rbd"] = json!({"monitors": ["m:6789"], "image": "i"});
        } else {
            v["spec"]["csi"] = json!({"driver": "d", "volumeHandle": "h"});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn selection_takes_rbd_pvs_of_the_classes_and_unfinished_ones() {
        let volumes = [
            pv("a", "old", true),
            pv("b", "new", true),
            pv("c", "old", false),
        ];
        let unfinished = [pv("d", "old", true), pv("a", "old", true)];
        assert_eq!(
            select(&[], true, &[], "other", &volumes, &unfinished),
            ["a", "b", "d"]
        );
        assert_eq!(
            select(&[], false, &["old".into()], "other", &volumes, &unfinished),
            ["a", "d"]
        );
        // PVs of ceph-csi's driver ("d" here) are selected too
        assert_eq!(
            select(&[], true, &[], "d", &volumes, &unfinished),
            ["a", "b", "c", "d"]
        );
        assert_eq!(
            select(
                &["c".into(), "x".into(), "c".into()],
                false,
                &[],
                "other",
                &volumes,
                &[]
            ),
            ["c", "x"]
        );
    }

    fn parse(args: &[&str]) -> Result<MigrateArgs, String> {
        use clap::Parser;
        let argv = std::iter::once("rbd-provisioner")
            .chain(std::iter::once("migrate"))
            .chain(args.iter().copied());
        match crate::cli::Cli::try_parse_from(argv) {
            Ok(crate::cli::Cli {
                command: Some(crate::cli::Command::Migrate(a)),
                ..
            }) => Ok(a),
            Ok(_) => Err("not migrate".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn the_command_line_needs_a_selection() {
        let a = parse(&["--all", "--dry-run", "-o", "json"]).unwrap();
        assert!(a.all && a.dry_run && a.output == Output::Json);
        assert_eq!(a.record_namespace, "kube-system");
        assert_eq!(a.csi_driver_name, rbd_csi::DEFAULT_DRIVER_NAME);
        let a = parse(&["--pv", "a", "--pv", "b", "--kubeconfig", "/k"]).unwrap();
        assert_eq!(a.pv, ["a", "b"]);
        assert_eq!(
            a.kube.kubeconfig.as_deref(),
            Some(std::path::Path::new("/k"))
        );
        let e = parse(&["--dry-run"]).unwrap_err();
        assert!(e.contains("--all") && e.contains("--pv"), "{e}");
        let e = parse(&["--all", "--pv", "a"]).unwrap_err();
        assert!(e.contains("cannot be used with"), "{e}");
    }

    #[test]
    fn the_table_has_a_line_per_pv_and_errors_fail_the_run() {
        let mut refused = Row::new("pvc-2", Outcome::Refused, "secret default/x not found");
        refused.claim = "default/b".into();
        let rows = [Row::new("pvc-1", Outcome::Migrated, "claim Bound"), refused];
        let table = render_table(&rows, false);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].starts_with("PV "));
        assert!(lines[2].contains("default/b") && lines[2].contains("refused"));
        assert!(lines[1].contains("  -  "), "{table}");
        assert!(rows[1].outcome.is_error() && !rows[0].outcome.is_error());
        let j = render_json(&rows, &[], &[], true);
        assert_eq!(j["volumes"][1]["result"], "refused");
        assert_eq!(j["dryRun"], true);
        assert!(render_table(&[], false).contains("nothing to do"));
    }
}
