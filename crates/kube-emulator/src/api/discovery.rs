//! Non-resource endpoints: `/version`, legacy and aggregated discovery, `/openapi/v3`, health.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::{error_response, json_response};
use crate::crd::Registry;
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
    if !r.storage_version_hash.is_empty() {
        m.insert("storageVersionHash".into(), json!(r.storage_version_hash));
    }
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

/// The versions of a group (preferred first) with their resources: built-in groups serve
/// `v1`, CRD groups what their CRDs serve.
fn group_versions(group: &str, crds: &Registry) -> Vec<(&'static str, Vec<&'static ResourceInfo>)> {
    if group.is_empty() || GROUPS.contains(&group) {
        return vec![("v1", resources::group_resources(group).collect())];
    }
    let all = crds.all();
    crds.groups()
        .into_iter()
        .filter(|(g, _)| *g == group)
        .flat_map(|(_, versions)| versions)
        .map(|v| {
            let list = all
                .iter()
                .copied()
                .filter(|r| r.group == group && r.version == v)
                .collect();
            (v, list)
        })
        .collect()
}

/// Every group after core: the built-in ones, then the CRD groups (sorted).
fn all_groups(crds: &Registry) -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = GROUPS.to_vec();
    groups.extend(crds.groups().into_iter().map(|(g, _)| g));
    groups
}

fn aggregated_group(name: Option<&str>, group: &str, crds: &Registry) -> Value {
    let versions: Vec<Value> = group_versions(group, crds)
        .into_iter()
        .map(|(v, list)| {
            let resources: Vec<Value> = list.into_iter().map(aggregated_resource).collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    let meta = match name {
        Some(n) => json!({"name": n}),
        None => json!({}),
    };
    json!({"metadata": meta, "versions": versions})
}

fn group_entry(g: &str, crds: &Registry) -> Value {
    let versions: Vec<Value> = group_versions(g, crds)
        .into_iter()
        .map(|(v, _)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": g, "versions": versions, "preferredVersion": preferred})
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
fn openapi_gv(group: &str, version: &str, crds: &Registry) -> Value {
    let mut paths = Map::new();
    let list = group_versions(group, crds)
        .into_iter()
        .filter(|(v, _)| *v == version)
        .flat_map(|(_, l)| l);
    for r in list {
        let prefix = if group.is_empty() {
            "/api/v1".to_string()
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": group, "version": version, "kind": r.kind});
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

fn openapi_root(crds: &Registry) -> Value {
    let mut paths = Map::new();
    let entry =
        |p: &str| json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={OPENAPI_HASH}")});
    paths.insert("api".into(), entry("api"));
    paths.insert("api/v1".into(), entry("api/v1"));
    paths.insert("apis".into(), entry("apis"));
    for g in all_groups(crds) {
        for (v, _) in group_versions(g, crds) {
            let p = format!("apis/{g}/{v}");
            paths.insert(p.clone(), entry(&p));
        }
    }
    json!({"paths": paths})
}

/// Serves non-resource GET paths; `None` for resource paths.
pub(crate) fn serve(path: &str, headers: &HeaderMap, crds: &Registry) -> Option<Response> {
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
                &json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": [aggregated_group(None, "", crds)]}),
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
            let items: Vec<Value> = all_groups(crds)
                .into_iter()
                .map(|g| aggregated_group(Some(g), g, crds))
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
            let groups: Vec<Value> = all_groups(crds)
                .into_iter()
                .map(|g| group_entry(g, crds))
                .collect();
            json_response(
                200,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
                &[],
            )
        }
        "/openapi/v3" => with_content_type(
            json_response(200, &openapi_root(crds), &[]),
            "text/plain; charset=utf-8",
        ),
        "/openapi/v3/api/v1" => json_response(200, &openapi_gv("", "v1", crds), &[]),
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
            let groups = all_groups(crds);
            let served = |g: &str, v: &str| {
                groups.contains(&g) && group_versions(g, crds).iter().any(|(x, _)| *x == v)
            };
            if let Some(rest) = p.strip_prefix("/openapi/v3/apis/") {
                return match rest.split_once('/') {
                    Some((g, v)) if served(g, v) => {
                        Some(json_response(200, &openapi_gv(g, v, crds), &[]))
                    }
                    _ => None,
                };
            }
            let rest = p.strip_prefix("/apis/")?;
            let segs: Vec<&str> = rest.split('/').collect();
            match segs.as_slice() {
                [g] if groups.contains(g) => json_response(
                    200,
                    &{
                        let mut e = group_entry(g, crds);
                        e["kind"] = json!("APIGroup");
                        e["apiVersion"] = json!("v1");
                        e
                    },
                    &[],
                ),
                [g, v] if served(g, v) => {
                    let res: Vec<Value> = group_versions(g, crds)
                        .into_iter()
                        .filter(|(x, _)| x == v)
                        .flat_map(|(_, l)| l)
                        .flat_map(legacy_resource)
                        .collect();
                    json_response(
                        200,
                        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{g}/{v}"), "resources": res}),
                        &[],
                    )
                }
                _ => return None,
            }
        }
    };
    Some(resp)
}
