//! The `grpc-timeout` header: `<1–8 digits><unit>`, unit one of `H M S m u n`.

use std::time::Duration;

/// Parse a `grpc-timeout` value; `None` when it is malformed (more than 8 digits, no unit, an
/// unknown unit, or an overflow).
pub fn parse(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 || !v.is_ascii() {
        return None;
    }
    let (num, unit) = v.split_at(v.len() - 1);
    if !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The units of `grpc-timeout`, finest first: nanoseconds per unit, and its letter.
const UNITS: [(u64, char); 6] = [
    (1, 'n'),
    (1_000, 'u'),
    (1_000_000, 'm'),
    (1_000_000_000, 'S'),
    (60_000_000_000, 'M'),
    (3_600_000_000_000, 'H'),
];

/// The largest count a `grpc-timeout` value holds (8 digits).
const MAX: u64 = 99_999_999;

/// Write a duration as a `grpc-timeout` value: the finest unit whose count fits in 8 digits,
/// rounded up (a call is never told it has less time than it has, nor zero).
pub fn format(d: Duration) -> String {
    // Per call: 64-bit arithmetic and no formatting machinery when the nanoseconds fit (584
    // years).
    if let Ok(ns) = u64::try_from(d.as_nanos()) {
        let ns = ns.max(1);
        for (per, unit) in UNITS {
            let n = ns.div_ceil(per);
            if n <= MAX {
                let mut out = String::with_capacity(10);
                out.push_str(itoa::Buffer::new().format(n));
                out.push(unit);
                return out;
            }
        }
    }
    format_wide(d)
}

/// [`format`] in 128-bit arithmetic: any duration.
fn format_wide(d: Duration) -> String {
    let ns = d.as_nanos().max(1);
    for (per, unit) in UNITS {
        let n = ns.div_ceil(u128::from(per));
        if n <= u128::from(MAX) {
            return format!("{n}{unit}");
        }
    }
    format!("{MAX}H")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_and_refuses_junk() {
        assert_eq!(parse("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse("9n"), Some(Duration::from_nanos(9)));
        for bad in [
            "",
            "m",
            "100",
            "100x",
            "123456789m",
            "-1m",
            "+1m",
            "1.5S",
            "１m",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_64_bit_path_formats_like_the_128_bit_one() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for d in [
                Duration::from_nanos(x),
                Duration::from_nanos(x % 10_000_000_000),
                Duration::from_nanos(x % 1_000_000),
            ] {
                assert_eq!(format(d), format_wide(d), "{d:?}");
            }
        }
        for d in [
            Duration::ZERO,
            Duration::from_nanos(u64::MAX),
            Duration::MAX,
        ] {
            assert_eq!(format(d), format_wide(d), "{d:?}");
        }
    }

    #[test]
    fn formats_in_eight_digits_rounding_up() {
        assert_eq!(format(Duration::from_millis(250)), "250000u");
        assert_eq!(format(Duration::from_nanos(1500)), "1500n");
        assert_eq!(format(Duration::ZERO), "1n");
        assert_eq!(format(Duration::from_secs(200)), "200000m");
        assert_eq!(format(Duration::from_secs(10 * 86_400)), "864000S");
        for d in [1u64, 999, 123_456_789, 99_999_999_999] {
            let d = Duration::from_micros(d);
            let s = format(d);
            assert!(s.len() <= 9, "{s}");
            assert!(parse(&s).is_some_and(|p| p >= d), "{s} >= {d:?}");
        }
    }
}
