//! `provisioner::paged` against the emulator: a list longer than a page comes in pages, every
//! object once, through the full and through the metadata-only list.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube_emulator::Emulator;

#[tokio::test]
async fn lists_longer_than_a_page_come_in_pages_with_every_object_once() {
    let emulator = Emulator::builder().record_requests(true).build();
    let client = emulator.client();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let n = 2 * provisioner::paged::PAGE as usize + 7;
    for i in 0..n {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("cm-{i:04}")},
            "data": {"k": "v"},
        }))
        .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let mut seen = Vec::new();
    provisioner::paged::for_each(&api, &ListParams::default(), |cm| {
        assert_eq!(cm.data.as_ref().unwrap()["k"], "v");
        seen.push(cm.name_any());
    })
    .await
    .unwrap();
    let mut names = Vec::new();
    provisioner::paged::for_each_metadata(&api, &ListParams::default(), |m| {
        names.push(m.name_any());
    })
    .await
    .unwrap();
    for listed in [&seen, &names] {
        assert_eq!(listed.len(), n);
        assert_eq!(listed.iter().collect::<BTreeSet<_>>().len(), n, "each once");
    }
    let lists = emulator
        .requests()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "configmaps")
        .count();
    assert_eq!(lists, 6, "three pages per pass");
}
