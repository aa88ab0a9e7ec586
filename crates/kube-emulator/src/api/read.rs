//! get and list, plus the helpers every verb shares (views, keys, body parsing).

use axum::response::Response;
use serde_json::{Map, Value, json};

use super::{Ctx, Target, json_response, table};
use crate::events_view;
use crate::resources::{self, ResourceInfo, View};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::Key;
use crate::util;

/// The stored object as the endpoint's view shows it.
pub(crate) fn present(res: &ResourceInfo, obj: &Value) -> Value {
    match res.view {
        View::Native if res.custom.is_some() => crate::crd::present_custom(res, obj),
        View::Native => obj.clone(),
        View::EventsV1 => events_view::core_to_v1(obj),
    }
}

pub(super) fn to_storage(res: &ResourceInfo, obj: Value) -> Value {
    match res.view {
        View::Native if res.custom.is_some() => crate::crd::to_storage_custom(res, obj),
        View::Native => obj,
        View::EventsV1 => events_view::v1_to_core(&obj),
    }
}

pub(super) fn storage_res(res: &'static ResourceInfo) -> &'static ResourceInfo {
    resources::by_storage(res.storage).unwrap_or(res)
}

pub(super) fn key_of(t: &Target) -> Key {
    (
        t.namespace.clone().unwrap_or_default(),
        t.name.clone().unwrap_or_default(),
    )
}

pub(super) fn wants_table(ctx: &Ctx) -> bool {
    ctx.header("accept").contains("as=Table")
}

pub(super) fn strict(ctx: &Ctx) -> bool {
    ctx.query.get("fieldValidation") == Some("Strict")
}

pub(super) fn unknown_warnings(ctx: &Ctx, unknown: &[String]) -> Vec<String> {
    if ctx.query.get("fieldValidation") == Some("Ignore") {
        return Vec::new();
    }
    unknown
        .iter()
        .map(|u| format!("unknown field \"{u}\""))
        .collect()
}

pub(super) fn parse_body(ctx: &Ctx) -> Result<Value, ApiError> {
    let ct = ctx.header("content-type");
    if ct.contains("protobuf") {
        return super::protobuf::decode_request(&ctx.body);
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

pub(super) fn list_body(res: &ResourceInfo, items: Vec<Value>, meta: Map<String, Value>) -> Value {
    json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": meta, "items": items})
}

pub(super) fn strip_type_meta(mut v: Value) -> Value {
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
