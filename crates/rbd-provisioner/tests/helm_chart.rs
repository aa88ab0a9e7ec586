//! The Helm chart, `charts/rbd-provisioner`, and the kustomize manifests in `deploy/` are one
//! product: `helm lint --strict` passes, and `helm template` renders, field for field (parsed as
//! YAML), the objects kustomize renders. With default values: `deploy/` and `deploy/csi/`, less
//! the Namespace (`helm install --create-namespace` makes it); with `csi.enabled=false`:
//! `deploy/` alone; with the cluster config and topology values: the `deploy/clusters/`
//! component on both; with the example classes switched on: `deploy/examples/`' StorageClass and
//! VolumeSnapshotClass as well. Every other value reaches the field or flag it names (the flags
//! parse with the binary's command line), and values that would install something broken are
//! refused.
//!
//! helm is the pinned build of `scripts/go-tool.sh helm` (from its Go module, cached; the first
//! call builds it); kustomize is `kubectl kustomize`, or `scripts/go-tool.sh kustomize` where
//! kubectl is not installed. Where a tool cannot be had, the tests fail in CI (`CI` or
//! `RBD_HELM_REQUIRED` set) and are skipped with a message elsewhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use clap::Parser;
use serde_yaml::Value;

const CHART: &str = "charts/rbd-provisioner";
const RELEASE: &str = "rbd-provisioner";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `scripts/go-tool.sh TOOL`: the cached binary's path, built first if missing; `None` (skip)
/// when it cannot be built outside CI, a failure in CI.
fn go_tool(tool: &str) -> Option<PathBuf> {
    let out = Command::new(repo().join("scripts/go-tool.sh"))
        .arg(tool)
        .output()
        .unwrap();
    if out.status.success() {
        return Some(PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()));
    }
    let why = format!(
        "scripts/go-tool.sh {tool} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let required = ["CI", "RBD_HELM_REQUIRED"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
    assert!(!required, "helm and kustomize are required here: {why}");
    eprintln!("SKIPPED: {why}");
    None
}

fn helm() -> Option<&'static Path> {
    static HELM: OnceLock<Option<PathBuf>> = OnceLock::new();
    HELM.get_or_init(|| go_tool("helm")).as_deref()
}

/// The kustomize command: `kubectl kustomize`, or the pinned build's `kustomize build`.
fn kustomize() -> Option<&'static [String]> {
    static KUSTOMIZE: OnceLock<Option<Vec<String>>> = OnceLock::new();
    KUSTOMIZE
        .get_or_init(|| {
            let kubectl = Command::new("kubectl")
                .args(["version", "--client"])
                .output()
                .is_ok_and(|o| o.status.success());
            if kubectl {
                return Some(vec!["kubectl".into(), "kustomize".into()]);
            }
            let path = go_tool("kustomize")?;
            Some(vec![path.to_str().unwrap().into(), "build".into()])
        })
        .as_deref()
}

/// A command's stdout as YAML documents (empty ones dropped); panics with its stderr on failure.
fn documents(command: &mut Command) -> Vec<Value> {
    let out = command.output().unwrap();
    parse(&format!("{command:?}"), &out)
}

/// The command succeeded; otherwise a panic with its output.
fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A successful command's stdout as YAML documents (empty ones dropped).
fn parse(what: &str, out: &Output) -> Vec<Value> {
    assert_success(what, out);
    let text = std::str::from_utf8(&out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|d: &Value| !d.is_null())
        .collect()
}

/// What kustomize renders for each directory (relative to the repository), concatenated.
fn kustomize_build(dirs: &[&str]) -> Option<Vec<Value>> {
    let (program, args) = kustomize()?.split_first().unwrap();
    let mut docs = Vec::new();
    for dir in dirs {
        docs.extend(documents(
            Command::new(program).args(args).arg(repo().join(dir)),
        ));
    }
    Some(docs)
}

/// The namespace deploy/ puts its objects in (its kustomization's `namespace:`).
fn deploy_namespace() -> String {
    let text = std::fs::read_to_string(repo().join("deploy/kustomization.yaml")).unwrap();
    let kustomization: Value = serde_yaml::from_str(&text).unwrap();
    kustomization["namespace"].as_str().unwrap().to_owned()
}

/// `helm ARGS... CHART` in deploy/'s namespace with these values (a values file).
fn run_helm(args: &[&str], values: &serde_json::Value) -> Option<Output> {
    let helm = helm()?;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    // JSON is YAML
    std::fs::write(&file, values.to_string()).unwrap();
    Some(
        Command::new(helm)
            .args(args)
            .arg(repo().join(CHART))
            .args(["--namespace", &deploy_namespace(), "--values"])
            .arg(&file)
            .output()
            .unwrap(),
    )
}

/// `helm template` of the chart with these values.
fn helm_template(values: &serde_json::Value) -> Option<Vec<Value>> {
    let out = run_helm(&["template", RELEASE], values)?;
    Some(parse("helm template", &out))
}

/// Objects by "Kind namespace/name" (cluster-scoped ones without a namespace). A ConfigMap's
/// `*.json` values are compared as JSON: the chart writes config.json from values, with its own
/// layout.
fn objects(docs: Vec<Value>) -> BTreeMap<String, Value> {
    let mut objects = BTreeMap::new();
    for mut doc in docs {
        let meta = &doc["metadata"];
        let key = format!(
            "{} {}/{}",
            doc["kind"].as_str().unwrap(),
            meta["namespace"].as_str().unwrap_or(""),
            meta["name"].as_str().unwrap()
        );
        if doc["kind"] == "ConfigMap"
            && let Some(Value::Mapping(data)) = doc.get_mut("data")
        {
            for (key, value) in data.iter_mut() {
                if key.as_str().is_some_and(|k| k.ends_with(".json")) {
                    let json: serde_json::Value =
                        serde_json::from_str(value.as_str().unwrap()).unwrap();
                    *value = serde_yaml::to_value(json).unwrap();
                }
            }
        }
        assert!(
            objects.insert(key.clone(), doc).is_none(),
            "{key} rendered twice"
        );
    }
    objects
}

/// Every place where two values differ, as "path: left != right" (each value in JSON; a key on
/// one side only is "absent" on the other, even where the other side has it null).
fn differences(path: &str, left: &Value, right: &Value, out: &mut Vec<String>) {
    let json = |v: &Value| serde_json::to_string(v).unwrap();
    match (left, right) {
        (Value::Mapping(l), Value::Mapping(r)) => {
            let mut keys: Vec<&Value> = l.keys().collect();
            keys.extend(r.keys().filter(|k| !l.contains_key(*k)));
            for key in keys {
                let at = format!(
                    "{path}.{}",
                    key.as_str().map_or_else(|| json(key), str::to_owned)
                );
                match (l.get(key), r.get(key)) {
                    (Some(l), Some(r)) => differences(&at, l, r, out),
                    (Some(l), None) => out.push(format!("{at}: {} != absent", json(l))),
                    (None, Some(r)) => out.push(format!("{at}: absent != {}", json(r))),
                    (None, None) => unreachable!("a key of either side"),
                }
            }
        }
        (Value::Sequence(l), Value::Sequence(r)) if l.len() == r.len() => {
            for (i, (l, r)) in l.iter().zip(r).enumerate() {
                differences(&format!("{path}[{i}]"), l, r, out);
            }
        }
        _ if left != right => out.push(format!("{path}: {} != {}", json(left), json(right))),
        _ => {}
    }
}

/// The chart's objects are kustomize's: the same set, each the same content.
fn assert_same_objects(chart: &BTreeMap<String, Value>, kustomize: &BTreeMap<String, Value>) {
    let mut problems = Vec::new();
    for key in kustomize.keys().filter(|k| !chart.contains_key(*k)) {
        problems.push(format!("{key}: rendered by kustomize, not by the chart"));
    }
    for key in chart.keys().filter(|k| !kustomize.contains_key(*k)) {
        problems.push(format!("{key}: rendered by the chart, not by kustomize"));
    }
    for (key, object) in chart {
        if let Some(expected) = kustomize.get(key) {
            let mut diffs = Vec::new();
            differences("", object, expected, &mut diffs);
            problems.extend(
                diffs
                    .iter()
                    .map(|d| format!("{key}{d} (chart != kustomize)")),
            );
        }
    }
    assert!(
        problems.is_empty(),
        "the chart and deploy/ differ:\n{}",
        problems.join("\n")
    );
}

/// kustomize's objects less deploy/namespace.yaml's Namespace, which must be a bare one (so
/// that `helm install --create-namespace` makes the same).
fn without_the_namespace(mut objects: BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    let namespace = objects
        .remove(&format!("Namespace /{}", deploy_namespace()))
        .expect("deploy/ creates its namespace");
    let bare: Value = serde_yaml::from_str(&format!(
        "{{apiVersion: v1, kind: Namespace, metadata: {{name: {}}}}}",
        deploy_namespace()
    ))
    .unwrap();
    assert_eq!(
        namespace, bare,
        "deploy/'s Namespace has more than `helm install --create-namespace` would make"
    );
    objects
}

#[test]
fn helm_lint_strict_passes_with_default_values_and_with_every_option() {
    for values in [serde_json::json!({}), every_option()] {
        let Some(out) = run_helm(&["lint", "--strict"], &values) else {
            return;
        };
        assert_success(&format!("helm lint --strict with {values}"), &out);
    }
}

#[test]
fn default_values_render_the_objects_of_deploy_and_deploy_csi() {
    let Some(chart) = helm_template(&serde_json::json!({})) else {
        return;
    };
    let Some(kustomize) = kustomize_build(&["deploy", "deploy/csi"]) else {
        return;
    };
    assert_same_objects(&objects(chart), &without_the_namespace(objects(kustomize)));
}

#[test]
fn without_csi_the_chart_renders_the_objects_of_deploy_alone() {
    let Some(chart) = helm_template(&serde_json::json!({"csi": {"enabled": false}})) else {
        return;
    };
    let Some(kustomize) = kustomize_build(&["deploy"]) else {
        return;
    };
    assert_same_objects(&objects(chart), &without_the_namespace(objects(kustomize)));
}

/// The cluster config of deploy/clusters/config.yaml given as values, with the component's
/// topology label: the objects of an overlay of deploy/ and deploy/csi/ with that component.
#[test]
fn cluster_config_values_render_the_clusters_component() {
    let text = std::fs::read_to_string(repo().join("deploy/clusters/config.yaml")).unwrap();
    let config_map: Value = serde_yaml::from_str(&text).unwrap();
    let clusters: serde_json::Value =
        serde_json::from_str(config_map["data"]["config.json"].as_str().unwrap()).unwrap();
    let Some(chart) = helm_template(&serde_json::json!({
        "clusterConfig": {"enabled": true, "clusters": clusters},
        "topologyLabels": ["topology.kubernetes.io/zone"],
    })) else {
        return;
    };
    // an overlay inside deploy/ would be a cycle for kustomize, so a temporary one beside it
    let overlay = tempfile::Builder::new()
        .prefix(".kustomize-helm-")
        .tempdir_in(repo())
        .unwrap();
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        "resources: [../deploy, ../deploy/csi]\ncomponents: [../deploy/clusters]\n",
    )
    .unwrap();
    let Some(kustomize) = kustomize_build(&[overlay.path().to_str().unwrap()]) else {
        return;
    };
    let kustomize = without_the_namespace(objects(kustomize));
    assert!(kustomize.contains_key("ConfigMap rbd-provisioner/ceph-csi-config"));
    assert_same_objects(&objects(chart), &kustomize);
}

/// The example StorageClass and VolumeSnapshotClass, switched on (the class with the examples'
/// monitors placeholder): the default objects plus deploy/examples/' two classes.
#[test]
fn example_class_values_render_the_classes_of_deploy_examples() {
    let Some(chart) = helm_template(&serde_json::json!({
        "storageClass": {"create": true, "parameters": {"monitors": "MONITORS"}},
        "volumeSnapshotClass": {"create": true},
    })) else {
        return;
    };
    let Some(base) = kustomize_build(&["deploy", "deploy/csi"]) else {
        return;
    };
    let mut expected = without_the_namespace(objects(base));
    let examples =
        objects(kustomize_build(&["deploy/examples", "deploy/examples/snapshots"]).unwrap());
    for key in ["StorageClass /rbd", "VolumeSnapshotClass /rbd-snapshots"] {
        let class = examples
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in deploy/examples"));
        expected.insert(key.to_owned(), class.clone());
    }
    assert_same_objects(&objects(chart), &expected);
}

/// Values that set every option away from its default (no cluster config created: the one in
/// the namespace is used).
fn every_option() -> serde_json::Value {
    let scheduling = serde_json::json!({
        "nodeSelector": {"example.com/storage": "yes"},
        "tolerations": [{"key": "example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}},
        "priorityClassName": "system-cluster-critical",
        // complete: Helm merges a map given with the default's (set a key null to drop it)
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    });
    let mut controller = scheduling.clone();
    controller.as_object_mut().unwrap().extend(
        serde_json::json!({
            "replicas": 3,
            "provisionerName": "example.com/rbd",
            "logFormat": "text",
            "extraArgs": ["--pv-source=csi"],
            "extraEnv": [{"name": "RUST_LOG", "value": "debug"}],
            "hostNetwork": true,
        })
        .as_object()
        .unwrap()
        .clone(),
    );
    let mut node = scheduling;
    node.as_object_mut().unwrap().extend(
        serde_json::json!({
            "defaultMounter": "fuse",
            "krbdMapOptions": "ms_mode=secure",
            "daemonCgroup": "",
            "logFormat": "text",
            "extraArgs": ["--max-volumes-per-node=16"],
        })
        .as_object()
        .unwrap()
        .clone(),
    );
    serde_json::json!({
        "image": {
            "controller": {"repository": "registry.example/rbd-provisioner", "tag": "v1", "pullPolicy": "Always"},
            "node": {"repository": "registry.example/rbd-provisioner-node", "tag": "v1", "pullPolicy": "Always"},
        },
        "imagePullSecrets": [{"name": "registry"}],
        "controller": controller,
        "metrics": {"port": 9090, "service": {"enabled": true, "annotations": {"prometheus.io/scrape": "true"}}},
        "csi": {"node": node},
        "topologyLabels": ["topology.kubernetes.io/zone", "topology.kubernetes.io/region"],
        "clusterConfig": {"enabled": true, "create": false},
        "storageClass": {
            "create": true,
            "name": "rbd-site-a",
            "volumeBindingMode": "WaitForFirstConsumer",
            "parameters": {"clusterID": "site-a", "pool": "kube"},
        },
        "volumeSnapshotClass": {"create": true, "secretName": "ceph-admin-b", "secretNamespace": "ceph"},
    })
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// Every value reaches the field or flag it names, and the flags are the binary's own (its
/// command line parses them).
#[test]
fn every_option_reaches_its_field_and_flag() {
    let values = every_option();
    let Some(docs) = helm_template(&values) else {
        return;
    };
    let objects = objects(docs);
    let get = |key: &str| {
        objects
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in {:?}", objects.keys()))
    };
    let as_yaml = |v: &serde_json::Value| serde_yaml::to_value(v).unwrap();
    // no ConfigMap: clusterConfig.create=false reads the one already there
    assert!(!objects.keys().any(|k| k.starts_with("ConfigMap ")));

    let deployment = get("Deployment rbd-provisioner/rbd-provisioner");
    assert_eq!(deployment["spec"]["replicas"], 3);
    for (pod, (of, container)) in [
        (
            &deployment["spec"]["template"]["spec"],
            ("controller", "controller"),
        ),
        (
            &get("DaemonSet rbd-provisioner/rbd-csi-node")["spec"]["template"]["spec"],
            ("node", "csi"),
        ),
    ] {
        let given = if container == "csi" {
            &values["csi"]["node"]
        } else {
            &values["controller"]
        };
        for field in [
            "nodeSelector",
            "tolerations",
            "affinity",
            "priorityClassName",
        ] {
            assert_eq!(pod[field], as_yaml(&given[field]), "{of}: {field}");
        }
        assert_eq!(
            pod["imagePullSecrets"],
            as_yaml(&values["imagePullSecrets"])
        );
        let c = &pod["containers"][0];
        assert_eq!(
            c["image"],
            format!(
                "registry.example/{}:v1",
                if of == "node" {
                    "rbd-provisioner-node"
                } else {
                    "rbd-provisioner"
                }
            )
        );
        assert_eq!(c["imagePullPolicy"], "Always");
        assert_eq!(c["resources"], as_yaml(&given["resources"]));
        let args = strings(&c["args"]);
        assert_eq!(
            args.last(),
            given["extraArgs"][0].as_str().map(str::to_owned).as_ref()
        );
        assert!(args.contains(&"--log-format=text".to_owned()), "{args:?}");
        assert!(
            args.contains(
                &"--topology-labels=topology.kubernetes.io/zone,topology.kubernetes.io/region"
                    .to_owned()
            ),
            "{of}: {args:?}"
        );
    }

    // the controller: its flags parse, and read what the values say
    let c = &deployment["spec"]["template"]["spec"]["containers"][0];
    let cli = rbd_provisioner::cli::Cli::try_parse_from(
        std::iter::once("rbd-provisioner".to_owned()).chain(strings(&c["args"])),
    )
    .unwrap();
    assert_eq!(cli.provisioner.metrics_port, 9090);
    assert_eq!(
        cli.provisioner.cluster_config.as_deref(),
        Some(Path::new("/etc/ceph-csi-config/config.json"))
    );
    assert_eq!(c["ports"][0]["containerPort"], 9090);
    assert_eq!(c["env"][0]["name"], "PROVISIONER_NAME");
    assert_eq!(c["env"][0]["value"], "example.com/rbd");
    let env = c["env"].as_sequence().unwrap();
    assert_eq!(env.last().unwrap()["name"], "RUST_LOG", "{env:?}");
    assert_eq!(env.last().unwrap()["value"], "debug");
    assert_eq!(deployment["spec"]["template"]["spec"]["hostNetwork"], true);

    // the node plugin: the mappers' flags parse; no --daemon-cgroup when it is empty
    let node = &get("DaemonSet rbd-provisioner/rbd-csi-node")["spec"]["template"]["spec"];
    let node_args = strings(&node["containers"][0]["args"]);
    assert!(!node_args.iter().any(|a| a.starts_with("--daemon-cgroup")));
    let cli = rbd_provisioner::cli::Cli::try_parse_from(
        ["rbd-provisioner".to_owned(), "csi".to_owned()]
            .into_iter()
            .chain(node_args.iter().cloned()),
    )
    .unwrap();
    let Some(rbd_provisioner::cli::Command::Csi(csi)) = cli.command else {
        panic!("not the csi subcommand")
    };
    assert_eq!(csi.default_mounter, rbd_csi::MounterKind::FuseLoop);
    assert_eq!(csi.krbd_map_options.as_deref(), Some("ms_mode=secure"));
    assert_eq!(csi.max_volumes_per_node, 16);

    let service = get("Service rbd-provisioner/rbd-provisioner-metrics");
    assert_eq!(service["spec"]["ports"][0]["port"], 9090);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        service["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );

    // the class: the provisioner's name, the mode, the parameters given and the defaults kept,
    // monitors (empty by default) left out
    let class = get("StorageClass /rbd-site-a");
    assert_eq!(class["provisioner"], "example.com/rbd");
    assert_eq!(class["volumeBindingMode"], "WaitForFirstConsumer");
    let params = &class["parameters"];
    assert_eq!(params["clusterID"], "site-a");
    assert_eq!(params["pool"], "kube");
    assert_eq!(params["imageFormat"], "2");
    assert!(params.get("monitors").is_none(), "{params:?}");
    let snapshots = get("VolumeSnapshotClass /rbd-snapshots");
    assert_eq!(
        snapshots["parameters"]["csi.storage.k8s.io/snapshotter-secret-name"],
        "ceph-admin-b"
    );
    assert_eq!(
        snapshots["parameters"]["csi.storage.k8s.io/snapshotter-secret-namespace"],
        "ceph"
    );
}

/// Values that would install something broken are refused by `helm template`, naming the value.
#[test]
fn a_class_without_monitors_a_config_without_clusters_and_no_metrics_port_are_refused() {
    for (values, named) in [
        (
            serde_json::json!({"storageClass": {"create": true}}),
            "storageClass.parameters",
        ),
        (
            serde_json::json!({"clusterConfig": {"enabled": true}}),
            "clusterConfig.clusters",
        ),
        (serde_json::json!({"metrics": {"port": 0}}), "metrics.port"),
    ] {
        let Some(out) = run_helm(&["template", RELEASE], &values) else {
            return;
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(named),
            "{values}: {}, {stderr}",
            out.status
        );
    }
}
