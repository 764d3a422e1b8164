//! Order statistics for benchmark results: medians of repeats, percentiles of latency
//! samples, spread.
//!
//! Percentiles use linear interpolation between closest ranks (the "type 7" definition of
//! Hyndman & Fan, the default of R, NumPy and most spreadsheets): for `n` sorted samples,
//! percentile `p` is taken at the fractional index `p / 100 × (n − 1)`. The median is the
//! 50th percentile, so for an even count it is the mean of the two middle samples.

use serde::Serialize;

/// Percentile `p` (0–100) of samples that are already sorted ascending; `None` when there
/// are none. `p` outside 0–100 is clamped.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let p = if p.is_nan() {
        50.0
    } else {
        p.clamp(0.0, 100.0)
    };
    let rank = p / 100.0 * (n - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Sorts a copy of `samples` (NaNs last) and returns it.
fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// Percentile `p` (0–100) of unsorted samples.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    percentile_sorted(&sorted(samples), p)
}

/// Median of unsorted samples.
pub fn median(samples: &[f64]) -> Option<f64> {
    percentile(samples, 50.0)
}

/// A summary of repeated measurements of one quantity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Smallest sample.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// `(max − min) / median`: the relative spread of the repeats (0 for one sample or a
    /// zero median).
    pub spread: f64,
}

impl Summary {
    /// Summarises `samples`; `None` when there are none.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let s = sorted(samples);
        let median = percentile_sorted(&s, 50.0)?;
        let (min, max) = (s[0], s[s.len() - 1]);
        Some(Summary {
            n: s.len(),
            min,
            median,
            max,
            mean: s.iter().sum::<f64>() / s.len() as f64,
            spread: if median != 0.0 {
                (max - min) / median.abs()
            } else {
                0.0
            },
        })
    }
}

/// The latency percentiles the reports quote.
pub const LATENCY_PERCENTILES: [f64; 4] = [50.0, 90.0, 99.0, 99.9];

/// Latency distribution of individual operations, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Latency {
    /// Number of operations.
    pub ops: u64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest operation.
    pub max_us: f64,
}

impl Latency {
    /// Summarises operation times in nanoseconds; sorts `ns` in place. All zeros when empty.
    pub fn of_nanos(ns: &mut [u64]) -> Latency {
        if ns.is_empty() {
            return Latency::default();
        }
        ns.sort_unstable();
        let us: Vec<f64> = ns.iter().map(|&x| x as f64 / 1e3).collect();
        let p = |q| percentile_sorted(&us, q).unwrap_or(0.0);
        Latency {
            ops: ns.len() as u64,
            p50_us: p(50.0),
            p90_us: p(90.0),
            p99_us: p(99.0),
            p999_us: p(99.9),
            max_us: us[us.len() - 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[5.0, 5.0, 1.0, 100.0, 5.0]), Some(5.0));
    }

    #[test]
    fn percentiles_match_numpy_linear() {
        // numpy.percentile(range(1, 11), [0, 10, 25, 50, 90, 99, 99.9, 100])
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        let want = [
            (0.0, 1.0),
            (10.0, 1.9),
            (25.0, 3.25),
            (50.0, 5.5),
            (90.0, 9.1),
            (99.0, 9.91),
            (99.9, 9.991),
            (100.0, 10.0),
        ];
        for (p, w) in want {
            let got = percentile(&v, p).unwrap();
            assert!(close(got, w), "p{p}: {got} != {w}");
        }
        // Order of the input does not matter; out-of-range p is clamped.
        let rev: Vec<f64> = v.iter().rev().copied().collect();
        assert_eq!(percentile(&rev, 90.0), percentile(&v, 90.0));
        assert_eq!(percentile(&v, 150.0), Some(10.0));
        assert_eq!(percentile(&v, -5.0), Some(1.0));
    }

    #[test]
    fn summary_of_repeats() {
        let s = Summary::of(&[2.0, 4.0, 3.0]).unwrap();
        assert_eq!((s.n, s.min, s.median, s.max), (3, 2.0, 3.0, 4.0));
        assert!(close(s.mean, 3.0));
        assert!(close(s.spread, 2.0 / 3.0));
        let one = Summary::of(&[5.0]).unwrap();
        assert_eq!((one.median, one.spread), (5.0, 0.0));
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn latency_percentiles_in_microseconds() {
        // 1..=1000 µs as nanoseconds, shuffled.
        let mut ns: Vec<u64> = (1..=1000u64)
            .map(|i| (i * 7919 % 1000 + 1) * 1000)
            .collect();
        let l = Latency::of_nanos(&mut ns);
        assert_eq!(l.ops, 1000);
        assert!(close(l.p50_us, 500.5), "{l:?}");
        assert!(close(l.p90_us, 900.1), "{l:?}");
        assert!(close(l.p99_us, 990.01), "{l:?}");
        assert!(close(l.p999_us, 999.001), "{l:?}");
        assert!(close(l.max_us, 1000.0), "{l:?}");
        assert_eq!(Latency::of_nanos(&mut []), Latency::default());
    }
}
