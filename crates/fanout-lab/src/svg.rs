//! Self-contained SVG line charts for the HTML report (no fonts, no scripts, no external files).

use std::fmt::Write;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points (x, y); drawn in order.
    pub points: Vec<(f64, f64)>,
    /// Dashed line (e.g. offered rate next to achieved).
    pub dashed: bool,
}

impl Series {
    /// A solid series.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            dashed: false,
        }
    }
    /// A dashed series.
    pub fn dashed(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            dashed: true,
            ..Series::new(name, points)
        }
    }
}

const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Escape text for XML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn nice_step(range: f64, ticks: f64) -> f64 {
    if range <= 0.0 || !range.is_finite() {
        return 1.0;
    }
    let raw = range / ticks;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm < 1.5 {
        1.0
    } else if norm < 3.0 {
        2.0
    } else if norm < 7.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A line chart with axes, ticks, a legend and point markers; `class="chart"` on the figure.
pub fn line_chart(
    id: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> String {
    let (w, h) = (760.0, 330.0);
    let (left, right, top, bottom) = (70.0, 170.0, 20.0, 50.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let pts = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    let mut any = false;
    for &(x, y) in pts {
        any = true;
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<figure class="chart" id="{}"><figcaption>{}</figcaption><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{}">"#,
        esc(id),
        esc(title),
        esc(title)
    );
    let _ = write!(
        out,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>"##
    );
    if !any {
        let _ = write!(
            out,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#666">no data</text></svg></figure>"##,
            left + pw / 2.0,
            top + ph / 2.0
        );
        return out;
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let y0 = 0.0;
    let ystep = nice_step(y1 - y0, 5.0);
    let y1 = ((y1 / ystep).ceil() * ystep).max(ystep);
    let xstep = nice_step(x1 - x0, 6.0);
    let sx = |x: f64| left + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| top + ph - (y - y0) / (y1 - y0) * ph;
    // Grid and ticks.
    let mut t = y0;
    while t <= y1 + ystep * 0.01 {
        let y = sy(t);
        let _ = write!(
            out,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{}" y="{:.1}" text-anchor="end" font-size="11" fill="#333">{}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0,
            fmt_tick(t)
        );
        t += ystep;
    }
    let mut t = (x0 / xstep).ceil() * xstep;
    while t <= x1 + xstep * 0.01 {
        let x = sx(t);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" stroke="#999"/><text x="{x:.1}" y="{}" text-anchor="middle" font-size="11" fill="#333">{}</text>"##,
            top + ph,
            top + ph + 4.0,
            top + ph + 17.0,
            fmt_tick(t)
        );
        t += xstep;
    }
    let _ = write!(
        out,
        r##"<text x="{}" y="{}" text-anchor="middle" font-size="12" fill="#111">{}</text>"##,
        left + pw / 2.0,
        h - 12.0,
        esc(x_label)
    );
    let _ = write!(
        out,
        r##"<text x="14" y="{}" text-anchor="middle" font-size="12" fill="#111" transform="rotate(-90 14 {})">{}</text>"##,
        top + ph / 2.0,
        top + ph / 2.0,
        esc(y_label)
    );
    // Lines, markers, legend.
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<polyline class="series" fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            pts.join(" ")
        );
        if pts.len() <= 40 {
            for p in &pts {
                if let Some((x, y)) = p.split_once(',') {
                    let _ = write!(out, r#"<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>"#);
                }
            }
        }
        let ly = top + 14.0 + i as f64 * 18.0;
        let lx = left + pw + 12.0;
        let _ = write!(
            out,
            r##"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{}" font-size="11" fill="#111">{}</text>"##,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
    out.push_str("</svg></figure>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_series_and_handles_empty() {
        let c = line_chart(
            "c",
            "T <&>",
            "x",
            "y",
            &[
                Series::new("a", vec![(0.0, 1.0), (1.0, 3.0)]),
                Series::dashed("b", vec![(0.5, 2.0)]),
            ],
        );
        assert!(c.contains("<svg") && c.contains("polyline") && c.contains("T &lt;&amp;&gt;"));
        assert_eq!(c.matches("class=\"series\"").count(), 2);
        let e = line_chart("e", "empty", "x", "y", &[]);
        assert!(e.contains("no data"));
    }
}
