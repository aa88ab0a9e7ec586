//! The HTTP surface: routing of Kubernetes REST paths, request accounting, fault injection,
//! and `Status` answers for everything that goes wrong.

mod delete;
mod discovery;
mod faults_http;
mod protobuf;
mod read;
mod table;
mod watch;
mod write;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;

use crate::emulator::Shared;
use crate::resources::{self, ResourceInfo};
use crate::status::ApiError;
use crate::util::Query;

const MAX_BODY: usize = 16 * 1024 * 1024;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/emulator/faults", axum::routing::post(faults_http::handle))
        .route("/emulator/stats", axum::routing::get(stats))
        .fallback(dispatch)
        .with_state(shared)
}

/// `GET /emulator/stats`: requests by client, verb and resource; stalls.
async fn stats(State(shared): State<Arc<Shared>>) -> Response {
    json_response(200, &shared.stats.to_json(), &[])
}

/// A parsed resource path.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub res: &'static ResourceInfo,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
    pub watch_path: bool,
}

/// Everything a handler needs about one request.
pub(crate) struct Ctx {
    pub shared: Arc<Shared>,
    pub target: Target,
    pub query: Query,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Ctx {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

fn not_found_path() -> ApiError {
    ApiError {
        details: Some(serde_json::json!({})),
        ..ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...` resource paths (built-ins first,
/// then the resources of the stored CRDs).
pub(crate) fn parse_target(path: &str, crds: &crate::crd::Registry) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(not_found_path()),
    };
    let (watch_path, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let find = |plural: &str| {
        resources::find(group, version, plural).or_else(|| crds.find(group, version, plural))
    };
    let lookup = |plural: &str| find(plural).ok_or_else(not_found_path);
    let namespaced = |plural: &str| find(plural).is_some_and(|r| r.namespaced);
    let target = |res, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>| Target {
        res,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        subresource: sub.map(str::to_string),
        watch_path,
    };
    let t = match rest {
        ["namespaces", ns, plural] if namespaced(plural) => {
            target(lookup(plural)?, Some(ns), None, None)
        }
        ["namespaces", ns, plural, name] if namespaced(plural) => {
            target(lookup(plural)?, Some(ns), Some(name), None)
        }
        ["namespaces", ns, plural, name, sub] if namespaced(plural) => {
            target(lookup(plural)?, Some(ns), Some(name), Some(sub))
        }
        [plural] => target(lookup(plural)?, None, None, None),
        [plural, name] => target(lookup(plural)?, None, Some(name), None),
        [plural, name, sub] => target(lookup(plural)?, None, Some(name), Some(sub)),
        _ => return Err(not_found_path()),
    };
    if t.res.namespaced && t.name.is_some() && t.namespace.is_none() {
        return Err(not_found_path());
    }
    if !t.res.namespaced && t.namespace.is_some() {
        return Err(not_found_path());
    }
    if let Some(sub) = &t.subresource
        && !(sub == "status" && t.res.has_status)
    {
        return Err(not_found_path());
    }
    Ok(t)
}

/// JSON response with the given status code.
pub(crate) fn json_response(code: u16, body: &Value, warnings: &[String]) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Body::from(bytes));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

pub(crate) fn error_response(e: &ApiError) -> Response {
    let mut resp = json_response(e.code, &e.to_status(), &[]);
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// The verb of a resource request, as used by RBAC, counting and fault injection.
fn verb_of(method: &Method, t: &Target, query: &Query) -> Option<&'static str> {
    let watch = t.watch_path || query.flag("watch");
    Some(match (method.as_str(), t.name.is_some()) {
        ("GET", true) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    })
}

async fn dispatch(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let protobuf = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(protobuf::prefers_protobuf)
        // Custom resources are never served as protobuf, their errors included.
        && parse_target(req.uri().path(), &shared.store.crds)
            .map_or(true, |t| t.res.custom.is_none());
    let resp = route(shared, req).await;
    if protobuf {
        protobuf::answer(resp).await
    } else {
        resp
    }
}

async fn route(shared: Arc<Shared>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query = Query::parse(parts.uri.query());
    if parts.method == Method::GET
        && let Some(resp) = discovery::serve(&path, &parts.headers, &shared.store.crds)
    {
        return resp;
    }
    let target = match parse_target(&path, &shared.store.crds) {
        Ok(t) => t,
        Err(e) => return error_response(&e),
    };
    let Some(verb) = verb_of(&parts.method, &target, &query) else {
        return error_response(&ApiError::method_not_allowed());
    };
    let resource = match &target.subresource {
        Some(sub) => format!("{}/{sub}", target.res.plural),
        None => target.res.plural.to_string(),
    };
    let user_agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    shared.stats.count(user_agent, verb, &resource);
    if shared.recording() {
        shared.record(crate::emulator::RequestRecord {
            user_agent: user_agent.to_string(),
            verb: verb.to_string(),
            group: target.res.group.to_string(),
            resource: resource.clone(),
            namespace: target.namespace.clone(),
        });
    }
    let verdict = shared.faults.take(verb, &resource);
    if let Some(d) = verdict.delay {
        tokio::time::sleep(d).await;
    }
    if let Some(code) = verdict.fail {
        tracing::debug!(verb, resource = %resource, code, "injected fault");
        return error_response(&ApiError::injected(code, verb, &resource));
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return error_response(&ApiError::bad_request(format!(
                "unable to read request body: {e}"
            )));
        }
    };
    tracing::debug!(verb, resource = %resource, path = %path, "request");
    let deprecation = target.res.custom.and_then(|c| c.deprecation.as_deref());
    let started = std::time::Instant::now();
    let stats = shared.stats.clone();
    let resp = serve_verb(verb, shared, target, query, parts.headers, body).await;
    if verb != "watch" {
        stats.answered(started.elapsed());
    }
    match deprecation {
        Some(text) => with_warning(resp, text),
        None => resp,
    }
}

/// Adds a `Warning: 299 - "..."` header (a deprecated custom resource version).
fn with_warning(mut resp: Response, text: &str) -> Response {
    let value = format!(
        "299 - \"{}\"",
        text.replace('\\', "\\\\").replace('"', "\\\"")
    );
    if let Ok(v) = HeaderValue::from_str(&value) {
        resp.headers_mut().append(header::WARNING, v);
    }
    resp
}

async fn serve_verb(
    verb: &str,
    shared: Arc<Shared>,
    target: Target,
    query: Query,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let ctx = Ctx {
        shared,
        target,
        query,
        headers,
        body,
    };
    let result = match verb {
        "get" => read::get(&ctx),
        "list" => read::list(&ctx),
        "watch" => {
            return watch::watch(ctx)
                .await
                .unwrap_or_else(|e| error_response(&e));
        }
        "create" => write::create(&ctx),
        "update" => write::update(&ctx),
        "patch" => write::patch(&ctx),
        "delete" => delete::delete(&ctx),
        _ => delete::delete_collection(&ctx),
    };
    result.unwrap_or_else(|e| error_response(&e))
}
