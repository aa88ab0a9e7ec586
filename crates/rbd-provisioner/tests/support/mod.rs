//! End-to-end harness: the real `rbd-provisioner` binary as a process, the project's Kubernetes
//! API emulator serving on a loopback port, and the test binary's micro-ceph cluster.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use kube_emulator::{Emulator, ServerHandle};
use serde_json::json;

pub const ADMIN_SECRET: &str = "ceph-admin";
pub const ADMIN_SECRET_NS: &str = "kube-system";

pub struct Harness {
    pub emu: Emulator,
    pub client: Client,
    pub kubeconfig: PathBuf,
    pub ceph: &'static micro_ceph::MicroCeph,
    pub dir: tempfile::TempDir,
    _server: ServerHandle,
}

/// A running provisioner process; killed on drop. Its log is printed if the test panics.
pub struct Process {
    child: Child,
    pub log: PathBuf,
}

impl Process {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a node failure or OOM kill would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit by itself (e.g. at a crash point).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // SIGTERM first: a graceful stop releases the lease
        unsafe_term(self.child.id());
        if self.wait_exit(Duration::from_secs(5)).is_none() {
            self.kill();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- provisioner log {} ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

fn unsafe_term(pid: u32) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
}

impl Harness {
    pub async fn start() -> Harness {
        let ceph = micro_ceph::cluster();
        let emu = Emulator::new();
        let server = emu.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let client = emu.client();
        let h = Harness {
            emu,
            client,
            kubeconfig,
            ceph,
            dir,
            _server: server,
        };
        h.create_namespace(ADMIN_SECRET_NS).await;
        h.create_secret(ADMIN_SECRET_NS, ADMIN_SECRET, &[("key", &ceph.admin_key)])
            .await;
        h
    }

    pub async fn create_namespace(&self, name: &str) {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let ns = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("{e}"),
        }
    }

    pub async fn create_secret(&self, ns: &str, name: &str, data: &[(&str, &str)]) {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let string_data: BTreeMap<&str, &str> = data.iter().copied().collect();
        let secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "type": "kubernetes.io/rbd",
            "stringData": string_data,
        }))
        .unwrap();
        api.create(&PostParams::default(), &secret).await.unwrap();
    }

    /// Starts the provisioner with `args` (after --kubeconfig) and extra environment.
    pub fn spawn(&self, args: &[&str], env: &[(&str, &str)]) -> Process {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = self.dir.path().join(format!("provisioner-{n}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let level: &[&str] = if args.contains(&"--log-level") {
            &[]
        } else {
            &[
                "--log-level",
                "info,provisioner=debug,rbd_provisioner=debug",
            ]
        };
        let child = Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(level)
            .args(args)
            .envs(env.iter().copied())
            .env_remove("RUST_LOG")
            .env_remove("PROVISIONER_NAME")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Process { child, log }
    }

    /// The provisioner with fast retries and no leader election (one replica).
    pub fn spawn_default(&self) -> Process {
        self.spawn(
            &[
                "--leader-elect=false",
                "--retry-interval-start=200ms",
                "--retry-interval-max=2s",
            ],
            &[],
        )
    }

    /// The class parameters an old-provisioner user would write for this cluster.
    pub fn params(&self) -> Vec<(String, String)> {
        [
            ("monitors", self.ceph.monitors.as_str()),
            ("pool", self.ceph.pool.as_str()),
            ("adminId", "admin"),
            ("adminSecretNamespace", ADMIN_SECRET_NS),
            ("adminSecretName", ADMIN_SECRET),
            ("userId", "admin"),
            ("userSecretNamespace", ADMIN_SECRET_NS),
            ("userSecretName", ADMIN_SECRET),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    pub async fn create_class(&self, name: &str, params: &[(String, String)], reclaim: &str) {
        let api: Api<StorageClass> = Api::all(self.client.clone());
        let params: BTreeMap<&str, &str> = params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let class = serde_json::from_value(json!({
            "metadata": {"name": name},
            "provisioner": "ceph.com/rbd",
            "reclaimPolicy": reclaim,
            "allowVolumeExpansion": true,
            "parameters": params,
        }))
        .unwrap();
        api.create(&PostParams::default(), &class).await.unwrap();
    }

    pub async fn create_claim(
        &self,
        name: &str,
        class: &str,
        size: &str,
        block: bool,
    ) -> PersistentVolumeClaim {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), "default");
        let claim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "storageClassName": class,
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": if block { "Block" } else { "Filesystem" },
                "resources": {"requests": {"storage": size}},
            }
        }))
        .unwrap();
        api.create(&PostParams::default(), &claim).await.unwrap()
    }

    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// Polls until `check` gives `Some`, or panics after `timeout` with `what`.
    pub async fn until<T, F, Fut>(&self, what: &str, timeout: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let end = Instant::now() + timeout;
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(
                Instant::now() < end,
                "timed out after {timeout:?} waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn wait_bound(&self, claim: &str) -> (PersistentVolumeClaim, PersistentVolume) {
        let claims = self.claims();
        let c = self
            .until(
                &format!("claim {claim} Bound"),
                Duration::from_secs(30),
                || {
                    let claims = claims.clone();
                    async move {
                        let c = claims.get(claim).await.ok()?;
                        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
                    }
                },
            )
            .await;
        let pv_name = c.spec.as_ref().unwrap().volume_name.clone().unwrap();
        let pv = self.volumes().get(&pv_name).await.unwrap();
        (c, pv)
    }

    pub async fn wait_pv_gone(&self, name: &str) {
        let volumes = self.volumes();
        self.until(
            &format!("PV {name} deleted"),
            Duration::from_secs(30),
            || {
                let volumes = volumes.clone();
                async move { matches!(volumes.get_opt(name).await, Ok(None)).then_some(()) }
            },
        )
        .await;
    }

    /// Events about `object` (any kind), newest last.
    pub async fn events_for(&self, object: &str) -> Vec<Event> {
        let api: Api<Event> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("involvedObject.name={object}"));
        api.list(&lp).await.map(|l| l.items).unwrap_or_default()
    }

    /// Waits for an event with `reason` about `object` and returns its message.
    pub async fn wait_event(&self, object: &str, reason: &str) -> String {
        self.until(
            &format!("event {reason} on {object}"),
            Duration::from_secs(30),
            || async {
                self.events_for(object)
                    .await
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some(reason))
                    .and_then(|e| e.message)
            },
        )
        .await
    }

    pub fn image_name(pv: &PersistentVolume) -> String {
        let spec = pv.spec.as_ref().unwrap();
        if let Some(rbd) = &spec.rbd {
            return rbd.image.clone();
        }
        spec.csi
            .as_ref()
            .unwrap()
            .volume_attributes
            .as_ref()
            .unwrap()["imageName"]
            .clone()
    }

    pub fn images(&self) -> Vec<String> {
        self.ceph
            .rbd(&["ls", &self.ceph.pool])
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    pub fn image_meta(&self, image: &str, key: &str) -> Option<String> {
        self.ceph
            .rbd(&[
                "image-meta",
                "get",
                &format!("{}/{image}", self.ceph.pool),
                key,
            ])
            .ok()
            .map(|s| s.trim().to_string())
    }

    pub fn image_size(&self, image: &str) -> u64 {
        let out = self
            .ceph
            .rbd(&[
                "info",
                "--format",
                "json",
                &format!("{}/{image}", self.ceph.pool),
            ])
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["size"].as_u64().unwrap()
    }
}
