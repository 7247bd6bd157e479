//! Postgres values ⇄ JSON: parameters from flow values, typed by the prepared statement
//! ([`param`]), and column values written straight into the answer's JSON text ([`write_value`]),
//! from the binary wire format: no intermediate document.
//!
//! | Postgres | JSON |
//! |---|---|
//! | int2, int4, int8, oid | number |
//! | float4 | number, the shortest text that reads back as that f32 (`0.1`, as `to_json`) |
//! | float8 | number (`NaN`, `±Infinity`: the string; float4's too) |
//! | numeric | number with its exact decimal text, any length (`NaN`, `±Infinity`: the string) |
//! | bool | `true`/`false` |
//! | text, varchar, char, name, citext, enums | string |
//! | uuid | string (`8-4-4-4-12` hex) |
//! | json, jsonb | the JSON value, inline |
//! | date | `"YYYY-MM-DD"` |
//! | timestamp | `"YYYY-MM-DDTHH:MM:SS[.ffffff]"` (no offset: the column has none) |
//! | timestamptz | `"YYYY-MM-DDTHH:MM:SS[.ffffff]Z"` (UTC) |
//! | bytea | string, base64 (standard alphabet, padded) |
//! | arrays of these | arrays (nested for several dimensions) |
//! | NULL | `null` |

use base64::Engine as _;
use bytes::{BufMut, BytesMut};
use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, Timelike};
use fanout_expr::{Val, kind_phrase};
use postgres_types::{IsNull, Kind, ToSql, Type, to_sql_checked};
use std::error::Error;
use std::fmt::Write as _;

type BoxError = Box<dyn Error + Sync + Send>;

/// Whether a column or parameter of type `ty` can be read and written (arrays: of such types).
pub fn supported(ty: &Type) -> bool {
    match ty.kind() {
        Kind::Array(member) => supported(member),
        Kind::Enum(_) => true,
        Kind::Domain(inner) => supported(inner),
        _ => {
            matches!(
                *ty,
                Type::BOOL
                    | Type::INT2
                    | Type::INT4
                    | Type::INT8
                    | Type::OID
                    | Type::FLOAT4
                    | Type::FLOAT8
                    | Type::NUMERIC
                    | Type::TEXT
                    | Type::VARCHAR
                    | Type::BPCHAR
                    | Type::NAME
                    | Type::UNKNOWN
                    | Type::UUID
                    | Type::JSON
                    | Type::JSONB
                    | Type::DATE
                    | Type::TIMESTAMP
                    | Type::TIMESTAMPTZ
                    | Type::BYTEA
            ) || ty.name() == "citext"
        }
    }
}

/// Seconds from 1970-01-01 to Postgres's epoch, 2000-01-01.
const PG_EPOCH_UNIX_SECS: i64 = 946_684_800;
/// Days from 0001-01-01 (CE day 1) to 2000-01-01.
const PG_EPOCH_CE_DAYS: i32 = 730_120;

/// A parameter value, encoded for its statement's type.
#[derive(Debug)]
pub enum Param {
    /// SQL NULL.
    Null,
    /// bool.
    Bool(bool),
    /// int2.
    I16(i16),
    /// int4.
    I32(i32),
    /// int8, oid.
    I64(i64),
    /// float4.
    F32(f32),
    /// float8.
    F64(f64),
    /// numeric, from its decimal text.
    Numeric(String),
    /// Text types.
    Text(String),
    /// uuid.
    Uuid([u8; 16]),
    /// json/jsonb: the JSON text.
    Json(Vec<u8>),
    /// date: days since 2000-01-01.
    Date(i32),
    /// timestamp/timestamptz: microseconds since 2000-01-01 (UTC for timestamptz).
    Timestamp(i64),
    /// bytea.
    Bytes(Vec<u8>),
    /// An array (one dimension), of the member type.
    Array(Vec<Param>),
}

impl ToSql for Param {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        use postgres_protocol::types as t;
        match self {
            Param::Null => return Ok(IsNull::Yes),
            Param::Bool(v) => t::bool_to_sql(*v, out),
            Param::I16(v) => t::int2_to_sql(*v, out),
            Param::I32(v) => t::int4_to_sql(*v, out),
            Param::I64(v) if *ty == Type::OID => t::oid_to_sql(*v as u32, out),
            Param::I64(v) => t::int8_to_sql(*v, out),
            Param::F32(v) => t::float4_to_sql(*v, out),
            Param::F64(v) => t::float8_to_sql(*v, out),
            Param::Numeric(text) => numeric_to_sql(text, out)?,
            Param::Text(s) => t::text_to_sql(s, out),
            Param::Uuid(b) => t::uuid_to_sql(*b, out),
            Param::Json(text) => {
                if *ty == Type::JSONB {
                    out.put_u8(1);
                }
                out.extend_from_slice(text);
            }
            Param::Date(d) => t::date_to_sql(*d, out),
            Param::Timestamp(us) => t::timestamp_to_sql(*us, out),
            Param::Bytes(b) => t::bytea_to_sql(b, out),
            Param::Array(items) => {
                let Kind::Array(member) = ty.kind() else {
                    return Err(format!("an array for the non-array type {ty}").into());
                };
                let dims = [postgres_protocol::types::ArrayDimension {
                    len: i32::try_from(items.len()).map_err(|_| "array too long")?,
                    lower_bound: 1,
                }];
                t::array_to_sql(
                    dims,
                    member.oid(),
                    items.iter(),
                    |e, buf| match e.to_sql(member, buf)? {
                        IsNull::No => Ok(postgres_protocol::IsNull::No),
                        IsNull::Yes => Ok(postgres_protocol::IsNull::Yes),
                    },
                    out,
                )?;
            }
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// The type a parameter wants, for messages: `an integer (int4)`.
fn wants(ty: &Type) -> String {
    let what = match *ty {
        Type::BOOL => "a boolean",
        Type::INT2 | Type::INT4 | Type::INT8 | Type::OID => "an integer",
        Type::FLOAT4 | Type::FLOAT8 | Type::NUMERIC => "a number",
        Type::UUID => "a UUID string",
        Type::JSON | Type::JSONB => "any JSON value",
        Type::DATE => "a date string (YYYY-MM-DD)",
        Type::TIMESTAMP | Type::TIMESTAMPTZ => "an RFC 3339 date-time string",
        Type::BYTEA => "a base64 string",
        _ => match ty.kind() {
            Kind::Array(_) => "an array",
            _ => "a string",
        },
    };
    format!("{what} ({})", ty.name())
}

fn number_text(v: &Val) -> String {
    fanout_expr::json::to_string(v)
}

/// Convert flow value `v` to a parameter of type `ty`, or say why it does not fit (the message
/// names what was expected and what came, never the value).
pub fn param(v: &Val, ty: &Type) -> Result<Param, String> {
    let bad = |extra: &str| format!("expected {}, got {}{extra}", wants(ty), kind_phrase(v));
    if matches!(v, Val::Null) {
        return Ok(Param::Null);
    }
    if let Kind::Domain(inner) = ty.kind() {
        return param(v, inner);
    }
    if let Kind::Array(member) = ty.kind() {
        let Val::Arr(items) = v else {
            return Err(bad(""));
        };
        return items
            .iter()
            .map(|x| param(x, member))
            .collect::<Result<Vec<_>, _>>()
            .map(Param::Array);
    }
    let text = || match v {
        Val::TStr(b) | Val::BStr(b) => std::str::from_utf8(b).ok(),
        _ => None,
    };
    let int = |min: i64, max: i64| -> Result<i64, String> {
        let Val::Num(num) = v else {
            let hint = if text().is_some_and(|t| t.trim().parse::<i64>().is_ok()) {
                " (convert it with `tonumber`)"
            } else {
                ""
            };
            return Err(bad(hint));
        };
        // A machine integer needs no text round trip.
        let n: i64 = match num {
            fanout_expr::Num::Int(i) => *i as i64,
            _ => {
                let t = number_text(v);
                t.parse()
                    .ok()
                    .or_else(|| {
                        // 5.0 is the integer 5; 5.5 is not an integer.
                        t.parse::<f64>()
                            .ok()
                            .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                            .map(|f| f as i64)
                    })
                    .ok_or_else(|| {
                        format!("expected {}, got a number that is not one", wants(ty))
                    })?
            }
        };
        if n < min || n > max {
            return Err(format!("{} is out of the range of {}", n, ty.name()));
        }
        Ok(n)
    };
    Ok(match *ty {
        Type::BOOL => match v {
            Val::Bool(b) => Param::Bool(*b),
            _ => return Err(bad("")),
        },
        Type::INT2 => Param::I16(int(i16::MIN.into(), i16::MAX.into())? as i16),
        Type::INT4 => Param::I32(int(i32::MIN.into(), i32::MAX.into())? as i32),
        Type::INT8 => Param::I64(int(i64::MIN, i64::MAX)?),
        Type::OID => Param::I64(int(0, u32::MAX.into())?),
        Type::FLOAT4 | Type::FLOAT8 | Type::NUMERIC => {
            let Val::Num(_) = v else {
                return Err(bad(""));
            };
            let t = number_text(v);
            match *ty {
                Type::NUMERIC => Param::Numeric(t),
                _ => {
                    let f: f64 = t.parse().map_err(|_| bad(""))?;
                    if *ty == Type::FLOAT4 {
                        Param::F32(f as f32)
                    } else {
                        Param::F64(f)
                    }
                }
            }
        }
        Type::UUID => {
            let s = text().ok_or_else(|| bad(""))?;
            let u = uuid::Uuid::parse_str(s)
                .map_err(|_| format!("expected {}, got a string that is not one", wants(ty)))?;
            Param::Uuid(*u.as_bytes())
        }
        Type::JSON | Type::JSONB => {
            let mut out = Vec::with_capacity(64);
            fanout_expr::json::write(v, &mut out);
            Param::Json(out)
        }
        Type::DATE => {
            let s = text().ok_or_else(|| bad(""))?;
            let d = NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .map_err(|_| format!("expected {}, got a string that is not one", wants(ty)))?;
            Param::Date(d.num_days_from_ce() - PG_EPOCH_CE_DAYS)
        }
        Type::TIMESTAMP | Type::TIMESTAMPTZ => {
            let s = text().ok_or_else(|| bad(""))?;
            let us = parse_timestamp(s, *ty == Type::TIMESTAMPTZ)
                .ok_or_else(|| format!("expected {}, got a string that is not one", wants(ty)))?;
            Param::Timestamp(us)
        }
        Type::BYTEA => {
            let s = text().ok_or_else(|| bad(""))?;
            let b = base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|_| format!("expected {}, got a string that is not one", wants(ty)))?;
            Param::Bytes(b)
        }
        _ => match text() {
            Some(s) => Param::Text(s.to_string()),
            None => return Err(bad("")),
        },
    })
}

/// Microseconds since 2000-01-01 of an RFC 3339 date-time (`timestamptz`: converted to UTC); a
/// `timestamp` also takes one without an offset (and drops an offset's value: the column keeps
/// the wall-clock time as written).
fn parse_timestamp(s: &str, with_zone: bool) -> Option<i64> {
    let naive = match DateTime::parse_from_rfc3339(s) {
        Ok(t) if with_zone => t.naive_utc(),
        Ok(t) => t.naive_local(),
        Err(_) if !with_zone => NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
            .or_else(|_| NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f"))
            .ok()?,
        Err(_) => return None,
    };
    let t = naive.and_utc();
    (t.timestamp() - PG_EPOCH_UNIX_SECS)
        .checked_mul(1_000_000)?
        .checked_add(i64::from(t.timestamp_subsec_micros()))
}

/// NUMERIC's binary form from decimal text (`-12.3400`, `1e5`): base-10 000 digits, weight,
/// sign, display scale.
fn numeric_to_sql(text: &str, out: &mut BytesMut) -> Result<(), BoxError> {
    let bad = || -> BoxError { format!("`{text}` is not a number").into() };
    let (neg, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], rest[i + 1..].parse::<i32>().map_err(|_| bad())?),
        None => (rest, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int_part.is_empty() && frac_part.is_empty()
        || !int_part
            .bytes()
            .chain(frac_part.bytes())
            .all(|b| b.is_ascii_digit())
        || exp.abs() > 10_000
    {
        return Err(bad());
    }
    // All decimal digits, and where the decimal point falls after the exponent.
    let digits: Vec<u8> = int_part
        .bytes()
        .chain(frac_part.bytes())
        .map(|b| b - b'0')
        .collect();
    let point = int_part.len() as i32 + exp; // digits before the point
    let dscale = (frac_part.len() as i32 - exp).max(0);
    // Pad so the point falls on a base-10 000 boundary.
    let lead = (4 - point.rem_euclid(4)) % 4;
    let mut padded = vec![0u8; lead as usize];
    padded.extend_from_slice(&digits);
    while !padded.len().is_multiple_of(4) {
        padded.push(0);
    }
    let mut groups: Vec<i16> = padded
        .chunks(4)
        .map(|c| c.iter().fold(0i16, |a, d| a * 10 + i16::from(*d)))
        .collect();
    let mut weight = (point + lead) / 4 - 1;
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    let n = i16::try_from(groups.len()).map_err(|_| bad())?;
    out.put_i16(n);
    out.put_i16(i16::try_from(weight).map_err(|_| bad())?);
    out.put_u16(if neg && !groups.is_empty() { 0x4000 } else { 0 });
    out.put_u16(u16::try_from(dscale).map_err(|_| bad())?);
    for g in groups {
        out.put_i16(g);
    }
    Ok(())
}

/// NUMERIC's decimal text from its binary form, with exactly `dscale` fraction digits, as
/// Postgres prints it.
fn numeric_text(raw: &[u8], out: &mut String) -> Result<(), String> {
    let rd = |i: usize| -> Result<u16, String> {
        raw.get(i..i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "a truncated numeric".to_string())
    };
    let ndigits = rd(0)? as usize;
    let weight = rd(2)? as i16 as i32;
    let sign = rd(4)?;
    let dscale = rd(6)? as usize;
    match sign {
        0xC000 => return Err("NaN".into()),
        0xD000 => return Err("Infinity".into()),
        0xF000 => return Err("-Infinity".into()),
        _ => {}
    }
    let digit = |k: i32| -> Result<u16, String> {
        if k < 0 || k as usize >= ndigits {
            Ok(0)
        } else {
            rd(8 + 2 * k as usize)
        }
    };
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for k in 0..=weight {
            let d = digit(k)?;
            if k == 0 {
                let _ = write!(out, "{d}");
            } else {
                let _ = write!(out, "{d:04}");
            }
        }
    }
    if dscale > 0 {
        out.push('.');
        let mut frac = String::with_capacity(dscale + 4);
        let mut k = weight + 1;
        while frac.len() < dscale {
            let _ = write!(frac, "{:04}", digit(k)?);
            k += 1;
        }
        frac.truncate(dscale);
        out.push_str(&frac);
    }
    Ok(())
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    fanout_expr::json::write(&Val::from(s.to_string()), out);
}

/// One column value (`raw`: its binary wire form, `None` for NULL) of type `ty` as a value: the
/// same value its JSON ([`write_value`]) parses to — built directly for the common scalar types
/// and numeric (its exact text, also beyond the 1000 characters the JSON parser reads exactly),
/// for arrays and domains of any type from their members' values (so a numeric in an array
/// keeps its text as a numeric column does), through that JSON (in `scratch`) for the others
/// (json/jsonb nested at most `max_depth` deep, an array's dimensions included).
pub fn to_val(
    ty: &Type,
    raw: Option<&[u8]>,
    max_depth: usize,
    scratch: &mut Vec<u8>,
) -> Result<Val, String> {
    use postgres_protocol::types as t;
    let Some(raw) = raw else {
        return Ok(Val::Null);
    };
    match ty.kind() {
        Kind::Domain(inner) => return to_val(inner, Some(raw), max_depth, scratch),
        Kind::Array(member) => return array_to_val(member, raw, max_depth, scratch),
        _ => {}
    }
    let e = |x: BoxError| x.to_string();
    // Integers of up to 18 digits are what the JSON parser keeps as plain integers too.
    let int = |i: i64| {
        (i.unsigned_abs() < 1_000_000_000_000_000_000)
            .then(|| isize::try_from(i).ok())
            .flatten()
    };
    let direct = match *ty {
        Type::BOOL => Some(Val::Bool(t::bool_from_sql(raw).map_err(e)?)),
        Type::INT2 => int(i64::from(t::int2_from_sql(raw).map_err(e)?)).map(Val::from),
        Type::INT4 => int(i64::from(t::int4_from_sql(raw).map_err(e)?)).map(Val::from),
        Type::INT8 => int(t::int8_from_sql(raw).map_err(e)?).map(Val::from),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => Some(fanout_expr::json::str_val(
            t::text_from_sql(raw).map_err(e)?,
        )),
        // The exact decimal text, whatever its length (the JSON parser would read a text of
        // more than 1000 characters as a float: `1e1000` as infinity, `-1e-1000` as 0).
        // NaN, ±Infinity and malformed values: below, as their JSON is.
        Type::NUMERIC => {
            let mut s = String::with_capacity(24);
            numeric_text(raw, &mut s)
                .ok()
                .map(|()| Val::Num(fanout_expr::json::decimal_num(s)))
        }
        _ => None,
    };
    if let Some(v) = direct {
        return Ok(v);
    }
    scratch.clear();
    write_value(ty, Some(raw), scratch)?;
    fanout_expr::json::parse_limited(scratch, max_depth)
        .map_err(|e| format!("the value is not valid JSON or nests too deep: {e}"))
}

/// An array's binary wire form read: the length of each dimension and the members' bytes
/// (`None` for NULL), in row-major order.
type ArrayParts<'a> = (Vec<usize>, Vec<Option<&'a [u8]>>);

/// [`ArrayParts`] of `raw`.
fn array_parts(raw: &[u8]) -> Result<ArrayParts<'_>, String> {
    use fallible_iterator::FallibleIterator;
    let e = |x: BoxError| x.to_string();
    let arr = postgres_protocol::types::array_from_sql(raw).map_err(e)?;
    let dims: Vec<usize> = arr
        .dimensions()
        .map(|d| Ok(usize::try_from(d.len).unwrap_or(0)))
        .collect()
        .map_err(e)?;
    let values: Vec<Option<&[u8]>> = arr.values().collect().map_err(e)?;
    Ok((dims, values))
}

/// An array column's value (`member`: its members' type): nested arrays for several dimensions,
/// as [`write_value`] writes it, each member by [`to_val`].
fn array_to_val(
    member: &Type,
    raw: &[u8],
    max_depth: usize,
    scratch: &mut Vec<u8>,
) -> Result<Val, String> {
    let (dims, values) = array_parts(raw)?;
    if dims.is_empty() {
        return Ok(Val::from_iter(std::iter::empty()));
    }
    // Each dimension is one level of nesting, as the JSON parser counts it.
    let inner = max_depth.checked_sub(dims.len()).ok_or_else(|| {
        format!(
            "the value is not valid JSON or nests too deep: an array of {} dimensions",
            dims.len()
        )
    })?;
    let mut next = 0usize;
    dims_to_val(member, &dims, &values, &mut next, inner, scratch)
}

/// One dimension of an array as a value (the members from `values[*next]` on).
fn dims_to_val(
    member: &Type,
    dims: &[usize],
    values: &[Option<&[u8]>],
    next: &mut usize,
    max_depth: usize,
    scratch: &mut Vec<u8>,
) -> Result<Val, String> {
    let Some((&len, rest)) = dims.split_first() else {
        return Err("an array without dimensions".into());
    };
    // No more members than the array has (its lengths are the wire's, not to be trusted).
    let mut items = Vec::with_capacity(len.min(values.len()));
    for _ in 0..len {
        items.push(if rest.is_empty() {
            let v = values
                .get(*next)
                .ok_or("an array with fewer values than its size")?;
            *next += 1;
            to_val(member, *v, max_depth, scratch)?
        } else {
            dims_to_val(member, rest, values, next, max_depth, scratch)?
        });
    }
    Ok(Val::from_iter(items))
}

/// Write the JSON of one column value (`raw`: its binary wire form, `None` for NULL) of type
/// `ty`. `Err`: the value could not be read (a type [`supported`] rejects, or malformed bytes).
pub fn write_value(ty: &Type, raw: Option<&[u8]>, out: &mut Vec<u8>) -> Result<(), String> {
    use postgres_protocol::types as t;
    let Some(raw) = raw else {
        out.extend_from_slice(b"null");
        return Ok(());
    };
    let e = |x: BoxError| x.to_string();
    if let Kind::Domain(inner) = ty.kind() {
        return write_value(inner, Some(raw), out);
    }
    if let Kind::Enum(_) = ty.kind() {
        write_str(t::text_from_sql(raw).map_err(e)?, out);
        return Ok(());
    }
    if let Kind::Array(member) = ty.kind() {
        let (dims, values) = array_parts(raw)?;
        if dims.is_empty() {
            out.extend_from_slice(b"[]");
            return Ok(());
        }
        let mut next = 0usize;
        return write_dims(member, &dims, &values, &mut next, out);
    }
    let mut buf = itoa::Buffer::new();
    match *ty {
        Type::BOOL => out.extend_from_slice(if t::bool_from_sql(raw).map_err(e)? {
            b"true"
        } else {
            b"false"
        }),
        Type::INT2 => {
            out.extend_from_slice(buf.format(t::int2_from_sql(raw).map_err(e)?).as_bytes())
        }
        Type::INT4 => {
            out.extend_from_slice(buf.format(t::int4_from_sql(raw).map_err(e)?).as_bytes())
        }
        Type::INT8 => {
            out.extend_from_slice(buf.format(t::int8_from_sql(raw).map_err(e)?).as_bytes())
        }
        Type::OID => out.extend_from_slice(buf.format(t::oid_from_sql(raw).map_err(e)?).as_bytes()),
        Type::FLOAT4 => {
            let f = t::float4_from_sql(raw).map_err(e)?;
            if f.is_finite() {
                // The shortest text that is this f32 (`0.1`), as Postgres's to_json prints it.
                let start = out.len();
                fanout_expr::json::write_shortest_f32(f, out);
                if out[start..].ends_with(b".0") {
                    out.truncate(out.len() - 2);
                }
            } else {
                write_float(f64::from(f), out);
            }
        }
        Type::FLOAT8 => write_float(t::float8_from_sql(raw).map_err(e)?, out),
        Type::NUMERIC => {
            let mut s = String::with_capacity(24);
            match numeric_text(raw, &mut s) {
                Ok(()) => out.extend_from_slice(s.as_bytes()),
                // NaN and the infinities have no JSON number.
                Err(special) if matches!(special.as_str(), "NaN" | "Infinity" | "-Infinity") => {
                    write_str(&special, out)
                }
                Err(other) => return Err(other),
            }
        }
        Type::UUID => {
            let u = uuid::Uuid::from_bytes(t::uuid_from_sql(raw).map_err(e)?);
            write_str(&u.hyphenated().to_string(), out);
        }
        Type::JSON => out.extend_from_slice(raw),
        Type::JSONB => match raw.split_first() {
            Some((1, rest)) => out.extend_from_slice(rest),
            _ => return Err("a jsonb value of an unknown version".into()),
        },
        Type::DATE => {
            let days = t::date_from_sql(raw).map_err(e)?;
            match days {
                i32::MAX => write_str("infinity", out),
                i32::MIN => write_str("-infinity", out),
                d => {
                    let date =
                        NaiveDate::from_num_days_from_ce_opt(d.saturating_add(PG_EPOCH_CE_DAYS))
                            .ok_or("a date out of range")?;
                    write_str(
                        &format!("{:04}-{:02}-{:02}", date.year(), date.month(), date.day()),
                        out,
                    );
                }
            }
        }
        Type::TIMESTAMP | Type::TIMESTAMPTZ => {
            let us = t::timestamp_from_sql(raw).map_err(e)?;
            match us {
                i64::MAX => write_str("infinity", out),
                i64::MIN => write_str("-infinity", out),
                us => {
                    let secs = us.div_euclid(1_000_000) + PG_EPOCH_UNIX_SECS;
                    let micros = us.rem_euclid(1_000_000) as u32;
                    let t = DateTime::from_timestamp(secs, micros * 1000)
                        .ok_or("a timestamp out of range")?
                        .naive_utc();
                    let mut s = format!(
                        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
                        t.year(),
                        t.month(),
                        t.day(),
                        t.hour(),
                        t.minute(),
                        t.second()
                    );
                    if micros > 0 {
                        let f = format!("{micros:06}");
                        s.push('.');
                        s.push_str(f.trim_end_matches('0'));
                    }
                    if *ty == Type::TIMESTAMPTZ {
                        s.push('Z');
                    }
                    write_str(&s, out);
                }
            }
        }
        Type::BYTEA => write_str(&base64::engine::general_purpose::STANDARD.encode(raw), out),
        _ if supported(ty) => write_str(t::text_from_sql(raw).map_err(e)?, out),
        _ => return Err(format!("values of type {} cannot be read", ty.name())),
    }
    Ok(())
}

fn write_dims(
    member: &Type,
    dims: &[usize],
    values: &[Option<&[u8]>],
    next: &mut usize,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    out.push(b'[');
    for i in 0..dims[0] {
        if i > 0 {
            out.push(b',');
        }
        if dims.len() > 1 {
            write_dims(member, &dims[1..], values, next, out)?;
        } else {
            let v = values
                .get(*next)
                .ok_or("an array with fewer values than its size")?;
            *next += 1;
            write_value(member, *v, out)?;
        }
    }
    out.push(b']');
    Ok(())
}

fn write_float(f: f64, out: &mut Vec<u8>) {
    if f.is_finite() {
        let start = out.len();
        fanout_expr::json::write_shortest(f, out);
        if out[start..].ends_with(b".0") {
            out.truncate(out.len() - 2);
        }
    } else if f.is_nan() {
        write_str("NaN", out);
    } else if f > 0.0 {
        write_str("Infinity", out);
    } else {
        write_str("-Infinity", out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int_param(json: &str, ty: &Type) -> Result<i64, String> {
        let v = fanout_expr::json::parse(json.as_bytes()).expect("test JSON");
        match param(&v, ty)? {
            Param::I16(n) => Ok(n.into()),
            Param::I32(n) => Ok(n.into()),
            Param::I64(n) => Ok(n),
            _ => Err("not an integer parameter".into()),
        }
    }

    #[test]
    fn integer_parameters_are_checked_against_their_type_s_range() {
        for (json, ty, want) in [
            ("5", Type::INT4, Ok(5)),
            ("-32768", Type::INT2, Ok(-32768)),
            ("2147483647", Type::INT4, Ok(2_147_483_647)),
            ("9223372036854775807", Type::INT8, Ok(i64::MAX)),
            ("4294967295", Type::OID, Ok(4_294_967_295)),
            // An integral float is its integer; big integers and fractions are not.
            ("5.0", Type::INT4, Ok(5)),
            ("1e3", Type::INT8, Ok(1000)),
            (
                "32768",
                Type::INT2,
                Err("32768 is out of the range of int2"),
            ),
            (
                "-2147483649",
                Type::INT4,
                Err("-2147483649 is out of the range of int4"),
            ),
            ("-1", Type::OID, Err("-1 is out of the range of oid")),
            (
                "5.5",
                Type::INT4,
                Err("expected an integer (int4), got a number that is not one"),
            ),
            (
                "1e30",
                Type::INT8,
                Err("expected an integer (int8), got a number that is not one"),
            ),
        ] {
            let got = int_param(json, &ty);
            match want {
                Ok(n) => assert_eq!(got, Ok(n), "{json} as {ty}"),
                Err(m) => assert!(
                    got.as_ref().is_err_and(|e| e.contains(m)),
                    "{json} as {ty}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn a_column_as_a_value_is_what_its_json_parses_to() {
        use postgres_protocol::types as t;
        let mut cases: Vec<(Type, Vec<u8>)> = Vec::new();
        let mut b = BytesMut::new();
        for i in [
            0i64,
            1,
            -1,
            999_999_999_999_999_999,
            1_000_000_000_000_000_000,
            i64::MAX,
            i64::MIN,
        ] {
            b.clear();
            t::int8_to_sql(i, &mut b);
            cases.push((Type::INT8, b.to_vec()));
        }
        for i in [i32::MIN, -7, 0, i32::MAX] {
            b.clear();
            t::int4_to_sql(i, &mut b);
            cases.push((Type::INT4, b.to_vec()));
        }
        b.clear();
        t::int2_to_sql(-3, &mut b);
        cases.push((Type::INT2, b.to_vec()));
        for x in [true, false] {
            b.clear();
            t::bool_to_sql(x, &mut b);
            cases.push((Type::BOOL, b.to_vec()));
        }
        for text in [
            "",
            "plain",
            "quote \" and \\ slash",
            "пр\u{1F600}",
            "'; DROP TABLE x; --",
        ] {
            for ty in [Type::TEXT, Type::VARCHAR, Type::NAME, Type::BPCHAR] {
                cases.push((ty, text.as_bytes().to_vec()));
            }
        }
        for f in [0.5f64, -1e300, 1.0 / 3.0] {
            b.clear();
            t::float8_to_sql(f, &mut b);
            cases.push((Type::FLOAT8, b.to_vec()));
        }
        for n in ["0.00010", "123456789012345678901234567890.5"] {
            b.clear();
            numeric_to_sql(n, &mut b).unwrap();
            cases.push((Type::NUMERIC, b.to_vec()));
        }
        cases.push((
            Type::NUMERIC_ARRAY,
            numeric_array(
                &[2, 3],
                &[Some("1"), None, Some("-2.50"), Some("1e5"), None, None],
            ),
        ));
        cases.push((Type::NUMERIC_ARRAY, numeric_array(&[], &[])));
        cases.push((Type::NUMERIC_ARRAY, numeric_array(&[0], &[])));
        b.clear();
        t::array_to_sql(
            [t::ArrayDimension {
                len: 3,
                lower_bound: 1,
            }],
            Type::TEXT.oid(),
            [Some("a"), None, Some("\"q\"")].iter(),
            |m, buf| match m {
                Some(s) => {
                    t::text_to_sql(s, buf);
                    Ok(postgres_protocol::IsNull::No)
                }
                None => Ok(postgres_protocol::IsNull::Yes),
            },
            &mut b,
        )
        .unwrap();
        cases.push((Type::TEXT_ARRAY, b.to_vec()));
        b.clear();
        t::array_to_sql(
            [t::ArrayDimension {
                len: 2,
                lower_bound: 1,
            }],
            Type::JSONB.oid(),
            [&b"\x01{\"a\": [1]}"[..], b"\x01null"].iter(),
            |m, buf| {
                buf.extend_from_slice(m);
                Ok(postgres_protocol::IsNull::No)
            },
            &mut b,
        )
        .unwrap();
        cases.push((Type::JSONB_ARRAY, b.to_vec()));
        cases.push((Type::JSONB, b"\x01{\"a\": [1, 2.50, null]}".to_vec()));
        cases.push((Type::JSON, b"[{\"b\": \"c\"}]".to_vec()));
        let mut scratch = Vec::new();
        for (ty, raw) in &cases {
            let mut json = Vec::new();
            write_value(ty, Some(raw), &mut json).unwrap();
            let want = fanout_expr::json::parse(&json).unwrap();
            let got = to_val(ty, Some(raw), 64, &mut scratch).unwrap();
            assert_eq!(
                fanout_expr::json::to_string(&got),
                fanout_expr::json::to_string(&want),
                "{ty}"
            );
            assert_eq!(got, want, "{ty}");
        }
        assert_eq!(
            to_val(&Type::TEXT, None, 64, &mut scratch).unwrap(),
            Val::Null
        );
        let deep = format!("\x01{}{}", "[".repeat(10), "]".repeat(10));
        assert!(to_val(&Type::JSONB, Some(deep.as_bytes()), 5, &mut scratch).is_err());
    }

    fn numeric_round_trip(text: &str) -> String {
        let mut b = BytesMut::new();
        numeric_to_sql(text, &mut b).unwrap();
        let mut s = String::new();
        numeric_text(&b, &mut s).unwrap();
        s
    }

    #[test]
    fn numerics_keep_their_digits() {
        for (input, want) in [
            ("0", "0"),
            ("1", "1"),
            ("-1", "-1"),
            ("12345678.9", "12345678.9"),
            ("0.0001", "0.0001"),
            ("0.00010", "0.00010"),
            ("-12.3400", "-12.3400"),
            ("10000", "10000"),
            (
                "123456789012345678901234567890.123456789",
                "123456789012345678901234567890.123456789",
            ),
            ("1e5", "100000"),
            ("1.5e-3", "0.0015"),
        ] {
            assert_eq!(numeric_round_trip(input), want, "{input}");
        }
        // Any length, as a value too (the JSON parser reads more than 1000 characters as a
        // float: 1e1000 would be null, -1e-1000 a 0).
        let mut scratch = Vec::new();
        for (input, want) in [
            ("1e1000", format!("1{}", "0".repeat(1000))),
            ("-1e-1000", format!("-0.{}1", "0".repeat(999))),
        ] {
            let mut b = BytesMut::new();
            numeric_to_sql(input, &mut b).unwrap();
            let v = to_val(&Type::NUMERIC, Some(&b), 64, &mut scratch).unwrap();
            assert_eq!(fanout_expr::json::to_string(&v), want, "{input}");
        }
        // real: the shortest text of the f32, not of its f64.
        for (f, want) in [
            (0.1f32, "0.1"),
            (1.0, "1"),
            (-2.5, "-2.5"),
            (3.4028235e38, "3.4028235e38"),
        ] {
            let mut b = BytesMut::new();
            postgres_protocol::types::float4_to_sql(f, &mut b);
            let mut out = Vec::new();
            write_value(&Type::FLOAT4, Some(&b), &mut out).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
        let mut b = BytesMut::new();
        assert!(numeric_to_sql("1.2.3", &mut b).is_err());
        assert!(numeric_to_sql("abc", &mut b).is_err());
    }

    /// A `numeric[]` (or deeper) column's wire form: `dims` lengths, the members' texts in
    /// order (`None`: NULL).
    fn numeric_array(dims: &[i32], members: &[Option<&str>]) -> Vec<u8> {
        let mut out = BytesMut::new();
        postgres_protocol::types::array_to_sql(
            dims.iter()
                .map(|&len| postgres_protocol::types::ArrayDimension {
                    len,
                    lower_bound: 1,
                }),
            Type::NUMERIC.oid(),
            members.iter(),
            |m, buf| match m {
                Some(text) => {
                    numeric_to_sql(text, buf)?;
                    Ok(postgres_protocol::IsNull::No)
                }
                None => Ok(postgres_protocol::IsNull::Yes),
            },
            &mut out,
        )
        .unwrap();
        out.to_vec()
    }

    /// An array's members are what the same values are as columns: a numeric longer than the
    /// 1000 characters the JSON parser reads exactly keeps its text in an array too (it was
    /// `null`: `[null, 1.50]`), in every dimension.
    #[test]
    fn numerics_in_arrays_are_what_they_are_as_columns() {
        let long = "1e1000";
        let tiny = "-1e-1000";
        let mut scratch = Vec::new();
        let scalar = |text: &str, scratch: &mut Vec<u8>| {
            let mut b = BytesMut::new();
            numeric_to_sql(text, &mut b).unwrap();
            fanout_expr::json::to_string(&to_val(&Type::NUMERIC, Some(&b), 64, scratch).unwrap())
        };
        let (l, t) = (scalar(long, &mut scratch), scalar(tiny, &mut scratch));
        assert_eq!(l.len(), 1001);
        let one = numeric_array(&[3], &[Some(long), Some("1.50"), None]);
        let v = to_val(&Type::NUMERIC_ARRAY, Some(&one), 64, &mut scratch).unwrap();
        assert_eq!(fanout_expr::json::to_string(&v), format!("[{l},1.50,null]"),);
        let two = numeric_array(&[2, 2], &[Some(long), Some(tiny), None, Some("0.00010")]);
        let v = to_val(&Type::NUMERIC_ARRAY, Some(&two), 64, &mut scratch).unwrap();
        assert_eq!(
            fanout_expr::json::to_string(&v),
            format!("[[{l},{t}],[null,0.00010]]"),
        );
        // The answer's JSON text (large answers) writes the same digits.
        let mut json = Vec::new();
        write_value(&Type::NUMERIC_ARRAY, Some(&one), &mut json).unwrap();
        assert_eq!(String::from_utf8(json).unwrap(), format!("[{l},1.50,null]"));
    }
}
