//! Writing a calibrated profile: YAML with the fit's provenance in its header comments.

use std::fmt::Write as _;

use super::fit::{error_summary, Fit};
use super::params::Param;
use super::shapes::Kind;
use crate::profile::Profile;

/// `x` with `digits` significant digits, as short as it can be written (no exponent for
/// ordinary magnitudes; `0` for zero).
pub fn sig(x: f64, digits: usize) -> String {
    if x == 0.0 || !x.is_finite() {
        return if x.is_finite() {
            "0".into()
        } else {
            format!("{x}")
        };
    }
    let mag = x.abs().log10().floor() as i32;
    if !(-5..=9).contains(&mag) {
        return format!("{:.*e}", digits.saturating_sub(1), x);
    }
    let decimals = (digits as i32 - 1 - mag).max(0) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The per-shape residual table and the summary lines, as comment lines (without `# `).
pub fn residual_lines(fit: &Fit) -> Vec<String> {
    let mut out = vec![format!(
        "  {:<28} {:>9} {:>9} {:>8}",
        "shape", "measured", "model", "error"
    )];
    for r in &fit.residuals {
        out.push(format!(
            "  {:<28} {:>9.2} {:>9.2} {:>+7.1} %",
            r.shape,
            r.measured,
            r.model,
            100.0 * r.rel()
        ));
    }
    for (label, decode) in [("TTFT", false), ("ITL", true)] {
        let sel = fit
            .residuals
            .iter()
            .filter(|r| (r.kind == Kind::Decode) == decode);
        let n = fit
            .residuals
            .iter()
            .filter(|r| (r.kind == Kind::Decode) == decode)
            .count();
        if let Some((med, worst, shape)) = error_summary(sel) {
            out.push(format!(
                "{label} ({n} shapes): median |error| {:.1} %, worst {:.1} % ({shape})",
                100.0 * med,
                100.0 * worst
            ));
        }
    }
    out
}

/// The profile as YAML: `header` lines as comments, then every field. Timing terms get six
/// significant digits (the file reproduces the fit), the prior seven (it is checked against
/// the timing terms on load).
pub fn profile_yaml(p: &Profile, header: &[String]) -> String {
    let mut y = String::new();
    for line in header {
        if line.is_empty() {
            y.push_str("#\n");
        } else {
            let _ = writeln!(y, "# {line}");
        }
    }
    let _ = writeln!(y, "name: {}", serde_json::Value::from(p.name.as_str()));
    let _ = writeln!(
        y,
        "description: {}",
        serde_json::Value::from(p.description.as_str())
    );
    let theta = super::params::theta_of(p);
    let mut section = "";
    for param in Param::ALL {
        let field = param.field();
        let (sec, name) = field.split_once('.').expect("section.name");
        if sec != section {
            let _ = writeln!(y, "{sec}:");
            section = sec;
        }
        let _ = writeln!(y, "  {name}: {}", sig(theta[param.index()], 6));
    }
    let _ = writeln!(y, "prior:");
    for (name, v) in p.ttft_prior().fields() {
        let _ = writeln!(y, "  {name}: {}", sig(v, 7));
    }
    let _ = writeln!(y, "kv_bytes_per_token: {}", p.kv_bytes_per_token);
    let _ = writeln!(y, "block_size: {}", p.block_size);
    let _ = writeln!(y, "num_kv_blocks: {}", p.num_kv_blocks);
    let _ = writeln!(y, "max_num_seqs: {}", p.max_num_seqs);
    let _ = writeln!(y, "max_num_batched_tokens: {}", p.max_num_batched_tokens);
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::params::{theta_of, with_theta};

    #[test]
    fn significant_digits() {
        assert_eq!(sig(0.0, 6), "0");
        assert_eq!(sig(22.9, 6), "22.9");
        assert_eq!(sig(0.000383219, 4), "0.0003832");
        assert_eq!(sig(1234.5678, 6), "1234.57");
        assert_eq!(sig(5e-10, 7), "5.000000e-10");
        assert_eq!(sig(-2.5, 3), "-2.5");
        assert_eq!(sig(3.0, 6), "3");
    }

    #[test]
    fn written_profiles_load_back_with_a_consistent_prior() {
        let base = Profile::builtin("cpu-tiny").unwrap();
        let theta = [
            3.2718281,
            2.0,
            0.0123456789,
            3.3,
            0.061,
            0.0,
            6.5,
            0.0049,
            8.25,
        ];
        let mut p = with_theta(&base, &theta);
        p.name = "mine".into();
        p.description = "a \"quoted\" engine: with colons".into();
        let text = profile_yaml(&p, &["first line".into(), String::new(), "x: y".into()]);
        assert!(text.starts_with("# first line\n#\n# x: y\n"), "{text}");
        let back = Profile::parse(&text, "written").unwrap();
        assert_eq!(back.name, "mine");
        assert_eq!(back.description, p.description);
        for (a, b) in theta_of(&back).iter().zip(theta) {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{a} vs {b}");
        }
        assert!(back.prior.is_some());
        assert_eq!(back.block_size, base.block_size);
        // A stale prior is refused.
        let stale = text.replace("  floor_ms: 3.27183", "  floor_ms: 4");
        let err = Profile::parse(&stale, "stale").unwrap_err().to_string();
        assert!(err.contains("prior.base_s"), "{err}");
    }
}
