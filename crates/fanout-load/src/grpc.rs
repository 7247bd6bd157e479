//! Unary gRPC targets: request templates built from `.proto` files and a JSON message, and the
//! verdict on each answer.
//!
//! A gRPC call is an HTTP/2 `POST /package.Service/Method` with `content-type: application/grpc`,
//! `te: trailers` and a body of one length-prefixed protobuf message; the answer's outcome is the
//! `grpc-status` in its trailers (or in its headers, for a trailers-only answer). [`grpc_request`]
//! builds such a [`RequestTemplate`] once — the message is encoded and framed when the template
//! is made, never per request — and a [`crate::LoadSpec`] with [`crate::Protocol::Grpc`] sends
//! it over h2c and judges every answer by its code:
//!
//! - `OK` on a 2xx answer is a success (`ok`); any other code is an error, counted by its name in
//!   [`crate::LoadReport::grpc_status`] (`OK` is counted there too), so `error_rate` and the
//!   `errors<…` threshold include it;
//! - `RESOURCE_EXHAUSTED` and `UNAVAILABLE` (the codes of 429 and 503) are also `rejected`;
//! - an answer without `grpc-status` is counted under the code a gRPC client reports for its
//!   HTTP status ([`Code::for_http_status`], gRPC's `http-grpc-status-mapping`: a 200 without a
//!   status is `UNKNOWN`), and in [`crate::LoadReport::grpc_missing_status`].
//!
//! HTTP status classes are recorded as for HTTP targets.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use fanout_load::{LoadSpec, Protocol, Schedule, grpc_request, load_protos};
//! use std::path::PathBuf;
//! let protos = load_protos(&[PathBuf::from("protos/demo.proto")], &[])?;
//! let template = grpc_request(&protos, "demo.v1.Users/GetUser", r#"{"id": "u1"}"#, &[])?;
//! let mut spec = LoadSpec::new("http://127.0.0.1:8080", Schedule::parse("const(1000,30s)")?);
//! spec.protocol = Protocol::Grpc;
//! spec.requests = vec![template];
//! # Ok(()) }
//! ```

use crate::RequestTemplate;
use crate::recorder::{GRPC_CODES, GrpcAnswer};
use bytes::Bytes;
use fanout_grpc::{CodecError, MessageCodec, MethodLookupError, frame};
use http::header::{HeaderName, HeaderValue};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use fanout_grpc::{Code, ProtoError, ProtoLimits, ProtoSet};

/// The trailer (or trailers-only header) carrying an answer's gRPC status.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// Headers a gRPC request sets itself; metadata may not override them.
const RESERVED: [&str; 3] = ["content-type", "te", "host"];

/// Most names listed after a lookup error.
const MAX_LISTED: usize = 12;

/// Why [`grpc_request`] could not build a template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrpcTemplateError {
    /// The method is not in the loaded `.proto` files (or is not written
    /// `package.Service/Method`).
    #[error("{source}{hint}")]
    Method {
        /// What the lookup said.
        source: MethodLookupError,
        /// "; did you mean `X`? (methods: …)" — what there is instead (may be empty).
        hint: String,
    },
    /// The method streams (client or server side); `fanout load` sends unary calls only.
    #[error("`{method}` is a streaming method ({kind}); fanout load sends unary calls only")]
    Streaming {
        /// The method, `package.Service/Method`.
        method: String,
        /// Which side streams: `client streaming`, `server streaming` or `bidirectional`.
        kind: &'static str,
    },
    /// The JSON does not fit the method's input message type (names the field at fault).
    #[error(
        "the JSON message for `{method}` does not fit {message}{}: {detail}",
        .field.as_deref().map(|f| format!(" at `{f}`")).unwrap_or_default()
    )]
    Json {
        /// The method, `package.Service/Method`.
        method: String,
        /// The input message type (`pkg.Request`).
        message: String,
        /// The field at fault, as a path (`items[2].score`), when it could be found.
        field: Option<String>,
        /// What does not fit (the JSON parser's or the proto3 JSON mapping's words).
        detail: String,
    },
    /// A metadata entry is not a valid header, or names a header gRPC sets itself.
    #[error("metadata `{name}`: {reason}")]
    Metadata {
        /// The entry's name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The template of a unary call of `method` (`package.Service/Method`; a leading `/` is
/// accepted) with the message `json` (proto3 JSON mapping: proto or lowerCamelCase field names,
/// unknown fields refused) and `metadata` as extra headers: `POST /package.Service/Method`,
/// `content-type: application/grpc`, `te: trailers`, and the message encoded and framed (5-byte
/// prefix, uncompressed) once, here. Send it with [`crate::Protocol::Grpc`].
///
/// Errors: an unknown service or method (with a did-you-mean and the names there are), a
/// streaming method, JSON that does not fit the input type (naming the field), invalid metadata.
pub fn grpc_request(
    protos: &ProtoSet,
    method: &str,
    json: &str,
    metadata: &[(String, String)],
) -> Result<RequestTemplate, GrpcTemplateError> {
    let info = protos.method(method).map_err(|source| {
        let hint = lookup_hint(protos, &source);
        GrpcTemplateError::Method { source, hint }
    })?;
    let full = info.path.trim_start_matches('/').to_string();
    if info.streaming {
        let kind = match (
            info.desc.is_client_streaming(),
            info.desc.is_server_streaming(),
        ) {
            (true, true) => "bidirectional",
            (true, false) => "client streaming",
            _ => "server streaming",
        };
        return Err(GrpcTemplateError::Streaming { method: full, kind });
    }
    let mut encoded = Ok(());
    let body: Bytes = frame::encode_with(|out| {
        encoded = info.input.json_to_proto_into(json.as_bytes(), out);
    });
    if let Err(e) = encoded {
        let (message, detail) = match e {
            CodecError::Json { message, detail } | CodecError::Proto { message, detail } => {
                (message, detail)
            }
        };
        let (field, suggestion) = serde_json::from_str::<serde_json::Value>(json)
            .ok()
            .and_then(|v| culprit(&info.input, &v, 0))
            .map_or((None, None), |(f, s)| (Some(f), s));
        return Err(GrpcTemplateError::Json {
            method: full,
            message,
            field,
            detail: match suggestion {
                Some(s) => format!("{detail}; did you mean `{s}`?"),
                None => detail,
            },
        });
    }
    let mut headers = vec![
        (
            "content-type".to_string(),
            fanout_grpc::CONTENT_TYPE.to_string(),
        ),
        ("te".to_string(), "trailers".to_string()),
    ];
    for (name, value) in metadata {
        let bad = |reason| GrpcTemplateError::Metadata {
            name: name.clone(),
            reason,
        };
        let n = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| bad("not a valid header name"))?;
        if RESERVED.contains(&n.as_str()) {
            return Err(bad("set by gRPC itself; it cannot be given as metadata"));
        }
        HeaderValue::from_str(value).map_err(|_| bad("the value is not a valid header value"))?;
        headers.push((n.as_str().to_string(), value.clone()));
    }
    Ok(RequestTemplate {
        method: http::Method::POST,
        path: info.path,
        headers,
        body,
    })
}

/// Deepest field path looked into by [`culprit`].
const MAX_CULPRIT_DEPTH: usize = 32;

/// The path of the field that makes `v` not fit `codec`'s message (`count`, `inner.note`,
/// `items[2].score`) and, when that field does not exist, the closest field name: each member
/// is tried on its own, and a failing message field (or list of messages) is searched further.
/// Only on errors, once per template.
fn culprit(
    codec: &MessageCodec,
    v: &serde_json::Value,
    depth: usize,
) -> Option<(String, Option<String>)> {
    let obj = v.as_object()?;
    let fits = |key: &str, val: serde_json::Value| {
        let mut one = serde_json::Map::new();
        one.insert(key.to_string(), val);
        serde_json::to_vec(&serde_json::Value::Object(one))
            .is_ok_and(|text| codec.from_json(&text).is_ok())
    };
    let (key, val) = obj.iter().find(|(k, v)| !fits(k, (*v).clone()))?;
    let desc = codec.descriptor();
    let Some(field) = desc
        .get_field_by_name(key)
        .or_else(|| desc.get_field_by_json_name(key))
    else {
        let names = desc
            .fields()
            .map(|f| f.name().to_string())
            .collect::<Vec<_>>();
        return Some((key.clone(), fanout_config::closest(key, &names)));
    };
    let kind = field.kind();
    let nested = match kind.as_message() {
        Some(m) if depth < MAX_CULPRIT_DEPTH && !field.is_map() => MessageCodec::new(m.clone()),
        _ => return Some((key.clone(), None)),
    };
    if field.is_list() {
        let items = val.as_array()?;
        let (i, item) = items
            .iter()
            .enumerate()
            .find(|(_, item)| !fits(key, serde_json::Value::Array(vec![(*item).clone()])))?;
        return Some(match culprit(&nested, item, depth + 1) {
            Some((p, s)) => (format!("{key}[{i}].{p}"), s),
            None => (format!("{key}[{i}]"), None),
        });
    }
    Some(match culprit(&nested, val, depth + 1) {
        Some((p, s)) => (format!("{key}.{p}"), s),
        None => (key.clone(), None),
    })
}

/// "; did you mean `X`? (methods: a, b)" for a failed method lookup.
fn lookup_hint(protos: &ProtoSet, e: &MethodLookupError) -> String {
    let (what, name, known): (&str, &str, Vec<String>) = match e {
        MethodLookupError::BadName(_) => ("services", "", protos.service_names()),
        MethodLookupError::UnknownService { service, known } => {
            ("services", service.as_str(), known.clone())
        }
        MethodLookupError::UnknownMethod { method, known, .. } => {
            ("methods", method.as_str(), known.clone())
        }
    };
    let mut hint = String::new();
    if !name.is_empty() {
        // A service named without its package (`Users` for `demo.v1.Users`) is a typo too.
        let suffix = format!(".{name}");
        let unqualified = known
            .iter()
            .filter(|k| k.ends_with(&suffix))
            .collect::<Vec<_>>();
        let guess = match unqualified.as_slice() {
            [one] => Some((*one).clone()),
            _ => fanout_config::closest(name, &known),
        };
        if let Some(g) = guess {
            let _ = write!(hint, "; did you mean `{g}`?");
        }
    }
    if known.is_empty() {
        hint.push_str(" (the loaded .proto files define no service)");
    } else {
        let listed = known
            .iter()
            .take(MAX_LISTED)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        let more = known.len().saturating_sub(MAX_LISTED);
        let _ = write!(hint, " ({what}: {listed}");
        if more > 0 {
            let _ = write!(hint, ", and {more} more");
        }
        hint.push(')');
    }
    hint
}

/// Compile `.proto` `files` for [`grpc_request`], with the well-known types.
///
/// Import path: `import_paths`, then the directory of each file that exists on disk outside
/// them; with no `import_paths`, each file's own directory then the current directory. So
/// `load_protos(&["protos/demo.proto".into()], &[])` just works (the file is `demo.proto`, its
/// sibling imports are found), and with an import path a file may be named relative to it.
pub fn load_protos(files: &[PathBuf], import_paths: &[PathBuf]) -> Result<ProtoSet, ProtoError> {
    let mut includes: Vec<PathBuf> = import_paths.to_vec();
    let here = Path::new(".");
    let canonical: Vec<PathBuf> = import_paths
        .iter()
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    for f in files {
        let inside = f
            .canonicalize()
            .ok()
            .map(|c| canonical.iter().any(|i| c.starts_with(i)));
        // Not on disk (named relative to an import path), or already inside one.
        if !import_paths.is_empty() && inside != Some(false) {
            continue;
        }
        let dir = f
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(here);
        if !includes.iter().any(|i| i == dir) {
            includes.push(dir.to_path_buf());
        }
    }
    if import_paths.is_empty() && !includes.iter().any(|i| i == here) {
        includes.push(here.to_path_buf());
    }
    // A file that is nowhere: say so, rather than "not in any include path".
    if let Some(f) = files
        .iter()
        .find(|f| !f.exists() && !includes.iter().any(|i| i.join(f).exists()))
    {
        let looked = includes
            .iter()
            .map(|i| i.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(ProtoError {
            file: None,
            path: Some(f.clone()),
            line_col: None,
            message: format!("no such file (nor in the import path: {looked})"),
        });
    }
    ProtoSet::compile(files, &includes, ProtoLimits::default())
}

/// The code of a `grpc-status` value (`0` is checked first: it is nearly every answer).
pub(crate) fn code_of(v: &[u8]) -> Code {
    if v == b"0" {
        Code::Ok
    } else {
        Code::from_header(v)
    }
}

/// The verdict on an answer with HTTP `status` and, if it had one, the code of its
/// `grpc-status`.
pub(crate) fn judge(status: u16, grpc_status: Option<Code>) -> GrpcAnswer {
    match grpc_status {
        Some(code) => GrpcAnswer {
            code,
            missing: false,
        },
        None => GrpcAnswer {
            code: Code::for_http_status(status),
            missing: true,
        },
    }
}

/// Counts by code number → counts by code name (codes never seen left out).
pub(crate) fn status_map(codes: &[u64; GRPC_CODES]) -> BTreeMap<String, u64> {
    codes
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(i, n)| {
            let code = Code::from_i32(i32::try_from(i).unwrap_or(2));
            (code.name().to_string(), *n)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        assert_eq!(code_of(b"0"), Code::Ok);
        assert_eq!(code_of(b"14"), Code::Unavailable);
        assert_eq!(code_of(b"99"), Code::Unknown);
        assert_eq!(code_of(b"x"), Code::Unknown);
        let j = judge(500, Some(Code::DeadlineExceeded));
        assert_eq!((j.code, j.missing), (Code::DeadlineExceeded, false));
        let m = judge(200, None);
        assert_eq!((m.code, m.missing), (Code::Unknown, true));
        assert_eq!(judge(503, None).code, Code::Unavailable);
        assert_eq!(judge(404, None).code, Code::Unimplemented);
        let mut codes = [0; GRPC_CODES];
        codes[0] = 3;
        codes[14] = 2;
        let m = status_map(&codes);
        assert_eq!(m.len(), 2);
        assert_eq!((m["OK"], m["UNAVAILABLE"]), (3, 2));
    }
}
