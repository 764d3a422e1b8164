//! Sizes, rates and durations as users write them (`64K`, `1gbit`, `100ms`): the one
//! parser of each for every command-line option and configuration value.
//!
//! Nothing here touches the protocol: it lives in this crate, with nothing but `std`,
//! because this is the lowest crate both the CLI and the engine (`dmover-core`, whose
//! server configuration may take the same units) depend on.
//!
//! A value is a number (digits with an optional decimal fraction: `2`, `1.5`, `.5`; no
//! sign, no exponent), optional spaces, then a unit. Units are case-insensitive except
//! where bits and bytes must be told apart (rates).
//!
//! | kind | units | a bare number |
//! |---|---|---|
//! | size (bytes) | `B`; `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (×1024 each); `KB`, `MB`, `GB`, `TB` are the same binary units | bytes |
//! | rate (bits per second) | bits: `bit`, `kbit`, `mbit`, `gbit`, `tbit` (×1000 each; also `kbps` … `tbps` and `kbit/s` …); bytes per second: `B/s`, `KB/s`, `MB/s`, `GB/s`, `TB/s` (×1000 each), `KiB/s` … `TiB/s` (×1024 each) | refused: a rate needs a unit |
//! | duration | `ns`, `us`/`µs`, `ms`, `s`, `m`/`min`, `h` | refused, except `0`: a duration needs a unit |
//!
//! Sizes are binary throughout, as buffer and chunk sizes always were in dmover (`--chunk
//! 4MB` and `4M` both mean 4 MiB). Rates are decimal, as links are sold, and must say
//! bits or bytes: `1gb`, `1g`, `1Gb/s` and `1GBps` are refused with a message naming
//! `1gbit` and `1GB/s`, since each is read as bits by some tools and bytes by others.
//! Fractions of a byte, a bit per second or a nanosecond are dropped.
//!
//! One exception in the CLI, kept because its help always said so: in the `--rtt` lists
//! of `dmover bench net` and `dmover bench transfer` a bare number is milliseconds (a
//! thin wrapper around [`parse_duration`]).
//!
//! Errors are messages for people: they quote the value and list the accepted units.
//!
//! Hand-written rather than a crate's: the common ones read `KB` as 1000 bytes or take
//! no fractions (`1.5s`), and none makes a rate say bits or bytes.

use std::time::Duration;

const SIZE_UNITS: &str = "B, K/KiB, M/MiB, G/GiB or T/TiB; KB, MB, GB, TB are binary too";
const RATE_UNITS: &str =
    "bits: kbit, mbit, gbit, tbit (or kbps … tbps); bytes: KB/s, MB/s, GB/s, TB/s, KiB/s … TiB/s";
const DURATION_UNITS: &str = "ns, us, ms, s, m, h or d";

/// A non-negative decimal number, kept exact: `int + frac / scale`.
#[derive(Debug, Clone, Copy)]
struct Number {
    int: u128,
    frac: u128,
    scale: u128,
}

impl Number {
    /// `⌊self × mult⌋`, or `None` if it does not fit in a `u128`.
    fn times(self, mult: u128) -> Option<u128> {
        let whole = self.int.checked_mul(mult)?;
        // frac < 10^24 < 2^80 and every unit is below 2^44, so this cannot overflow.
        whole.checked_add(self.frac * mult / self.scale)
    }

    fn is_zero(self) -> bool {
        self.int == 0 && self.frac == 0
    }
}

/// Fraction digits kept; later ones cannot change a result in whole units.
const MAX_FRACTION_DIGITS: u32 = 24;

/// Splits `" 12.5 ms "` into the number 12.5, its text `"12.5"` and the unit `"ms"`.
fn split<'a>(
    what: &str,
    s: &'a str,
    example: &str,
    too_big: &str,
) -> Result<(Number, &'a str, &'a str), String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(format!(
            "empty {what}: write a number and a unit, e.g. {example}"
        ));
    }
    if t.starts_with('-') {
        return Err(format!("{what} {s:?} is negative"));
    }
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(format!(
            "{what} {s:?} is not a number with a unit, e.g. {example}"
        ));
    }
    let too_large = || format!("{what} {s:?} is {too_big}");
    let mut n = Number {
        int: 0,
        frac: 0,
        scale: 1,
    };
    for d in int.bytes() {
        n.int = n
            .int
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(d - b'0')))
            .ok_or_else(too_large)?;
    }
    for d in frac.bytes().take(MAX_FRACTION_DIGITS as usize) {
        n.frac = n.frac * 10 + u128::from(d - b'0');
        n.scale *= 10;
    }
    Ok((n, num, unit.trim()))
}

/// Parses a size in bytes: `4096`, `64K`, `1.5GiB`, `2 MB` (all units binary; see the
/// [module docs](self)).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (n, _, unit) = split("size", s, "64K, 4M or 2G", "too large")?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" | "byte" | "bytes" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in size {s:?} (use {SIZE_UNITS})"
            ));
        }
    };
    n.times(1 << shift)
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| format!("size {s:?} is too large (at most {} bytes)", u64::MAX))
}

/// The multiplier of a decimal or binary prefix (`""`, `k`, `m`, `g`, `t`; with `binary`
/// `ki`, `mi`, `gi`, `ti`), compared case-insensitively.
fn prefix(p: &str, binary: bool) -> Option<u128> {
    let p = p.to_ascii_lowercase();
    let (letter, bin) = match p.strip_suffix('i') {
        Some(l) if binary && !l.is_empty() => (l, true),
        _ => (p.as_str(), false),
    };
    let power = ["", "k", "m", "g", "t"].iter().position(|x| *x == letter)? as u32;
    Some(if bin {
        1u128 << (10 * power)
    } else {
        1000u128.pow(power)
    })
}

/// Bits per second per unit of `unit`, or `None` if it is not a rate unit.
fn rate_unit(unit: &str) -> Option<u128> {
    let lower = unit.to_ascii_lowercase();
    let body = lower.strip_suffix("/s").unwrap_or(&lower);
    // Bits spelled out, with or without "/s": 5gbit, 5Gbit/s, 5 gbits.
    for bit in ["bits", "bit"] {
        if let Some(m) = body.strip_suffix(bit).and_then(|p| prefix(p, false)) {
            return Some(m);
        }
    }
    // The old spellings 10gbps, 10Gbps: bits, when the b is lowercase.
    if let Some(p) = unit.strip_suffix("bps") {
        return prefix(p, false);
    }
    // Bytes per second: 10GB/s (decimal), 10GiB/s (binary), 10 bytes/s.
    let body = unit
        .strip_suffix("/s")
        .or_else(|| unit.strip_suffix("/S"))?;
    let p = body
        .strip_suffix("bytes")
        .or_else(|| body.strip_suffix("byte"))
        .or_else(|| body.strip_suffix('B'))?;
    Some(8 * prefix(p, true)?)
}

/// Parses a rate in bits per second: `5gbit`, `100mbit`, `10gbps`, `1.25GB/s` (=
/// 10 Gbit/s), `100MiB/s`. A unit is required and must say bits or bytes (see the
/// [module docs](self)).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let (n, num, unit) = split("rate", s, "1gbit or 125MB/s", "too large")?;
    if unit.is_empty() {
        return Err(format!(
            "rate {s:?} needs a unit, e.g. {num}gbit or {num}MB/s ({RATE_UNITS})"
        ));
    }
    let Some(mult) = rate_unit(unit) else {
        let lower = unit.to_ascii_lowercase();
        let p = lower
            .trim_end_matches("/s")
            .trim_end_matches("ps")
            .trim_end_matches("ytes")
            .trim_end_matches("yte")
            .trim_end_matches('b');
        return Err(if prefix(p, false).is_some() {
            let up = p.to_ascii_uppercase();
            format!(
                "rate {s:?} does not say bits or bytes: write {num}{p}bit for bits per second \
                 or {num}{up}B/s for bytes per second"
            )
        } else {
            format!("unknown unit {unit:?} in rate {s:?} (use {RATE_UNITS})")
        });
    };
    n.times(mult)
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| format!("rate {s:?} is too large"))
}

/// Formats a rate in bits per second the way [`parse_rate`] reads it: `5gbit`,
/// `2.5gbit`, `100mbit`, `999bit`.
pub fn format_rate(bps: u64) -> String {
    for (m, u) in [(1e12, "tbit"), (1e9, "gbit"), (1e6, "mbit"), (1e3, "kbit")] {
        if bps as f64 >= m {
            let v = format!("{:.3}", bps as f64 / m);
            let v = v.trim_end_matches('0').trim_end_matches('.');
            return format!("{v}{u}");
        }
    }
    format!("{bps}bit")
}

/// Parses a duration: `100ms`, `1.5s`, `250us`, `2m`, `1h`, `30d`. A unit is required; a bare
/// `0` is allowed (see the [module docs](self)).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, num, unit) = split("duration", s, "500ms, 5s or 2m", "too long")?;
    let nanos: u128 = match unit.to_ascii_lowercase().as_str() {
        "" if n.is_zero() => 1,
        "" => {
            return Err(format!(
                "duration {s:?} needs a unit, e.g. {num}s or {num}ms (use {DURATION_UNITS})"
            ));
        }
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" | "secs" => 1_000_000_000,
        "m" | "min" | "mins" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in duration {s:?} (use {DURATION_UNITS})"
            ));
        }
    };
    let too_long = || format!("duration {s:?} is too long");
    let total = n.times(nanos).ok_or_else(too_long)?;
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| too_long())?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn sizes_accepted() {
        for (s, v) in [
            ("0", 0),
            ("100", 100),
            ("100B", 100),
            ("4096 bytes", 4096),
            ("64K", 64 << 10),
            ("64k", 64 << 10),
            ("64KiB", 64 << 10),
            ("64KB", 64 << 10),
            ("4M", 4 << 20),
            ("4mib", 4 << 20),
            ("4MB", 4 << 20),
            ("2G", 2 * GIB),
            ("1gb", GIB),
            ("1.5G", 3 << 29),
            (".5K", 512),
            ("1.", 1),
            ("1.5KiB", 1536),
            (" 2 MB ", 2 << 20),
            ("1T", 1 << 40),
            ("1TiB", 1 << 40),
            ("0.1K", 102),
            ("18446744073709551615", u64::MAX),
            ("18446744073709551615.999", u64::MAX),
            ("16777215T", u64::MAX - (1 << 40) + 1),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s:?}");
        }
    }

    #[test]
    fn sizes_refused() {
        for (s, why) in [
            ("", "empty"),
            ("  ", "empty"),
            ("-1", "negative"),
            ("-1K", "negative"),
            ("NaN", "not a number"),
            ("inf", "not a number"),
            ("K", "not a number"),
            ("+1", "not a number"),
            ("1.2.3", "not a number"),
            ("1e3", "unknown unit"),
            ("4X", "unknown unit"),
            ("4 P", "unknown unit"),
            ("1gbit", "unknown unit"),
            ("18446744073709551616", "too large"),
            ("16777216T", "too large"),
            ("99999999999999999999999999999999999999999999G", "too large"),
        ] {
            let e = parse_size(s).unwrap_err();
            assert!(e.contains(why), "{s:?}: {e}");
            if !s.trim().is_empty() {
                assert!(e.contains(&format!("{s:?}")), "{s:?} is named: {e}");
            }
        }
        assert!(parse_size("4X").unwrap_err().contains("K/KiB"));
    }

    #[test]
    fn rates_accepted() {
        for (s, v) in [
            ("5gbit", 5_000_000_000),
            ("1Gbit", 1_000_000_000),
            ("1GBIT", 1_000_000_000),
            ("1 gbit/s", 1_000_000_000),
            ("1Gbits", 1_000_000_000),
            ("100mbit", 100_000_000),
            ("1kbit", 1000),
            ("2tbit", 2_000_000_000_000),
            ("999bit", 999),
            ("2.5gbit", 2_500_000_000),
            ("10gbps", 10_000_000_000),
            ("10Gbps", 10_000_000_000),
            ("100Mbps", 100_000_000),
            ("1bps", 1),
            ("125MB/s", 1_000_000_000),
            ("1.25GB/s", 10_000_000_000),
            ("1kB/s", 8000),
            ("1TB/s", 8_000_000_000_000),
            ("1GB/S", 8_000_000_000),
            ("10B/s", 80),
            ("10 bytes/s", 80),
            ("1KiB/s", 8192),
            ("1MiB/s", 8 << 20),
            ("1GiB/s", 8 * GIB),
            ("0gbit", 0),
            ("18446744073709551615bit", u64::MAX),
        ] {
            assert_eq!(parse_rate(s), Ok(v), "{s:?}");
        }
    }

    #[test]
    fn rates_refused() {
        for (s, why) in [
            ("", "empty"),
            ("100", "needs a unit"),
            ("0", "needs a unit"),
            ("1gb", "write 1gbit for bits per second or 1GB/s for bytes"),
            ("1GB", "write 1gbit for bits per second or 1GB/s"),
            ("2.5g", "write 2.5gbit"),
            ("1Gb/s", "bits or bytes"),
            ("1gb/s", "bits or bytes"),
            ("1GBps", "bits or bytes"),
            ("1b", "bits or bytes"),
            ("5gbyte", "bits or bytes"),
            ("1GiB", "unknown unit"),
            ("1gibit", "unknown unit"),
            ("1x", "unknown unit"),
            ("-1gbit", "negative"),
            ("nan", "not a number"),
            ("18446744073709551616bit", "too large"),
            ("18446744073709552tbit", "too large"),
        ] {
            let e = parse_rate(s).unwrap_err();
            assert!(e.contains(why), "{s:?}: {e}");
        }
        assert!(parse_rate("1x").unwrap_err().contains("gbit"));
    }

    #[test]
    fn rates_format_as_they_parse() {
        for (bps, s) in [
            (5_000_000_000, "5gbit"),
            (2_500_000_000, "2.5gbit"),
            (100_000_000, "100mbit"),
            (1_500, "1.5kbit"),
            (999, "999bit"),
            (10_000_000_000_000, "10tbit"),
        ] {
            assert_eq!(format_rate(bps), s);
            assert_eq!(parse_rate(s), Ok(bps));
        }
    }

    #[test]
    fn durations_accepted() {
        let ms = Duration::from_millis;
        for (s, v) in [
            ("0", Duration::ZERO),
            ("0.0", Duration::ZERO),
            ("0ms", Duration::ZERO),
            ("100ms", ms(100)),
            ("100 MS", ms(100)),
            ("1.5s", ms(1500)),
            ("5s", ms(5000)),
            ("2sec", ms(2000)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("1ns", Duration::from_nanos(1)),
            ("12.5ms", Duration::from_micros(12_500)),
            ("0.0000000015s", Duration::from_nanos(1)),
            ("1m", ms(60_000)),
            ("1.5min", ms(90_000)),
            ("2h", ms(7_200_000)),
            ("30d", Duration::from_secs(30 * 86_400)),
            ("20000000000ns", Duration::from_secs(20)),
            ("18446744073709551615s", Duration::from_secs(u64::MAX)),
            (
                "5124095576030431h",
                Duration::from_secs(5_124_095_576_030_431 * 3600),
            ),
        ] {
            assert_eq!(parse_duration(s), Ok(v), "{s:?}");
        }
    }

    #[test]
    fn durations_refused() {
        for (s, why) in [
            ("", "empty"),
            ("5", "needs a unit, e.g. 5s or 5ms"),
            ("100", "needs a unit"),
            ("-1ms", "negative"),
            ("NaN", "not a number"),
            ("ms", "not a number"),
            ("5x", "unknown unit"),
            ("1w", "unknown unit"),
            ("18446744073709551616s", "too long"),
            ("5124095576030432h", "too long"),
            ("9999999999999999999999999999999999999999h", "too long"),
        ] {
            let e = parse_duration(s).unwrap_err();
            assert!(e.contains(why), "{s:?}: {e}");
        }
        assert!(parse_duration("5x").unwrap_err().contains("ms"));
    }
}
