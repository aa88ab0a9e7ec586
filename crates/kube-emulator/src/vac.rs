//! `storage.k8s.io/v1` VolumeAttributesClass (GA in 1.34) and the claim fields that name one,
//! validated as kube-apiserver's `pkg/apis/storage/validation` and `pkg/apis/core/validation`
//! do, with their messages:
//!
//! - a class needs a `driverName`; its `parameters` keys must not be empty; `driverName` is
//!   immutable ("field is immutable") and so are its `parameters` ("updates to parameters are
//!   forbidden.");
//! - a claim's `status.modifyVolumeStatus.status` is one of `Pending`, `InProgress`,
//!   `Infeasible` (required when `modifyVolumeStatus` is set).
//!
//! Everything else round-trips as written: a claim's `spec.volumeAttributesClassName` (mutable
//! on bound claims, see the claim update rules), `status.currentVolumeAttributesClassName`,
//! `status.modifyVolumeStatus.targetVolumeAttributesClassName` and a PV's
//! `spec.volumeAttributesClassName`. Nothing here acts on a class: that is the CSI driver's
//! (external-resizer's modify controller).

use serde_json::Value;

use crate::status::Cause;
use crate::util::str_at;

/// The statuses of `status.modifyVolumeStatus.status`.
const MODIFY_STATUSES: &[&str] = &["InProgress", "Infeasible", "Pending"];

/// Causes for a new (`old` = `None`) or updated VolumeAttributesClass.
pub(crate) fn class_causes(old: Option<&Value>, new: &Value, causes: &mut Vec<Cause>) {
    let driver = str_at(new, "/driverName").unwrap_or_default();
    if driver.is_empty() {
        causes.push(Cause::required("driverName", ""));
    }
    if let Some(params) = new.get("parameters").and_then(Value::as_object)
        && params.contains_key("")
    {
        causes.push(Cause::invalid(
            "parameters",
            "\"\"",
            "field can not be empty.",
        ));
    }
    let Some(old) = old else {
        return;
    };
    if old.get("parameters") != new.get("parameters") {
        causes.push(Cause::forbidden(
            "parameters",
            "updates to parameters are forbidden.",
        ));
    }
    if str_at(old, "/driverName") != str_at(new, "/driverName") {
        causes.push(Cause::invalid(
            "driverName",
            &format!("\"{driver}\""),
            "field is immutable",
        ));
    }
}

/// Causes for a claim's `status.modifyVolumeStatus`.
pub(crate) fn claim_status_causes(claim: &Value, causes: &mut Vec<Cause>) {
    let Some(modify) = claim.pointer("/status/modifyVolumeStatus") else {
        return;
    };
    if modify.is_null() {
        return;
    }
    match str_at(modify, "/status") {
        None | Some("") => causes.push(Cause::required("status.modifyVolumeStatus.status", "")),
        Some(s) if !MODIFY_STATUSES.contains(&s) => causes.push(Cause::not_supported(
            "status.modifyVolumeStatus.status",
            s,
            MODIFY_STATUSES,
        )),
        Some(_) => {}
    }
}
