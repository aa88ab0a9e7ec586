//! The built-in provisioner and encrypted classes: it refuses them (a ProvisioningFailed event
//! naming the parameter and the CSI controller that makes encrypted volumes) and makes no PV,
//! for in-tree and CSI PVs alike.
//!
//! `cargo test -p rbd-provisioner --test encryption_builtin`

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_classes_are_refused_naming_the_parameter() {
    let h = support::Harness::start().await;
    let mut p = h.spawn_default();
    let cases = [
        ("crypt-intree", "rbd", "encrypted"),
        ("crypt-csi", "csi", "encryptionKMSID"),
    ];
    for (name, source, key) in cases {
        let mut params = h.params();
        params.push(("pvSource".to_owned(), source.to_owned()));
        params.push((key.to_owned(), "true".to_owned()));
        h.create_class(name, &params, "Delete").await;
        h.create_claim(name, name, "8Mi", false).await;
    }
    for (name, _, key) in cases {
        let message = h.wait_event(name, "ProvisioningFailed").await;
        for part in [
            format!("StorageClass parameter {key:?}"),
            "CSI controller".to_owned(),
        ] {
            assert!(message.contains(&part), "claim {name}: {message:?}");
        }
    }
    assert!(p.running());
    let volumes = h.volumes().list(&Default::default()).await.unwrap().items;
    assert!(volumes.is_empty(), "no PV was made");
}
