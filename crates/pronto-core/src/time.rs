//! Time arithmetic on passed-in times (no clock is read here): calendar dates of a
//! [`SystemTime`], and nanosecond spans as seconds.

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

/// `ns` nanoseconds in seconds. Through `i64`: on the baseline x86-64 target a signed
/// conversion is one instruction and an unsigned one a sequence of five, and a routing view
/// converts a few spans per backend. Exact as `ns as f64 * 1e-9` up to `i64::MAX` ns (292
/// years); a longer span reads as 292 years.
#[inline]
pub(crate) fn secs_from_ns(ns: u64) -> f64 {
    (ns.min(i64::MAX as u64) as i64) as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanosecond_spans_read_as_the_unsigned_conversion_does() {
        for ns in [
            0,
            1,
            999,
            1_000_000_007,
            3_600 * 1_000_000_000,
            1 << 53,
            (1 << 53) + 1,
        ] {
            assert_eq!(secs_from_ns(ns), ns as f64 * 1e-9, "{ns}");
        }
        assert_eq!(secs_from_ns(u64::MAX), i64::MAX as f64 * 1e-9);
    }
}
