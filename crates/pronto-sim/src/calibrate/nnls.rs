//! Non-negative least squares: `min ‖A x − b‖²` subject to `x ≥ 0` (Lawson & Hanson's
//! active-set algorithm, "Solving Least Squares Problems", 1974, ch. 23).
//!
//! Small dense problems only (a few dozen rows, at most a dozen columns). Columns are scaled
//! to unit norm first (the timing features span six orders of magnitude); an all-zero column
//! gets 0. Each unconstrained sub-problem is solved by Householder QR, not normal equations.

// Dense linear algebra reads best with explicit row and column indices.
#![allow(clippy::needless_range_loop)]

/// Solve `min ‖A x − b‖², x ≥ 0`; `a` is row-major with `cols` columns.
pub fn nnls(a: &[Vec<f64>], b: &[f64], cols: usize) -> Vec<f64> {
    assert_eq!(a.len(), b.len(), "one target per row");
    assert!(a.iter().all(|r| r.len() == cols), "rows of `cols` columns");
    let m = a.len();
    let norms: Vec<f64> = (0..cols)
        .map(|j| a.iter().map(|r| r[j] * r[j]).sum::<f64>().sqrt())
        .collect();
    let usable: Vec<bool> = norms.iter().map(|&n| n > 0.0 && n.is_finite()).collect();
    let s: Vec<Vec<f64>> = a
        .iter()
        .map(|r| {
            (0..cols)
                .map(|j| if usable[j] { r[j] / norms[j] } else { 0.0 })
                .collect()
        })
        .collect();
    let mut x = vec![0.0; cols];
    let mut passive = vec![false; cols];
    let tol = 1e-12 * (1.0 + b.iter().map(|v| v * v).sum::<f64>().sqrt());
    let gradient = |x: &[f64]| -> Vec<f64> {
        let resid: Vec<f64> = (0..m)
            .map(|i| b[i] - (0..cols).map(|j| s[i][j] * x[j]).sum::<f64>())
            .collect();
        (0..cols)
            .map(|j| (0..m).map(|i| s[i][j] * resid[i]).sum())
            .collect()
    };
    for _outer in 0..3 * cols + 3 {
        let w = gradient(&x);
        let next = (0..cols)
            .filter(|&j| usable[j] && !passive[j])
            .max_by(|&i, &j| w[i].total_cmp(&w[j]));
        let Some(j) = next.filter(|&j| w[j] > tol) else {
            break;
        };
        passive[j] = true;
        for _inner in 0..3 * cols + 3 {
            let z = solve_on(&s, b, &passive);
            if (0..cols).all(|k| !passive[k] || z[k] > 0.0) {
                x = z;
                break;
            }
            // Step from x towards z until the first passive variable reaches 0.
            let alpha = (0..cols)
                .filter(|&k| passive[k] && z[k] <= 0.0)
                .map(|k| x[k] / (x[k] - z[k]))
                .fold(f64::INFINITY, f64::min);
            for k in 0..cols {
                x[k] += alpha * (z[k] - x[k]);
                if passive[k] && x[k] <= tol {
                    passive[k] = false;
                    x[k] = 0.0;
                }
            }
        }
    }
    (0..cols)
        .map(|j| if usable[j] { x[j] / norms[j] } else { 0.0 })
        .collect()
}

/// Unconstrained least squares over the columns marked in `on` (the others 0), by
/// Householder QR.
fn solve_on(a: &[Vec<f64>], b: &[f64], on: &[bool]) -> Vec<f64> {
    let idx: Vec<usize> = (0..on.len()).filter(|&j| on[j]).collect();
    let (m, k) = (a.len(), idx.len());
    let mut r: Vec<Vec<f64>> = a
        .iter()
        .map(|row| idx.iter().map(|&j| row[j]).collect())
        .collect();
    let mut y = b.to_vec();
    for c in 0..k.min(m) {
        let norm = (c..m).map(|i| r[i][c] * r[i][c]).sum::<f64>().sqrt();
        if norm == 0.0 {
            continue;
        }
        let alpha = if r[c][c] > 0.0 { -norm } else { norm };
        let mut v: Vec<f64> = (c..m).map(|i| r[i][c]).collect();
        v[0] -= alpha;
        let vv: f64 = v.iter().map(|x| x * x).sum();
        if vv == 0.0 {
            continue;
        }
        for col in c..k {
            let d: f64 = (c..m).map(|i| v[i - c] * r[i][col]).sum::<f64>() * 2.0 / vv;
            for i in c..m {
                r[i][col] -= d * v[i - c];
            }
        }
        let d: f64 = (c..m).map(|i| v[i - c] * y[i]).sum::<f64>() * 2.0 / vv;
        for i in c..m {
            y[i] -= d * v[i - c];
        }
    }
    // Back substitution; a (numerically) dependent column gets 0.
    let mut z = vec![0.0; k];
    let scale = (0..k.min(m)).map(|c| r[c][c].abs()).fold(0.0_f64, f64::max);
    for c in (0..k.min(m)).rev() {
        if r[c][c].abs() <= 1e-12 * scale {
            continue;
        }
        let s: f64 = (c + 1..k).map(|j| r[c][j] * z[j]).sum();
        z[c] = (y[c] - s) / r[c][c];
    }
    let mut out = vec![0.0; on.len()];
    for (p, &j) in idx.iter().enumerate() {
        out[j] = z[p];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn residual(a: &[Vec<f64>], b: &[f64], x: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(r, bi)| (r.iter().zip(x).map(|(p, q)| p * q).sum::<f64>() - bi).powi(2))
            .sum()
    }

    #[test]
    fn recovers_an_exact_non_negative_solution() {
        let truth = [3.0, 0.01, 2.5, 0.0];
        let a: Vec<Vec<f64>> = (0..12)
            .map(|i| {
                let n = 100.0 * (i + 1) as f64;
                vec![1.0, n, n * n / 2e6, (i % 3) as f64]
            })
            .collect();
        let b: Vec<f64> = a
            .iter()
            .map(|r| r.iter().zip(&truth).map(|(p, q)| p * q).sum())
            .collect();
        let x = nnls(&a, &b, 4);
        for (got, want) in x.iter().zip(truth) {
            assert!((got - want).abs() < 1e-9 * (1.0 + want), "{x:?}");
        }
    }

    #[test]
    fn clamps_at_zero_and_beats_every_clamped_alternative() {
        // Unconstrained optimum has a negative slope.
        let a: Vec<Vec<f64>> = (0..6).map(|i| vec![1.0, i as f64]).collect();
        let b = [5.0, 4.0, 3.5, 3.0, 2.0, 1.5];
        let x = nnls(&a, &b, 2);
        assert_eq!(x[1], 0.0);
        let mean = b.iter().sum::<f64>() / 6.0;
        assert!((x[0] - mean).abs() < 1e-9, "{x:?}");
        // KKT, checked against a grid of feasible points.
        let best = residual(&a, &b, &x);
        for i in 0..50 {
            for j in 0..50 {
                let y = [i as f64 * 0.2, j as f64 * 0.02];
                assert!(residual(&a, &b, &y) >= best - 1e-9);
            }
        }
    }

    #[test]
    fn zero_and_duplicate_columns_are_harmless() {
        let a: Vec<Vec<f64>> = (0..5).map(|i| vec![0.0, 1.0, i as f64, i as f64]).collect();
        let b: Vec<f64> = (0..5).map(|i| 2.0 + 3.0 * i as f64).collect();
        let x = nnls(&a, &b, 4);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 2.0).abs() < 1e-9, "{x:?}");
        assert!((x[2] + x[3] - 3.0).abs() < 1e-9, "{x:?}");
        assert!(x.iter().all(|v| *v >= 0.0));
        assert_eq!(nnls(&[], &[], 3), vec![0.0; 3]);
    }
}
