//! `.proto` files compiled in process (protox: no `protoc`, no code generation) into a
//! [`ProtoSet`]: the descriptor pool, the encoded `FileDescriptorSet` for server reflection, and
//! method lookup. Files are read through a resolver that bounds their size and number; errors
//! carry the `.proto` file, line and column.

use crate::codec::MessageCodec;
use bytes::Bytes;
use miette::Diagnostic;
use prost_reflect::{DescriptorPool, MethodDescriptor, Value};
use protox::file::{
    ChainFileResolver, File, FileResolver, GoogleFileResolver, IncludeFileResolver,
};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bounds on what compiling `.proto` files may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtoLimits {
    /// Largest `.proto` file, in bytes. Default 1 MiB.
    pub max_file_bytes: u64,
    /// Most files read, imports included. Default 1,000.
    pub max_files: usize,
}

impl Default for ProtoLimits {
    fn default() -> Self {
        ProtoLimits {
            max_file_bytes: 1 << 20,
            max_files: 1000,
        }
    }
}

/// A `.proto` compile error: the file (as named in the include path) and, when the compiler
/// knows it, the line and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ProtoError {
    /// The file, as found in an include path (`demo/v1/users.proto`), if known.
    pub file: Option<String>,
    /// The file on disk, if known.
    pub path: Option<PathBuf>,
    /// 1-based line and column, if known.
    pub line_col: Option<(usize, usize)>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self
            .path
            .as_ref()
            .map(|p| p.display().to_string())
            .or_else(|| self.file.clone());
        match (file, self.line_col) {
            (Some(file), Some((l, c))) => write!(f, "{file}:{l}:{c}: {}", self.message),
            (Some(file), None) => write!(f, "{file}: {}", self.message),
            (None, _) => f.write_str(&self.message),
        }
    }
}

/// A method named in a config that the loaded `.proto` files do not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MethodLookupError {
    /// Not `package.Service/Method`.
    #[error("`{0}` is not a method name: write `package.Service/Method`")]
    BadName(String),
    /// No such service.
    #[error("no service `{service}` in the loaded .proto files")]
    UnknownService {
        /// The service asked for.
        service: String,
        /// The services there are.
        known: Vec<String>,
    },
    /// The service has no such method.
    #[error("service `{service}` has no method `{method}`")]
    UnknownMethod {
        /// The service.
        service: String,
        /// The method asked for.
        method: String,
        /// The service's methods.
        known: Vec<String>,
    },
}

impl MethodLookupError {
    /// The names the wrong one should be compared with (did-you-mean), and what it was.
    pub fn candidates(&self) -> Option<(&str, &[String])> {
        match self {
            MethodLookupError::BadName(_) => None,
            MethodLookupError::UnknownService { service, known } => Some((service, known)),
            MethodLookupError::UnknownMethod { method, known, .. } => Some((method, known)),
        }
    }
}

/// A method found in a [`ProtoSet`].
#[derive(Debug, Clone)]
pub struct MethodInfo {
    /// The descriptor.
    pub desc: MethodDescriptor,
    /// Its HTTP/2 path: `/package.Service/Method`.
    pub path: String,
    /// The request message's codec.
    pub input: MessageCodec,
    /// The answer message's codec.
    pub output: MessageCodec,
    /// Whether the `.proto` marks it `idempotency_level = NO_SIDE_EFFECTS` or `IDEMPOTENT`.
    pub idempotent: bool,
    /// Whether the `.proto` marks it `idempotency_level = NO_SIDE_EFFECTS` (a read).
    pub no_side_effects: bool,
    /// Whether the client or the server streams (fanout serves and calls unary methods only).
    pub streaming: bool,
}

/// Compiled `.proto` files. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct ProtoSet {
    pool: DescriptorPool,
    encoded: Bytes,
    files: Vec<String>,
}

impl Default for ProtoSet {
    fn default() -> Self {
        ProtoSet::empty()
    }
}

impl ProtoSet {
    /// No files (a config without `protos:`).
    pub fn empty() -> ProtoSet {
        ProtoSet {
            pool: DescriptorPool::new(),
            encoded: Bytes::new(),
            files: Vec::new(),
        }
    }

    /// Compile `files` (paths; each must lie in one of `includes`, or be named relative to
    /// one) with `includes` as the import path, plus the `google/protobuf/*` well-known types.
    pub fn compile(
        files: &[PathBuf],
        includes: &[PathBuf],
        limits: ProtoLimits,
    ) -> Result<ProtoSet, ProtoError> {
        let resolver = Bounded::new(includes, limits);
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        compiler.include_imports(true).include_source_info(false);
        for f in files {
            compiler
                .open_file(f)
                .map_err(|e| proto_error(&e, includes))?;
        }
        let pool = compiler.descriptor_pool();
        let encoded = Bytes::from(compiler.encode_file_descriptor_set());
        let files = compiler
            .files()
            .filter(|f| !f.is_import())
            .map(|f| f.name().to_string())
            .collect();
        Ok(ProtoSet {
            pool,
            encoded,
            files,
        })
    }

    /// The descriptor pool.
    pub fn pool(&self) -> &DescriptorPool {
        &self.pool
    }

    /// The encoded `FileDescriptorSet`, imports included (for server reflection).
    pub fn file_descriptor_set(&self) -> &Bytes {
        &self.encoded
    }

    /// The files named in the config, as found in the include paths.
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// Whether no file is loaded.
    pub fn is_empty(&self) -> bool {
        self.pool.services().len() == 0 && self.pool.all_messages().len() == 0
    }

    /// Full names of every service.
    pub fn service_names(&self) -> Vec<String> {
        self.pool
            .services()
            .map(|s| s.full_name().to_string())
            .collect()
    }

    /// A method by `package.Service/Method` (a leading `/` and `.` between service and method
    /// are accepted too).
    pub fn method(&self, name: &str) -> Result<MethodInfo, MethodLookupError> {
        let n = name.trim().trim_start_matches('/');
        let (service, method) = n
            .rsplit_once('/')
            .or_else(|| n.rsplit_once('.'))
            .filter(|(s, m)| !s.is_empty() && !m.is_empty())
            .ok_or_else(|| MethodLookupError::BadName(name.to_string()))?;
        let svc = self.pool.get_service_by_name(service).ok_or_else(|| {
            MethodLookupError::UnknownService {
                service: service.to_string(),
                known: self.service_names(),
            }
        })?;
        let desc = svc.methods().find(|m| m.name() == method).ok_or_else(|| {
            MethodLookupError::UnknownMethod {
                service: service.to_string(),
                method: method.to_string(),
                known: svc.methods().map(|m| m.name().to_string()).collect(),
            }
        })?;
        Ok(MethodInfo::of(desc))
    }

    /// Every unary method, with its info.
    pub fn methods(&self) -> Vec<MethodInfo> {
        self.pool
            .services()
            .flat_map(|s| s.methods().collect::<Vec<_>>())
            .map(MethodInfo::of)
            .collect()
    }
}

impl MethodInfo {
    fn of(desc: MethodDescriptor) -> MethodInfo {
        let path = format!("/{}/{}", desc.parent_service().full_name(), desc.name());
        // `idempotency_level` (field 34 of MethodOptions): 1 NO_SIDE_EFFECTS, 2 IDEMPOTENT.
        let level = match desc
            .options()
            .get_field_by_name("idempotency_level")
            .as_deref()
        {
            Some(Value::EnumNumber(n)) => *n,
            _ => 0,
        };
        MethodInfo {
            input: MessageCodec::new(desc.input()),
            output: MessageCodec::new(desc.output()),
            streaming: desc.is_client_streaming() || desc.is_server_streaming(),
            idempotent: level == 1 || level == 2,
            no_side_effects: level == 1,
            path,
            desc,
        }
    }
}

/// Include paths and the well-known types, with the size of each file and their number bounded.
struct Bounded {
    includes: Vec<PathBuf>,
    inner: ChainFileResolver,
    limits: ProtoLimits,
    opened: AtomicUsize,
}

impl Bounded {
    fn new(includes: &[PathBuf], limits: ProtoLimits) -> Bounded {
        let mut inner = ChainFileResolver::new();
        for i in includes {
            inner.add(IncludeFileResolver::new(i.clone()));
        }
        inner.add(GoogleFileResolver::new());
        Bounded {
            includes: includes.to_vec(),
            inner,
            limits,
            opened: AtomicUsize::new(0),
        }
    }
}

impl FileResolver for Bounded {
    fn resolve_path(&self, path: &Path) -> Option<String> {
        self.inner.resolve_path(path)
    }

    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        if self.opened.fetch_add(1, Ordering::Relaxed) >= self.limits.max_files {
            return Err(protox::Error::new(format!(
                "more than {} .proto files to read (imports included)",
                self.limits.max_files
            )));
        }
        // Checked before the compiler reads it: a regular file (not a FIFO that would block),
        // within the size limit.
        for dir in &self.includes {
            let p = dir.join(name);
            if let Ok(meta) = std::fs::metadata(&p) {
                if !meta.is_file() {
                    return Err(protox::Error::new(format!(
                        "`{}` is not a regular file",
                        p.display()
                    )));
                }
                if meta.len() > self.limits.max_file_bytes {
                    return Err(protox::Error::new(format!(
                        "`{}` is {} bytes, more than the limit of {}",
                        p.display(),
                        meta.len(),
                        self.limits.max_file_bytes
                    )));
                }
                break;
            }
        }
        self.inner.open_file(name)
    }
}

/// A protox error with its file, line and column.
fn proto_error(e: &protox::Error, includes: &[PathBuf]) -> ProtoError {
    let file = e.file().map(str::to_string);
    let path = file
        .as_ref()
        .and_then(|f| includes.iter().map(|i| i.join(f)).find(|p| p.is_file()));
    let mut line_col = None;
    if let (Some(src), Some(label)) = (e.source_code(), e.labels().and_then(|mut l| l.next()))
        && let Ok(span) = src.read_span(label.inner(), 0, 0)
    {
        line_col = Some((span.line() + 1, span.column() + 1));
    }
    let mut message = e.to_string();
    if let Some(help) = e.help() {
        message.push_str(&format!(" ({help})"));
    }
    ProtoError {
        file,
        path,
        line_col,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory, removed when dropped.
    struct Dir(PathBuf);
    impl std::ops::Deref for Dir {
        type Target = PathBuf;
        fn deref(&self) -> &PathBuf {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir_with(files: &[(&str, &str)]) -> Dir {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let d = std::env::temp_dir().join(format!("fanout-grpc-{}-{n}", std::process::id()));
        for (name, text) in files {
            let p = d.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        Dir(d)
    }

    const USERS: &str = r#"syntax = "proto3";
package demo.v1;
import "google/protobuf/timestamp.proto";

service Users {
  rpc GetUser(GetUserRequest) returns (User) { option idempotency_level = NO_SIDE_EFFECTS; }
  rpc Rename(User) returns (User);
  rpc Watch(GetUserRequest) returns (stream User);
}
message GetUserRequest { string id = 1; }
message User {
  string id = 1;
  string display_name = 2;
  int64 karma = 3;
  repeated string tags = 4;
  google.protobuf.Timestamp created = 5;
  Kind kind = 6;
  User referrer = 7;
}
enum Kind { KIND_UNSPECIFIED = 0; ADMIN = 1; }
message Rich {
  map<string, int32> counts = 1;
  repeated int32 nums = 2;
  bytes blob = 3;
  sint64 s = 4;
  fixed32 f = 5;
  double d = 6;
  map<int64, User> users = 7;
  repeated User list = 8;
  optional string maybe = 9;
  oneof choice { string a = 10; int32 b = 11; }
  float fl = 12;
  bool flag = 13;
  uint64 big = 14;
  repeated double ds = 15;
  sfixed64 sf = 16;
  map<bool, string> flags = 17;
  repeated Kind kinds = 18;
}
service Rich2 { rpc Echo(Rich) returns (Rich); }
"#;

    #[test]
    fn compiles_and_looks_up_methods() {
        let d = dir_with(&[("demo/v1/users.proto", USERS)]);
        let set = ProtoSet::compile(
            &[PathBuf::from("demo/v1/users.proto")],
            std::slice::from_ref(&*d),
            ProtoLimits::default(),
        )
        .unwrap();
        assert_eq!(set.files(), ["demo/v1/users.proto"]);
        assert_eq!(set.service_names(), ["demo.v1.Users", "demo.v1.Rich2"]);
        let m = set.method("demo.v1.Users/GetUser").unwrap();
        assert_eq!(m.path, "/demo.v1.Users/GetUser");
        assert!(m.idempotent && !m.streaming);
        let r = set.method("/demo.v1.Users/Rename").unwrap();
        assert!(!r.idempotent);
        assert!(set.method("demo.v1.Users.Watch").unwrap().streaming);
        assert!(matches!(
            set.method("demo.v1.User/GetUser"),
            Err(MethodLookupError::UnknownService { .. })
        ));
        let e = set.method("demo.v1.Users/GetUsr").unwrap_err();
        assert_eq!(
            e.candidates().unwrap().1,
            ["GetUser".to_string(), "Rename".into(), "Watch".into()]
        );
        assert!(matches!(
            set.method("x"),
            Err(MethodLookupError::BadName(_))
        ));
        assert!(!set.file_descriptor_set().is_empty());
        // A path on disk inside an include directory works as well.
        let set2 = ProtoSet::compile(
            &[d.join("demo/v1/users.proto")],
            std::slice::from_ref(&*d),
            ProtoLimits::default(),
        )
        .unwrap();
        assert_eq!(set2.service_names(), ["demo.v1.Users", "demo.v1.Rich2"]);
    }

    #[test]
    fn json_round_trip_with_fanout_options() {
        let d = dir_with(&[("u.proto", USERS)]);
        let set = ProtoSet::compile(
            &[PathBuf::from("u.proto")],
            &[d.to_path_buf()],
            ProtoLimits::default(),
        )
        .unwrap();
        let m = set.method("demo.v1.Users/Rename").unwrap();
        let bytes = m
            .input
            .json_to_proto(
                br#"{"id":"u1","displayName":"Ann","karma":"9007199254740993","tags":["a"],
                    "created":"2024-01-02T03:04:05Z","kind":"ADMIN"}"#,
            )
            .unwrap();
        let json = m.output.proto_to_json(&bytes).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"id":"u1","display_name":"Ann","karma":9007199254740993i64,
                "tags":["a"],"created":"2024-01-02T03:04:05Z","kind":"ADMIN"})
        );
        // Defaults are written; unset message fields are not.
        let empty = m.output.proto_to_json(&[]).unwrap();
        assert_eq!(
            std::str::from_utf8(&empty).unwrap(),
            r#"{"id":"","display_name":"","karma":0,"tags":[],"kind":"KIND_UNSPECIFIED"}"#
        );
        let e = m.input.json_to_proto(br#"{"nope":1}"#).unwrap_err();
        assert!(e.to_string().contains("'nope'"), "{e}");
        assert!(!e.to_string().contains("at line"), "{e}");
        let e = m.input.json_to_proto(br#"{"karma":"x"}"#).unwrap_err();
        assert!(e.to_string().contains("demo.v1.User"), "{e}");
        let e = m.output.proto_to_json(&[0xff, 0xff, 0xff]).unwrap_err();
        assert!(matches!(e, crate::CodecError::Proto { .. }), "{e}");
        // A deeply nested message is refused, not a stack overflow.
        let mut deep = Vec::new();
        for _ in 0..200 {
            let mut next = vec![0x3a]; // field 7, length-delimited
            prost::encoding::encode_varint(deep.len() as u64, &mut next);
            next.extend_from_slice(&deep);
            deep = next;
        }
        assert!(m.output.proto_to_json(&deep).is_err());
        let nested = format!("{}{}", "{\"referrer\":".repeat(300), "}".repeat(300));
        assert!(m.input.json_to_proto(nested.as_bytes()).is_err());
    }

    #[test]
    fn the_value_path_maps_like_the_json_path() {
        let d = dir_with(&[("u.proto", USERS)]);
        let set = ProtoSet::compile(
            &[PathBuf::from("u.proto")],
            &[d.to_path_buf()],
            ProtoLimits::default(),
        )
        .unwrap();
        let m = set.method("demo.v1.Users/Rename").unwrap();
        let json = br#"{"id":"u1","displayName":"Ann","karma":"9007199254740993","tags":["a","b"],
            "created":"2024-01-02T03:04:05Z","kind":"ADMIN","referrer":{"id":"u0","kind":1}}"#;
        let bytes = m.input.json_to_proto(json).unwrap();
        let via_json = fanout_expr::json::parse(&m.output.proto_to_json(&bytes).unwrap()).unwrap();
        let via_val = m.output.decode_val(&bytes, 64).unwrap();
        assert_eq!(
            fanout_expr::json::to_string(&via_val),
            fanout_expr::json::to_string(&via_json)
        );
        // And back: the value encodes to the same message.
        let mut again = Vec::new();
        m.input.encode_val(&via_val, &mut again).unwrap();
        assert_eq!(m.output.decode_val(&again, 64).unwrap(), via_val);
        // A nested message of 128 bytes or more (its length takes two bytes) and one of
        // fewer, nested twice: what the encoder writes reads back, by prost-reflect too, as
        // the value it was given.
        for n in [10, 126, 127, 128, 300, 20_000] {
            let json = format!(
                r#"{{"id":"a","referrer":{{"id":"b","displayName":"{}","referrer":{{"id":"{}"}}}}}}"#,
                "x".repeat(n),
                "y".repeat(n)
            );
            let want = m.input.json_to_proto(json.as_bytes()).unwrap();
            let v = m.output.decode_val(&want, 64).unwrap();
            let mut got = Vec::new();
            m.input.encode_val(&v, &mut got).unwrap();
            assert_eq!(m.output.decode_val(&got, 64).unwrap(), v, "{n}");
            assert_eq!(
                m.output.decode_val_dynamic(&got, 64).unwrap(),
                m.output.decode_val_dynamic(&want, 64).unwrap(),
                "{n}"
            );
        }
        // Defaults, empty input.
        assert_eq!(
            fanout_expr::json::to_string(&m.output.decode_val(&[], 64).unwrap()),
            r#"{"id":"","display_name":"","karma":0,"tags":[],"kind":"KIND_UNSPECIFIED"}"#
        );
        // Refusals name the field; depth is bounded both ways.
        let bad = fanout_expr::json::parse(br#"{"nope":1}"#).unwrap();
        let e = m.input.encode_val(&bad, &mut Vec::new()).unwrap_err();
        assert!(
            e.to_string().contains("unrecognized field name 'nope'"),
            "{e}"
        );
        let bad = fanout_expr::json::parse(br#"{"karma":"x"}"#).unwrap();
        let e = m.input.encode_val(&bad, &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("karma"), "{e}");
        let bad = fanout_expr::json::parse(br#"{"kind":"NOPE"}"#).unwrap();
        assert!(m.input.encode_val(&bad, &mut Vec::new()).is_err());
        let nested = format!("{}{{}}{}", "{\"referrer\":".repeat(150), "}".repeat(150));
        let deep = fanout_expr::json::parse_limited(nested.as_bytes(), 500).unwrap();
        assert!(m.input.encode_val(&deep, &mut Vec::new()).is_err());
        let mut chain = Vec::new();
        m.input
            .encode_val(
                &fanout_expr::json::parse(
                    format!("{}{{}}{}", "{\"referrer\":".repeat(20), "}".repeat(20)).as_bytes(),
                )
                .unwrap(),
                &mut chain,
            )
            .unwrap();
        assert!(m.output.decode_val(&chain, 10).is_err(), "max depth");
        assert!(m.output.decode_val(&chain, 64).is_ok());
    }

    #[test]
    fn the_direct_wire_codec_matches_prost_reflect() {
        let d = dir_with(&[("u.proto", USERS)]);
        let set = ProtoSet::compile(
            &[PathBuf::from("u.proto")],
            &[d.to_path_buf()],
            ProtoLimits::default(),
        )
        .unwrap();
        let m = set.method("demo.v1.Rich2/Echo").unwrap();
        let json = br#"{"counts":{"a":1,"b":-2},"nums":[1,-5,300],"blob":"aGVsbG8=","s":-77,
            "f":4000000000,"d":1.5,"users":{"7":{"id":"u7","kind":"ADMIN"},"-1":{}},
            "list":[{"id":"x","tags":["t","\u0442\u044d\u0433 \u2713"]},{}],"maybe":"","b":0,"fl":0.25,"flag":true,
            "big":"18446744073709551615","ds":[0.5,-2],"sf":"-9000000000","flags":{"true":"y"},
            "kinds":["ADMIN","KIND_UNSPECIFIED"]}"#;
        let bytes = m.input.json_to_proto(json).unwrap();
        let direct = m.output.decode_val(&bytes, 64).unwrap();
        let dynamic = m.output.decode_val_dynamic(&bytes, 64).unwrap();
        assert_eq!(
            fanout_expr::json::to_string(&direct),
            fanout_expr::json::to_string(&dynamic)
        );
        // Presence: `maybe` and the oneof member are there although they hold defaults.
        let s = fanout_expr::json::to_string(&direct);
        assert!(s.contains(r#""maybe":"""#) && s.contains(r#""b":0"#), "{s}");
        assert!(s.contains(r#""big":18446744073709551615"#), "{s}");
        // The direct encoder writes what both decoders read back as the same value.
        let mut again = Vec::new();
        m.input.encode_val(&direct, &mut again).unwrap();
        assert_eq!(m.output.decode_val_dynamic(&again, 64).unwrap(), dynamic);
        assert_eq!(m.output.decode_val(&again, 64).unwrap(), direct);
        // Hostile bytes: errors, never panics.
        for bad in [
            &[0x0a, 0xff][..],
            &[0x12, 0x05, 0x01],
            &[0x1b],
            &[0x2d, 0x01],
            &[
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
            &[0x3a, 0x02, 0x0a, 0x05],
            // `maybe` (a string): not UTF-8, and a non-ASCII letter cut in half.
            &[0x4a, 0x02, 0xc3, 0x28],
            &[0x4a, 0x03, b'a', 0xd1, 0x82][..4],
            &[0x4a, 0x02, b'a', 0xd1],
        ] {
            assert!(m.output.decode_val(bad, 64).is_err(), "{bad:?}");
        }
        // Keys in any order, by proto or JSON name, encode the same message.
        let encoded = |t: &str| {
            let mut out = Vec::new();
            let v = fanout_expr::json::parse(t.as_bytes()).unwrap();
            m.input.encode_val(&v, &mut out).unwrap();
            m.output.decode_val(&out, 64).unwrap()
        };
        let in_order = encoded(
            r#"{"nums":[1],"maybe":"x","flag":true,"users":{"7":{"id":"u","display_name":"d"}}}"#,
        );
        for other in [
            r#"{"users":{"7":{"displayName":"d","id":"u"}},"flag":true,"maybe":"x","nums":[1]}"#,
            r#"{"flag":true,"nums":[1],"users":{"7":{"display_name":"d","id":"u"}},"maybe":"x"}"#,
        ] {
            assert_eq!(encoded(other), in_order, "{other}");
        }
        // A text string that is not UTF-8 is not encoded as a protobuf string.
        for bytes in [vec![0xc3, 0x28], vec![b'a', 0xd1], vec![0xff; 20]] {
            let mut o = fanout_expr::Map::default();
            o.insert(
                fanout_expr::Val::utf8_str("maybe"),
                fanout_expr::Val::utf8_str(bytes.clone()),
            );
            let v = fanout_expr::Val::obj(o);
            assert!(
                m.input.encode_val(&v, &mut Vec::new()).is_err(),
                "{bytes:?}"
            );
        }
        let val = |t: &str| fanout_expr::json::parse(t.as_bytes()).unwrap();
        for bad in [
            r#"{"nums":[1.5]}"#,
            r#"{"nums":"x"}"#,
            r#"{"f":-1}"#,
            r#"{"s":"99999999999999999999"}"#,
            r#"{"flag":1}"#,
            r#"{"blob":"!!"}"#,
            r#"{"users":{"x":{}}}"#,
            r#"{"kinds":["NOPE"]}"#,
            r#"[]"#,
        ] {
            assert!(
                m.input.encode_val(&val(bad), &mut Vec::new()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn errors_point_at_file_line_and_column() {
        let d = dir_with(&[(
            "bad.proto",
            "syntax = \"proto3\";\npackage x;\nmessage A {\n  strin name = 1;\n}\n",
        )]);
        let e = ProtoSet::compile(
            &[PathBuf::from("bad.proto")],
            std::slice::from_ref(&*d),
            ProtoLimits::default(),
        )
        .unwrap_err();
        assert_eq!(e.file.as_deref(), Some("bad.proto"));
        assert_eq!(e.line_col.map(|l| l.0), Some(4), "{e}");
        assert!(e.to_string().contains("bad.proto:4:"), "{e}");

        let d2 = dir_with(&[(
            "imp.proto",
            "syntax = \"proto3\";\nimport \"missing.proto\";\n",
        )]);
        let e = ProtoSet::compile(
            &[PathBuf::from("imp.proto")],
            &[d2.to_path_buf()],
            ProtoLimits::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("missing.proto"), "{e}");
        assert_eq!(e.line_col.map(|l| l.0), Some(2), "{e}");

        let e = ProtoSet::compile(
            &[PathBuf::from("nope.proto")],
            std::slice::from_ref(&*d),
            ProtoLimits::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("nope.proto"), "{e}");

        let e = ProtoSet::compile(
            &[PathBuf::from("bad.proto")],
            &[d.to_path_buf()],
            ProtoLimits {
                max_file_bytes: 10,
                max_files: 10,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("more than the limit"), "{e}");
    }
}
