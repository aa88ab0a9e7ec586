//! Resource quantities (`1Gi`, `500M`, `2147483648`): parsing, comparison, canonical form.

/// The regular expression kube-apiserver quotes when a quantity does not parse.
pub(crate) const QUANTITY_REGEX: &str = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    BinarySi,
    DecimalSi,
    DecimalExponent,
}

/// A parsed quantity: its value (as f64, enough for comparisons) and, when the value is an
/// integer, its exact value for canonical rendering.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Quantity {
    pub value: f64,
    exact: Option<i128>,
    format: Format,
}

fn split_number(s: &str) -> Option<(&str, &str)> {
    let bytes = s.as_bytes();
    let mut i = 0;
    if i < bytes.len() && (bytes[i] == b'+' || bytes[i] == b'-') {
        i += 1;
    }
    let start_digits = i;
    while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
        i += 1;
    }
    if i == start_digits {
        return None;
    }
    Some((&s[..i], &s[i..]))
}

/// Parses a quantity; `None` when it does not match the Kubernetes syntax.
pub(crate) fn parse(s: &str) -> Option<Quantity> {
    let (num, suffix) = split_number(s)?;
    if num.matches('.').count() > 1 {
        return None;
    }
    let value: f64 = num.parse().ok()?;
    let (mult, base, exp, format): (f64, i128, u32, Format) = match suffix {
        "" => (1.0, 1, 0, Format::DecimalSi),
        "n" => (1e-9, 1, 0, Format::DecimalSi),
        "u" => (1e-6, 1, 0, Format::DecimalSi),
        "m" => (1e-3, 1, 0, Format::DecimalSi),
        "k" => (1e3, 1000, 1, Format::DecimalSi),
        "M" => (1e6, 1000, 2, Format::DecimalSi),
        "G" => (1e9, 1000, 3, Format::DecimalSi),
        "T" => (1e12, 1000, 4, Format::DecimalSi),
        "P" => (1e15, 1000, 5, Format::DecimalSi),
        "E" => (1e18, 1000, 6, Format::DecimalSi),
        "Ki" => (1024.0, 1024, 1, Format::BinarySi),
        "Mi" => (1024f64.powi(2), 1024, 2, Format::BinarySi),
        "Gi" => (1024f64.powi(3), 1024, 3, Format::BinarySi),
        "Ti" => (1024f64.powi(4), 1024, 4, Format::BinarySi),
        "Pi" => (1024f64.powi(5), 1024, 5, Format::BinarySi),
        "Ei" => (1024f64.powi(6), 1024, 6, Format::BinarySi),
        other => {
            let rest = other.strip_prefix(['e', 'E'])?;
            let e: i32 = rest.parse().ok()?;
            let v = value * 10f64.powi(e);
            let exact = (e >= 0 && !num.contains('.'))
                .then(|| num.parse::<i128>().ok())
                .flatten()
                .and_then(|n| {
                    10i128
                        .checked_pow(e.unsigned_abs())
                        .and_then(|p| n.checked_mul(p))
                });
            return Some(Quantity {
                value: v,
                exact,
                format: Format::DecimalExponent,
            });
        }
    };
    let exact = if num.contains('.') || mult < 1.0 {
        None
    } else {
        num.parse::<i128>()
            .ok()
            .and_then(|n| base.checked_pow(exp).and_then(|p| n.checked_mul(p)))
    };
    Some(Quantity {
        value: value * mult,
        exact,
        format,
    })
}

impl Quantity {
    /// The canonical string kube-apiserver stores for this quantity, when it can be computed
    /// exactly (integers); otherwise `None` (keep the input).
    pub fn canonical(&self) -> Option<String> {
        let n = self.exact?;
        if n == 0 {
            return Some("0".into());
        }
        let (base, suffixes): (i128, &[&str]) = match self.format {
            Format::BinarySi => (1024, &["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]),
            Format::DecimalSi => (1000, &["", "k", "M", "G", "T", "P", "E"]),
            Format::DecimalExponent => (1000, &["", "e3", "e6", "e9", "e12", "e15", "e18"]),
        };
        if self.format == Format::BinarySi && n.abs() < 1024 {
            // Binary quantities below 1Ki are rendered in decimal SI.
            return Some(n.to_string());
        }
        let mut value = n;
        let mut idx = 0;
        while idx + 1 < suffixes.len() && value % base == 0 {
            value /= base;
            idx += 1;
        }
        Some(format!("{value}{}", suffixes[idx]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_canonicalises() {
        assert_eq!(
            parse("1Gi").and_then(|q| q.canonical()).as_deref(),
            Some("1Gi")
        );
        assert_eq!(
            parse("1024Mi").and_then(|q| q.canonical()).as_deref(),
            Some("1Gi")
        );
        assert_eq!(
            parse("1536Mi").and_then(|q| q.canonical()).as_deref(),
            Some("1536Mi")
        );
        assert_eq!(
            parse("1000M").and_then(|q| q.canonical()).as_deref(),
            Some("1G")
        );
        assert_eq!(
            parse("2147483648").and_then(|q| q.canonical()).as_deref(),
            Some("2147483648")
        );
        assert!(parse("1 GB").is_none());
        assert!(parse("abc").is_none());
        assert!(parse("-1Gi").map(|q| q.value < 0.0).unwrap_or(false));
        assert!(
            parse("2Gi").map(|q| q.value).unwrap_or(0.0)
                > parse("1Gi").map(|q| q.value).unwrap_or(0.0)
        );
    }
}
