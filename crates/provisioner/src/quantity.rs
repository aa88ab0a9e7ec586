//! Kubernetes resource quantities as byte counts (pure).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const KI: u64 = 1024;

/// Parses a storage quantity (`10Gi`, `1G`, `1.5Gi`, `100`, `1e9`, `500m`) into bytes, rounding
/// any fraction up. `None` when malformed, negative or larger than `u64`.
#[must_use]
pub fn parse_bytes(quantity: &str) -> Option<u64> {
    let quantity = quantity.trim();
    let split = quantity
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    if number.is_empty() {
        return None;
    }
    let (multiplier, divisor): (u128, u128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1000, 1),
        "M" => (1000u128.pow(2), 1),
        "G" => (1000u128.pow(3), 1),
        "T" => (1000u128.pow(4), 1),
        "P" => (1000u128.pow(5), 1),
        "E" => (1000u128.pow(6), 1),
        "Ki" => (u128::from(KI), 1),
        "Mi" => (u128::from(KI).pow(2), 1),
        "Gi" => (u128::from(KI).pow(3), 1),
        "Ti" => (u128::from(KI).pow(4), 1),
        "Pi" => (u128::from(KI).pow(5), 1),
        "Ei" => (u128::from(KI).pow(6), 1),
        exp if exp.starts_with(['e', 'E']) => {
            let e: u32 = exp[1..].trim_start_matches('+').parse().ok()?;
            (10u128.checked_pow(e)?, 1)
        }
        _ => return None,
    };
    let number = number.trim_start_matches('+');
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let digits = format!("{int_part}{frac_part}");
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    let frac_divisor = 10u128.checked_pow(u32::try_from(frac_part.len()).ok()?)?;
    let numerator = mantissa.checked_mul(multiplier)?;
    let denominator = divisor.checked_mul(frac_divisor)?;
    u64::try_from(numerator.div_ceil(denominator)).ok()
}

/// Formats bytes the way a person would write them: `NGi`/`NMi`/`NKi` when exact, else bytes.
#[must_use]
pub fn format_bytes(bytes: u64) -> String {
    for (suffix, unit) in [
        ("Ti", KI.pow(4)),
        ("Gi", KI.pow(3)),
        ("Mi", KI.pow(2)),
        ("Ki", KI),
    ] {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// Bytes as a [`Quantity`].
#[must_use]
pub fn quantity(bytes: u64) -> Quantity {
    Quantity(format_bytes(bytes))
}

/// The claim's `spec.resources.requests.storage` in bytes.
#[must_use]
pub fn claim_request_bytes(claim: &PersistentVolumeClaim) -> Option<u64> {
    let requests = claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?;
    parse_bytes(&requests.get("storage")?.0)
}

/// The claim's `status.capacity.storage` in bytes.
#[must_use]
pub fn claim_capacity_bytes(claim: &PersistentVolumeClaim) -> Option<u64> {
    let capacity = claim.status.as_ref()?.capacity.as_ref()?;
    parse_bytes(&capacity.get("storage")?.0)
}

/// The volume's `spec.capacity.storage` in bytes.
#[must_use]
pub fn volume_capacity_bytes(volume: &PersistentVolume) -> Option<u64> {
    let capacity = volume.spec.as_ref()?.capacity.as_ref()?;
    parse_bytes(&capacity.get("storage")?.0)
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
        assert_eq!(parse_bytes("Gi"), None);
        assert_eq!(parse_bytes("1Xi"), None);
        assert_eq!(parse_bytes("-1Gi"), None);
        assert_eq!(parse_bytes("."), None);
        assert_eq!(parse_bytes("99999999999Ei"), None);
    }

    #[test]
    fn formats_exact_units() {
        assert_eq!(format_bytes(1 << 30), "1Gi");
        assert_eq!(format_bytes(3 << 29), "1536Mi");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(2048), "2Ki");
        assert_eq!(format_bytes(0), "0");
        assert_eq!(parse_bytes(&format_bytes(12345 << 20)), Some(12345 << 20));
    }
}
