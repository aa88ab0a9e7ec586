//! Kubernetes resource quantities as byte counts (pure).
//!
//! Built on [`kube_quantity`], the workspace's one quantity implementation (the API emulator
//! uses it too): exact decimals, compared by value (`1G` < `954Mi`), rounded up to bytes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
/// `canonicalize(text)`: the text kube-apiserver stores for a quantity written as `text`.
pub use kube_quantity::canonicalize;
pub use kube_quantity::{ParseError, Quantity as ParsedQuantity};

use crate::pv::VolumeFacts;

/// Parses a quantity exactly (`10Gi`, `1G`, `1.5Gi`, `100m`, `1e9`).
///
/// # Errors
/// When `text` is not a Kubernetes quantity.
pub fn parse(text: &str) -> Result<ParsedQuantity, ParseError> {
    kube_quantity::parse(text.trim())
}

/// Parses a storage quantity (`10Gi`, `1G`, `1.5Gi`, `100`, `1e9`, `500m`) into bytes, rounding
/// any fraction up. `None` when malformed, negative or larger than `u64`.
#[must_use]
pub fn parse_bytes(quantity: &str) -> Option<u64> {
    parse(quantity).ok()?.to_u64_ceil()
}

/// Bytes the way the API server writes binary sizes: `NEi`..`NKi` when exact (`954Mi`,
/// `1Gi`), else plain bytes.
#[must_use]
pub fn format_bytes(bytes: u64) -> String {
    ParsedQuantity::from_bytes(bytes).canonical()
}

/// Bytes as a [`Quantity`].
#[must_use]
pub fn quantity(bytes: u64) -> Quantity {
    Quantity(format_bytes(bytes))
}

pub(crate) fn storage(map: Option<&BTreeMap<String, Quantity>>) -> Option<&Quantity> {
    map?.get("storage")
}

/// The claim's `spec.resources.requests.storage` as written.
#[must_use]
pub fn claim_request(claim: &PersistentVolumeClaim) -> Option<&Quantity> {
    storage(claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref())
}

/// The claim's `status.capacity.storage` as written.
#[must_use]
pub fn claim_capacity(claim: &PersistentVolumeClaim) -> Option<&Quantity> {
    storage(claim.status.as_ref()?.capacity.as_ref())
}

/// The claim's `status.allocatedResources.storage` as written: the request the resizer last
/// acted on.
#[must_use]
pub fn claim_allocated(claim: &PersistentVolumeClaim) -> Option<&Quantity> {
    storage(claim.status.as_ref()?.allocated_resources.as_ref())
}

/// The volume's `spec.capacity.storage` as written.
#[must_use]
pub fn volume_capacity(volume: &(impl VolumeFacts + ?Sized)) -> Option<&Quantity> {
    volume.capacity()
}

/// The claim's `spec.resources.requests.storage` in bytes.
#[must_use]
pub fn claim_request_bytes(claim: &PersistentVolumeClaim) -> Option<u64> {
    parse_bytes(&claim_request(claim)?.0)
}

/// The claim's `status.capacity.storage` in bytes.
#[must_use]
pub fn claim_capacity_bytes(claim: &PersistentVolumeClaim) -> Option<u64> {
    parse_bytes(&claim_capacity(claim)?.0)
}

/// The volume's `spec.capacity.storage` in bytes.
#[must_use]
pub fn volume_capacity_bytes(volume: &(impl VolumeFacts + ?Sized)) -> Option<u64> {
    parse_bytes(&volume_capacity(volume)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("1Gi"), Some(1 << 30));
        assert_eq!(parse_bytes("10Mi"), Some(10 << 20));
        assert_eq!(parse_bytes("1G"), Some(1_000_000_000));
        assert_eq!(parse_bytes("2k"), Some(2000));
        assert_eq!(parse_bytes("1Ki"), Some(1024));
        assert_eq!(parse_bytes("100"), Some(100));
        assert_eq!(parse_bytes("1e3"), Some(1000));
        assert_eq!(parse_bytes("1E+6"), Some(1_000_000));
    }

    #[test]
    fn rounds_fractions_up() {
        assert_eq!(parse_bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_bytes("0.1"), Some(1));
        assert_eq!(parse_bytes("1500m"), Some(2));
        assert_eq!(parse_bytes(".5Ki"), Some(512));
    }

    #[test]
    fn refuses_garbage() {
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("1Xi"), None);
        assert_eq!(parse_bytes("1 GB"), None);
        assert_eq!(parse_bytes("-1Gi"), None);
        assert_eq!(parse_bytes("99999999999E"), None);
        assert_eq!(parse_bytes("20E"), None);
    }

    #[test]
    fn reads_odd_forms_as_the_api_server_does() {
        // Go's ParseQuantity reads a missing number as zero (and zero is refused as a size).
        assert_eq!(parse_bytes("Gi"), Some(0));
        assert_eq!(parse_bytes("."), Some(0));
        assert_eq!(parse_bytes(" 1Gi "), Some(1 << 30));
    }

    #[test]
    fn binary_sizes_above_the_api_servers_cap_are_capped() {
        // kube-apiserver stores `16Ei` as 2^63-1.
        assert_eq!(parse_bytes("16Ei"), Some(i64::MAX as u64));
        assert_eq!(parse_bytes("9223372036854775807"), Some(i64::MAX as u64));
    }

    #[test]
    fn decimal_requests_compare_below_their_rounded_up_capacity() {
        let q = |t: &str| parse(t).unwrap();
        for (request, capacity) in [("1G", "954Mi"), ("10G", "9537Mi"), ("500M", "477Mi")] {
            assert!(q(request) < q(capacity), "{request} < {capacity}");
        }
        assert!(q("100m") < q("1Mi") && q("1.5Gi") == q("1536Mi"));
    }

    #[test]
    fn formats_exact_units() {
        assert_eq!(format_bytes(1 << 30), "1Gi");
        assert_eq!(format_bytes(3 << 29), "1536Mi");
        assert_eq!(format_bytes(1000), "1k");
        assert_eq!(format_bytes(1023), "1023");
        assert_eq!(format_bytes(954 << 20), "954Mi");
        assert_eq!(format_bytes(2048), "2Ki");
        assert_eq!(format_bytes(0), "0");
        assert_eq!(parse_bytes(&format_bytes(12345 << 20)), Some(12345 << 20));
    }
}
