//! One benchmark environment: a fresh `kube-emulator` process, a kube client for it, the admin
//! Secret and StorageClass, and the `rbd-provisioner` process under test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::json;

use crate::procs::Proc;

pub const NAMESPACE: &str = "default";
pub const CLASS: &str = "bench-rbd";
const SECRET: &str = "ceph-admin";
const SECRET_NS: &str = "kube-system";

/// The emulator and the provisioner of one run; both stopped on drop (provisioner first).
pub struct Env {
    pub client: Client,
    pub provisioner: Proc,
    pub emulator: Proc,
    /// Time from process start until the provisioner held the lease.
    pub startup: Duration,
}

impl Env {
    /// Starts the emulator, stores the admin secret and the class, starts the provisioner with
    /// `provisioner_args` and waits until it holds the leader lease.
    pub async fn start(
        bins: &Path,
        dir: &Path,
        tag: &str,
        ceph: &micro_ceph::MicroCeph,
        provisioner_args: &[String],
        provisioner_env: &[(String, String)],
        emulator_args: &[String],
    ) -> anyhow::Result<Env> {
        let kubeconfig = dir.join(format!("kubeconfig-{tag}"));
        let mut args = vec![
            "--listen".to_string(),
            "127.0.0.1:0".into(),
            "--kubeconfig-out".into(),
            path_arg(&kubeconfig),
        ];
        args.extend(emulator_args.iter().cloned());
        let mut emulator = Proc::spawn(
            "kube-emulator",
            &bins.join("kube-emulator"),
            &args,
            &[],
            dir.join(format!("emulator-{tag}.log")),
        )?;
        let end = Instant::now() + Duration::from_secs(30);
        while !kubeconfig.is_file() {
            emulator.check_alive()?;
            if Instant::now() > end {
                bail!("kube-emulator wrote no kubeconfig within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let client = client_for(&kubeconfig).await?;
        create_namespace(&client, SECRET_NS).await?;
        create_namespace(&client, NAMESPACE).await?;
        store_secret(&client, &ceph.admin_key).await?;
        create_class(&client, ceph).await?;

        let mut args = vec!["--kubeconfig".to_string(), path_arg(&kubeconfig)];
        args.extend(provisioner_args.iter().cloned());
        let started = Instant::now();
        let mut provisioner = Proc::spawn(
            "rbd-provisioner",
            &bins.join("rbd-provisioner"),
            &args,
            provisioner_env,
            dir.join(format!("provisioner-{tag}.log")),
        )?;
        wait_leader(&client, &mut provisioner).await?;
        Ok(Env {
            client,
            provisioner,
            emulator,
            startup: started.elapsed(),
        })
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // the provisioner first, while the API is still there to release its lease
        self.provisioner.stop(Duration::from_secs(5));
        self.emulator.stop(Duration::from_secs(5));
    }
}

fn path_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A client for the emulator, without client-side throttling.
async fn client_for(kubeconfig: &PathBuf) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig).context("reading the emulator's kubeconfig")?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .context("loading the emulator's kubeconfig")?;
    config.read_timeout = Some(Duration::from_secs(300));
    Client::try_from(config).context("building the kube client")
}

async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating namespace {name}")),
    }
}

async fn store_secret(client: &Client, key: &str) -> anyhow::Result<()> {
    let api: Api<Secret> = Api::namespaced(client.clone(), SECRET_NS);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": SECRET, "namespace": SECRET_NS},
        "type": "kubernetes.io/rbd",
        "stringData": {"key": key},
    }))?;
    api.create(&PostParams::default(), &secret)
        .await
        .context("storing the admin secret")?;
    Ok(())
}

async fn create_class(client: &Client, ceph: &micro_ceph::MicroCeph) -> anyhow::Result<()> {
    let params: BTreeMap<&str, &str> = [
        ("monitors", ceph.monitors.as_str()),
        ("pool", ceph.pool.as_str()),
        ("adminId", "admin"),
        ("adminSecretNamespace", SECRET_NS),
        ("adminSecretName", SECRET),
        ("userId", "admin"),
        ("userSecretNamespace", SECRET_NS),
        ("userSecretName", SECRET),
    ]
    .into_iter()
    .collect();
    let api: Api<StorageClass> = Api::all(client.clone());
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": CLASS},
        "provisioner": "ceph.com/rbd",
        "reclaimPolicy": "Delete",
        "parameters": params,
    }))?;
    api.create(&PostParams::default(), &class)
        .await
        .context("creating the StorageClass")?;
    Ok(())
}

/// Waits until some Lease in the leader-election namespace has a holder.
async fn wait_leader(client: &Client, provisioner: &mut Proc) -> anyhow::Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        provisioner.check_alive()?;
        let leases = api.list(&ListParams::default()).await?;
        let held = leases.items.iter().any(|l| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| !h.is_empty())
        });
        if held {
            return Ok(());
        }
        if Instant::now() > end {
            bail!(
                "the provisioner did not take the lease within 60 s; log {}:\n{}",
                provisioner.log.display(),
                crate::procs::log_tail(&provisioner.log, 10)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
