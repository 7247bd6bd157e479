//! One message type mapped between protobuf bytes and JSON — the proto3 JSON mapping
//! (prost-reflect) with the options fanout uses everywhere:
//!
//! - **written** (answers and requests as flows see them): proto field names (`user_id`, as in
//!   the `.proto`), every field with its default value (`0`, `""`, `[]`; unset message fields
//!   are left out), enums by name, 64-bit integers as JSON numbers (not strings), well-known
//!   types in their JSON forms (`Timestamp` as RFC 3339, …);
//! - **read** (messages built by flows and stubs): both proto and lowerCamelCase names, enums by
//!   name or number, 64-bit integers as numbers or strings, `null` for a default; a field the
//!   message does not have is an error naming it.
//!
//! Depth is bounded on both sides: protobuf decoding by prost's recursion limit (100), JSON by
//! serde_json's (128).

use crate::value::{SER, msg_to_val, wire};
use fanout_expr::Val;
use prost::Message;
use prost_reflect::{DeserializeOptions, DynamicMessage, MessageDescriptor};

/// A message that could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// JSON that does not fit the message type (an unknown field, a wrong type, bad JSON).
    #[error("{message}: {detail}")]
    Json {
        /// The message type's full name.
        message: String,
        /// What does not fit.
        detail: String,
    },
    /// Bytes that are not a valid protobuf encoding of the message type.
    #[error("invalid protobuf for {message}: {detail}")]
    Proto {
        /// The message type's full name.
        message: String,
        /// The decoder's error.
        detail: String,
    },
}

const DE: DeserializeOptions = DeserializeOptions::new().deny_unknown_fields(true);

/// Converts one message type between protobuf and JSON (module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct MessageCodec {
    desc: MessageDescriptor,
    /// What the value path reads of this type and the types it contains, made on first use
    /// (shared by clones).
    plans: std::sync::Arc<std::sync::OnceLock<crate::value::Plans>>,
}

impl PartialEq for MessageCodec {
    fn eq(&self, other: &Self) -> bool {
        self.desc == other.desc
    }
}

impl Eq for MessageCodec {}

impl MessageCodec {
    /// The codec of a message type.
    pub fn new(desc: MessageDescriptor) -> MessageCodec {
        MessageCodec {
            desc,
            plans: Default::default(),
        }
    }

    /// The value path's plans ([`crate::value::Plans`]), made on first use.
    pub(crate) fn plans(&self) -> &crate::value::Plans {
        self.plans
            .get_or_init(|| crate::value::Plans::new(&self.desc))
    }

    /// The message type's full name (`pkg.User`).
    pub fn name(&self) -> &str {
        self.desc.full_name()
    }

    /// The message type.
    pub fn descriptor(&self) -> &MessageDescriptor {
        &self.desc
    }

    /// JSON → protobuf, appended to `out` (which may already hold a frame header).
    pub fn json_to_proto_into(&self, json: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        let msg = self.from_json(json)?;
        out.reserve(msg.encoded_len());
        // Encoding into a Vec cannot run out of room.
        let _ = msg.encode(out);
        Ok(())
    }

    /// JSON → protobuf.
    pub fn json_to_proto(&self, json: &[u8]) -> Result<Vec<u8>, CodecError> {
        let mut out = Vec::new();
        self.json_to_proto_into(json, &mut out)?;
        Ok(out)
    }

    /// JSON → the message (checks it against the type).
    pub fn from_json(&self, json: &[u8]) -> Result<DynamicMessage, CodecError> {
        let mut de = serde_json::Deserializer::from_slice(json);
        let msg = DynamicMessage::deserialize_with_options(self.desc.clone(), &mut de, &DE)
            .and_then(|m| de.end().map(|()| m))
            .map_err(|e| CodecError::Json {
                message: self.desc.full_name().to_string(),
                detail: json_detail(&e),
            })?;
        Ok(msg)
    }

    /// Protobuf → JSON, appended to `out`.
    pub fn proto_to_json_into(&self, proto: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        let msg =
            DynamicMessage::decode(self.desc.clone(), proto).map_err(|e| CodecError::Proto {
                message: self.desc.full_name().to_string(),
                detail: e.to_string(),
            })?;
        let mut ser = serde_json::Serializer::new(out);
        msg.serialize_with_options(&mut ser, &SER)
            .map_err(|e| CodecError::Proto {
                message: self.desc.full_name().to_string(),
                detail: e.to_string(),
            })
    }

    /// Protobuf → JSON.
    pub fn proto_to_json(&self, proto: &[u8]) -> Result<Vec<u8>, CodecError> {
        let mut out = Vec::with_capacity(proto.len() * 2 + 16);
        self.proto_to_json_into(proto, &mut out)?;
        Ok(out)
    }
}

/// One field of a message type, as a config check sees it.
#[derive(Debug, Clone)]
pub struct FieldInfo {
    /// The field's proto name.
    pub name: String,
    /// The field's message type, when it is a singular or repeated message field whose JSON
    /// form is an object with the message's fields (not a map, not a well-known type with a
    /// JSON form of its own).
    pub message: Option<MessageCodec>,
}

impl MessageCodec {
    /// The field named `name` (proto name or lowerCamelCase JSON name).
    pub fn field(&self, name: &str) -> Option<FieldInfo> {
        let f = self
            .desc
            .get_field_by_name(name)
            .or_else(|| self.desc.get_field_by_json_name(name))?;
        let message = match f.kind() {
            prost_reflect::Kind::Message(m)
                if !f.is_map() && !m.full_name().starts_with("google.protobuf.") =>
            {
                Some(MessageCodec::new(m))
            }
            _ => None,
        };
        Some(FieldInfo {
            name: f.name().to_string(),
            message,
        })
    }

    /// Every field's proto name, in field order.
    pub fn field_names(&self) -> Vec<String> {
        self.desc.fields().map(|f| f.name().to_string()).collect()
    }

    /// Whether any key is a valid JSON form of this type (`google.protobuf.Struct`, `Value`,
    /// `Any`, …): such messages are not checked by their keys.
    pub fn is_well_known(&self) -> bool {
        self.desc.full_name().starts_with("google.protobuf.")
    }
}

/// serde_json's message without the position in our own generated JSON (it means nothing to
/// the reader): "unknown field `x`, expected one of …".
fn json_detail(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) if e.line() > 0 => s[..i].to_string(),
        _ => s,
    }
}

/// The value path ([`crate::value`]): protobuf ⇄ [`Val`] without JSON text in between.
impl MessageCodec {
    /// Protobuf → value (at most `max_depth` levels of objects and arrays).
    ///
    /// A message field that occurs more than once (protobuf merges the occurrences: a valid
    /// encoding, though no encoder writes one), and a well-known type's value out of range for
    /// its JSON form (a later field may replace it), are decoded through `DynamicMessage`.
    pub fn decode_val(&self, proto: &[u8], max_depth: usize) -> Result<Val, CodecError> {
        match wire::decode(self.plans(), 0, proto, max_depth) {
            Ok(v) => Ok(v),
            Err(detail) if detail == wire::MERGE || detail == wire::REFERENCE => {
                self.decode_val_dynamic(proto, max_depth)
            }
            Err(detail) => Err(CodecError::Proto {
                message: self.name().to_string(),
                detail,
            }),
        }
    }

    /// Value → protobuf, appended to `out`; a key the type does not have is an error naming it
    /// (`unrecognized field name 'x'`, as the JSON path says).
    pub fn encode_val(&self, v: &Val, out: &mut Vec<u8>) -> Result<(), CodecError> {
        wire::encode(self.plans(), 0, v, 0, out).map_err(|detail| CodecError::Json {
            message: self.name().to_string(),
            detail,
        })
    }

    /// [`MessageCodec::decode_val`] through prost-reflect's `DynamicMessage` (the reference the
    /// direct path is tested against).
    pub fn decode_val_dynamic(&self, proto: &[u8], max_depth: usize) -> Result<Val, CodecError> {
        let msg = DynamicMessage::decode(self.descriptor().clone(), proto).map_err(|e| {
            CodecError::Proto {
                message: self.name().to_string(),
                detail: e.to_string(),
            }
        })?;
        msg_to_val(&msg, max_depth).map_err(|detail| CodecError::Proto {
            message: self.name().to_string(),
            detail,
        })
    }
}
