//! Kubelet plugin registration (pluginregistration v1), which replaces the
//! node-driver-registrar sidecar.
//!
//! The kubelet watches its plugins registry directory (`/var/lib/kubelet/plugins_registry`) for
//! sockets, calls `GetInfo` on each to learn the plugin type (`CSIPlugin`), name and the CSI
//! endpoint, registers the driver (`CSINode` object, `csi` volume plugin) and reports the outcome
//! with `NotifyRegistrationStatus`.

use std::path::{Path, PathBuf};

use tonic::{Request, Response, Status};

use crate::proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::Registration,
};

/// Where the registration socket goes and what it announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationConfig {
    /// The kubelet's plugin registry directory. Default `/var/lib/kubelet/plugins_registry`.
    pub registry_dir: PathBuf,
    /// The CSI socket path as the kubelet (on the host) sees it, e.g.
    /// `/var/lib/kubelet/plugins/rbd.provisioner.ceph.io/csi.sock`. Default: the served endpoint.
    pub kubelet_endpoint: Option<PathBuf>,
}

impl Default for RegistrationConfig {
    fn default() -> Self {
        Self {
            registry_dir: PathBuf::from("/var/lib/kubelet/plugins_registry"),
            kubelet_endpoint: None,
        }
    }
}

/// The registration socket of `driver_name` in `registry_dir`: `<driver_name>-reg.sock`.
#[must_use]
pub fn socket_path(registry_dir: &Path, driver_name: &str) -> PathBuf {
    registry_dir.join(format!("{driver_name}-reg.sock"))
}

/// CSI versions announced to the kubelet.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// The `Registration` service.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    driver_name: String,
    endpoint: String,
}

impl RegistrationService {
    #[must_use]
    pub fn new(driver_name: impl Into<String>, endpoint: &Path) -> Self {
        Self {
            driver_name: driver_name.into(),
            endpoint: endpoint.to_string_lossy().into_owned(),
        }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".to_owned(),
            name: self.driver_name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.driver_name, "registered with the kubelet");
        } else {
            tracing::error!(driver = %self.driver_name, error = %status.error, "kubelet registration failed");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
