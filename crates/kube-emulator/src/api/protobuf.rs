//! Request bodies in `application/vnd.kubernetes.protobuf`, as kubectl and client-go send them
//! for built-in types: the magic `k8s\0`, then a `runtime.Unknown` envelope whose `raw` is the
//! object's message (without type meta). The message is decoded against the vendored upstream
//! `generated.proto` files (`proto/`, compiled by `build.rs`) and turned into the JSON the
//! apiserver would produce from the same Go object, so the rest of the request path is unchanged.

use std::collections::HashSet;
use std::sync::OnceLock;

use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, MapKey, ReflectMessage, Value as PValue,
};
use serde_json::{Map, Value, json};

use crate::status::ApiError;
use crate::util::base64_encode;

/// The prefix of every Kubernetes protobuf body.
pub(crate) const MAGIC: &[u8] = b"k8s\0";

const TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime";
const DURATION: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Duration";
const FIELDS_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1";
const QUANTITY: &str = "k8s.io.apimachinery.pkg.api.resource.Quantity";
const INT_OR_STRING: &str = "k8s.io.apimachinery.pkg.util.intstr.IntOrString";
const RAW_EXTENSION: &str = "k8s.io.apimachinery.pkg.runtime.RawExtension";
const UNKNOWN: &str = "k8s.io.apimachinery.pkg.runtime.Unknown";
const META_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";

/// Why a protobuf body could not be decoded; the text is the 400's message.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProtoError {
    #[error("empty data")]
    Empty,
    #[error(
        "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]"
    )]
    NoMagic,
    #[error("protobuf envelope (runtime.Unknown) is invalid: {0}")]
    Envelope(String),
    #[error(
        "protobuf envelope has content encoding {0:?}; only the identity encoding is supported"
    )]
    ContentEncoding(String),
    #[error("Object 'Kind' is missing in the protobuf envelope")]
    MissingKind,
    #[error("no kind \"{kind}\" is registered for version \"{api_version}\"")]
    NotRegistered { kind: String, api_version: String },
    #[error("unable to decode {message} from protobuf: {detail}")]
    Message { message: String, detail: String },
    #[error("the protobuf descriptors compiled into the emulator are unusable: {0}")]
    Descriptors(String),
}

fn pool() -> Result<&'static DescriptorPool, ProtoError> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(&include_bytes!(concat!(env!("OUT_DIR"), "/k8s-protos.bin"))[..])
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| ProtoError::Descriptors(e.clone()))
}

/// Fields whose zero value is kept (Go pointers and fields without `omitempty`), generated from
/// the Go types by `proto/keep-zero.py`. Every other zero scalar on the wire is Go's zero value,
/// which the apiserver's JSON omits.
fn keeps_zero(field: &FieldDescriptor) -> bool {
    static KEEP: OnceLock<HashSet<&'static str>> = OnceLock::new();
    KEEP.get_or_init(|| {
        include_str!("../../proto/keep-zero.txt")
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    })
    .contains(field.full_name())
}

/// The protobuf package of an API group version (`storage.k8s.io/v1` -> `k8s.io.api.storage.v1`).
fn package_of(api_version: &str) -> Option<String> {
    match api_version.split_once('/') {
        None => Some(format!("k8s.io.api.core.{api_version}")),
        Some(("meta.k8s.io", v)) => Some(format!("k8s.io.apimachinery.pkg.apis.meta.{v}")),
        Some((group, v)) if group.ends_with(".k8s.io") => {
            let short = group.trim_end_matches(".k8s.io").replace('.', "");
            Some(format!("k8s.io.api.{short}.{v}"))
        }
        Some(_) => None,
    }
}

/// A protobuf request body as JSON, or the 400 the apiserver answers (`BadRequest` with the
/// decoder's message).
pub(super) fn decode_request(body: &[u8]) -> Result<Value, ApiError> {
    decode_body(body).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Decodes a whole protobuf request body into the JSON object it stands for, with `apiVersion`
/// and `kind` from the envelope.
pub(crate) fn decode_body(body: &[u8]) -> Result<Value, ProtoError> {
    if body.is_empty() {
        return Err(ProtoError::Empty);
    }
    let rest = body.strip_prefix(MAGIC).ok_or(ProtoError::NoMagic)?;
    let pool = pool()?;
    let unknown_desc = pool
        .get_message_by_name(UNKNOWN)
        .ok_or_else(|| ProtoError::Descriptors(format!("{UNKNOWN} is missing")))?;
    let unknown = DynamicMessage::decode(unknown_desc, rest)
        .map_err(|e| ProtoError::Envelope(e.to_string()))?;
    let text = |msg: &DynamicMessage, name: &str| {
        msg.get_field_by_name(name)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let encoding = text(&unknown, "contentEncoding");
    if !encoding.is_empty() {
        return Err(ProtoError::ContentEncoding(encoding));
    }
    let (api_version, kind) = match unknown.get_field_by_name("typeMeta") {
        Some(tm) => match tm.as_message() {
            Some(tm) => (text(tm, "apiVersion"), text(tm, "kind")),
            None => (String::new(), String::new()),
        },
        None => (String::new(), String::new()),
    };
    if kind.is_empty() {
        return Err(ProtoError::MissingKind);
    }
    let not_registered = || ProtoError::NotRegistered {
        kind: kind.clone(),
        api_version: api_version.clone(),
    };
    let package = package_of(&api_version).ok_or_else(not_registered)?;
    // Option kinds (DeleteOptions, ...) are registered in every group version, as in Go.
    let desc = pool
        .get_message_by_name(&format!("{package}.{kind}"))
        .or_else(|| pool.get_message_by_name(&format!("{META_V1}.{kind}")))
        .ok_or_else(not_registered)?;
    let raw = unknown
        .get_field_by_name("raw")
        .and_then(|v| v.as_bytes().cloned())
        .unwrap_or_default();
    let msg = DynamicMessage::decode(desc.clone(), raw).map_err(|e| ProtoError::Message {
        message: desc.full_name().to_string(),
        detail: e.to_string(),
    })?;
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind));
    match message_json(&msg)? {
        Value::Object(fields) => obj.extend(fields),
        _ => {
            return Err(ProtoError::Message {
                message: desc.full_name().to_string(),
                detail: "not an object".into(),
            });
        }
    }
    Ok(Value::Object(obj))
}

fn invalid(msg: &DynamicMessage, detail: impl Into<String>) -> ProtoError {
    ProtoError::Message {
        message: msg.descriptor().full_name().to_string(),
        detail: detail.into(),
    }
}

fn int_field(msg: &DynamicMessage, name: &str) -> i64 {
    match msg.get_field_by_name(name).as_deref() {
        Some(PValue::I64(v)) => *v,
        Some(PValue::I32(v)) => i64::from(*v),
        _ => 0,
    }
}

fn has_fields(msg: &DynamicMessage) -> bool {
    msg.fields().next().is_some()
}

/// A message as the JSON of its Go type, with apimachinery's custom encodings.
fn message_json(msg: &DynamicMessage) -> Result<Value, ProtoError> {
    match msg.descriptor().full_name() {
        // Go's Time unmarshals an empty message as the zero time (JSON null) and keeps seconds
        // only; MicroTime keeps microseconds.
        TIME | MICRO_TIME if !has_fields(msg) => Ok(Value::Null),
        name @ (TIME | MICRO_TIME) => {
            let secs = int_field(msg, "seconds");
            let nanos = u32::try_from(int_field(msg, "nanos")).unwrap_or(0);
            let (nanos, format) = if name == TIME {
                (0, "%Y-%m-%dT%H:%M:%SZ")
            } else {
                (nanos / 1000 * 1000, "%Y-%m-%dT%H:%M:%S%.6fZ")
            };
            let t = chrono::DateTime::from_timestamp(secs, nanos)
                .ok_or_else(|| invalid(msg, format!("time out of range: {secs}s")))?;
            Ok(json!(t.format(format).to_string()))
        }
        DURATION => Ok(json!(go_duration(int_field(msg, "duration")))),
        QUANTITY => Ok(json!(
            msg.get_field_by_name("string")
                .and_then(|v| v.as_str().map(str::to_string))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "0".into())
        )),
        INT_OR_STRING => Ok(if int_field(msg, "type") == 1 {
            json!(
                msg.get_field_by_name("strVal")
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            )
        } else {
            json!(int_field(msg, "intVal"))
        }),
        RAW_EXTENSION | FIELDS_V1 => {
            let field = if msg.descriptor().full_name() == FIELDS_V1 {
                "Raw"
            } else {
                "raw"
            };
            let raw = msg
                .get_field_by_name(field)
                .and_then(|v| v.as_bytes().cloned())
                .unwrap_or_default();
            if raw.is_empty() {
                return Ok(Value::Null);
            }
            serde_json::from_slice(&raw)
                .map_err(|e| invalid(msg, format!("embedded object is not JSON: {e}")))
        }
        _ => {
            let mut out = Map::new();
            for (field, value) in msg.fields() {
                if is_zero_scalar(value) && !keeps_zero(&field) {
                    continue;
                }
                out.insert(field.name().to_string(), value_json(value)?);
            }
            Ok(Value::Object(out))
        }
    }
}

fn is_zero_scalar(v: &PValue) -> bool {
    match v {
        PValue::Bool(b) => !b,
        PValue::I32(n) | PValue::EnumNumber(n) => *n == 0,
        PValue::I64(n) => *n == 0,
        PValue::U32(n) => *n == 0,
        PValue::U64(n) => *n == 0,
        PValue::F32(n) => *n == 0.0,
        PValue::F64(n) => *n == 0.0,
        PValue::String(s) => s.is_empty(),
        PValue::Bytes(b) => b.is_empty(),
        PValue::Message(_) | PValue::List(_) | PValue::Map(_) => false,
    }
}

fn value_json(v: &PValue) -> Result<Value, ProtoError> {
    Ok(match v {
        PValue::Bool(b) => json!(b),
        PValue::I32(n) | PValue::EnumNumber(n) => json!(n),
        PValue::I64(n) => json!(n),
        PValue::U32(n) => json!(n),
        PValue::U64(n) => json!(n),
        PValue::F32(n) => json!(n),
        PValue::F64(n) => json!(n),
        PValue::String(s) => json!(s),
        PValue::Bytes(b) => json!(base64_encode(b, false)),
        PValue::Message(m) => message_json(m)?,
        PValue::List(items) => {
            Value::Array(items.iter().map(value_json).collect::<Result<_, _>>()?)
        }
        PValue::Map(entries) => {
            let mut out = Map::new();
            for (k, v) in entries {
                let key = match k {
                    MapKey::String(s) => s.clone(),
                    MapKey::Bool(b) => b.to_string(),
                    MapKey::I32(n) => n.to_string(),
                    MapKey::I64(n) => n.to_string(),
                    MapKey::U32(n) => n.to_string(),
                    MapKey::U64(n) => n.to_string(),
                };
                out.insert(key, value_json(v)?);
            }
            Value::Object(out)
        }
    })
}

/// Go's `time.Duration.String()` (`1h2m3.5s`, `300ms`, `0s`).
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let u = nanos.unsigned_abs();
    // Below one second Go picks the largest unit that keeps an integer part.
    let fraction = |value: u64, scale: u64| {
        let int = value / scale;
        let frac = value % scale;
        if frac == 0 {
            int.to_string()
        } else {
            let digits = scale.ilog10() as usize;
            let f = format!("{frac:0digits$}");
            format!("{int}.{}", f.trim_end_matches('0'))
        }
    };
    if u < 1_000 {
        return format!("{sign}{u}ns");
    }
    if u < 1_000_000 {
        return format!("{sign}{}µs", fraction(u, 1_000));
    }
    if u < 1_000_000_000 {
        return format!("{sign}{}ms", fraction(u, 1_000_000));
    }
    let secs_total = u / 1_000_000_000;
    let sub = u % 1_000_000_000;
    let h = secs_total / 3600;
    let m = (secs_total / 60) % 60;
    let s = fraction((secs_total % 60) * 1_000_000_000 + sub, 1_000_000_000);
    match (h, m) {
        (0, 0) => format!("{sign}{s}s"),
        (0, m) => format!("{sign}{m}m{s}s"),
        (h, m) => format!("{sign}{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_duration_matches_go() {
        for (n, s) in [
            (0, "0s"),
            (1, "1ns"),
            (1_500, "1.5µs"),
            (300_000_000, "300ms"),
            (1_000_000_000, "1s"),
            (90_000_000_000, "1m30s"),
            (3_600_000_000_000, "1h0m0s"),
            (3_723_500_000_000, "1h2m3.5s"),
            (-2_000_000_000, "-2s"),
        ] {
            assert_eq!(go_duration(n), s, "{n}");
        }
    }

    #[test]
    fn packages_of_group_versions() {
        assert_eq!(package_of("v1").as_deref(), Some("k8s.io.api.core.v1"));
        assert_eq!(
            package_of("storage.k8s.io/v1").as_deref(),
            Some("k8s.io.api.storage.v1")
        );
        assert_eq!(package_of("example.com/v1"), None);
    }

    #[test]
    fn bodies_without_the_magic_or_with_garbage_are_named_errors() {
        assert!(matches!(decode_body(b""), Err(ProtoError::Empty)));
        assert!(matches!(decode_body(b"{}"), Err(ProtoError::NoMagic)));
        let err = decode_body(b"k8s\0\x0a\xff\xff").unwrap_err();
        assert!(matches!(err, ProtoError::Envelope(_)), "{err}");
    }
}
