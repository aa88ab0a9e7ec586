//! The manifests in deploy/ render with kustomize and say what the README promises.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `kubectl kustomize DIR` as YAML documents; `None` when kubectl is not installed.
fn render(dir: &str) -> Option<Vec<serde_yaml::Value>> {
    let out = match Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join(dir))
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("kubectl not installed: skipping");
            return None;
        }
        Err(e) => panic!("{e}"),
    };
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect(),
    )
}

fn find<'a>(docs: &'a [serde_yaml::Value], kind: &str, name: &str) -> &'a serde_yaml::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn the_base_renders_a_leader_elected_deployment_with_least_privilege() {
    let Some(docs) = render("deploy") else { return };
    let deployment = find(&docs, "Deployment", "rbd-provisioner");
    assert_eq!(deployment["metadata"]["namespace"], "rbd-provisioner");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let args = pod["containers"][0]["args"].as_sequence().unwrap();
    assert!(args.iter().any(|a| a == "--leader-elect=true"));

    let role = find(&docs, "ClusterRole", "rbd-provisioner");
    for rule in role["rules"].as_sequence().unwrap() {
        let resources = rule["resources"].as_sequence().unwrap();
        let verbs: Vec<&str> = rule["verbs"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(!verbs.contains(&"*"), "wildcard verbs in {rule:?}");
        if resources.iter().any(|r| r == "secrets") {
            assert_eq!(verbs, vec!["get"], "secrets must be get-only");
        }
    }
    let leases = find(&docs, "Role", "rbd-provisioner-leader-election");
    assert_eq!(leases["metadata"]["namespace"], "rbd-provisioner");
}

#[test]
fn the_csi_overlay_and_examples_render() {
    let Some(csi) = render("deploy/csi") else {
        return;
    };
    let driver = find(&csi, "CSIDriver", "rbd.provisioner.ceph.io");
    assert_eq!(driver["spec"]["attachRequired"], false);
    let node = find(&csi, "DaemonSet", "rbd-csi-node");
    let args = node["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .unwrap();
    assert!(args.iter().any(|a| a == "--register=true"));
    let Some(examples) = render("deploy/examples") else {
        return;
    };
    let class = find(&examples, "StorageClass", "rbd");
    assert_eq!(class["provisioner"], "ceph.com/rbd");
    find(&examples, "PersistentVolumeClaim", "data-block");
}
