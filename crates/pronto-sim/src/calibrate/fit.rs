//! The fit: θ that makes the replayed shapes match the measured ones.
//!
//! Minimise the weighted squared *relative* error over the shapes,
//!
//! ```text
//! Σ_k  w_k · ((x_k(θ) · θ − y_k) / y_k)²       θ ≥ 0, fixed parameters pinned
//! ```
//!
//! where `y_k` is shape k's measured median and `x_k(θ)` its [`super::replay::shape_row`] at θ
//! (TTFT rows weight 1, ITL rows [`FitOptions::itl_weight`]). For a fixed schedule the problem
//! is a non-negative least-squares problem ([`super::nnls`]); the schedule depends on θ, so the
//! fit is a fixed-point iteration — replay at θ, solve for θ′, replay at θ′ — that stops when θ
//! no longer moves. The iteration can settle in a schedule that is self-consistent but wrong
//! (a batch explained by steps it would not share at the true θ), so it is started from a grid
//! of front-end values ([`start_grid`]: they decide which requests share a step) and the
//! iterate whose own schedule scores best over all starts is returned. Everything here is pure
//! and deterministic.

use super::nnls::nnls;
use super::params::{Lin, Param, Theta, N};
use super::replay::{shape_row, ReplayError};
use super::shapes::{Kind, ShapeResult};
use crate::engine::EngineConfig;

/// Which statistic of each shape is fitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stat {
    /// Median of all samples.
    Median,
    /// Lower quartile of the per-repetition medians (the quiet-host estimate).
    Quiet,
}

impl Stat {
    /// The shape's value of this statistic, ms.
    pub fn of(self, r: &ShapeResult) -> f64 {
        match self {
            Stat::Median => r.ms_median,
            Stat::Quiet => r.ms_quiet,
        }
    }
}

/// What to fit and how.
#[derive(Debug, Clone, PartialEq)]
pub struct FitOptions {
    /// Parameters fitted; the rest stay at `start`'s value.
    pub free: Vec<Param>,
    /// The first iterate, and the value of every parameter not in `free`.
    pub start: Theta,
    /// Weight of an ITL row relative to a TTFT row.
    pub itl_weight: f64,
    /// Most fixed-point iterations.
    pub max_iterations: usize,
    /// Fitted statistic.
    pub stat: Stat,
}

impl FitOptions {
    /// Every parameter but `decode_ms_per_kctx` free (contexts of a few hundred tokens do not
    /// identify it), starting from a generic small engine; ITL rows weigh as much as four TTFT
    /// rows (there are two of them against twenty).
    pub fn standard() -> FitOptions {
        FitOptions {
            free: Param::ALL
                .into_iter()
                .filter(|&p| p != Param::DecodePerKctx)
                .collect(),
            start: [5.0, 0.0, 0.01, 1.0, 0.05, 0.0, 1.0, 0.001, 1.0],
            itl_weight: 4.0,
            max_iterations: 30,
            stat: Stat::Median,
        }
    }
}

/// One shape's measured value next to the fitted model's.
#[derive(Debug, Clone, PartialEq)]
pub struct Residual {
    /// Shape label.
    pub shape: String,
    /// TTFT or ITL.
    pub kind: Kind,
    /// Measured, ms.
    pub measured: f64,
    /// Model, ms.
    pub model: f64,
}

impl Residual {
    /// `(model − measured) / measured`.
    pub fn rel(&self) -> f64 {
        (self.model - self.measured) / self.measured
    }
}

/// Median and worst absolute relative error of a set of residuals, with the worst's shape.
pub fn error_summary<'a>(rows: impl Iterator<Item = &'a Residual>) -> Option<(f64, f64, String)> {
    let rows: Vec<&Residual> = rows.collect();
    let worst = rows
        .iter()
        .max_by(|a, b| a.rel().abs().total_cmp(&b.rel().abs()))?;
    let errs: Vec<f64> = rows.iter().map(|r| r.rel().abs()).collect();
    Some((
        super::shapes::median(&errs),
        worst.rel().abs(),
        worst.shape.clone(),
    ))
}

/// A finished fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// The fitted parameters.
    pub theta: Theta,
    /// Per shape, measured vs model at θ.
    pub residuals: Vec<Residual>,
    /// Fixed-point iterations run.
    pub iterations: usize,
    /// Whether θ stopped moving (else the best iterate of `max_iterations` is returned).
    pub converged: bool,
}

/// Why a fit failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    /// A shape could not be replayed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// A measured value is not a positive number.
    #[error("{0}: measured value is not a positive number")]
    BadValue(String),
    /// Nothing to fit.
    #[error("no shapes to fit")]
    Empty,
}

/// The replayed rows of every shape at θ.
pub fn rows(
    results: &[ShapeResult],
    cfg: &EngineConfig,
    theta: &Theta,
) -> Result<Vec<Lin>, FitError> {
    results
        .iter()
        .map(|r| Ok(shape_row(&r.shape(), r.prompt_tokens(), cfg, theta)?))
        .collect()
}

/// The model's value of every shape at θ, ms.
pub fn predict(
    results: &[ShapeResult],
    cfg: &EngineConfig,
    theta: &Theta,
) -> Result<Vec<f64>, FitError> {
    Ok(rows(results, cfg, theta)?
        .iter()
        .map(|x| x.at(theta))
        .collect())
}

fn weight(r: &ShapeResult, opts: &FitOptions) -> f64 {
    match r.kind {
        Kind::Decode => opts.itl_weight,
        _ => 1.0,
    }
}

/// Weighted squared relative error of θ under its own schedule.
fn score(xs: &[Lin], ys: &[f64], ws: &[f64], theta: &Theta) -> f64 {
    xs.iter()
        .zip(ys)
        .zip(ws)
        .map(|((x, y), w)| w * ((x.at(theta) - y) / y).powi(2))
        .sum()
}

/// One least-squares solve for a fixed schedule: the free parameters, non-negative.
fn solve(xs: &[Lin], ys: &[f64], ws: &[f64], theta: &Theta, free: &[Param]) -> Theta {
    let fixed: Vec<bool> = (0..N)
        .map(|j| !free.iter().any(|p| p.index() == j))
        .collect();
    let mut a = Vec::with_capacity(xs.len());
    let mut b = Vec::with_capacity(xs.len());
    for ((x, &y), &w) in xs.iter().zip(ys).zip(ws) {
        let sw = w.sqrt();
        let offset: f64 = (0..N)
            .filter(|&j| fixed[j])
            .map(|j| x.0[j] * theta[j])
            .sum();
        a.push(
            free.iter()
                .map(|p| sw * x.0[p.index()] / y)
                .collect::<Vec<f64>>(),
        );
        b.push(sw * (y - offset) / y);
    }
    let sol = nnls(&a, &b, free.len());
    let mut out = *theta;
    for (p, v) in free.iter().zip(sol) {
        out[p.index()] = v;
    }
    out
}

/// The starting points: `opts.start`, then every combination of a few values of the free
/// front-end terms and the output latency (which decide when requests reach the engine and so
/// which share a step).
pub fn start_grid(opts: &FitOptions) -> Vec<Theta> {
    let mut out = vec![opts.start];
    let free = |p: Param| opts.free.contains(&p);
    let values = |p: Param, grid: &[f64]| -> Vec<f64> {
        if free(p) {
            grid.to_vec()
        } else {
            vec![opts.start[p.index()]]
        }
    };
    for &req in &values(Param::FrontendRequest, &[0.5, 2.0, 5.0, 10.0, 20.0]) {
        for &tok in &values(Param::FrontendPerToken, &[0.001, 0.005, 0.02]) {
            for &lat in &values(Param::Latency, &[0.5, 5.0, 15.0]) {
                let mut t = opts.start;
                t[Param::FrontendRequest.index()] = req;
                t[Param::FrontendPerToken.index()] = tok;
                t[Param::Latency.index()] = lat;
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
    }
    out
}

/// Halvings of a step before a fixed-point run gives up on it.
const BACKTRACKS: usize = 6;

/// One fixed-point run from `start`.
struct Run {
    theta: Theta,
    score: f64,
    iterations: usize,
    converged: bool,
}

fn fixed_point(
    results: &[ShapeResult],
    cfg: &EngineConfig,
    opts: &FitOptions,
    ys: &[f64],
    ws: &[f64],
    start: Theta,
) -> Result<Run, FitError> {
    let mut theta = start;
    let mut xs = rows(results, cfg, &theta)?;
    let mut s = score(&xs, ys, ws, &theta);
    let mut iterations = 0;
    let mut converged = false;
    while iterations < opts.max_iterations {
        iterations += 1;
        let target = solve(&xs, ys, ws, &theta, &opts.free);
        let moved = target
            .iter()
            .zip(&theta)
            .any(|(a, b)| (a - b).abs() > 1e-9 + 1e-7 * b.abs());
        if !moved {
            converged = true;
            break;
        }
        // The solve is exact for θ's schedule only: step towards it, halving the step until
        // the score under the new point's own schedule improves (a convex combination of
        // non-negative points stays non-negative).
        let mut accepted = None;
        let mut alpha = 1.0;
        for _ in 0..BACKTRACKS {
            let cand: Theta = std::array::from_fn(|j| theta[j] + alpha * (target[j] - theta[j]));
            let xc = rows(results, cfg, &cand)?;
            let sc = score(&xc, ys, ws, &cand);
            if sc < s {
                accepted = Some((cand, xc, sc));
                break;
            }
            alpha *= 0.5;
        }
        let Some((cand, xc, sc)) = accepted else {
            // No step along the solve improves: a local optimum of the schedule-dependent
            // score.
            converged = true;
            break;
        };
        (theta, xs, s) = (cand, xc, sc);
    }
    Ok(Run {
        theta,
        score: s,
        iterations,
        converged,
    })
}

/// Fit θ to the measured shapes (see the module docs).
pub fn fit(
    results: &[ShapeResult],
    cfg: &EngineConfig,
    opts: &FitOptions,
) -> Result<Fit, FitError> {
    if results.is_empty() {
        return Err(FitError::Empty);
    }
    let ys: Vec<f64> = results.iter().map(|r| opts.stat.of(r)).collect();
    for (r, y) in results.iter().zip(&ys) {
        if !(y.is_finite() && *y > 0.0) {
            return Err(FitError::BadValue(r.shape.clone()));
        }
    }
    let ws: Vec<f64> = results.iter().map(|r| weight(r, opts)).collect();
    let mut best: Option<(f64, Theta)> = None;
    let mut iterations = 0;
    let mut converged = false;
    for start in start_grid(opts) {
        let run = fixed_point(results, cfg, opts, &ys, &ws, start)?;
        iterations += run.iterations;
        if best.as_ref().is_none_or(|(b, _)| run.score < *b) {
            best = Some((run.score, run.theta));
            converged = run.converged;
        }
        if best.as_ref().is_some_and(|(b, _)| *b < 1e-20) {
            break;
        }
    }
    let (_, theta) = best.expect("at least one iterate");
    let preds = predict(results, cfg, &theta)?;
    let residuals = results
        .iter()
        .zip(ys)
        .zip(preds)
        .map(|((r, measured), model)| Residual {
            shape: r.shape.clone(),
            kind: r.kind,
            measured,
            model,
        })
        .collect();
    Ok(Fit {
        theta,
        residuals,
        iterations,
        converged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::shapes::Plan;
    use crate::profile::Profile;

    fn cfg() -> EngineConfig {
        EngineConfig::from_profile(Profile::builtin("cpu-tiny").unwrap())
    }

    /// Measurements that are exactly the model's values at `theta`.
    fn synthetic(plan: &Plan, theta: &Theta) -> Vec<ShapeResult> {
        plan.shapes
            .iter()
            .map(|s| {
                let y = shape_row(s, s.tokens, &cfg(), theta).unwrap().at(theta);
                ShapeResult::summarise(s, &[y], &[y], &[s.tokens], &[])
            })
            .collect()
    }

    #[test]
    fn recovers_known_coefficients_from_the_standard_shapes() {
        let truth: Theta = [3.0, 2.0, 0.01, 3.0, 0.1, 0.0, 6.0, 0.005, 8.0];
        let results = synthetic(&Plan::standard(), &truth);
        let f = fit(&results, &cfg(), &FitOptions::standard()).unwrap();
        for p in Param::ALL {
            let (got, want) = (f.theta[p.index()], truth[p.index()]);
            assert!(
                (got - want).abs() <= 1e-4 * want.max(1e-3),
                "{}: {got} vs {want} ({f:?})",
                p.name()
            );
        }
        assert!(f.residuals.iter().all(|r| r.rel().abs() < 1e-6), "{f:?}");
        let (med, worst, _) = error_summary(f.residuals.iter()).unwrap();
        assert!(med < 1e-6 && worst < 1e-6);
    }

    #[test]
    fn recovers_a_gpu_like_profile_without_a_front_end() {
        // No front end, a plain per-step floor: what the GPU profiles look like.
        let truth: Theta = [10.0, 0.0, 0.0214, 1.06, 0.025, 0.0, 0.0, 0.0, 0.0];
        let results = synthetic(&Plan::standard(), &truth);
        let f = fit(&results, &cfg(), &FitOptions::standard()).unwrap();
        let preds = predict(&results, &cfg(), &f.theta).unwrap();
        for (r, p) in results.iter().zip(preds) {
            assert!(
                (p - r.ms_median).abs() <= 1e-4 * r.ms_median,
                "{}: {p}",
                r.shape
            );
        }
        assert!((f.theta[0] - 10.0).abs() < 1e-3, "{:?}", f.theta);
    }

    #[test]
    fn fixed_parameters_stay_put_and_bad_input_is_an_error() {
        let truth: Theta = [3.0, 2.0, 0.01, 3.0, 0.1, 0.0, 6.0, 0.005, 8.0];
        let results = synthetic(&Plan::standard(), &truth);
        let mut opts = FitOptions::standard();
        opts.free.retain(|&p| p != Param::Latency);
        opts.start[Param::Latency.index()] = 8.0;
        let f = fit(&results, &cfg(), &opts).unwrap();
        assert_eq!(f.theta[Param::Latency.index()], 8.0);
        assert!((f.theta[Param::Floor.index()] - 3.0).abs() < 0.06, "{f:?}");
        assert_eq!(fit(&[], &cfg(), &opts), Err(FitError::Empty));
        let mut bad = results.clone();
        bad[0].ms_median = 0.0;
        assert!(matches!(
            fit(&bad, &cfg(), &opts),
            Err(FitError::BadValue(_))
        ));
    }

    #[test]
    fn noisy_measurements_fit_within_their_noise() {
        let truth: Theta = [3.0, 2.0, 0.01, 3.0, 0.1, 0.0, 6.0, 0.005, 8.0];
        let mut results = synthetic(&Plan::standard(), &truth);
        // ±3 %, deterministic.
        for (i, r) in results.iter_mut().enumerate() {
            r.ms_median *= 1.0 + 0.03 * if i % 2 == 0 { 1.0 } else { -1.0 };
        }
        let f = fit(&results, &cfg(), &FitOptions::standard()).unwrap();
        let (med, worst, _) = error_summary(f.residuals.iter()).unwrap();
        assert!(med <= 0.035 && worst <= 0.06, "{med} {worst} {f:?}");
    }
}
