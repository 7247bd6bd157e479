//! [`Dur`]: durations written as `150ms`, `1.5s`, `2m`, `1h`, or a bare number of milliseconds.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, de};
use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// A duration from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl Dur {
    /// Whole seconds.
    pub const fn secs(s: u64) -> Dur {
        Dur(Duration::from_secs(s))
    }
    /// Milliseconds.
    pub const fn millis(ms: u64) -> Dur {
        Dur(Duration::from_millis(ms))
    }
    /// Parse `150ms`, `1.5s`, `250us`, `2m`, `1h`.
    pub fn parse(s: &str) -> Result<Dur, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: f64 = num
            .parse()
            .map_err(|_| format!("invalid duration `{s}`: expected e.g. `150ms`, `2s`, `1m`"))?;
        let factor = match unit.trim() {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" | "" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => {
                return Err(format!(
                    "invalid duration unit `{other}` in `{s}`: use ns, us, ms, s, m or h"
                ));
            }
        };
        let secs = n * factor;
        if !secs.is_finite() || secs > 1e9 {
            return Err(format!("duration `{s}` is out of range"));
        }
        Ok(Dur(Duration::from_secs_f64(secs)))
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
            "description": "A duration: `150ms`, `1.5s`, `2m`, `1h`, `250us`, or a number of milliseconds.",
            "oneOf": [
                { "type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)?$" },
                { "type": "number", "minimum": 0 }
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parses() {
        assert_eq!(Dur::parse("150ms").unwrap(), Dur::millis(150));
        assert_eq!(Dur::parse("1.5s").unwrap(), Dur::millis(1500));
        assert_eq!(Dur::parse("2m").unwrap(), Dur::secs(120));
        assert!(Dur::parse("5 parsecs").is_err());
        assert!(Dur::parse("abc").is_err());
    }
}
