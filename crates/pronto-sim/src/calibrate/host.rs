//! Where a calibration ran: the host's CPU and name, and the time (for the profile's header).

use std::time::{SystemTime, UNIX_EPOCH};

/// The host a calibration ran on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// `model name` of the first CPU in `/proc/cpuinfo` (else `unknown CPU`), with its family,
    /// model and stepping numbers when present (a virtualised CPU's name is often generic).
    pub cpu: String,
    /// CPUs this process may use.
    pub cpus: usize,
    /// The kernel's host name.
    pub hostname: String,
}

/// The value of `key` in the first CPU's block of a `/proc/cpuinfo` text.
fn cpuinfo_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim())
        })
}

/// The CPU description of a `/proc/cpuinfo` text.
pub fn describe_cpu(cpuinfo: &str) -> String {
    let name = cpuinfo_field(cpuinfo, "model name").unwrap_or("unknown CPU");
    let ids: Vec<String> = ["cpu family", "model", "stepping"]
        .into_iter()
        .filter_map(|k| cpuinfo_field(cpuinfo, k).map(|v| format!("{k} {v}")))
        .collect();
    if ids.is_empty() {
        name.to_string()
    } else {
        format!("{name} ({})", ids.join(", "))
    }
}

impl Host {
    /// This host.
    pub fn this() -> Host {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Host {
            cpu: describe_cpu(&cpuinfo),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix time in seconds (proleptic Gregorian, UTC).
pub fn utc(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// The current UTC time as [`utc`] writes it.
pub fn now_utc() -> String {
    utc(SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_764_586_245), "2025-12-01T10:50:45Z");
    }

    #[test]
    fn cpu_description() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n\
                    model name\t: Intel(R) Xeon(R) Processor\nstepping\t: 8\n\nprocessor\t: 1\n\
                    model name\t: other\n";
        assert_eq!(
            describe_cpu(text),
            "Intel(R) Xeon(R) Processor (cpu family 6, model 143, stepping 8)"
        );
        assert_eq!(describe_cpu(""), "unknown CPU");
    }
}
