//! Small self-contained SVG charts for the logbook: line charts (curves of several runs) and bar charts
//! (throughput by strategy or swept value). Plain SVG 1.1, no scripts or external fonts, so any browser,
//! GitHub's markdown view or an image viewer shows them.

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// One named curve.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A legend label cut to the legend's width (the canvas's right margin), with `…` where it was cut;
/// `prefix` characters (such as `1: `) come before it.
fn fit_legend(label: &str, prefix: usize) -> String {
    let room = ((RIGHT - 32.0) / 6.2) as usize - prefix;
    match label.chars().count() > room {
        true => {
            label
                .chars()
                .take(room.saturating_sub(1))
                .collect::<String>()
                + "…"
        }
        false => label.to_string(),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `count` ticks over `span`.
fn tick_step(span: f64, count: f64) -> f64 {
    let raw = (span / count).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    let r = raw / magnitude;
    magnitude
        * if r <= 1.0 {
            1.0
        } else if r <= 2.0 {
            2.0
        } else if r <= 5.0 {
            5.0
        } else {
            10.0
        }
}

fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let step = tick_step(hi - lo, 5.0);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() < 20 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e6).contains(&a) {
        return format!("{v:.1e}");
    }
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The (x, y) ranges the points span.
fn extent(points: &[(f64, f64)]) -> ((f64, f64), (f64, f64)) {
    let range = |f: fn(&(f64, f64)) -> f64| {
        points
            .iter()
            .map(f)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    (range(|p| p.0), range(|p| p.1))
}

/// Range padded so a flat series still has height.
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if (hi - lo).abs() < 1e-12 {
        let d = if lo.abs() > 0.0 { lo.abs() * 0.1 } else { 1.0 };
        (lo - d, hi + d)
    } else {
        (lo, hi)
    }
}

fn frame(title: &str, x_label: &str, y_label: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
         <text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
        (LEFT + WIDTH - RIGHT) / 2.0,
        escape(title),
        (LEFT + WIDTH - RIGHT) / 2.0,
        HEIGHT - 12.0,
        escape(x_label),
        (TOP + HEIGHT - BOTTOM) / 2.0,
        escape(y_label)
    )
}

/// Axes with ticks; returns the SVG and the data→pixel maps.
fn axes(
    (x0, x1): (f64, f64),
    (y0, y1): (f64, f64),
    x_ticks: bool,
) -> (String, impl Fn(f64) -> f64, impl Fn(f64) -> f64) {
    let (pw, ph) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let sx = move |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
    let sy = move |y: f64| TOP + ph - (y - y0) / (y1 - y0) * ph;
    let mut s = format!(
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#333\"/>\n"
    );
    for t in ticks(y0, y1) {
        let y = sy(t);
        s += &format!(
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(t)
        );
    }
    if x_ticks {
        for t in ticks(x0, x1) {
            let x = sx(t);
            s += &format!(
                "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{TOP}\" y2=\"{}\" stroke=\"#eee\"/>\
                 <text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                TOP + ph,
                TOP + ph + 16.0,
                fmt_tick(t)
            );
        }
    }
    (s, sx, sy)
}

/// Several curves on shared axes, with a legend on the right.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let mut svg = frame(title, x_label, y_label);
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    if all.is_empty() {
        svg += &format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no data</text>\n</svg>\n",
            (LEFT + WIDTH - RIGHT) / 2.0,
            HEIGHT / 2.0
        );
        return svg;
    }
    let (xr, yr) = extent(&all);
    let (ax, sx, sy) = axes(padded(xr.0, xr.1), padded(yr.0, yr.1), true);
    svg += &ax;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if pts.len() == 1 {
            let (x, y) = pts[0].split_once(',').unwrap_or(("0", "0"));
            svg += &format!("<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{color}\"/>\n");
        } else if !pts.is_empty() {
            svg += &format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.8\" points=\"{}\"/>\n",
                pts.join(" ")
            );
        }
        let ly = TOP + 14.0 + 18.0 * i as f64;
        svg += &format!(
            "<line x1=\"{}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"3\"/>\
             <text x=\"{}\" y=\"{}\">{}</text>\n",
            WIDTH - RIGHT + 12.0,
            WIDTH - RIGHT + 32.0,
            WIDTH - RIGHT + 38.0,
            ly + 4.0,
            escape(&fit_legend(&s.name, 1))
        );
    }
    svg + "</svg>\n"
}

/// One bar per label, value printed above each bar. Labels go under the bars when they fit, else the bars
/// are numbered and the labels listed in a legend.
pub fn bar_chart(title: &str, y_label: &str, bars: &[(String, f64)]) -> String {
    let mut svg = frame(title, "", y_label);
    let top = bars
        .iter()
        .map(|b| b.1)
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let (ax, _, sy) = axes(
        (0.0, 1.0),
        (0.0, if top > 0.0 { top * 1.1 } else { 1.0 }),
        false,
    );
    svg += &ax;
    let pw = WIDTH - LEFT - RIGHT;
    let slot = pw / bars.len().max(1) as f64;
    let fits = bars
        .iter()
        .all(|(label, _)| label.chars().count() as f64 * 6.5 < slot * 0.95);
    for (i, (label, value)) in bars.iter().enumerate() {
        let v = if value.is_finite() { *value } else { 0.0 };
        let x = LEFT + slot * i as f64 + slot * 0.15;
        let (y, base) = (sy(v), sy(0.0));
        let color = COLORS[i % COLORS.len()];
        let under = if fits {
            escape(label)
        } else {
            (i + 1).to_string()
        };
        svg += &format!(
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{under}</text>\n",
            slot * 0.7,
            base - y,
            x + slot * 0.35,
            y - 4.0,
            fmt_tick((v * 10.0).round() / 10.0),
            x + slot * 0.35,
            base + 16.0,
        );
        if !fits {
            let ly = TOP + 14.0 + 18.0 * i as f64;
            svg += &format!(
                "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{color}\"/>\
                 <text x=\"{}\" y=\"{}\" font-size=\"11\">{}: {}</text>\n",
                WIDTH - RIGHT + 12.0,
                ly - 6.0,
                WIDTH - RIGHT + 28.0,
                ly + 4.0,
                i + 1,
                escape(&fit_legend(label, 5))
            );
        }
    }
    svg + "</svg>\n"
}

/// A confusion matrix as a picture: rows the target class, columns the predicted one, each cell shaded by
/// its share of its row (so every class reads alike whatever its size) and labelled with its count when
/// the cells are large enough to hold it.
pub fn heatmap(title: &str, counts: &[Vec<f64>]) -> String {
    let n = counts.len().max(1);
    let (left, top) = (70.0, 50.0);
    let side = (HEIGHT + 200.0 - top - 40.0).min(WIDTH - left - 40.0);
    let cell = side / n as f64;
    let (w, h) = (left + side + 40.0, top + side + 45.0);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{:.1}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">predicted class</text>\n\
         <text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1})\">target class</text>\n",
        w / 2.0,
        escape(title),
        left + side / 2.0,
        top + side + 38.0,
        top + side / 2.0,
        top + side / 2.0,
    );
    for (r, row) in counts.iter().enumerate() {
        let total: f64 = row.iter().sum();
        for (c, v) in row.iter().enumerate() {
            let share = if total > 0.0 { v / total } else { 0.0 };
            // White to dark blue.
            let shade = |full: f64| 255.0 - (255.0 - full) * share;
            let (x, y) = (left + c as f64 * cell, top + r as f64 * cell);
            svg += &format!(
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{cell:.1}\" height=\"{cell:.1}\" \
                 fill=\"rgb({:.0},{:.0},{:.0})\" stroke=\"#ddd\"/>\n",
                shade(8.0),
                shade(48.0),
                shade(107.0)
            );
            if cell >= 22.0 {
                let ink = if share > 0.5 { "white" } else { "black" };
                svg += &format!(
                    "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\" fill=\"{ink}\">{}</text>\n",
                    x + cell / 2.0,
                    y + cell / 2.0 + 4.0,
                    fmt_tick(*v)
                );
            }
        }
    }
    if cell >= 14.0 {
        for i in 0..n {
            let mid = left + (i as f64 + 0.5) * cell;
            svg += &format!(
                "<text x=\"{mid:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{i}</text>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"10\">{i}</text>\n",
                top + side + 14.0,
                left - 6.0,
                top + (i as f64 + 0.5) * cell + 4.0
            );
        }
    }
    svg + "</svg>\n"
}

/// A search's trials: one dot per trial's value (hollow for a pruned trial's last report) and the best so
/// far as a step line.
pub fn trials_chart(
    title: &str,
    y_label: &str,
    values: &[(f64, f64, bool)],
    best: &[(f64, f64)],
) -> String {
    let mut svg = frame(title, "trial", y_label);
    let finite = |x: f64, y: f64| x.is_finite() && y.is_finite();
    let all: Vec<(f64, f64)> = values
        .iter()
        .map(|&(x, y, _)| (x, y))
        .chain(best.iter().copied())
        .filter(|&(x, y)| finite(x, y))
        .collect();
    if all.is_empty() {
        return line_chart(title, "trial", y_label, &[]);
    }
    let (xr, yr) = extent(&all);
    let (ax, sx, sy) = axes(padded(xr.0, xr.1), padded(yr.0, yr.1), true);
    svg += &ax;
    let best: Vec<(f64, f64)> = best
        .iter()
        .copied()
        .filter(|&(x, y)| finite(x, y))
        .collect();
    let mut steps = Vec::new();
    for (i, &(x, y)) in best.iter().enumerate() {
        if i > 0 {
            steps.push(format!("{:.1},{:.1}", sx(x), sy(best[i - 1].1)));
        }
        steps.push(format!("{:.1},{:.1}", sx(x), sy(y)));
    }
    svg += &format!(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" points=\"{}\"/>\n",
        COLORS[1],
        steps.join(" ")
    );
    for &(x, y, pruned) in values.iter().filter(|&&(x, y, _)| finite(x, y)) {
        let fill = if pruned { "white" } else { COLORS[0] };
        svg += &format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{fill}\" stroke=\"{}\"/>\n",
            sx(x),
            sy(y),
            COLORS[0]
        );
    }
    for (i, (name, color)) in [
        ("trial value", COLORS[0]),
        ("pruned (last report)", "white"),
        ("best so far", COLORS[1]),
    ]
    .iter()
    .enumerate()
    {
        let ly = TOP + 14.0 + 18.0 * i as f64;
        let mark = match i {
            2 => format!(
                "<line x1=\"{}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"3\"/>",
                WIDTH - RIGHT + 12.0,
                WIDTH - RIGHT + 32.0
            ),
            _ => format!(
                "<circle cx=\"{}\" cy=\"{ly}\" r=\"4\" fill=\"{color}\" stroke=\"{}\"/>",
                WIDTH - RIGHT + 22.0,
                COLORS[0]
            ),
        };
        svg += &format!(
            "{mark}<text x=\"{}\" y=\"{}\">{}</text>\n",
            WIDTH - RIGHT + 38.0,
            ly + 4.0,
            escape(&fit_legend(name, 1))
        );
    }
    svg + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case(0.0, 1.0, vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0])]
    #[case(0.0, 2.3, vec![0.0, 0.5, 1.0, 1.5, 2.0])]
    #[case(120.0, 980.0, vec![200.0, 400.0, 600.0, 800.0])]
    fn ticks_are_round_numbers(#[case] lo: f64, #[case] hi: f64, #[case] want: Vec<f64>) {
        let got = ticks(lo, hi);
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-9, "{got:?}");
        }
    }

    #[test]
    fn a_trials_chart_has_a_dot_per_trial_and_the_best_as_a_step_line() {
        let values = [(0.0, 0.5, false), (1.0, 0.7, false), (2.0, 0.2, true)];
        let best = [(0.0, 0.5), (1.0, 0.7), (2.0, 0.7)];
        let svg = trials_chart("t", "val/acc1", &values, &best);
        // Three trials and two dot legends; the pruned one is hollow.
        assert_eq!(svg.matches("<circle").count(), 5, "{svg}");
        assert_eq!(svg.matches("fill=\"white\" stroke").count(), 2, "{svg}");
        // Steps: each best point after the first is reached by a flat segment then a jump.
        let line = svg.split("<polyline").nth(1).unwrap();
        let points = line
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(points.split(' ').count(), 5, "{points}");
        assert!(trials_chart("t", "v", &[], &[]).contains("no data"));
    }

    #[test]
    fn text_is_escaped_and_empty_charts_say_so() {
        let svg = line_chart("a<b & c", "x", "y", &[]);
        assert!(svg.contains("a&lt;b &amp; c") && svg.contains("no data"));
        let svg = line_chart(
            "t",
            "x",
            "y",
            &[Series {
                name: "r".into(),
                points: vec![(0.0, 1.0), (1.0, 0.5)],
            }],
        );
        assert!(svg.contains("<polyline") && svg.ends_with("</svg>\n"));
    }
}
