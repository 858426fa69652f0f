//! `--plot FILE.svg`: throughput (top) and latency percentiles (bottom,
//! log scale) over time, per job, in one picture, so a stall is seen rather
//! than read for. Drawn with plotters' SVG backend.
//!
//! The legend is a strip of its own under both charts, one row per job:
//! inside a chart it would hide whatever curve passed under it, and a
//! curve can pass anywhere.

use super::error::{BenchError, PlotError};
use super::report::RunResult;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

/// Width of the picture, px.
const WIDTH_PX: u32 = 1000;
/// Height of the throughput chart, px.
const THROUGHPUT_HEIGHT_PX: u32 = 340;
/// Height of the latency chart, px.
const LATENCY_HEIGHT_PX: u32 = 380;
/// Height of one legend row, px.
const LEGEND_ROW_PX: u32 = 22;
/// Space above and below the legend's rows, px.
const LEGEND_PAD_PX: u32 = 10;
/// Legend text size, px.
const LEGEND_FONT_PX: u32 = 15;

/// One plotted interval: end (s), ops/s, lat p50, p99 and max (µs).
type Point = (f64, f64, f64, f64, f64);

/// One job's curves: its legend label and its points, in time order.
struct Series {
    label: String,
    points: Vec<Point>,
}

/// Draws `run`'s per-interval samples to `path`.
pub fn draw(run: &RunResult, path: &Path) -> Result<(), BenchError> {
    let svg = render(&series_of(run)).map_err(|source| BenchError::Plot {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, svg).map_err(BenchError::io(format!("writing {}", path.display())))
}

/// Each job's points: one per full interval, on the run's time axis.
fn series_of(run: &RunResult) -> Vec<Series> {
    run.jobs
        .iter()
        .map(|j| {
            let full_ms = j.options.interval().as_millis() as u64;
            let mut start_ms = 0u64;
            let mut points = Vec::new();
            for s in &j.stats.intervals {
                let span_ms = s.end_ms - start_ms;
                start_ms = s.end_ms;
                // A short last interval (the run's tail) would draw as a
                // spike or a cliff that is not there.
                if span_ms < full_ms / 2 {
                    continue;
                }
                let us = |ns: u64| (ns as f64 / 1e3).max(1.0);
                points.push((
                    (j.group_start_ms + s.end_ms) as f64 / 1e3,
                    s.ops as f64 / (span_ms as f64 / 1e3),
                    us(s.lat_p50_ns),
                    us(s.lat_p99_ns),
                    us(s.lat_max_ns),
                ));
            }
            Series {
                label: format!("{} (group {})", j.options.name, j.groupid),
                points,
            }
        })
        .collect()
}

/// The SVG document of `series`: the two charts, then the legend strip.
fn render(series: &[Series]) -> Result<String, PlotError> {
    let legend_px = 2 * LEGEND_PAD_PX + LEGEND_ROW_PX * series.len().max(1) as u32;
    let height_px = THROUGHPUT_HEIGHT_PX + LATENCY_HEIGHT_PX + legend_px;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, height_px)).into_drawing_area();
        root.fill(&WHITE)?;
        let (charts, legend) = root.split_vertically(THROUGHPUT_HEIGHT_PX + LATENCY_HEIGHT_PX);
        draw_charts(&charts, series)?;
        draw_legend(&legend, series)?;
        root.present()?;
    }
    Ok(svg)
}

/// One row per job on `area`: its colour's line and its label (the line
/// styles of the latency chart are in its caption).
fn draw_legend(area: &DrawingArea<SVGBackend, Shift>, series: &[Series]) -> Result<(), PlotError> {
    let style = TextStyle::from(("sans-serif", LEGEND_FONT_PX).into_font())
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, s) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let top = (LEGEND_PAD_PX + LEGEND_ROW_PX * i as u32) as i32;
        let mid = top + LEGEND_ROW_PX as i32 / 2;
        area.draw(&PathElement::new(
            vec![(70, mid), (100, mid)],
            c.stroke_width(3),
        ))?;
        area.draw(&Text::new(s.label.clone(), (110, mid), style.clone()))?;
    }
    Ok(())
}

/// Both charts on `root`, throughput above latency.
fn draw_charts(root: &DrawingArea<SVGBackend, Shift>, series: &[Series]) -> Result<(), PlotError> {
    let x_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let iops_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.1;
    let (lat_lo, lat_hi) = series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .filter(|p| p.1 > 0.0)
                .flat_map(|p| [p.2, p.3, p.4])
        })
        .fold((f64::MAX, 1.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lat_lo = if lat_lo == f64::MAX {
        1.0
    } else {
        (lat_lo / 2.0).max(0.5)
    };
    let (top, bottom) = root.split_vertically(THROUGHPUT_HEIGHT_PX);
    let mut chart = ChartBuilder::on(&top)
        .caption("quire-bench: throughput", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..iops_max)?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(235, 235, 235))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_desc("time since the run started (s)")
        .y_desc("ops/s")
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        chart.draw_series(LineSeries::new(
            s.points.iter().map(|p| (p.0, p.1)),
            c.stroke_width(2),
        ))?;
    }
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            "latency from intended start (p50 solid, p99 dashed, max dotted)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, (lat_lo..lat_hi * 1.5).log_scale())?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_desc("time since the run started (s)")
        .y_desc("latency (us)")
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let live: Vec<_> = s.points.iter().filter(|p| p.1 > 0.0).collect();
        chart.draw_series(LineSeries::new(
            live.iter().map(|p| (p.0, p.2)),
            c.stroke_width(2),
        ))?;
        chart.draw_series(DashedLineSeries::new(
            live.iter().map(|p| (p.0, p.3)),
            6,
            4,
            c.stroke_width(2),
        ))?;
        chart.draw_series(DashedLineSeries::new(
            live.iter().map(|p| (p.0, p.4)),
            2,
            3,
            c.stroke_width(1),
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An axis-aligned box in the SVG's pixels: x0 <= x1, y0 <= y1.
    #[derive(Clone, Copy, Debug)]
    struct Rect {
        x0: f64,
        y0: f64,
        x1: f64,
        y1: f64,
    }

    impl Rect {
        fn contains(&self, (x, y): (f64, f64)) -> bool {
            (self.x0..=self.x1).contains(&x) && (self.y0..=self.y1).contains(&y)
        }
    }

    /// Jobs whose curves zigzag from the bottom to the top of both charts
    /// at every interval, over the whole time axis: a legend anywhere in
    /// a chart's plotting area lies on some curve.
    fn sweeping(jobs: usize) -> Vec<Series> {
        (0..jobs)
            .map(|j| Series {
                label: format!("job-{j} (group {j})"),
                points: (1..=200)
                    .map(|k| {
                        let high = (k + j) % 2 == 0;
                        let t = k as f64 / 10.0;
                        if high {
                            (t, 50_000.0, 40_000.0, 90_000.0, 100_000.0)
                        } else {
                            (t, 1.0, 10.0, 20.0, 30.0)
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    /// The value of attribute `name` in the tag text `tag`.
    fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        tag[at..].split('"').next()
    }

    /// Every `<text>` element: its tag and its content.
    fn texts(svg: &str) -> Vec<(&str, &str)> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let (tag, rest) = t.split_once('>')?;
                Some((tag, rest.split("</text>").next()?.trim()))
            })
            .collect()
    }

    /// Where the text of `tag` with `content` is drawn, generously: the
    /// glyphs' box (0.6 em a character, one em tall, from its anchor)
    /// widened by a quarter em, plus 40 px on the left for the legend's
    /// sample line.
    fn text_box(tag: &str, content: &str) -> Rect {
        let num = |n| attr(tag, n).and_then(|v| v.parse::<f64>().ok()).unwrap();
        let (x, y, em) = (num("x"), num("y"), num("font-size"));
        let width = content.chars().count() as f64 * 0.6 * em;
        let x0 = match attr(tag, "text-anchor") {
            Some("end") => x - width,
            Some("middle") => x - width / 2.0,
            _ => x,
        };
        let top = match attr(tag, "dy") {
            Some("0.76em") => y,
            Some("0.5ex") => y - em / 2.0,
            _ => y - em,
        };
        let pad = em / 4.0;
        Rect {
            x0: x0 - 40.0 - pad,
            y0: top - pad,
            x1: x0 + width + pad,
            y1: top + em + pad,
        }
    }

    /// The points of every polyline of three or more points: the curves
    /// (a legend's sample line has two).
    fn curves(svg: &str) -> Vec<Vec<(f64, f64)>> {
        svg.split("<polyline")
            .skip(1)
            .filter_map(|t| attr(t, "points"))
            .map(|p| {
                p.split_whitespace()
                    .filter_map(|xy| {
                        let (x, y) = xy.split_once(',')?;
                        Some((x.parse().ok()?, y.parse().ok()?))
                    })
                    .collect::<Vec<_>>()
            })
            .filter(|p| p.len() >= 3)
            .collect()
    }

    /// True if the segment from `a` to `b` passes through `r` (checked
    /// every half pixel along it).
    fn crosses(a: (f64, f64), b: (f64, f64), r: Rect) -> bool {
        let steps = ((b.0 - a.0).abs().max((b.1 - a.1).abs()) * 2.0)
            .ceil()
            .max(1.0) as usize;
        (0..=steps).any(|i| {
            let f = i as f64 / steps as f64;
            r.contains((a.0 + (b.0 - a.0) * f, a.1 + (b.1 - a.1) * f))
        })
    }

    #[test]
    fn no_curve_passes_under_a_legend_entry() {
        for jobs in [1, 2, 6] {
            let series = sweeping(jobs);
            let svg = render(&series).unwrap();
            let curves = curves(&svg);
            assert!(
                curves.len() >= 2 * jobs,
                "{jobs} jobs: {} curves",
                curves.len()
            );
            for s in &series {
                let entries: Vec<Rect> = texts(&svg)
                    .into_iter()
                    .filter(|(_, content)| content.contains(&s.label))
                    .map(|(tag, content)| text_box(tag, content))
                    .collect();
                assert!(!entries.is_empty(), "no legend entry for {}", s.label);
                for entry in entries {
                    for curve in &curves {
                        let hit = curve.windows(2).find(|w| crosses(w[0], w[1], entry));
                        assert!(
                            hit.is_none(),
                            "{jobs} jobs: a curve passes under {}'s legend entry {entry:?}: {hit:?}",
                            s.label
                        );
                    }
                }
            }
        }
    }
}
