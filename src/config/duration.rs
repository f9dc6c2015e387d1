//! Human-written quantities: durations (`250ms`, `2s`, `1h30m`) and byte sizes (`32MiB`).
//!
//! Durations are read by `humantime`: one or more `<number><unit>` terms, optionally
//! separated by spaces, summed (`1h30m`, `1m 30s`, `1.5s`); units `ns`, `us` (`µs`), `ms`,
//! `s`, `m`, `h`, `d` and humantime's longer spellings (`sec`, `min`, `hours`, ...). A number
//! without a unit is rejected with a hint — `30` could mean seconds or milliseconds, and
//! guessing wrong is a silent 1000× error.
//!
//! Sizes are read by `bytesize`: a plain integer (bytes) or `<number><unit>` with a binary
//! unit (`KiB`, `MiB`, `GiB`, `TiB`: powers of 1024) or a decimal one (`B`, `KB`, `MB`,
//! `GB`, `TB`: powers of 1000; any case). Fractions round down to whole bytes: `1.5KiB` is
//! 1536. A size past `u64` is an error, never a saturated value.

use std::time::Duration;

/// Parse a human duration such as `250ms`, `2s`, `1m`, `1h30m` or `1.5s`.
///
/// Returns a message suitable for a config error on failure.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let example = "e.g. `250ms`, `2s`, `1h30m`";
    if t.is_empty() {
        return Err(format!("empty string is not a duration ({example})"));
    }
    if t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("`{t}` has no unit; write e.g. `{t}s` or `{t}ms`"));
    }
    humantime::parse_duration(t).map_err(|e| match e {
        humantime::DurationError::UnknownUnit { unit, .. } => {
            format!("unknown duration unit `{unit}` in `{t}`; use ns, us, ms, s, m, h or d")
        }
        humantime::DurationError::NumberOverflow => format!("duration `{t}` is too large"),
        _ => format!("`{t}` is not a duration ({example})"),
    })
}

/// Parse a byte size such as `32MiB`, `512KiB`, `1GB` or `1048576`.
///
/// Returns a message suitable for a config error on failure.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let example = "e.g. `32MiB`, `512KiB`, `1GB`";
    if t.is_empty() || !t.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!("`{t}` is not a size ({example})"));
    }
    let size: bytesize::ByteSize = t.parse().map_err(|_| {
        let unit = t.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
        if unit.trim().contains(char::is_whitespace) {
            format!("`{t}` is not a size; write one number and unit, e.g. `32MiB`")
        } else {
            format!(
                "unknown size unit `{}` in `{t}`; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB",
                unit.trim()
            )
        }
    })?;
    match size.as_u64() {
        u64::MAX => Err(format!("size `{t}` is too large")),
        bytes => Ok(bytes),
    }
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

/// A duration as a config field of a struct that is the model: read from text such as `2s`
/// or `1h30m` ([`parse_duration`]; a bare number is refused with a hint), written as
/// humantime prints it. Zero is refused ("must be greater than zero"): every duration the file
/// holds is a time to wait or a bound, none of which can be nothing. A field with bounds of its
/// own reads with [`text_duration::within`] or [`text_duration::whole_seconds`]; bounds
/// between fields are the checker's.
pub mod text_duration {
    use super::*;
    use serde::{Deserialize, Deserializer, Serializer};

    /// As humantime prints it (`2s`, `1m 30s`).
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    /// From text; a bare number is an error that suggests both units.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let parsed = match Written::deserialize(d)? {
            Written::Text(s) => parse_duration(&s),
            Written::Int(n) => Err(no_unit(&n.to_string(), n as f64)),
            Written::Float(x) => Err(no_unit(&x.to_string(), x)),
        };
        match parsed {
            Ok(d) if d.is_zero() => Err(serde::de::Error::custom("must be greater than zero")),
            parsed => parsed.map_err(serde::de::Error::custom),
        }
    }

    /// The same for an optional duration (absent: `None`; with `#[serde(default)]`).
    pub mod option {
        use serde::{Deserializer, Serializer};
        use std::time::Duration;

        /// `None` as serde's none (left out with `skip_serializing_if`).
        pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }

        /// A present duration.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            super::deserialize(d).map(Some)
        }
    }

    /// A duration in `MIN_MS..=MAX_MS` milliseconds (`deserialize_with`): out of it,
    /// "must be between 100ms and 10m, got 50ms" (or "must be at least .." with
    /// `MAX_MS = u64::MAX`).
    pub fn within<'de, D, const MIN_MS: u64, const MAX_MS: u64>(d: D) -> Result<Duration, D::Error>
    where
        D: Deserializer<'de>,
    {
        let d = deserialize(d)?;
        let (min, max) = (Duration::from_millis(MIN_MS), Duration::from_millis(MAX_MS));
        if (min..=max).contains(&d) {
            return Ok(d);
        }
        let show = humantime::format_duration;
        let max = (MAX_MS < u64::MAX).then(|| show(max));
        Err(serde::de::Error::custom(
            crate::config::value::out_of_range(Some(show(min)), max, show(d)),
        ))
    }

    /// [`within`] for an optional duration (absent: `None`; with `#[serde(default)]`).
    pub fn within_option<'de, D, const MIN_MS: u64, const MAX_MS: u64>(
        d: D,
    ) -> Result<Option<Duration>, D::Error>
    where
        D: Deserializer<'de>,
    {
        within::<D, MIN_MS, MAX_MS>(d).map(Some)
    }

    /// A duration of whole seconds (`deserialize_with`): "must be whole seconds, got 1.5s".
    pub fn whole_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match deserialize(d)? {
            d if d.subsec_nanos() == 0 => Ok(d),
            d => Err(serde::de::Error::custom(format!(
                "must be whole seconds, got {d:?}"
            ))),
        }
    }

    /// A bare number's hint: the reading nearer a second first (`5`: `5s`; `250`: `250ms`).
    fn no_unit(text: &str, x: f64) -> String {
        let (first, second) = if x.abs() > 31.6 {
            ("ms", "s")
        } else {
            ("s", "ms")
        };
        format!("`{text}` has no unit; write `{text}{first}` or `{text}{second}`")
    }
}

/// A byte size as a config field of a struct that is the model: a plain integer (bytes) or
/// text such as `32MiB` ([`parse_size`]), written as [`format_size`] prints it.
pub mod text_size {
    use serde::{Deserialize, Deserializer, Serializer};

    /// As [`super::format_size`] prints it (`32MiB`).
    pub fn serialize<S: Serializer>(bytes: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_size(*bytes))
    }

    /// From whole bytes or text.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        use super::Written;
        let parsed = match Written::deserialize(d)? {
            Written::Int(n) => {
                u64::try_from(n).map_err(|_| format!("`{n}` is not a size (e.g. `32MiB`)"))
            }
            Written::Float(x) => Err(format!("`{x}` is not a size (e.g. `32MiB`)")),
            Written::Text(s) => super::parse_size(&s),
        };
        parsed.map_err(serde::de::Error::custom)
    }

    /// A size in `MIN..=MAX` bytes (`deserialize_with`): out of it, "must be between 1KiB
    /// and 1GiB, got 512B".
    pub fn within<'de, D, const MIN: u64, const MAX: u64>(d: D) -> Result<u64, D::Error>
    where
        D: Deserializer<'de>,
    {
        let n = deserialize(d)?;
        if (MIN..=MAX).contains(&n) {
            return Ok(n);
        }
        let show = super::format_size;
        Err(serde::de::Error::custom(
            crate::config::value::out_of_range(Some(show(MIN)), Some(show(MAX)), show(n)),
        ))
    }

    /// [`within`] for an optional size (absent: `None`; with `#[serde(default)]`).
    pub fn within_option<'de, D, const MIN: u64, const MAX: u64>(
        d: D,
    ) -> Result<Option<u64>, D::Error>
    where
        D: Deserializer<'de>,
    {
        within::<D, MIN, MAX>(d).map(Some)
    }

    /// An optional size, written (every optional size is read with its range,
    /// [`within_option`]).
    pub mod option {
        use serde::Serializer;

        /// `None` as serde's none (left out with `skip_serializing_if`).
        pub fn serialize<S: Serializer>(bytes: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
            match bytes {
                Some(b) => super::serialize(b, s),
                None => s.serialize_none(),
            }
        }
    }
}

/// A duration or size as written: a bare number or a string with a unit. Read only to tell
/// a bare number (refused with a hint, or bytes) from text.
enum Written {
    /// A bare integer (`30`, `-1`).
    Int(i128),
    /// A bare non-integer (`1.5`).
    Float(f64),
    /// A string (`30s`, `32MiB`).
    Text(String),
}

impl<'de> serde::Deserialize<'de> for Written {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Written, D::Error> {
        struct WrittenVisitor;

        impl serde::de::Visitor<'_> for WrittenVisitor {
            type Value = Written;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number or a string with a unit, like `2s` or `32MiB`")
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Written, E> {
                Ok(Written::Int(i128::from(v)))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Written, E> {
                Ok(Written::Int(i128::from(v)))
            }

            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Written, E> {
                Ok(Written::Float(v))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Written, E> {
                Ok(Written::Text(v.to_string()))
            }
        }

        deserializer.deserialize_any(WrittenVisitor)
    }
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
            parse_duration("5 parsecs"),
            Err(
                "unknown duration unit `parsecs` in `5 parsecs`; use ns, us, ms, s, m, h or d"
                    .to_string()
            )
        );
        // humantime's longer spellings are read too.
        assert_eq!(parse_duration("5 minutes"), Ok(ms(300_000)));
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
            parse_size("32zb"),
            Err(
                "unknown size unit `zb` in `32zb`; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"
                    .to_string()
            )
        );
        // Units are read in any case (bytesize): `mb` is a megabyte.
        assert_eq!(parse_size("32mb"), Ok(32_000_000));
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
