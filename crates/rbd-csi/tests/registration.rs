//! Kubelet plugin registration over its own socket in the plugins registry directory.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use common::{TestServer, connect};
use rbd_csi::proto::pluginregistration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use rbd_csi::{RegistrationConfig, Services};

#[tokio::test]
async fn kubelet_learns_type_name_endpoint_and_versions() {
    let registry = tempfile::tempdir().unwrap();
    let registry_dir = registry.path().to_path_buf();
    let server = TestServer::start(Services::Node, |c| {
        c.registration = Some(RegistrationConfig {
            registry_dir: registry_dir.clone(),
            kubelet_endpoint: Some(PathBuf::from(
                "/var/lib/kubelet/plugins/rbd.provisioner.ceph.io/csi.sock",
            )),
        });
    })
    .await;
    let socket = registry_dir.join("rbd.provisioner.ceph.io-reg.sock");
    common::wait_for_socket(&socket).await;
    // Both sockets are owner-only, and nothing else (no temporary name) is left in the
    // registry directory the kubelet watches.
    for path in [&socket, &server.socket] {
        let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} has mode {mode:o}", path.display());
    }
    let names: Vec<_> = std::fs::read_dir(&registry_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [socket.file_name().unwrap()]);
    let mut client = RegistrationClient::new(connect(&socket).await);
    let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "rbd.provisioner.ceph.io");
    assert_eq!(
        info.endpoint,
        "/var/lib/kubelet/plugins/rbd.provisioner.ceph.io/csi.sock"
    );
    assert_eq!(info.supported_versions, ["1.0.0"]);
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "driver name clash".into(),
        })
        .await
        .unwrap();
    server.stop().await.unwrap();
    assert!(!socket.exists(), "registration socket removed on shutdown");
}

#[tokio::test]
async fn endpoint_defaults_to_the_served_socket_and_controller_does_not_register() {
    let registry = tempfile::tempdir().unwrap();
    let registry_dir = registry.path().to_path_buf();
    let server = TestServer::start(Services::Node, |c| {
        c.driver_name = "rbd.example.org".into();
        c.registration = Some(RegistrationConfig {
            registry_dir: registry_dir.clone(),
            kubelet_endpoint: None,
        });
    })
    .await;
    let socket = registry_dir.join("rbd.example.org-reg.sock");
    common::wait_for_socket(&socket).await;
    let info = RegistrationClient::new(connect(&socket).await)
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "rbd.example.org");
    assert_eq!(PathBuf::from(info.endpoint), server.socket);
    server.stop().await.unwrap();

    let controller_registry = tempfile::tempdir().unwrap();
    let dir = controller_registry.path().to_path_buf();
    let controller = TestServer::start(Services::Controller, |c| {
        c.registration = Some(RegistrationConfig {
            registry_dir: dir.clone(),
            kubelet_endpoint: None,
        });
    })
    .await;
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    controller.stop().await.unwrap();
}

/// The `:authority` grpc-go sends when dialled by a bare socket path (the kubelet's plugin
/// watcher), `%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Frbd.provisioner.ceph.io-reg.sock`,
/// Huffman-coded (RFC 7541 Appendix B) as grpc-go's HPACK encoder sends it (it Huffman-codes
/// every string that gets shorter).
const KUBELET_AUTHORITY_HUFFMAN: &str = "54587b8ec545868346a8b0f5b632d054aa2c35d16cc6a91158598c84d9e95161b23917aec3f7320c7a8b62e42d73ae63ad61665d07275f";

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// An HTTP/2 frame: 24-bit length, type, flags, stream id, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// A plain (not Huffman-coded) HPACK string literal shorter than 127 bytes.
fn plain(text: &str) -> Vec<u8> {
    let mut out = vec![u8::try_from(text.len()).unwrap()];
    out.extend(text.as_bytes());
    out
}

/// A gRPC message frame (uncompressed).
fn grpc_message(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
    out.extend(message);
    out
}

/// Reads frames until both `streams` ended (END_STREAM or RST_STREAM) or the connection closed;
/// answers the server's SETTINGS. Returns every frame as (type, flags, stream, payload).
async fn read_frames(
    conn: &mut tokio::net::UnixStream,
    streams: &[u32],
) -> Vec<(u8, u8, u32, Vec<u8>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut frames = Vec::new();
    let mut open: Vec<u32> = streams.to_vec();
    let read = async {
        while !open.is_empty() {
            let mut head = [0u8; 9];
            if conn.read_exact(&mut head).await.is_err() {
                break;
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            conn.read_exact(&mut payload).await.unwrap();
            let (kind, flags) = (head[3], head[4]);
            if kind == 4 && flags & 1 == 0 {
                conn.write_all(&frame(4, 1, 0, &[])).await.unwrap();
            }
            if (flags & 1 == 1 && (kind == 0 || kind == 1)) || kind == 3 {
                open.retain(|s| *s != stream);
            }
            let goaway = kind == 7;
            frames.push((kind, flags, stream, payload));
            if goaway {
                break;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("the server answered within 10 s");
    frames
}

/// A node server registering in a registry directory of its own: (that directory, the server,
/// its registration socket, up).
async fn node_with_registration() -> (tempfile::TempDir, TestServer, PathBuf) {
    let registry = tempfile::tempdir().unwrap();
    let registry_dir = registry.path().to_path_buf();
    let server = TestServer::start(Services::Node, |c| {
        c.registration = Some(RegistrationConfig {
            registry_dir: registry_dir.clone(),
            kubelet_endpoint: None,
        });
    })
    .await;
    let socket = registry_dir.join("rbd.provisioner.ceph.io-reg.sock");
    common::wait_for_socket(&socket).await;
    (registry, server, socket)
}

#[tokio::test]
async fn grpc_go_on_the_wire_with_a_percent_encoded_path_as_authority_gets_plugin_info() {
    use prost::Message;
    use rbd_csi::proto::pluginregistration::PluginInfo;
    use tokio::io::AsyncWriteExt;

    let (_registry, server, socket) = node_with_registration().await;

    // Request 1, as grpc-go encodes it: :method POST and :scheme http from the static table,
    // then literals with incremental indexing (entering the dynamic table):
    // :path (static name 4), :authority (static name 1, Huffman-coded value),
    // content-type (static name 31), te (literal name), user-agent (static name 58).
    let mut block = vec![0x83, 0x86, 0x44];
    block.extend(plain("/pluginregistration.Registration/GetInfo"));
    block.push(0x41);
    let authority = unhex(KUBELET_AUTHORITY_HUFFMAN);
    block.push(0x80 | u8::try_from(authority.len()).unwrap());
    block.extend(&authority);
    block.push(0x5f);
    block.extend(plain("application/grpc"));
    block.push(0x40);
    block.extend(plain("te"));
    block.extend(plain("trailers"));
    block.push(0x7a);
    block.extend(plain("grpc-go/1.72.0"));
    // Request 2 on the same connection refers to all five by dynamic-table index, newest (62,
    // user-agent) to oldest (66, :path): the :authority is entry 65.
    let second = [0x83, 0x86, 0xc2, 0xc1, 0xc0, 0xbf, 0xbe];

    let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    wire.extend(frame(4, 0, 0, &[])); // SETTINGS
    // HEADERS (END_HEADERS), then the empty InfoRequest in a DATA frame with END_STREAM.
    wire.extend(frame(1, 0x4, 1, &block));
    wire.extend(frame(0, 0x1, 1, &grpc_message(&[])));
    wire.extend(frame(1, 0x4, 3, &second));
    wire.extend(frame(0, 0x1, 3, &grpc_message(&[])));
    let mut conn = tokio::net::UnixStream::connect(&socket).await.unwrap();
    conn.write_all(&wire).await.unwrap();
    let frames = read_frames(&mut conn, &[1, 3]).await;
    // The server's graceful shutdown waits for its clients to hang up.
    drop(conn);

    let kinds: Vec<(u8, u32)> = frames.iter().map(|f| (f.0, f.2)).collect();
    for stream in [1, 3] {
        assert!(
            !frames.iter().any(|f| f.0 == 3 && f.2 == stream) && !frames.iter().any(|f| f.0 == 7),
            "stream {stream} reset or connection closed (frames: {kinds:?})"
        );
        let data: Vec<u8> = frames
            .iter()
            .filter(|f| f.0 == 0 && f.2 == stream)
            .flat_map(|f| f.3.clone())
            .collect();
        assert!(
            data.len() > 5,
            "no gRPC message on stream {stream}: {kinds:?}"
        );
        assert_eq!(data[0], 0, "uncompressed message");
        let info = PluginInfo::decode(&data[5..]).unwrap();
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, "rbd.provisioner.ceph.io");
        assert_eq!(PathBuf::from(&info.endpoint), server.socket);
        assert!(
            frames
                .iter()
                .any(|f| f.0 == 1 && f.2 == stream && f.1 & 1 == 1),
            "stream {stream} ends with trailers: {kinds:?}"
        );
    }
    server.stop().await.unwrap();
}

/// A gRPC client configured like the kubelet's plugin watcher, in Debian's python3-grpcio: it
/// dials `unix:<path>` and sends the `:authority` grpc-go derives from a bare socket path, the
/// percent-encoded path (grpcio's own default would be `localhost`). GetInfo, then
/// NotifyRegistrationStatus on the same channel; then a CSI Identity call on the CSI socket.
/// Requests and replies are raw protobuf bytes, printed in hex.
const PYTHON_CLIENT: &str = r#"
import sys, urllib.parse, grpc
def channel(path):
    authority = urllib.parse.quote(path, safe="")
    return grpc.insecure_channel("unix:" + path, options=[("grpc.default_authority", authority)])
reg, csi = sys.argv[1], sys.argv[2]
with channel(reg) as ch:
    print(ch.unary_unary("/pluginregistration.Registration/GetInfo")(b"", timeout=10).hex())
    notify = ch.unary_unary("/pluginregistration.Registration/NotifyRegistrationStatus")
    print(notify(b"\x08\x01", timeout=10).hex())
with channel(csi) as ch:
    print(ch.unary_unary("/csi.v1.Identity/GetPluginInfo")(b"", timeout=10).hex())
"#;

/// Runs [`PYTHON_CLIENT`] against the registration socket `reg` and the CSI socket `csi`:
/// (GetInfo reply, NotifyRegistrationStatus reply, GetPluginInfo reply).
async fn python_kubelet(
    reg: &std::path::Path,
    csi: &std::path::Path,
) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let out = tokio::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(PYTHON_CLIENT)
        .arg(reg)
        .arg(csi)
        .kill_on_drop(true)
        .output()
        .await
        .expect("/usr/bin/python3 runs (scripts/install-deps.sh installs python3-grpcio)");
    assert!(
        out.status.success(),
        "python grpcio client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    (unhex(lines[0]), unhex(lines[1]), unhex(lines[2]))
}

#[tokio::test]
async fn python_grpcio_registers_like_the_kubelet_and_registers_again_after_a_kubelet_restart() {
    use prost::Message;
    use rbd_csi::proto::csi::GetPluginInfoResponse;
    use rbd_csi::proto::pluginregistration::PluginInfo;

    let (_registry, server, socket) = node_with_registration().await;
    // Each run is a new process with new connections: a kubelet (re)starting and re-dialling
    // the sockets it finds.
    for run in ["first kubelet", "restarted kubelet"] {
        let (info, notified, plugin) = python_kubelet(&socket, &server.socket).await;
        let info = PluginInfo::decode(info.as_slice()).unwrap();
        assert_eq!(info.r#type, "CSIPlugin", "{run}");
        assert_eq!(info.name, "rbd.provisioner.ceph.io", "{run}");
        assert_eq!(PathBuf::from(&info.endpoint), server.socket, "{run}");
        assert!(
            notified.is_empty(),
            "{run}: empty RegistrationStatusResponse"
        );
        let plugin = GetPluginInfoResponse::decode(plugin.as_slice()).unwrap();
        assert_eq!(plugin.name, "rbd.provisioner.ceph.io", "{run}");
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_removed_registration_socket_is_recreated_and_serves_again() {
    use rbd_csi::proto::pluginregistration::registration_client::RegistrationClient;

    let (_registry, server, socket) = node_with_registration().await;
    std::fs::remove_file(&socket).unwrap();
    // The plugin notices within its check interval (one second) and binds the socket again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::net::UnixStream::connect(&socket).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "registration socket not recreated within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let info = RegistrationClient::new(connect(&socket).await)
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "rbd.provisioner.ceph.io");
    let (info, _, _) = python_kubelet(&socket, &server.socket).await;
    assert!(!info.is_empty());
    server.stop().await.unwrap();
    assert!(!socket.exists(), "registration socket removed on shutdown");
}
