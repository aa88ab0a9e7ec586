//! The event recorder: a burst about many objects is written whole, through all its writers,
//! and repeats on one object are aggregated into one Event with a count.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use kube::api::{Api, ListParams};
use kube_emulator::Emulator;
use provisioner::events::{EventRecorder, EventType};

use crate::common::*;

#[tokio::test]
async fn a_burst_about_many_objects_is_written_whole_and_aggregated_per_object() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    let recorder = EventRecorder::new(client.clone(), "test-provisioner", "instance-1");
    const OBJECTS: usize = 300;
    for i in 0..OBJECTS {
        let object = ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            name: Some(format!("claim-{i}")),
            namespace: Some(NS.into()),
            uid: Some(format!("uid-{i}")),
            ..Default::default()
        };
        let succeeded = format!("provisioned volume for claim-{i}");
        recorder.record(object.clone(), EventType::Normal, "Provisioning", "started");
        recorder.record(
            object.clone(),
            EventType::Normal,
            "ProvisioningSucceeded",
            &succeeded,
        );
        recorder.record(
            object,
            EventType::Normal,
            "ProvisioningSucceeded",
            &succeeded,
        );
    }
    let events: Api<Event> = Api::namespaced(client, NS);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let written = loop {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        let aggregated = list
            .iter()
            .filter(|e| e.reason.as_deref() == Some("ProvisioningSucceeded"))
            .filter(|e| e.count == Some(2))
            .count();
        if aggregated == OBJECTS || tokio::time::Instant::now() > deadline {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // one Provisioning and one ProvisioningSucceeded (count 2) per object, nothing else
    assert_eq!(written.len(), 2 * OBJECTS, "events written");
    for i in 0..OBJECTS {
        let about: Vec<&Event> = written
            .iter()
            .filter(|e| e.involved_object.uid.as_deref() == Some(&*format!("uid-{i}")))
            .collect();
        let mut seen: Vec<(&str, i32)> = about
            .iter()
            .map(|e| (e.reason.as_deref().unwrap_or(""), e.count.unwrap_or(0)))
            .collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            [("Provisioning", 1), ("ProvisioningSucceeded", 2)],
            "claim-{i}"
        );
    }
}
