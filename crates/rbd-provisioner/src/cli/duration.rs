//! Go-style durations for flags (`5s`, `1m30s`, `500ms`, `2h`), as the old provisioner took them.

use std::time::Duration;

/// Parses a Go duration string; a bare number is seconds.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return duration_from(secs, text);
    }
    let mut total = 0f64;
    let mut rest = text;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("invalid duration {text:?}"))?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {unit:?} (use ms, s, m or h)"
                ));
            }
        };
        total += value * scale;
        rest = tail;
    }
    duration_from(total, text)
}

fn duration_from(secs: f64, text: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration {text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("10").unwrap(), Duration::from_secs(10));
        assert!(parse("5 parsecs").is_err());
        assert!(parse("").is_err());
        assert!(parse("-1s").is_err());
    }
}
