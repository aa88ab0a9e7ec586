//! delete and deletecollection: finalizers, preconditions, immediate removal.

use axum::response::Response;
use serde_json::{Map, Value, json};

use super::read::{key_of, list_body, present, selectors, strip_type_meta};
use super::write::written_response;
use super::{Ctx, Target, json_response};
use crate::resources::{self, ResourceInfo, View};
use crate::status::ApiError;
use crate::store::{Action, Key, Origin, Written};
use crate::util::{self, now_time};

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
    let builtin = resources::RESOURCES
        .iter()
        .filter(|r| r.namespaced && r.view == View::Native)
        .map(|r| r.storage);
    let custom = ctx.shared.store.crds.storages().into_iter();
    let storages: Vec<&'static str> = builtin
        .chain(custom.filter(|(_, namespaced)| *namespaced).map(|(s, _)| s))
        .collect();
    for storage in storages {
        let (objs, _) = ctx.shared.store.list(storage, Some(ns));
        for o in objs {
            let key = (ns.to_string(), util::name_of(&o).to_string());
            let _ = ctx
                .shared
                .store
                .write(storage, &key, Origin::Client, |_, e| {
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
    if ctx.header("content-type").contains("protobuf") {
        return super::protobuf::decode_request(&ctx.body);
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
