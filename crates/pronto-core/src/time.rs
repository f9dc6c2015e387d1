//! Calendar arithmetic on a passed-in [`SystemTime`] (no clock is read here).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The UTC calendar date `(year, month 1..=12, day 1..=31)` of `t` (Howard Hinnant's
/// days-to-civil algorithm; times before 1970 read as 1970-01-01).
pub fn civil_date(t: SystemTime) -> (i64, i64, i64) {
    let days = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
        / 86_400;
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}
