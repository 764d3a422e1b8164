//! Parsers for the link parameters as users write them (`100ms`, `5gbit`, `0.01%`).

use std::time::Duration;

/// Splits `"12.5ms"` into `(12.5, "ms")`.
fn split_number(s: &str) -> Result<(f64, String), String> {
    let t = s.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid number in {s:?}"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok((v, unit.trim().to_ascii_lowercase()))
}

/// Parses a duration: a number with `ns`, `us`, `ms`, `s` (a bare `0` is allowed;
/// other bare numbers are refused as ambiguous). Example: `100ms`, `1.5s`, `250us`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (v, unit) = split_number(s)?;
    let secs = match unit.as_str() {
        "" if v == 0.0 => 0.0,
        "" => return Err(format!("duration {s:?} needs a unit (ms, s, us)")),
        "ns" => v / 1e9,
        "us" | "µs" => v / 1e6,
        "ms" => v / 1e3,
        "s" | "sec" => v,
        u => {
            return Err(format!(
                "unknown time unit {u:?} in {s:?} (use ms, s or us)"
            ));
        }
    };
    if secs > 3600.0 {
        return Err(format!("duration {s:?} is too long"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a link rate in bits per second: `bit`, `kbit`, `mbit`, `gbit`, `tbit`
/// (also `k`, `m`, `g`, `t` and `bps`-less `gbps` spellings meaning bits). Decimal
/// multiples, as links are sold. Example: `5gbit` is 5 000 000 000 bit/s.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let (v, unit) = split_number(s)?;
    let mult = match unit.trim_end_matches("ps").trim_end_matches("it") {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        _ => {
            return Err(format!(
                "unknown rate unit {unit:?} in {s:?} (use kbit, mbit or gbit)"
            ));
        }
    };
    let bps = v * mult;
    if !(1000.0..=1e13).contains(&bps) {
        return Err(format!("rate {s:?} is out of range (1kbit..10tbit)"));
    }
    Ok(bps as u64)
}

/// Parses a loss probability: `X%` is a percentage, a bare number a fraction below 1.
/// Example: `0.01%` and `0.0001` are the same.
pub fn parse_loss(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, pct) = match t.strip_suffix('%') {
        Some(n) => (n, true),
        None => (t, false),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid loss {s:?}"))?;
    let f = if pct { v / 100.0 } else { v };
    if !(0.0..1.0).contains(&f) || !f.is_finite() {
        return Err(format!(
            "loss {s:?} is out of range (0 to below 100 %; write percentages with a % sign)"
        ));
    }
    Ok(f)
}

/// Parses a byte size with an optional binary unit (`K`, `M`, `G`; `KiB`, ...).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let (v, unit) = split_number(s)?;
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        u => return Err(format!("unknown size unit {u:?} in {s:?} (use K, M or G)")),
    };
    let b = v * mult as f64;
    if b > 64.0 * (1u64 << 30) as f64 {
        return Err(format!("size {s:?} is too large"));
    }
    Ok(b as u64)
}

/// Formats a rate in bits per second the way [`parse_rate`] reads it (`5gbit`).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert!(parse_duration("100").is_err());
        assert!(parse_duration("-1ms").is_err());
        assert!(parse_duration("1h").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("5gbit"), Ok(5_000_000_000));
        assert_eq!(parse_rate("1Gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("2.5g"), Ok(2_500_000_000));
        assert_eq!(parse_rate("10gbps"), Ok(10_000_000_000));
        assert!(parse_rate("5gbyte").is_err());
        assert!(parse_rate("0").is_err());
        assert_eq!(format_rate(5_000_000_000), "5gbit");
        assert_eq!(format_rate(2_500_000_000), "2.5gbit");
        assert_eq!(format_rate(100_000_000), "100mbit");
    }

    #[test]
    fn losses() {
        assert_eq!(parse_loss("1%"), Ok(0.01));
        assert!((parse_loss("0.01%").unwrap() - 0.0001).abs() < 1e-12);
        assert_eq!(parse_loss("0.02"), Ok(0.02));
        assert_eq!(parse_loss("0"), Ok(0.0));
        assert!(parse_loss("1").is_err());
        assert!(parse_loss("100%").is_err());
        assert!(parse_loss("x").is_err());
    }

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("1.5KiB"), Ok(1536));
        assert!(parse_bytes("1Q").is_err());
    }
}
