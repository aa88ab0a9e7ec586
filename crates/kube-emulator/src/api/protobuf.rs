//! Request bodies in `application/vnd.kubernetes.protobuf`, as kubectl and client-go send them
//! for built-in types: the magic `k8s\0`, then a `runtime.Unknown` envelope whose `raw` is the
//! object's message (without type meta). The message is decoded against the vendored upstream
//! `generated.proto` files (`proto/`, compiled by `build.rs`) and turned into the JSON the
//! apiserver would produce from the same Go object, so the rest of the request path is unchanged.

use std::collections::HashSet;

use axum::body::{Body, HttpBody};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use std::sync::OnceLock;

use prost_reflect::prost::Message as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor,
    ReflectMessage, Value as PValue,
};
use serde_json::{Map, Value, json};

use crate::status::ApiError;
use crate::util::{base64_decode, base64_encode};

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
const TYPE_META: &str = "k8s.io.apimachinery.pkg.runtime.TypeMeta";
const META_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";

/// The media type of Kubernetes protobuf bodies.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

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

/// What the .proto files do not say about the JSON of the Go types, generated from them by
/// `proto/go-fields.py`: fields whose zero value is kept (Go pointers, fields without
/// `omitempty`), and embedded structs whose fields are inline in the parent's JSON.
struct GoFields {
    keep_zero: HashSet<&'static str>,
    inline: HashSet<&'static str>,
}

fn go_fields() -> &'static GoFields {
    static FIELDS: OnceLock<GoFields> = OnceLock::new();
    FIELDS.get_or_init(|| {
        let mut fields = GoFields {
            keep_zero: HashSet::new(),
            inline: HashSet::new(),
        };
        for line in include_str!("../../proto/go-fields.txt").lines() {
            match line.split_once(' ') {
                Some(("keep-zero", f)) => fields.keep_zero.insert(f.trim()),
                Some(("inline", f)) => fields.inline.insert(f.trim()),
                _ => false,
            };
        }
        fields
    })
}

/// Every other zero scalar on the wire is Go's zero value, which the apiserver's JSON omits.
fn keeps_zero(field: &FieldDescriptor) -> bool {
    go_fields().keep_zero.contains(field.full_name())
}

/// The embedded message of an inline field (`Volume.volumeSource`).
fn inline_message(field: &FieldDescriptor) -> Option<MessageDescriptor> {
    match field.kind() {
        Kind::Message(m) if go_fields().inline.contains(field.full_name()) => Some(m),
        _ => None,
    }
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

/// The message of a kind in a group version. Option kinds and Status (DeleteOptions, ...) are
/// registered in every group version, as in Go.
fn message_for(pool: &DescriptorPool, api_version: &str, kind: &str) -> Option<MessageDescriptor> {
    let package = package_of(api_version)?;
    pool.get_message_by_name(&format!("{package}.{kind}"))
        .or_else(|| pool.get_message_by_name(&format!("{META_V1}.{kind}")))
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
    let desc = message_for(pool, &api_version, &kind).ok_or_else(not_registered)?;
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
                let json = value_json(value)?;
                match json {
                    Value::Object(inner) if inline_message(&field).is_some() => out.extend(inner),
                    json => {
                        out.insert(field.name().to_string(), json);
                    }
                }
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

/// Whether an `Accept` header prefers protobuf: its first media type is Kubernetes protobuf, as
/// client-go's `application/vnd.kubernetes.protobuf,application/json` (or `..., */*`).
pub(crate) fn prefers_protobuf(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| {
        let mut parts = first.split(';').map(str::trim);
        parts.next() == Some(MEDIA_TYPE) && parts.all(|p| !p.starts_with("as="))
    })
}

/// A JSON answer re-encoded as protobuf for a client that prefers it. Streams (watches) and
/// answers that are not plain JSON objects of a kind with a protobuf message (discovery,
/// `/version`, Tables) stay as they are: every such client also accepts JSON.
pub(crate) async fn answer(resp: Response) -> Response {
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v == "application/json");
    if !is_json || resp.body().size_hint().exact().is_none() {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            return super::error_response(&ApiError::internal(format!(
                "unable to read the answer: {e}"
            )));
        }
    };
    let encoded = serde_json::from_slice::<Value>(&bytes)
        .map_err(|e| e.to_string())
        .and_then(|v| encode_body(&v));
    match encoded {
        Ok(pb) => {
            parts
                .headers
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(MEDIA_TYPE));
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(pb))
        }
        Err(e) => {
            tracing::debug!(error = %e, "answering JSON instead of protobuf");
            Response::from_parts(parts, Body::from(bytes))
        }
    }
}

/// Encodes a JSON object (with `apiVersion` and `kind`) as a protobuf body: the magic, then
/// `runtime.Unknown` with the type meta and the object's message.
pub(crate) fn encode_body(obj: &Value) -> Result<Vec<u8>, String> {
    let pool = pool().map_err(|e| e.to_string())?;
    let field = |name: &str| obj.get(name).and_then(Value::as_str).unwrap_or_default();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    let desc = message_for(pool, api_version, kind)
        .ok_or_else(|| format!("no protobuf message for kind {kind:?} in {api_version:?}"))?;
    let msg = json_message(&desc, obj)?;
    let descriptor = |name: &str| {
        pool.get_message_by_name(name)
            .ok_or_else(|| format!("{name} is missing from the descriptors"))
    };
    let mut type_meta = DynamicMessage::new(descriptor(TYPE_META)?);
    type_meta.set_field_by_name("apiVersion", PValue::String(api_version.into()));
    type_meta.set_field_by_name("kind", PValue::String(kind.into()));
    let mut unknown = DynamicMessage::new(descriptor(UNKNOWN)?);
    unknown.set_field_by_name("typeMeta", PValue::Message(type_meta));
    unknown.set_field_by_name("raw", PValue::Bytes(msg.encode_to_vec().into()));
    let mut out = MAGIC.to_vec();
    out.extend(unknown.encode_to_vec());
    Ok(out)
}

/// The message for a JSON value: the inverse of [`message_json`].
fn json_message(desc: &MessageDescriptor, v: &Value) -> Result<DynamicMessage, String> {
    let mut msg = DynamicMessage::new(desc.clone());
    let name = desc.full_name();
    let wrong = || format!("{name}: unexpected JSON {v}");
    match name {
        TIME | MICRO_TIME => {
            if v.is_null() {
                return Ok(msg);
            }
            let t = chrono::DateTime::parse_from_rfc3339(v.as_str().ok_or_else(wrong)?)
                .map_err(|e| format!("{name}: {e}"))?;
            msg.set_field_by_name("seconds", PValue::I64(t.timestamp()));
            let nanos = t.timestamp_subsec_micros() * 1000;
            if name == MICRO_TIME && nanos != 0 {
                let nanos = i32::try_from(nanos).map_err(|e| e.to_string())?;
                msg.set_field_by_name("nanos", PValue::I32(nanos));
            }
        }
        QUANTITY => {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(wrong()),
            };
            msg.set_field_by_name("string", PValue::String(text));
        }
        INT_OR_STRING => match v {
            Value::String(s) => {
                msg.set_field_by_name("type", PValue::I64(1));
                msg.set_field_by_name("strVal", PValue::String(s.clone()));
            }
            Value::Number(n) => {
                let n = n.as_i64().and_then(|n| i32::try_from(n).ok());
                msg.set_field_by_name("type", PValue::I64(0));
                msg.set_field_by_name("intVal", PValue::I32(n.ok_or_else(wrong)?));
            }
            _ => return Err(wrong()),
        },
        RAW_EXTENSION | FIELDS_V1 => {
            let field = if name == FIELDS_V1 { "Raw" } else { "raw" };
            let raw = serde_json::to_vec(v).map_err(|e| e.to_string())?;
            msg.set_field_by_name(field, PValue::Bytes(raw.into()));
        }
        _ => {
            let inline: Vec<(FieldDescriptor, MessageDescriptor)> = desc
                .fields()
                .filter_map(|f| inline_message(&f).map(|m| (f, m)))
                .collect();
            let mut inlined: Vec<Map<String, Value>> = vec![Map::new(); inline.len()];
            for (key, value) in v.as_object().ok_or_else(wrong)? {
                if value.is_null() {
                    continue;
                }
                let Some(field) = desc.get_field_by_name(key) else {
                    if let Some(i) = inline
                        .iter()
                        .position(|(_, m)| m.get_field_by_name(key).is_some())
                    {
                        inlined[i].insert(key.clone(), value.clone());
                        continue;
                    }
                    // Type meta is inline in Go and has no field of its own.
                    if key == "apiVersion" || key == "kind" {
                        continue;
                    }
                    return Err(format!("{name} has no field {key:?}"));
                };
                let value = field_value(&field, value)?;
                msg.try_set_field(&field, value)
                    .map_err(|e| format!("{}: {e}", field.full_name()))?;
            }
            for ((field, inner), fields) in inline.iter().zip(inlined) {
                if !fields.is_empty() {
                    let inner = json_message(inner, &Value::Object(fields))?;
                    msg.try_set_field(field, PValue::Message(inner))
                        .map_err(|e| format!("{}: {e}", field.full_name()))?;
                }
            }
        }
    }
    Ok(msg)
}

fn field_value(field: &FieldDescriptor, v: &Value) -> Result<PValue, String> {
    let wrong = || format!("{}: unexpected JSON {v}", field.full_name());
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return Err(wrong());
        };
        let value_kind = entry.map_entry_value_field().kind();
        let mut map = std::collections::HashMap::new();
        for (k, item) in v.as_object().ok_or_else(wrong)? {
            map.insert(MapKey::String(k.clone()), single_value(&value_kind, item)?);
        }
        return Ok(PValue::Map(map));
    }
    if field.is_list() {
        let items = v.as_array().ok_or_else(wrong)?;
        let kind = field.kind();
        return Ok(PValue::List(
            items
                .iter()
                .map(|i| single_value(&kind, i))
                .collect::<Result<_, _>>()?,
        ));
    }
    single_value(&field.kind(), v)
}

fn single_value(kind: &Kind, v: &Value) -> Result<PValue, String> {
    let wrong = || format!("expected {kind:?}, got {v}");
    let int = || v.as_i64().ok_or_else(wrong);
    let uint = || v.as_u64().ok_or_else(wrong);
    Ok(match kind {
        Kind::String => PValue::String(v.as_str().ok_or_else(wrong)?.to_string()),
        Kind::Bytes => {
            let text = v.as_str().ok_or_else(wrong)?;
            PValue::Bytes(base64_decode(text).ok_or_else(wrong)?.into())
        }
        Kind::Bool => PValue::Bool(v.as_bool().ok_or_else(wrong)?),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            PValue::I32(i32::try_from(int()?).map_err(|_| wrong())?)
        }
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => PValue::I64(int()?),
        Kind::Uint32 | Kind::Fixed32 => PValue::U32(u32::try_from(uint()?).map_err(|_| wrong())?),
        Kind::Uint64 | Kind::Fixed64 => PValue::U64(uint()?),
        Kind::Double => PValue::F64(v.as_f64().ok_or_else(wrong)?),
        Kind::Float => PValue::F32(v.as_f64().ok_or_else(wrong)? as f32),
        Kind::Enum(_) => return Err(wrong()),
        Kind::Message(desc) => PValue::Message(json_message(desc, v)?),
    })
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

    /// JSON -> protobuf -> JSON is the identity for objects holding no Go zero values.
    fn round_trip(obj: &Value) {
        let pb = encode_body(obj).unwrap_or_else(|e| panic!("{e}: {obj}"));
        assert!(pb.starts_with(MAGIC));
        let back = decode_body(&pb).unwrap_or_else(|e| panic!("{e}: {obj}"));
        assert_eq!(&back, obj);
    }

    #[test]
    fn objects_of_the_served_kinds_round_trip() {
        let meta = json!({"name": "x", "namespace": "default", "uid": "u-1", "resourceVersion": "7",
            "creationTimestamp": "2026-01-02T03:04:05Z", "labels": {"a": "b"},
            "annotations": {"pv.kubernetes.io/bound-by-controller": "yes"},
            "finalizers": ["kubernetes.io/pvc-protection"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-2", "controller": true}],
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                "time": "2026-01-02T03:04:05Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:resources": {}}}}]});
        round_trip(
            &json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "", "volumeMode": "Block", "volumeName": "pv-1"},
            "status": {"phase": "Bound", "capacity": {"storage": "2Gi"},
                "conditions": [{"type": "Resizing", "status": "True",
                    "lastTransitionTime": "2026-01-02T03:04:06Z"}],
                "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"}}}),
        );
        round_trip(&json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1"},
            "spec": {"capacity": {"storage": "1Gi"}, "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "x",
                    "uid": "u-1", "resourceVersion": "7", "apiVersion": "v1"},
                "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "rbd/img",
                    "volumeAttributes": {"pool": "rbd"},
                    "nodeStageSecretRef": {"name": "s", "namespace": "kube-system"}},
                "rbd": {"monitors": ["10.0.0.1:6789"], "image": "img", "pool": "rbd",
                    "user": "admin", "secretRef": {"name": "s", "namespace": "kube-system"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions":
                    [{"key": "k", "operator": "In", "values": ["v"]}]}]}}},
            "status": {"phase": "Released", "lastPhaseTransitionTime": "2026-01-02T03:04:05Z"}}));
        round_trip(
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}},
                "livenessProbe": {"tcpSocket": {"port": 8080}},
                "resources": {"limits": {"cpu": "100m"}}}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "x"}},
                    {"name": "e", "emptyDir": {}}],
                "terminationGracePeriodSeconds": 0}}),
        );
        round_trip(&json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "x.1", "namespace": "default"},
            "involvedObject": {"kind": "PersistentVolumeClaim", "name": "x"},
            "reason": "ExternalProvisioning", "message": "waiting", "type": "Normal", "count": 3,
            "source": {"component": "persistentvolume-controller"},
            "firstTimestamp": "2026-01-02T03:04:05Z"}));
        round_trip(&json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "x.2", "namespace": "default"},
            "eventTime": "2026-01-02T03:04:05.123456Z", "reportingController": "c",
            "reportingInstance": "i", "action": "Provision", "reason": "R", "note": "n",
            "regarding": {"kind": "Pod", "name": "p"}, "type": "Normal"}));
        round_trip(
            &json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": "rbd.csi.ceph.com"},
            "spec": {"attachRequired": false, "podInfoOnMount": false,
                "volumeLifecycleModes": ["Persistent"], "fsGroupPolicy": "File"}}),
        );
    }

    #[test]
    fn lists_and_statuses_round_trip() {
        round_trip(&json!({"apiVersion": "v1", "kind": "SecretList",
            "metadata": {"resourceVersion": "9", "continue": "abc", "remainingItemCount": 2},
            "items": [{"metadata": {"name": "a"}, "data": {"k": "AAH/"}, "type": "Opaque"}]}));
        round_trip(
            &json!({"apiVersion": "v1", "kind": "Status", "metadata": {},
            "status": "Failure", "message": "m", "reason": "Invalid", "code": 422,
            "details": {"name": "x", "kind": "persistentvolumeclaims", "causes": [
                {"reason": "FieldValueInvalid", "message": "bad", "field": "spec"}],
                "retryAfterSeconds": 1}}),
        );
    }

    #[test]
    fn accept_headers_that_prefer_protobuf() {
        assert!(prefers_protobuf(
            "application/vnd.kubernetes.protobuf,application/json"
        ));
        assert!(prefers_protobuf("application/vnd.kubernetes.protobuf, */*"));
        assert!(!prefers_protobuf("application/json"));
        assert!(!prefers_protobuf(""));
        assert!(!prefers_protobuf(
            "application/json, application/vnd.kubernetes.protobuf"
        ));
        assert!(!prefers_protobuf(
            "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io"
        ));
    }

    #[test]
    fn objects_without_a_message_are_not_encoded() {
        assert!(encode_body(&json!({"major": "1", "minor": "36"})).is_err());
        let err =
            encode_body(&json!({"apiVersion": "v1", "kind": "Secret", "bogus": 1})).unwrap_err();
        assert!(err.contains("bogus"), "{err}");
    }
}
