//! Turning internal errors into gRPC statuses with the codes the CSI specification expects.

use tonic::Status;

use crate::fs::FsError;
use crate::mapper::MapError;

/// `value` if non-empty, else `INVALID_ARGUMENT` naming the missing field.
///
/// # Errors
/// `INVALID_ARGUMENT` "`<field>` is required".
pub fn require<'a>(value: &'a str, field: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!("{field} is required")))
    } else {
        Ok(value)
    }
}

/// `value` if present, else `INVALID_ARGUMENT` naming the missing field.
///
/// # Errors
/// `INVALID_ARGUMENT` "`<field>` is required".
pub fn require_some<'a, T>(value: Option<&'a T>, field: &str) -> Result<&'a T, Status> {
    value.ok_or_else(|| Status::invalid_argument(format!("{field} is required")))
}

/// `INTERNAL` with context.
pub fn internal(context: &str, error: &dyn std::fmt::Display) -> Status {
    Status::internal(format!("{context}: {error}"))
}

impl From<MapError> for Status {
    fn from(e: MapError) -> Self {
        match &e {
            MapError::ImageNotFound { .. } => Status::not_found(e.to_string()),
            MapError::Timeout(_) => Status::deadline_exceeded(e.to_string()),
            MapError::ReadOnlyUnsupported(_) => Status::invalid_argument(e.to_string()),
            MapError::ModeMismatch { .. } => Status::failed_precondition(e.to_string()),
            _ => Status::internal(e.to_string()),
        }
    }
}

impl From<FsError> for Status {
    fn from(e: FsError) -> Self {
        match &e {
            FsError::OnlineGrowRefused { .. } => Status::failed_precondition(e.to_string()),
            _ => Status::internal(e.to_string()),
        }
    }
}
