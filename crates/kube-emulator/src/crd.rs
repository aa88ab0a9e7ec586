//! CustomResourceDefinitions (`apiextensions.k8s.io/v1`) and the custom resources they define,
//! served with the same machinery as the built-in resources (kube-apiserver's
//! `apiextensions-apiserver`, as far as the snapshot CRDs need it).
//!
//! - A CRD object lives in the store like any other. Every store write of one updates the
//!   [`Registry`] (under the store lock), which `parse_target` and discovery consult after the
//!   built-in table: the served versions become resources at once (the emulator sets
//!   `NamesAccepted` and `Established` on create instead of running the naming and establishing
//!   controllers).
//! - A served version is a leaked, interned [`ResourceInfo`] whose `custom` carries that
//!   version's schema and printer columns. All versions of a CRD share one storage key
//!   (`plural.group`); objects are shown with the requested `apiVersion` (conversion strategy
//!   `None`).
//! - Bodies are pruned with the structural schema (unknown fields warn, or 400 under
//!   `fieldValidation=Strict`), then validated: types, `required`, `enum`, `minimum`/`maximum`,
//!   `maxLength`, `nullable`, and a subset of CEL `x-kubernetes-validations` (see [`cel`]).
//! - The CRD carries the `customresourcecleanup.apiextensions.k8s.io` finalizer; deleting it
//!   deletes its objects (waiting for their finalizers), then the CRD goes.

pub(crate) mod cel;
mod cleanup;
mod schema;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, RwLock};

use serde_json::{Map, Value, json};

use crate::resources::{ResourceInfo, View};
use crate::status::{ApiError, Cause};
use crate::util::{self, now_time, obj_mut};

pub(crate) use cleanup::ensure_cleanup;
pub(crate) use schema::{decode_custom, validate_custom};

/// Storage key of CRD objects.
pub(crate) const CRDS: &str = "customresourcedefinitions";
/// The annotation CRDs of `*.k8s.io` and `*.kubernetes.io` groups need.
const API_APPROVED: &str = "api-approved.kubernetes.io";
/// The finalizer kube-apiserver puts on every CRD.
pub(crate) const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// One `additionalPrinterColumns` entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Column {
    pub name: String,
    pub ty: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

/// What a served version of a CRD adds to its [`ResourceInfo`].
#[derive(Debug, PartialEq)]
pub(crate) struct Custom {
    /// `metadata.name` of the CRD.
    pub crd_name: String,
    /// `openAPIV3Schema` of this version (`Null` when absent).
    pub schema: Value,
    pub columns: Vec<Column>,
    /// The version objects are stored as.
    pub storage_version: String,
    /// `deprecationWarning` (or the default text) for a deprecated version.
    pub deprecation: Option<String>,
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn leak_list(items: &[String]) -> &'static [&'static str] {
    Box::leak(
        items
            .iter()
            .map(|s| leak(s))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    )
}

/// Interned resource descriptions: a CRD recreated with the same definition (as every test
/// does) reuses its leaked entries, so memory grows only with distinct definitions.
static INTERNED: Mutex<Vec<&'static ResourceInfo>> = Mutex::new(Vec::new());

#[derive(PartialEq)]
struct Described {
    group: String,
    version: String,
    plural: String,
    singular: String,
    kind: String,
    namespaced: bool,
    short_names: Vec<String>,
    categories: Vec<String>,
    has_status: bool,
    storage: String,
    custom: Custom,
}

fn intern(d: Described) -> &'static ResourceInfo {
    let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
    let same = |r: &ResourceInfo| {
        r.group == d.group
            && r.version == d.version
            && r.plural == d.plural
            && r.singular == d.singular
            && r.kind == d.kind
            && r.namespaced == d.namespaced
            && r.short_names.iter().eq(d.short_names.iter())
            && r.categories.iter().eq(d.categories.iter())
            && r.has_status == d.has_status
            && r.storage == d.storage
            && r.custom == Some(&d.custom)
    };
    if let Some(r) = interned.iter().find(|r| same(r)) {
        return r;
    }
    let info: &'static ResourceInfo = Box::leak(Box::new(ResourceInfo {
        group: leak(&d.group),
        version: leak(&d.version),
        plural: leak(&d.plural),
        singular: leak(&d.singular),
        kind: leak(&d.kind),
        namespaced: d.namespaced,
        short_names: leak_list(&d.short_names),
        categories: leak_list(&d.categories),
        has_status: d.has_status,
        storage: leak(&d.storage),
        view: View::Native,
        storage_version_hash: "",
        // customResourceStrategy.AllowUnconditionalUpdate is false.
        allow_unconditional_update: false,
        custom: Some(Box::leak(Box::new(d.custom))),
    }));
    interned.push(info);
    info
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn columns(version: &Value) -> Vec<Column> {
    version
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .map(|cols| {
            cols.iter()
                .map(|c| Column {
                    name: util::str_at(c, "/name").unwrap_or_default().to_string(),
                    ty: util::str_at(c, "/type").unwrap_or("string").to_string(),
                    format: util::str_at(c, "/format").unwrap_or_default().to_string(),
                    description: util::str_at(c, "/description")
                        .unwrap_or_default()
                        .to_string(),
                    priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    json_path: util::str_at(c, "/jsonPath").unwrap_or_default().to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The served resources of a stored CRD, one per served version, in spec order.
fn served_resources(crd: &Value) -> Vec<&'static ResourceInfo> {
    let spec = crd.get("spec").cloned().unwrap_or(Value::Null);
    let group = util::str_at(&spec, "/group").unwrap_or_default();
    let names = spec.get("names").cloned().unwrap_or(Value::Null);
    let plural = util::str_at(&names, "/plural").unwrap_or_default();
    let kind = util::str_at(&names, "/kind").unwrap_or_default();
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return Vec::new();
    }
    let singular = util::str_at(&names, "/singular")
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let namespaced = util::str_at(&spec, "/scope") != Some("Cluster");
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let storage_version = versions
        .iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .and_then(|v| util::str_at(v, "/name"))
        .unwrap_or_default()
        .to_string();
    versions
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool) == Some(true))
        .map(|v| {
            let version = util::str_at(v, "/name").unwrap_or_default().to_string();
            let deprecation =
                (v.get("deprecated").and_then(Value::as_bool) == Some(true)).then(|| {
                    util::str_at(v, "/deprecationWarning")
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("{group}/{version} {kind} is deprecated"))
                });
            intern(Described {
                group: group.to_string(),
                version,
                plural: plural.to_string(),
                singular: singular.clone(),
                kind: kind.to_string(),
                namespaced,
                short_names: strings(names.get("shortNames")),
                categories: strings(names.get("categories")),
                has_status: v.pointer("/subresources/status").is_some(),
                storage: format!("{plural}.{group}"),
                custom: Custom {
                    crd_name: util::name_of(crd).to_string(),
                    schema: v
                        .pointer("/schema/openAPIV3Schema")
                        .cloned()
                        .unwrap_or(Value::Null),
                    columns: columns(v),
                    storage_version: storage_version.clone(),
                    deprecation,
                },
            })
        })
        .collect()
}

/// `version.CompareKubeAwareVersionStrings` as a sort key (greater is preferred): GA over beta
/// over alpha, then higher major, then higher minor; other strings after all of those, in
/// reverse lexicographic key order so that the ascending ones come first.
fn version_priority(v: &str) -> (u8, u64, u64, std::cmp::Reverse<String>) {
    let kube = v.strip_prefix('v').and_then(|rest| {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let major: u64 = rest[..digits].parse().ok()?;
        let tail = &rest[digits..];
        if tail.is_empty() {
            return Some((3, major, 0));
        }
        let (rank, minor) = if let Some(m) = tail.strip_prefix("beta") {
            (2, m)
        } else {
            (1, tail.strip_prefix("alpha")?)
        };
        Some((rank, major, minor.parse().ok()?))
    });
    match kube {
        Some((rank, major, minor)) => (rank, major, minor, std::cmp::Reverse(String::new())),
        None => (0, 0, 0, std::cmp::Reverse(v.to_string())),
    }
}

/// The resources defined by the CRDs in the store (one registry per emulator).
#[derive(Default)]
pub(crate) struct Registry {
    /// CRD name -> its served resources.
    served: RwLock<HashMap<String, Vec<&'static ResourceInfo>>>,
    /// Whether the cleanup (CRD finalizer) task runs.
    pub cleanup_started: AtomicBool,
}

impl Registry {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Vec<&'static ResourceInfo>>> {
        self.served.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by the store for every write of a CRD (`None`: the CRD `name` is gone).
    pub fn sync(&self, name: &str, crd: Option<&Value>) {
        let mut served = self.served.write().unwrap_or_else(|e| e.into_inner());
        match crd.map(served_resources) {
            Some(list) if !list.is_empty() => {
                served.insert(name.to_string(), list);
            }
            _ => {
                served.remove(name);
            }
        }
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
        self.read()
            .values()
            .flatten()
            .copied()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// All served custom resources, sorted by group, version, plural.
    pub fn all(&self) -> Vec<&'static ResourceInfo> {
        let mut all: Vec<&'static ResourceInfo> = self.read().values().flatten().copied().collect();
        all.sort_by(|a, b| (a.group, a.version, a.plural).cmp(&(b.group, b.version, b.plural)));
        all
    }

    /// The groups of the served custom resources (sorted) with their versions, the preferred
    /// (first-listed) version first.
    pub fn groups(&self) -> Vec<(&'static str, Vec<&'static str>)> {
        let served = self.read();
        let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
        let mut lists: Vec<&Vec<&'static ResourceInfo>> = served.values().collect();
        lists.sort_by_key(|l| l.first().map(|r| (r.group, r.plural)));
        for list in lists {
            for r in list {
                match out.iter_mut().find(|(g, _)| *g == r.group) {
                    Some((_, versions)) => {
                        if !versions.contains(&r.version) {
                            versions.push(r.version);
                        }
                    }
                    None => out.push((r.group, vec![r.version])),
                }
            }
        }
        out.sort_by_key(|(g, _)| *g);
        for (_, versions) in &mut out {
            versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        }
        out
    }

    /// The storage key of a CRD's objects.
    pub fn storage_of(&self, crd_name: &str) -> Option<&'static str> {
        self.read()
            .get(crd_name)
            .and_then(|l| l.first())
            .map(|r| r.storage)
    }

    /// The CRD that defines the objects stored under `storage`.
    pub fn crd_of_storage(&self, storage: &str) -> Option<String> {
        self.read()
            .iter()
            .find(|(_, l)| l.first().is_some_and(|r| r.storage == storage))
            .map(|(name, _)| name.clone())
    }

    /// The storage keys of every custom resource (for namespace deletion).
    pub fn storages(&self) -> Vec<(&'static str, bool)> {
        let mut out: Vec<(&'static str, bool)> = self
            .read()
            .values()
            .filter_map(|l| l.first().map(|r| (r.storage, r.namespaced)))
            .collect();
        out.sort();
        out
    }
}

// ---- CustomResourceDefinition admission ----

fn condition(ty: &str, reason: &str, message: &str, old: Option<&Value>) -> Value {
    let since = old
        .and_then(|o| o.pointer("/status/conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter().find(|c| {
                util::str_at(c, "/type") == Some(ty) && util::str_at(c, "/status") == Some("True")
            })
        })
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(now_time()));
    json!({"type": ty, "status": "True", "lastTransitionTime": since, "reason": reason, "message": message})
}

/// Scheme defaults of a CRD (run on every write).
fn default_crd(obj: &mut Value) {
    if let Some(names) = obj
        .pointer_mut("/spec/names")
        .and_then(Value::as_object_mut)
    {
        let kind = names
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if !kind.is_empty() {
            names
                .entry("listKind")
                .or_insert_with(|| json!(format!("{kind}List")));
            names
                .entry("singular")
                .or_insert_with(|| json!(kind.to_lowercase()));
        }
    }
    if let Some(spec) = obj_mut(obj, "spec") {
        spec.entry("conversion")
            .or_insert_with(|| json!({"strategy": "None"}));
    }
}

/// The status kube-apiserver's naming and establishing controllers converge to for a CRD
/// without name conflicts; `storedVersions` only grows.
fn crd_status(obj: &Value, old: Option<&Value>) -> Value {
    let names = obj.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let mut stored = old
        .map(|o| strings(o.pointer("/status/storedVersions")))
        .unwrap_or_default();
    if let Some(v) = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        })
        .and_then(|v| util::str_at(v, "/name"))
        && !stored.iter().any(|s| s == v)
    {
        stored.push(v.to_string());
    }
    let mut conditions = vec![
        condition("NamesAccepted", "NoConflicts", "no conflicts found", old),
        condition(
            "Established",
            "InitialNamesAccepted",
            "the initial names have been accepted",
            old,
        ),
    ];
    if util::is_terminating(obj) {
        conditions.push(condition(
            "Terminating",
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress",
            old,
        ));
    }
    json!({"conditions": conditions, "acceptedNames": names, "storedVersions": stored})
}

/// Create-time admission of a CRD: the cleanup finalizer, defaults, generation, status.
pub(crate) fn on_create_crd(obj: &mut Value) {
    let mut fins = util::finalizers(obj);
    if !fins.iter().any(|f| f == CLEANUP_FINALIZER) {
        fins.push(CLEANUP_FINALIZER.to_string());
        util::set_finalizers(obj, fins);
    }
    default_crd(obj);
    if let Some(meta) = obj_mut(obj, "metadata") {
        meta.insert("generation".into(), json!(1));
    }
    let status = crd_status(obj, None);
    if let Some(m) = obj.as_object_mut() {
        m.insert("status".into(), status);
    }
}

/// Update-time normalisation of a CRD (defaults, status kept converged).
pub(crate) fn on_update_crd(old: &Value, next: &mut Value) {
    default_crd(next);
    let status = crd_status(next, Some(old));
    if let Some(m) = next.as_object_mut() {
        m.insert("status".into(), status);
    }
}

fn crd_invalid(obj: &Value, causes: Vec<Cause>) -> Result<(), ApiError> {
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid_with(
        "CustomResourceDefinition.apiextensions.k8s.io",
        util::name_of(obj),
        None,
        "CustomResourceDefinition",
        causes,
    )
    .with_group("apiextensions.k8s.io"))
}

/// The CRD validation that matters for serving it (a subset of `ValidateCustomResourceDefinition`).
pub(crate) fn validate_crd(obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    let group = util::str_at(obj, "/spec/group").unwrap_or_default();
    let plural = util::str_at(obj, "/spec/names/plural").unwrap_or_default();
    let kind = util::str_at(obj, "/spec/names/kind").unwrap_or_default();
    if group.is_empty() {
        causes.push(Cause::required("spec.group", ""));
    } else if !group.contains('.') {
        causes.push(Cause::invalid(
            "spec.group",
            &format!("\"{group}\""),
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::required("spec.names.plural", ""));
    }
    if kind.is_empty() {
        causes.push(Cause::required("spec.names.kind", ""));
    }
    let name = util::name_of(obj);
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            &format!("\"{name}\""),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    match util::str_at(obj, "/spec/scope") {
        Some("Namespaced" | "Cluster") => {}
        None | Some("") => causes.push(Cause::required("spec.scope", "")),
        Some(other) => causes.push(Cause::not_supported(
            "spec.scope",
            other,
            &["Cluster", "Namespaced"],
        )),
    }
    let versions = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::invalid(
            "spec.versions",
            "null",
            "must have exactly one version marked as storage version",
        ));
    } else {
        let storage = versions
            .iter()
            .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .count();
        if storage != 1 {
            causes.push(Cause::invalid(
                "spec.versions",
                &serde_json::to_string(&versions).unwrap_or_default(),
                "must have exactly one version marked as storage version",
            ));
        }
        for (i, v) in versions.iter().enumerate() {
            if v.pointer("/schema/openAPIV3Schema").is_none() {
                causes.push(Cause::required(
                    &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                    "schemas are required",
                ));
            }
        }
    }
    let protected = |g: &str| {
        g == "k8s.io"
            || g.ends_with(".k8s.io")
            || g == "kubernetes.io"
            || g.ends_with(".kubernetes.io")
    };
    if protected(group) {
        let field = format!("metadata.annotations[{API_APPROVED}]");
        match util::annotation(obj, API_APPROVED) {
            None => causes.push(Cause::required(
                &field,
                &format!("protected groups must have approval annotation \"{API_APPROVED}\", see https://github.com/kubernetes/enhancements/pull/1111"),
            )),
            Some(v) if !(v.starts_with("unapproved") || v.starts_with("https://") || v.starts_with("http://")) => {
                causes.push(Cause::invalid(
                    &field,
                    &format!("\"{v}\""),
                    &format!("protected groups must have approval annotation \"{API_APPROVED}\" with either a URL or a reason starting with \"unapproved\", see https://github.com/kubernetes/enhancements/pull/1111"),
                ))
            }
            Some(_) => {}
        }
    }
    if let Some(old) = old {
        let old_group = util::str_at(old, "/spec/group").unwrap_or_default();
        if old_group != group {
            causes.push(Cause::invalid(
                "spec.group",
                &format!("\"{group}\""),
                "field is immutable",
            ));
        }
    }
    crd_invalid(obj, causes)
}

// ---- custom resource admission ----

/// Create-time admission of a custom resource: `status` is dropped when the status
/// subresource is on, `generation` starts at 1.
pub(crate) fn on_create_custom(res: &ResourceInfo, obj: &mut Value) {
    if res.has_status
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
    if let Some(meta) = obj_mut(obj, "metadata") {
        meta.insert("generation".into(), json!(1));
    }
}

fn without_meta_and_status(v: &Value, has_status: bool) -> Map<String, Value> {
    let mut m = v.as_object().cloned().unwrap_or_default();
    m.remove("metadata");
    m.remove("apiVersion");
    m.remove("kind");
    if has_status {
        m.remove("status");
    }
    m
}

/// `metadata.generation` after an update: +1 when anything but metadata (and status, when it
/// is a subresource) changed. Applies to custom resources and CRDs.
pub(crate) fn bump_generation(has_status: bool, old: &Value, next: &mut Value) {
    let old_gen = old
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let changed =
        without_meta_and_status(old, has_status) != without_meta_and_status(next, has_status);
    let generation = if changed { old_gen + 1 } else { old_gen };
    if let Some(meta) = obj_mut(next, "metadata") {
        meta.insert("generation".into(), json!(generation));
    }
}

/// Creates are refused while the CRD is being deleted (405, as kube-apiserver answers).
pub(crate) fn check_create_allowed(
    res: &ResourceInfo,
    view: &crate::store::StoreView<'_>,
) -> Result<(), ApiError> {
    let Some(custom) = res.custom else {
        return Ok(());
    };
    if view
        .get(CRDS, "", &custom.crd_name)
        .is_some_and(|crd| util::is_terminating(crd))
    {
        return Err(ApiError {
            details: Some(json!({})),
            ..ApiError::new(
                405,
                "MethodNotAllowed",
                "create not allowed while custom resource definition is terminating",
            )
        });
    }
    Ok(())
}

/// The object as the endpoint's version shows it (conversion strategy `None`).
pub(crate) fn present_custom(res: &ResourceInfo, obj: &Value) -> Value {
    let mut shown = obj.clone();
    let api_version = res.api_version();
    if shown.get("apiVersion").and_then(Value::as_str) != Some(api_version.as_str())
        && let Some(m) = shown.as_object_mut()
    {
        m.insert("apiVersion".into(), json!(api_version));
    }
    shown
}

/// The object as stored (in the storage version).
pub(crate) fn to_storage_custom(res: &ResourceInfo, mut obj: Value) -> Value {
    if let Some(custom) = res.custom
        && custom.storage_version != res.version
        && let Some(m) = obj.as_object_mut()
    {
        m.insert(
            "apiVersion".into(),
            json!(format!("{}/{}", res.group, custom.storage_version)),
        );
    }
    obj
}

/// The 415 kube-apiserver answers to a strategic merge patch of a custom resource (kubectl
/// falls back to a JSON merge patch for types it has no Go struct for).
pub(crate) fn strategic_merge_refused() -> ApiError {
    ApiError {
        details: Some(json!({})),
        ..ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    }
}

/// The `snapshot.storage.k8s.io/v1` CRDs of `deploy/snapshot-crds/` (VolumeSnapshotClass,
/// VolumeSnapshotContent, VolumeSnapshot), as YAML.
pub const SNAPSHOT_CRDS: [&str; 3] = [
    include_str!("../../../deploy/snapshot-crds/volumesnapshotclasses.yaml"),
    include_str!("../../../deploy/snapshot-crds/volumesnapshotcontents.yaml"),
    include_str!("../../../deploy/snapshot-crds/volumesnapshots.yaml"),
];

/// The csi-addons `NetworkFence` CRD of `deploy/csi-addons-crds/`, as YAML.
pub const NETWORK_FENCE_CRD: &str =
    include_str!("../../../deploy/csi-addons-crds/networkfences.yaml");

/// The csi-addons `ReclaimSpaceJob` CRD of `deploy/csi-addons-crds/`, as YAML.
pub const RECLAIM_SPACE_JOB_CRD: &str =
    include_str!("../../../deploy/csi-addons-crds/reclaimspacejobs.yaml");

/// The csi-addons `ReclaimSpaceCronJob` CRD of `deploy/csi-addons-crds/`, as YAML.
pub const RECLAIM_SPACE_CRON_JOB_CRD: &str =
    include_str!("../../../deploy/csi-addons-crds/reclaimspacecronjobs.yaml");

/// The csi-addons `VolumeReplicationClass` CRD of `deploy/csi-addons-crds/`, as YAML.
pub const VOLUME_REPLICATION_CLASS_CRD: &str =
    include_str!("../../../deploy/csi-addons-crds/volumereplicationclasses.yaml");

/// The csi-addons `VolumeReplication` CRD of `deploy/csi-addons-crds/`, as YAML.
pub const VOLUME_REPLICATION_CRD: &str =
    include_str!("../../../deploy/csi-addons-crds/volumereplications.yaml");

/// Every csi-addons CRD of `deploy/csi-addons-crds/`, as YAML.
pub const CSI_ADDONS_CRDS: [&str; 5] = [
    NETWORK_FENCE_CRD,
    RECLAIM_SPACE_JOB_CRD,
    RECLAIM_SPACE_CRON_JOB_CRD,
    VOLUME_REPLICATION_CLASS_CRD,
    VOLUME_REPLICATION_CRD,
];

/// Stores a CRD (YAML) as a create through the API would; an existing one is kept. Must run
/// inside a tokio runtime (it starts the CRD finalizer task).
pub(crate) fn install(
    store: &std::sync::Arc<crate::store::Store>,
    yaml: &str,
) -> Result<(), ApiError> {
    let body: Value = serde_yaml::from_str(yaml)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    let res = crate::resources::find("apiextensions.k8s.io", "v1", CRDS)
        .ok_or_else(|| ApiError::internal("no CRD resource"))?;
    let mut obj = crate::schema::decode(res, body, true)?.object;
    if let Some(meta) = obj_mut(&mut obj, "metadata") {
        meta.remove("resourceVersion");
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(now_time()));
    }
    on_create_crd(&mut obj);
    validate_crd(&obj, None)?;
    let key = (String::new(), util::name_of(&obj).to_string());
    store.write(CRDS, &key, crate::store::Origin::Client, |_, existing| {
        Ok(match existing {
            Some(_) => crate::store::Action::Keep,
            None => crate::store::Action::Put(obj),
        })
    })?;
    ensure_cleanup(store);
    Ok(())
}
