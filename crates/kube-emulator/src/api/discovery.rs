//! Non-resource endpoints: `/version`, legacy and aggregated discovery, `/openapi/v3`, health.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::{error_response, json_response};
use crate::resources::{self, GROUPS, ResourceInfo};
use crate::status::ApiError;

const AGGREGATED_CT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// A fixed hash: the emulated API never changes while it runs.
const OPENAPI_HASH: &str = "E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0E0";

fn version() -> Value {
    json!({
        "major": "1", "minor": "36", "emulationMajor": "1", "emulationMinor": "36",
        "minCompatibilityMajor": "1", "minCompatibilityMinor": "35",
        "gitVersion": "v1.36.2", "gitCommit": "kube-emulator", "gitTreeState": "clean",
        "buildDate": "2026-11-29T21:12:52Z", "goVersion": "go1.26.6", "compiler": "gc",
        "platform": "linux/amd64"
    })
}

fn legacy_resource(r: &ResourceInfo) -> Vec<Value> {
    let mut m = Map::new();
    m.insert("name".into(), json!(r.plural));
    m.insert("singularName".into(), json!(r.singular));
    m.insert("namespaced".into(), json!(r.namespaced));
    m.insert("kind".into(), json!(r.kind));
    m.insert("verbs".into(), json!(r.verbs()));
    if !r.short_names.is_empty() {
        m.insert("shortNames".into(), json!(r.short_names));
    }
    if !r.categories.is_empty() {
        m.insert("categories".into(), json!(r.categories));
    }
    m.insert("storageVersionHash".into(), json!(r.storage_version_hash));
    let mut out = vec![Value::Object(m)];
    if r.has_status {
        out.push(json!({
            "name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
            "kind": r.kind, "verbs": ["get", "patch", "update"]
        }));
    }
    out
}

fn aggregated_resource(r: &ResourceInfo) -> Value {
    let mut m = Map::new();
    m.insert("resource".into(), json!(r.plural));
    m.insert(
        "responseKind".into(),
        json!({"group": "", "version": "", "kind": r.kind}),
    );
    m.insert(
        "scope".into(),
        json!(if r.namespaced {
            "Namespaced"
        } else {
            "Cluster"
        }),
    );
    m.insert("singularResource".into(), json!(r.singular));
    m.insert("verbs".into(), json!(r.verbs()));
    if !r.short_names.is_empty() {
        m.insert("shortNames".into(), json!(r.short_names));
    }
    if !r.categories.is_empty() {
        m.insert("categories".into(), json!(r.categories));
    }
    if r.has_status {
        m.insert(
            "subresources".into(),
            json!([{"subresource": "status", "responseKind": {"group": "", "version": "", "kind": r.kind}, "verbs": ["get", "patch", "update"]}]),
        );
    }
    Value::Object(m)
}

fn aggregated_group(name: Option<&str>, group: &str) -> Value {
    let resources: Vec<Value> = resources::group_resources(group)
        .map(aggregated_resource)
        .collect();
    let meta = match name {
        Some(n) => json!({"name": n}),
        None => json!({}),
    };
    json!({"metadata": meta, "versions": [{"version": "v1", "resources": resources, "freshness": "Current"}]})
}

fn group_entry(g: &str) -> Value {
    let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
    json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
}

fn with_content_type(mut resp: Response, ct: &'static str) -> Response {
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    resp
}

/// A minimal OpenAPI v3 document for one group/version: one path per resource with the PATCH
/// operation tagged with its GVK and the `fieldValidation` parameter (kubectl checks these to
/// decide on server-side field validation). No schemas: kubectl then builds strategic merge
/// patches from its compiled-in types.
fn openapi_gv(group: &str) -> Value {
    let mut paths = Map::new();
    for r in resources::group_resources(group) {
        let prefix = if group.is_empty() {
            "/api/v1".to_string()
        } else {
            format!("/apis/{group}/v1")
        };
        let path = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": group, "version": "v1", "kind": r.kind});
        let params = json!([
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            {"name": "force", "in": "query", "schema": {"type": "boolean"}}
        ]);
        let op = |id: &str| {
            json!({"operationId": format!("{id}{}", r.kind), "x-kubernetes-group-version-kind": gvk,
                   "parameters": params, "responses": {"200": {"description": "OK"}}})
        };
        paths.insert(path, json!({"get": op("read"), "put": op("replace"), "patch": op("patch"), "delete": op("delete")}));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.36.2"},
        "paths": paths,
        "components": {"schemas": {}}
    })
}

fn openapi_root() -> Value {
    let mut paths = Map::new();
    let entry =
        |p: &str| json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={OPENAPI_HASH}")});
    paths.insert("api".into(), entry("api"));
    paths.insert("api/v1".into(), entry("api/v1"));
    paths.insert("apis".into(), entry("apis"));
    for g in GROUPS {
        let p = format!("apis/{g}/v1");
        paths.insert(p.clone(), entry(&p));
    }
    json!({"paths": paths})
}

/// Serves non-resource GET paths; `None` for resource paths.
pub(crate) fn serve(path: &str, headers: &HeaderMap) -> Option<Response> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let aggregated = accept.contains("as=APIGroupDiscoveryList") && accept.contains("v=v2;");
    let path = path.trim_end_matches('/');
    let resp = match path {
        "/version" => json_response(200, &version(), &[]),
        "/healthz" | "/livez" | "/readyz" => {
            let mut r = Response::new(Body::from("ok"));
            *r.status_mut() = StatusCode::OK;
            r
        }
        "/api" if aggregated => with_content_type(
            json_response(
                200,
                &json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": [aggregated_group(None, "")]}),
                &[],
            ),
            AGGREGATED_CT,
        ),
        "/api" => json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]}),
            &[],
        ),
        "/api/v1" => {
            let res: Vec<Value> = resources::group_resources("")
                .flat_map(legacy_resource)
                .collect();
            json_response(
                200,
                &json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": res}),
                &[],
            )
        }
        "/apis" if aggregated => {
            let items: Vec<Value> = GROUPS
                .iter()
                .map(|g| aggregated_group(Some(g), g))
                .collect();
            with_content_type(
                json_response(
                    200,
                    &json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items}),
                    &[],
                ),
                AGGREGATED_CT,
            )
        }
        "/apis" => {
            let groups: Vec<Value> = GROUPS.iter().map(|g| group_entry(g)).collect();
            json_response(
                200,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
                &[],
            )
        }
        "/openapi/v3" => with_content_type(
            json_response(200, &openapi_root(), &[]),
            "text/plain; charset=utf-8",
        ),
        "/openapi/v3/api/v1" => json_response(200, &openapi_gv(""), &[]),
        "/openapi/v3/api" | "/openapi/v3/apis" => json_response(
            200,
            &json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.36.2"}, "paths": {}}),
            &[],
        ),
        "/openapi/v2" => error_response(&ApiError {
            details: Some(json!({})),
            ..ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        }),
        p => {
            if let Some(rest) = p.strip_prefix("/openapi/v3/apis/") {
                let group = rest.trim_end_matches("/v1");
                if GROUPS.contains(&group) {
                    return Some(json_response(200, &openapi_gv(group), &[]));
                }
                return None;
            }
            let rest = p.strip_prefix("/apis/")?;
            let segs: Vec<&str> = rest.split('/').collect();
            match segs.as_slice() {
                [g] if GROUPS.contains(g) => json_response(
                    200,
                    &{
                        let mut e = group_entry(g);
                        e["kind"] = json!("APIGroup");
                        e["apiVersion"] = json!("v1");
                        e
                    },
                    &[],
                ),
                [g, "v1"] if GROUPS.contains(g) => {
                    let res: Vec<Value> = resources::group_resources(g)
                        .flat_map(legacy_resource)
                        .collect();
                    json_response(
                        200,
                        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{g}/v1"), "resources": res}),
                        &[],
                    )
                }
                _ => return None,
            }
        }
    };
    Some(resp)
}
