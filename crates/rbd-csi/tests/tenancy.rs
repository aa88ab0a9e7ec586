//! One Ceph user per tenant, its caps restricted to the tenant's RADOS namespace
//! (`profile rbd pool=P namespace=N`), as docs/tenancy.md and deploy/examples/tenants set it up:
//! the controller creates the volume in the namespace with the provisioner's key, the node
//! stages, publishes and writes it with the tenant's key (fuse mapper, micro-ceph), and another
//! tenant's key is refused before anything is mapped.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::controller::{MIB, create_request, server};
use common::{NodeCleanup, TestServer, fuse_processes_under, loops_under, mount_cap, strings};
use rbd_csi::proto::csi;
use tonic::Code;

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

/// A tenant: a RADOS namespace of the test pool and a Ceph user whose caps stop at it.
struct Tenant {
    user: String,
    key: String,
}

impl Tenant {
    fn create(name: &str) -> Self {
        let cluster = micro_ceph::cluster();
        cluster
            .rbd(&["namespace", "create", &format!("{}/{name}", cluster.pool)])
            .unwrap();
        let entity = format!("client.{name}");
        let osd_caps = format!("profile rbd pool={} namespace={name}", cluster.pool);
        let out = cluster
            .cli("ceph")
            .args(["auth", "get-or-create", &entity, "mon", "profile rbd"])
            .args(["osd", &osd_caps])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = cluster
            .cli("ceph")
            .args(["auth", "print-key", &entity])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            user: name.to_owned(),
            key: String::from_utf8(out.stdout).unwrap().trim().to_owned(),
        }
    }

    fn secrets(&self) -> HashMap<String, String> {
        strings(&[("userID", &self.user), ("userKey", &self.key)])
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let cluster = micro_ceph::cluster();
        let _ = cluster
            .cli("ceph")
            .args(["auth", "rm", &format!("client.{}", self.user)])
            .output();
        let _ = cluster.rbd(&[
            "namespace",
            "remove",
            &format!("{}/{}", cluster.pool, self.user),
        ]);
    }
}

struct Paths {
    staging: PathBuf,
    target: PathBuf,
}

fn stage_request(
    volume: &csi::Volume,
    paths: &Paths,
    secrets: HashMap<String, String>,
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        staging_target_path: paths.staging.display().to_string(),
        volume_capability: Some(mount_cap("ext4")),
        secrets,
        volume_context: volume.volume_context.clone(),
        publish_context: HashMap::new(),
    }
}

#[tokio::test]
async fn a_tenant_user_limited_to_its_namespace_stages_and_writes_its_volume_and_no_other() {
    let server: TestServer = server().await;
    let _cleanup = NodeCleanup {
        dirs: vec![server.dir.path().to_path_buf()],
    };
    let a = Tenant::create(&unique("tenant-a"));
    let b = Tenant::create(&unique("tenant-b"));

    let mut request = create_request("pvc-tenant-a", 64 * MIB);
    request
        .parameters
        .insert("radosNamespace".into(), a.user.clone());
    let mut controller = server.controller().await;
    let volume = controller
        .create_volume(request)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let cluster = micro_ceph::cluster();
    let in_a = cluster
        .rbd(&["ls", &format!("{}/{}", cluster.pool, a.user)])
        .unwrap();
    assert_eq!(
        in_a.lines().count(),
        1,
        "images in tenant a's namespace: {in_a}"
    );

    let root = server.dir.path().join("tenant-a");
    let paths = Paths {
        staging: root.join("globalmount"),
        target: root.join("pod").join("mount"),
    };
    let mut node = server.node().await;

    // Tenant b's key cannot open tenant a's image: refused before anything is mapped.
    let err = node
        .node_stage_volume(stage_request(&volume, &paths, b.secrets()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        !err.message().contains(&b.key),
        "the key is quoted: {err:?}"
    );
    assert!(loops_under(server.dir.path()).is_empty());
    assert!(fuse_processes_under(server.dir.path()).is_empty());

    // Tenant a's own key: stage, publish, write, read back after a restage.
    node.node_stage_volume(stage_request(&volume, &paths, a.secrets()))
        .await
        .unwrap();
    let publish = csi::NodePublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        staging_target_path: paths.staging.display().to_string(),
        target_path: paths.target.display().to_string(),
        volume_capability: Some(mount_cap("ext4")),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    };
    node.node_publish_volume(publish.clone()).await.unwrap();
    std::fs::write(paths.target.join("owner.txt"), "tenant a").unwrap();
    let unpublish = csi::NodeUnpublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        target_path: paths.target.display().to_string(),
    };
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        staging_target_path: paths.staging.display().to_string(),
    };
    node.node_unpublish_volume(unpublish.clone()).await.unwrap();
    node.node_unstage_volume(unstage.clone()).await.unwrap();
    node.node_stage_volume(stage_request(&volume, &paths, a.secrets()))
        .await
        .unwrap();
    node.node_publish_volume(publish).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(paths.target.join("owner.txt")).unwrap(),
        "tenant a"
    );
    node.node_unpublish_volume(unpublish).await.unwrap();
    node.node_unstage_volume(unstage).await.unwrap();
    assert!(loops_under(server.dir.path()).is_empty());

    // Tenant a's key cannot reach the pool's default namespace (the caps hold).
    let keyfile = server.dir.path().join("tenant-a.key");
    std::fs::write(&keyfile, &a.key).unwrap();
    let listing = cluster
        .cli("rbd")
        .args(["ls", &cluster.pool, "--id", &a.user, "--keyfile"])
        .arg(&keyfile)
        .output()
        .unwrap();
    std::fs::remove_file(&keyfile).unwrap();
    assert!(
        !listing.status.success(),
        "tenant a listed the default namespace"
    );

    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: volume.volume_id.clone(),
            secrets: common::controller::secrets(),
        })
        .await
        .unwrap();
}
