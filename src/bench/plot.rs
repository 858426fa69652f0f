//! `--plot FILE.svg`: throughput (top) and latency percentiles (bottom,
//! log scale) over time, per job, in one picture, so a stall is seen rather
//! than read for. Drawn with plotters' SVG backend.

use super::report::RunResult;
use plotters::prelude::*;
use std::path::Path;

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

/// One plotted interval: end (s), ops/s, lat p50, p99 and max (µs).
type Point = (f64, f64, f64, f64, f64);

/// Draws `run`'s per-interval samples to `path`.
pub fn draw(run: &RunResult, path: &Path) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    let series: Vec<(String, Vec<Point>)> = run
        .jobs
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
            (format!("{} (group {})", j.options.name, j.groupid), points)
        })
        .collect();
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let iops_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.1;
    let (lat_lo, lat_hi) = series
        .iter()
        .flat_map(|(_, p)| p.iter().filter(|p| p.1 > 0.0).flat_map(|p| [p.2, p.3, p.4]))
        .fold((f64::MAX, 1.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let lat_lo = if lat_lo == f64::MAX {
        1.0
    } else {
        (lat_lo / 2.0).max(0.5)
    };
    let root = SVGBackend::new(path, (1000, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(340);
    let mut chart = ChartBuilder::on(&top)
        .caption("quire-bench: throughput", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..iops_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(235, 235, 235))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_desc("time since the run started (s)")
        .y_desc("ops/s")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (name, points)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.0, p.1)),
                c.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            "latency from intended start (p50 solid, p99 dashed, max dotted)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, (lat_lo..lat_hi * 1.5).log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_desc("time since the run started (s)")
        .y_desc("latency (us)")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (name, points)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let live: Vec<_> = points.iter().filter(|p| p.1 > 0.0).collect();
        chart
            .draw_series(LineSeries::new(
                live.iter().map(|p| (p.0, p.2)),
                c.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!("{name} p50/p99/max"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(
                live.iter().map(|p| (p.0, p.3)),
                6,
                4,
                c.stroke_width(2),
            ))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(DashedLineSeries::new(
                live.iter().map(|p| (p.0, p.4)),
                2,
                3,
                c.stroke_width(1),
            ))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
