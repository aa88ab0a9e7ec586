//! `application/vnd.kubernetes.protobuf` request bodies, encoded here by hand the way Go's
//! generated marshallers do (every non-pointer field, zero or not; pointer fields when set).
//! kubectl itself is covered in tests/kubectl.rs.

use axum::body::Body;
use axum::http::Request;
use kube_emulator::Emulator;
use serde_json::{Value, json};
use tower::ServiceExt;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// A length-delimited field (string, bytes, message, map entry).
fn ld(field: u64, data: &[u8]) -> Vec<u8> {
    let mut out = varint(field << 3 | 2);
    out.extend(varint(data.len() as u64));
    out.extend(data);
    out
}

fn num(field: u64, v: u64) -> Vec<u8> {
    let mut out = varint(field << 3);
    out.extend(varint(v));
    out
}

fn s(field: u64, text: &str) -> Vec<u8> {
    ld(field, text.as_bytes())
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

/// `k8s\0` + runtime.Unknown{typeMeta{apiVersion, kind}, raw}.
fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let type_meta = cat(&[s(1, api_version), s(2, kind)]);
    cat(&[b"k8s\0".to_vec(), ld(1, &type_meta), ld(2, raw)])
}

/// ObjectMeta as Go marshals a fresh object: all non-pointer fields, zero or not, and an empty
/// creationTimestamp (the zero Time).
fn object_meta(name: &str, namespace: &str) -> Vec<u8> {
    cat(&[
        s(1, name),
        s(2, ""),
        s(3, namespace),
        s(4, ""),
        s(5, ""),
        s(6, ""),
        num(7, 0),
        ld(8, &[]),
    ])
}

struct Answer {
    status: u16,
    body: Value,
}

async fn exchange(
    emu: &Emulator,
    method: &str,
    path: &str,
    ct: &str,
    accept: &str,
    body: Vec<u8>,
) -> (u16, String, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", ct)
        .header("accept", accept)
        .body(Body::from(body))
        .unwrap();
    let resp = emu.router().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, ct, bytes.to_vec())
}

/// A request answered in JSON (protobuf answers are checked with kubectl, which decodes them
/// with the real Go types, and at the end of this file for their framing).
async fn send(emu: &Emulator, method: &str, path: &str, ct: &str, body: Vec<u8>) -> Answer {
    let (status, _, bytes) = exchange(emu, method, path, ct, "application/json", body).await;
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {bytes:?}"));
    Answer { status, body }
}

async fn get(emu: &Emulator, path: &str) -> Value {
    let a = send(emu, "GET", path, "application/json", Vec::new()).await;
    assert_eq!(a.status, 200, "{}", a.body);
    a.body
}

fn emu() -> Emulator {
    Emulator::builder().pv_controller(false).build()
}

const SECRETS: &str = "/api/v1/namespaces/default/secrets";

fn secret(name: &str) -> Vec<u8> {
    let entry = cat(&[s(1, "key"), ld(2, &[0, 1, 0xff])]);
    envelope(
        "v1",
        "Secret",
        &cat(&[ld(1, &object_meta(name, "")), ld(2, &entry), s(3, "")]),
    )
}

#[tokio::test]
async fn a_protobuf_secret_is_stored_as_its_json_form() {
    let emu = emu();
    let a = send(&emu, "POST", SECRETS, PROTOBUF, secret("s1")).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let stored = get(&emu, &format!("{SECRETS}/s1")).await;
    assert_eq!(stored["data"], json!({"key": "AAH/"}));
    // `type: ""` is Go's zero value: defaulted as if absent.
    assert_eq!(stored["type"], "Opaque");
    assert_eq!(stored["metadata"]["namespace"], "default");
    let meta = stored["metadata"].as_object().unwrap();
    for absent in ["generateName", "selfLink", "generation"] {
        assert!(!meta.contains_key(absent), "{absent}: {stored}");
    }
    assert!(meta["creationTimestamp"].is_string(), "{stored}");
}

#[tokio::test]
async fn pointer_zero_values_survive_and_plain_zero_values_do_not() {
    let emu = emu();
    let class = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "fast", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "ceph.com/rbd"});
    let a = send(
        &emu,
        "POST",
        "/apis/storage.k8s.io/v1/storageclasses",
        "application/json",
        class.to_string().into_bytes(),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);

    let claim = |name: &str, class: Option<&str>| {
        let quantity = s(1, "1Gi");
        let request = cat(&[s(1, "storage"), ld(2, &quantity)]);
        let resources = ld(2, &request);
        let mut spec = cat(&[s(1, "ReadWriteOnce"), ld(2, &resources), s(3, "")]);
        if let Some(c) = class {
            spec.extend(s(5, c));
        }
        envelope(
            "v1",
            "PersistentVolumeClaim",
            &cat(&[
                ld(1, &object_meta(name, "default")),
                ld(2, &spec),
                ld(3, &[]),
            ]),
        )
    };
    let pvcs = "/api/v1/namespaces/default/persistentvolumeclaims";
    // storageClassName is a *string: "" means "no class", so the default class is not applied.
    let a = send(&emu, "POST", pvcs, PROTOBUF, claim("no-class", Some(""))).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let spec = &a.body["spec"];
    assert_eq!(spec["storageClassName"], "", "{}", a.body);
    // volumeName is a plain string: its zero value is no volume name at all.
    assert!(spec.get("volumeName").is_none(), "{}", a.body);
    assert_eq!(spec["resources"]["requests"]["storage"], "1Gi");
    assert_eq!(spec["accessModes"], json!(["ReadWriteOnce"]));

    let a = send(&emu, "POST", pvcs, PROTOBUF, claim("defaulted", None)).await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(a.body["spec"]["storageClassName"], "fast");
}

#[tokio::test]
async fn a_protobuf_put_updates_with_its_resource_version_precondition() {
    let emu = emu();
    let a = send(&emu, "POST", SECRETS, PROTOBUF, secret("rotated")).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let rv = a.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let put = |rv: &str| {
        let meta = cat(&[s(1, "rotated"), s(3, "default"), s(6, rv), ld(8, &[])]);
        let entry = cat(&[s(1, "key"), ld(2, b"new")]);
        envelope(
            "v1",
            "Secret",
            &cat(&[ld(1, &meta), ld(2, &entry), s(3, "Opaque")]),
        )
    };
    let path = format!("{SECRETS}/rotated");
    let a = send(&emu, "PUT", &path, PROTOBUF, put("1")).await;
    assert_eq!(a.status, 409, "{}", a.body);
    let a = send(&emu, "PUT", &path, PROTOBUF, put(&rv)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(get(&emu, &path).await["data"], json!({"key": "bmV3"}));
}

#[tokio::test]
async fn a_protobuf_storage_class_keeps_its_explicit_false_and_parameters() {
    let emu = emu();
    let param = |k: &str, v: &str| ld(3, &cat(&[s(1, k), s(2, v)]));
    let body = envelope(
        "storage.k8s.io/v1",
        "StorageClass",
        &cat(&[
            ld(1, &object_meta("rbd", "")),
            s(2, "ceph.com/rbd"),
            param("pool", "rbd"),
            param("adminSecretName", "ceph-admin-secret"),
            s(5, "discard"),
            num(6, 0),
            s(7, "WaitForFirstConsumer"),
        ]),
    );
    let a = send(
        &emu,
        "POST",
        "/apis/storage.k8s.io/v1/storageclasses",
        PROTOBUF,
        body,
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let sc = &a.body;
    assert_eq!(sc["apiVersion"], "storage.k8s.io/v1");
    assert_eq!(sc["provisioner"], "ceph.com/rbd");
    assert_eq!(
        sc["parameters"],
        json!({"pool": "rbd", "adminSecretName": "ceph-admin-secret"})
    );
    assert_eq!(sc["mountOptions"], json!(["discard"]));
    // allowVolumeExpansion is a *bool: an explicit false is kept, as on a real server.
    assert_eq!(sc["allowVolumeExpansion"], false);
    assert_eq!(sc["volumeBindingMode"], "WaitForFirstConsumer");
    // Not sent: defaulted.
    assert_eq!(sc["reclaimPolicy"], "Delete");
}

#[tokio::test]
async fn an_embedded_volume_source_is_inline_in_the_json() {
    let emu = emu();
    // PersistentVolumeSpec embeds PersistentVolumeSource (`json:",inline"`): field 2 on the
    // wire, but `spec.csi` in JSON.
    let csi = cat(&[
        s(1, "rbd.csi.ceph.com"),
        s(2, "rbd/img"),
        num(3, 0),
        s(4, ""),
        ld(5, &cat(&[s(1, "pool"), s(2, "rbd")])),
    ]);
    let capacity = ld(1, &cat(&[s(1, "storage"), ld(2, &s(1, "1Gi"))]));
    let spec = cat(&[
        capacity,
        ld(2, &ld(22, &csi)),
        s(3, "ReadWriteOnce"),
        s(5, "Delete"),
        s(6, "rbd"),
    ]);
    let body = envelope(
        "v1",
        "PersistentVolume",
        &cat(&[ld(1, &object_meta("pv-1", "")), ld(2, &spec), ld(3, &[])]),
    );
    let a = send(&emu, "POST", "/api/v1/persistentvolumes", PROTOBUF, body).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let spec = &a.body["spec"];
    assert!(spec.get("persistentVolumeSource").is_none(), "{}", a.body);
    assert_eq!(
        spec["csi"],
        json!({"driver": "rbd.csi.ceph.com", "volumeHandle": "rbd/img",
               "volumeAttributes": {"pool": "rbd"}})
    );
    assert_eq!(spec["capacity"]["storage"], "1Gi");
    assert_eq!(spec["storageClassName"], "rbd");
}

#[tokio::test]
async fn lease_micro_times_and_empty_holder_decode_like_go() {
    let emu = emu();
    let renew = cat(&[num(1, 1_700_000_000), num(2, 123_456_789)]);
    let spec = cat(&[
        s(1, ""),
        num(2, 15),
        ld(3, &renew),
        ld(4, &renew),
        num(5, 0),
    ]);
    let body = envelope(
        "coordination.k8s.io/v1",
        "Lease",
        &cat(&[ld(1, &object_meta("leader", "default")), ld(2, &spec)]),
    );
    let a = send(
        &emu,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        PROTOBUF,
        body,
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    assert_eq!(
        a.body["spec"],
        json!({"holderIdentity": "", "leaseDurationSeconds": 15, "leaseTransitions": 0,
               "acquireTime": "2023-11-14T22:13:20.123456Z", "renewTime": "2023-11-14T22:13:20.123456Z"})
    );
}

#[tokio::test]
async fn protobuf_delete_options_carry_their_preconditions() {
    let emu = emu();
    let a = send(&emu, "POST", SECRETS, PROTOBUF, secret("doomed")).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let uid = a.body["metadata"]["uid"].as_str().unwrap().to_string();
    let options = |uid: &str| {
        envelope(
            "v1",
            "DeleteOptions",
            &cat(&[num(1, 0), ld(2, &s(1, uid)), s(4, "Background")]),
        )
    };
    let path = format!("{SECRETS}/doomed");
    let a = send(&emu, "DELETE", &path, PROTOBUF, options("not-the-uid")).await;
    assert_eq!(a.status, 409, "{}", a.body);
    assert!(
        a.body["message"].as_str().unwrap().contains("not-the-uid"),
        "{}",
        a.body
    );
    let a = send(&emu, "DELETE", &path, PROTOBUF, options(&uid)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = send(&emu, "GET", &path, "application/json", Vec::new()).await;
    assert_eq!(a.status, 404);
}

#[tokio::test]
async fn malformed_protobuf_bodies_are_400s_that_name_the_problem() {
    let emu = emu();
    let bad_secret = envelope("v1", "Secret", &[0x0a, 0x05, 0x0a]);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            br#"{"kind":"Secret"}"#.to_vec(),
            "does not appear to be a protobuf message, expected prefix [107 56 115 0]",
        ),
        (Vec::new(), "empty data"),
        (
            b"k8s\0\x0a\xff".to_vec(),
            "protobuf envelope (runtime.Unknown) is invalid",
        ),
        (
            envelope("v1", "", &[]),
            "Object 'Kind' is missing in the protobuf envelope",
        ),
        (
            envelope("v1", "Widget", &[]),
            "no kind \"Widget\" is registered for version \"v1\"",
        ),
        (
            envelope("example.com/v1", "Secret", &[]),
            "no kind \"Secret\" is registered for version \"example.com/v1\"",
        ),
        (
            bad_secret,
            "unable to decode k8s.io.api.core.v1.Secret from protobuf",
        ),
        (
            envelope("v1", "ConfigMap", &ld(1, &object_meta("x", ""))),
            "the kind in the data (ConfigMap) does not match the expected kind (Secret)",
        ),
    ];
    for (body, want) in cases {
        let a = send(&emu, "POST", SECRETS, PROTOBUF, body).await;
        assert_eq!(a.status, 400, "{want}: {}", a.body);
        assert_eq!(a.body["kind"], "Status");
        assert_eq!(a.body["reason"], "BadRequest");
        let message = a.body["message"].as_str().unwrap();
        assert!(message.contains(want), "want {want:?} in {message:?}");
    }
    // Nothing was stored, and the server still answers.
    let list = get(&emu, SECRETS).await;
    assert_eq!(list["items"], json!([]));
}

#[tokio::test]
async fn answers_are_protobuf_when_the_client_prefers_it() {
    let emu = emu();
    let prefer = "application/vnd.kubernetes.protobuf,application/json";
    let (status, ct, body) = exchange(&emu, "POST", SECRETS, PROTOBUF, prefer, secret("pb")).await;
    assert_eq!(status, 201);
    assert_eq!(ct, PROTOBUF);
    assert!(body.starts_with(b"k8s\0"), "{body:?}");
    let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    // The envelope's type meta and the object's name and data.
    assert!(has(&cat(&[s(1, "v1"), s(2, "Secret")])), "{body:?}");
    assert!(has(&s(1, "pb")) && has(&[0, 1, 0xff]), "{body:?}");

    // Errors are protobuf Status objects too.
    let (status, ct, body) = exchange(
        &emu,
        "GET",
        &format!("{SECRETS}/missing"),
        "",
        prefer,
        Vec::new(),
    )
    .await;
    assert_eq!((status, ct.as_str()), (404, PROTOBUF));
    assert!(body.windows(8).any(|w| w == b"NotFound"), "{body:?}");

    // JSON first (or only) keeps JSON; so do Tables and watch streams.
    for accept in [
        "application/json",
        "application/json, application/vnd.kubernetes.protobuf",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    ] {
        let (status, ct, _) = exchange(
            &emu,
            "GET",
            &format!("{SECRETS}/pb"),
            "",
            accept,
            Vec::new(),
        )
        .await;
        assert_eq!((status, ct.as_str()), (200, "application/json"), "{accept}");
    }
    let (status, ct, body) = exchange(
        &emu,
        "GET",
        &format!("{SECRETS}?watch=1&timeoutSeconds=1"),
        "",
        prefer,
        Vec::new(),
    )
    .await;
    assert_eq!((status, ct.as_str()), (200, "application/json"));
    let first = body.split(|b| *b == b'\n').next().unwrap();
    let first: Value = serde_json::from_slice(first).unwrap();
    assert_eq!(first["type"], "ADDED");
}
