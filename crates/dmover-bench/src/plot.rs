//! Plots of benchmark results, as SVG or PNG (chosen by the file name's extension).
//!
//! A [`Figure`] is one or more panels side by side under a title. A panel is a line
//! chart ([`Lines`]: e.g. throughput against file size, or against streams, one line
//! per setting, with min–max whiskers over the repeats), a bar chart ([`Bars`]: e.g.
//! throughput per tool), or a trajectory over time ([`Trajectory`]: a rate with a
//! step line of settings on a second axis and horizontal reference lines). Text is set in DejaVu Sans, embedded in the binary, so plots look
//! the same on any machine.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::size_label;

/// Why a plot could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The extension is neither `.svg` nor `.png`.
    #[error("cannot plot to {}: the file name must end in .svg or .png", .0.display())]
    Format(PathBuf),
    /// Nothing to plot.
    #[error("nothing to plot in {}: no successful measurements", .0.display())]
    Empty(PathBuf),
    /// Drawing or writing failed.
    #[error("drawing {}: {message}", .path.display())]
    Draw {
        /// The output file.
        path: PathBuf,
        /// What the plotting library said.
        message: String,
    },
}

/// One point of a line, with an optional range (min–max over repeats).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Position on the x axis.
    pub x: f64,
    /// Value (usually the median).
    pub y: f64,
    /// Low end of the whisker.
    pub lo: Option<f64>,
    /// High end of the whisker.
    pub hi: Option<f64>,
}

/// A named line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points, in any order (drawn sorted by x).
    pub points: Vec<Point>,
}

/// How the x axis of a line chart is scaled and labelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// Logarithmic (base 2), ticks at powers of two labelled as byte sizes (4K, 1M, ...).
    Log2Bytes,
    /// Logarithmic (base 2), ticks at powers of two labelled as integers (1, 2, 4, 8).
    Log2Count,
    /// Linear.
    Linear,
}

/// A line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Lines {
    /// Panel caption.
    pub title: String,
    /// X axis description.
    pub x_label: String,
    /// Y axis description.
    pub y_label: String,
    /// X axis scale.
    pub x_axis: XAxis,
    /// The lines.
    pub series: Vec<Series>,
}

/// One bar, with an optional range (min–max over repeats).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bar {
    /// Height (usually the median).
    pub value: f64,
    /// Low end of the whisker.
    pub lo: Option<f64>,
    /// High end of the whisker.
    pub hi: Option<f64>,
}

/// A bar chart: one group of bars per category, one bar per series in each group.
#[derive(Debug, Clone, PartialEq)]
pub struct Bars {
    /// Panel caption.
    pub title: String,
    /// Y axis description.
    pub y_label: String,
    /// Category names along the x axis.
    pub categories: Vec<String>,
    /// `(series name, one bar or none per category)`. With a single series each
    /// category gets its own colour and no legend is drawn.
    pub series: Vec<(String, Vec<Option<Bar>>)>,
}

/// A trajectory over time: rates (left axis) with a step line of a setting per rate
/// (right axis, e.g. the streams in use), and horizontal reference lines on the left
/// axis (e.g. the rates of fixed settings).
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory {
    /// Panel caption.
    pub title: String,
    /// X axis description (linear, from 0).
    pub x_label: String,
    /// Left axis description (the rates and references).
    pub y_label: String,
    /// Right axis description (the steps).
    pub y2_label: String,
    /// Rates over time, one line each.
    pub rates: Vec<Series>,
    /// Step lines on the right axis: each value holds from its point to the next. The
    /// i-th is drawn in the colour of the i-th rate.
    pub steps: Vec<Series>,
    /// Single measurements on the left axis (e.g. a tuner's own), drawn as marks; the
    /// i-th in the colour of the i-th rate.
    pub marks: Vec<Series>,
    // Rates, steps and marks with an empty name have no legend entry.
    /// `(legend text, value)`: dashed horizontal lines across the panel.
    pub references: Vec<(String, f64)>,
}

/// One panel of a figure.
#[derive(Debug, Clone, PartialEq)]
pub enum Panel {
    /// A line chart.
    Lines(Lines),
    /// A bar chart.
    Bars(Bars),
    /// Rates and settings over time.
    Trajectory(Trajectory),
}

/// Panels side by side under a title.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Title above all panels.
    pub title: String,
    /// Panels, left to right.
    pub panels: Vec<Panel>,
}

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

const FONT: &str = "sans-serif";

fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded fonts are valid TrueType files; failure would be a build defect.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

impl Figure {
    /// Draws the figure into `path` (`.svg` or `.png`), all panels side by side.
    pub fn save(&self, path: &Path) -> Result<(), PlotError> {
        self.save_in_columns(path, self.panels.len())
    }

    /// Draws the figure into `path` (`.svg` or `.png`), `columns` panels to a row (at
    /// least 1), rows filled left to right.
    pub fn save_in_columns(&self, path: &Path, columns: usize) -> Result<(), PlotError> {
        let has_data = self.panels.iter().any(|p| match p {
            Panel::Lines(l) => l.series.iter().any(|s| !s.points.is_empty()),
            Panel::Bars(b) => b.series.iter().any(|(_, v)| v.iter().any(Option::is_some)),
            Panel::Trajectory(t) => t.rates.iter().any(|s| !s.points.is_empty()),
        });
        if !has_data {
            return Err(PlotError::Empty(path.to_path_buf()));
        }
        register_fonts();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| PlotError::Draw {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        }
        let columns = columns.clamp(1, self.panels.len().max(1));
        let rows = self.panels.len().div_ceil(columns).max(1);
        // Time runs along a trajectory's x axis: those panels are wider.
        let width = if self
            .panels
            .iter()
            .any(|p| matches!(p, Panel::Trajectory(_)))
        {
            900
        } else {
            620
        };
        let size = (width * columns as u32, 460 * rows as u32);
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let result = match ext.as_deref() {
            Some("svg") => self.draw(SVGBackend::new(path, size).into_drawing_area(), columns),
            Some("png") => self.draw(BitMapBackend::new(path, size).into_drawing_area(), columns),
            _ => return Err(PlotError::Format(path.to_path_buf())),
        };
        result.map_err(|message| PlotError::Draw {
            path: path.to_path_buf(),
            message,
        })
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, Shift>,
        columns: usize,
    ) -> Result<(), String> {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
        root.fill(&WHITE).map_err(e)?;
        let body = root.titled(&self.title, (FONT, 22)).map_err(e)?;
        let rows = self.panels.len().div_ceil(columns).max(1);
        let areas = body.split_evenly((rows, columns));
        for (area, panel) in areas.iter().zip(&self.panels) {
            match panel {
                Panel::Lines(l) => draw_lines(area, l).map_err(e)?,
                Panel::Bars(b) => draw_bars(area, b).map_err(e)?,
                Panel::Trajectory(t) => draw_trajectory(area, t).map_err(e)?,
            }
        }
        root.present().map_err(e)
    }
}

/// Range of the y axis: from 0 to a little above the largest value or whisker.
fn y_top(values: impl Iterator<Item = f64>) -> f64 {
    let m = values.filter(|v| v.is_finite()).fold(0.0f64, f64::max);
    if m > 0.0 { m * 1.12 } else { 1.0 }
}

/// The corner of a line panel with the fewest points under where its legend would go
/// (upper left unless data sits there).
fn legend_corner(
    l: &Lines,
    tx: &dyn Fn(f64) -> f64,
    (lo, hi): (f64, f64),
    ymax: f64,
) -> SeriesLabelPosition {
    let pts: Vec<(f64, f64)> = l
        .series
        .iter()
        .flat_map(|s| s.points.iter())
        .map(|p| ((tx(p.x) - lo) / (hi - lo), p.y / ymax))
        .collect();
    let corners = [
        (SeriesLabelPosition::UpperLeft, false, true),
        (SeriesLabelPosition::UpperRight, true, true),
        (SeriesLabelPosition::LowerRight, true, false),
        (SeriesLabelPosition::LowerLeft, false, false),
    ];
    let crowd = |right: bool, upper: bool| {
        pts.iter()
            .filter(|&&(x, y)| {
                (if right { x > 0.6 } else { x < 0.4 }) && (if upper { y > 0.6 } else { y < 0.4 })
            })
            .count()
    };
    corners
        .into_iter()
        .min_by_key(|&(_, right, upper)| crowd(right, upper))
        .map_or(SeriesLabelPosition::UpperLeft, |(c, _, _)| c)
}

fn draw_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    l: &Lines,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let log = l.x_axis != XAxis::Linear;
    let tx = |x: f64| if log { x.max(1e-9).log2() } else { x };
    let xs: Vec<f64> = l
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| tx(p.x)))
        .collect();
    let (mut x0, mut x1) = xs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    let pad = ((x1 - x0) * 0.05).max(if log { 0.3 } else { 0.5 });
    let (lo, hi) = (x0 - pad, x1 + pad);
    let ymax = y_top(
        l.series
            .iter()
            .flat_map(|s| s.points.iter().flat_map(|p| [p.y, p.hi.unwrap_or(p.y)])),
    );
    let caption = (FONT, 16).into_font();
    // On log axes the chart's x is log2 of the value: ticks at whole numbers are powers
    // of two, and only those get labels (every other one when there are many).
    let every = if log && x1 - x0 > 10.0 { 2.0 } else { 1.0 };
    let fmt_x = |x: &f64| {
        let i = x.round();
        if log && ((x - i).abs() > 1e-6 || i.rem_euclid(every) != 0.0) {
            return String::new();
        }
        match l.x_axis {
            XAxis::Log2Bytes => size_label(2f64.powf(i).round() as u64),
            XAxis::Log2Count => format!("{}", 2f64.powf(i).round()),
            XAxis::Linear => format_value(*x),
        }
    };
    let fmt_y = |y: &f64| format_value(*y);
    let mut chart = ChartBuilder::on(area)
        .caption(&l.title, caption)
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(lo..hi, 0.0..ymax)?;
    let ticks = if log {
        (hi - lo).ceil() as usize + 1
    } else {
        10
    };
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.12))
        .x_labels(ticks)
        .x_desc(&l.x_label)
        .y_desc(&l.y_label)
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&fmt_y)
        .draw()?;
    for (i, s) in l.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut pts: Vec<Point> = s.points.clone();
        pts.sort_by(|a, b| a.x.total_cmp(&b.x));
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (tx(p.x), p.y)),
                color.stroke_width(2),
            ))?
            .label(&s.name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart.draw_series(
            pts.iter()
                .map(|p| Circle::new((tx(p.x), p.y), 3, color.filled())),
        )?;
        chart.draw_series(pts.iter().filter_map(|p| {
            let (lo, hi) = (p.lo?, p.hi?);
            Some(PathElement::new(
                vec![(tx(p.x), lo), (tx(p.x), hi)],
                color.stroke_width(1),
            ))
        }))?;
    }
    if l.series.len() > 1 || l.series.first().is_some_and(|s| !s.name.is_empty()) {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font((FONT, 12))
            .position(legend_corner(l, &tx, (lo, hi), ymax))
            .draw()?;
    }
    Ok(())
}

/// The corners of a step line through `pts` (sorted by x): each value holds until the
/// next point's x.
fn step_points(pts: &[Point]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(pts.len() * 2);
    for (i, p) in pts.iter().enumerate() {
        if i > 0 {
            out.push((p.x, pts[i - 1].y));
        }
        out.push((p.x, p.y));
    }
    out
}

fn draw_trajectory<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    t: &Trajectory,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let sorted = |s: &Series| {
        let mut pts = s.points.clone();
        pts.sort_by(|a, b| a.x.total_cmp(&b.x));
        pts
    };
    let rates: Vec<Vec<Point>> = t.rates.iter().map(sorted).collect();
    let marks: Vec<Vec<Point>> = t.marks.iter().map(sorted).collect();
    let steps: Vec<Vec<Point>> = t.steps.iter().map(sorted).collect();
    let xmax = rates
        .iter()
        .chain(&steps)
        .flatten()
        .map(|p| p.x)
        .filter(|x| x.is_finite())
        .fold(0.0f64, f64::max);
    let xmax = if xmax > 0.0 { xmax * 1.02 } else { 1.0 };
    // The legend goes in the upper right, above the data: its share of the height is
    // left free (about 16 pixels an entry of some 360).
    let named = |v: &[Series]| v.iter().filter(|s| !s.name.is_empty()).count();
    let entries = t.references.len() + named(&t.rates) + named(&t.steps) + named(&t.marks);
    let free = ((entries as f64 * 16.0 + 24.0) / 360.0).clamp(0.1, 0.6);
    let top = |m: f64| if m > 0.0 { m / (1.0 - free) } else { 1.0 };
    let ymax = top(rates
        .iter()
        .chain(&marks)
        .flatten()
        .map(|p| p.y)
        .chain(t.references.iter().map(|r| r.1))
        .filter(|y| y.is_finite())
        .fold(0.0f64, f64::max));
    let smax = top(steps
        .iter()
        .flatten()
        .map(|p| p.y)
        .filter(|y| y.is_finite())
        .fold(0.0f64, f64::max))
    .ceil();
    let fmt = |v: &f64| format_value(*v);
    let fmt_count = |v: &f64| {
        if (v - v.round()).abs() < 1e-6 {
            format!("{}", v.round())
        } else {
            String::new()
        }
    };
    let mut chart = ChartBuilder::on(area)
        .caption(&t.title, (FONT, 16).into_font())
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .right_y_label_area_size(50)
        .build_cartesian_2d(0.0..xmax, 0.0..ymax)?
        .set_secondary_coord(0.0..xmax, 0.0..smax);
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.12))
        .x_desc(&t.x_label)
        .y_desc(&t.y_label)
        .x_label_formatter(&fmt)
        .y_label_formatter(&fmt)
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc(&t.y2_label)
        .y_labels((smax as usize + 1).min(11))
        .y_label_formatter(&fmt_count)
        .draw()?;
    for (i, (name, y)) in t.references.iter().enumerate() {
        let color = COLORS[(t.rates.len() + i) % COLORS.len()];
        let style = color.stroke_width(1);
        chart
            .draw_series(DashedLineSeries::new([(0.0, *y), (xmax, *y)], 8, 5, style))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
    }
    for (i, pts) in steps.iter().enumerate() {
        let color = COLORS[i % COLORS.len()].mix(0.6);
        let style = color.stroke_width(1);
        let drawn = chart.draw_secondary_series(LineSeries::new(step_points(pts), style))?;
        if !t.steps[i].name.is_empty() {
            drawn.label(&t.steps[i].name).legend(move |(x, y)| {
                PathElement::new(
                    vec![(x, y + 4), (x + 9, y + 4), (x + 9, y - 4), (x + 18, y - 4)],
                    style,
                )
            });
        }
    }
    for (i, pts) in rates.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let drawn = chart.draw_series(LineSeries::new(
            pts.iter().map(|p| (p.x, p.y)),
            color.stroke_width(2),
        ))?;
        if !t.rates[i].name.is_empty() {
            drawn.label(&t.rates[i].name).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        }
    }
    for (i, pts) in marks.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let drawn = chart.draw_series(
            pts.iter()
                .map(|p| TriangleMarker::new((p.x, p.y), 6, color.filled())),
        )?;
        if !t.marks[i].name.is_empty() {
            drawn
                .label(&t.marks[i].name)
                .legend(move |(x, y)| TriangleMarker::new((x + 9, y), 6, color.filled()));
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 12))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}

fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    b: &Bars,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let n = b.categories.len().max(1);
    let k = b.series.len().max(1);
    let ymax = y_top(b.series.iter().flat_map(|(_, v)| {
        v.iter()
            .flatten()
            .flat_map(|bar| [bar.value, bar.hi.unwrap_or(bar.value)])
    }));
    let mut chart = ChartBuilder::on(area)
        .caption(&b.title, (FONT, 16))
        .margin(12)
        .x_label_area_size(if n > 4 { 70 } else { 45 })
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..ymax)?;
    let cats = b.categories.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.12))
        .x_labels(n * 2 + 1)
        .y_desc(&b.y_label)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                cats.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style((FONT, 12))
        .y_label_formatter(&|y| format_value(*y))
        .draw()?;
    let width = 0.8 / k as f64;
    for (si, (name, bars)) in b.series.iter().enumerate() {
        let series_color = COLORS[si % COLORS.len()];
        let color_of = |ci: usize| {
            if k == 1 {
                COLORS[ci % COLORS.len()]
            } else {
                series_color
            }
        };
        let x_of = |ci: usize| ci as f64 - 0.4 + width * si as f64;
        let drawn = chart.draw_series(bars.iter().enumerate().filter_map(|(ci, bar)| {
            let bar = (*bar)?;
            Some(Rectangle::new(
                [(x_of(ci), 0.0), (x_of(ci) + width * 0.92, bar.value)],
                color_of(ci).filled(),
            ))
        }))?;
        if k > 1 {
            drawn.label(name).legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 12, y + 5)], series_color.filled())
            });
        }
        chart.draw_series(bars.iter().enumerate().filter_map(|(ci, bar)| {
            let bar = (*bar)?;
            let xm = x_of(ci) + width * 0.46;
            Some(PathElement::new(
                vec![(xm, bar.lo?), (xm, bar.hi?)],
                BLACK.stroke_width(1),
            ))
        }))?;
        chart.draw_series(bars.iter().enumerate().filter_map(|(ci, bar)| {
            let bar = (*bar)?;
            Some(Text::new(
                format_value(bar.value),
                (
                    x_of(ci),
                    bar.hi.unwrap_or(bar.value).max(bar.value) + ymax * 0.01,
                ),
                (FONT, 11).into_font(),
            ))
        }))?;
    }
    if k > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font((FONT, 12))
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    Ok(())
}

/// A value with about three significant digits and no trailing noise.
pub fn format_value(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure() -> Figure {
        let pt = |x, y| Point {
            x,
            y,
            lo: Some(y * 0.9),
            hi: Some(y * 1.1),
        };
        Figure {
            title: "test figure".into(),
            panels: vec![
                Panel::Lines(Lines {
                    title: "write".into(),
                    x_label: "file size".into(),
                    y_label: "Gbit/s".into(),
                    x_axis: XAxis::Log2Bytes,
                    series: vec![Series {
                        name: "direct, 1 thread".into(),
                        points: vec![pt(4096.0, 0.5), pt(1048576.0, 3.0), pt(268435456.0, 8.0)],
                    }],
                }),
                Panel::Bars(Bars {
                    title: "losf".into(),
                    y_label: "Gbit/s".into(),
                    categories: vec!["cp".into(), "dmover-push".into()],
                    series: vec![(
                        "median".into(),
                        vec![
                            Some(Bar {
                                value: 2.5,
                                lo: Some(2.0),
                                hi: Some(3.0),
                            }),
                            None,
                        ],
                    )],
                }),
            ],
        }
    }

    #[test]
    fn svg_and_png_are_written_with_their_text() {
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("a.svg");
        figure().save(&svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..100.min(text.len())]);
        for want in ["test figure", "dmover-push", "1M", "256M", "Gbit/s"] {
            assert!(text.contains(want), "SVG lacks {want:?}");
        }
        if let Ok(keep) = std::env::var("DMOVER_PLOT_SAMPLE") {
            figure().save(Path::new(&keep)).unwrap();
        }
        let png = dir.path().join("b.PNG");
        figure().save(&png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 5000, "PNG of {} bytes", bytes.len());
    }

    #[test]
    fn the_legend_goes_where_the_data_is_not() {
        let lines = |pts: &[(f64, f64)]| Lines {
            title: String::new(),
            x_label: String::new(),
            y_label: String::new(),
            x_axis: XAxis::Linear,
            series: vec![Series {
                name: "s".into(),
                points: pts
                    .iter()
                    .map(|&(x, y)| Point {
                        x,
                        y,
                        lo: None,
                        hi: None,
                    })
                    .collect(),
            }],
        };
        let at = |l: &Lines| format!("{:?}", legend_corner(l, &|x| x, (0.0, 10.0), 1.0));
        // Rising curve: the upper left is free.
        let rising = lines(&[(1.0, 0.1), (5.0, 0.5), (9.0, 0.9)]);
        assert_eq!(at(&rising), format!("{:?}", SeriesLabelPosition::UpperLeft));
        // Flat lines near the top (throughput at the link rate): the legend goes low.
        let flat = lines(&[(1.0, 0.9), (5.0, 0.9), (9.0, 0.9), (1.0, 0.7), (9.0, 0.7)]);
        assert!(at(&flat).starts_with("Lower"), "{}", at(&flat));
    }

    #[test]
    fn bad_extension_and_empty_data_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            figure().save(&dir.path().join("x.pdf")),
            Err(PlotError::Format(_))
        ));
        let empty = Figure {
            title: "t".into(),
            panels: vec![],
        };
        assert!(matches!(
            empty.save(&dir.path().join("x.svg")),
            Err(PlotError::Empty(_))
        ));
    }

    fn trajectory(title: &str) -> Panel {
        let pt = |x, y| Point {
            x,
            y,
            lo: None,
            hi: None,
        };
        Panel::Trajectory(Trajectory {
            title: title.into(),
            x_label: "seconds".into(),
            y_label: "Gbit/s".into(),
            y2_label: "streams".into(),
            rates: vec![Series {
                name: "tuned r1".into(),
                points: vec![pt(0.5, 0.0), pt(1.0, 0.4), pt(1.5, 0.6), pt(2.0, 0.9)],
            }],
            steps: vec![Series {
                name: "streams r1".into(),
                points: vec![pt(0.6, 4.0), pt(1.4, 8.0), pt(2.0, 8.0)],
            }],
            marks: vec![Series {
                name: "tuner r1".into(),
                points: vec![pt(1.4, 0.5)],
            }],
            references: vec![("-P 4, 16M".into(), 0.7), ("-P 16, 16M".into(), 0.85)],
        })
    }

    #[test]
    fn trajectories_draw_rates_steps_and_references_in_rows() {
        let dir = tempfile::tempdir().unwrap();
        let fig = Figure {
            title: "trajectory".into(),
            panels: vec![
                trajectory("50 ms push"),
                trajectory("50 ms pull"),
                trajectory("200 ms push"),
            ],
        };
        let svg = dir.path().join("t.svg");
        fig.save_in_columns(&svg, 2).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        // Two panels to a row: two rows (of wide panels).
        assert!(
            text.contains(r#"width="1800" height="920""#),
            "{}",
            &text[..200.min(text.len())]
        );
        for want in [
            "200 ms push",
            "tuned r1",
            "streams r1",
            "tuner r1",
            "-P 16, 16M",
            "seconds",
            "streams",
        ] {
            assert!(text.contains(want), "SVG lacks {want:?}");
        }
        if let Ok(keep) = std::env::var("DMOVER_TRAJECTORY_SAMPLE") {
            fig.save_in_columns(Path::new(&keep), 2).unwrap();
        }
        let png = dir.path().join("t.png");
        fig.save_in_columns(&png, 2).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 5000, "PNG of {} bytes", bytes.len());
        // No rates: nothing to plot.
        let empty = Figure {
            title: "t".into(),
            panels: vec![Panel::Trajectory(Trajectory {
                title: String::new(),
                x_label: String::new(),
                y_label: String::new(),
                y2_label: String::new(),
                rates: vec![],
                steps: vec![],
                marks: vec![],
                references: vec![("x".into(), 1.0)],
            })],
        };
        assert!(matches!(
            empty.save(&dir.path().join("e.svg")),
            Err(PlotError::Empty(_))
        ));
    }

    #[test]
    fn steps_hold_each_value_until_the_next_point() {
        let pt = |x, y| Point {
            x,
            y,
            lo: None,
            hi: None,
        };
        assert_eq!(
            step_points(&[pt(1.0, 4.0), pt(2.0, 8.0), pt(3.0, 6.0)]),
            vec![(1.0, 4.0), (2.0, 4.0), (2.0, 8.0), (3.0, 8.0), (3.0, 6.0)]
        );
        assert!(step_points(&[]).is_empty());
    }
}
