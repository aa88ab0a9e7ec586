//! Schedules of ReclaimSpaceCronJobs, read as csi-addons reads them (robfig/cron's standard
//! parser): five fields (minute, hour, day of month, month, day of week; names, ranges, steps
//! and lists; a day matches when either day field does, when both are restricted), the
//! descriptors `@yearly`/`@annually`, `@monthly`, `@weekly`, `@daily`/`@midnight`, `@hourly`,
//! and `@every <duration>` (Go's duration syntax: `90m`, `1h30m`, `45s`). Times are UTC.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// A parsed schedule.
#[derive(Clone, Debug)]
pub enum Schedule {
    /// A cron pattern (five fields or a descriptor).
    Cron(Box<croner::Cron>),
    /// `@every <duration>`: every so long after the last run.
    Every(Duration),
}

/// The last start time missed (if any) and the next one (if any): [`Schedule::missed`].
pub type Missed = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// How many missed start times [`Schedule::missed`] walks before it gives up (as Kubernetes'
/// and csi-addons' cron job controllers do).
pub const MAX_MISSED: usize = 100;

impl Schedule {
    /// Parses `text`.
    ///
    /// # Errors
    /// What is wrong with it, as a sentence.
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = text.trim();
        if let Some(every) = text.strip_prefix("@every") {
            let every = every.trim();
            let duration = parse_go_duration(every)
                .ok_or_else(|| format!("{every:?} after @every is not a duration (e.g. 1h30m)"))?;
            if duration < Duration::from_secs(1) {
                return Err(format!("@every {every}: the interval must be at least 1s"));
            }
            return Ok(Schedule::Every(duration));
        }
        let pattern = match text {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => {
                return Err(format!(
                    "unknown descriptor {other:?} (@yearly, @annually, @monthly, @weekly, \
                     @daily, @midnight, @hourly or @every <duration>)"
                ));
            }
            other => {
                let fields = other.split_whitespace().count();
                if fields != 5 {
                    return Err(format!(
                        "{other:?} has {fields} fields; a schedule has 5 (minute hour \
                         day-of-month month day-of-week) or is a descriptor such as @weekly"
                    ));
                }
                other
            }
        };
        croner::Cron::from_str(pattern)
            .map(|c| Schedule::Cron(Box::new(c)))
            .map_err(|e| format!("{text:?} is not a cron schedule: {e}"))
    }

    /// The first start time strictly after `after`.
    #[must_use]
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Schedule::Cron(cron) => cron.find_next_occurrence(&after, false).ok(),
            Schedule::Every(every) => {
                let step = chrono::Duration::from_std(*every).ok()?;
                after.checked_add_signed(step)
            }
        }
    }

    /// The start times after `earliest` up to `now` (the last one missed, if any) and the
    /// next one after `now`.
    ///
    /// # Errors
    /// More than [`MAX_MISSED`] start times were missed.
    pub fn missed(&self, earliest: DateTime<Utc>, now: DateTime<Utc>) -> Result<Missed, String> {
        let mut last = None;
        let mut t = earliest;
        let mut count = 0;
        loop {
            let Some(next) = self.next_after(t) else {
                return Ok((last, None));
            };
            if next > now {
                return Ok((last, Some(next)));
            }
            count += 1;
            if count > MAX_MISSED {
                return Err(format!(
                    "too many missed start times (more than {MAX_MISSED}); set or decrease \
                     spec.startingDeadlineSeconds, or check the clock"
                ));
            }
            last = Some(next);
            t = next;
        }
    }
}

/// Go's `time.ParseDuration` for the units a schedule needs (`h`, `m`, `s`, `ms`), without sign:
/// `1h30m`, `90s`, `1.5h`.
fn parse_go_duration(text: &str) -> Option<Duration> {
    if text.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * seconds;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).single().unwrap()
    }

    #[test]
    fn descriptors_are_the_patterns_csi_addons_reads() {
        // 2026-12-06 is a Sunday
        let now = at(2026, 12, 6, 10, 30);
        let weekly = Schedule::parse("@weekly").unwrap();
        assert_eq!(weekly.next_after(now), Some(at(2026, 12, 13, 0, 0)));
        let hourly = Schedule::parse("@hourly").unwrap();
        assert_eq!(hourly.next_after(now), Some(at(2026, 12, 6, 11, 0)));
        let daily = Schedule::parse("@daily").unwrap();
        assert_eq!(daily.next_after(now), Some(at(2026, 12, 7, 0, 0)));
        let monthly = Schedule::parse("@monthly").unwrap();
        assert_eq!(monthly.next_after(now), Some(at(2027, 1, 1, 0, 0)));
        let every = Schedule::parse("@every 1h30m").unwrap();
        assert_eq!(every.next_after(now), Some(at(2026, 12, 6, 12, 0)));
    }

    #[test]
    fn five_fields_with_steps_ranges_and_names() {
        let now = at(2026, 12, 6, 10, 31);
        let s = Schedule::parse("*/15 9-17 * * MON-FRI").unwrap();
        assert_eq!(s.next_after(now), Some(at(2026, 12, 7, 9, 0)));
        let s = Schedule::parse("0 3 * * 6").unwrap();
        assert_eq!(s.next_after(now), Some(at(2026, 12, 12, 3, 0)));
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        assert!(
            Schedule::parse("every day")
                .unwrap_err()
                .contains("has 2 fields")
        );
        assert!(
            Schedule::parse("@fortnightly")
                .unwrap_err()
                .contains("unknown descriptor")
        );
        assert!(
            Schedule::parse("@every soon")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(
            Schedule::parse("61 * * * *")
                .unwrap_err()
                .contains("not a cron schedule")
        );
    }

    #[test]
    fn missed_start_times_are_counted_up_to_the_limit() {
        let s = Schedule::parse("* * * * *").unwrap();
        let now = at(2026, 12, 6, 10, 30);
        let (last, next) = s.missed(at(2026, 12, 6, 10, 27), now).unwrap();
        assert_eq!(last, Some(at(2026, 12, 6, 10, 30)));
        assert_eq!(next, Some(at(2026, 12, 6, 10, 31)));
        let (last, _) = s.missed(now, now).unwrap();
        assert_eq!(last, None);
        assert!(s.missed(at(2026, 12, 6, 8, 0), now).is_err());
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1h30m"), Some(Duration::from_mins(90)));
        assert_eq!(parse_go_duration("1.5h"), Some(Duration::from_mins(90)));
        assert_eq!(parse_go_duration("5x"), None);
        assert_eq!(parse_go_duration(""), None);
    }
}
