//! Load schedules in Yandex.Tank syntax and their intended send times.
//!
//! A schedule is a sequence of profiles, separated by whitespace and/or commas:
//!
//! | profile                       | offered rate                                                     |
//! |-------------------------------|------------------------------------------------------------------|
//! | `const(r, d)`                 | `r` requests/s for `d`; `const(0, d)` is a pause                 |
//! | `line(a, b, d)`               | linear ramp from `a` to `b` requests/s over `d`                  |
//! | `step(a, b, s, d)`            | `a`, `a±s`, … up to `b` requests/s (both ends included), `d` each |
//!
//! Rates may be fractional. Durations are a number with a unit — `500ms`, `10s`, `2m`, `1h`,
//! `250us`, compounds such as `1m30s` — or a bare number of **seconds** (Tank's convention;
//! elsewhere in fanout a bare number is milliseconds). The grammar is
//! [`fanout_config::parse_duration`]'s.
//!
//! The schedule is an *open model*: [`Schedule::send_time`] gives the intended offset of the
//! n-th request in closed form (const: `n/r`; line: the root of `a·t + (b−a)·t²/(2d) = n`;
//! step: piecewise const), independently of how fast the target answers.

use fanout_config::{BareNumber, DurationError, DurationProblem};
use std::fmt;
use std::time::Duration;

/// Most levels one `step(…)` may expand to.
pub const MAX_STEP_LEVELS: u64 = 100_000;
/// Highest rate a profile may ask for (requests per second).
pub const MAX_RATE: f64 = 10_000_000.0;
/// Most requests one schedule may contain.
pub const MAX_TOTAL_REQUESTS: u64 = 1 << 40;
/// Longest duration one profile may have: 2⁶⁴ − 1 ns (about 584 years).
pub const MAX_DURATION: Duration = Duration::from_nanos(u64::MAX);

const NANOS_PER_SEC: f64 = 1e9;

/// One profile of a schedule, as written.
#[derive(Debug, Clone, PartialEq)]
pub enum Profile {
    /// `const(rate, duration)`: a constant rate.
    Const {
        /// Requests per second.
        rate: f64,
        /// How long.
        duration: Duration,
    },
    /// `line(from, to, duration)`: a linear ramp.
    Line {
        /// Rate at the start (requests per second).
        from: f64,
        /// Rate at the end (requests per second).
        to: f64,
        /// How long the ramp lasts.
        duration: Duration,
    },
    /// `step(from, to, step, duration)`: constant levels `from`, `from±step`, … `to`.
    Step {
        /// First level (requests per second).
        from: f64,
        /// Last level (requests per second), included when `|to − from|` is a multiple of `step`.
        to: f64,
        /// Increment between levels (> 0; the direction follows `from` → `to`).
        step: f64,
        /// How long each level lasts.
        duration: Duration,
    },
}

/// A linear piece of the rate curve (const when `a == b`); `step` expands into several.
#[derive(Debug, Clone, PartialEq)]
struct Piece {
    start_ns: u64,
    dur_ns: u64,
    a: f64,
    b: f64,
    /// Index of the piece's first request in the whole schedule.
    first: u64,
    /// Requests in this piece.
    count: u64,
}

impl Piece {
    fn new(start_ns: u64, dur_ns: u64, a: f64, b: f64, first: u64) -> Piece {
        let d = dur_ns as f64 / NANOS_PER_SEC;
        let expected = (a + b) / 2.0 * d;
        // The k-th request (0-based) goes out at N⁻¹(k); it belongs to the piece while
        // N⁻¹(k) < d, i.e. k < N(d). The epsilon absorbs float error on exact products.
        let count = (expected - 1e-9 * expected.max(1.0)).ceil().max(0.0) as u64;
        Piece {
            start_ns,
            dur_ns,
            a,
            b,
            first,
            count,
        }
    }

    fn dur_s(&self) -> f64 {
        self.dur_ns as f64 / NANOS_PER_SEC
    }

    /// Offset of local request `k` (< count) from the piece start, in ns.
    fn local_ns(&self, k: u64) -> u64 {
        if k == 0 {
            return 0;
        }
        let kf = k as f64;
        let ns = if self.a == self.b {
            kf * NANOS_PER_SEC / self.a
        } else {
            // a·t + slope·t²/2 = k  →  t = 2k / (a + √(a² + 2·slope·k)), stable for both signs.
            let slope = (self.b - self.a) / self.dur_s();
            let disc = (self.a * self.a + 2.0 * slope * kf).max(0.0);
            2.0 * kf / (self.a + disc.sqrt()) * NANOS_PER_SEC
        };
        let ns = ns.round();
        if ns.is_finite() && ns >= 0.0 {
            (ns as u64).min(self.dur_ns.saturating_sub(1))
        } else {
            self.dur_ns.saturating_sub(1)
        }
    }

    fn rate_at(&self, local_ns: u64) -> f64 {
        let frac = local_ns as f64 / self.dur_ns as f64;
        self.a + (self.b - self.a) * frac
    }

    /// Local requests intended strictly before local offset `ns`.
    fn count_before(&self, ns: u64) -> u64 {
        // Smallest k with local_ns(k) >= ns (binary search keeps it consistent with send_time).
        let (mut lo, mut hi) = (0u64, self.count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.local_ns(mid) < ns {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// A parsed load schedule: profiles in order, with their intended send times.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    profiles: Vec<Profile>,
    pieces: Vec<Piece>,
    total: u64,
    dur_ns: u64,
}

/// Why a schedule string was rejected. Columns are 1-based character positions.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    /// Nothing but separators.
    #[error(
        "empty schedule: expected profiles such as `const(100,10s) line(100,500,30s) step(100,500,100,10s)`"
    )]
    Empty,
    /// A name other than const/line/step.
    #[error(
        "column {col}: unknown profile `{name}`; expected const(rate,duration), \
         line(from,to,duration) or step(from,to,step,duration)"
    )]
    UnknownProfile {
        /// Where the name starts.
        col: usize,
        /// The name as written.
        name: String,
    },
    /// Unexpected text.
    #[error("column {col}: expected {expected}, found {found}")]
    Syntax {
        /// Where.
        col: usize,
        /// What the parser wanted.
        expected: &'static str,
        /// What it saw.
        found: String,
    },
    /// Wrong number of arguments.
    #[error("column {col}: {usage} takes {expected} arguments, found {found}")]
    Arity {
        /// Where the profile starts.
        col: usize,
        /// The profile's signature, e.g. `line(from,to,duration)`.
        usage: &'static str,
        /// Arguments it takes.
        expected: usize,
        /// Arguments given.
        found: usize,
    },
    /// A rate (or step) that is not a usable number.
    #[error("column {col}: invalid {what} `{text}`: {reason}")]
    Number {
        /// Where.
        col: usize,
        /// `rate` or `step`.
        what: &'static str,
        /// The argument as written.
        text: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A duration that does not parse, or is longer than [`MAX_DURATION`].
    #[error("column {col}: {error}")]
    BadDuration {
        /// Where.
        col: usize,
        /// What is wrong with it, and the accepted forms.
        error: DurationError,
    },
    /// A duration the schedule cannot use (zero).
    #[error(
        "column {col}: invalid duration `{text}`: {reason} (write e.g. `500ms`, `10s`, `2m`, `1m30s`)"
    )]
    Duration {
        /// Where.
        col: usize,
        /// The argument as written.
        text: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A step profile with too many levels.
    #[error("column {col}: step(…) would expand to {levels} levels (at most {MAX_STEP_LEVELS})")]
    TooManyLevels {
        /// Where the profile starts.
        col: usize,
        /// Levels it would have.
        levels: u64,
    },
    /// The whole schedule asks for too many requests or lasts too long.
    #[error("schedule too large: {what}")]
    TooLarge {
        /// What overflowed.
        what: String,
    },
}

impl Schedule {
    /// Parse Tank syntax: `const(100,10s) line(100,500,30s) step(100,500,100,10s)`.
    pub fn parse(s: &str) -> Result<Schedule, ScheduleError> {
        let mut p = Parser {
            chars: s.chars().collect(),
            pos: 0,
        };
        let mut profiles = Vec::new();
        loop {
            p.skip_separators();
            if p.eof() {
                break;
            }
            profiles.push(p.profile()?);
        }
        if profiles.is_empty() {
            return Err(ScheduleError::Empty);
        }
        Schedule::from_profiles(profiles)
    }

    /// Build a schedule from profiles (checked as [`Schedule::parse`] checks them).
    pub fn from_profiles(profiles: Vec<Profile>) -> Result<Schedule, ScheduleError> {
        let mut pieces = Vec::new();
        let mut start_ns: u64 = 0;
        let mut first: u64 = 0;
        let too_long = || ScheduleError::TooLarge {
            what: "total duration overflows".into(),
        };
        let mut push = |dur: Duration, a: f64, b: f64| -> Result<(), ScheduleError> {
            let dur_ns = u64::try_from(dur.as_nanos()).map_err(|_| too_long())?;
            let piece = Piece::new(start_ns, dur_ns, a, b, first);
            first = first
                .checked_add(piece.count)
                .filter(|t| *t <= MAX_TOTAL_REQUESTS)
                .ok_or_else(|| ScheduleError::TooLarge {
                    what: format!("more than {MAX_TOTAL_REQUESTS} requests"),
                })?;
            start_ns = start_ns.checked_add(dur_ns).ok_or_else(too_long)?;
            pieces.push(piece);
            Ok(())
        };
        for p in &profiles {
            check_profile(p)?;
            match *p {
                Profile::Const { rate, duration } => push(duration, rate, rate)?,
                Profile::Line { from, to, duration } => push(duration, from, to)?,
                Profile::Step {
                    from,
                    to,
                    step,
                    duration,
                } => {
                    for level in step_levels(from, to, step) {
                        push(duration, level, level)?;
                    }
                }
            }
        }
        if profiles.is_empty() {
            return Err(ScheduleError::Empty);
        }
        Ok(Schedule {
            profiles,
            pieces,
            total: first,
            dur_ns: start_ns,
        })
    }

    /// The profiles, as parsed.
    pub fn profiles(&self) -> &[Profile] {
        &self.profiles
    }

    /// Total length of the schedule.
    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.dur_ns)
    }

    /// Number of requests the schedule asks for.
    pub fn total_requests(&self) -> u64 {
        self.total
    }

    /// The offered rate (requests/s) at offset `t`; 0 past the end.
    pub fn rate_at(&self, t: Duration) -> f64 {
        let Ok(ns) = u64::try_from(t.as_nanos()) else {
            return 0.0;
        };
        self.piece_at_ns(ns)
            .map(|p| p.rate_at(ns - p.start_ns))
            .unwrap_or(0.0)
    }

    /// Intended offset (from the start of the run) of the `n`-th request, 0-based; `None` past
    /// the end. Offsets never decrease with `n`.
    pub fn send_time(&self, n: u64) -> Option<Duration> {
        if n >= self.total {
            return None;
        }
        let i = self.pieces.partition_point(|p| p.first + p.count <= n);
        let p = self.pieces.get(i)?;
        Some(Duration::from_nanos(p.start_ns + p.local_ns(n - p.first)))
    }

    /// Number of requests intended strictly before offset `t` (so the requests offered in
    /// `[t1, t2)` are `requests_before(t2) − requests_before(t1)`).
    pub fn requests_before(&self, t: Duration) -> u64 {
        let Ok(ns) = u64::try_from(t.as_nanos()) else {
            return self.total;
        };
        if ns >= self.dur_ns {
            return self.total;
        }
        match self.piece_at_ns(ns) {
            Some(p) => p.first + p.count_before(ns - p.start_ns),
            None => self.total,
        }
    }

    fn piece_at_ns(&self, ns: u64) -> Option<&Piece> {
        if ns >= self.dur_ns {
            return None;
        }
        let i = self.pieces.partition_point(|p| p.start_ns + p.dur_ns <= ns);
        self.pieces.get(i)
    }
}

impl std::str::FromStr for Schedule {
    type Err = ScheduleError;
    fn from_str(s: &str) -> Result<Schedule, ScheduleError> {
        Schedule::parse(s)
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.profiles.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Profile::Const { rate, duration } => {
                write!(f, "const({rate},{})", DisplayDuration(*duration))
            }
            Profile::Line { from, to, duration } => {
                write!(f, "line({from},{to},{})", DisplayDuration(*duration))
            }
            Profile::Step {
                from,
                to,
                step,
                duration,
            } => write!(f, "step({from},{to},{step},{})", DisplayDuration(*duration)),
        }
    }
}

/// Formats a duration the way the schedule syntax writes it (`2m`, `10s`, `1.5s`, `500ms`).
pub(crate) struct DisplayDuration(pub Duration);

impl fmt::Display for DisplayDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        const S: u128 = 1_000_000_000;
        if ns == 0 {
            f.write_str("0s")
        } else if ns.is_multiple_of(3600 * S) {
            write!(f, "{}h", ns / (3600 * S))
        } else if ns.is_multiple_of(60 * S) {
            write!(f, "{}m", ns / (60 * S))
        } else if ns.is_multiple_of(S) {
            write!(f, "{}s", ns / S)
        } else if ns > S && ns.is_multiple_of(S / 10) {
            write!(f, "{}s", self.0.as_secs_f64())
        } else if ns.is_multiple_of(1_000_000) {
            write!(f, "{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1_000) {
            write!(f, "{}us", ns / 1_000)
        } else {
            write!(f, "{ns}ns")
        }
    }
}

fn check_profile(p: &Profile) -> Result<(), ScheduleError> {
    let bad_rate = |v: f64| {
        let reason = if !v.is_finite() {
            Some("not a finite number")
        } else if v < 0.0 {
            Some("a rate cannot be negative")
        } else if v > MAX_RATE {
            Some("above the maximum of 10000000 requests/s")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(ScheduleError::Number {
                col: 0,
                what: "rate",
                text: v.to_string(),
                reason,
            }),
            None => Ok(()),
        }
    };
    let (rates, duration): (Vec<f64>, Duration) = match *p {
        Profile::Const { rate, duration } => (vec![rate], duration),
        Profile::Line { from, to, duration } => (vec![from, to], duration),
        Profile::Step {
            from,
            to,
            step,
            duration,
        } => {
            if !(step.is_finite() && step > 0.0) {
                return Err(ScheduleError::Number {
                    col: 0,
                    what: "step",
                    text: step.to_string(),
                    reason: "the step must be a number greater than 0",
                });
            }
            (vec![from, to], duration)
        }
    };
    for r in rates {
        bad_rate(r)?;
    }
    if duration.is_zero() {
        return Err(ScheduleError::Duration {
            col: 0,
            text: "0".into(),
            reason: "a duration must be greater than zero",
        });
    }
    if let Profile::Step { from, to, step, .. } = *p {
        let levels = step_level_count(from, to, step);
        if levels > MAX_STEP_LEVELS {
            return Err(ScheduleError::TooManyLevels { col: 0, levels });
        }
    }
    Ok(())
}

fn step_level_count(from: f64, to: f64, step: f64) -> u64 {
    ((to - from).abs() / step + 1e-9).floor() as u64 + 1
}

fn step_levels(from: f64, to: f64, step: f64) -> impl Iterator<Item = f64> {
    let sign = if to >= from { 1.0 } else { -1.0 };
    (0..step_level_count(from, to, step)).map(move |i| from + sign * step * i as f64)
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
}

impl Parser {
    fn eof(&self) -> bool {
        self.pos >= self.chars.len()
    }

    fn col(&self) -> usize {
        self.pos + 1
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_separators(&mut self) {
        while matches!(self.peek(), Some(c) if c.is_whitespace() || c == ',' || c == ';') {
            self.pos += 1;
        }
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(c) if c.is_whitespace()) {
            self.pos += 1;
        }
    }

    fn found(&self) -> String {
        match self.peek() {
            None => "end of input".into(),
            Some(c) => format!("`{c}`"),
        }
    }

    fn profile(&mut self) -> Result<Profile, ScheduleError> {
        let start = self.col();
        let name_start = self.pos;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == '_') {
            self.pos += 1;
        }
        let name: String = self.chars[name_start..self.pos].iter().collect();
        if name.is_empty() {
            return Err(ScheduleError::Syntax {
                col: start,
                expected: "a profile such as `const(100,10s)`",
                found: self.found(),
            });
        }
        let (usage, arity) = match name.to_ascii_lowercase().as_str() {
            "const" => ("const(rate,duration)", 2),
            "line" => ("line(from,to,duration)", 3),
            "step" => ("step(from,to,step,duration)", 4),
            _ => {
                return Err(ScheduleError::UnknownProfile { col: start, name });
            }
        };
        self.skip_ws();
        if self.peek() != Some('(') {
            return Err(ScheduleError::Syntax {
                col: self.col(),
                expected: "`(` after the profile name",
                found: self.found(),
            });
        }
        self.pos += 1;
        // Arguments: comma-separated until `)`.
        let mut args: Vec<(usize, String)> = Vec::new();
        let mut cur_start = self.col();
        let mut cur = String::new();
        loop {
            match self.peek() {
                None => {
                    return Err(ScheduleError::Syntax {
                        col: self.col(),
                        expected: "`)` closing the profile",
                        found: self.found(),
                    });
                }
                Some(')') => {
                    self.pos += 1;
                    args.push((cur_start, cur));
                    break;
                }
                Some(',') => {
                    self.pos += 1;
                    args.push((cur_start, std::mem::take(&mut cur)));
                    cur_start = self.col();
                }
                Some('(') => {
                    return Err(ScheduleError::Syntax {
                        col: self.col(),
                        expected: "an argument or `)`",
                        found: self.found(),
                    });
                }
                Some(c) => {
                    if cur.trim().is_empty() && c.is_whitespace() {
                        cur_start = self.col() + 1;
                    }
                    cur.push(c);
                    self.pos += 1;
                }
            }
        }
        let args: Vec<(usize, String)> = args
            .into_iter()
            .map(|(c, s)| (c, s.trim().to_string()))
            .collect();
        let empty_call = args.len() == 1 && args[0].1.is_empty();
        let found = if empty_call { 0 } else { args.len() };
        if found != arity {
            return Err(ScheduleError::Arity {
                col: start,
                usage,
                expected: arity,
                found,
            });
        }
        let rate = |i: usize, what: &'static str| parse_rate(&args[i].1, args[i].0, what);
        let dur = |i: usize| parse_duration(&args[i].1, args[i].0);
        let profile = match arity {
            2 => Profile::Const {
                rate: rate(0, "rate")?,
                duration: dur(1)?,
            },
            3 => Profile::Line {
                from: rate(0, "rate")?,
                to: rate(1, "rate")?,
                duration: dur(2)?,
            },
            _ => Profile::Step {
                from: rate(0, "rate")?,
                to: rate(1, "rate")?,
                step: rate(2, "step")?,
                duration: dur(3)?,
            },
        };
        if let Profile::Step { step, .. } = profile
            && step <= 0.0
        {
            return Err(ScheduleError::Number {
                col: args[2].0,
                what: "step",
                text: args[2].1.clone(),
                reason: "the step must be greater than 0",
            });
        }
        check_profile(&profile).map_err(|e| match e {
            ScheduleError::TooManyLevels { levels, .. } => {
                ScheduleError::TooManyLevels { col: start, levels }
            }
            ScheduleError::Duration { reason, .. } => {
                let (col, text) = args[arity - 1].clone();
                ScheduleError::Duration { col, text, reason }
            }
            other => other,
        })?;
        Ok(profile)
    }
}

fn parse_rate(text: &str, col: usize, what: &'static str) -> Result<f64, ScheduleError> {
    let err = |reason| ScheduleError::Number {
        col,
        what,
        text: text.to_string(),
        reason,
    };
    if text.is_empty() {
        return Err(err("missing value"));
    }
    let v: f64 = text.parse().map_err(|_| err("not a number"))?;
    if !v.is_finite() {
        return Err(err("not a finite number"));
    }
    if v < 0.0 {
        return Err(err("cannot be negative"));
    }
    if v > MAX_RATE {
        return Err(err("above the maximum of 10000000 requests/s"));
    }
    Ok(v)
}

/// Parse a profile's duration: [`fanout_config::parse_duration`] with a bare number of seconds
/// (Tank's convention: `const(100,10)` lasts 10 s), greater than zero and at most
/// [`MAX_DURATION`].
pub(crate) fn parse_duration(text: &str, col: usize) -> Result<Duration, ScheduleError> {
    let bad = |error| ScheduleError::BadDuration { col, error };
    let too_long = || {
        bad(DurationError {
            text: text.to_string(),
            problem: DurationProblem::TooLong { max: MAX_DURATION },
            bare: BareNumber::Seconds,
        })
    };
    let d = match fanout_config::parse_duration(text, BareNumber::Seconds) {
        Ok(d) if d > MAX_DURATION => return Err(too_long()),
        Ok(d) => d,
        Err(e) if matches!(e.problem, DurationProblem::TooLong { .. }) => return Err(too_long()),
        Err(e) => return Err(bad(e)),
    };
    if d.is_zero() {
        return Err(ScheduleError::Duration {
            col,
            text: text.to_string(),
            reason: "a duration must be greater than zero",
        });
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> Schedule {
        match Schedule::parse(text) {
            Ok(s) => s,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    fn err(text: &str) -> String {
        match Schedule::parse(text) {
            Ok(s) => panic!("{text} parsed as {s}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn parses_each_form() {
        assert_eq!(
            s("const(100,10s)").profiles(),
            &[Profile::Const {
                rate: 100.0,
                duration: Duration::from_secs(10)
            }]
        );
        assert_eq!(
            s("line(1, 5000, 60s)").profiles(),
            &[Profile::Line {
                from: 1.0,
                to: 5000.0,
                duration: Duration::from_secs(60)
            }]
        );
        assert_eq!(
            s("step(100,500,100,10s)").profiles(),
            &[Profile::Step {
                from: 100.0,
                to: 500.0,
                step: 100.0,
                duration: Duration::from_secs(10)
            }]
        );
        assert_eq!(
            s("CONST(0.5, 2m)").profiles(),
            &[Profile::Const {
                rate: 0.5,
                duration: Duration::from_secs(120)
            }]
        );
    }

    #[test]
    fn parses_sequences_and_durations() {
        let sch = s("const(100,10s) line(100,500,30s),step(100,500,100,10s) ,, const(1, 500ms)");
        assert_eq!(sch.profiles().len(), 4);
        assert_eq!(
            sch.duration(),
            Duration::from_millis(10_000 + 30_000 + 50_000 + 500)
        );
        assert_eq!(
            sch.to_string(),
            "const(100,10s) line(100,500,30s) step(100,500,100,10s) const(1,500ms)"
        );
        assert_eq!(s("const(1,1m30s)").duration(), Duration::from_secs(90));
        assert_eq!(s("const(1,2)").duration(), Duration::from_secs(2));
        assert_eq!(s("const(1,1.5s)").duration(), Duration::from_millis(1500));
        assert_eq!(s("const(1,250us)").duration(), Duration::from_micros(250));
        assert_eq!(s("const(1,1h)").duration(), Duration::from_secs(3600));
        assert_eq!(s("const(1,1min)").duration(), Duration::from_secs(60));
        assert_eq!(s("const(1,10µs)").duration(), Duration::from_micros(10));
        assert_eq!(s("const(1,0.5)").duration(), Duration::from_millis(500));
        assert_eq!(s("const(1,1h2m)").duration(), Duration::from_secs(3720));
        assert_eq!(s("const(1,30s1m)").duration(), Duration::from_secs(90));
        assert_eq!(
            s("const(1,18446744073709551615ns)").duration(),
            Duration::from_nanos(u64::MAX)
        );
        // Display round-trips.
        for text in ["const(1.5,1.5s)", "line(0,10,2m)", "step(5,1,2,250ms)"] {
            assert_eq!(s(text).to_string(), text);
            assert_eq!(s(&s(text).to_string()), s(text));
        }
    }

    #[test]
    fn errors_are_clear() {
        assert!(err("").contains("empty schedule"));
        assert!(err("  , ").contains("empty schedule"));
        let e = err("const(100,10s) ramp(1,2,3s)");
        assert!(
            e.contains("column 16") && e.contains("unknown profile `ramp`"),
            "{e}"
        );
        let e = err("const(100)");
        assert!(
            e.contains("const(rate,duration) takes 2 arguments, found 1"),
            "{e}"
        );
        let e = err("line(1,2)");
        assert!(e.contains("takes 3 arguments, found 2"), "{e}");
        let e = err("const()");
        assert!(e.contains("found 0"), "{e}");
        let e = err("const(abc,10s)");
        assert!(
            e.contains("column 7") && e.contains("invalid rate `abc`: not a number"),
            "{e}"
        );
        let e = err("const(-5,10s)");
        assert!(e.contains("cannot be negative"), "{e}");
        let e = err("const(5,10x)");
        assert!(
            e.contains("invalid duration `10x`") && e.contains("unknown unit"),
            "{e}"
        );
        let e = err("const(5,0s)");
        assert!(e.contains("greater than zero"), "{e}");
        let e = err("const(5, 1m30)");
        assert!(
            e.contains("column 10") && e.contains("missing unit after `30`"),
            "{e}"
        );
        let e = err("const(5,10x)");
        assert!(
            e.contains("column 9") && e.contains("bare number of seconds"),
            "{e}"
        );
        let e = err("const(5,)");
        assert!(
            e.contains("column 9") && e.contains("invalid duration ``"),
            "{e}"
        );
        let e = err("const(5,18446744073709551616ns)");
        assert!(
            e.contains("too long (at most 18446744073.709551615s)"),
            "{e}"
        );
        let e = err("const(5,99999999999999999999999999h)");
        assert!(
            e.contains("too long (at most 18446744073.709551615s)"),
            "{e}"
        );
        let e = err("const(5,10s");
        assert!(e.contains("`)` closing the profile"), "{e}");
        let e = err("const 5");
        assert!(e.contains("`(` after the profile name"), "{e}");
        let e = err("step(1,10,0,1s)");
        assert!(e.contains("invalid step"), "{e}");
        let e = err("step(0,1000000,1,1s)");
        assert!(e.contains("levels"), "{e}");
        let e = err("(1,2)");
        assert!(e.contains("expected a profile"), "{e}");
        let e = err("const(1,5s)x");
        assert!(e.contains("unknown profile `x`"), "{e}");
    }

    #[test]
    fn const_spacing_is_exact() {
        let sch = s("const(200,2s)");
        assert_eq!(sch.total_requests(), 400);
        assert_eq!(sch.send_time(0), Some(Duration::ZERO));
        for n in 0..399 {
            let a = sch.send_time(n).unwrap_or_default();
            let b = sch.send_time(n + 1).unwrap_or_default();
            assert_eq!(b - a, Duration::from_millis(5), "n={n}");
        }
        assert_eq!(sch.send_time(399), Some(Duration::from_millis(1995)));
        assert_eq!(sch.send_time(400), None);
        assert_eq!(
            s("const(3,1s)").send_time(1),
            Some(Duration::from_nanos(333_333_333))
        );
        // Fractional rates: 0.5/s over 10s = 5 requests, 2 s apart.
        let half = s("const(0.5,10s)");
        assert_eq!(half.total_requests(), 5);
        assert_eq!(half.send_time(4), Some(Duration::from_secs(8)));
        // A non-integral product rounds up (n < r·d): 1.5/s for 3s = 4.5 → 5 (0, 0.67, … 2.67 s).
        assert_eq!(s("const(1.5,3s)").total_requests(), 5);
        // A pause offers nothing but takes time.
        let p = s("const(0,1s) const(10,1s)");
        assert_eq!(p.total_requests(), 10);
        assert_eq!(p.send_time(0), Some(Duration::from_secs(1)));
        assert_eq!(p.rate_at(Duration::from_millis(500)), 0.0);
        assert_eq!(p.rate_at(Duration::from_millis(1500)), 10.0);
        assert_eq!(p.rate_at(Duration::from_secs(5)), 0.0);
    }

    #[test]
    fn line_count_matches_area() {
        for (a, b, d) in [
            (100.0, 500.0, 30.0),
            (0.0, 1000.0, 10.0),
            (500.0, 100.0, 7.0),
            (1.0, 5000.0, 60.0),
            (10.0, 0.0, 3.0),
            (0.3, 7.7, 13.0),
        ] {
            let sch = s(&format!("line({a},{b},{d}s)"));
            let expected = (a + b) / 2.0 * d;
            let got = sch.total_requests() as f64;
            assert!(
                (got - expected).abs() <= 1.0,
                "line({a},{b},{d}s): {got} vs {expected}"
            );
            // Monotone and inside the segment.
            let mut prev = Duration::ZERO;
            for n in 0..sch.total_requests() {
                let t = sch.send_time(n).unwrap_or_default();
                assert!(t >= prev && t < sch.duration(), "n={n} t={t:?}");
                prev = t;
            }
            // The number of requests in the first half matches the integral of the rate.
            let half = sch.requests_before(Duration::from_secs_f64(d / 2.0)) as f64;
            let expected_half = a * d / 2.0 + (b - a) / d * (d / 2.0) * (d / 2.0) / 2.0;
            assert!(
                (half - expected_half).abs() <= 1.0,
                "{half} vs {expected_half}"
            );
        }
        let ramp = s("line(100,500,30s)");
        assert!((ramp.rate_at(Duration::from_secs(15)) - 300.0).abs() < 1e-9);
        // Spacing at the start ≈ 1/a, at the end ≈ 1/b.
        let d0 = ramp.send_time(1).unwrap_or_default() - ramp.send_time(0).unwrap_or_default();
        assert!((d0.as_secs_f64() - 0.01).abs() < 1e-4, "{d0:?}");
        let n = ramp.total_requests();
        let d1 =
            ramp.send_time(n - 1).unwrap_or_default() - ramp.send_time(n - 2).unwrap_or_default();
        assert!((d1.as_secs_f64() - 0.002).abs() < 1e-4, "{d1:?}");
    }

    #[test]
    fn step_is_piecewise_const() {
        let sch = s("step(100,500,100,10s)");
        assert_eq!(sch.duration(), Duration::from_secs(50));
        assert_eq!(sch.total_requests(), (100 + 200 + 300 + 400 + 500) * 10);
        assert_eq!(sch.rate_at(Duration::from_secs(5)), 100.0);
        assert_eq!(sch.rate_at(Duration::from_secs(45)), 500.0);
        // The first request of the second level goes out at 10 s, then every 5 ms.
        assert_eq!(sch.send_time(1000), Some(Duration::from_secs(10)));
        assert_eq!(sch.send_time(1001), Some(Duration::from_millis(10_005)));
        assert_eq!(sch.requests_before(Duration::from_secs(10)), 1000);
        assert_eq!(sch.requests_before(Duration::from_secs(20)), 3000);
        // Descending, and an end that is not on the grid.
        let down = s("step(25,5,5,1s)");
        assert_eq!(down.duration(), Duration::from_secs(5));
        assert_eq!(down.total_requests(), 25 + 20 + 15 + 10 + 5);
        let off = s("step(1,10,4,1s)");
        assert_eq!(off.duration(), Duration::from_secs(3)); // 1, 5, 9
        assert_eq!(off.total_requests(), 15);
    }

    #[test]
    fn requests_before_is_consistent_with_send_time() {
        let sch = s("const(7,1s) line(3,40,2s) step(10,1,3,500ms)");
        let total = sch.total_requests();
        let mut t = Duration::ZERO;
        while t <= sch.duration() + Duration::from_millis(100) {
            let direct = (0..total)
                .filter(|n| sch.send_time(*n).unwrap_or_default() < t)
                .count() as u64;
            assert_eq!(sch.requests_before(t), direct, "t={t:?}");
            t += Duration::from_millis(37);
        }
        assert_eq!(sch.requests_before(Duration::from_secs(1000)), total);
    }
}
