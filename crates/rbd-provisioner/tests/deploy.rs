//! The manifests in deploy/ render with kustomize and say what the README promises.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;

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
    // What the "restricted" Pod Security level requires of the pod and its container.
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &pod["containers"][0]["securityContext"];
    assert_eq!(container["allowPrivilegeEscalation"], false);
    assert_eq!(container["capabilities"]["drop"][0], "ALL");
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
    assert_eq!(driver["spec"]["attachRequired"], true);
    let node = find(&csi, "DaemonSet", "rbd-csi-node");
    let args = node["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .unwrap();
    assert!(args.iter().any(|a| a == "--register=true"));
    // the KMS config of encrypted volumes at --kms-config's default path, from ceph-csi's ConfigMap
    let mounts = node["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap();
    assert!(mounts.iter().any(|m| {
        m["name"] == "ceph-csi-encryption-kms-config"
            && m["mountPath"] == "/etc/ceph-csi-encryption-kms-config"
    }));
    if let Some(encryption) = render("deploy/examples/encryption") {
        let config = find(&encryption, "ConfigMap", "ceph-csi-encryption-kms-config");
        let text = config["data"]["config.json"].as_str().unwrap();
        let kms = rbd_volume::encryption::KmsConfig::parse("config.json", text).unwrap();
        assert!(kms.kms("plain").is_ok());
        for id in ["wrapped", "per-volume"] {
            // well-formed entries that read Secrets: refused only for want of API access here
            let err = kms.kms(id).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("Kubernetes API"), "{id}: {err}");
        }
        find(&encryption, "StorageClass", "rbd-encrypted");
        // the built-in provisioner's class parses, encrypted, with a KMS entry the config has
        let builtin = find(&encryption, "StorageClass", "rbd-encrypted-builtin");
        assert_eq!(builtin["provisioner"], "ceph.com/rbd");
        let raw: std::collections::BTreeMap<String, String> =
            serde_yaml::from_value(builtin["parameters"].clone()).unwrap();
        let params = rbd_provisioner::backend::params::Parameters::parse(&raw).unwrap();
        let encryption = params.encryption.expect("an encrypted class");
        assert!(
            kms.kms(&encryption.kms_id)
                .is_err_and(|e| e.to_string().contains("Kubernetes API"))
        );
    }
    let Some(examples) = render("deploy/examples") else {
        return;
    };
    let class = find(&examples, "StorageClass", "rbd");
    assert_eq!(class["provisioner"], "ceph.com/rbd");
    find(&examples, "PersistentVolumeClaim", "data-block");
}

/// The cluster-config component on the base, as an operator's overlay would combine them (an
/// overlay inside deploy/ would be a cycle for kustomize, so a temporary one beside it).
#[test]
fn the_clusters_component_mounts_the_config_the_flag_names_and_its_classes_parse() {
    let overlay = tempfile::Builder::new()
        .prefix(".kustomize-clusters-")
        .tempdir_in(repo())
        .unwrap();
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        "resources: [../deploy, ../deploy/csi]\ncomponents: [../deploy/clusters]\n",
    )
    .unwrap();
    let Some(docs) = render(overlay.path().to_str().unwrap()) else {
        return;
    };
    let deployment = find(&docs, "Deployment", "rbd-provisioner");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<String> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let cli = rbd_provisioner::cli::Cli::try_parse_from(
        std::iter::once("rbd-provisioner".to_string()).chain(args),
    )
    .unwrap();
    let path = cli.provisioner.cluster_config.expect("--cluster-config");
    assert_eq!(
        cli.provisioner.topology_labels.0,
        ["topology.kubernetes.io/zone"]
    );
    // the flag's directory is a mount (no subPath: the kubelet then updates it) of a ConfigMap in
    // the provisioner's namespace whose key is the flag's file name
    let mount = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == path.parent().unwrap())
        .expect("a mount of the --cluster-config directory");
    assert!(mount["subPath"].is_null());
    // the base's mount of the KMS configuration (--kms-config's default) stays beside it
    let kms_dir = cli.provisioner.kms_config.parent().unwrap();
    let mounts = container["volumeMounts"].as_sequence().unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| Path::new(m["mountPath"].as_str().unwrap()) == kms_dir),
        "a mount of the --kms-config directory: {mounts:?}"
    );
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let config_map = find(
        &docs,
        "ConfigMap",
        volume["configMap"]["name"].as_str().unwrap(),
    );
    assert_eq!(
        config_map["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
    let file = path.file_name().unwrap().to_str().unwrap();
    let config =
        rbd_volume::clusters::ClusterConfig::parse(config_map["data"][file].as_str().unwrap())
            .unwrap();

    // the CSI node plugin: the same ConfigMap at the default path its csi subcommand reads, the
    // same topology labels, and RBAC to read its Node
    let node = find(&docs, "DaemonSet", "rbd-csi-node");
    let node_pod = &node["spec"]["template"]["spec"];
    let node_args = node_pod["containers"][0]["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string());
    let node_cli = rbd_provisioner::cli::Cli::try_parse_from(
        ["rbd-provisioner".to_string(), "csi".to_string()]
            .into_iter()
            .chain(node_args),
    )
    .unwrap();
    let Some(rbd_provisioner::cli::Command::Csi(csi)) = node_cli.command else {
        panic!("not the csi subcommand")
    };
    assert_eq!(csi.topology_labels, "topology.kubernetes.io/zone");
    let node_mount = node_pod["containers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| {
            m["mountPath"]
                == rbd_volume::clusters::DEFAULT_PATH
                    .rsplit_once('/')
                    .unwrap()
                    .0
        })
        .expect("the cluster config mounted at the csi subcommand's default path");
    let node_volume = node_pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == node_mount["name"])
        .unwrap();
    assert_eq!(
        node_volume["configMap"]["name"],
        volume["configMap"]["name"]
    );
    assert_eq!(node_volume["configMap"]["optional"], true);
    let binding = find(&docs, "ClusterRoleBinding", "rbd-csi-node");
    assert_eq!(
        binding["subjects"][0]["name"],
        node_pod["serviceAccountName"]
    );
    assert_eq!(
        binding["subjects"][0]["namespace"],
        node["metadata"]["namespace"]
    );
    let role = find(
        &docs,
        "ClusterRole",
        binding["roleRef"]["name"].as_str().unwrap(),
    );
    assert_eq!(
        role["rules"],
        serde_yaml::from_str::<serde_yaml::Value>(
            "[{apiGroups: [''], resources: [nodes], verbs: [get]},
              {apiGroups: [''], resources: [secrets], verbs: [get]},
              {apiGroups: [csiaddons.openshift.io], resources: [reclaimspacejobs],
               verbs: [get, list, watch, patch]}]"
        )
        .unwrap()
    );

    // the example classes parse, and name clusters of that config
    let Some(classes) = render("deploy/examples/clusters") else {
        return;
    };
    assert_eq!(classes.len(), 3);
    for class in &classes {
        let params: std::collections::BTreeMap<String, String> =
            serde_yaml::from_value(class["parameters"].clone()).unwrap();
        let parsed = rbd_provisioner::backend::params::Parameters::parse(&params)
            .unwrap_or_else(|e| panic!("{:?}: {e}", class["metadata"]["name"]));
        let id = parsed.cluster_id.expect("clusterID");
        assert!(config.lookup(&id).is_ok(), "{id}");
    }
}

/// The tenant example: its class parses, keeps the tenant's images in the tenant's RADOS
/// namespace, maps them with the tenant's own user whose key is in the tenant's namespace, and
/// the quota names that class.
#[test]
fn the_tenant_example_gives_a_tenant_its_namespace_user_and_secret() {
    let Some(docs) = render("deploy/examples/tenants") else {
        return;
    };
    let class = find(&docs, "StorageClass", "rbd-team-a");
    let mut params: std::collections::BTreeMap<String, String> =
        serde_yaml::from_value(class["parameters"].clone()).unwrap();
    params.insert("monitors".into(), "10.0.0.1:3300".into());
    let parsed = rbd_provisioner::backend::params::Parameters::parse(&params).unwrap();
    assert_eq!(parsed.rados_namespace.as_deref(), Some("team-a"));
    assert_eq!(parsed.user_id, "team-a");
    assert_eq!(parsed.user_secret_namespace.as_deref(), Some("team-a"));
    assert_ne!(parsed.admin_id, parsed.user_id);
    let quota = find(&docs, "ResourceQuota", "no-rbd-team-a");
    assert_ne!(quota["metadata"]["namespace"], "team-a");
    assert_eq!(
        quota["spec"]["hard"]["rbd-team-a.storageclass.storage.k8s.io/persistentvolumeclaims"],
        "0"
    );
}
