use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, PostParams};

#[tokio::test]
async fn smoke() {
    let emu = kube_emulator::Emulator::new();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(emu.client());
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "a"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    })).unwrap();
    let created = api.create(&PostParams::default(), &pvc).await.unwrap();
    println!("{}", serde_json::to_string(&created).unwrap());
    let got = api.get("a").await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    let err = api.get("nope").await.unwrap_err();
    println!("{err:?}");
}
