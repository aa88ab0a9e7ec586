//! Telling "wrong credentials" from "unreachable" after a connect timeout.
//!
//! With msgr2, a monitor that refuses our key does not answer "permission denied": the client
//! keeps hunting until `client_mount_timeout` and librados reports `ETIMEDOUT`, exactly as for a
//! dead cluster. Operators need to know which one it is, so after a timed-out connect we open a
//! plain TCP connection to each monitor and read its banner (`ceph v2\n`, or `ceph v027` for
//! msgr1). If a monitor greets us, it was reachable and alive, so the handshake failed on
//! authentication.

use std::time::Duration;

use tokio::io::AsyncReadExt;

/// Candidate `host:port` addresses from a monitor list such as
/// `10.0.0.1:6789,[v2:10.0.0.2:3300/0,v1:10.0.0.2:6789/0],mon-c`.
pub(crate) fn monitor_addresses(monitors: &str) -> Vec<String> {
    let mut out = Vec::new();
    for raw in monitors.split([',', ' ', ';']) {
        let entry = raw.trim().trim_matches(|c| c == '[' || c == ']');
        let entry = entry
            .strip_prefix("v2:")
            .or_else(|| entry.strip_prefix("v1:"))
            .unwrap_or(entry);
        let entry = entry.split('/').next().unwrap_or(entry);
        if entry.is_empty() {
            continue;
        }
        let has_port = entry.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && !host.ends_with(':') && port.parse::<u16>().is_ok()
        }) && !entry.starts_with('[');
        if has_port {
            out.push(entry.to_string());
        } else {
            out.push(format!("{entry}:3300"));
            out.push(format!("{entry}:6789"));
        }
    }
    out
}

/// Whether any monitor answers with a Ceph banner within `wait`.
pub(crate) async fn any_monitor_answers(monitors: &str, wait: Duration) -> bool {
    let mut probes = tokio::task::JoinSet::new();
    for addr in monitor_addresses(monitors) {
        probes.spawn(async move {
            let attempt = async {
                let mut stream = tokio::net::TcpStream::connect(&addr).await.ok()?;
                let mut banner = [0u8; 8];
                stream.read_exact(&mut banner).await.ok()?;
                Some(banner.starts_with(b"ceph v"))
            };
            matches!(tokio::time::timeout(wait, attempt).await, Ok(Some(true)))
        });
    }
    while let Some(answered) = probes.join_next().await {
        if answered.unwrap_or(false) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_monitor_list_forms() {
        assert_eq!(
            monitor_addresses("127.0.0.1:40000"),
            vec!["127.0.0.1:40000"]
        );
        assert_eq!(
            monitor_addresses("[v2:10.0.0.2:3300/0,v1:10.0.0.2:6789/0], mon-c"),
            vec!["10.0.0.2:3300", "10.0.0.2:6789", "mon-c:3300", "mon-c:6789"]
        );
    }
}
