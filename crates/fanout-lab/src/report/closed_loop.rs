//! Closed-loop cells (`parallel-calls`) → per-target summaries: the rounds of each route × client
//! count together, mean ms per operation with JMH's error (99.9 % confidence interval over 1-s
//! iterations), percentiles over every operation, CPU per operation; and the warnings a reader
//! needs (failed operations, calls per operation other than expected, a busy machine, targets
//! that did not run).

use super::format::f;
use super::{ClosedCell, ClosedLoopReport, ClosedRun, LabReport, Stat};

/// How `mean_ms ± error_ms` is computed, for the report.
pub const ERROR_METHOD: &str = "mean = the mean of the iterations' means (an iteration is 1 s of a measured window: the operations that ended in it; the clients finishing their last operation count in the last one), pooled over the rounds; ± = half-width of its 99.9 % confidence interval, t(0.9995, n−1) · s / √n over the n iterations — as JMH computes `Error` over its iterations";

/// Other processes' share of the machine above which a cell gets a warning, %.
const OTHERS_PCT: f64 = 10.0;

/// Two-sided 99.9 % quantile of Student's t distribution, t(0.9995, df), from the standard
/// table (df 1–30, 40, 60, 120, ∞), interpolated linearly in 1/df in between; `None` for df 0.
pub fn t999(df: usize) -> Option<f64> {
    const SMALL: [f64; 30] = [
        636.619, 31.599, 12.924, 8.610, 6.869, 5.959, 5.408, 5.041, 4.781, 4.587, 4.437, 4.318,
        4.221, 4.140, 4.073, 4.015, 3.965, 3.922, 3.883, 3.850, 3.819, 3.792, 3.768, 3.745, 3.725,
        3.707, 3.690, 3.674, 3.659, 3.646,
    ];
    const LARGE: [(f64, f64); 4] = [(30.0, 3.646), (40.0, 3.551), (60.0, 3.460), (120.0, 3.373)];
    const INF: f64 = 3.291;
    match df {
        0 => None,
        1..=30 => SMALL.get(df - 1).copied(),
        _ => {
            let x = df as f64;
            let inv = 1.0 / x;
            for w in LARGE.windows(2) {
                let ((d0, t0), (d1, t1)) = (w[0], w[1]);
                if x <= d1 {
                    let (i0, i1) = (1.0 / d0, 1.0 / d1);
                    return Some(t1 + (t0 - t1) * (inv - i1) / (i0 - i1));
                }
            }
            // 120 < df: between t(120) and t(∞), linear in 1/df.
            Some(INF + (3.373 - INF) * inv * 120.0)
        }
    }
}

/// Mean and JMH's error of `xs` (the iterations' means).
fn mean_and_error(xs: &[f64]) -> (f64, Option<f64>) {
    let n = xs.len();
    if n == 0 {
        return (0.0, None);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, None);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let err = t999(n - 1).map(|t| t * var.sqrt() / (n as f64).sqrt());
    (mean, err)
}

fn median(v: Vec<f64>) -> f64 {
    Stat::of(v).median
}

/// One target's cell over its runs (all of the same route and clients).
fn cell(runs: &[&ClosedRun]) -> Option<ClosedCell> {
    let first = runs.first()?;
    let iterations: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.iterations_ms.iter().copied())
        .collect();
    let (mean_ms, error_ms) = mean_and_error(&iterations);
    let mut lat: Vec<u64> = runs
        .iter()
        .flat_map(|r| r.latencies_us.iter().copied())
        .collect();
    lat.sort_unstable();
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0.0, |v| *v as f64 / 1000.0)
    };
    let ops: u64 = runs.iter().map(|r| r.ops).sum();
    let elapsed: f64 = runs.iter().map(|r| r.elapsed_s).sum();
    let stub_calls: u64 = runs.iter().map(|r| r.stub_calls).sum();
    let stub_cpu: Vec<f64> = runs.iter().filter_map(|r| r.stub_cpu_ms_per_op).collect();
    let busy: Vec<f64> = runs.iter().filter_map(|r| r.machine_busy_pct).collect();
    let others: Vec<f64> = runs.iter().filter_map(|r| r.others_busy_pct).collect();
    Some(ClosedCell {
        route: first.route.clone(),
        clients: first.clients,
        rounds: runs.len(),
        ops,
        errors: runs.iter().map(|r| r.errors).sum(),
        ops_per_s: ops as f64 / elapsed.max(1e-9),
        mean_ms,
        error_ms,
        iterations: iterations.len(),
        p50_ms: pick(0.5),
        p99_ms: pick(0.99),
        cpu_ms_per_op: Stat::of(runs.iter().map(|r| r.cpu_ms_per_op).collect()),
        stub_calls_per_op: stub_calls as f64 / ops.max(1) as f64,
        stub_cpu_ms_per_op: (!stub_cpu.is_empty()).then(|| median(stub_cpu)),
        lab_cpu_ms_per_op: median(runs.iter().map(|r| r.lab_cpu_ms_per_op).collect()),
        machine_busy_pct: (!busy.is_empty()).then(|| median(busy)),
        others_busy_pct: (!others.is_empty()).then(|| median(others)),
        threads_max: runs.iter().map(|r| r.threads_max).max().unwrap_or(0),
        rss_max_mb: runs.iter().map(|r| r.rss_max_mb).fold(0.0, f64::max),
    })
}

/// Add a closed-loop run to `rep`: each target's cells (in the order the cells were run), the
/// run itself under `closed_loop`, and the warnings.
pub fn attach_closed_loop(rep: &mut LabReport, closed: ClosedLoopReport) {
    let mut keys: Vec<(String, usize)> = Vec::new();
    for r in &closed.runs {
        if !keys.contains(&(r.route.clone(), r.clients)) {
            keys.push((r.route.clone(), r.clients));
        }
    }
    for (name, t) in rep.targets.iter_mut() {
        t.cells = keys
            .iter()
            .filter_map(|(route, clients)| {
                let runs: Vec<&ClosedRun> = closed
                    .runs
                    .iter()
                    .filter(|r| &r.target == name && &r.route == route && r.clients == *clients)
                    .collect();
                cell(&runs)
            })
            .collect();
        for c in &t.cells {
            if c.errors > 0 {
                rep.warnings.push(format!(
                    "{name} {} × {} clients: {} of {} operations failed ({})",
                    c.route,
                    c.clients,
                    c.errors,
                    c.ops,
                    first_error(&closed.runs, name, &c.route, c.clients)
                ));
            }
            let want = closed.calls_per_op as f64;
            if c.ops > 0 && c.errors == 0 && (c.stub_calls_per_op - want).abs() > 0.005 {
                rep.warnings.push(format!(
                    "{name} {} × {} clients: {} stub calls per operation, not {}",
                    c.route,
                    c.clients,
                    f(c.stub_calls_per_op),
                    closed.calls_per_op
                ));
            }
            let others = c.others_busy_pct.unwrap_or(0.0);
            if others >= OTHERS_PCT {
                rep.warnings.push(format!(
                    "{name} {} × {} clients: other processes (not the target, the stub or the clients) kept {others:.0} % of the machine's CPU busy (median over the rounds): the figures include waiting for it",
                    c.route, c.clients
                ));
            } else if c.machine_busy_pct.is_some_and(|b| b >= 95.0) {
                rep.warnings.push(format!(
                    "{name} {} × {} clients: the machine was {:.0} % busy (all cores), nearly all of it the target, the stub and the clients: they competed for the CPU, and the figure includes that wait",
                    c.route,
                    c.clients,
                    c.machine_busy_pct.unwrap_or(0.0)
                ));
            }
        }
    }
    for (name, why) in &closed.not_run {
        rep.warnings.push(format!("{name}: not run — {why}"));
    }
    rep.closed_loop = Some(closed);
}

fn first_error(runs: &[ClosedRun], target: &str, route: &str, clients: usize) -> String {
    runs.iter()
        .filter(|r| r.target == target && r.route == route && r.clients == clients)
        .find_map(|r| {
            r.first_error.clone().map(|e| {
                let kinds: Vec<String> = r
                    .error_kinds
                    .iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .collect();
                format!("{}; first: {e}", kinds.join(", "))
            })
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_match_the_table() {
        assert_eq!(t999(0), None);
        assert_eq!(t999(1), Some(636.619));
        assert_eq!(t999(9), Some(4.781));
        assert_eq!(t999(30), Some(3.646));
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 0.01);
        assert!(close(t999(40), 3.551));
        assert!(close(t999(60), 3.460));
        assert!(close(t999(120), 3.373));
        // Between the table's rows (t(50) = 3.496, t(100) = 3.390, t(1000) ≈ 3.300).
        assert!(close(t999(50), 3.496), "{:?}", t999(50));
        assert!(close(t999(100), 3.390), "{:?}", t999(100));
        assert!(close(t999(1000), 3.300), "{:?}", t999(1000));
        // Decreasing towards the normal quantile.
        let mut last = f64::INFINITY;
        for df in 1..2000 {
            let t = t999(df).unwrap_or(0.0);
            assert!(t < last && t > 3.29, "df {df}: {t}");
            last = t;
        }
    }

    #[test]
    fn mean_and_error_are_jmh_like() {
        assert_eq!(mean_and_error(&[]), (0.0, None));
        assert_eq!(mean_and_error(&[5.0]), (5.0, None));
        // n = 4, mean 10, s = √(20/3): error = t(3) · s / 2 = 12.924 · 2.582 / 2.
        let (m, e) = mean_and_error(&[7.0, 9.0, 11.0, 13.0]);
        assert_eq!(m, 10.0);
        let want = 12.924 * (20.0f64 / 3.0).sqrt() / 2.0;
        assert!(e.is_some_and(|e| (e - want).abs() < 1e-9), "{e:?}");
        // No spread, no error.
        assert_eq!(mean_and_error(&[3.0, 3.0, 3.0]).1, Some(0.0));
    }
}
