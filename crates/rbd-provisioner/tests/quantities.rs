//! End to end: claims written the ways people write sizes (decimal units, fractions, milli)
//! are provisioned in whole MiB, Bound, and left alone by the expansion controller; a claim
//! larger than any RBD image gets one clear ProvisioningFailed naming the limit.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::Harness;

const MIB: u64 = 1 << 20;

/// `(request, image size)`: the request rounded up to whole MiB.
const SIZES: [(&str, &str, u64); 5] = [
    ("one-g", "1G", 954 * MIB),
    ("ten-g", "10G", 9537 * MIB),
    ("half-g", "500M", 477 * MIB),
    ("one-and-a-half-gi", "1.5Gi", 1536 * MIB),
    ("milli", "100m", MIB),
];

fn count(event: &Event) -> i32 {
    event.count.unwrap_or(1)
}

fn describe(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {} x{}: {}",
                e.type_.as_deref().unwrap_or_default(),
                e.reason.as_deref().unwrap_or_default(),
                count(e),
                e.message.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decimal_and_fractional_sizes_bind_without_warnings_and_grow_once() {
    let h = Harness::start().await;
    let _p = h.spawn_default();
    h.create_class("rbd", &h.params(), "Delete").await;
    for (name, size, _) in SIZES {
        h.create_claim(name, "rbd", size, false).await;
    }
    let mut bound = Vec::new();
    for (name, size, image_bytes) in SIZES {
        let (claim, pv) = h.wait_bound(name).await;
        let image = Harness::image_name(&pv);
        assert_eq!(
            h.image_size(&image),
            image_bytes,
            "image of {name} ({size})"
        );
        let request = provisioner::quantity::parse_bytes(size).unwrap();
        let capacity = provisioner::quantity::volume_capacity_bytes(&pv).unwrap();
        assert_eq!(capacity, image_bytes, "PV capacity of {name} ({size})");
        assert!(capacity >= request && capacity.is_multiple_of(MIB));
        let claim_capacity = provisioner::quantity::claim_capacity_bytes(&claim);
        assert_eq!(
            claim_capacity,
            Some(image_bytes),
            "claim capacity of {name}"
        );
        bound.push((name, pv.metadata.name.clone().unwrap(), image));
    }

    // Grow 10G to 20G: one resize with the normal events. The claims above were all Bound
    // (and queued for the expansion controller) before this change, so by the time this
    // resize has finished their own checks have run too.
    let patch = json!({"spec": {"resources": {"requests": {"storage": "20G"}}}});
    h.claims()
        .patch("ten-g", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    h.wait_event("ten-g", "FileSystemResizeRequired").await;
    let ten_g_image = &bound[1].2;
    assert_eq!(h.image_size(ten_g_image), 19074 * MIB, "20G in whole MiB");
    let pv = h.volumes().get(&bound[1].1).await.unwrap();
    assert_eq!(
        provisioner::quantity::volume_capacity_bytes(&pv),
        Some(19074 * MIB)
    );

    // Every claim: no Warning of any kind; the grown one resized exactly once.
    for (name, _, _) in SIZES {
        let events = h.events_for(name).await;
        let warnings: Vec<_> = events
            .iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .cloned()
            .collect();
        assert!(
            warnings.is_empty(),
            "{name}: unexpected warnings {:?}",
            describe(&warnings)
        );
        let resizes: i32 = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("Resizing"))
            .map(count)
            .sum();
        let expected = i32::from(name == "ten-g");
        assert_eq!(resizes, expected, "{name}: {:?}", describe(&events));
    }
    let ten_g = h.events_for("ten-g").await;
    let fs_required: i32 = ten_g
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FileSystemResizeRequired"))
        .map(count)
        .sum();
    assert_eq!(fs_required, 1, "{:?}", describe(&ten_g));
    let claim = h.claims().get("ten-g").await.unwrap();
    let status = claim.status.unwrap();
    assert_eq!(
        status.allocated_resources.unwrap()["storage"].0,
        "20G",
        "allocatedResources is the request as written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_larger_than_any_rbd_image_fails_clearly() {
    let h = Harness::start().await;
    let _p = h.spawn_default();
    h.create_class("rbd", &h.params(), "Delete").await;
    let claim = h.create_claim("huge", "rbd", "16Ei", false).await;
    let uid = claim.metadata.uid.clone().unwrap();
    // As kube-apiserver does: binary quantities are capped at 2^63-1.
    assert_eq!(
        claim.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
        "9223372036854775807"
    );
    let message = h.wait_event("huge", "ProvisioningFailed").await;
    assert!(
        message.contains("larger than the largest RBD image")
            && message.contains("9223372036853727232 bytes"),
        "{message}"
    );
    assert!(!message.contains("not a valid quantity"), "{message}");
    // A second attempt has happened (and failed the same way) once a "still failing" event
    // exists; the plain failure is a single Event (same text aggregates into its count).
    let events = h
        .until(
            "a second ProvisioningFailed attempt",
            Duration::from_secs(30),
            || async {
                let events = h.events_for("huge").await;
                events
                    .iter()
                    .any(|e| {
                        e.message
                            .as_deref()
                            .is_some_and(|m| m.contains("still failing"))
                    })
                    .then_some(events)
            },
        )
        .await;
    let failures: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ProvisioningFailed"))
        .collect();
    assert!(
        failures.iter().all(|e| e
            .message
            .as_deref()
            .is_some_and(|m| m.contains("larger than the largest RBD image"))),
        "{:?}",
        describe(&events)
    );
    let plain = failures
        .iter()
        .filter(|e| e.message.as_deref() == Some(message.as_str()))
        .count();
    assert_eq!(plain, 1, "{:?}", describe(&events));
    assert!(
        !h.images().iter().any(|i| i.contains(&uid)),
        "no image may be created"
    );
    assert!(
        h.claims()
            .get("huge")
            .await
            .unwrap()
            .spec
            .unwrap()
            .volume_name
            .is_none()
    );
}
