//! Label and field selectors as used in list and watch requests.

use serde_json::Value;

use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum LabelOp {
    Exists,
    NotExists,
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelSelector {
    reqs: Vec<(String, LabelOp)>,
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_set(s: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{whole}', expected: '('"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some(key) = part.strip_prefix('!') {
                (key.trim().to_string(), LabelOp::NotExists)
            } else if let Some((k, v)) = part.split_once("!=") {
                (k.trim().to_string(), LabelOp::NotEq(v.trim().to_string()))
            } else if let Some((k, v)) = part.split_once("==") {
                (k.trim().to_string(), LabelOp::Eq(v.trim().to_string()))
            } else if let Some((k, v)) = part.split_once('=') {
                (k.trim().to_string(), LabelOp::Eq(v.trim().to_string()))
            } else if let Some((k, v)) = part.split_once(" notin ") {
                (k.trim().to_string(), LabelOp::NotIn(parse_set(v, &part)?))
            } else if let Some((k, v)) = part.split_once(" in ") {
                (k.trim().to_string(), LabelOp::In(parse_set(v, &part)?))
            } else if part.contains(' ') || part.contains('(') {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: <nil>: Invalid value: \"{part}\": invalid label key"
                )));
            } else {
                (part.clone(), LabelOp::Exists)
            };
            if req.0.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: found '{part}', expected: identifier"
                )));
            }
            reqs.push(req);
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        self.reqs.iter().all(|(key, op)| {
            let val = labels.and_then(|l| l.get(key)).and_then(Value::as_str);
            match op {
                LabelOp::Exists => val.is_some(),
                LabelOp::NotExists => val.is_none(),
                LabelOp::Eq(v) => val == Some(v.as_str()),
                LabelOp::NotEq(v) => val != Some(v.as_str()),
                LabelOp::In(set) => val.is_some_and(|x| set.iter().any(|s| s == x)),
                LabelOp::NotIn(set) => !val.is_some_and(|x| set.iter().any(|s| s == x)),
            }
        })
    }
}

/// A parsed `fieldSelector`: `path=value`, `path==value`, `path!=value`, comma-separated.
#[derive(Debug, Clone, Default)]
pub(crate) struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<FieldSelector, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let (path, eq, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            reqs.push((path.trim().to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether the selector names only `metadata.name=<x>` (used to short-cut lookups).
    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(path, eq, want)| {
            let mut cur = obj;
            let mut found = true;
            for seg in path.split('.') {
                match cur.get(seg) {
                    Some(v) => cur = v,
                    None => {
                        found = false;
                        break;
                    }
                }
            }
            let have = if !found {
                String::new()
            } else {
                match cur {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                }
            };
            (have == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_operators() {
        let obj = json!({"metadata": {"labels": {"app": "db", "tier": "gold"}}});
        let m = |s: &str| {
            LabelSelector::parse(s)
                .map(|l| l.matches(&obj))
                .unwrap_or(false)
        };
        assert!(m("app=db"));
        assert!(m("app==db,tier"));
        assert!(!m("app!=db"));
        assert!(m("app in (db, web)"));
        assert!(!m("app notin (db)"));
        assert!(m("!missing"));
        assert!(!m("missing"));
    }

    #[test]
    fn field_selector_paths() {
        let obj = json!({"metadata": {"name": "a", "namespace": "default"}, "involvedObject": {"name": "pvc"}});
        let m = |s: &str| {
            FieldSelector::parse(s)
                .map(|f| f.matches(&obj))
                .unwrap_or(false)
        };
        assert!(m("metadata.name=a"));
        assert!(m("involvedObject.name=pvc,metadata.namespace=default"));
        assert!(!m("metadata.name!=a"));
    }
}
