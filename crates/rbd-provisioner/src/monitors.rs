//! Monitor addresses: hostnames are resolved with the system resolver (the node's
//! /etc/resolv.conf and /etc/hosts), never through cluster DNS lookups of our own.

/// A monitor could not be resolved.
#[derive(Debug, thiserror::Error)]
#[error("StorageClass parameter \"monitors\": cannot resolve {host:?}: {reason}")]
pub struct ResolveError {
    pub host: String,
    pub reason: String,
}

/// Resolves every `host[:port]` entry to `ip[:port]` (IP literals pass through).
pub async fn resolve(monitors: &str) -> Result<String, ResolveError> {
    let mut out = Vec::new();
    for entry in monitors.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (host, port) = match entry.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') || h.starts_with('[') => (h, Some(p)),
            _ => (entry, None),
        };
        let bare = host.trim_matches(|c| c == '[' || c == ']');
        if bare.parse::<std::net::IpAddr>().is_ok() {
            out.push(entry.to_string());
            continue;
        }
        let lookup_port: u16 = port.and_then(|p| p.parse().ok()).unwrap_or(6789);
        let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((bare, lookup_port))
            .await
            .map_err(|e| ResolveError {
                host: host.to_string(),
                reason: e.to_string(),
            })?
            .collect();
        let Some(addr) = addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()) else {
            return Err(ResolveError {
                host: host.to_string(),
                reason: "no addresses".into(),
            });
        };
        out.push(match (port, addr.ip()) {
            (Some(p), std::net::IpAddr::V6(ip)) => format!("[{ip}]:{p}"),
            (Some(p), ip) => format!("{ip}:{p}"),
            (None, ip) => ip.to_string(),
        });
    }
    Ok(out.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_hostnames_and_keeps_ip_literals() {
        assert_eq!(
            resolve("10.0.0.1:6789, [::1]:3300").await.unwrap(),
            "10.0.0.1:6789,[::1]:3300"
        );
        assert_eq!(resolve("localhost:6789").await.unwrap(), "127.0.0.1:6789");
        let e = resolve("no-such-host.invalid:6789").await.unwrap_err();
        assert!(e.to_string().contains("no-such-host.invalid"), "{e}");
    }
}
