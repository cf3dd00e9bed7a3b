//! Times as the admin page shows them: UTC, to the second, and spans in
//! two units.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `at` in UTC, its date only when it is not `now`'s, and how long from
/// `now`: `10:30:00<br><small>in 29 min</small>`.
pub(super) fn at_and_in(at: SystemTime, now: SystemTime) -> String {
    let when = match at.duration_since(now) {
        Ok(d) if d >= Duration::from_secs(1) => format!("in {}", span(d)),
        _ => "now".to_owned(),
    };
    let (day, time) = utc_parts(at);
    let shown = if day == utc_parts(now).0 {
        time
    } else {
        format!("{day} {time}")
    };
    format!("{shown}<br><small>{when}</small>")
}

/// A time in UTC, to the second: `2026-01-01 10:30:00 UTC`.
pub(super) fn utc(at: SystemTime) -> String {
    let (day, time) = utc_parts(at);
    format!("{day} {time} UTC")
}

/// A time's date and time of day in UTC: `2026-01-01`, `10:30:00`.
fn utc_parts(at: SystemTime) -> (String, String) {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil(days);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!("{:02}:{:02}:{:02}", rest / 3600, rest / 60 % 60, rest % 60),
    )
}

/// The civil date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// A span in its largest unit and the next one, when not zero: `29 min`,
/// `2 h 5 min`, `30 d`, `12 s`.
pub(super) fn span(d: Duration) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400, "d"), (3600, "h"), (60, "min"), (1, "s")];
    let s = d.as_secs();
    let Some(i) = UNITS.iter().position(|(size, _)| s >= *size) else {
        return format!("{} ms", d.as_millis());
    };
    let (size, name) = UNITS[i];
    let mut out = format!("{} {name}", s / size);
    if let Some((next, next_name)) = UNITS.get(i + 1) {
        let n = s % size / next;
        if n > 0 {
            let _ = write!(out, " {n} {next_name}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_in_utc() {
        let at = |s| UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(utc(at(0)), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(at(1_767_263_400)), "2026-01-01 10:30:00 UTC");
        assert_eq!(utc(at(951_782_400)), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(at(951_868_799)), "2000-02-29 23:59:59 UTC");
        assert_eq!(utc(at(4_107_542_400)), "2100-03-01 00:00:00 UTC");
    }

    #[test]
    fn spans_in_two_units() {
        let s = Duration::from_secs;
        assert_eq!(span(s(12)), "12 s");
        assert_eq!(span(s(15 * 60)), "15 min");
        assert_eq!(span(s(2 * 3600 + 5 * 60 + 7)), "2 h 5 min");
        assert_eq!(span(s(30 * 86_400)), "30 d");
        assert_eq!(span(s(86_400 + 7)), "1 d");
        assert_eq!(span(Duration::from_millis(250)), "250 ms");
    }
}
