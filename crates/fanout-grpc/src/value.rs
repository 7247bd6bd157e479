//! Protobuf ⇄ flow values ([`Val`]) without JSON text in between: what the gateway does per
//! request (a backend's answer to a step's value, a step's message to bytes, a gRPC request to
//! `$request.body`, a route's answer to bytes). The mapping is [`codec`](crate::codec)'s —
//! proto field names, defaults written, enums by name, 64-bit integers as numbers, bytes as
//! base64 — and the well-known types (`google.protobuf.*`) go through the same serde mapping
//! as there, so both paths give the same JSON. Messages are decoded and encoded by
//! prost-reflect (`DynamicMessage`); only the JSON layer is replaced by a walk over the
//! descriptor, about 5× cheaper than serde's generic path on the lab's messages
//! (`examples/codec_cost.rs`).

use bytes::Bytes;
use fanout_expr::json::u64_num;
use fanout_expr::{Map, Val, kind_phrase};
use jaq_json::{Num, Rc};
use prost::Message;
use prost_reflect::{
    DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor,
    ReflectMessage, SerializeOptions, Value,
};

/// How messages are written as JSON, by both paths (the codec's JSON and this one's well-known
/// types): proto field names, defaults written, 64-bit integers as numbers.
pub(crate) const SER: SerializeOptions = SerializeOptions::new()
    .use_proto_field_name(true)
    .skip_default_fields(false)
    .stringify_64_bit_integers(false);

/// How deep a message may nest before encoding refuses it (prost's decoder has the same bound).
const MAX_NESTING: usize = 100;

fn key(s: &str) -> Val {
    Val::utf8_str(s.as_bytes().to_vec())
}

/// Whether `b` is UTF-8. ASCII, what most protobuf strings hold, is checked a word at a time:
/// for short strings several times faster than the general validation.
fn is_utf8(b: &[u8]) -> bool {
    b.is_ascii() || std::str::from_utf8(b).is_ok()
}

fn is_well_known(d: &MessageDescriptor) -> bool {
    d.full_name().starts_with("google.protobuf.")
}

pub(crate) fn msg_to_val(msg: &DynamicMessage, depth: usize) -> Result<Val, String> {
    if depth == 0 {
        return Err("the message is nested too deeply".into());
    }
    let desc = msg.descriptor();
    if is_well_known(&desc) {
        let json = msg
            .serialize_with_options(serde_json::value::Serializer, &SER)
            .map_err(|e| e.to_string())?;
        return Ok(fanout_expr::json::from_serde(&json));
    }
    let mut out = Map::default();
    for f in desc.fields() {
        if f.supports_presence() && !msg.has_field(&f) {
            continue;
        }
        let v = msg.get_field(&f);
        out.insert(key(f.name()), field_to_val(&f, &v, depth - 1)?);
    }
    Ok(Val::obj(out))
}

fn field_to_val(f: &FieldDescriptor, v: &Value, depth: usize) -> Result<Val, String> {
    match v {
        Value::List(items) => {
            if depth == 0 {
                return Err("the message is nested too deeply".into());
            }
            let kind = f.kind();
            items
                .iter()
                .map(|x| scalar_to_val(&kind, x, depth - 1))
                .collect::<Result<Vec<_>, _>>()
                .map(|v| v.into_iter().collect())
        }
        Value::Map(entries) => {
            if depth == 0 {
                return Err("the message is nested too deeply".into());
            }
            let value_kind = match f.kind() {
                Kind::Message(entry) => entry.map_entry_value_field().kind(),
                k => k,
            };
            let mut keyed: Vec<(String, &Value)> =
                entries.iter().map(|(k, v)| (map_key_text(k), v)).collect();
            keyed.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out = Map::default();
            for (k, v) in keyed {
                out.insert(key(&k), scalar_to_val(&value_kind, v, depth - 1)?);
            }
            Ok(Val::obj(out))
        }
        v => scalar_to_val(&f.kind(), v, depth),
    }
}

fn map_key_text(k: &MapKey) -> String {
    match k {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => s.clone(),
    }
}

fn float_val(f: f64) -> Val {
    if f.is_nan() {
        key("NaN")
    } else if f.is_infinite() {
        key(if f > 0.0 { "Infinity" } else { "-Infinity" })
    } else {
        Val::Num(Num::Float(f))
    }
}

fn int_val(n: i64) -> Val {
    Val::Num(Num::from_integral(n))
}

fn scalar_to_val(kind: &Kind, v: &Value, depth: usize) -> Result<Val, String> {
    Ok(match v {
        Value::Bool(b) => Val::Bool(*b),
        Value::I32(n) => int_val(i64::from(*n)),
        Value::I64(n) => int_val(*n),
        Value::U32(n) => int_val(i64::from(*n)),
        Value::U64(n) => Val::Num(u64_num(*n)),
        Value::F32(f) => float_val(f64::from(*f)),
        Value::F64(f) => float_val(*f),
        Value::String(s) => key(s),
        Value::Bytes(b) => key(&base64_encode(b)),
        Value::EnumNumber(n) => match kind {
            Kind::Enum(e) => match e.get_value(*n) {
                Some(v) => key(v.name()),
                None => int_val(i64::from(*n)),
            },
            _ => int_val(i64::from(*n)),
        },
        Value::Message(m) => msg_to_val(m, depth)?,
        Value::List(_) | Value::Map(_) => return Err("a list inside a list".into()),
    })
}

fn text(v: &Val) -> Option<&[u8]> {
    match v {
        Val::TStr(b) | Val::BStr(b) => Some(b),
        _ => None,
    }
}

/// A well-known type (`google.protobuf.*`) from its JSON form (RFC 3339 timestamps, `"1.5s"`,
/// any JSON for Struct/Value, …), by the serde mapping.
///
/// The value goes to serde as a `serde_json::Value`, not as JSON text: serde_json reads a
/// float's text to the nearest double only with its `float_roundtrip` feature, and without it a
/// `DoubleValue` (or a Struct's number) could come out one unit in the last place off.
fn wkt_from_val(desc: &MessageDescriptor, v: &Val) -> Result<DynamicMessage, String> {
    DynamicMessage::deserialize_with_options(desc.clone(), to_serde(v), &DeserializeOptions::new())
        .map_err(|e| format!("{}: {e}", desc.full_name()))
}

/// A value as serde_json's, numbers exactly: what [`fanout_expr::json::write`] writes, read
/// back without a text parser in between (a non-finite float is `null`, as written).
fn to_serde(v: &Val) -> serde_json::Value {
    use serde_json::Value as J;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match v {
        Val::Null => J::Null,
        Val::Bool(b) => J::Bool(*b),
        Val::Num(Num::Int(i)) => J::from(*i as i64),
        Val::Num(Num::Float(f)) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Val::Num(n) => {
            // A big integer or a decimal literal: exact when it is a 64-bit integer, else the
            // nearest double (Rust's parser is exact).
            let t = n.to_string();
            if let Ok(i) = t.parse::<i64>() {
                J::from(i)
            } else if let Ok(u) = t.parse::<u64>() {
                J::from(u)
            } else {
                t.parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map_or(J::Null, J::Number)
            }
        }
        Val::TStr(b) | Val::BStr(b) => J::String(text(b)),
        Val::Arr(a) => J::Array(a.iter().map(to_serde).collect()),
        Val::Obj(o) => J::Object(
            o.iter()
                .map(|(k, x)| {
                    let k = match k {
                        Val::TStr(b) | Val::BStr(b) => text(b),
                        other => fanout_expr::json::to_string(other),
                    };
                    (k, to_serde(x))
                })
                .collect(),
        ),
    }
}

/// A number's text (integers exactly, whatever their size).
fn num_text(v: &Val) -> Option<String> {
    match v {
        Val::Num(n) => Some(n.to_string()),
        Val::TStr(b) | Val::BStr(b) => std::str::from_utf8(b).ok().map(|s| s.trim().to_string()),
        _ => None,
    }
}

fn int<T: std::str::FromStr + TryFrom<isize>>(v: &Val, what: &str) -> Result<T, String> {
    // The common case without text: an integer that fits.
    if let Val::Num(Num::Int(i)) = v
        && let Ok(n) = T::try_from(*i)
    {
        return Ok(n);
    }
    let t = num_text(v).ok_or_else(|| format!("expected {what}, got {}", kind_phrase(v)))?;
    if let Ok(n) = t.parse::<T>() {
        return Ok(n);
    }
    // `3.0` or `1e3` are integers too (proto3 JSON accepts them).
    match t.parse::<f64>() {
        Ok(f) if f.fract() == 0.0 && f.is_finite() => format!("{f:.0}")
            .parse::<T>()
            .map_err(|_| format!("{t} is out of range for {what}")),
        _ => Err(format!("expected {what}, got `{t}`")),
    }
}

fn float(v: &Val) -> Result<f64, String> {
    if let Val::Num(Num::Float(f)) = v {
        return Ok(*f);
    }
    let t = num_text(v).ok_or_else(|| format!("expected a number, got {}", kind_phrase(v)))?;
    match t.as_str() {
        "NaN" => Ok(f64::NAN),
        "Infinity" => Ok(f64::INFINITY),
        "-Infinity" => Ok(f64::NEG_INFINITY),
        t => t
            .parse()
            .map_err(|_| format!("expected a number, got `{t}`")),
    }
}

/// What the value path reads of a message type, from its descriptor, once (a codec's first
/// use): its fields with their numbers, names (also as shared key values), kinds, defaults, and
/// the plans of the message types they hold — so a message decoded or encoded per request
/// touches no descriptor lookups, hashes no field names and allocates no keys.
pub(crate) struct Plans(Vec<MsgPlan>);

impl std::fmt::Debug for Plans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Plans({} message types)", self.0.len())
    }
}

struct MsgPlan {
    desc: MessageDescriptor,
    /// `google.protobuf.*`: through `DynamicMessage` and the serde mapping.
    well_known: bool,
    fields: Vec<FieldPlan>,
    /// (number, index in `fields`), sorted by number.
    by_number: Vec<(u32, usize)>,
    /// Proto names, then JSON names, to indices in `fields` (types of many fields; a few are
    /// scanned).
    by_name: Option<std::collections::HashMap<Box<[u8]>, usize>>,
    /// Every field (its key) with the value it has when absent: its default, `[]`, `{}`, or
    /// [`wire::unset`] for a field with presence; decoding starts from a copy.
    template: Map,
    /// Some field has presence (an absent one is left out of the value).
    presence: bool,
}

struct FieldPlan {
    number: u32,
    name: Box<str>,
    json_name: Box<str>,
    /// The name as a value (an object key), shared by every message decoded.
    key: Val,
    kind: Kind,
    /// The plan of the message type of a message field or list (not of a map's entry).
    msg: Option<usize>,
    map: Option<MapPlan>,
    list: bool,
    presence: bool,
    /// The oneof the field is a member of (its index in the message's descriptor), synthetic
    /// ones (proto3 `optional`) aside.
    oneof: Option<usize>,
    /// The value of an absent singular field without presence.
    default: Val,
}

struct MapPlan {
    key: Kind,
    value: Kind,
    /// The plan of the values' message type.
    value_msg: Option<usize>,
}

impl Plans {
    /// The plans of `root` (index 0) and of every message type reachable from it.
    pub(crate) fn new(root: &MessageDescriptor) -> Plans {
        let mut index: std::collections::HashMap<String, usize> = Default::default();
        let mut todo = vec![root.clone()];
        index.insert(root.full_name().to_string(), 0);
        let mut out: Vec<MsgPlan> = Vec::new();
        let id = |m: &MessageDescriptor,
                  todo: &mut Vec<MessageDescriptor>,
                  index: &mut std::collections::HashMap<String, usize>|
         -> usize {
            if let Some(i) = index.get(m.full_name()) {
                return *i;
            }
            let i = index.len();
            index.insert(m.full_name().to_string(), i);
            todo.push(m.clone());
            i
        };
        // Breadth-first in index order: `todo` holds the types numbered but not yet planned.
        let mut next = 0;
        while next < todo.len() {
            let desc = todo[next].clone();
            next += 1;
            let well_known = is_well_known(&desc);
            let mut fields = Vec::new();
            if !well_known {
                for f in desc.fields() {
                    let kind = f.kind();
                    let (msg, map) = match &kind {
                        Kind::Message(e) if f.is_map() => {
                            let (kf, vf) = (e.map_entry_key_field(), e.map_entry_value_field());
                            let value = vf.kind();
                            let value_msg = match &value {
                                Kind::Message(m) => Some(id(m, &mut todo, &mut index)),
                                _ => None,
                            };
                            let key = kf.kind();
                            (
                                None,
                                Some(MapPlan {
                                    key,
                                    value,
                                    value_msg,
                                }),
                            )
                        }
                        Kind::Message(m) => (Some(id(m, &mut todo, &mut index)), None),
                        _ => (None, None),
                    };
                    fields.push(FieldPlan {
                        number: f.number(),
                        name: f.name().into(),
                        json_name: f.json_name().into(),
                        key: key(f.name()),
                        default: wire::default_of(&kind),
                        kind,
                        msg,
                        map,
                        list: f.is_list(),
                        presence: f.supports_presence(),
                        oneof: f
                            .containing_oneof()
                            .filter(|o| !o.is_synthetic())
                            .and_then(|o| desc.oneofs().position(|x| x.name() == o.name())),
                    });
                }
            }
            let mut by_number: Vec<(u32, usize)> = fields
                .iter()
                .enumerate()
                .map(|(i, f)| (f.number, i))
                .collect();
            by_number.sort_unstable();
            let by_name = (fields.len() > SCAN_FIELDS).then(|| {
                let mut m: std::collections::HashMap<Box<[u8]>, usize> = Default::default();
                for (i, f) in fields.iter().enumerate() {
                    m.entry(f.name.as_bytes().into()).or_insert(i);
                }
                for (i, f) in fields.iter().enumerate() {
                    m.entry(f.json_name.as_bytes().into()).or_insert(i);
                }
                m
            });
            let mut template = Map::with_capacity_and_hasher(fields.len(), Default::default());
            for f in &fields {
                let absent = if f.map.is_some() {
                    Val::obj(Map::default())
                } else if f.list {
                    Val::Arr(Default::default())
                } else if f.presence {
                    wire::unset()
                } else {
                    f.default.clone()
                };
                template.insert(f.key.clone(), absent);
            }
            let presence = fields
                .iter()
                .any(|f| f.presence && f.map.is_none() && !f.list);
            out.push(MsgPlan {
                desc,
                well_known,
                fields,
                by_number,
                by_name,
                template,
                presence,
            });
        }
        Plans(out)
    }

    fn get(&self, i: usize) -> Result<&MsgPlan, String> {
        self.0
            .get(i)
            .ok_or_else(|| "a message type without a plan".to_string())
    }
}

impl MsgPlan {
    fn by_number(&self, n: u32) -> Option<usize> {
        if self.by_number.len() <= SCAN_FIELDS {
            return self
                .by_number
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, i)| *i);
        }
        self.by_number
            .binary_search_by_key(&n, |(k, _)| *k)
            .ok()
            .and_then(|j| self.by_number.get(j))
            .map(|(_, i)| *i)
    }

    /// The field named `name` (as [`MsgPlan::by_name`]) for an object's `i`-th key: the `i`-th
    /// field is tried first — an object decoded from this type, or written in the `.proto`'s
    /// order, finds each field with one comparison.
    fn by_name_at(&self, i: usize, name: &[u8]) -> Option<&FieldPlan> {
        match self.fields.get(i) {
            Some(f) if f.name.as_bytes() == name => Some(f),
            _ => self.by_name(name),
        }
    }

    /// A field by proto name, else by JSON name (as prost-reflect's lookups, in that order).
    fn by_name(&self, name: &[u8]) -> Option<&FieldPlan> {
        match &self.by_name {
            Some(m) => m.get(name).and_then(|i| self.fields.get(*i)),
            None => self
                .fields
                .iter()
                .find(|f| f.name.as_bytes() == name)
                .or_else(|| self.fields.iter().find(|f| f.json_name.as_bytes() == name)),
        }
    }
}

/// Message types of up to this many fields are searched by scanning them.
const SCAN_FIELDS: usize = 16;

/// The direct protobuf wire codec: values read and written field by field from the
/// descriptor, no `DynamicMessage` (the well-known types excepted).
pub(crate) mod wire {
    use super::*;
    use prost::bytes::Buf;
    use prost::encoding::{decode_varint, encode_varint};

    fn dyn_wkt_decode(m: &MessageDescriptor, b: &[u8], depth: usize) -> Result<Val, String> {
        let msg = DynamicMessage::decode(m.clone(), b).map_err(|e| e.to_string())?;
        msg_to_val(&msg, depth)
    }

    /// Decode one message of the type `plans[p]`: into a copy of the type's template (every
    /// field with its default, in field order), each field found replacing its value in place
    /// (by position: no key is hashed); absent fields with presence are then left out.
    pub(crate) fn decode(
        plans: &Plans,
        p: usize,
        mut buf: &[u8],
        depth: usize,
    ) -> Result<Val, String> {
        if depth == 0 {
            return Err("the message is nested too deeply".into());
        }
        let mp = plans.get(p)?;
        if mp.well_known {
            return dyn_wkt_decode(&mp.desc, buf, depth);
        }
        let fields = &mp.fields;
        let mut out = mp.template.clone();
        let mut maps = false;
        while buf.has_remaining() {
            let (number, wt) = tag(&mut buf)?;
            let Some(i) = mp.by_number(number) else {
                skip(wt, &mut buf)?;
                continue;
            };
            let (Some(f), Some((_, slot))) = (fields.get(i), out.get_index_mut(i)) else {
                skip(wt, &mut buf)?;
                continue;
            };
            if let Some(mplan) = &f.map {
                let entry = len_delimited(wt, &mut buf)?;
                let (k, v) = map_entry(plans, mplan, entry, depth)?;
                if let Val::Obj(m) = slot {
                    Rc::make_mut(m).insert(k, v);
                    maps = true;
                }
            } else if f.list {
                let Val::Arr(list) = slot else {
                    continue;
                };
                let list = Rc::make_mut(list);
                if wt == 2 && packable(&f.kind) {
                    let mut packed = len_delimited(wt, &mut buf)?;
                    let w = if matches!(f.kind, Kind::Fixed32 | Kind::Sfixed32 | Kind::Float) {
                        5
                    } else if matches!(f.kind, Kind::Fixed64 | Kind::Sfixed64 | Kind::Double) {
                        1
                    } else {
                        0
                    };
                    while packed.has_remaining() {
                        list.push(element(plans, &f.kind, f.msg, w, &mut packed, depth)?);
                    }
                } else {
                    list.push(element(plans, &f.kind, f.msg, wt, &mut buf, depth)?);
                }
            } else {
                if f.msg.is_some() && !is_unset(slot) {
                    // The second occurrence of a message field: merged with the first.
                    return Err(MERGE.into());
                }
                *slot = element(plans, &f.kind, f.msg, wt, &mut buf, depth)?;
                if let Some(o) = f.oneof {
                    // The last member of a oneof on the wire is the one set.
                    for (g, (_, other)) in fields.iter().zip(out.iter_mut()) {
                        if g.oneof == Some(o) && g.number != f.number {
                            *other = unset();
                        }
                    }
                }
            }
        }
        if maps {
            // Keys in order, as the `DynamicMessage` path gives them.
            for (f, (_, v)) in fields.iter().zip(out.iter_mut()) {
                if let (Some(_), Val::Obj(m)) = (&f.map, v) {
                    Rc::make_mut(m).sort_unstable_by(|a, _, b, _| a.cmp(b));
                }
            }
        }
        if mp.presence {
            out.retain(|_, v| !is_unset(v));
        }
        Ok(Val::obj(out))
    }

    /// The error [`decode`] stops with at a message field met twice.
    pub(crate) const MERGE: &str = "a message field occurs twice (merged)";

    /// The template's value of an absent field with presence: a byte string, which decoding
    /// never makes (strings and bytes decode to text strings).
    pub(super) fn unset() -> Val {
        Val::BStr(Rc::new(Bytes::new()))
    }

    fn is_unset(v: &Val) -> bool {
        matches!(v, Val::BStr(_))
    }

    pub(super) fn default_of(kind: &Kind) -> Val {
        match kind {
            Kind::Bool => Val::Bool(false),
            Kind::String | Kind::Bytes => key(""),
            Kind::Float | Kind::Double => Val::Num(Num::Float(0.0)),
            Kind::Enum(e) => match e.get_value(0) {
                Some(v) => key(v.name()),
                None => int_val(0),
            },
            Kind::Message(_) => Val::Null,
            _ => int_val(0),
        }
    }

    fn packable(kind: &Kind) -> bool {
        !matches!(kind, Kind::String | Kind::Bytes | Kind::Message(_))
    }

    fn len_delimited<'a>(wt: u8, buf: &mut &'a [u8]) -> Result<&'a [u8], String> {
        if wt != 2 {
            return Err(format!(
                "wire type {wt} where a length-delimited field was expected"
            ));
        }
        let len = decode_varint(buf).map_err(|e| e.to_string())?;
        let len = usize::try_from(len).map_err(|_| "a length beyond the message".to_string())?;
        if len > buf.len() {
            return Err("a length beyond the message".into());
        }
        let (head, tail) = buf.split_at(len);
        *buf = tail;
        Ok(head)
    }

    fn skip(wt: u8, buf: &mut &[u8]) -> Result<(), String> {
        let n = match wt {
            0 => {
                decode_varint(buf).map_err(|e| e.to_string())?;
                0
            }
            1 => 8,
            5 => 4,
            2 => {
                len_delimited(wt, buf)?;
                0
            }
            _ => {
                return Err(format!(
                    "unsupported wire type {wt} (groups are not supported)"
                ));
            }
        };
        if n > buf.len() {
            return Err("a field beyond the message".into());
        }
        buf.advance(n);
        Ok(())
    }

    fn fixed<const N: usize>(buf: &mut &[u8]) -> Result<[u8; N], String> {
        if buf.len() < N {
            return Err("a field beyond the message".into());
        }
        let mut a = [0u8; N];
        a.copy_from_slice(&buf[..N]);
        buf.advance(N);
        Ok(a)
    }

    /// One value of a field of kind `kind` (`msg`: the plan of its message type).
    fn element(
        plans: &Plans,
        kind: &Kind,
        msg: Option<usize>,
        wt: u8,
        buf: &mut &[u8],
        depth: usize,
    ) -> Result<Val, String> {
        let want = match kind {
            Kind::Fixed32 | Kind::Sfixed32 | Kind::Float => 5,
            Kind::Fixed64 | Kind::Sfixed64 | Kind::Double => 1,
            Kind::String | Kind::Bytes | Kind::Message(_) => 2,
            _ => 0,
        };
        if wt != want {
            return Err(format!("wire type {wt} for a field of wire type {want}"));
        }
        Ok(match kind {
            Kind::Int32 => int_val(i64::from(varint(buf)? as i32)),
            Kind::Int64 => int_val(varint(buf)? as i64),
            Kind::Uint32 => int_val(i64::from(varint(buf)? as u32)),
            Kind::Uint64 => Val::Num(u64_num(varint(buf)?)),
            Kind::Sint32 => {
                let v = varint(buf)? as u32;
                int_val(i64::from(((v >> 1) as i32) ^ -((v & 1) as i32)))
            }
            Kind::Sint64 => {
                let v = varint(buf)?;
                int_val(((v >> 1) as i64) ^ -((v & 1) as i64))
            }
            Kind::Bool => Val::Bool(varint(buf)? != 0),
            Kind::Enum(e) => {
                let n = varint(buf)? as i32;
                match e.get_value(n) {
                    Some(v) => key(v.name()),
                    None => int_val(i64::from(n)),
                }
            }
            Kind::Fixed32 => int_val(i64::from(u32::from_le_bytes(fixed(buf)?))),
            Kind::Sfixed32 => int_val(i64::from(i32::from_le_bytes(fixed(buf)?))),
            Kind::Float => float_val(f64::from(f32::from_le_bytes(fixed(buf)?))),
            Kind::Fixed64 => Val::Num(u64_num(u64::from_le_bytes(fixed(buf)?))),
            Kind::Sfixed64 => int_val(i64::from_le_bytes(fixed(buf)?)),
            Kind::Double => float_val(f64::from_le_bytes(fixed(buf)?)),
            Kind::String => {
                let b = len_delimited(wt, buf)?;
                if !is_utf8(b) {
                    return Err("a string that is not UTF-8".into());
                }
                Val::utf8_str(b.to_vec())
            }
            Kind::Bytes => key(&base64_encode(len_delimited(wt, buf)?)),
            Kind::Message(_) => {
                let i = msg.ok_or("a message field without a plan")?;
                decode(plans, i, len_delimited(wt, buf)?, depth - 1)?
            }
        })
    }

    /// A field's key: its number and wire type. Refused as prost refuses it: a key beyond 32
    /// bits, field number 0.
    fn tag(buf: &mut &[u8]) -> Result<(u32, u8), String> {
        let key = varint(buf)?;
        let Ok(key) = u32::try_from(key) else {
            return Err(format!("invalid key value: {key}"));
        };
        if key >> 3 == 0 {
            return Err("invalid tag value: 0".into());
        }
        Ok((key >> 3, (key & 7) as u8))
    }

    fn varint(buf: &mut &[u8]) -> Result<u64, String> {
        decode_varint(buf).map_err(|e| e.to_string())
    }

    fn map_entry(
        plans: &Plans,
        e: &MapPlan,
        mut b: &[u8],
        depth: usize,
    ) -> Result<(Val, Val), String> {
        let (kk, vk) = (&e.key, &e.value);
        let mut k = None;
        let mut v = None;
        while b.has_remaining() {
            let (number, wt) = tag(&mut b)?;
            match number {
                1 => k = Some(element(plans, kk, None, wt, &mut b, depth)?),
                // A message value twice: merged, as a message field met twice.
                2 if v.is_some() && e.value_msg.is_some() => return Err(MERGE.into()),
                2 => v = Some(element(plans, vk, e.value_msg, wt, &mut b, depth)?),
                _ => skip(wt, &mut b)?,
            }
        }
        let k = match k.unwrap_or_else(|| default_of(kk)) {
            s @ (Val::TStr(_) | Val::BStr(_)) => s,
            other => key(&fanout_expr::json::to_string(&other)),
        };
        let v = match v {
            Some(v) => v,
            None => match e.value_msg {
                Some(i) => decode(plans, i, &[], depth)?,
                None => default_of(vk),
            },
        };
        Ok((k, v))
    }

    fn put_key(number: u32, wt: u8, out: &mut Vec<u8>) {
        encode_varint((u64::from(number) << 3) | u64::from(wt), out);
    }

    fn put_len(body: &[u8], out: &mut Vec<u8>) {
        encode_varint(body.len() as u64, out);
        out.extend_from_slice(body);
    }

    /// Encode one message of the type `plans[p]` (an object value; null is the empty message).
    pub(crate) fn encode(
        plans: &Plans,
        p: usize,
        v: &Val,
        depth: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        if depth > MAX_NESTING {
            return Err("the message is nested too deeply".into());
        }
        let mp = plans.get(p)?;
        if mp.well_known {
            let msg = wkt_from_val(&mp.desc, v)?;
            let _ = msg.encode(out);
            return Ok(());
        }
        let obj = match v {
            Val::Null => return Ok(()),
            Val::Obj(o) => o,
            other => {
                return Err(format!(
                    "expected an object for {}, got {}",
                    mp.desc.full_name(),
                    kind_phrase(other)
                ));
            }
        };
        for (i, (k, fv)) in obj.iter().enumerate() {
            let Some(name) = text(k) else {
                return Err("a key that is not a string".into());
            };
            // Field names are UTF-8: a key that is not matches none.
            let Some(f) = mp.by_name_at(i, name) else {
                return Err(match std::str::from_utf8(name) {
                    Ok(name) => format!("unrecognized field name '{name}'"),
                    Err(_) => "a key that is not a string".into(),
                });
            };
            if matches!(fv, Val::Null) {
                continue;
            }
            field(plans, f, fv, depth, out)
                .map_err(|e| format!("field `{}`: {e}", String::from_utf8_lossy(name)))?;
        }
        Ok(())
    }

    fn field(
        plans: &Plans,
        f: &FieldPlan,
        v: &Val,
        depth: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let kind = &f.kind;
        if let Some(mplan) = &f.map {
            let Val::Obj(o) = v else {
                return Err(format!(
                    "expected an object (a map), got {}",
                    kind_phrase(v)
                ));
            };
            let (kk, vk) = (&mplan.key, &mplan.value);
            let mut body = Vec::new();
            for (mk, mv) in o.iter() {
                let ks = text(mk)
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .ok_or("a map key that is not a string")?;
                body.clear();
                let key_val = match kk {
                    Kind::String => mk.clone(),
                    Kind::Bool => Val::Bool(
                        ks.parse()
                            .map_err(|_| format!("map key `{ks}` is not a bool"))?,
                    ),
                    // integer keys by their text: exact for all 64 bits
                    _ => mk.clone(),
                };
                value(plans, kk, None, 1, &key_val, depth, &mut body)?;
                if !matches!(mv, Val::Null) {
                    value(plans, vk, mplan.value_msg, 2, mv, depth, &mut body)?;
                }
                put_key(f.number, 2, out);
                put_len(&body, out);
            }
            return Ok(());
        }
        if f.list {
            let Val::Arr(a) = v else {
                return Err(format!("expected an array, got {}", kind_phrase(v)));
            };
            if packable(kind) {
                if a.is_empty() {
                    return Ok(());
                }
                let mut body = Vec::with_capacity(a.len() * 4);
                for x in a.iter() {
                    raw(kind, x, &mut body)?;
                }
                put_key(f.number, 2, out);
                put_len(&body, out);
            } else {
                for x in a.iter() {
                    value(plans, kind, f.msg, f.number, x, depth, out)?;
                }
            }
            return Ok(());
        }
        value(plans, kind, f.msg, f.number, v, depth, out)
    }

    /// One tagged value.
    fn value(
        plans: &Plans,
        kind: &Kind,
        msg: Option<usize>,
        number: u32,
        v: &Val,
        depth: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        match kind {
            Kind::String => {
                let Some(b) = text(v) else {
                    return Err(format!("expected a string, got {}", kind_phrase(v)));
                };
                if !is_utf8(b) {
                    return Err("a string that is not UTF-8".into());
                }
                put_key(number, 2, out);
                put_len(b, out);
            }
            Kind::Bytes => {
                let Some(b) = text(v) else {
                    return Err(format!("expected a base64 string, got {}", kind_phrase(v)));
                };
                let raw = base64_decode(b).ok_or("expected base64 for a bytes field")?;
                put_key(number, 2, out);
                put_len(&raw, out);
            }
            Kind::Message(_) => {
                let i = msg.ok_or("a message field without a plan")?;
                put_key(number, 2, out);
                // The body in place after a one-byte length, which a body of 128 bytes or more
                // makes room for afterwards (copying as much as writing it elsewhere would).
                let at = out.len();
                out.push(0);
                encode(plans, i, v, depth + 1, out)?;
                let len = out.len() - at - 1;
                if len < 128 {
                    out[at] = len as u8;
                } else {
                    let mut prefix = Vec::with_capacity(10);
                    encode_varint(len as u64, &mut prefix);
                    out.splice(at..at + 1, prefix);
                }
            }
            Kind::Fixed32 | Kind::Sfixed32 | Kind::Float => {
                put_key(number, 5, out);
                raw(kind, v, out)?;
            }
            Kind::Fixed64 | Kind::Sfixed64 | Kind::Double => {
                put_key(number, 1, out);
                raw(kind, v, out)?;
            }
            _ => {
                put_key(number, 0, out);
                raw(kind, v, out)?;
            }
        }
        Ok(())
    }

    /// A scalar's bytes without its tag (also the elements of packed lists).
    fn raw(kind: &Kind, v: &Val, out: &mut Vec<u8>) -> Result<(), String> {
        match kind {
            Kind::Int32 => encode_varint(i64::from(int::<i32>(v, "a 32-bit integer")?) as u64, out),
            Kind::Int64 => encode_varint(int::<i64>(v, "a 64-bit integer")? as u64, out),
            Kind::Uint32 => {
                encode_varint(u64::from(int::<u32>(v, "an unsigned 32-bit integer")?), out)
            }
            Kind::Uint64 => encode_varint(int::<u64>(v, "an unsigned 64-bit integer")?, out),
            Kind::Sint32 => {
                let n = int::<i32>(v, "a 32-bit integer")?;
                encode_varint(u64::from(((n << 1) ^ (n >> 31)) as u32), out)
            }
            Kind::Sint64 => {
                let n = int::<i64>(v, "a 64-bit integer")?;
                encode_varint(((n << 1) ^ (n >> 63)) as u64, out)
            }
            Kind::Bool => match v {
                Val::Bool(b) => encode_varint(u64::from(*b), out),
                other => return Err(format!("expected a boolean, got {}", kind_phrase(other))),
            },
            Kind::Enum(e) => {
                let n = match v {
                    Val::TStr(b) | Val::BStr(b) => {
                        let name = std::str::from_utf8(b).unwrap_or("");
                        e.get_value_by_name(name)
                            .ok_or_else(|| format!("`{name}` is not a value of {}", e.full_name()))?
                            .number()
                    }
                    Val::Num(_) => int::<i32>(v, "an enum number")?,
                    other => {
                        return Err(format!("expected an enum name, got {}", kind_phrase(other)));
                    }
                };
                encode_varint(i64::from(n) as u64, out)
            }
            Kind::Fixed32 => {
                out.extend_from_slice(&int::<u32>(v, "an unsigned 32-bit integer")?.to_le_bytes())
            }
            Kind::Sfixed32 => {
                out.extend_from_slice(&int::<i32>(v, "a 32-bit integer")?.to_le_bytes())
            }
            Kind::Float => out.extend_from_slice(&(float(v)? as f32).to_le_bytes()),
            Kind::Fixed64 => {
                out.extend_from_slice(&int::<u64>(v, "an unsigned 64-bit integer")?.to_le_bytes())
            }
            Kind::Sfixed64 => {
                out.extend_from_slice(&int::<i64>(v, "a 64-bit integer")?.to_le_bytes())
            }
            Kind::Double => out.extend_from_slice(&float(v)?.to_le_bytes()),
            Kind::String | Kind::Bytes | Kind::Message(_) => {
                return Err("a length-delimited value in a packed list".into());
            }
        }
        Ok(())
    }
}

/// Decoding accepts padded or unpadded input, and ignores bits after the last whole byte (as
/// protobuf's own JSON readers do).
const B64_DECODE: base64::engine::GeneralPurposeConfig =
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
const B64_STANDARD: base64::engine::GeneralPurpose =
    base64::engine::GeneralPurpose::new(&base64::alphabet::STANDARD, B64_DECODE);
const B64_URL_SAFE: base64::engine::GeneralPurpose =
    base64::engine::GeneralPurpose::new(&base64::alphabet::URL_SAFE, B64_DECODE);

/// Standard base64 with padding (proto3 JSON's form of `bytes`).
pub(crate) fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Standard or URL-safe base64, padded or not (proto3 JSON accepts either).
pub(crate) fn base64_decode(s: &[u8]) -> Option<Bytes> {
    use base64::Engine;
    let url_safe = s.iter().any(|&c| c == b'-' || c == b'_');
    let engine = if url_safe {
        &B64_URL_SAFE
    } else {
        &B64_STANDARD
    };
    engine.decode(s).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trip() {
        for b in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"fooba",
            b"foobar",
            &[0xff, 0xfe],
        ] {
            let e = base64_encode(b);
            assert_eq!(&base64_decode(e.as_bytes()).unwrap()[..], b, "{e}");
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(&base64_decode(b"_-8").unwrap()[..], &[0xff, 0xef][..]);
        assert!(base64_decode(b"a b").is_none());
    }
}
