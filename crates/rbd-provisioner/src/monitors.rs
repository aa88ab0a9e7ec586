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
        if addrs.is_empty() {
            return Err(ResolveError {
                host: host.to_string(),
                reason: "no addresses".into(),
            });
        }
        out.extend(entries(&addrs, port));
    }
    Ok(out.join(","))
}

/// One `ip[:port]` entry per distinct address of a name, IPv4 first (resolver order kept): the
/// old provisioner added every record, so a DNS name with one record per monitor keeps working
/// when one of them is down.
fn entries(addrs: &[std::net::SocketAddr], port: Option<&str>) -> Vec<String> {
    let mut ips: Vec<std::net::IpAddr> = Vec::new();
    for ip in addrs.iter().map(std::net::SocketAddr::ip) {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips.sort_by_key(std::net::IpAddr::is_ipv6);
    ips.into_iter()
        .map(|ip| match (port, ip) {
            (Some(p), std::net::IpAddr::V6(ip)) => format!("[{ip}]:{p}"),
            (Some(p), ip) => format!("{ip}:{p}"),
            (None, std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
            (None, ip) => ip.to_string(),
        })
        .collect()
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
        // every address the resolver has for the name, IPv4 first
        let all: Vec<std::net::IpAddr> = tokio::net::lookup_host(("localhost", 6789))
            .await
            .unwrap()
            .map(|a| a.ip())
            .collect();
        let resolved = resolve("localhost:6789").await.unwrap();
        assert!(resolved.starts_with("127.0.0.1:6789"), "{resolved}");
        for ip in all {
            let entry = match ip {
                std::net::IpAddr::V6(ip) => format!("[{ip}]:6789"),
                ip => format!("{ip}:6789"),
            };
            assert!(
                resolved.split(',').any(|e| e == entry),
                "{entry} missing from {resolved}"
            );
        }
        let e = resolve("no-such-host.invalid:6789").await.unwrap_err();
        assert!(e.to_string().contains("no-such-host.invalid"), "{e}");
    }

    #[test]
    fn every_address_of_a_name_becomes_a_monitor() {
        let addrs: Vec<std::net::SocketAddr> = [
            "[fd00::3]:6789",
            "10.0.0.1:6789",
            "10.0.0.2:6789",
            "10.0.0.1:6789",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        assert_eq!(
            entries(&addrs, Some("3300")),
            ["10.0.0.1:3300", "10.0.0.2:3300", "[fd00::3]:3300"]
        );
        assert_eq!(entries(&addrs, None), ["10.0.0.1", "10.0.0.2", "[fd00::3]"]);
    }
}
