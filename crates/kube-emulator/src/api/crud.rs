//! get, list, create, update, patch, delete and deletecollection.

use axum::response::Response;
use serde_json::{Map, Value, json};

use super::{Ctx, Target, json_response, table};
use crate::admission;
use crate::events_view;
use crate::patch::{self, PatchKind};
use crate::resources::{self, ResourceInfo, View};
use crate::schema;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::{ApiError, Cause};
use crate::store::{Action, Key, Origin, StoreView, Written};
use crate::util::{self, generate_name, now_time};

/// The stored object as the endpoint's view shows it.
pub(crate) fn present(res: &ResourceInfo, obj: &Value) -> Value {
    match res.view {
        View::Native => obj.clone(),
        View::EventsV1 => events_view::core_to_v1(obj),
    }
}

fn to_storage(res: &ResourceInfo, obj: Value) -> Value {
    match res.view {
        View::Native => obj,
        View::EventsV1 => events_view::v1_to_core(&obj),
    }
}

fn storage_res(res: &'static ResourceInfo) -> &'static ResourceInfo {
    resources::by_storage(res.storage).unwrap_or(res)
}

fn key_of(t: &Target) -> Key {
    (
        t.namespace.clone().unwrap_or_default(),
        t.name.clone().unwrap_or_default(),
    )
}

fn wants_table(ctx: &Ctx) -> bool {
    ctx.header("accept").contains("as=Table")
}

fn strict(ctx: &Ctx) -> bool {
    ctx.query.get("fieldValidation") == Some("Strict")
}

fn unknown_warnings(ctx: &Ctx, unknown: &[String]) -> Vec<String> {
    if ctx.query.get("fieldValidation") == Some("Ignore") {
        return Vec::new();
    }
    unknown
        .iter()
        .map(|u| format!("unknown field \"{u}\""))
        .collect()
}

fn parse_body(ctx: &Ctx) -> Result<Value, ApiError> {
    let ct = ctx.header("content-type");
    if ct.contains("protobuf") {
        return Err(ApiError::unsupported_media_type());
    }
    if ct.contains("yaml") {
        return serde_yaml::from_slice(&ctx.body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; yaml parse error: {e}"))
        });
    }
    serde_json::from_slice(&ctx.body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

pub(crate) fn get(ctx: &Ctx) -> Result<Response, ApiError> {
    let t = &ctx.target;
    let (ns, name) = key_of(t);
    let obj = ctx
        .shared
        .store
        .get(t.res.storage, &ns, &name)
        .ok_or_else(|| ApiError::not_found(t.res, &name))?;
    let shown = present(t.res, &obj);
    if wants_table(ctx) {
        let rv = ctx.shared.store.current_rv();
        return Ok(json_response(
            200,
            &table::render(t.res, &[shown], rv, &ctx.query),
            &[],
        ));
    }
    Ok(json_response(200, &shown, &[]))
}

/// The continue token: base64url JSON like kube-apiserver's (opaque to clients).
fn continue_token(rv: u64, last: &Value) -> String {
    let ns = util::ns_of(last);
    let name = util::name_of(last);
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}\u{0}"), "ns": ns, "name": name});
    util::base64_encode(token.to_string().as_bytes(), true)
}

fn parse_continue(token: &str) -> Result<(u64, String, String), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let bytes = util::base64_decode(token).ok_or_else(bad)?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let ns = v
        .get("ns")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let name = v
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(bad)?
        .to_string();
    Ok((rv, ns, name))
}

pub(crate) fn selectors(ctx: &Ctx) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(ctx.query.get("labelSelector").unwrap_or_default())?;
    let fields = FieldSelector::parse(ctx.query.get("fieldSelector").unwrap_or_default())?;
    Ok((labels, fields))
}

fn list_body(res: &ResourceInfo, items: Vec<Value>, meta: Map<String, Value>) -> Value {
    json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": meta, "items": items})
}

fn strip_type_meta(mut v: Value) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    v
}

pub(crate) fn list(ctx: &Ctx) -> Result<Response, ApiError> {
    let t = &ctx.target;
    let store = &ctx.shared.store;
    let (labels, fields) = selectors(ctx)?;
    let rv_param = ctx.query.get("resourceVersion").unwrap_or_default();
    let exact = ctx.query.get("resourceVersionMatch") == Some("Exact");
    let cont = ctx
        .query
        .get("continue")
        .filter(|c| !c.is_empty())
        .map(parse_continue)
        .transpose()?;
    let (objects, rv) = if let Some((rv, _, _)) = &cont {
        (store.snapshot_at(t.res.storage, *rv)?, *rv)
    } else if exact && !rv_param.is_empty() {
        let rv: u64 = rv_param.parse().map_err(|_| {
            ApiError::bad_request(format!("resourceVersion: Invalid value: \"{rv_param}\": strconv.ParseUint: parsing \"{rv_param}\": invalid syntax"))
        })?;
        (store.snapshot_at(t.res.storage, rv)?, rv)
    } else {
        store.list(t.res.storage, None)
    };
    let mut items: Vec<Value> = objects
        .iter()
        .filter(|o| t.namespace.as_deref().is_none_or(|ns| util::ns_of(o) == ns))
        .filter(|o| {
            if let Some((_, ns, name)) = &cont {
                (util::ns_of(o), util::name_of(o)) > (ns.as_str(), name.as_str())
            } else {
                true
            }
        })
        .map(|o| present(t.res, o))
        .filter(|o| labels.matches(o) && fields.matches(o))
        .collect();
    let mut meta = Map::new();
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    if let Some(limit) = ctx
        .query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        && items.len() > limit
    {
        let remaining = items.len() - limit;
        items.truncate(limit);
        if let Some(last) = items.last() {
            meta.insert("continue".into(), json!(continue_token(rv, last)));
            meta.insert("remainingItemCount".into(), json!(remaining));
        }
    }
    if wants_table(ctx) {
        return Ok(json_response(
            200,
            &table::render(t.res, &items, rv, &ctx.query),
            &[],
        ));
    }
    let items = items.into_iter().map(strip_type_meta).collect();
    Ok(json_response(200, &list_body(t.res, items, meta), &[]))
}

/// Fills name (generateName), uid and creationTimestamp; clears server-owned metadata.
fn prepare_new_metadata(obj: &mut Value, url_name: Option<&str>) {
    let Some(meta) = util::obj_mut(obj, "metadata") else {
        return;
    };
    for f in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "managedFields",
        "uid",
    ] {
        meta.remove(f);
    }
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if name.is_empty() {
        if let Some(n) = url_name {
            meta.insert("name".into(), json!(n));
        } else if let Some(prefix) = meta
            .get("generateName")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
        {
            let generated = generate_name(prefix);
            meta.insert("name".into(), json!(generated));
        }
    }
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now_time()));
}

/// Checks and fills the namespace of a body against the URL.
fn settle_namespace(t: &Target, obj: &mut Value) -> Result<(), ApiError> {
    let Some(meta) = util::obj_mut(obj, "metadata") else {
        return Ok(());
    };
    if !t.res.namespaced {
        meta.remove("namespace");
        return Ok(());
    }
    let url_ns = t.namespace.clone().unwrap_or_default();
    match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && ns != url_ns => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {
            meta.insert("namespace".into(), json!(url_ns));
            Ok(())
        }
    }
}

/// Creates `body` (already parsed) at the target; used by POST and by apply-creates.
fn create_object(ctx: &Ctx, body: Value, url_name: Option<&str>) -> Result<Response, ApiError> {
    let t = &ctx.target;
    let decoded = schema::decode(t.res, body, strict(ctx))?;
    let mut warnings = unknown_warnings(ctx, &decoded.unknown);
    let mut obj = decoded.object;
    settle_namespace(t, &mut obj)?;
    let obj = to_storage(t.res, obj);
    let s_res = storage_res(t.res);
    let dry_run = ctx.query.get("dryRun") == Some("All");
    let generated = url_name.is_none()
        && util::meta_str(&obj, "name").is_none_or(str::is_empty)
        && util::meta_str(&obj, "generateName").is_some_and(|g| !g.is_empty());
    let attempts = if generated { 8 } else { 1 };
    let mut last_err = None;
    for _ in 0..attempts {
        let mut candidate = obj.clone();
        prepare_new_metadata(&mut candidate, url_name);
        let key = (
            util::ns_of(&candidate).to_string(),
            util::name_of(&candidate).to_string(),
        );
        let mut dry: Option<Value> = None;
        let mut admission_warnings = Vec::new();
        let result =
            ctx.shared
                .store
                .write(s_res.storage, &key, Origin::Client, |view, existing| {
                    if s_res.namespaced && view.get("namespaces", "", &key.0).is_none() {
                        return Err(ApiError::namespace_not_found(&key.0));
                    }
                    admission_warnings = admission::on_create(s_res, &mut candidate, view);
                    admission::validate_create(s_res, &candidate)?;
                    if existing.is_some() {
                        return Err(ApiError::already_exists(t.res, &key.1));
                    }
                    if dry_run {
                        dry = Some(candidate);
                        return Ok(Action::Abort);
                    }
                    Ok(Action::Put(candidate))
                });
        match result {
            Ok(written) => {
                warnings.extend(admission_warnings);
                let created = match (dry, written.object()) {
                    (Some(d), _) => d,
                    (None, Some(o)) => (**o).clone(),
                    (None, None) => return Err(ApiError::internal("create stored nothing")),
                };
                return Ok(json_response(201, &present(t.res, &created), &warnings));
            }
            Err(e) if generated && e.reason == "AlreadyExists" => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| ApiError::internal("name generation failed")))
}

pub(crate) fn create(ctx: &Ctx) -> Result<Response, ApiError> {
    let body = parse_body(ctx)?;
    create_object(ctx, body, None)
}

/// Options for composing an update from a new object.
struct UpdateOpts<'a> {
    target: &'a Target,
    /// PUT requires `metadata.resourceVersion` for resources without unconditional update.
    require_rv: bool,
    dry_run: bool,
}

/// The shared update logic of PUT and PATCH, run under the store lock.
fn compose_update(
    opts: &UpdateOpts<'_>,
    view: &StoreView<'_>,
    old: &Value,
    new: Value,
    dry: &mut Option<Value>,
) -> Result<Action, ApiError> {
    let t = opts.target;
    let s_res = storage_res(t.res);
    let name = t.name.as_deref().unwrap_or_default();
    let body_rv = util::meta_str(&new, "resourceVersion")
        .unwrap_or_default()
        .to_string();
    let old_rv = util::meta_str(old, "resourceVersion").unwrap_or_default();
    if !body_rv.is_empty() {
        if body_rv != old_rv {
            return Err(ApiError::conflict(t.res, name));
        }
    } else if opts.require_rv && !s_res.allow_unconditional_update {
        return Err(ApiError::invalid(
            t.res,
            name,
            vec![Cause::invalid(
                "metadata.resourceVersion",
                "0",
                "must be specified for an update",
            )],
        ));
    }
    if let Some(uid) = util::meta_str(&new, "uid").filter(|u| !u.is_empty())
        && Some(uid) != util::meta_str(old, "uid")
    {
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                util::meta_str(old, "uid").unwrap_or_default()
            ),
        ));
    }
    let mut next = if t.subresource.as_deref() == Some("status") {
        let mut next = old.clone();
        if let Some(m) = next.as_object_mut() {
            match new.get("status") {
                Some(s) => m.insert("status".into(), s.clone()),
                None => m.remove("status"),
            };
        }
        if let Some(meta) = util::obj_mut(&mut next, "metadata") {
            for f in ["labels", "annotations"] {
                match new.pointer(&format!("/metadata/{f}")) {
                    Some(v) => meta.insert(f.into(), v.clone()),
                    None => meta.remove(f),
                };
            }
        }
        next
    } else {
        let mut next = new;
        admission::carry_immutable_metadata(old, &mut next);
        if s_res.has_status
            && let Some(m) = next.as_object_mut()
        {
            match old.get("status") {
                Some(s) => m.insert("status".into(), s.clone()),
                None => m.remove("status"),
            };
        }
        next
    };
    admission::normalize(s_res, &mut next);
    admission::validate_update(s_res, old, &next, view)?;
    if opts.dry_run {
        *dry = Some(next);
        return Ok(Action::Abort);
    }
    Ok(Action::Put(next))
}

fn written_response(
    t: &Target,
    written: &Written,
    dry: Option<Value>,
    warnings: &[String],
) -> Result<Response, ApiError> {
    let obj = match (dry, written.object()) {
        (Some(d), _) => d,
        (None, Some(o)) => (**o).clone(),
        (None, None) => return Err(ApiError::internal("write stored nothing")),
    };
    Ok(json_response(200, &present(t.res, &obj), warnings))
}

fn check_url_identity(t: &Target, obj: &mut Value) -> Result<(), ApiError> {
    let url_name = t.name.clone().unwrap_or_default();
    let meta =
        util::obj_mut(obj, "metadata").ok_or_else(|| ApiError::bad_request("metadata missing"))?;
    match meta.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() && n != url_name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({url_name})"
            )));
        }
        _ => {
            meta.insert("name".into(), json!(url_name));
        }
    }
    settle_namespace(t, obj)
}

pub(crate) fn update(ctx: &Ctx) -> Result<Response, ApiError> {
    let t = &ctx.target;
    let body = parse_body(ctx)?;
    let decoded = schema::decode(t.res, body, strict(ctx))?;
    let warnings = unknown_warnings(ctx, &decoded.unknown);
    let mut obj = decoded.object;
    check_url_identity(t, &mut obj)?;
    let new = to_storage(t.res, obj);
    let opts = UpdateOpts {
        target: t,
        require_rv: true,
        dry_run: ctx.query.get("dryRun") == Some("All"),
    };
    let key = key_of(t);
    let mut dry = None;
    let written =
        ctx.shared
            .store
            .write(t.res.storage, &key, Origin::Client, |view, existing| {
                let old = existing.ok_or_else(|| ApiError::not_found(t.res, &key.1))?;
                compose_update(&opts, view, old, new, &mut dry)
            })?;
    written_response(t, &written, dry, &warnings)
}

fn apply_patch(kind: PatchKind, doc: &mut Value, patch_body: &Value) -> Result<(), ApiError> {
    match kind {
        PatchKind::Json => patch::json_patch(doc, patch_body),
        PatchKind::Merge => {
            patch::merge_patch(doc, patch_body);
            Ok(())
        }
        PatchKind::Strategic => patch::strategic_merge(doc, patch_body),
        PatchKind::Apply => patch::apply(doc, patch_body),
    }
}

pub(crate) fn patch(ctx: &Ctx) -> Result<Response, ApiError> {
    let t = &ctx.target;
    let kind = PatchKind::from_content_type(ctx.header("content-type"))
        .ok_or_else(ApiError::unsupported_media_type)?;
    let patch_body: Value = if kind == PatchKind::Apply {
        serde_yaml::from_slice(&ctx.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
    } else {
        serde_json::from_slice(&ctx.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?
    };
    if kind == PatchKind::Apply && ctx.query.get("fieldManager").is_none_or(str::is_empty) {
        return Err(ApiError::invalid_with(
            "PatchOptions.meta.k8s.io",
            "",
            None,
            "PatchOptions",
            vec![Cause::required(
                "fieldManager",
                "is required for apply patch",
            )],
        )
        .with_group("meta.k8s.io"));
    }
    let key = key_of(t);
    if kind == PatchKind::Apply
        && t.subresource.is_none()
        && ctx
            .shared
            .store
            .get(t.res.storage, &key.0, &key.1)
            .is_none()
    {
        return create_object(ctx, patch_body, Some(&key.1));
    }
    let opts = UpdateOpts {
        target: t,
        require_rv: false,
        dry_run: ctx.query.get("dryRun") == Some("All"),
    };
    let strict = strict(ctx);
    let mut warnings = Vec::new();
    let mut dry = None;
    let written =
        ctx.shared
            .store
            .write(t.res.storage, &key, Origin::Client, |view, existing| {
                let old = existing.ok_or_else(|| ApiError::not_found(t.res, &key.1))?;
                let mut doc = present(t.res, old);
                apply_patch(kind, &mut doc, &patch_body)?;
                let decoded = schema::decode(t.res, doc, strict)?;
                warnings = decoded
                    .unknown
                    .iter()
                    .map(|u| format!("unknown field \"{u}\""))
                    .collect();
                let mut obj = decoded.object;
                check_url_identity(t, &mut obj)?;
                compose_update(&opts, view, old, to_storage(t.res, obj), &mut dry)
            })?;
    written_response(t, &written, dry, &warnings)
}

fn precondition_check(t: &Target, old: &Value, opts: &Value) -> Result<(), ApiError> {
    let name = util::name_of(old);
    if let Some(uid) = opts.pointer("/preconditions/uid").and_then(Value::as_str) {
        let actual = util::meta_str(old, "uid").unwrap_or_default();
        if uid != actual {
            return Err(ApiError::precondition(
                t.res,
                name,
                format!(
                    "the UID in the precondition ({uid}) does not match the UID in record ({actual}). The object might have been deleted and then recreated"
                ),
            ));
        }
    }
    if let Some(rv) = opts
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
    {
        let actual = util::meta_str(old, "resourceVersion").unwrap_or_default();
        if rv != actual {
            return Err(ApiError::precondition(
                t.res,
                name,
                format!(
                    "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({actual}). The object might have been modified"
                ),
            ));
        }
    }
    Ok(())
}

/// Deletes one object; returns the write outcome.
fn delete_one(ctx: &Ctx, t: &Target, key: &Key, opts: &Value) -> Result<Written, ApiError> {
    let dry_run = ctx.query.get("dryRun") == Some("All")
        || opts
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|v| v == "All"));
    ctx.shared
        .store
        .write(t.res.storage, key, Origin::Client, |_, existing| {
            let old = existing.ok_or_else(|| ApiError::not_found(t.res, &key.1))?;
            precondition_check(t, old, opts)?;
            if dry_run {
                return Ok(Action::Keep);
            }
            if util::finalizers(old).is_empty() {
                return Ok(Action::Remove);
            }
            if util::is_terminating(old) {
                return Ok(Action::Keep);
            }
            let mut next = (**old).clone();
            if let Some(meta) = util::obj_mut(&mut next, "metadata") {
                meta.insert("deletionTimestamp".into(), json!(now_time()));
                meta.insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            Ok(Action::Put(next))
        })
}

/// Namespaces are removed at once together with their contents (no namespace controller).
fn cascade_namespace(ctx: &Ctx, ns: &str) {
    for res in resources::RESOURCES
        .iter()
        .filter(|r| r.namespaced && r.view == View::Native)
    {
        let (objs, _) = ctx.shared.store.list(res.storage, Some(ns));
        for o in objs {
            let key = (ns.to_string(), util::name_of(&o).to_string());
            let _ = ctx
                .shared
                .store
                .write(res.storage, &key, Origin::Client, |_, e| {
                    Ok(if e.is_some() {
                        Action::Remove
                    } else {
                        Action::Abort
                    })
                });
        }
    }
}

fn delete_status(res: &ResourceInfo, obj: &Value) -> Value {
    let mut details = Map::new();
    details.insert("name".into(), json!(util::name_of(obj)));
    if !res.group.is_empty() {
        details.insert("group".into(), json!(res.group));
    }
    details.insert("kind".into(), json!(res.plural));
    details.insert(
        "uid".into(),
        json!(util::meta_str(obj, "uid").unwrap_or_default()),
    );
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

fn delete_options(ctx: &Ctx) -> Result<Value, ApiError> {
    if ctx.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(&ctx.body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

pub(crate) fn delete(ctx: &Ctx) -> Result<Response, ApiError> {
    let t = &ctx.target;
    let opts = delete_options(ctx)?;
    let key = key_of(t);
    let written = delete_one(ctx, t, &key, &opts)?;
    match &written {
        Written::Removed(obj) => {
            if t.res.plural == "namespaces" {
                cascade_namespace(ctx, &key.1);
            }
            if t.res.plural == "pods" {
                Ok(json_response(200, &present(t.res, obj), &[]))
            } else {
                Ok(json_response(200, &delete_status(t.res, obj), &[]))
            }
        }
        other => written_response(t, other, None, &[]),
    }
}

pub(crate) fn delete_collection(ctx: &Ctx) -> Result<Response, ApiError> {
    let t = &ctx.target;
    let opts = delete_options(ctx)?;
    let (labels, fields) = selectors(ctx)?;
    let (objs, rv) = ctx.shared.store.list(t.res.storage, t.namespace.as_deref());
    let mut items = Vec::new();
    for o in objs {
        let shown = present(t.res, &o);
        if !(labels.matches(&shown) && fields.matches(&shown)) {
            continue;
        }
        let key = (util::ns_of(&o).to_string(), util::name_of(&o).to_string());
        match delete_one(ctx, t, &key, &opts) {
            Ok(w) => {
                if let Some(obj) = w.object() {
                    items.push(strip_type_meta(present(t.res, obj)));
                }
            }
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let mut meta = Map::new();
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    Ok(json_response(200, &list_body(t.res, items, meta), &[]))
}
