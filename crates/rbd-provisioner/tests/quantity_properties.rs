//! Property tests over claim sizes, from the text a user writes to the expansion controller's
//! decision: binary and decimal suffixes, exponents, milli, fractions, plain bytes, values near
//! MiB boundaries and near the 64-bit limits, each also in the form kube-apiserver stores.
//!
//! For every positive request: the image is the request rounded up to whole MiB (or a clear
//! error naming the largest image), the capacity is never below the request, and the expansion
//! controller sees nothing to do for any request at or below the capacity (`1G` is
//! provisioned as `954Mi`, which is no reason for a "cannot shrink" warning).
//!
//! The binary's claim module is compiled in with `#[path]` (as in bad_input.rs), so the real
//! sizing code is tested. `PROPTEST_CASES=N` for more cases.

#[allow(dead_code)]
#[path = "../src/backend/claim.rs"]
mod claim;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use proptest::prelude::*;
use provisioner::quantity::{self, canonicalize, parse};
use provisioner::resize::{ResizeDecision, decide};
use rbd_csi::volume::MAX_SIZE;
use serde_json::json;

const MIB: u64 = 1 << 20;

fn names() -> Vec<String> {
    vec!["ceph.com/rbd".to_string()]
}

fn class() -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": "rbd"}, "provisioner": "ceph.com/rbd", "allowVolumeExpansion": true,
    }))
    .unwrap()
}

/// A bound claim and its PV as the API holds them after provisioning: the PV capacity is what
/// the provisioner wrote (`<n>Mi`) in the API server's stored form, copied to the claim status.
fn bound(
    request: &str,
    capacity: &str,
    allocated: Option<&str>,
) -> (PersistentVolumeClaim, PersistentVolume) {
    let mut status = json!({"phase": "Bound", "capacity": {"storage": capacity}});
    if let Some(a) = allocated {
        status["allocatedResources"] = json!({"storage": a});
    }
    let claim = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "default", "uid": "u-1"},
        "spec": {"storageClassName": "rbd", "accessModes": ["ReadWriteOnce"],
                 "volumeName": "pvc-u-1", "resources": {"requests": {"storage": request}}},
        "status": status,
    }))
    .unwrap();
    let volume = serde_json::from_value(json!({
        "metadata": {"name": "pvc-u-1",
                     "annotations": {"pv.kubernetes.io/provisioned-by": "ceph.com/rbd"}},
        "spec": {"capacity": {"storage": capacity}, "persistentVolumeReclaimPolicy": "Delete",
                 "claimRef": {"name": "c", "namespace": "default", "uid": "u-1"}},
    }))
    .unwrap();
    (claim, volume)
}

/// The stored form of the PV capacity the provisioner writes for an image of `size` bytes.
fn capacity_text(size: u64) -> String {
    canonicalize(&format!("{}Mi", size >> 20)).unwrap()
}

/// Interesting byte counts: small, around MiB boundaries, around 2^63 and 2^64.
fn interesting_bytes() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..100_000,
        (1u64..(1 << 30), 0u64..3, any::<bool>()).prop_map(|(mib, d, up)| {
            let edge = mib * MIB;
            if up { edge + d } else { edge - d }
        }),
        (0u64..(1 << 21)).prop_map(|d| MAX_SIZE - (1 << 20) + d),
        (0u64..4096).prop_map(|d| i64::MAX as u64 - d),
        (0u64..4096).prop_map(|d| u64::MAX - d),
        any::<u64>(),
    ]
}

/// Quantity texts as people write them.
fn request_text() -> impl Strategy<Value = String> {
    let suffix = prop_oneof![
        Just(""),
        Just("k"),
        Just("M"),
        Just("G"),
        Just("T"),
        Just("P"),
        Just("E"),
        Just("Ki"),
        Just("Mi"),
        Just("Gi"),
        Just("Ti"),
        Just("Pi"),
        Just("Ei"),
        Just("m"),
    ];
    prop_oneof![
        // Plain bytes (and their neighbourhoods).
        interesting_bytes().prop_map(|b| b.to_string()),
        // Whole numbers with a suffix.
        (1u64..100_000, suffix.clone()).prop_map(|(n, s)| format!("{n}{s}")),
        // Fractions with a suffix.
        (0u64..10_000, "[0-9]{1,4}", suffix).prop_map(|(i, f, s)| format!("{i}.{f}{s}")),
        // Exponents.
        (1u64..100_000, prop_oneof![Just("e"), Just("E")], 0u32..19)
            .prop_map(|(n, e, x)| format!("{n}{e}{x}")),
        // Milli.
        (1u64..10_000_000_000u64).prop_map(|n| format!("{n}m")),
        // Near 64 bits in binary units (the API server caps these at 2^63-1).
        (1u64..17, prop_oneof![Just("Ei"), Just("E")]).prop_map(|(n, s)| format!("{n}{s}")),
    ]
}

fn check(written: &str) -> Result<(), TestCaseError> {
    let Ok(parsed) = parse(written) else {
        return Ok(());
    };
    if !parsed.is_positive() {
        prop_assert!(claim::image_size(Some(written)).is_err());
        return Ok(());
    }
    // What the API server stores means the same.
    let stored = canonicalize(written).unwrap();
    prop_assert_eq!(
        parse(&stored).unwrap(),
        parsed.clone(),
        "{} stored as {}",
        written,
        stored
    );
    let bytes = parsed.to_u64_ceil();
    let size = match claim::image_size(Some(&stored)) {
        Ok(size) => size,
        Err(e) => {
            prop_assert!(
                bytes.is_none_or(|b| b > MAX_SIZE),
                "{} ({}) refused: {}",
                written,
                stored,
                e
            );
            prop_assert!(e.contains("larger than the largest RBD image"), "{}", e);
            prop_assert!(e.contains(&stored), "{}", e);
            return Ok(());
        }
    };
    let bytes = bytes.unwrap();
    prop_assert!(size.is_multiple_of(MIB));
    prop_assert!(
        size >= bytes && size - bytes < MIB,
        "{} -> {}",
        written,
        size
    );
    let capacity = capacity_text(size);
    prop_assert!(
        parse(&capacity).unwrap() >= parsed,
        "{} -> {}",
        written,
        capacity
    );

    // Freshly bound, during and after growth to this request: nothing to do.
    let class = class();
    for allocated in [None, Some(stored.as_str())] {
        let (c, v) = bound(&stored, &capacity, allocated);
        prop_assert_eq!(
            decide(&c, &v, &class, &names()),
            ResizeDecision::Nothing,
            "{} ({}) with capacity {}",
            written,
            stored,
            capacity
        );
    }
    // Any request at or below the capacity: nothing either.
    for lower in [
        size.to_string(),
        (size - 1).to_string(),
        format!("{}k", size / 1000),
    ] {
        let (c, v) = bound(&lower, &capacity, None);
        prop_assert_eq!(
            decide(&c, &v, &class, &names()),
            ResizeDecision::Nothing,
            "{}",
            lower
        );
    }
    // One byte more than the capacity: an expansion to exactly that.
    if size < MAX_SIZE {
        let (c, v) = bound(&(size + 1).to_string(), &capacity, Some(&stored));
        prop_assert_eq!(
            decide(&c, &v, &class, &names()),
            ResizeDecision::Expand {
                requested: size + 1
            }
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn provisioning_rounds_up_to_mib_and_needs_no_resize(text in request_text()) {
        check(&text)?;
    }
}

/// The forms in the real-API recordings (reference/k8s-traces) and the examples.
#[test]
fn recorded_and_reported_forms() {
    for (written, stored, image) in [
        ("1Gi", "1Gi", 1024 * MIB),
        ("2Gi", "2Gi", 2048 * MIB),
        ("5Gi", "5Gi", 5120 * MIB),
        ("100Gi", "100Gi", 102_400 * MIB),
        ("1G", "1G", 954 * MIB),
        ("10G", "10G", 9537 * MIB),
        ("500M", "500M", 477 * MIB),
        ("1.5Gi", "1536Mi", 1536 * MIB),
        ("100m", "100m", MIB),
        ("0.5", "500m", MIB),
        ("1e3", "1e3", MIB),
        ("1", "1", MIB),
        ("1024Mi", "1Gi", 1024 * MIB),
    ] {
        assert_eq!(canonicalize(written).as_deref(), Ok(stored), "{written}");
        assert_eq!(claim::image_size(Some(stored)), Ok(image), "{written}");
        check(written).unwrap();
        check(stored).unwrap();
    }
    // The 16Ei claim: stored capped at 2^63-1, refused naming the limit.
    assert_eq!(canonicalize("16Ei").as_deref(), Ok("9223372036854775807"));
    let e = claim::image_size(Some("9223372036854775807")).unwrap_err();
    assert!(e.contains("9223372036853727232 bytes"), "{e}");
    // PV capacities as the provisioner writes them read back exactly.
    assert_eq!(
        quantity::parse_bytes(&capacity_text(954 * MIB)),
        Some(954 * MIB)
    );
}
