//! Wording shared by the renderers and the acceptance lines: numbers with as many decimals as
//! they deserve, shares as percentages, and how an overload run recovered.

use super::Recovery;

/// A figure with 0, 1 or 2 decimals depending on its size (`1234`, `56.7`, `8.90`).
pub(crate) fn f(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A share as a whole percentage (`0.953` → `95 %`).
pub(crate) fn pct(x: f64) -> String {
    format!("{:.0} %", x * 100.0)
}

/// How an overload run recovered, in words (the HTML phase table and the text summary).
pub(crate) fn recovery_text(r: &Recovery) -> String {
    match r.time_to_recover_s {
        Some(s) => format!(
            "{s:.0} s after the drop at {:.0} s (≥ 99.9 % success per second from then on)",
            r.drop_at_s
        ),
        None => format!(
            "not recovered: success per second after the drop at {:.0} s: {}",
            r.drop_at_s,
            r.success_by_second
                .iter()
                .map(|x| format!("{:.1} %", x * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
