//! `rbd-provisioner gc`: deliberately orphaned images (a PV object deleted behind the
//! provisioner's back, images with an owner record naming a PV that never existed) are listed
//! by the dry run, exactly them; `--delete` removes exactly them and refuses a watched one.
//!
//! `cargo test -p rbd-provisioner --test gc`

mod support;

use std::collections::BTreeSet;
use std::process::Output;
use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use micro_ceph::ImageHolder;
use support::{Harness, claim_names, unique_prefix};

/// `gc` with no minimum age (the test's orphans are seconds old).
fn gc(h: &Harness, identity: &str, delete: bool) -> (Output, String) {
    gc_with(h, identity, delete, &["--min-age=0s"])
}

fn gc_with(h: &Harness, identity: &str, delete: bool, extra: &[&str]) -> (Output, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"));
    cmd.args(["gc", "--id", identity])
        .args(extra)
        .arg("--kubeconfig")
        .arg(&h.kubeconfig)
        .env_remove("RUST_LOG");
    if delete {
        cmd.arg("--delete");
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

/// Image names of `prefix` that the gc output lists.
fn listed(text: &str, prefix: &str) -> BTreeSet<String> {
    text.split_whitespace()
        .filter_map(|w| {
            let w = w.rsplit('/').next().unwrap_or(w);
            w.starts_with(prefix).then(|| w.to_string())
        })
        .collect()
}

/// An image with an owner record, as our provisioner (`identity`) writes it.
fn owned_image(h: &Harness, image: &str, pv: &str, identity: &str) {
    let spec = format!("{}/{image}", h.ceph.pool);
    h.ceph.rbd(&["create", &spec, "--size", "8M"]).unwrap();
    for (key, value) in [
        ("provisioner.ceph.com/pv", pv),
        ("provisioner.ceph.com/claim", "default/gone"),
        ("provisioner.ceph.com/provisioner", identity),
    ] {
        h.ceph
            .rbd(&["image-meta", "set", &spec, key, value])
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_lists_exactly_the_orphans_and_deletes_only_unwatched_ones() {
    let h = Harness::start().await;
    let prefix = unique_prefix("gc");
    // an identity of this test only: other tests' images in the shared pool are not ours
    let identity = format!("gc-test-{}", &prefix[5..13]);
    h.create_class("rbd", &h.params(), "Delete").await;
    let names = claim_names("gc", 3);
    let mut p = h.spawn(
        &[
            "--leader-elect=false",
            "--id",
            &identity,
            "--image-name-prefix",
            &prefix,
        ],
        &[],
    );
    h.create_claims("rbd", &names, "8Mi").await;
    h.wait_all_bound(&names, Duration::from_secs(30)).await;
    let (_, nothing) = gc(&h, &identity, false);
    assert!(nothing.contains("no orphaned images"), "{nothing}");

    // orphan 1: a PV object deleted while the provisioner is stopped
    p.kill();
    let (_, victim) = h.wait_bound(&names[0]).await;
    let victim_pv = victim.metadata.name.clone().unwrap();
    let victim_image = Harness::image_name(&victim);
    // what an admin's `kubectl delete pv --force` with the finalizers stripped does
    h.claims()
        .delete(&names[0], &DeleteParams::default())
        .await
        .unwrap();
    let strip = serde_json::json!({"metadata": {"finalizers": null}});
    h.volumes()
        .patch(&victim_pv, &PatchParams::default(), &Patch::Merge(&strip))
        .await
        .unwrap();
    h.volumes()
        .delete(&victim_pv, &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(&victim_pv).await;
    // orphan 2: an owner record naming a PV that never existed
    let made_up = format!("{prefix}made-up");
    owned_image(
        &h,
        &made_up,
        "pvc-00000000-0000-0000-0000-000000000000",
        &identity,
    );
    // orphan 3: the same, but mapped somewhere (a watcher)
    let watched = format!("{prefix}watched");
    owned_image(
        &h,
        &watched,
        "pvc-11111111-0000-0000-0000-000000000000",
        &identity,
    );
    let holder = ImageHolder::open(h.ceph, &h.ceph.pool, &watched).unwrap();
    // not orphans: another provisioner's image, and an image with no owner record
    let foreign = format!("{prefix}foreign");
    owned_image(
        &h,
        &foreign,
        "pvc-22222222-0000-0000-0000-000000000000",
        "someone-else",
    );
    let unowned = format!("{prefix}unowned");
    h.ceph
        .rbd(&[
            "create",
            &format!("{}/{unowned}", h.ceph.pool),
            "--size",
            "8M",
        ])
        .unwrap();

    let orphans: BTreeSet<String> = [victim_image.clone(), made_up.clone(), watched.clone()]
        .into_iter()
        .collect();
    let before: BTreeSet<String> = h
        .images()
        .into_iter()
        .filter(|i| i.starts_with(&prefix))
        .collect();
    let (out, text) = gc(&h, &identity, false);
    assert!(out.status.success(), "{text}");
    assert_eq!(listed(&text, &prefix), orphans, "dry run:\n{text}");
    assert!(
        text.contains(&victim_pv),
        "the dry run names the missing PV:\n{text}"
    );
    assert!(text.contains("3 orphaned image(s)"), "{text}");
    let after_dry: BTreeSet<String> = h
        .images()
        .into_iter()
        .filter(|i| i.starts_with(&prefix))
        .collect();
    assert_eq!(before, after_dry, "the dry run removed something");

    // --delete: the two unwatched orphans go, the watched one is refused and reported
    let (out, text) = gc(&h, &identity, true);
    assert!(
        !out.status.success(),
        "a refused orphan must fail the run:\n{text}"
    );
    assert!(
        text.contains("1 orphaned image(s) could not be removed"),
        "{text}"
    );
    let now: BTreeSet<String> = h
        .images()
        .into_iter()
        .filter(|i| i.starts_with(&prefix))
        .collect();
    let expected: BTreeSet<String> = before
        .iter()
        .filter(|i| **i != victim_image && **i != made_up)
        .cloned()
        .collect();
    assert_eq!(now, expected, "--delete removed the wrong images:\n{text}");
    assert!(now.contains(&watched) && now.contains(&foreign) && now.contains(&unowned));

    // released: the next run removes it and finds nothing more
    drop(holder);
    let (out, text) = gc(&h, &identity, true);
    assert!(out.status.success(), "{text}");
    assert!(!h.images().contains(&watched));
    let (_, text2) = gc(&h, &identity, false);
    assert!(text2.contains("no orphaned images"), "{text2}");
    for image in [foreign, unowned] {
        h.ceph
            .rbd(&["rm", &format!("{}/{image}", h.ceph.pool)])
            .unwrap();
    }
    // live volumes untouched
    let live = &names[1..];
    // (the owner records name our test identity, not ceph.com/rbd: checked on the PV key only)
    h.assert_converged_pv_owner(&prefix, live, 8 << 20).await;
    assert!(!text.contains(&h.ceph.admin_key) && !text2.contains(&h.ceph.admin_key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_spares_the_image_of_a_volume_being_provisioned() {
    let h = Harness::start().await;
    let prefix = unique_prefix("gr");
    let identity = format!("gc-race-{}", &prefix[5..13]);
    h.create_class("rbd", &h.params(), "Delete").await;
    let _p = h.spawn(
        &[
            "--leader-elect=false",
            "--id",
            &identity,
            "--image-name-prefix",
            &prefix,
        ],
        &[],
    );
    // the PV save takes 5 s (a slow API server): the image exists, its PV not yet
    h.emu
        .faults()
        .delay_next("create", "persistentvolumes", 1, Duration::from_secs(5));
    let claim = h.create_claim("racy", "rbd", "8Mi", false).await;
    let image = format!("{prefix}{}", claim.metadata.uid.unwrap());
    h.until("the image created", Duration::from_secs(10), || async {
        let records = h.image_records(&prefix);
        records
            .get(&image)
            .is_some_and(|r| r.meta.contains_key("provisioner.ceph.com/provisioner"))
            .then_some(())
    })
    .await;
    // the default minimum age (10 min) protects it
    let (_, text) = gc_with(&h, &identity, true, &[]);
    h.wait_all_bound(&["racy".to_string()], Duration::from_secs(30))
        .await;
    assert!(
        h.images().contains(&image),
        "gc removed the image of a volume being provisioned; the PV is Bound to nothing:\n{text}"
    );
}
