//! The CSI Identity service: plugin name and version, capabilities (controller service, online
//! volume expansion) and a readiness probe that reports whether Ceph is reachable.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::proto::csi::{self, identity_server::Identity, plugin_capability};

/// Answers "is the backend reachable?" for Probe.
#[async_trait::async_trait]
pub trait ReadinessProbe: Send + Sync {
    /// `Ok(true)` when ready; `Ok(false)` while not (yet) ready; `Err` when the plugin is broken.
    async fn ready(&self) -> Result<bool, String>;
}

/// The Identity service.
#[derive(Clone)]
pub struct IdentityService {
    name: String,
    vendor_version: String,
    probe: Option<Arc<dyn ReadinessProbe>>,
    /// Whether `VOLUME_ACCESSIBILITY_CONSTRAINTS` is advertised.
    topology: bool,
}

impl std::fmt::Debug for IdentityService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityService")
            .field("name", &self.name)
            .field("vendor_version", &self.vendor_version)
            .field("probe", &self.probe.is_some())
            .field("topology", &self.topology)
            .finish()
    }
}

impl IdentityService {
    /// Identity for driver `name`, version = this crate's version; always ready unless a probe
    /// is attached with [`IdentityService::with_probe`].
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            probe: None,
            topology: false,
        }
    }

    /// Advertises `VOLUME_ACCESSIBILITY_CONSTRAINTS` (topology is configured): only then, since
    /// the external-provisioner refuses `WaitForFirstConsumer` claims on nodes that report no
    /// topology once a driver advertises it.
    #[must_use]
    pub fn with_topology(mut self, topology: bool) -> Self {
        self.topology = topology;
        self
    }

    /// Makes Probe report `probe`'s answer.
    #[must_use]
    pub fn with_probe(mut self, probe: Arc<dyn ReadinessProbe>) -> Self {
        self.probe = Some(probe);
        self
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: self.vendor_version.clone(),
            manifest: std::collections::HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
        let mut capabilities = vec![
            csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::ControllerService as i32,
                })),
            },
            csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::GroupControllerService as i32,
                })),
            },
            csi::PluginCapability {
                r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                })),
            },
        ];
        if self.topology {
            capabilities.push(csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::VolumeAccessibilityConstraints as i32,
                })),
            });
        }
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        _request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        let ready = match &self.probe {
            None => true,
            Some(probe) => match probe.ready().await {
                Ok(ready) => ready,
                Err(message) => {
                    tracing::warn!(error = %message, "readiness probe failed");
                    return Err(Status::failed_precondition(message));
                }
            },
        };
        Ok(Response::new(csi::ProbeResponse { ready: Some(ready) }))
    }
}
