//! Human-written quantities: durations (`250ms`, `2s`, `1h30m`) and byte sizes (`32MiB`).
//!
//! Durations are one or more `<number><unit>` terms, optionally separated by spaces, summed:
//! `1h30m`, `1m 30s`, `1.5s`. Units: `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`, `d`. A number
//! without a unit is rejected — `30` could mean seconds or milliseconds, and guessing wrong is
//! a silent 1000× error.
//!
//! Sizes are a plain integer (bytes) or `<number><unit>` with a binary unit (`KiB`, `MiB`,
//! `GiB`, `TiB`: powers of 1024) or a decimal one (`B`, `KB`/`kB`, `MB`, `GB`, `TB`: powers
//! of 1000). Fractions round down to whole bytes: `1.5KiB` is 1536.
//!
//! Both parsers compute in integers (`u128` nanoseconds or bytes), so `0.1s` is exactly
//! 100 ms, and report overflow instead of wrapping.

use std::time::Duration;

/// Parse a human duration such as `250ms`, `2s`, `1m`, `1h30m` or `1.5s`.
///
/// Returns a message suitable for a config error on failure.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let terms = parse_terms(text, "a duration", "e.g. `250ms`, `2s`, `1h30m`")?;
    let mut total_ns: u128 = 0;
    for (number, unit) in terms {
        let unit_ns: u128 = match unit {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "d" => 86_400 * 1_000_000_000,
            "" => {
                return Err(format!(
                    "`{}` has no unit; write e.g. `{}s` or `{}ms`",
                    text.trim(),
                    number.text,
                    number.text
                ))
            }
            other => {
                return Err(format!(
                    "unknown duration unit `{other}` in `{}`; use ns, us, ms, s, m, h or d",
                    text.trim()
                ))
            }
        };
        total_ns = number
            .scale(unit_ns)
            .and_then(|ns| total_ns.checked_add(ns))
            .ok_or_else(|| format!("duration `{}` is too large", text.trim()))?;
    }
    let secs = u64::try_from(total_ns / 1_000_000_000)
        .map_err(|_| format!("duration `{}` is too large", text.trim()))?;
    // The remainder is below 1e9, so it fits in u32.
    let nanos = (total_ns % 1_000_000_000) as u32;
    Ok(Duration::new(secs, nanos))
}

/// Parse a byte size such as `32MiB`, `512KiB`, `1GB` or `1048576`.
///
/// Returns a message suitable for a config error on failure.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let terms = parse_terms(text, "a size", "e.g. `32MiB`, `512KiB`, `1GB`")?;
    if terms.len() != 1 {
        return Err(format!(
            "`{}` is not a size; write one number and unit, e.g. `32MiB`",
            text.trim()
        ));
    }
    let (number, unit) = &terms[0];
    let multiplier: u128 = match *unit {
        "" | "B" => 1,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{}`; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB",
                text.trim()
            ))
        }
    };
    number
        .scale(multiplier)
        .and_then(|bytes| u64::try_from(bytes).ok())
        .ok_or_else(|| format!("size `{}` is too large", text.trim()))
}

/// Format a byte count with the largest binary unit that divides it exactly (`32MiB`),
/// else as plain bytes.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes != 0 && bytes % (1u64 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// Format a duration with the largest unit that divides it exactly (`2s`, `250ms`, `90s`),
/// so [`parse_duration`] reads it back unchanged.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".to_string();
    }
    for (unit_ns, unit) in [
        (3_600_000_000_000u128, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ] {
        if ns % unit_ns == 0 {
            return format!("{}{unit}", ns / unit_ns);
        }
    }
    format!("{ns}ns")
}

/// A non-negative decimal number as written: integer part and fractional digits.
#[derive(Debug, Clone, Copy)]
struct Number<'a> {
    text: &'a str,
    int: u128,
    frac: &'a str,
}

impl Number<'_> {
    /// `self × unit`, rounded down, or `None` on overflow.
    fn scale(&self, unit: u128) -> Option<u128> {
        let whole = self.int.checked_mul(unit)?;
        let mut frac_value: u128 = 0;
        let mut denom: u128 = 1;
        // 18 digits are finer than a nanosecond for every unit here and keep
        // `frac_value × unit` far below u128::MAX.
        for d in self.frac.bytes().take(18) {
            frac_value = frac_value * 10 + u128::from(d - b'0');
            denom *= 10;
        }
        whole.checked_add(frac_value.checked_mul(unit)? / denom)
    }
}

/// Split `text` into `(number, unit)` terms. `what` and `example` phrase the errors.
fn parse_terms<'a>(
    text: &'a str,
    what: &str,
    example: &str,
) -> Result<Vec<(Number<'a>, &'a str)>, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(format!("empty string is not {what} ({example})"));
    }
    let bad = || format!("`{trimmed}` is not {what} ({example})");
    let mut terms = Vec::new();
    let mut rest = trimmed;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num_text = &rest[..num_len];
        let (int_text, frac) = match num_text.split_once('.') {
            Some((i, f)) => (i, f),
            None => (num_text, ""),
        };
        if int_text.is_empty() || frac.contains('.') || (num_text.ends_with('.')) {
            return Err(bad());
        }
        let int: u128 = int_text.parse().map_err(|_| bad())?;
        rest = rest[num_len..].trim_start();
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c.is_whitespace())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = rest[unit_len..].trim_start();
        terms.push((
            Number {
                text: num_text,
                int,
                frac,
            },
            unit,
        ));
    }
    Ok(terms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("250ms"), Ok(ms(250)));
        assert_eq!(parse_duration("2s"), Ok(ms(2_000)));
        assert_eq!(parse_duration("1m"), Ok(ms(60_000)));
        assert_eq!(parse_duration("1h"), Ok(ms(3_600_000)));
        assert_eq!(parse_duration("1d"), Ok(ms(86_400_000)));
        assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
        assert_eq!(parse_duration("7us"), Ok(Duration::from_micros(7)));
        assert_eq!(parse_duration("7µs"), Ok(Duration::from_micros(7)));
    }

    #[test]
    fn compound_and_fractional_durations() {
        assert_eq!(parse_duration("1h30m"), Ok(ms(5_400_000)));
        assert_eq!(parse_duration("1m 30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration(" 1.5s "), Ok(ms(1_500)));
        assert_eq!(parse_duration("0.1s"), Ok(ms(100)));
        assert_eq!(parse_duration("2 s"), Ok(ms(2_000)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_say_why() {
        assert_eq!(
            parse_duration("30"),
            Err("`30` has no unit; write e.g. `30s` or `30ms`".to_string())
        );
        assert_eq!(
            parse_duration("5 minutes"),
            Err(
                "unknown duration unit `minutes` in `5 minutes`; use ns, us, ms, s, m, h or d"
                    .to_string()
            )
        );
        assert_eq!(
            parse_duration(""),
            Err("empty string is not a duration (e.g. `250ms`, `2s`, `1h30m`)".to_string())
        );
        assert_eq!(
            parse_duration("fast"),
            Err("`fast` is not a duration (e.g. `250ms`, `2s`, `1h30m`)".to_string())
        );
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1..5s").is_err());
        assert!(parse_duration("1.s").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn huge_durations_overflow_cleanly() {
        let err = parse_duration("99999999999999999999999999h").unwrap_err();
        assert!(err.contains("too large"), "{err}");
        let err = parse_duration("999999999999999999999999999999999999999s").unwrap_err();
        assert!(
            err.contains("is not a duration") || err.contains("too large"),
            "{err}"
        );
    }

    #[test]
    fn sizes_binary_and_decimal() {
        assert_eq!(parse_size("32MiB"), Ok(32 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("2kB"), Ok(2_000));
        assert_eq!(parse_size("2KB"), Ok(2_000));
        assert_eq!(parse_size("1.5KiB"), Ok(1_536));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("100 B"), Ok(100));
    }

    #[test]
    fn bad_sizes_say_why() {
        assert_eq!(
            parse_size("32mb"),
            Err(
                "unknown size unit `mb` in `32mb`; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"
                    .to_string()
            )
        );
        assert_eq!(
            parse_size("1MiB 2KiB"),
            Err("`1MiB 2KiB` is not a size; write one number and unit, e.g. `32MiB`".to_string())
        );
        assert!(parse_size("huge").is_err());
        assert!(parse_size("99999999TiB").unwrap_err().contains("too large"));
    }

    proptest::proptest! {
        /// Whatever humantime writes below a day (`1h 30m 5s 250ms 3us 7ns`), we read back
        /// exactly. (From a day up it writes `1day`, a spelling we do not accept.)
        #[test]
        fn reads_back_humantime_output(nanos in 0u64..(86_400 * 1_000_000_000)) {
            let d = Duration::from_nanos(nanos);
            let text = humantime::format_duration(d).to_string();
            proptest::prop_assert_eq!(parse_duration(&text), Ok(d), "{}", text);
        }

        /// Any input gives a value or a message; never a panic.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,24}") {
            let _ = parse_duration(&text);
            let _ = parse_size(&text);
        }

        /// Sizes written with the unit format_size picks read back exactly.
        #[test]
        fn sizes_round_trip(bytes in 0u64..(1 << 50)) {
            proptest::prop_assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }
    }

    #[test]
    fn format_size_picks_exact_unit() {
        assert_eq!(format_size(32 << 20), "32MiB");
        assert_eq!(format_size(1536), "1536B");
        assert_eq!(format_size(2048), "2KiB");
        assert_eq!(format_size(0), "0B");
    }

    #[test]
    fn format_duration_round_trips() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(2), "2s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_micros(3), "3us"),
            (Duration::from_nanos(1_000_000_001), "1000000001ns"),
        ] {
            assert_eq!(format_duration(d), text);
            if !d.is_zero() {
                assert_eq!(parse_duration(text), Ok(d));
            }
        }
    }
}
