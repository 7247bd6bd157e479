//! HTTP compression (`compression:`; docs/config.md#compression), over `fanout-compress`:
//!
//! - answers: `Gateway::handle` asks [`CompressionTable::choose`] before the request is
//!   consumed (the client's `Accept-Encoding`, the route's `compression: off`, HEAD), and once
//!   the answer is final (CORS headers included) [`Gateway::compress`] encodes a whole body of a
//!   compressible type, at least `min_bytes` long, that has no `Content-Encoding` and no
//!   `Cache-Control: no-transform`, is not gRPC and not 1xx/204/304 — on the compute pool above
//!   `compute_above_bytes` — with `Vary: Accept-Encoding` and a strong `ETag` made weak;
//! - request bodies: [`Gateway::decode_body`] decodes a body with a `Content-Encoding` the
//!   config accepts, the body limit applying to the decoded size (415 for other codings).
//!
//! Counters of both (by coding) are process-lived ([`CompressionStats`]): `/metrics` and the
//! status page.

use crate::answer::ApiError;
use crate::{Gateway, Live};
use bytes::Bytes;
use fanout_compress::{Choice, Coding};
use fanout_config::{Config, ContentCoding, RouteCompression};
use fanout_flow::RoutePlan;
use fanout_protocol::metrics::{MetricType, Out, Value};
use fanout_transport::body::Body;
use http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG, VARY,
};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The `fanout-compress` coding of a config coding.
pub(crate) fn coding(c: ContentCoding) -> Coding {
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
pub(crate) struct CompressionTable {
    response: Option<ResponsePolicy>,
    off_by_route: Vec<bool>,
    /// Whether any route turns compression off (else no route lookup per request).
    any_off: bool,
    /// The defaults' `compression: off` (answers that match no route).
    default_off: bool,
    decode: Vec<Coding>,
}

/// What [`CompressionTable::choose`] decided for a request: its answer may be compressed, with
/// this outcome of the negotiation.
#[derive(Clone, Copy)]
pub(crate) struct Chosen(Choice);

impl CompressionTable {
    /// Compile `cfg.compression` and the routes' `compression` (`routes` in config order).
    pub(crate) fn build(cfg: &Config, routes: &[Arc<RoutePlan>]) -> CompressionTable {
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
            .zip(routes)
            .map(|(rc, _)| {
                rc.compression.or(cfg.defaults.compression) == Some(RouteCompression::Off)
            })
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
    pub(crate) fn choose<B>(
        &self,
        router: &matchit::Router<Vec<Arc<RoutePlan>>>,
        req: &Request<B>,
    ) -> Option<Chosen> {
        let policy = self.response.as_ref()?;
        if req.method() == Method::HEAD {
            return None;
        }
        let h = req.headers();
        if h.get(CONTENT_TYPE)
            .is_some_and(|v| fanout_grpc::looks_like_grpc(v.as_bytes()))
        {
            return None;
        }
        if self.any_off && self.route_off(router, req.method(), req.uri().path()) {
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
        Some(Chosen(fanout_compress::negotiate(accept, &policy.offered)))
    }

    fn route_off(
        &self,
        router: &matchit::Router<Vec<Arc<RoutePlan>>>,
        method: &Method,
        path: &str,
    ) -> bool {
        let Ok(m) = router.at(path) else {
            return self.default_off;
        };
        let off = |r: &Arc<RoutePlan>| self.off_by_route.get(r.index).copied().unwrap_or(false);
        match m.value.iter().find(|r| r.method == *method) {
            Some(r) => off(r),
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
        if fanout_grpc::looks_like_grpc(essence.as_bytes()) {
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
pub(crate) struct CompressionStats {
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
    pub(crate) fn status_json(&self) -> serde_json::Value {
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
    pub(crate) fn metrics(&self, out: &mut Out<'_>) -> std::fmt::Result {
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

impl Gateway {
    /// Compress the final answer `resp` when it qualifies (see the module doc); otherwise it is
    /// returned as it is. Never fails: an answer that cannot be encoded (compute queue full) is
    /// sent plain.
    pub(crate) async fn compress(
        &self,
        live: &Live,
        chosen: Chosen,
        mut resp: Response<Body>,
    ) -> Response<Body> {
        let Some(policy) = live.compression.response.as_ref() else {
            return resp;
        };
        let status = resp.status();
        if status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return resp;
        }
        let h = resp.headers();
        if h.contains_key(CONTENT_ENCODING)
            || h.get_all(CACHE_CONTROL).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|s| s.to_ascii_lowercase().contains("no-transform"))
            })
            || !live.compression.compressible(policy, h)
        {
            return resp;
        }
        let data = match resp.body() {
            Body::Full {
                data: Some(d),
                trailers: None,
            } if d.len() >= policy.min_bytes => d.clone(),
            _ => return resp,
        };
        // The answer depends on `Accept-Encoding` from here on, compressed or not.
        vary(resp.headers_mut());
        let Chosen(Choice::Encode(c)) = chosen else {
            return resp;
        };
        let level = policy.levels.get(index(c)).copied().unwrap_or(1);
        let len = data.len();
        let encoded = if len > policy.compute_above {
            let data = data.clone();
            self.compute
                .run(move || fanout_compress::encode(c, level, &data))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        } else {
            fanout_compress::encode(c, level, &data).map_err(|e| e.to_string())
        };
        let encoded = match encoded {
            Ok(e) => e,
            Err(e) => {
                self.compression_stats.skipped.fetch_add(1, Relaxed);
                tracing::debug!(error = %e, "answer sent uncompressed");
                return resp;
            }
        };
        let s = &self.compression_stats;
        add(&s.answers, c, 1);
        add(&s.bytes_in, c, len as u64);
        add(&s.bytes_out, c, encoded.len() as u64);
        let h = resp.headers_mut();
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
        *resp.body_mut() = Body::full(Bytes::from(encoded));
        resp
    }

    /// The request body `bytes` decoded by its `Content-Encoding` (`identity` or none: as it
    /// is), with `limit` on the decoded size: 415 `unsupported_encoding` for a coding the config
    /// does not accept, 413 `body_too_large` for a body decoding past the limit (decoding stops
    /// there), 400 `bad_encoding` for data that does not decode. Large bodies are decoded on
    /// the compute pool.
    pub(crate) async fn decode_body(
        &self,
        live: &Live,
        headers: &HeaderMap,
        bytes: Bytes,
        limit: usize,
    ) -> Result<Bytes, ApiError> {
        let refused = |e: ApiError| {
            self.compression_stats.refused.fetch_add(1, Relaxed);
            e
        };
        let c = match request_coding(&live.compression, headers) {
            Ok(None) => return Ok(bytes),
            Ok(Some(c)) => c,
            Err(Unsupported) => return Err(refused(unsupported(&live.compression))),
        };
        let decoded = if bytes.len() > 64 * 1024 {
            self.compute
                .run(move || fanout_compress::decode(c, &bytes, limit))
                .await
                .map_err(|e| {
                    let mut err = ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "overloaded",
                        "the gateway is overloaded; retry later",
                    );
                    err.detail = Some(e.to_string());
                    err
                })?
        } else {
            fanout_compress::decode(c, &bytes, limit)
        };
        match decoded {
            Ok(d) => {
                add(&self.compression_stats.decoded, c, 1);
                Ok(Bytes::from(d))
            }
            Err(fanout_compress::Error::TooLarge { limit }) => Err(refused(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "request body decodes to more than {limit} bytes (server.max_body_bytes applies to the decoded size)"
                ),
            ))),
            Err(e) => {
                let mut err = ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_encoding",
                    format!("the request body is not valid {}", c.name()),
                );
                err.detail = Some(e.to_string());
                Err(refused(err))
            }
        }
    }

    /// The compression counters (process-lived).
    pub(crate) fn compression_stats(&self) -> &CompressionStats {
        &self.compression_stats
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
fn unsupported(table: &CompressionTable) -> ApiError {
    let accepted: Vec<&str> = table.decode.iter().map(|c| c.name()).collect();
    let message = if accepted.is_empty() {
        "request bodies with a Content-Encoding are not accepted".to_string()
    } else {
        format!(
            "the request body's Content-Encoding is not accepted (accepted: {})",
            accepted.join(", ")
        )
    };
    let mut e = ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_encoding",
        message,
    );
    if let Some(v) = accept_encoding_value(&table.decode) {
        e.headers.push((ACCEPT_ENCODING, v));
    }
    e
}

/// `Accept-Encoding` naming `codings` (RFC 9110 §12.5.3: a 415 for a request's coding says
/// which it would accept); `None` for none.
pub(crate) fn accept_encoding_value(codings: &[Coding]) -> Option<HeaderValue> {
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
