//! `--plot FILE.svg`: every row's latency distribution in one picture, one panel per case
//! (scenario, size, connections), a line per transport. The x axis is the percentile on the
//! scale HdrHistogram uses (0%, 90%, 99%, 99.9%: equal steps of tail), the y axis the latency
//! on a log scale, so medians and tails read off one picture.

use std::fmt::Write as _;

/// Quantiles kept per row: latency (us) at `i / (QUANTILES - 1)` of the tail scale.
pub(crate) const QUANTILES: usize = 121;

/// How far the x axis reaches into the tail: 10^-3, the 99.9th percentile.
const TAIL_DECADES: f64 = 3.0;

/// The step nearest the median: `-log10(0.5)` of [`TAIL_DECADES`] over the steps (12 of 120).
const P50_STEP: usize = 12;

/// The quantile at step `i` of [`QUANTILES`]: evenly spaced in `-log10(1 - q)` from 0 to 99.9%.
pub(crate) fn quantile_at(i: usize) -> f64 {
    let x = TAIL_DECADES * i as f64 / (QUANTILES - 1) as f64;
    1.0 - 10f64.powf(-x)
}

/// The latencies (ns, sorted) at every step of the tail scale, in microseconds.
pub(crate) fn quantiles(sorted_ns: &[u64]) -> Vec<f64> {
    if sorted_ns.is_empty() {
        return Vec::new();
    }
    (0..QUANTILES)
        .map(|i| {
            let idx = ((sorted_ns.len() - 1) as f64 * quantile_at(i)).round() as usize;
            sorted_ns[idx.min(sorted_ns.len() - 1)] as f64 / 1000.0
        })
        .collect()
}

/// One line: a transport's latencies at the [`quantile_at`] steps.
pub(crate) struct Series {
    pub(crate) label: String,
    pub(crate) quantiles: Vec<f64>,
}

/// One panel: a case and its lines.
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) series: Vec<Series>,
}

const PANEL_W: f64 = 460.0;
const PANEL_H: f64 = 300.0;
const MARGIN_L: f64 = 62.0;
const MARGIN_R: f64 = 16.0;
const MARGIN_T: f64 = 30.0;
const MARGIN_B: f64 = 42.0;
const COLUMNS: usize = 2;

fn color(label: &str) -> &'static str {
    match label.split('/').next().unwrap_or(label) {
        "smc" => "#d62728",
        "tcp" => "#1f77b4",
        "unix" => "#2ca02c",
        _ => "#9467bd",
    }
}

fn dash(label: &str) -> &'static str {
    // The file scenario's variants of one transport differ by dash.
    match label.split('/').nth(1) {
        None | Some("cork-sendfile") => "",
        Some("write") => "6 3",
        Some("sendfile") => "2 2",
        Some(_) => "8 2 2 2",
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The picture, as an SVG document.
pub(crate) fn svg(panels: &[Panel]) -> String {
    let rows = panels.len().div_ceil(COLUMNS).max(1);
    let (w, h) = (PANEL_W * COLUMNS as f64, PANEL_H * rows as f64 + 24.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="8" y="16" font-size="13">smcperf: latency by percentile (log scale), lower is better</text>"#
    );
    for (n, p) in panels.iter().enumerate() {
        let (ox, oy) = (PANEL_W * (n % COLUMNS) as f64, 24.0 + PANEL_H * (n / COLUMNS) as f64);
        panel(&mut out, p, ox, oy);
    }
    out.push_str("</svg>\n");
    out
}

fn panel(out: &mut String, p: &Panel, ox: f64, oy: f64) {
    let (x0, x1) = (ox + MARGIN_L, ox + PANEL_W - MARGIN_R);
    let (y0, y1) = (oy + PANEL_H - MARGIN_B, oy + MARGIN_T);
    let values = p.series.iter().flat_map(|s| s.quantiles.iter().copied()).filter(|v| *v > 0.0);
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let _ = writeln!(out, r#"<text x="{}" y="{}" font-size="12">{}</text>"#, x0, oy + 18.0, escape(&p.title));
    let _ = writeln!(
        out,
        r##"<rect x="{x0}" y="{y1}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
        x1 - x0,
        y0 - y1
    );
    if lo > hi {
        let _ = writeln!(out, r#"<text x="{}" y="{}">no latencies</text>"#, x0 + 10.0, (y0 + y1) / 2.0);
        return;
    }
    // Whole decades around the data.
    let (dlo, dhi) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let y_of = |us: f64| y0 - (us.max(lo).log10() - dlo) / (dhi - dlo) * (y0 - y1);
    let x_of = |step: f64| x0 + step / (QUANTILES - 1) as f64 * (x1 - x0);
    let mut d = dlo;
    while d <= dhi + 1e-9 {
        let y = y0 - (d - dlo) / (dhi - dlo) * (y0 - y1);
        let label = match 10f64.powf(d) {
            v if v >= 1e6 => format!("{} s", v / 1e6),
            v if v >= 1e3 => format!("{} ms", v / 1e3),
            v => format!("{v} us"),
        };
        let _ = writeln!(out, r##"<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#ddd"/>"##);
        let _ = writeln!(out, r#"<text x="{}" y="{}" text-anchor="end">{label}</text>"#, x0 - 4.0, y + 4.0);
        d += 1.0;
    }
    for (k, label) in ["0%", "90%", "99%", "99.9%"].iter().enumerate() {
        let x = x0 + k as f64 / TAIL_DECADES * (x1 - x0);
        let _ = writeln!(out, r##"<line x1="{x}" y1="{y0}" x2="{x}" y2="{y1}" stroke="#ddd"/>"##);
        let _ = writeln!(out, r#"<text x="{x}" y="{}" text-anchor="middle">{label}</text>"#, y0 + 14.0);
    }
    let _ = writeln!(out, r#"<text x="{}" y="{}" text-anchor="middle">percentile</text>"#, (x0 + x1) / 2.0, y0 + 30.0);
    for (k, s) in p.series.iter().enumerate() {
        if s.quantiles.is_empty() {
            continue;
        }
        let points: Vec<String> =
            s.quantiles.iter().enumerate().map(|(i, v)| format!("{:.1},{:.1}", x_of(i as f64), y_of(*v))).collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.8" stroke-dasharray="{}" points="{}"/>"#,
            color(&s.label),
            dash(&s.label),
            points.join(" ")
        );
        let ly = y1 + 14.0 + 14.0 * k as f64;
        let p50 = s.quantiles[P50_STEP.min(s.quantiles.len() - 1)];
        let _ = writeln!(
            out,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="2" stroke-dasharray="{}"/><text x="{}" y="{}">{} (p50 {:.1} us)</text>"#,
            x0 + 8.0,
            ly - 4.0,
            x0 + 26.0,
            ly - 4.0,
            color(&s.label),
            dash(&s.label),
            x0 + 30.0,
            ly,
            escape(&s.label),
            p50
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_scale_reaches_the_99_9th_percentile() {
        assert_eq!(quantile_at(0), 0.0);
        assert!((quantile_at((QUANTILES - 1) / 3) - 0.9).abs() < 1e-9);
        assert!((quantile_at(QUANTILES - 1) - 0.999).abs() < 1e-9);
        assert!((quantile_at(P50_STEP) - 0.5).abs() < 0.01);
    }

    #[test]
    fn a_picture_has_a_line_per_series_and_a_panel_per_case() {
        let lat: Vec<u64> = (1..=10_000).map(|i| i * 1000).collect();
        let q = quantiles(&lat);
        assert_eq!(q.len(), QUANTILES);
        assert!((q[0] - 1.0).abs() < 1e-9, "the minimum first");
        assert!((q[QUANTILES - 1] - 9990.0).abs() < 1.0, "the 99.9th percentile last: {}", q[QUANTILES - 1]);
        let panels = vec![
            Panel {
                title: "rr 14 B".into(),
                series: vec![
                    Series { label: "smc".into(), quantiles: q.clone() },
                    Series { label: "tcp".into(), quantiles: q },
                ],
            },
            Panel { title: "stream <64 KiB>".into(), series: vec![] },
        ];
        let s = svg(&panels);
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("stream &lt;64 KiB&gt;") && s.contains("no latencies"));
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    }
}
