//! Small helpers: timestamps, names, base64, query strings, JSON accessors.

use rand::Rng;
use serde_json::{Map, Value};

/// `metav1.Time` format (seconds precision).
pub(crate) fn now_time() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Nanoseconds since the epoch, for Event names (`<object>.<hex>`).
pub(crate) fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The alphabet of `k8s.io/apimachinery/pkg/util/rand` (no vowels, no confusable digits).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `generateName` semantics: the prefix cut to 58 characters plus 5 random characters.
pub(crate) fn generate_name(prefix: &str) -> String {
    let cut: String = prefix.chars().take(58).collect();
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| NAME_ALPHABET[rng.random_range(0..NAME_ALPHABET.len())] as char)
        .collect();
    format!("{cut}{suffix}")
}

pub(crate) const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

pub(crate) const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

pub(crate) fn is_dns1123_label(s: &str) -> bool {
    is_label(s)
}

const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard (padded) or URL-safe (unpadded) base64.
pub(crate) fn base64_encode(data: &[u8], url_safe: bool) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                let idx = ((n >> (18 - 6 * i)) & 63) as usize;
                let c = B64[idx] as char;
                out.push(match (url_safe, c) {
                    (true, '+') => '-',
                    (true, '/') => '_',
                    _ => c,
                });
            } else if !url_safe {
                out.push('=');
            }
        }
    }
    out
}

pub(crate) fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut bits = 0u32;
    let mut nbits = 0;
    let mut out = Vec::new();
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => continue,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push(((bits >> nbits) & 0xff) as u8);
        }
    }
    Some(out)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Query parameters, decoded; the last value of a repeated key wins.
#[derive(Debug, Default, Clone)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(q: Option<&str>) -> Query {
        Query(
            q.unwrap_or_default()
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (percent_decode(k), percent_decode(v)),
                    None => (percent_decode(p), String::new()),
                })
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("1" | "true" | "True"))
    }
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

pub(crate) fn name_of(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or_default()
}

pub(crate) fn ns_of(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or_default()
}

pub(crate) fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    at(obj, pointer).and_then(Value::as_str)
}

/// `obj.pointer(pointer)` without allocating for pointers that need no `~` unescaping (all of
/// ours): serde_json's version allocates a `String` per token, which the PV controller's
/// per-claim scans of all PVs made the emulator's top cost in bulk benchmarks.
pub(crate) fn at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a Value> {
    if pointer.contains('~') {
        return obj.pointer(pointer);
    }
    let rest = pointer.strip_prefix('/')?;
    rest.split('/').try_fold(obj, |v, token| match v {
        Value::Object(map) => map.get(token),
        Value::Array(items) => token.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

/// A mutable object map at `key` of `obj`, created when missing (or not an object).
pub(crate) fn obj_mut<'a>(obj: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    let map = obj.as_object_mut()?;
    let entry = map
        .entry(key.to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    entry.as_object_mut()
}

pub(crate) fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn set_finalizers(obj: &mut Value, list: Vec<String>) {
    if let Some(meta) = obj_mut(obj, "metadata") {
        if list.is_empty() {
            meta.remove("finalizers");
        } else {
            meta.insert(
                "finalizers".into(),
                Value::Array(list.into_iter().map(Value::String).collect()),
            );
        }
    }
}

pub(crate) fn is_terminating(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

pub(crate) fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

pub(crate) fn set_annotation(obj: &mut Value, key: &str, value: &str) {
    if let Some(meta) = obj_mut(obj, "metadata")
        && let Some(ann) = {
            let e = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if !e.is_object() {
                *e = Value::Object(Map::new());
            }
            e.as_object_mut()
        }
    {
        ann.insert(key.to_string(), Value::String(value.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_matches_serde_json_pointer() {
        let v = serde_json::json!({"spec": {"claimRef": {"name": "c"}, "modes": ["a", "b"]},
                                   "metadata": {"annotations": {"a/b": 1, "x~y": 2}}});
        for p in [
            "/spec/claimRef/name",
            "/spec/modes/1",
            "/spec/modes/9",
            "/spec/nope",
            "/metadata/annotations/a~1b",
            "/metadata/annotations/x~0y",
            "/spec",
            "",
        ] {
            assert_eq!(at(&v, p), v.pointer(p).filter(|_| !p.is_empty()), "{p}");
        }
    }

    #[test]
    fn base64_round_trip() {
        for s in ["", "a", "ab", "abc", "hello world"] {
            let e = base64_encode(s.as_bytes(), false);
            assert_eq!(base64_decode(&e).as_deref(), Some(s.as_bytes()));
        }
        assert_eq!(base64_encode(b"hello", false), "aGVsbG8=");
    }

    #[test]
    fn generated_names_follow_upstream() {
        let n = generate_name("data-rbd-");
        assert_eq!(n.len(), 14);
        assert!(n.starts_with("data-rbd-"));
        let long = generate_name(&"h".repeat(70));
        assert_eq!(long.len(), 63);
    }

    #[test]
    fn query_decoding() {
        let q = Query::parse(Some("fieldSelector=metadata.name%3Dx&watch=true&a=b+c"));
        assert_eq!(q.get("fieldSelector"), Some("metadata.name=x"));
        assert!(q.flag("watch"));
        assert_eq!(q.get("a"), Some("b c"));
    }
}
