//! Durations: the one grammar every fanout duration is written in, and [`Dur`], the config type.
//!
//! [`parse_duration`] reads config durations, `fanout load` flags, Tank schedules and latency
//! thresholds. A duration is one or more `NUMBER UNIT` parts that add up — `250ms`, `1.5s`,
//! `2m`, `1h`, `1m30s`, `1h2m` — where a number is an integer or a decimal (`1.5`, `.5`, `2.`)
//! and a unit is `ns`, `us` (`µs`), `ms`, `s`, `m` (`min`) or `h`; whitespace may surround the
//! parts. A bare number (no unit, alone) means what the caller says: see [`BareNumber`].
//! Decimals are exact (no float rounding) down to the nanosecond, rounded half up.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, de};
use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// How a number written without a unit (`150`) is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BareNumber {
    /// Milliseconds: config durations, `fanout load --timeout`, latency thresholds.
    Millis,
    /// Seconds: Yandex.Tank schedules (`const(100,10)` lasts 10 s).
    Seconds,
    /// Not accepted: a unit is required.
    Refuse,
}

impl BareNumber {
    /// The forms a duration may take under this reading, for error messages.
    pub fn accepted_forms(self) -> &'static str {
        match self {
            BareNumber::Millis => {
                "write a number with a unit (ns, us, ms, s, m, h) such as `250ms`, `1.5s`, \
                 `1m30s`, or a bare number of milliseconds such as `150`"
            }
            BareNumber::Seconds => {
                "write a number with a unit (ns, us, ms, s, m, h) such as `500ms`, `10s`, \
                 `1m30s`, or a bare number of seconds such as `10`"
            }
            BareNumber::Refuse => {
                "write a number with a unit (ns, us, ms, s, m, h) such as `250ms`, `1.5s`, \
                 `1m30s`"
            }
        }
    }

    fn nanos(self) -> Option<u128> {
        match self {
            BareNumber::Millis => Some(NANOS_PER_MILLI),
            BareNumber::Seconds => Some(NANOS_PER_SEC),
            BareNumber::Refuse => None,
        }
    }
}

/// What is wrong with a duration (the reason part of a [`DurationError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationProblem {
    /// Nothing but whitespace.
    #[error("empty")]
    Empty,
    /// A part does not start with a number (`abc`, `-5ms`, `ms`).
    #[error("expected a number, found `{0}`")]
    ExpectedNumber(char),
    /// Digits and dots that are not a number (`1.2.3`, `.`).
    #[error("`{0}` is not a number")]
    BadNumber(String),
    /// A unit other than ns, us, µs, ms, s, m, min, h.
    #[error("unknown unit `{0}`")]
    UnknownUnit(String),
    /// A number without a unit where one is needed: in a compound (`1m30`) or when bare
    /// numbers are refused.
    #[error("missing unit after `{0}`")]
    MissingUnit(String),
    /// Longer than the caller accepts.
    #[error("too long (at most {max:?})")]
    TooLong {
        /// The longest duration accepted.
        max: Duration,
    },
}

/// A duration that was rejected: the text, what is wrong, and (in the message) the forms that
/// would have been accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration `{text}`: {problem}; {}", .bare.accepted_forms())]
pub struct DurationError {
    /// The duration as written.
    pub text: String,
    /// What is wrong with it.
    pub problem: DurationProblem,
    /// How a bare number would have been read (decides the accepted forms shown).
    pub bare: BareNumber,
}

const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SEC: u128 = 1_000_000_000;
/// Fraction digits kept; further digits are below 10⁻⁶ ns even for hours and are ignored.
const FRACTION_DIGITS: u32 = 18;
/// One nanosecond in units of the fraction accumulator (10⁻¹⁸ ns).
const ATTOS_PER_NANO: u128 = 10u128.pow(FRACTION_DIGITS);

/// Parse a duration in the grammar described in the [module docs](self): `250ms`, `1.5s`,
/// `1m30s`, …; a bare number (`150`) is read as `bare` says. The result is at most
/// [`Duration::MAX`]; callers with a smaller limit check it themselves.
pub fn parse_duration(text: &str, bare: BareNumber) -> Result<Duration, DurationError> {
    parse_total(text, bare)?
        .duration()
        .ok_or_else(|| error(text, bare, too_long()))
}

/// Parse like [`parse_duration`] (same grammar and limit), but return milliseconds as a float
/// without rounding to whole nanoseconds first: `0.4161281` (bare milliseconds) is 0.4161281, not
/// 0.416128. For limits compared against measured figures, such as latency thresholds.
pub fn parse_millis_f64(text: &str, bare: BareNumber) -> Result<f64, DurationError> {
    let total = parse_total(text, bare)?;
    match total.duration() {
        Some(_) => Ok(total.millis_f64()),
        None => Err(error(text, bare, too_long())),
    }
}

fn error(text: &str, bare: BareNumber, problem: DurationProblem) -> DurationError {
    DurationError {
        text: text.to_string(),
        problem,
        bare,
    }
}

/// The exact sum of the parts of `text`.
fn parse_total(text: &str, bare: BareNumber) -> Result<Total, DurationError> {
    let err = |problem| error(text, bare, problem);
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(err(DurationProblem::Empty));
    }
    let mut total = Total::default();
    let mut first = true;
    while !rest.is_empty() {
        let (number, unit, tail) = split_part(rest).map_err(err)?;
        let alone = first && tail.is_empty();
        let scale = match unit {
            "" if alone => bare.nanos(),
            "" => None,
            unit => Some(unit_nanos(unit).ok_or_else(|| err(unknown(unit)))?),
        };
        let scale = scale.ok_or_else(|| err(DurationProblem::MissingUnit(number.to_string())))?;
        let value = Decimal::parse(number)
            .ok_or_else(|| err(DurationProblem::BadNumber(number.to_string())))?;
        total.add(&value, scale).ok_or_else(|| err(too_long()))?;
        first = false;
        rest = tail;
    }
    Ok(total)
}

fn unknown(unit: &str) -> DurationProblem {
    DurationProblem::UnknownUnit(unit.to_string())
}

fn too_long() -> DurationProblem {
    DurationProblem::TooLong { max: Duration::MAX }
}

/// Nanoseconds in one `unit`.
fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => NANOS_PER_MILLI,
        "s" => NANOS_PER_SEC,
        "m" | "min" => 60 * NANOS_PER_SEC,
        "h" => 3600 * NANOS_PER_SEC,
        _ => return None,
    })
}

/// Split `NUMBER [ws] UNIT [ws]` off the front of `s` (which starts with no whitespace):
/// (number, unit — empty when none —, the rest).
fn split_part(s: &str) -> Result<(&str, &str, &str), DurationProblem> {
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, rest) = s.split_at(number_end);
    if number.is_empty() {
        let found = rest.chars().next().unwrap_or(' ');
        return Err(DurationProblem::ExpectedNumber(found));
    }
    let rest = rest.trim_start();
    let unit_end = rest
        .find(|c: char| !c.is_alphabetic())
        .unwrap_or(rest.len());
    let (unit, rest) = rest.split_at(unit_end);
    Ok((number, unit, rest.trim_start()))
}

/// A decimal number: integer part and the first [`FRACTION_DIGITS`] fraction digits.
struct Decimal {
    int: u128,
    /// The fraction × 10¹⁸.
    frac: u128,
}

impl Decimal {
    /// `12`, `1.5`, `.5`, `2.`; `None` for no digits or more than one dot. An integer part too
    /// large for u128 saturates (and is then too long for any unit).
    fn parse(s: &str) -> Option<Decimal> {
        let (int, frac) = s.split_once('.').unwrap_or((s, ""));
        let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
        if !digits(int) || !digits(frac) || (int.is_empty() && frac.is_empty()) {
            return None;
        }
        let int = int.bytes().fold(0u128, |acc, b| {
            acc.saturating_mul(10).saturating_add(u128::from(b - b'0'))
        });
        let mut scale = ATTOS_PER_NANO;
        let mut f = 0u128;
        for b in frac.bytes().take(FRACTION_DIGITS as usize) {
            scale /= 10;
            f += u128::from(b - b'0') * scale;
        }
        Some(Decimal { int, frac: f })
    }
}

/// A running sum: whole nanoseconds plus a fraction of a nanosecond in 10⁻¹⁸ ns.
#[derive(Default)]
struct Total {
    nanos: u128,
    attos: u128,
}

impl Total {
    /// Add `value` × `scale` ns; `None` on overflow.
    fn add(&mut self, value: &Decimal, scale: u128) -> Option<()> {
        // frac < 10¹⁸ and scale ≤ 3.6·10¹² ns, so the product fits in u128.
        let frac = value.frac * scale;
        self.attos += frac % ATTOS_PER_NANO;
        let carry = self.attos / ATTOS_PER_NANO;
        self.attos %= ATTOS_PER_NANO;
        self.nanos = self
            .nanos
            .checked_add(value.int.checked_mul(scale)?)?
            .checked_add(frac / ATTOS_PER_NANO + carry)?;
        Some(())
    }

    /// The sum rounded half up to whole nanoseconds; `None` beyond [`Duration::MAX`].
    fn duration(&self) -> Option<Duration> {
        let nanos = self
            .nanos
            .checked_add(u128::from(self.attos >= ATTOS_PER_NANO / 2))?;
        let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
        let sub = u32::try_from(nanos % NANOS_PER_SEC).ok()?;
        Some(Duration::new(secs, sub))
    }

    /// The sum in milliseconds, fraction of a nanosecond included. A whole number of
    /// nanoseconds (below 2⁵³) is divided once, so it gives the float nearest to the decimal
    /// value (`800us` is exactly the float `0.8`).
    fn millis_f64(&self) -> f64 {
        (self.nanos as f64 + self.attos as f64 / 1e18) / 1e6
    }
}

/// A duration from the config: [`parse_duration`] with a bare number of milliseconds, at most
/// [`Dur::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl Dur {
    /// The longest duration a config may hold: 10⁹ s (about 31.7 years).
    pub const MAX: Duration = Duration::from_secs(1_000_000_000);

    /// Whole seconds.
    pub const fn secs(s: u64) -> Dur {
        Dur(Duration::from_secs(s))
    }
    /// Milliseconds.
    pub const fn millis(ms: u64) -> Dur {
        Dur(Duration::from_millis(ms))
    }
    /// Microseconds.
    pub const fn micros(us: u64) -> Dur {
        Dur(Duration::from_micros(us))
    }
    /// Parse `150ms`, `1.5s`, `250us`, `2m`, `1h`, `1m30s`, or `150` (milliseconds).
    pub fn parse(s: &str) -> Result<Dur, DurationError> {
        let d = parse_duration(s, BareNumber::Millis)?;
        if d > Dur::MAX {
            return Err(DurationError {
                text: s.to_string(),
                problem: DurationProblem::TooLong { max: Dur::MAX },
                bare: BareNumber::Millis,
            });
        }
        Ok(Dur(d))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as `150ms`, `2s`, `1m`, or a number of milliseconds")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Dur, E> {
                Ok(Dur::millis(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Dur, E> {
                u64::try_from(v)
                    .map(Dur::millis)
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Dur, E> {
                if (0.0..1e12).contains(&v) {
                    Ok(Dur(Duration::from_secs_f64(v / 1000.0)))
                } else {
                    Err(E::custom(
                        "a duration must be a non-negative number of milliseconds",
                    ))
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dur, E> {
                Dur::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Dur {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration: `150ms`, `1.5s`, `2m`, `1h`, `250us`, a sum such as `1m30s`, or a number of milliseconds.",
            "oneOf": [
                { "type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|min|m|h))+$|^[0-9]+(\\.[0-9]+)?$" },
                { "type": "number", "minimum": 0 }
            ]
        })
    }
}

/// A duration as a config writes it, in the grammar [`parse_duration`] reads back exactly:
/// `150ms`, `2s`, `1m30s`, `1.5s`, `250us` (`fanout explain`'s text, step descriptions).
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if !nanos.is_multiple_of(1_000_000) {
        return if nanos.is_multiple_of(1_000) {
            format!("{}us", nanos / 1_000)
        } else {
            format!("{nanos}ns")
        };
    }
    let ms = nanos / 1_000_000;
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if !ms.is_multiple_of(1000) {
        return format!("{}s", trim_float(ms as f64 / 1000.0));
    }
    let s = ms / 1000;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

fn trim_float(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str, bare: BareNumber) -> Duration {
        parse_duration(text, bare).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn problem(text: &str, bare: BareNumber) -> DurationProblem {
        match parse_duration(text, bare) {
            Ok(d) => panic!("{text} parsed as {d:?}"),
            Err(e) => e.problem,
        }
    }

    #[test]
    fn parses() {
        assert_eq!(Dur::parse("150ms").unwrap(), Dur::millis(150));
        assert_eq!(Dur::parse("1.5s").unwrap(), Dur::millis(1500));
        assert_eq!(Dur::parse("2m").unwrap(), Dur::secs(120));
        assert!(Dur::parse("5 parsecs").is_err());
        assert!(Dur::parse("abc").is_err());
    }

    #[test]
    fn every_unit() {
        let m = BareNumber::Refuse;
        assert_eq!(ok("7ns", m), Duration::from_nanos(7));
        assert_eq!(ok("7us", m), Duration::from_micros(7));
        assert_eq!(ok("7µs", m), Duration::from_micros(7));
        assert_eq!(ok("7μs", m), Duration::from_micros(7));
        assert_eq!(ok("7ms", m), Duration::from_millis(7));
        assert_eq!(ok("7s", m), Duration::from_secs(7));
        assert_eq!(ok("7m", m), Duration::from_secs(420));
        assert_eq!(ok("7min", m), Duration::from_secs(420));
        assert_eq!(ok("7h", m), Duration::from_secs(7 * 3600));
        assert_eq!(ok("0s", m), Duration::ZERO);
    }

    #[test]
    fn compounds_add_up() {
        let m = BareNumber::Refuse;
        assert_eq!(ok("1m30s", m), Duration::from_secs(90));
        assert_eq!(ok("1h2m", m), Duration::from_secs(3720));
        assert_eq!(ok("1h2m3s4ms5us6ns", m), Duration::new(3723, 4_005_006));
        assert_eq!(ok("1m 30s", m), Duration::from_secs(90));
        // Any order, repeats allowed (as Tank schedules always accepted).
        assert_eq!(ok("30s1m", m), Duration::from_secs(90));
        assert_eq!(ok("1s1s", m), Duration::from_secs(2));
        assert_eq!(ok("1.5m0.5s", m), Duration::from_millis(90_500));
        // Fractions of a nanosecond add up before rounding.
        assert_eq!(ok("0.5ns0.5ns", m), Duration::from_nanos(1));
    }

    #[test]
    fn decimals_are_exact() {
        let m = BareNumber::Refuse;
        assert_eq!(ok("1.5s", m), Duration::from_millis(1500));
        assert_eq!(ok(".5s", m), Duration::from_millis(500));
        assert_eq!(ok("2.s", m), Duration::from_secs(2));
        assert_eq!(ok("0.1s", m), Duration::from_millis(100));
        assert_eq!(ok("1.1ms", m), Duration::from_micros(1100));
        assert_eq!(ok("0.000001ms", m), Duration::from_nanos(1));
        assert_eq!(ok("1.000000001s", m), Duration::new(1, 1));
        assert_eq!(
            ok("123456789.123456789s", m),
            Duration::new(123_456_789, 123_456_789)
        );
        assert_eq!(ok("0.0001h", m), Duration::from_millis(360));
        // Rounded half up to the nanosecond; digits past the 18th are ignored.
        assert_eq!(ok("1.5ns", m), Duration::from_nanos(2));
        assert_eq!(ok("1.4999ns", m), Duration::from_nanos(1));
        assert_eq!(ok("0.0015us", m), Duration::from_nanos(2));
        assert_eq!(ok("1.0000000000000000009999s", m), Duration::from_secs(1));
        // Whitespace around the parts and between number and unit.
        assert_eq!(ok("  150 ms ", m), Duration::from_millis(150));
    }

    #[test]
    fn bare_numbers_follow_the_caller() {
        assert_eq!(ok("150", BareNumber::Millis), Duration::from_millis(150));
        assert_eq!(ok("1.5", BareNumber::Millis), Duration::from_micros(1500));
        assert_eq!(ok("10", BareNumber::Seconds), Duration::from_secs(10));
        assert_eq!(ok("0.25", BareNumber::Seconds), Duration::from_millis(250));
        assert_eq!(ok(" 2 ", BareNumber::Seconds), Duration::from_secs(2));
        assert_eq!(
            problem("150", BareNumber::Refuse),
            DurationProblem::MissingUnit("150".into())
        );
        // Only a number standing alone is bare; in a compound every part needs a unit.
        for bare in [BareNumber::Millis, BareNumber::Seconds] {
            assert_eq!(
                problem("1m30", bare),
                DurationProblem::MissingUnit("30".into())
            );
            assert_eq!(
                problem("1 30s", bare),
                DurationProblem::MissingUnit("1".into())
            );
        }
    }

    #[test]
    fn errors_name_the_problem_and_the_forms() {
        let m = BareNumber::Millis;
        assert_eq!(problem("", m), DurationProblem::Empty);
        assert_eq!(problem("   ", m), DurationProblem::Empty);
        assert_eq!(problem("abc", m), DurationProblem::ExpectedNumber('a'));
        assert_eq!(problem("ms", m), DurationProblem::ExpectedNumber('m'));
        assert_eq!(problem("-5ms", m), DurationProblem::ExpectedNumber('-'));
        assert_eq!(problem("5ms%", m), DurationProblem::ExpectedNumber('%'));
        assert_eq!(
            problem("1.2.3s", m),
            DurationProblem::BadNumber("1.2.3".into())
        );
        assert_eq!(problem(".s", m), DurationProblem::BadNumber(".".into()));
        assert_eq!(
            problem("5 parsecs", m),
            DurationProblem::UnknownUnit("parsecs".into())
        );
        assert_eq!(problem("10x", m), DurationProblem::UnknownUnit("x".into()));
        assert_eq!(problem("1e3", m), DurationProblem::UnknownUnit("e".into()));
        assert_eq!(
            problem("10MS", m),
            DurationProblem::UnknownUnit("MS".into())
        );

        let msg = |text: &str, bare| match parse_duration(text, bare) {
            Ok(d) => panic!("{text} parsed as {d:?}"),
            Err(e) => e.to_string(),
        };
        let e = msg("soon", BareNumber::Millis);
        assert!(
            e.starts_with("invalid duration `soon`: expected a number"),
            "{e}"
        );
        assert!(
            e.contains("`1m30s`") && e.contains("bare number of milliseconds"),
            "{e}"
        );
        let e = msg("10x", BareNumber::Seconds);
        assert!(
            e.contains("unknown unit `x`") && e.contains("bare number of seconds"),
            "{e}"
        );
        let e = msg("10", BareNumber::Refuse);
        assert!(
            e.contains("missing unit after `10`") && !e.contains("bare"),
            "{e}"
        );
    }

    #[test]
    fn huge_values_are_errors_not_panics() {
        let too_long = DurationProblem::TooLong { max: Duration::MAX };
        let m = BareNumber::Seconds;
        assert_eq!(
            ok("18446744073709551615s", m),
            Duration::from_secs(u64::MAX)
        );
        assert_eq!(problem("18446744073709551616s", m), too_long);
        assert_eq!(problem("18446744073709551615s1s", m), too_long);
        assert_eq!(problem("99999999999999999999999999999999h", m), too_long);
        let digits = "9".repeat(100);
        assert_eq!(problem(&format!("{digits}h"), m), too_long);
        assert_eq!(problem(&digits, m), too_long);
        assert_eq!(problem(&format!("{digits}.{digits}ns"), m), too_long);
        let many = "1h".repeat(100_000);
        assert_eq!(ok(&many, m), Duration::from_secs(360_000_000));
        let tiny = format!("0.{}1ns", "0".repeat(200));
        assert_eq!(ok(&tiny, m), Duration::ZERO);
        // The config caps durations at 10⁹ s.
        assert_eq!(Dur::parse("1000000000s").map(|d| d.0), Ok(Dur::MAX));
        let e = Dur::parse("1000000001s").map(|d| d.0);
        assert_eq!(
            e.map_err(|e| e.problem),
            Err(DurationProblem::TooLong { max: Dur::MAX })
        );
        assert!(Dur::parse("1000000000000").is_ok());
        assert!(Dur::parse("1000000000001").is_err());
    }

    #[test]
    fn millis_keep_fractions_of_a_nanosecond() {
        let ms = |text: &str, bare| {
            parse_millis_f64(text, bare).unwrap_or_else(|e| panic!("{text}: {e}"))
        };
        let m = BareNumber::Millis;
        assert_eq!(ms("3", m), 3.0);
        assert_eq!(ms("3.25", m), 3.25);
        assert_eq!(ms("12.345", m), 12.345);
        assert_eq!(ms("800us", m), 0.8);
        assert_eq!(ms("1.5s", m), 1500.0);
        assert_eq!(ms("1m30s", m), 90_000.0);
        assert_eq!(ms("2", BareNumber::Seconds), 2000.0);
        assert!((ms("0.4161281", m) - 0.4161281).abs() < 1e-15);
        assert!((ms("0.5ns", m) - 0.0000005).abs() < 1e-18);
        assert_eq!(
            parse_millis_f64("18446744073709551616s", m).map_err(|e| e.problem),
            Err(DurationProblem::TooLong { max: Duration::MAX })
        );
        assert_eq!(
            parse_millis_f64("x", m).map_err(|e| e.problem),
            Err(DurationProblem::ExpectedNumber('x'))
        );
    }

    #[test]
    fn durations_are_written_as_the_config_writes_them_and_read_back() {
        let ms = Duration::from_millis;
        assert_eq!(format_duration(ms(0)), "0s");
        assert_eq!(format_duration(ms(150)), "150ms");
        assert_eq!(format_duration(ms(1500)), "1.5s");
        assert_eq!(format_duration(ms(2000)), "2s");
        assert_eq!(format_duration(ms(90_000)), "1m30s");
        assert_eq!(format_duration(ms(300_000)), "5m");
        assert_eq!(format_duration(ms(3_600_000)), "1h");
        assert_eq!(format_duration(Duration::from_micros(250)), "250us");
        for d in [
            ms(0),
            ms(1),
            ms(999),
            ms(1001),
            ms(3_723_000),
            ms(3_723_456),
            Duration::from_nanos(1_000_000_001),
            Duration::from_micros(1_500_250),
            Dur::MAX,
        ] {
            let text = format_duration(d);
            assert_eq!(parse_duration(&text, BareNumber::Refuse), Ok(d), "{text}");
        }
    }
}
