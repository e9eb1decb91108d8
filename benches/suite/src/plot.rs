//! The RSS-over-time plot (PNG, `plotters`' bitmap backend). Text needs a TrueType font:
//! the first of [`FONTS`] that exists is registered; without one the plot is drawn without
//! text (the caption in `BENCHMARKS.md` says what is what).

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use crate::procfs::Sample;

/// TrueType fonts tried in order (Debian's `fonts-dejavu-core` and `fonts-liberation`).
pub const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

fn register_font() -> bool {
    for path in FONTS {
        if let Ok(bytes) = std::fs::read(path) {
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

/// One line of the plot: a label and its samples.
pub struct Series<'a> {
    /// Legend text.
    pub label: &'a str,
    /// RSS samples over time.
    pub samples: &'a [Sample],
    /// Line colour.
    pub color: RGBColor,
}

/// Draws RSS (MiB, log scale) over time (s) for each series into a 1000×560 PNG at `path`.
pub fn rss_over_time(path: &Path, title: &str, series: &[Series<'_>]) -> anyhow::Result<()> {
    let text = register_font();
    let t_max = series
        .iter()
        .flat_map(|s| s.samples.iter().map(|x| x.t))
        .fold(1.0f64, f64::max);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let y_max = series
        .iter()
        .flat_map(|s| s.samples.iter().map(|x| mib(x.rss)))
        .fold(10.0f64, f64::max)
        * 1.5;
    let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if text {
        builder
            .caption(title, ("sans-serif", 22))
            .x_label_area_size(45)
            .y_label_area_size(70);
    } else {
        builder.x_label_area_size(10).y_label_area_size(10);
    }
    let mut chart = builder.build_cartesian_2d(0.0..t_max * 1.02, (1.0..y_max).log_scale())?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("seconds since start")
            .y_desc("RSS (MiB, log scale)")
            .label_style(("sans-serif", 15));
    } else {
        mesh.disable_x_mesh().disable_y_mesh();
    }
    mesh.draw()?;
    for s in series {
        let color = s.color;
        let line = chart.draw_series(LineSeries::new(
            s.samples.iter().map(|x| (x.t, mib(x.rss).max(1.0))),
            color.stroke_width(2),
        ))?;
        if text {
            line.label(s.label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
        }
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
