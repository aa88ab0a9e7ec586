//! Serving the CSI services (and kubelet registration) on unix sockets.
//!
//! Every accepted connection goes through [`AuthorityFix`], so gRPC clients that send a socket
//! path as `:authority` (grpc-go dialled by a bare path, as the kubelet's plugin watcher does)
//! are served instead of refused by h2. The registration socket is watched: when its file is
//! removed (a kubelet or an operator cleaning the plugins registry), it is bound again within
//! [`SOCKET_CHECK`], and the kubelet's plugin watcher sees it as a new plugin socket.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::Server;

use crate::h2_authority::AuthorityFix;

use crate::config::CsiConfig;
use crate::identity::IdentityService;
use crate::node::NodeService;
use crate::proto::csi::{identity_server::IdentityServer, node_server::NodeServer};
use crate::proto::pluginregistration::registration_server::RegistrationServer;
use crate::registration::{self, RegistrationService};

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("gRPC server on {path}: {source}")]
    Transport {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Binds a unix socket at `path`, replacing a stale socket file left by an earlier process.
///
/// # Errors
/// [`CsiError::NotASocket`] when `path` is another kind of file; the bind error otherwise.
pub fn bind_unix(path: &Path) -> Result<UnixListener, CsiError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| CsiError::Io {
                what: "removing stale socket",
                path: path.to_path_buf(),
                source,
            })?;
        }
        Ok(_) => {
            return Err(CsiError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(_) => {}
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| CsiError::Io {
            what: "creating socket directory",
            path: parent.to_path_buf(),
            source,
        })?;
    }
    // Bound under a temporary name, made owner-only (0600: the kubelet and the sidecars run as
    // root), then renamed into place: the socket is never reachable with the umask's mode. The
    // temporary name starts with a dot, which the kubelet's plugin watcher ignores.
    let name = path.file_name().ok_or_else(|| {
        CsiError::Config(format!("socket path {} has no file name", path.display()))
    })?;
    let mut staged_name = std::ffi::OsString::from(".");
    staged_name.push(name);
    staged_name.push(format!(".{}.new", std::process::id()));
    let staged = path.with_file_name(staged_name);
    let _ = std::fs::remove_file(&staged);
    let listener = UnixListener::bind(&staged).map_err(|source| CsiError::Io {
        what: "binding",
        path: path.to_path_buf(),
        source,
    })?;
    let placed = std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
        .map_err(|source| ("setting the mode of", source))
        .and_then(|()| std::fs::rename(&staged, path).map_err(|source| ("placing", source)));
    if let Err((what, source)) = placed {
        let _ = std::fs::remove_file(&staged);
        return Err(CsiError::Io {
            what,
            path: path.to_path_buf(),
            source,
        });
    }
    Ok(listener)
}

/// How often the registration socket's file is checked for removal.
pub const SOCKET_CHECK: Duration = Duration::from_secs(1);

/// The connections accepted on `listener`, each wrapped in [`AuthorityFix`].
fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = std::io::Result<AuthorityFix<UnixStream>>> {
    UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFix::new))
}

/// The connections accepted on the socket at `path`, each wrapped in [`AuthorityFix`]; when the
/// socket file disappears, it is bound again (a file that is there, even another process's
/// socket, is left alone). Ends when `stop` completes.
fn incoming_rebinding(
    path: PathBuf,
    listener: UnixListener,
    stop: impl Future<Output = ()> + Send + 'static,
) -> impl Stream<Item = std::io::Result<AuthorityFix<UnixStream>>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut listener = listener;
        let mut check = tokio::time::interval(SOCKET_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                accepted = listener.accept() => {
                    if tx.send(accepted.map(|(conn, _)| AuthorityFix::new(conn))).await.is_err() {
                        break;
                    }
                }
                _ = check.tick() => {
                    let gone = matches!(std::fs::symlink_metadata(&path),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound);
                    if gone {
                        match bind_unix(&path) {
                            Ok(bound) => {
                                tracing::warn!(socket = %path.display(),
                                    "registration socket was removed; bound it again");
                                listener = bound;
                            }
                            Err(error) => tracing::error!(%error,
                                "cannot recreate the registration socket; retrying"),
                        }
                    }
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Serves the services `config.services` selects on `config.endpoint` (plus the kubelet
/// registration socket when configured and the node service runs) until `shutdown` completes,
/// then removes the socket files.
///
/// # Errors
/// [`CsiError::Config`] for an invalid configuration ([`CsiConfig::validate`]); otherwise when a
/// socket cannot be bound or a server fails.
pub async fn serve(
    config: CsiConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CsiError> {
    config.validate().map_err(CsiError::Config)?;
    let node = config
        .services
        .node()
        .then(|| NodeService::new(config.node_config()));
    serve_with_node(config, node, shutdown).await
}

/// [`serve`] with the caller's node service (`Some` when `config.services` includes the node
/// service), so that the caller can share it, e.g. with a task that reclaims space on this
/// node under the same per-volume locks.
///
/// # Errors
/// As [`serve`]; [`CsiError::Config`] when `node` does not match `config.services`.
pub async fn serve_with_node(
    config: CsiConfig,
    node: Option<NodeService>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CsiError> {
    config.validate().map_err(CsiError::Config)?;
    if node.is_some() != config.services.node() {
        return Err(CsiError::Config(
            "a node service is given exactly when the node service is served".into(),
        ));
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let identity = IdentityServer::new(identity_service(&config));
    let node = node.map(NodeServer::new);
    let (controller, group_controller) = config
        .services
        .controller()
        .then(|| crate::controller::servers(&config))
        .unzip();

    let listener = bind_unix(&config.endpoint)?;
    tracing::info!(endpoint = %config.endpoint.display(), driver = %config.driver_name,
        services = ?config.services, "serving CSI");
    let endpoint = config.endpoint.clone();
    let csi = Server::builder()
        .add_service(identity)
        .add_optional_service(controller)
        .add_optional_service(group_controller)
        .add_optional_service(node)
        .serve_with_incoming_shutdown(incoming(listener), stopped(stop_rx.clone()));

    let registration = match (&config.registration, config.services.node()) {
        (Some(reg), true) => {
            let socket = registration::socket_path(&reg.registry_dir, &config.driver_name);
            let announced = reg
                .kubelet_endpoint
                .clone()
                .unwrap_or_else(|| config.endpoint.clone());
            let listener = bind_unix(&socket)?;
            tracing::info!(socket = %socket.display(), "serving kubelet plugin registration");
            let service =
                RegistrationServer::new(RegistrationService::new(&config.driver_name, &announced));
            let server = Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    incoming_rebinding(socket.clone(), listener, stopped(stop_rx.clone())),
                    stopped(stop_rx.clone()),
                );
            Some((socket, server))
        }
        _ => None,
    };

    let result = match registration {
        Some((socket, reg_server)) => {
            let (a, b) = tokio::join!(csi, reg_server);
            let _ = std::fs::remove_file(&socket);
            a.map_err(|source| CsiError::Transport {
                path: endpoint.clone(),
                source,
            })
            .and(b.map_err(|source| CsiError::Transport {
                path: socket,
                source,
            }))
        }
        None => csi.await.map_err(|source| CsiError::Transport {
            path: endpoint.clone(),
            source,
        }),
    };
    let _ = std::fs::remove_file(&endpoint);
    result
}

fn identity_service(config: &CsiConfig) -> IdentityService {
    let identity = IdentityService::new(config.driver_name.clone())
        .with_topology(!config.topology_labels.is_empty());
    match &config.probe {
        Some(probe) => identity.with_probe(crate::controller::probe(probe)),
        None => identity,
    }
}
