//! Bad input: property tests over StorageClass parameter maps, secret contents, claim sizes,
//! access/volume modes, annotations and CSI volume IDs / capacity ranges (never a panic; an
//! error always names the field), and a few generated bad classes through the real binary
//! (a ProvisioningFailed event naming the parameter, never a crash).
//!
//! The parsers are the binary's own modules, used through its library target.
//!
//! `cargo test -p rbd-provisioner --test bad_input` (PROPTEST_CASES=N for more cases).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use rbd_provisioner::backend::{claim, params, secrets};
use serde_json::json;

/// Every key the parser knows, in canonical spelling.
const KNOWN: &[&str] = &[
    "monitors",
    "adminId",
    "adminSecretName",
    "adminSecretNamespace",
    "pool",
    "dataPool",
    "userId",
    "userSecretName",
    "userSecretNamespace",
    "fsType",
    "imageFormat",
    "imageFeatures",
    "objectSize",
    "stripeUnit",
    "stripeCount",
    "pvSource",
    "mounter",
    "csi.storage.k8s.io/fstype",
    "csi.storage.k8s.io/provisioner-secret-name",
    "csi.storage.k8s.io/node-stage-secret-name",
];

/// Values that stress parsers: empty, blanks, huge and negative numbers, quantities, unicode,
/// separators, control characters.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(" ".to_string()),
        Just("2".to_string()),
        Just("1".to_string()),
        Just("layering,fast-diff".to_string()),
        Just("layering,exclusive-lock,object-map,fast-diff".to_string()),
        Just("18446744073709551616".to_string()),
        Just("-1".to_string()),
        Just("9Ei".to_string()),
        Just("1e400".to_string()),
        Just("4Mi".to_string()),
        Just("10.0.0.1:6789,[::1]:3300".to_string()),
        Just("a:99999".to_string()),
        Just(",,".to_string()),
        "[a-zA-Z0-9:,.\\[\\]/ -]{0,40}",
        any::<String>(),
    ]
}

/// A key: a known one in random case, or anything.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (prop::sample::select(KNOWN), any::<u64>()).prop_map(|(k, bits)| {
            k.chars()
                .enumerate()
                .map(|(i, c)| if bits >> (i % 64) & 1 == 1 { c.to_ascii_uppercase() } else { c })
                .collect()
        }),
        1 => any::<String>(),
    ]
}

fn parameter_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    // usually a valid base with a few keys changed, sometimes anything at all
    let base = || {
        BTreeMap::from([
            ("monitors".to_string(), "10.0.0.1:6789".to_string()),
            ("adminSecretName".to_string(), "ceph-admin".to_string()),
        ])
    };
    prop_oneof![
        prop::collection::btree_map(key(), value(), 0..6).prop_map(move |extra| {
            let mut m = base();
            m.extend(extra);
            m
        }),
        prop::collection::btree_map(key(), value(), 0..8),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        // no lib.rs/main.rs next to this file to persist regressions in: print them instead
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Never a panic; an error names a key of the map, or the required/related parameter.
    #[test]
    fn storage_class_parameters_never_panic_and_errors_name_the_field(raw in parameter_map()) {
        match params::Parameters::parse(&raw) {
            Ok(p) => {
                prop_assert!(!p.monitors.is_empty());
                prop_assert!(!p.admin_secret_name.is_empty());
                prop_assert!(p.image_format == 1 || p.image_format == 2);
            }
            Err(e) => {
                let named = raw.contains_key(&e.key)
                    || ["monitors", "adminSecretName", "stripeUnit"].contains(&e.key.as_str());
                prop_assert!(named, "error names {:?}, not a key of {:?}", e.key, raw);
                let text = e.to_string();
                prop_assert!(text.starts_with("StorageClass parameter "), "{}", text);
                prop_assert!(text.contains(&format!("{:?}", e.key)), "{}", text);
            }
        }
    }

    /// Never a panic; the key is the first non-blank of key / userKey / adminKey, trimmed;
    /// without those, never a value that is not in the secret.
    #[test]
    fn secret_contents_never_panic_and_the_key_is_predictable(
        data in prop::collection::btree_map(
            prop_oneof![Just("key".to_string()), Just("userKey".to_string()),
                        Just("adminKey".to_string()), any::<String>()],
            prop::collection::vec(any::<u8>(), 0..64),
            0..5,
        )
    ) {
        let secret = Secret {
            data: Some(data.iter().map(|(k, v)| (k.clone(), ByteString(v.clone()))).collect()),
            ..Default::default()
        };
        let expected = secrets::KEY_FIELDS.iter().find_map(|f| {
            let v = String::from_utf8_lossy(data.get(*f)?).trim().to_string();
            (!v.is_empty()).then_some(v)
        });
        let got = match secrets::key_from(&secret) {
            secrets::Found::Key(k) => Some(k.expose().to_string()),
            _ => None,
        };
        let values: Vec<String> = data
            .values()
            .map(|v| String::from_utf8_lossy(v).trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        if expected.is_some() {
            prop_assert_eq!(got, expected);
        } else if let Some(got) = got {
            prop_assert!(values.contains(&got));
        }
    }

    /// Any quantity text: parse and size never panic; a size is whole MiB, never smaller than
    /// asked; an error names spec.resources.requests.storage.
    #[test]
    fn claim_sizes_never_panic(
        text in prop_oneof![
            "[0-9]{1,25}(\\.[0-9]{1,5})?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|e[0-9]{1,3})?",
            any::<String>(),
        ]
    ) {
        let bytes = provisioner::quantity::parse_bytes(&text);
        match claim::image_size(Some(&text)) {
            Ok(size) => {
                prop_assert_eq!(size % (1 << 20), 0);
                prop_assert!(size >= bytes.unwrap());
            }
            Err(e) => prop_assert!(e.contains("spec.resources.requests.storage"), "{}", e),
        }
    }

    /// Any access and volume modes: never a panic; an error names the spec field.
    #[test]
    fn access_and_volume_modes_never_panic(
        modes in prop::collection::vec(
            prop_oneof![Just("ReadWriteOnce".to_string()), Just("ReadWriteMany".to_string()),
                        Just("ReadOnlyMany".to_string()), any::<String>()], 0..4),
        mode in prop::option::of(prop_oneof![Just("Block".to_string()),
                                             Just("Filesystem".to_string()), any::<String>()]),
    ) {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {"accessModes": modes, "volumeMode": mode},
        })).unwrap();
        if let Err(e) = claim::check_modes(&claim) {
            prop_assert!(e.contains("spec.accessModes") || e.contains("spec.volumeMode"), "{}", e);
        }
    }

    /// Claim and PV annotations, finalizers and names of any content: the library's pure
    /// decisions (ownership, PV deletion, expansion) never panic.
    #[test]
    fn annotations_never_panic_the_decisions(
        annotations in prop::collection::btree_map(
            prop_oneof![
                Just("volume.kubernetes.io/storage-provisioner".to_string()),
                Just("volume.beta.kubernetes.io/storage-provisioner".to_string()),
                Just("volume.kubernetes.io/selected-node".to_string()),
                Just("pv.kubernetes.io/provisioned-by".to_string()),
                Just("rbdProvisionerIdentity".to_string()),
                any::<String>(),
            ],
            prop_oneof![Just("ceph.com/rbd".to_string()), any::<String>()],
            0..5,
        ),
        size in "[0-9]{1,22}(Mi|Gi|Ei)?",
        phase in prop_oneof![Just("Bound"), Just("Released"), Just("Pending"), Just("Lost")],
        binding in prop_oneof![Just("Immediate"), Just("WaitForFirstConsumer"), Just("Bogus")],
    ) {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "default", "uid": "u-1",
                         "annotations": annotations},
            "spec": {"storageClassName": "rbd", "accessModes": ["ReadWriteOnce"],
                     "volumeName": "pvc-u-1",
                     "resources": {"requests": {"storage": size}}},
            "status": {"phase": phase, "capacity": {"storage": "1Mi"}},
        })).unwrap();
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "rbd"}, "provisioner": "ceph.com/rbd",
            "volumeBindingMode": binding, "allowVolumeExpansion": true,
        })).unwrap();
        let volume: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pvc-u-1", "annotations": annotations},
            "spec": {"capacity": {"storage": "1Mi"}, "persistentVolumeReclaimPolicy": "Delete",
                     "claimRef": {"name": "c", "namespace": "default", "uid": "u-1"}},
            "status": {"phase": phase},
        })).unwrap();
        let names = vec!["ceph.com/rbd".to_string()];
        let _ = provisioner::ownership::decide(&claim, &class, &names, true);
        let _ = provisioner::pv::decide(&volume, &names);
        let _ = provisioner::resize::decide(&claim, &volume, &class, &names);
        let _ = provisioner::quantity::claim_request_bytes(&claim);
    }

    /// CSI volume IDs and capacity ranges of any content: never a panic; errors say what.
    #[test]
    fn csi_volume_ids_and_capacity_ranges_never_panic(
        id in prop_oneof!["v1/[a-z0-9:.,]{0,20}/[a-z]{0,5}/[a-z0-9-]{0,10}", any::<String>()],
        required in any::<i64>(),
        limit in any::<i64>(),
    ) {
        match rbd_csi::volume::VolumeId::parse(&id) {
            Ok(v) => prop_assert_eq!(v.to_string(), id.clone()),
            Err(e) => prop_assert!(e.contains("malformed volume id"), "{}", e),
        }
        match rbd_csi::volume::size_for_range(required, limit) {
            Ok(size) => {
                prop_assert_eq!(size % (1 << 20), 0);
                prop_assert!(required <= 0 || size >= required as u64);
                prop_assert!(limit <= 0 || size <= limit as u64);
            }
            Err(e) => prop_assert!(e.contains("required_bytes") || e.contains("limit_bytes"), "{}", e),
        }
        let name = rbd_csi::volume::image_name(&id);
        prop_assert!(rbd_csi::volume::is_safe_image_name(&name));
    }
}

/// Generated bad classes through the real binary: each claim gets a ProvisioningFailed event
/// naming the bad parameter, no PV appears, and the process is still running afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_bad_classes_are_reported_by_the_binary_without_a_crash() {
    let h = support::Harness::start().await;
    let mut p = h.spawn(
        &[
            "--leader-elect=false",
            "--retry-interval-start=1s",
            "--retry-interval-max=5s",
        ],
        &[],
    );
    // sample bad maps deterministically from the same strategy the property test uses
    let mut runner = TestRunner::deterministic();
    let strategy = (prop::sample::select(KNOWN), value());
    let mut cases: Vec<(String, BTreeMap<String, String>, String)> = Vec::new();
    while cases.len() < 6 {
        let (k, v) = strategy.new_tree(&mut runner).unwrap().current();
        let mut raw: BTreeMap<String, String> = h.params().into_iter().collect();
        raw.insert(k.to_string(), v);
        if let Err(e) = params::Parameters::parse(&raw) {
            let i = cases.len();
            cases.push((format!("bad-{i}"), raw, e.key));
        }
    }
    for (name, raw, _) in &cases {
        let pairs: Vec<(String, String)> = raw.clone().into_iter().collect();
        h.create_class(name, &pairs, "Delete").await;
        h.create_claim(name, name, "8Mi", false).await;
    }
    for (name, _, key) in &cases {
        let message = h.wait_event(name, "ProvisioningFailed").await;
        assert!(
            message.contains(&format!("StorageClass parameter {key:?}")),
            "claim {name}: {message:?} does not name {key:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(p.running(), "the provisioner died on bad input");
    let volumes = h.volumes().list(&Default::default()).await.unwrap().items;
    assert!(volumes.is_empty());
    let key = h.ceph.admin_key.clone();
    h.assert_nowhere(&key, &[p.log_text()]).await;
    eprintln!(
        "RELIABILITY bad-input e2e: {} generated bad classes, each reported by key: {:?}",
        cases.len(),
        cases.iter().map(|c| c.2.clone()).collect::<Vec<_>>()
    );
}
