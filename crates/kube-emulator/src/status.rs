//! Kubernetes `Status` errors, shaped exactly like kube-apiserver 1.36 answers them.

use serde_json::{Map, Value, json};

use crate::resources::ResourceInfo;

/// One `details.causes[]` entry of an Invalid status.
#[derive(Debug, Clone)]
pub(crate) struct Cause {
    pub reason: &'static str,
    /// Message without the field prefix, e.g. `Required value: ...`.
    pub message: String,
    pub field: String,
}

impl Cause {
    pub fn required(field: &str, detail: &str) -> Cause {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Cause {
            reason: "FieldValueRequired",
            message,
            field: field.to_string(),
        }
    }

    pub fn invalid(field: &str, value: &str, detail: &str) -> Cause {
        Cause {
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {value}: {detail}"),
            field: field.to_string(),
        }
    }

    pub fn forbidden(field: &str, detail: &str) -> Cause {
        Cause {
            reason: "FieldValueForbidden",
            message: format!("Forbidden: {detail}"),
            field: field.to_string(),
        }
    }

    pub fn not_supported(field: &str, value: &str, supported: &[&str]) -> Cause {
        let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        Cause {
            reason: "FieldValueNotSupported",
            message: format!(
                "Unsupported value: \"{value}\": supported values: {}",
                list.join(", ")
            ),
            field: field.to_string(),
        }
    }

    fn full(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

/// An error answered as a `Status` object.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
    pub(crate) retry_after: Option<u64>,
}

fn details(name: &str, res: &ResourceInfo, kind_field: &str) -> Value {
    let mut d = Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !res.group.is_empty() {
        d.insert("group".into(), json!(res.group));
    }
    d.insert("kind".into(), json!(kind_field));
    Value::Object(d)
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub(crate) fn not_found(res: &ResourceInfo, name: &str) -> ApiError {
        ApiError {
            details: Some(details(name, res, res.plural)),
            ..ApiError::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", res.qualified()),
            )
        }
    }

    pub(crate) fn namespace_not_found(ns: &str) -> ApiError {
        ApiError {
            details: Some(json!({"name": ns, "kind": "namespaces"})),
            ..ApiError::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
        }
    }

    pub(crate) fn already_exists(res: &ResourceInfo, name: &str) -> ApiError {
        ApiError {
            details: Some(details(name, res, res.plural)),
            ..ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", res.qualified()),
            )
        }
    }

    /// The optimistic-concurrency conflict (stale resourceVersion).
    pub(crate) fn conflict(res: &ResourceInfo, name: &str) -> ApiError {
        ApiError {
            details: Some(details(name, res, res.plural)),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                    res.qualified()
                ),
            )
        }
    }

    /// A failed DELETE precondition; `details.kind` is the Kind here, not the resource.
    pub(crate) fn precondition(res: &ResourceInfo, name: &str, what: String) -> ApiError {
        ApiError {
            details: Some(details(name, res, res.kind)),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {what}",
                    res.kind
                ),
            )
        }
    }

    pub(crate) fn forbidden(res: &ResourceInfo, name: &str, why: &str) -> ApiError {
        ApiError {
            details: Some(details(name, res, res.plural)),
            ..ApiError::new(
                403,
                "Forbidden",
                format!("{} \"{name}\" is forbidden: {why}", res.qualified()),
            )
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 400 for a body that cannot be decoded into the kind.
    pub(crate) fn cannot_handle(res: &ResourceInfo, why: &str) -> ApiError {
        ApiError::bad_request(format!(
            "{kind} in version \"{v}\" cannot be handled as a {kind}: {why}",
            kind = res.kind,
            v = res.version
        ))
    }

    /// 422 Invalid with causes. `kind_label` is the Kind (core style) or `plural.group`.
    pub(crate) fn invalid_with(
        kind_label: &str,
        name: &str,
        res: Option<&ResourceInfo>,
        details_kind: &str,
        causes: Vec<Cause>,
    ) -> ApiError {
        let joined = if causes.len() == 1 {
            causes[0].full()
        } else {
            format!(
                "[{}]",
                causes
                    .iter()
                    .map(Cause::full)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let mut d = Map::new();
        if !name.is_empty() {
            d.insert("name".into(), json!(name));
        }
        if let Some(r) = res
            && !r.group.is_empty()
        {
            d.insert("group".into(), json!(r.group));
        }
        d.insert("kind".into(), json!(details_kind));
        d.insert(
            "causes".into(),
            Value::Array(
                causes
                    .iter()
                    .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                    .collect(),
            ),
        );
        ApiError {
            details: Some(Value::Object(d)),
            ..ApiError::new(
                422,
                "Invalid",
                format!("{kind_label} \"{name}\" is invalid: {joined}"),
            )
        }
    }

    /// Adds `details.group`.
    pub(crate) fn with_group(mut self, group: &str) -> ApiError {
        if let Some(d) = self.details.as_mut().and_then(Value::as_object_mut) {
            d.insert("group".into(), json!(group));
        }
        self
    }

    /// 422 Invalid for an object of `res` (core types use the Kind; others `plural.group`).
    pub(crate) fn invalid(res: &ResourceInfo, name: &str, causes: Vec<Cause>) -> ApiError {
        if res.group.is_empty() {
            ApiError::invalid_with(res.kind, name, Some(res), res.kind, causes)
        } else {
            ApiError::invalid_with(&res.qualified(), name, Some(res), res.plural, causes)
        }
    }

    pub(crate) fn method_not_allowed() -> ApiError {
        ApiError {
            details: Some(json!({})),
            ..ApiError::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        }
    }

    pub(crate) fn unsupported_media_type() -> ApiError {
        ApiError {
            details: Some(json!({})),
            ..ApiError::new(415, "UnsupportedMediaType", "415: Unsupported Media Type")
        }
    }

    pub(crate) fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            details: Some(json!({})),
            ..ApiError::new(500, "InternalError", message)
        }
    }

    /// The canonical Status for an injected fault with `code`.
    pub(crate) fn injected(code: u16, verb: &str, resource: &str) -> ApiError {
        let (reason, message): (&'static str, String) = match code {
            400 => ("BadRequest", "injected fault".into()),
            401 => ("Unauthorized", "Unauthorized".into()),
            403 => (
                "Forbidden",
                format!("{resource} is forbidden: injected fault"),
            ),
            404 => ("NotFound", format!("{resource} not found (injected fault)")),
            409 => (
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {resource}: the object has been modified; please apply your changes to the latest version and try again"
                ),
            ),
            410 => ("Expired", "injected fault: resource version expired".into()),
            422 => ("Invalid", "injected fault".into()),
            429 => (
                "TooManyRequests",
                "The server has received too many requests and has asked us to try again later"
                    .into(),
            ),
            503 => (
                "ServiceUnavailable",
                "The server is currently unable to handle the request (injected fault)".into(),
            ),
            504 => (
                "Timeout",
                "Timeout: request did not complete within the allotted timeout (injected fault)"
                    .into(),
            ),
            _ => (
                "InternalError",
                format!("Internal error occurred: injected fault for {verb} {resource}"),
            ),
        };
        ApiError {
            retry_after: (code == 429 || code == 503).then_some(1),
            details: Some(json!({})),
            ..ApiError::new(code, reason, message)
        }
    }

    /// The `Status` body.
    pub(crate) fn to_status(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), json!("Status"));
        m.insert("apiVersion".into(), json!("v1"));
        m.insert("metadata".into(), json!({}));
        m.insert("status".into(), json!("Failure"));
        m.insert("message".into(), json!(self.message));
        if self.code != 500 || self.reason != "InternalError" || self.details.is_some() {
            m.insert("reason".into(), json!(self.reason));
        }
        if let Some(d) = &self.details {
            let mut d = d.clone();
            if let (Some(secs), Some(obj)) = (self.retry_after, d.as_object_mut()) {
                obj.insert("retryAfterSeconds".into(), json!(secs));
            }
            m.insert("details".into(), d);
        }
        m.insert("code".into(), json!(self.code));
        Value::Object(m)
    }
}
