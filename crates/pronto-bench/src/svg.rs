//! Hand-written SVG plots (no plotting crate): latency CDFs and latency over time.
//!
//! Both plots use a **log-scaled latency axis**: TTFT spans orders of magnitude between a warm
//! prefix hit and a queued long prompt, and a linear axis would squash everything below the
//! tail into one pixel. The axis runs over whole decades that cover the data; every decade gets
//! a labelled tick, and when the data spans at most two decades the 2× and 5× points are
//! labelled too. Non-positive and non-finite values cannot be placed on a log axis and are
//! left out (a CDF's fraction still counts them in its denominator, so the curve then does
//! not reach 1).
//!
//! - [`cdf_svg`] draws the empirical CDF of several named series in one figure (one colour each,
//!   a legend with the sample counts): `y = fraction of samples ≤ x`, drawn as a step function.
//! - [`over_time_svg`] scatters each request's TTFT against its send time; failed requests are
//!   red crosses along the bottom edge, so a burst of errors shows where it happened.
//!
//! Output is a standalone SVG 1.1 document; all text is XML-escaped.

use std::fmt::Write;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 460.0;
/// Plot area: left, right, top, bottom.
const X0: f64 = 80.0;
const X1: f64 = 730.0;
const Y0: f64 = 50.0;
const Y1: f64 = 400.0;

/// Series colours, in order (cycled beyond eight series).
const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
];
const ERROR_COLOUR: &str = "#d62728";

/// Escape `&`, `<`, `>`, `"` and `'` for XML text and attributes.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// A log10 axis over whole decades `10^lo ..= 10^hi`, mapped onto pixels `p0 ..= p1`.
struct LogAxis {
    lo: i32,
    hi: i32,
    p0: f64,
    p1: f64,
}

impl LogAxis {
    /// The decades covering the positive finite `values` (1..1000 when there are none).
    fn covering(values: impl Iterator<Item = f64>, p0: f64, p1: f64) -> LogAxis {
        let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite() && *v > 0.0) {
            min = min.min(v);
            max = max.max(v);
        }
        let (lo, hi) = if min.is_finite() {
            let lo = min.log10().floor() as i32;
            let hi = (max.log10().ceil() as i32).max(lo + 1);
            (lo, hi)
        } else {
            (0, 3)
        };
        LogAxis { lo, hi, p0, p1 }
    }

    fn pos(&self, v: f64) -> f64 {
        let f = (v.log10() - f64::from(self.lo)) / f64::from(self.hi - self.lo);
        self.p0 + f * (self.p1 - self.p0)
    }

    /// Tick values and whether each is labelled.
    fn ticks(&self) -> Vec<(f64, bool)> {
        let fine = self.hi - self.lo <= 2;
        let mut out = Vec::new();
        for d in self.lo..=self.hi {
            let base = 10f64.powi(d);
            out.push((base, true));
            if d < self.hi {
                for m in 2..=9 {
                    out.push((base * f64::from(m), fine && (m == 2 || m == 5)));
                }
            }
        }
        out
    }
}

/// A milliseconds tick label: `500 ms`, `2 s`, `0.5 ms`.
fn ms_label(v: f64) -> String {
    let round = |x: f64| (x * 1e6).round() / 1e6;
    if v >= 1000.0 {
        format!("{} s", round(v / 1000.0))
    } else {
        format!("{} ms", round(v))
    }
}

/// A step of 1, 2 or 5 × 10^k giving at most about eight ticks over `0..=max`.
fn linear_step(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn header(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n\
         <rect x=\"{X0}\" y=\"{Y0}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n",
        WIDTH / 2.0,
        xml_escape(title),
        X1 - X0,
        Y1 - Y0
    );
}

/// Vertical grid lines and labels for a log x axis.
fn log_x_axis(out: &mut String, axis: &LogAxis, label: &str) {
    for (v, labelled) in axis.ticks() {
        let x = axis.pos(v);
        let (stroke, len) = if labelled {
            ("#ccc", 6.0)
        } else {
            ("#eee", 3.0)
        };
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{Y0}\" x2=\"{x:.1}\" y2=\"{Y1}\" stroke=\"{stroke}\"/>\
             <line x1=\"{x:.1}\" y1=\"{Y1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>",
            Y1 + len
        );
        if labelled {
            let _ = writeln!(
                out,
                "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                Y1 + 20.0,
                ms_label(v)
            );
        }
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        (X0 + X1) / 2.0,
        Y1 + 42.0,
        xml_escape(label)
    );
}

fn y_label(out: &mut String, label: &str) {
    let (x, y) = (20.0, (Y0 + Y1) / 2.0);
    let _ = writeln!(
        out,
        "<text x=\"{x}\" y=\"{y}\" text-anchor=\"middle\" transform=\"rotate(-90 {x} {y})\">{}</text>",
        xml_escape(label)
    );
}

/// Where a legend goes inside the plot area.
#[derive(Clone, Copy)]
enum Corner {
    /// Empty in a CDF: a curve is still low at the right only when nearly all its samples lie
    /// near the axis' maximum, at the top of its last decade.
    BottomRight,
    /// Clear of the error marks along a scatter's bottom edge.
    TopRight,
}

/// Legend entries (colour, text) in a corner of the plot area.
fn legend(out: &mut String, entries: &[(String, String)], corner: Corner) {
    let height = 18.0 * entries.len() as f64 + 8.0;
    let (x, top) = match corner {
        // The box (drawn from `top - 6`) ends 8 px above the bottom edge, as the top one
        // starts 8 px below the top edge.
        Corner::BottomRight => (X1 - 250.0, Y1 - 2.0 - height),
        Corner::TopRight => (X1 - 250.0, Y0 + 14.0),
    };
    let _ = writeln!(
        out,
        "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"240\" height=\"{:.1}\" fill=\"white\" \
         fill-opacity=\"0.85\" stroke=\"#999\"/>",
        x - 6.0,
        top - 6.0,
        height
    );
    for (i, (colour, text)) in entries.iter().enumerate() {
        let y = top + 18.0 * i as f64 + 6.0;
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{colour}\" \
             stroke-width=\"3\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            x + 22.0,
            x + 30.0,
            y + 4.0,
            xml_escape(text)
        );
    }
}

/// Empirical CDFs of several named series (values in milliseconds) on one log-x plot.
///
/// Each series is one coloured step curve; the legend shows its name and sample count.
/// Empty series appear in the legend only. See the module docs for the axis.
pub fn cdf_svg(series: &[(&str, &[f64])], title: &str) -> String {
    let axis = LogAxis::covering(series.iter().flat_map(|(_, v)| v.iter().copied()), X0, X1);
    let mut out = String::new();
    header(&mut out, title);
    for i in 0..=4 {
        let f = f64::from(i) / 4.0;
        let y = Y1 - f * (Y1 - Y0);
        let _ = writeln!(
            out,
            "<line x1=\"{X0}\" y1=\"{y:.1}\" x2=\"{X1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{f:.2}</text>",
            X0 - 6.0,
            y + 4.0
        );
    }
    log_x_axis(&mut out, &axis, "time to first token (log scale)");
    y_label(&mut out, "fraction of requests");
    let mut entries = Vec::new();
    for (k, (name, values)) in series.iter().enumerate() {
        let colour = PALETTE[k % PALETTE.len()];
        let mut v: Vec<f64> = values
            .iter()
            .copied()
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect();
        v.sort_by(f64::total_cmp);
        entries.push((colour.to_string(), format!("{name} (n={})", values.len())));
        if v.is_empty() {
            continue;
        }
        let n = values.len() as f64;
        let y = |count: usize| Y1 - (count as f64 / n) * (Y1 - Y0);
        let mut pts = format!("{:.1},{:.1}", axis.pos(v[0]), Y1);
        for (i, x) in v.iter().enumerate() {
            let px = axis.pos(*x);
            let _ = write!(pts, " {px:.1},{:.1} {px:.1},{:.1}", y(i), y(i + 1));
        }
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{pts}\"/>"
        );
    }
    legend(&mut out, &entries, Corner::BottomRight);
    out.push_str("</svg>\n");
    out
}

/// One request for [`over_time_svg`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimePoint {
    /// Send time, seconds after the run started.
    pub t_s: f64,
    /// TTFT in ms of a successful request.
    pub ttft_ms: Option<f64>,
    /// The request failed.
    pub error: bool,
}

/// TTFT (log y, ms) against send time (linear x, s); errors as red crosses on the bottom edge.
pub fn over_time_svg(points: &[TimePoint], title: &str) -> String {
    let ok: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| !p.error)
        .filter_map(|p| p.ttft_ms.map(|v| (p.t_s, v)))
        .filter(|(t, v)| t.is_finite() && v.is_finite() && *v > 0.0)
        .collect();
    let errors: Vec<f64> = points
        .iter()
        .filter(|p| p.error && p.t_s.is_finite())
        .map(|p| p.t_s)
        .collect();
    let t_max = points
        .iter()
        .map(|p| p.t_s)
        .filter(|t| t.is_finite())
        .fold(0.0, f64::max);
    let step = linear_step(t_max);
    let t_end = ((t_max / step).ceil() * step).max(step);
    let px = |t: f64| X0 + (t / t_end) * (X1 - X0);
    let axis = LogAxis::covering(ok.iter().map(|p| p.1), Y1, Y0);
    let mut out = String::new();
    header(&mut out, title);
    for (v, labelled) in axis.ticks() {
        let y = axis.pos(v);
        let stroke = if labelled { "#ccc" } else { "#eee" };
        let _ = writeln!(
            out,
            "<line x1=\"{X0}\" y1=\"{y:.1}\" x2=\"{X1}\" y2=\"{y:.1}\" stroke=\"{stroke}\"/>"
        );
        if labelled {
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                X0 - 6.0,
                y + 4.0,
                ms_label(v)
            );
        }
    }
    let ticks = (t_end / step).round() as usize;
    for i in 0..=ticks {
        let t = step * i as f64;
        let x = px(t);
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{Y1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            Y1 + 6.0,
            Y1 + 20.0,
            (t * 1e6).round() / 1e6
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">send time (s)</text>",
        (X0 + X1) / 2.0,
        Y1 + 42.0
    );
    y_label(&mut out, "time to first token (log scale)");
    out.push_str(&format!(
        "<g fill=\"{}\" fill-opacity=\"0.6\">\n",
        PALETTE[0]
    ));
    for (t, v) in &ok {
        let _ = writeln!(
            out,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\"/>",
            px(*t),
            axis.pos(*v)
        );
    }
    out.push_str("</g>\n");
    out.push_str(&format!(
        "<g stroke=\"{ERROR_COLOUR}\" stroke-width=\"1.5\">\n"
    ));
    for t in &errors {
        let (x, y) = (px(*t), Y1 - 6.0);
        let _ = writeln!(
            out,
            "<path d=\"M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}\"/>",
            x - 3.0,
            y - 3.0,
            x + 3.0,
            y + 3.0,
            x - 3.0,
            y + 3.0,
            x + 3.0,
            y - 3.0
        );
    }
    out.push_str("</g>\n");
    legend(
        &mut out,
        &[
            (PALETTE[0].to_string(), format!("TTFT (n={})", ok.len())),
            (
                ERROR_COLOUR.to_string(),
                format!("error (n={})", errors.len()),
            ),
        ],
        Corner::TopRight,
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks that tags nest and close properly, that the root is `<svg>`, and that text holds
    /// no raw `<` or `&` outside entities; returns the number of elements.
    fn well_formed(svg: &str) -> usize {
        assert!(svg.starts_with("<svg "), "{}", &svg[..svg.len().min(40)]);
        let mut stack: Vec<&str> = Vec::new();
        let mut elements = 0;
        let mut rest = svg;
        while let Some(open) = rest.find('<') {
            let text = &rest[..open];
            for (i, _) in text.match_indices('&') {
                let ent = &text[i..];
                assert!(
                    ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                        .iter()
                        .any(|e| ent.starts_with(e)),
                    "raw & in {text:?}"
                );
            }
            let close = rest[open..].find('>').expect("unclosed tag") + open;
            let tag = &rest[open + 1..close];
            assert!(!tag.contains('<'), "nested < in tag {tag:?}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop(), Some(name.trim()), "mismatched </{name}>");
            } else {
                elements += 1;
                let name = tag.split_whitespace().next().unwrap_or("");
                if !tag.ends_with('/') {
                    if stack.is_empty() {
                        assert_eq!(name, "svg", "root element");
                    }
                    stack.push(name.trim_end_matches('/'));
                } else {
                    assert!(!stack.is_empty(), "element outside <svg>");
                }
            }
            rest = &rest[close + 1..];
        }
        assert!(stack.is_empty(), "unclosed {stack:?}");
        assert!(rest.trim().is_empty(), "text after </svg>");
        elements
    }

    #[test]
    fn cdf_of_several_series_is_well_formed_and_named() {
        let a: Vec<f64> = (1..=200).map(|i| f64::from(i) * 3.7).collect();
        let b: Vec<f64> = (1..=50).map(|i| f64::from(i).powi(2)).collect();
        let svg = cdf_svg(
            &[
                ("pronto <predicted_ttft>", &a),
                ("sglang & co", &b),
                ("none", &[]),
            ],
            "TTFT \"CDF\"",
        );
        let elements = well_formed(&svg);
        assert!(svg.contains("pronto &lt;predicted_ttft&gt; (n=200)"));
        assert!(svg.contains("sglang &amp; co (n=50)"));
        assert!(svg.contains("none (n=0)"));
        assert_eq!(
            svg.matches("<polyline").count(),
            2,
            "no curve for an empty series"
        );
        // 1 ms .. 10 s: decade labels, log spaced.
        for label in [">1 ms<", ">10 ms<", ">100 ms<", ">1 s<", ">10 s<"] {
            assert!(svg.contains(label), "missing tick {label}");
        }
        assert!(elements > 20);
    }

    #[test]
    fn cdf_steps_rise_monotonically_to_one() {
        let v = [5.0, 1.0, 3.0, 2.0];
        let svg = cdf_svg(&[("s", &v)], "t");
        well_formed(&svg);
        let pts = svg.split("points=\"").nth(1).unwrap();
        let pts = &pts[..pts.find('"').unwrap()];
        let xy: Vec<(f64, f64)> = pts
            .split(' ')
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        assert!(xy.windows(2).all(|w| w[1].0 >= w[0].0 && w[1].1 <= w[0].1));
        assert_eq!(xy.first().unwrap().1, Y1);
        assert_eq!(xy.last().unwrap().1, Y0);
        // Narrow data (1..5 ms, one decade): the 2× and 5× ticks are labelled.
        assert!(svg.contains(">2 ms<") && svg.contains(">5 ms<"));
    }

    #[test]
    fn the_cdf_legend_sits_clear_of_the_curves() {
        // A steep fast curve at the left (most of it high there) and a long slow tail: the
        // demo's shapes. No curve point falls inside the legend's box.
        let fast: Vec<f64> = (1..=300).map(|i| 20.0 + f64::from(i) * 0.2).collect();
        let slow: Vec<f64> = (1..=300).map(|i| 20.0 * 1.02f64.powi(i)).collect();
        let svg = cdf_svg(&[("fast", &fast), ("slow", &slow)], "t");
        let attr = |tag: &str, name: &str| -> f64 {
            let t = &tag[tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3..];
            t[..t.find('"').unwrap()].parse().unwrap()
        };
        let rect = svg
            .lines()
            .find(|l| l.starts_with("<rect") && l.contains("fill-opacity"))
            .expect("a legend box");
        let (x, y) = (attr(rect, "x"), attr(rect, "y"));
        let (w, h) = (attr(rect, "width"), attr(rect, "height"));
        assert!(x + w <= X1 && y + h <= Y1 && x >= X0 && y >= Y0, "{rect}");
        let mut points = 0;
        for line in svg.lines().filter(|l| l.starts_with("<polyline")) {
            let pts = line.split("points=\"").nth(1).unwrap();
            for p in pts[..pts.find('"').unwrap()].split(' ') {
                let (px, py) = p.split_once(',').unwrap();
                let (px, py): (f64, f64) = (px.parse().unwrap(), py.parse().unwrap());
                assert!(
                    !(px > x && px < x + w && py > y && py < y + h),
                    "({px}, {py}) inside the legend {rect}"
                );
                points += 1;
            }
        }
        assert!(points > 1000);
    }

    #[test]
    fn log_axis_edges() {
        let a = LogAxis::covering([0.0, -1.0, f64::NAN].into_iter(), 0.0, 100.0);
        assert_eq!((a.lo, a.hi), (0, 3), "no usable values: default decades");
        let a = LogAxis::covering([10.0].into_iter(), 0.0, 100.0);
        assert_eq!((a.lo, a.hi), (1, 2));
        assert_eq!(a.pos(10.0), 0.0);
        assert_eq!(a.pos(100.0), 100.0);
        let a = LogAxis::covering([0.2, 3000.0].into_iter(), 0.0, 100.0);
        assert_eq!((a.lo, a.hi), (-1, 4));
        assert_eq!(ms_label(0.5), "0.5 ms");
        assert_eq!(ms_label(2000.0), "2 s");
        assert_eq!(linear_step(60.0), 10.0);
        assert_eq!(linear_step(7.0), 1.0);
        assert_eq!(linear_step(0.0), 1.0);
    }

    #[test]
    fn over_time_marks_errors_apart() {
        let mut pts: Vec<TimePoint> = (0..30)
            .map(|i| TimePoint {
                t_s: f64::from(i) * 0.5,
                ttft_ms: Some(20.0 + f64::from(i)),
                error: false,
            })
            .collect();
        pts.push(TimePoint {
            t_s: 3.0,
            ttft_ms: None,
            error: true,
        });
        let svg = over_time_svg(&pts, "over time");
        well_formed(&svg);
        assert_eq!(svg.matches("<circle").count(), 30);
        assert!(svg.contains("error (n=1)") && svg.contains("TTFT (n=30)"));
        let empty = over_time_svg(&[], "nothing");
        well_formed(&empty);
        assert_eq!(empty.matches("<circle").count(), 0);
    }
}
