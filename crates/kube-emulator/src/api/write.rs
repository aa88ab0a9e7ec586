//! create, update (PUT) and patch, sharing one update composition run under the store lock.

use axum::response::Response;
use serde_json::{Value, json};

use super::read::{key_of, parse_body, present, storage_res, strict, to_storage, unknown_warnings};
use super::{Ctx, Target, json_response};
use crate::admission;
use crate::patch::{self, PatchKind};
use crate::schema;
use crate::ssa;
use crate::status::{ApiError, Cause};
use crate::store::{Action, Origin, StoreView, Written};
use crate::util::{self, generate_name, now_time};

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
fn create_object(
    ctx: &Ctx,
    body: Value,
    url_name: Option<&str>,
    managed_fields: Option<Value>,
) -> Result<Response, ApiError> {
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
        if let (Some(mf), Some(meta)) = (&managed_fields, util::obj_mut(&mut candidate, "metadata"))
        {
            meta.insert("managedFields".into(), mf.clone());
        }
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
                    crate::crd::check_create_allowed(s_res, view)?;
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
                if s_res.storage == crate::crd::CRDS {
                    crate::crd::ensure_cleanup(&ctx.shared.store);
                }
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
    create_object(ctx, body, None, None)
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
        // Custom resources keep all of the old object but status (customResourceStatusStrategy).
        if s_res.custom.is_none()
            && let Some(meta) = util::obj_mut(&mut next, "metadata")
        {
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
    if s_res.storage == crate::crd::CRDS {
        crate::crd::on_update_crd(old, &mut next);
    }
    if s_res.custom.is_some() || s_res.storage == crate::crd::CRDS {
        crate::crd::bump_generation(s_res.has_status, old, &mut next);
    }
    admission::validate_update(s_res, old, &next, view)?;
    if opts.dry_run {
        *dry = Some(next);
        return Ok(Action::Abort);
    }
    Ok(Action::Put(next))
}

pub(super) fn written_response(
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
    if kind == PatchKind::Strategic && t.res.custom.is_some() {
        return Err(crate::crd::strategic_merge_refused());
    }
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
    let manager = ctx.query.get("fieldManager").unwrap_or_default();
    let force = ctx.query.flag("force");
    if kind == PatchKind::Apply
        && t.subresource.is_none()
        && ctx
            .shared
            .store
            .get(t.res.storage, &key.0, &key.1)
            .is_none()
    {
        let mf = ssa::apply_ownership(
            None,
            &patch_body,
            manager,
            force,
            &t.res.api_version(),
            &now_time(),
        )?;
        return create_object(ctx, patch_body, Some(&key.1), Some(mf));
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
                let managed = if kind == PatchKind::Apply {
                    Some(ssa::apply_ownership(
                        Some(old),
                        &patch_body,
                        manager,
                        force,
                        &t.res.api_version(),
                        &now_time(),
                    )?)
                } else {
                    None
                };
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
                let action = compose_update(&opts, view, old, to_storage(t.res, obj), &mut dry)?;
                Ok(match (action, managed) {
                    (Action::Put(mut next), Some(mf)) => {
                        if let Some(meta) = util::obj_mut(&mut next, "metadata") {
                            meta.insert("managedFields".into(), mf);
                        }
                        Action::Put(next)
                    }
                    (action, _) => action,
                })
            })?;
    written_response(t, &written, dry, &warnings)
}
