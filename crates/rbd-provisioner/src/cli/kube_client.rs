//! The Kubernetes client from --master / --kubeconfig / in-cluster configuration.

use anyhow::Context;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cli::KubeArgs;
use crate::cli::throttle::ThrottleLayer;

/// `User-Agent` of every API request.
pub const USER_AGENT: &str = concat!("rbd-provisioner/", env!("CARGO_PKG_VERSION"));

/// The Kubernetes cluster's identity: `--kube-cluster-id`, else the uid of the `kube-system`
/// namespace (the same for the life of the cluster, different in every cluster).
///
/// # Errors
/// The namespace cannot be read, or has no uid.
pub async fn kube_cluster_id(client: &Client, args: &KubeArgs) -> anyhow::Result<String> {
    if let Some(id) = &args.kube_cluster_id {
        return Ok(id.clone());
    }
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    let context = "reading the uid of namespace kube-system (the Kubernetes cluster's identity \
                   recorded on images; --kube-cluster-id sets it instead)";
    namespaces
        .get("kube-system")
        .await
        .context(context)?
        .metadata
        .uid
        .filter(|uid| !uid.is_empty())
        .with_context(|| format!("{context}: the namespace has no uid"))
}

/// Builds the client the way the old provisioner did: kubeconfig if given, else in-cluster
/// (falling back to $KUBECONFIG / ~/.kube/config outside a pod); --master overrides the URL.
pub async fn client(args: &KubeArgs) -> anyhow::Result<Client> {
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None if args.master.is_some() => Config::new("http://localhost".parse()?),
        None => Config::infer()
            .await
            .context("no --kubeconfig or --master and no in-cluster configuration")?,
    };
    // Identifies our requests in API server audit logs and as the managedFields manager.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    if let Some(master) = &args.master {
        config.cluster_url = master
            .parse()
            .with_context(|| format!("--master {master:?} is not a URL"))?;
    }
    let builder = ClientBuilder::try_from(config).context("building the Kubernetes client")?;
    Ok(if args.kube_api_qps > 0.0 {
        builder
            .with_layer(&ThrottleLayer::new(args.kube_api_qps, args.kube_api_burst))
            .build()
    } else {
        builder.build()
    })
}
