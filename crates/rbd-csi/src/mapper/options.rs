//! Map and unmap options: the node's `--krbd-map-options` flag and the `mapOptions` /
//! `unmapOptions` `StorageClass` parameters, in ceph-csi's syntax.
//!
//! A value is a `;`-separated list of `MOUNTER:OPTIONS` entries, `MOUNTER` being `krbd` or `nbd`
//! and `OPTIONS` a comma-separated list of `name` or `name=value` (`krbd:queue_depth=1024,
//! ms_mode=secure;nbd:try-netlink`). An entry without `MOUNTER:` applies to the volume's own
//! mounter. The controller checks a class's values when it creates a volume (errors name the
//! parameter and the option); the node checks them again before it passes them on.
//!
//! krbd options are the kernel's and `rbd map`'s (`rbd map -o`); rbd-nbd options become
//! `rbd-nbd map --name[=value]` flags. Options that would carry a secret or change who maps
//! (`secret`, `key`, `keyfile`, `name`, `id`, ...) are refused: the key reaches the helper
//! only through its private key file.

use std::fmt;

use super::MounterKind;

/// Which list an option string is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// `mapOptions`.
    Map,
    /// `unmapOptions`.
    Unmap,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Self::Map => "mapOptions",
            Self::Unmap => "unmapOptions",
        }
    }
}

/// The options of each mapper, parsed from one `mapOptions`/`unmapOptions` value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MounterOptions {
    /// `krbd:` options (comma-joined).
    pub krbd: Option<String>,
    /// `nbd:` options (comma-joined).
    pub nbd: Option<String>,
    /// Options without a mounter prefix: for the volume's own mounter.
    pub unprefixed: Option<String>,
}

impl MounterOptions {
    /// The options for `mounter`: its own entry, else the unprefixed one.
    #[must_use]
    pub fn for_mounter(&self, mounter: MounterKind) -> Option<&str> {
        let own = match mounter {
            MounterKind::Krbd => self.krbd.as_deref(),
            MounterKind::Nbd => self.nbd.as_deref(),
            MounterKind::FuseLoop => None,
        };
        own.or(self.unprefixed.as_deref())
    }
}

/// krbd `rbd map -o` options (the kernel's rbd and libceph options, and the CLI's `udev`).
const KRBD_MAP: &[&str] = &[
    "alloc_size",
    "compression_hint",
    "exclusive",
    "lock_on_read",
    "lock_timeout",
    "notrim",
    "queue_depth",
    "read_only",
    "ro",
    "read_write",
    "rw",
    "rxbounce",
    "udev",
    "noudev",
    "ms_mode",
    "read_from_replica",
    "crush_location",
    "mount_timeout",
    "osd_idle_ttl",
    "osdkeepalive",
    "osd_request_timeout",
    "share",
    "noshare",
    "crc",
    "nocrc",
    "cephx_require_signatures",
    "nocephx_require_signatures",
    "cephx_sign_messages",
    "nocephx_sign_messages",
    "tcp_nodelay",
    "notcp_nodelay",
    "abort_on_full",
];
/// krbd `rbd unmap -o` options.
const KRBD_UNMAP: &[&str] = &["force", "udev", "noudev"];
/// `rbd-nbd map` flags taken as options.
const NBD_MAP: &[&str] = &[
    "try-netlink",
    "io-timeout",
    "timeout",
    "reattach-timeout",
    "exclusive",
    "notrim",
    "quiesce",
    "read-only",
    "max_part",
    "nbds_max",
];
/// `rbd-nbd unmap` flags taken as options.
const NBD_UNMAP: &[&str] = &[];

/// The `ms_mode` values krbd accepts.
const MS_MODES: &[&str] = &["legacy", "crc", "secure", "prefer-crc", "prefer-secure"];

/// An option list that cannot be used, naming the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct OptionsError {
    /// Where the value came from (`parameters.mapOptions`, `--krbd-map-options`, ...).
    pub field: String,
    /// What is wrong, naming the option.
    pub problem: String,
}

/// Parses and checks a `mapOptions`/`unmapOptions` value (`field` names it in errors).
///
/// # Errors
/// A message naming `field` and the entry or option at fault: an unknown mounter prefix, two
/// entries for one mounter, an option that is malformed, unknown for its mounter or would
/// carry a secret, a bad `ms_mode` value.
pub fn parse(field: &str, which: Which, value: &str) -> Result<MounterOptions, OptionsError> {
    let err = |problem: String| OptionsError {
        field: field.to_owned(),
        problem,
    };
    let mut parsed = MounterOptions::default();
    for entry in value.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (mounter, options) = match entry.split_once(':') {
            Some((prefix, options)) => {
                let mounter = match prefix.trim() {
                    "krbd" => Some(MounterKind::Krbd),
                    "nbd" => Some(MounterKind::Nbd),
                    other => {
                        return Err(err(format!(
                            "unknown mounter {other:?} in entry {entry:?} (expected krbd:... or \
                             nbd:...)"
                        )));
                    }
                };
                (mounter, options.trim())
            }
            None => (None, entry),
        };
        let slot = match mounter {
            Some(MounterKind::Krbd) => &mut parsed.krbd,
            Some(MounterKind::Nbd) => &mut parsed.nbd,
            _ => &mut parsed.unprefixed,
        };
        if slot.is_some() {
            return Err(err(format!(
                "more than one entry for {} (entry {entry:?})",
                mounter.map_or("the volume's mounter", MounterKind::as_str)
            )));
        }
        let checked = check_list(which, mounter, options).map_err(err)?;
        *slot = Some(checked).filter(|o| !o.is_empty());
    }
    Ok(parsed)
}

/// Checks one mounter's comma-separated options; `None` mounter: valid for krbd or nbd.
fn check_list(which: Which, mounter: Option<MounterKind>, options: &str) -> Result<String, String> {
    let mut out = Vec::new();
    for option in options.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        let (name, value) = match option.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (option, None),
        };
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        let value_ok = value.is_none_or(|v| {
            !v.is_empty()
                && !v.starts_with('-')
                && v.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':' | b'/')
                })
        });
        if !name_ok || !value_ok {
            return Err(format!(
                "option {option:?} is malformed (expected name or name=value of letters, digits \
                 and _-.:/)"
            ));
        }
        if matches!(
            name,
            "secret" | "key" | "keyfile" | "keyring" | "name" | "id" | "user" | "mon_addr"
        ) {
            return Err(format!(
                "option {name:?} is not allowed (the node passes identity and key itself)"
            ));
        }
        let known = |kind: MounterKind| {
            let list = match (kind, which) {
                (MounterKind::Krbd, Which::Map) => KRBD_MAP,
                (MounterKind::Krbd, Which::Unmap) => KRBD_UNMAP,
                (MounterKind::Nbd, Which::Map) => NBD_MAP,
                (MounterKind::Nbd, Which::Unmap) => NBD_UNMAP,
                (MounterKind::FuseLoop, _) => &[],
            };
            list.contains(&name)
        };
        let ok = match mounter {
            Some(kind) => known(kind),
            None => known(MounterKind::Krbd) || known(MounterKind::Nbd),
        };
        if !ok {
            let whose = mounter.map_or_else(|| "krbd or nbd".to_owned(), |m| m.to_string());
            return Err(format!(
                "unknown {whose} {} option {name:?}",
                match which {
                    Which::Map => "map",
                    Which::Unmap => "unmap",
                }
            ));
        }
        if name == "ms_mode" && !value.is_some_and(|v| MS_MODES.contains(&v)) {
            return Err(format!(
                "option {option:?}: ms_mode must be one of {}",
                MS_MODES.join(", ")
            ));
        }
        out.push(option);
    }
    Ok(out.join(","))
}

/// Checks a whole value as a class parameter (`parameters.mapOptions`); the controller's check.
///
/// # Errors
/// See [`parse`].
pub fn check_parameter(which: Which, value: &str) -> Result<(), OptionsError> {
    parse(&format!("parameters.{}", which.name()), which, value).map(drop)
}

/// The value of a volume context's `mapOptions`/`unmapOptions` for `mounter`, checked.
///
/// # Errors
/// See [`parse`]; the field is `volume_context.mapOptions` (or `unmapOptions`).
pub fn for_volume(
    which: Which,
    value: Option<&str>,
    mounter: MounterKind,
) -> Result<Option<String>, OptionsError> {
    let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let field = format!("volume_context.{}", which.name());
    let parsed = parse(&field, which, value)?;
    let options = parsed.for_mounter(mounter).map(str::to_owned);
    if let Some(options) = &options {
        // An unprefixed entry was only checked against both lists: check it as this mounter's.
        check_list(which, Some(mounter), options).map_err(|problem| OptionsError {
            field: field.clone(),
            problem,
        })?;
    }
    Ok(options)
}

/// Joins option lists, later lists winning for an option name they repeat (`node` flag, then
/// the volume's).
#[must_use]
pub fn merge(lists: &[Option<&str>]) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for list in lists.iter().flatten() {
        for option in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            let name = option.split_once('=').map_or(option, |(n, _)| n);
            out.retain(|o| o.split_once('=').map_or(*o, |(n, _)| n) != name);
            out.push(option);
        }
    }
    Some(out.join(",")).filter(|o| !o.is_empty())
}

/// `rbd-nbd` flags for nbd options: `name` becomes `--name`, `name=value` `--name value`.
#[must_use]
pub fn nbd_flags(options: Option<&str>) -> Vec<String> {
    let mut flags = Vec::new();
    for option in options
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|o| !o.is_empty())
    {
        match option.split_once('=') {
            Some((name, value)) => {
                flags.push(format!("--{name}"));
                flags.push(value.to_owned());
            }
            None => flags.push(format!("--{option}")),
        }
    }
    flags
}

/// The `ms_mode` krbd needs when none is configured, from the monitor addresses as the `rbd`
/// CLI reads them (`-m`): an address is msgr1 when it says `v1:`, or has no prefix and the
/// msgr1 port 6789 or no port at all; otherwise msgr2 (`v2:`, port 3300, any other port). The
/// CLI hands krbd only the addresses of the kernel's mode (legacy = msgr1 unless `ms_mode` says
/// otherwise), so monitors without any msgr1 address cannot be mapped without `ms_mode`
/// (`rbd: failed to get mon address (possible ms_mode mismatch)`): for them `prefer-crc`
/// (msgr2, integrity-checked, not encrypted: what `ms_mode=legacy` gave on msgr1). With any
/// msgr1 address, nothing is added, so kernels before 5.11 (which know no `ms_mode`) keep
/// working as before.
#[must_use]
pub fn default_ms_mode(monitors: &str) -> Option<&'static str> {
    let entries: Vec<&str> = monitors
        .split(',')
        .map(|e| e.trim().trim_start_matches('[').trim_end_matches(']'))
        .filter(|e| !e.is_empty())
        .collect();
    if entries.is_empty() {
        return None;
    }
    let msgr1 = |entry: &str| -> bool {
        if let Some(rest) = entry.strip_prefix("v1:") {
            return !rest.is_empty();
        }
        if entry.starts_with("v2:") {
            return false;
        }
        // IPv6 in brackets was unwrapped above only at the ends; take the text after the last
        // ':' as the port when it is all digits and the address is not a bare IPv6 one.
        let port = if entry.matches(':').count() == 1 {
            entry.rsplit_once(':').map(|(_, p)| p)
        } else if let Some((_, p)) = entry.rsplit_once("]:") {
            Some(p)
        } else {
            None
        };
        match port {
            None => true,
            Some(p) => p == "6789",
        }
    };
    if entries.iter().any(|e| msgr1(e)) {
        None
    } else {
        Some("prefer-crc")
    }
}

/// Whether an option list sets `name` (`ms_mode`, ...).
#[must_use]
pub fn sets(options: Option<&str>, name: &str) -> bool {
    options.unwrap_or_default().split(',').any(|o| {
        let o = o.trim();
        o == name || o.split_once('=').is_some_and(|(n, _)| n == name)
    })
}

/// The krbd option in `options` that maps an image writable (`rw`, `read_write`), if any: never
/// allowed on a read-only stage.
#[must_use]
pub fn writable_option(options: Option<&str>) -> Option<&'static str> {
    ["rw", "read_write"]
        .into_iter()
        .find(|name| sets(options, name))
}

impl fmt::Display for Which {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceph_csi_syntax_is_parsed_per_mounter() {
        let p = parse(
            "parameters.mapOptions",
            Which::Map,
            "krbd:queue_depth=1024,ms_mode=secure;nbd:try-netlink,io-timeout=30",
        )
        .unwrap();
        assert_eq!(p.krbd.as_deref(), Some("queue_depth=1024,ms_mode=secure"));
        assert_eq!(p.nbd.as_deref(), Some("try-netlink,io-timeout=30"));
        assert_eq!(p.for_mounter(MounterKind::FuseLoop), None);
        let bare = parse("f", Which::Map, "lock_on_read").unwrap();
        assert_eq!(bare.for_mounter(MounterKind::Krbd), Some("lock_on_read"));
        assert!(parse("f", Which::Map, "").unwrap() == MounterOptions::default());
    }

    #[test]
    fn errors_name_the_field_and_the_option() {
        let cases = [
            ("krbd:queue_depth=1;krbd:ro", "more than one entry for krbd"),
            ("fuse:x", "unknown mounter \"fuse\""),
            ("krbd:bogus", "unknown krbd map option \"bogus\""),
            ("krbd:secret=AQB", "option \"secret\" is not allowed"),
            ("nbd:keyfile=/etc/x", "option \"keyfile\" is not allowed"),
            ("krbd:ms_mode=fast", "ms_mode must be one of"),
            (
                "krbd:queue_depth=1 2",
                "option \"queue_depth=1 2\" is malformed",
            ),
            ("krbd:ro=-o", "malformed"),
            (
                "nbd:try-netlink,ms_mode=crc",
                "unknown rbd-nbd map option \"ms_mode\"",
            ),
        ];
        for (value, want) in cases {
            let e = parse("parameters.mapOptions", Which::Map, value).unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with("parameters.mapOptions: ") && text.contains(want),
                "{value}: {text}"
            );
        }
        let e = parse(
            "parameters.unmapOptions",
            Which::Unmap,
            "krbd:queue_depth=4",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown krbd unmap option \"queue_depth\"")
        );
        assert!(parse("f", Which::Unmap, "krbd:force").is_ok());
    }

    #[test]
    fn volume_options_pick_the_mounter_and_check_unprefixed_ones_for_it() {
        let v = Some("krbd:ms_mode=crc;nbd:try-netlink");
        assert_eq!(
            for_volume(Which::Map, v, MounterKind::Krbd)
                .unwrap()
                .as_deref(),
            Some("ms_mode=crc")
        );
        assert_eq!(
            for_volume(Which::Map, v, MounterKind::Nbd)
                .unwrap()
                .as_deref(),
            Some("try-netlink")
        );
        // unprefixed krbd option on an nbd volume
        let e = for_volume(Which::Map, Some("queue_depth=8"), MounterKind::Nbd).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("volume_context.mapOptions: unknown rbd-nbd")
        );
        assert_eq!(
            for_volume(Which::Map, None, MounterKind::Krbd).unwrap(),
            None
        );
    }

    #[test]
    fn merge_lets_later_lists_win() {
        assert_eq!(
            merge(&[
                Some("noudev,ms_mode=crc"),
                Some("ms_mode=secure,queue_depth=8")
            ])
            .as_deref(),
            Some("noudev,ms_mode=secure,queue_depth=8")
        );
        assert_eq!(merge(&[None, Some("")]), None);
        assert_eq!(
            nbd_flags(Some("try-netlink,io-timeout=30")),
            ["--try-netlink", "--io-timeout", "30"]
        );
    }

    #[test]
    fn ms_mode_default_follows_the_monitor_addresses() {
        // msgr2 only, as the CLI reads them: prefer-crc
        for m in [
            "127.0.0.1:40000",
            "10.0.0.1:3300,10.0.0.2:3300",
            "v2:10.0.0.1:3300",
            "[v2:10.0.0.1:3300]",
            "mon.example:40000",
        ] {
            assert_eq!(default_ms_mode(m), Some("prefer-crc"), "{m}");
        }
        // any msgr1 address: nothing added (works on every kernel)
        for m in [
            "10.0.0.1:6789",
            "10.0.0.1",
            "v1:127.0.0.1:40001",
            "127.0.0.1:40000,v1:127.0.0.1:40001",
            "mon.example",
        ] {
            assert_eq!(default_ms_mode(m), None, "{m}");
        }
        assert!(sets(Some("noudev,ms_mode=crc"), "ms_mode"));
        assert_eq!(writable_option(Some("queue_depth=8,rw")), Some("rw"));
        assert_eq!(writable_option(Some("read_write")), Some("read_write"));
        assert_eq!(writable_option(Some("ro,rwx")), None);
        assert_eq!(writable_option(None), None);
        assert!(!sets(Some("noudev"), "ms_mode"));
    }
}
