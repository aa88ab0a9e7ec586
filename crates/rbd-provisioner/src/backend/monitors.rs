//! Monitor addresses resolved to IP addresses with the system resolver.
//!
//! Hostnames are resolved as the node resolves them (its /etc/resolv.conf and /etc/hosts),
//! never through cluster DNS lookups of our own.

/// A monitor could not be resolved.
#[derive(Debug, thiserror::Error)]
#[error("StorageClass parameter \"monitors\": cannot resolve {host:?}: {reason}")]
pub struct ResolveError {
    pub host: String,
    pub reason: String,
}

/// Resolves every `host[:port]` entry to `ip[:port]` (IP literals pass through). An entry may
/// name the messenger protocol as Ceph's monitor maps do (`v2:10.0.0.1:3300`, `v1:mon-a:6789`):
/// the prefix is kept on each resolved address.
pub async fn resolve(monitors: &str) -> Result<String, ResolveError> {
    let mut out = Vec::new();
    for entry in monitors.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (protocol, entry) = split_protocol(entry);
        let start = out.len();
        resolve_entry(entry, &mut out).await?;
        if let Some(p) = protocol {
            for resolved in &mut out[start..] {
                *resolved = format!("{p}:{resolved}");
            }
        }
    }
    Ok(out.join(","))
}

/// `v2:host:port` -> (`v2`, `host:port`); `v1:6789` is the host `v1` (a protocol is followed by
/// a host and a port).
fn split_protocol(entry: &str) -> (Option<&str>, &str) {
    match entry.split_once(':') {
        Some((p @ ("v1" | "v2"), rest)) if rest.contains(':') => (Some(p), rest),
        _ => (None, entry),
    }
}

/// Resolves one `host[:port]` entry onto `out`.
async fn resolve_entry(entry: &str, out: &mut Vec<String>) -> Result<(), ResolveError> {
    let (host, port) = match entry.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') || h.starts_with('[') => (h, Some(p)),
        _ => (entry, None),
    };
    let bare = host.trim_matches(|c| c == '[' || c == ']');
    if bare.parse::<std::net::IpAddr>().is_ok() {
        out.push(entry.to_string());
        return Ok(());
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
    Ok(())
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
        // a messenger protocol prefix is kept, on every address of a name too
        assert_eq!(
            resolve("v2:10.0.0.1:3300,v1:[::1]:6789").await.unwrap(),
            "v2:10.0.0.1:3300,v1:[::1]:6789"
        );
        let v2 = resolve("v2:localhost:3300").await.unwrap();
        assert!(v2.starts_with("v2:127.0.0.1:3300"), "{v2}");
        assert!(v2.split(',').all(|e| e.starts_with("v2:")), "{v2}");
        let e = resolve("no-such-host.invalid:6789").await.unwrap_err();
        assert!(e.to_string().contains("no-such-host.invalid"), "{e}");
    }

    #[test]
    fn a_protocol_prefix_needs_a_host_and_port_after_it() {
        assert_eq!(
            split_protocol("v2:10.0.0.1:3300"),
            (Some("v2"), "10.0.0.1:3300")
        );
        assert_eq!(split_protocol("v1:[::1]:6789"), (Some("v1"), "[::1]:6789"));
        assert_eq!(split_protocol("v1:6789"), (None, "v1:6789"));
        assert_eq!(split_protocol("mon-a:6789"), (None, "mon-a:6789"));
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
