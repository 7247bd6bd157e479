//! HTTP compression (`compression:`; docs/config.md#compression), over `fanout-compress`, an edge
//! stage of three phases:
//!
//! - on arrival ([`EdgeStage::on_arrival`]), before the request is consumed: may its answer be
//!   compressed, and with which coding (the client's `Accept-Encoding`, the route's
//!   `compression: off`, HEAD, gRPC) — kept as the stage's note;
//! - on the answer ([`EdgeStage::on_answer`]), once final (CORS headers included): a whole body
//!   of a compressible type, at least `min_bytes` long, that has no `Content-Encoding` and no
//!   `Cache-Control: no-transform`, is not gRPC and not 1xx/204/304, is encoded — on the compute
//!   pool above `compute_above_bytes` — with `Vary: Accept-Encoding` and a strong `ETag` made
//!   weak; a streamed body is never buffered to be compressed;
//! - on the request body ([`EdgeStage::on_body`]): a body with a `Content-Encoding` the config
//!   accepts is decoded, the body limit applying to the decoded size (415 for other codings).
//!
//! Counters of both (by coding) live as long as the process ([`CompressionStats`], handed from
//! each config's stage to the next): `/metrics` and the status page.

use crate::{
    Answer, Arrival, BodyStep, BuildCx, Early, EdgeStage, Later, Registration, Rejection,
    RequestHead, RouteKind, Step, Tools,
};
use bytes::Bytes;
use fanout_compress::{Choice, Coding};
use fanout_config::{Config, ConfigErrors, ContentCoding, RouteCompression};
use fanout_protocol::metrics::{MetricType, Out, Value};
use fanout_transport::body::Body;
use http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG, VARY,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Request bodies longer than this are decoded on the compute pool.
const DECODE_ON_POOL_ABOVE: usize = 64 * 1024;

/// The stage's registration line.
pub const STAGE: Registration = Registration {
    name: "compression",
    section: false,
    codes: &["unsupported_encoding", "bad_encoding"],
    build,
    schema: None,
};

/// The config's compression and the process's counters (kept from the stage it replaces).
pub struct CompressionStage {
    table: CompressionTable,
    stats: Arc<CompressionStats>,
}

fn build(cx: &BuildCx<'_>) -> Result<Option<Arc<dyn EdgeStage>>, ConfigErrors> {
    let stats = cx
        .prev
        .and_then(|p| p.as_any().downcast_ref::<CompressionStage>())
        .map_or_else(Arc::default, |p| p.stats.clone());
    Ok(Some(Arc::new(CompressionStage {
        table: CompressionTable::build(cx.config),
        stats,
    })))
}

/// The `fanout-compress` coding of a config coding.
pub fn coding(c: ContentCoding) -> Coding {
    match c {
        ContentCoding::Gzip => Coding::Gzip,
        ContentCoding::Br => Coding::Br,
        ContentCoding::Zstd => Coding::Zstd,
    }
}

fn index(c: Coding) -> usize {
    match c {
        Coding::Zstd => 0,
        Coding::Br => 1,
        Coding::Gzip => 2,
    }
}

/// One entry of `content_types`.
enum TypePattern {
    /// `type/subtype`.
    Exact(String),
    /// `type/*`: the type and its slash.
    Prefix(String),
    /// `*+suffix`: `+suffix`.
    Suffix(String),
}

/// `compression.response` compiled.
struct ResponsePolicy {
    offered: Vec<Coding>,
    levels: [i32; 3],
    min_bytes: usize,
    compute_above: usize,
    types: Vec<TypePattern>,
}

/// A loaded config's compression: the answer policy (`None` when off), which routes turn it
/// off (by route index) and the request codings decoded.
#[derive(Default)]
struct CompressionTable {
    response: Option<ResponsePolicy>,
    off_by_route: Vec<bool>,
    /// Whether any route turns compression off (else no route lookup per request).
    any_off: bool,
    /// The defaults' `compression: off` (answers that match no route).
    default_off: bool,
    decode: Vec<Coding>,
}

impl CompressionTable {
    /// Compile `cfg.compression` and the routes' `compression`.
    fn build(cfg: &Config) -> CompressionTable {
        let r = &cfg.compression.response;
        let response = r.enabled.then(|| ResponsePolicy {
            offered: r.algorithms.iter().map(|c| coding(*c)).collect(),
            levels: [r.levels.zstd, r.levels.br, r.levels.gzip],
            min_bytes: r.min_bytes,
            compute_above: r.compute_above_bytes,
            types: r
                .content_types
                .iter()
                .map(|t| {
                    let t = t.trim().to_ascii_lowercase();
                    if let Some(s) = t.strip_prefix('*') {
                        TypePattern::Suffix(s.to_string())
                    } else if let Some(p) = t.strip_suffix('*') {
                        TypePattern::Prefix(p.to_string())
                    } else {
                        TypePattern::Exact(t)
                    }
                })
                .collect(),
        });
        let default_off = cfg.defaults.compression == Some(RouteCompression::Off);
        let off_by_route: Vec<bool> = cfg
            .routes
            .iter()
            .map(|rc| rc.compression.or(cfg.defaults.compression) == Some(RouteCompression::Off))
            .collect();
        CompressionTable {
            response,
            any_off: default_off || off_by_route.iter().any(|o| *o),
            off_by_route,
            default_off,
            decode: cfg
                .compression
                .request
                .decode
                .iter()
                .map(|c| coding(*c))
                .collect(),
        }
    }

    /// Whether this request's answer may be compressed, and how (`None`: it is sent as it is,
    /// without `Vary`): answer compression on, not HEAD, not gRPC, the route not `off`.
    fn choose(&self, a: &mut Arrival<'_>) -> Option<Choice> {
        let policy = self.response.as_ref()?;
        if *a.method == Method::HEAD {
            return None;
        }
        let h = a.headers;
        if h.get(CONTENT_TYPE)
            .is_some_and(|v| fanout_grpc::looks_like_grpc(v.as_bytes()))
        {
            return None;
        }
        if self.any_off && self.route_off(a) {
            return None;
        }
        // Repeated `Accept-Encoding` lines are one list (RFC 9110 §5.3), read in their order.
        // A line that is not text names no coding we know.
        let mut lines = h.get_all(ACCEPT_ENCODING).iter();
        let first = lines.next().map(|v| v.to_str().unwrap_or(""));
        let joined: Option<String> = lines.next().map(|second| {
            let mut all = first.unwrap_or("").to_string();
            for v in std::iter::once(second).chain(lines) {
                all.push_str(", ");
                all.push_str(v.to_str().unwrap_or(""));
            }
            all
        });
        let accept = joined.as_deref().or(first);
        Some(fanout_compress::negotiate(accept, &policy.offered))
    }

    /// Whether the route the request goes to turns compression off (the defaults' for a path
    /// no route has, or a method none has there).
    fn route_off(&self, a: &mut Arrival<'_>) -> bool {
        let off = |i: usize| self.off_by_route.get(i).copied().unwrap_or(false);
        let method = a.method;
        match a.routes().iter().find(|r| r.method == *method) {
            Some(r) => off(r.index),
            None => self.default_off,
        }
    }

    /// Whether the answer's media type is one of `content_types`.
    fn compressible(&self, policy: &ResponsePolicy, headers: &HeaderMap) -> bool {
        let Some(ct) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let essence = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        // gRPC frames its own compression; an event stream is read event by event as it
        // arrives (an encoder would hold events back), whatever `content_types` says.
        if fanout_grpc::looks_like_grpc(essence.as_bytes()) || essence == "text/event-stream" {
            return false;
        }
        policy.types.iter().any(|p| match p {
            TypePattern::Exact(t) => essence == *t,
            TypePattern::Prefix(p) => essence.starts_with(p.as_str()),
            TypePattern::Suffix(s) => essence.ends_with(s.as_str()),
        })
    }
}

/// Process-lived counters: answers compressed and their bytes before and after, by coding;
/// request bodies decoded, by coding, and refused.
#[derive(Default)]
pub struct CompressionStats {
    answers: [AtomicU64; 3],
    bytes_in: [AtomicU64; 3],
    bytes_out: [AtomicU64; 3],
    /// Answers that could have been compressed but went out as they were (the compute queue
    /// full, an encoder failure).
    skipped: AtomicU64,
    decoded: [AtomicU64; 3],
    /// Request bodies refused: an unaccepted coding, too large decoded, corrupt.
    refused: AtomicU64,
}

const CODINGS: [Coding; 3] = [Coding::Zstd, Coding::Br, Coding::Gzip];

impl CompressionStats {
    /// The status page's `compression` section.
    pub fn status_json(&self) -> serde_json::Value {
        let by = |a: &[AtomicU64; 3]| {
            let m: serde_json::Map<String, serde_json::Value> = CODINGS
                .iter()
                .map(|c| {
                    let n = a.get(index(*c)).map_or(0, |n| n.load(Relaxed));
                    (c.name().to_string(), n.into())
                })
                .collect();
            serde_json::Value::Object(m)
        };
        serde_json::json!({
            "answers": by(&self.answers),
            "bytes_before": by(&self.bytes_in),
            "bytes_after": by(&self.bytes_out),
            "answers_skipped": self.skipped.load(Relaxed),
            "request_bodies_decoded": by(&self.decoded),
            "request_bodies_refused": self.refused.load(Relaxed),
        })
    }

    /// The `/metrics` families.
    pub fn metrics(&self, out: &mut Out<'_>) -> std::fmt::Result {
        let families: [(&str, &str, &[AtomicU64; 3]); 4] = [
            (
                "fanout_compressed_answers",
                "Answers sent compressed, by coding",
                &self.answers,
            ),
            (
                "fanout_compressed_answer_bytes_before",
                "Bytes of the answers sent compressed, before compression, by coding",
                &self.bytes_in,
            ),
            (
                "fanout_compressed_answer_bytes_after",
                "Bytes of the answers sent compressed, as sent, by coding",
                &self.bytes_out,
            ),
            (
                "fanout_decoded_request_bodies",
                "Request bodies with a Content-Encoding decoded, by coding",
                &self.decoded,
            ),
        ];
        for (name, help, a) in families {
            out.family(
                name,
                help,
                MetricType::Counter,
                CODINGS.iter().map(|c| {
                    let n = a.get(index(*c)).map_or(0, |n| n.load(Relaxed));
                    ([("coding", c.name())], Value::Counter(n))
                }),
            )?;
        }
        out.single(
            "fanout_compression_skipped",
            "Answers that could have been compressed but were sent as they were (compute queue full)",
            Value::Counter(self.skipped.load(Relaxed)),
        )?;
        out.single(
            "fanout_encoded_request_bodies_refused",
            "Request bodies refused for their Content-Encoding: not accepted, corrupt, or too large decoded",
            Value::Counter(self.refused.load(Relaxed)),
        )
    }
}

fn add(a: &[AtomicU64; 3], c: Coding, n: u64) {
    if let Some(x) = a.get(index(c)) {
        x.fetch_add(n, Relaxed);
    }
}

/// A [`Choice`] as the stage's note, and back.
fn note_of(c: Choice) -> u64 {
    match c {
        Choice::Identity => 0,
        Choice::NotAcceptable => 1,
        Choice::Encode(c) => 2 + index(c) as u64,
    }
}

fn choice_of(note: u64) -> Choice {
    match note {
        2 => Choice::Encode(Coding::Zstd),
        3 => Choice::Encode(Coding::Br),
        4 => Choice::Encode(Coding::Gzip),
        1 => Choice::NotAcceptable,
        _ => Choice::Identity,
    }
}

impl CompressionStage {
    /// What to encode of `answer` under `choice` (the coding, its level and the whole body),
    /// after adding `Vary: Accept-Encoding` to an answer that qualifies; `None` when it is
    /// sent as it is.
    fn to_encode(&self, choice: Choice, answer: &mut Answer) -> Option<(Coding, i32, Bytes)> {
        let policy = self.table.response.as_ref()?;
        let status = answer.status();
        if status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return None;
        }
        let h = answer.headers();
        if h.contains_key(CONTENT_ENCODING)
            || h.get_all(CACHE_CONTROL).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|s| s.to_ascii_lowercase().contains("no-transform"))
            })
            || !self.table.compressible(policy, h)
        {
            return None;
        }
        let data = match answer.body() {
            Body::Full {
                data: Some(d),
                trailers: None,
            } if d.len() >= policy.min_bytes => d.clone(),
            _ => return None,
        };
        // The answer depends on `Accept-Encoding` from here on, compressed or not.
        vary(answer.headers_mut());
        let Choice::Encode(c) = choice else {
            return None;
        };
        let level = policy.levels.get(index(c)).copied().unwrap_or(1);
        Some((c, level, data))
    }

    /// Put the encoded body on `answer` (or leave it plain when encoding failed: counted).
    fn finish(&self, answer: &mut Answer, c: Coding, len: usize, encoded: Result<Vec<u8>, String>) {
        let encoded = match encoded {
            Ok(e) => e,
            Err(e) => {
                self.stats.skipped.fetch_add(1, Relaxed);
                tracing::debug!(error = %e, "answer sent uncompressed");
                return;
            }
        };
        let s = &self.stats;
        add(&s.answers, c, 1);
        add(&s.bytes_in, c, len as u64);
        add(&s.bytes_out, c, encoded.len() as u64);
        let h = answer.headers_mut();
        h.insert(CONTENT_ENCODING, HeaderValue::from_static(c.name()));
        h.remove(CONTENT_LENGTH);
        if let Some(tag) = h.get(ETAG)
            && tag.as_bytes().first() == Some(&b'"')
        {
            let mut weak = b"W/".to_vec();
            weak.extend_from_slice(tag.as_bytes());
            if let Ok(v) = HeaderValue::from_bytes(&weak) {
                h.insert(ETAG, v);
            }
        }
        *answer.body_mut() = Body::full(Bytes::from(encoded));
    }

    /// The request body `bytes` decoded by its `Content-Encoding` (`identity` or none: as it
    /// is), with `limit` on the decoded size: 415 `unsupported_encoding` for a coding the config
    /// does not accept, 413 `body_too_large` for a body decoding past the limit (decoding stops
    /// there), 400 `bad_encoding` for data that does not decode. Called for bodies over
    /// [`DECODE_ON_POOL_ABOVE`]: decoded on the compute pool.
    async fn decode_on_pool(
        &self,
        c: Coding,
        bytes: Bytes,
        limit: usize,
        tools: Tools<'_>,
    ) -> Result<Bytes, Rejection> {
        let decoded = tools
            .compute
            .run(move || fanout_compress::decode(c, &bytes, limit))
            .await
            .map_err(|e| {
                Rejection::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "overloaded",
                    "the gateway is overloaded; retry later",
                )
                .detail(e.to_string())
            })?;
        self.decoded(c, decoded)
    }

    fn decoded(
        &self,
        c: Coding,
        decoded: Result<Vec<u8>, fanout_compress::Error>,
    ) -> Result<Bytes, Rejection> {
        match decoded {
            Ok(d) => {
                add(&self.stats.decoded, c, 1);
                Ok(Bytes::from(d))
            }
            Err(fanout_compress::Error::TooLarge { limit }) => Err(self.refused(Rejection::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "request body decodes to more than {limit} bytes (server.max_body_bytes applies to the decoded size)"
                ),
            ))),
            Err(e) => Err(self.refused(
                Rejection::new(
                    StatusCode::BAD_REQUEST,
                    "bad_encoding",
                    format!("the request body is not valid {}", c.name()),
                )
                .detail(e.to_string()),
            )),
        }
    }

    fn refused(&self, r: Rejection) -> Rejection {
        self.stats.refused.fetch_add(1, Relaxed);
        r
    }
}

impl EdgeStage for CompressionStage {
    fn applies(&self, _route: usize, _kind: RouteKind) -> bool {
        // Arrival, body and answer phases only: nothing to do on the request head.
        false
    }

    fn on_request<'a>(&'a self, _head: &'a mut RequestHead<'_>) -> Step<'a> {
        Step::Next
    }

    fn arrives(&self) -> bool {
        self.table.response.is_some()
    }

    fn on_arrival(&self, arrival: &mut Arrival<'_>) -> Early {
        if let Some(choice) = self.table.choose(arrival) {
            arrival.keep(note_of(choice));
        }
        Early::Next
    }

    fn reads_body(&self) -> bool {
        true
    }

    fn on_body<'a>(
        &'a self,
        headers: &'a HeaderMap,
        body: Bytes,
        limit: usize,
        tools: Tools<'a>,
    ) -> BodyStep<'a> {
        if !headers.contains_key(CONTENT_ENCODING) {
            return BodyStep::Done(Ok(body));
        }
        let c = match request_coding(&self.table, headers) {
            Ok(None) => return BodyStep::Done(Ok(body)),
            Ok(Some(c)) => c,
            Err(Unsupported) => {
                return BodyStep::Done(Err(self.refused(unsupported(&self.table))));
            }
        };
        if body.len() > DECODE_ON_POOL_ABOVE {
            return BodyStep::Wait(Box::pin(self.decode_on_pool(c, body, limit, tools)));
        }
        BodyStep::Done(self.decoded(c, fanout_compress::decode(c, &body, limit)))
    }

    fn on_answer<'a>(&'a self, note: u64, answer: &'a mut Answer, tools: Tools<'a>) -> Later<'a> {
        let Some((c, level, data)) = self.to_encode(choice_of(note), answer) else {
            return Later::Done;
        };
        let len = data.len();
        let above = self
            .table
            .response
            .as_ref()
            .is_some_and(|p| len > p.compute_above);
        if !above {
            let encoded = fanout_compress::encode(c, level, &data).map_err(|e| e.to_string());
            self.finish(answer, c, len, encoded);
            return Later::Done;
        }
        Later::Wait(Box::pin(async move {
            let encoded = tools
                .compute
                .run(move || fanout_compress::encode(c, level, &data))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            self.finish(answer, c, len, encoded);
        }))
    }

    fn status_json(&self) -> Option<serde_json::Value> {
        Some(self.stats.status_json())
    }

    fn metrics(&self, out: &mut Out<'_>) -> std::fmt::Result {
        self.stats.metrics(out)
    }

    fn explain(&self, route: usize) -> Vec<String> {
        match self.table.off_by_route.get(route) {
            Some(true) => vec!["compression: off (answers are sent as they are)".to_string()],
            _ => Vec::new(),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The coding of a request body: `None` for none or `identity`, an error answer for a coding
/// (or a list of several) the config does not accept.
fn request_coding(
    table: &CompressionTable,
    headers: &HeaderMap,
) -> Result<Option<Coding>, Unsupported> {
    let listed = headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .map(|v| v.as_bytes());
    let first = match fanout_compress::listed_coding(listed) {
        fanout_compress::Listed::None => return Ok(None),
        fanout_compress::Listed::One(first) => first,
        fanout_compress::Listed::Several => return Err(Unsupported),
    };
    Coding::from_token(first)
        .filter(|c| table.decode.contains(c))
        .map(Some)
        .ok_or(Unsupported)
}

/// A request body's `Content-Encoding` that the config does not accept (or several).
struct Unsupported;

/// 415 `unsupported_encoding`, with `Accept-Encoding` naming the codings accepted.
fn unsupported(table: &CompressionTable) -> Rejection {
    let accepted: Vec<&str> = table.decode.iter().map(|c| c.name()).collect();
    let message = if accepted.is_empty() {
        "request bodies with a Content-Encoding are not accepted".to_string()
    } else {
        format!(
            "the request body's Content-Encoding is not accepted (accepted: {})",
            accepted.join(", ")
        )
    };
    let r = Rejection::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_encoding",
        message,
    );
    match accept_encoding_value(&table.decode) {
        Some(v) => r.header(ACCEPT_ENCODING, v),
        None => r,
    }
}

/// `Accept-Encoding` naming `codings` (RFC 9110 §12.5.3: a 415 for a request's coding says
/// which it would accept); `None` for none.
pub fn accept_encoding_value(codings: &[Coding]) -> Option<HeaderValue> {
    if codings.is_empty() {
        return None;
    }
    let names: Vec<&str> = codings.iter().map(|c| c.name()).collect();
    HeaderValue::from_str(&names.join(", ")).ok()
}

/// Add `Accept-Encoding` to the answer's `Vary` (beside `Origin` from CORS).
fn vary(headers: &mut HeaderMap) {
    let present = headers.get_all(VARY).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("accept-encoding") || t.trim() == "*")
        })
    });
    if !present {
        headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
}
