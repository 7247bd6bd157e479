//! `hyper-aggregator`: the load lab's baseline — the two example flows of `examples/`
//! (`hh-vacancies` and `product-page`) written by hand on tokio + hyper 1 + hyper-util, with no
//! framework, no config and no expression engine. It answers exactly what fanout answers for those
//! flows (same status codes, same JSON bytes, same `x-fanout-partial` header, same timeouts and
//! deadline forwarding), so the lab can show what the orchestration layer costs against the
//! practical limit of the stack it is built on.
//!
//! - `GET /vacancies?text=…` — search, then each vacancy (at most 8 in flight, in search order).
//! - `POST /product-page` — masks, recommendations (optional) and attribute batches, merged per id.
//! - `GET /posts?page=N` — the lab's `n-plus-one` scenario: 100 posts, each joined with its user.
//!
//! The library holds everything runnable; the binary only parses arguments. Tests call [`serve`]
//! with a [`Config`] pointing at in-process stubs.

mod backend;
mod error;
mod posts;
mod product_page;
mod vacancies;

use backend::Backend;
use bytes::Bytes;
use error::Error;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// Response body type of the server.
pub type Body = Full<Bytes>;

/// Header carrying a deadline in milliseconds: read from clients (it may shorten a route's
/// deadline) and sent to every backend with the budget left for that call — as fanout does.
pub const DEADLINE_HEADER: HeaderName = HeaderName::from_static("x-request-timeout");

/// Header naming the optional calls that failed and fell back to their default (`recs`).
pub const PARTIAL_HEADER: HeaderName = HeaderName::from_static("x-fanout-partial");

/// Listen address when neither `--listen` nor `LISTEN` says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8090";

/// Time in-flight requests get to finish after the shutdown signal (fanout's default).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Largest accepted request body (fanout's default `server.max_body_bytes`); larger → 413.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Backend addresses (`host:port`, plain HTTP). Each field has an environment variable with the
/// same name and default as in the examples' `fanout.yaml` (see [`Config::VARS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `SEARCH_ADDR`, default `127.0.0.1:9101`.
    pub search: String,
    /// `VACANCIES_ADDR`, default `127.0.0.1:9102`.
    pub vacancies: String,
    /// `MASKS_ADDR`, default `127.0.0.1:9201`.
    pub masks: String,
    /// `RECOMMENDATIONS_ADDR`, default `127.0.0.1:9202`.
    pub recommendations: String,
    /// `PRICE_ADDR`, default `127.0.0.1:9203`.
    pub price: String,
    /// `STOCK_ADDR`, default `127.0.0.1:9204`.
    pub stock: String,
    /// `MEDIA_ADDR`, default `127.0.0.1:9205`.
    pub media: String,
    /// `POSTS_ADDR`, default `127.0.0.1:9601` (the lab's `n-plus-one` stubs).
    pub posts: String,
    /// `USERS_ADDR`, default `127.0.0.1:9602`.
    pub users: String,
    /// `ITEM_ADDR`, default `127.0.0.1:9501` (the stub of `fanout lab hop`).
    pub item: String,
}

impl Config {
    /// Every variable with its default address, in field order.
    pub const VARS: [(&'static str, &'static str); 10] = [
        ("SEARCH_ADDR", "127.0.0.1:9101"),
        ("VACANCIES_ADDR", "127.0.0.1:9102"),
        ("MASKS_ADDR", "127.0.0.1:9201"),
        ("RECOMMENDATIONS_ADDR", "127.0.0.1:9202"),
        ("PRICE_ADDR", "127.0.0.1:9203"),
        ("STOCK_ADDR", "127.0.0.1:9204"),
        ("MEDIA_ADDR", "127.0.0.1:9205"),
        ("POSTS_ADDR", "127.0.0.1:9601"),
        ("USERS_ADDR", "127.0.0.1:9602"),
        ("ITEM_ADDR", "127.0.0.1:9501"),
    ];

    /// Addresses from `lookup` (variable name → value); unset or empty variables take their
    /// default, like `${SEARCH_ADDR:-127.0.0.1:9101}` in the examples.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Config {
        let [
            search,
            vacancies,
            masks,
            recommendations,
            price,
            stock,
            media,
            posts,
            users,
            item,
        ] = Self::VARS.map(|(var, default)| {
            lookup(var)
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_string())
        });
        Config {
            search,
            vacancies,
            masks,
            recommendations,
            price,
            stock,
            media,
            posts,
            users,
            item,
        }
    }

    /// Addresses from the process environment.
    pub fn from_env() -> Config {
        Self::from_lookup(|var| std::env::var(var).ok())
    }
}

impl Default for Config {
    /// The examples' default addresses.
    fn default() -> Self {
        Self::from_lookup(|_| None)
    }
}

/// The backends, one pooled client each, with the timeouts of the examples' `fanout.yaml`.
struct App {
    search: Backend,
    vacancies: Backend,
    masks: Backend,
    recommendations: Backend,
    price: Backend,
    stock: Backend,
    media: Backend,
    posts: Backend,
    users: Backend,
    item: Backend,
}

impl App {
    fn new(cfg: &Config) -> App {
        let ms = Duration::from_millis;
        App {
            search: Backend::new("search", &cfg.search, ms(150)),
            vacancies: Backend::new("vacancies", &cfg.vacancies, ms(100)),
            masks: Backend::new("masks", &cfg.masks, ms(100)),
            recommendations: Backend::new("recommendations", &cfg.recommendations, ms(50)),
            price: Backend::new("price", &cfg.price, ms(100)),
            stock: Backend::new("stock", &cfg.stock, ms(100)),
            media: Backend::new("media", &cfg.media, ms(100)),
            posts: Backend::new("posts", &cfg.posts, ms(200)),
            users: Backend::new("users", &cfg.users, ms(200)),
            item: Backend::new("item", &cfg.item, ms(1000)),
        }
    }

    /// Route one request; every failure becomes a JSON error response.
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let start = Instant::now();
        let result = match (req.uri().path(), req.method()) {
            ("/vacancies", &Method::GET) => self.vacancies(req, start).await,
            ("/vacancies", _) => Err(Error::method_not_allowed(&req, "GET")),
            ("/product-page", &Method::POST) => self.product_page(req, start).await,
            ("/product-page", _) => Err(Error::method_not_allowed(&req, "POST")),
            ("/posts", &Method::GET) => self.posts(req, start).await,
            ("/posts", _) => Err(Error::method_not_allowed(&req, "GET")),
            (p, &Method::GET) if p.starts_with("/items/") => self.item(req, start).await,
            (path, _) => Err(Error::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no route for {path}"),
            )),
        };
        result.unwrap_or_else(Error::into_response)
    }

    async fn vacancies(
        &self,
        req: Request<Incoming>,
        start: Instant,
    ) -> Result<Response<Body>, Error> {
        let deadline = deadline(req.headers(), start, Duration::from_millis(500))?;
        within(deadline, vacancies::run(self, req.uri().query(), deadline)).await
    }

    /// `GET /items/{id}` — `fanout lab hop`'s one hop by hand: one call to the item stub, its
    /// JSON answer parsed and sent back (as fanout's `respond: '$got'` does).
    async fn item(&self, req: Request<Incoming>, start: Instant) -> Result<Response<Body>, Error> {
        let deadline = deadline(req.headers(), start, Duration::from_secs(1))?;
        let path = req.uri().path();
        within(deadline, async {
            let got = self.item.get(path, "got", deadline).await?;
            Ok(json_response(&got, None))
        })
        .await
    }

    async fn posts(&self, req: Request<Incoming>, start: Instant) -> Result<Response<Body>, Error> {
        let deadline = deadline(req.headers(), start, Duration::from_secs(1))?;
        within(deadline, posts::run(self, req.uri().query(), deadline)).await
    }

    async fn product_page(
        &self,
        req: Request<Incoming>,
        start: Instant,
    ) -> Result<Response<Body>, Error> {
        let deadline = deadline(req.headers(), start, Duration::from_millis(300))?;
        let body = read_body(req, deadline).await?;
        within(deadline, product_page::run(self, &body, deadline)).await
    }
}

/// The route's deadline, shortened by the client's `x-request-timeout` if it sends one.
fn deadline(headers: &HeaderMap, start: Instant, route_max: Duration) -> Result<Instant, Error> {
    let mut budget = route_max;
    if let Some(v) = headers.get(&DEADLINE_HEADER) {
        let ms = v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                Error::new(
                    StatusCode::BAD_REQUEST,
                    "bad_header",
                    format!("header {DEADLINE_HEADER}: expected a number of milliseconds"),
                )
            })?;
        budget = budget.min(Duration::from_millis(ms));
    }
    Ok(start + budget)
}

/// Run a flow against the request deadline: past it, every call still in flight is dropped.
async fn within(
    deadline: Instant,
    flow: impl Future<Output = Result<Response<Body>, Error>>,
) -> Result<Response<Body>, Error> {
    tokio::time::timeout_at(deadline, flow)
        .await
        .unwrap_or_else(|_| {
            Err(Error::new(
                StatusCode::GATEWAY_TIMEOUT,
                "deadline_exceeded",
                "route deadline exceeded while waiting for the flow",
            ))
        })
}

/// The request body, at most [`MAX_BODY_BYTES`], received before the deadline.
async fn read_body(req: Request<Incoming>, deadline: Instant) -> Result<Bytes, Error> {
    let too_large = || {
        Error::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body exceeds {MAX_BODY_BYTES} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let collect = Limited::new(req.into_body(), MAX_BODY_BYTES).collect();
    match tokio::time::timeout_at(deadline, collect).await {
        Ok(Ok(body)) => Ok(body.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(Error::new(
            StatusCode::BAD_REQUEST,
            "bad_body",
            format!("reading the request body failed: {e}"),
        )),
        Err(_) => Err(Error::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            "the request body did not arrive before the deadline",
        )),
    }
}

/// A 200 JSON response; `partial` names the optional call that fell back, if any.
#[allow(
    clippy::expect_used,
    reason = "a JSON value with string keys always serializes"
)]
fn json_response(body: &serde_json::Value, partial: Option<&'static str>) -> Response<Body> {
    let bytes = serde_json::to_vec(body).expect("a JSON value with string keys always serializes");
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(p) = partial {
        h.insert(PARTIAL_HEADER, HeaderValue::from_static(p));
    }
    resp
}

/// A value as jq string interpolation (`"\(x)"`) renders it: strings as they are, anything
/// else as compact JSON.
fn interpolate(v: &serde_json::Value) -> Cow<'_, str> {
    match v {
        serde_json::Value::String(s) => Cow::Borrowed(s),
        other => Cow::Owned(other.to_string()),
    }
}

/// A list as jq's `join(",")` renders it: strings as they are, null as nothing, anything else as
/// compact JSON.
fn join(items: &[serde_json::Value]) -> String {
    let mut out = String::new();
    for (i, v) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if !v.is_null() {
            out.push_str(&interpolate(v));
        }
    }
    out
}

/// Serve both flows on `listener` (HTTP/1.1 and h2c) until `shutdown` resolves, then stop
/// accepting and give in-flight requests [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let app = Arc::new(App::new(&config));
    // The same server limits as fanout's defaults, so both sides do the same work per request.
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .max_buf_size(16 << 10)
        .header_read_timeout(Duration::from_secs(10))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .max_header_list_size(16 << 10);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(_) => {
                    // Out of file descriptors and the like: back off briefly, keep serving.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Best effort: a socket that refuses TCP_NODELAY still works, only slower.
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(move |req| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(app.handle(req).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A client that goes away mid-request is not an error worth reporting here.
            let _ = conn.await;
        });
    }
    drop(listener);
    // Past the grace period the remaining connections are simply dropped.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
    Ok(())
}

/// Resolves when the process gets Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_match_the_examples() {
        let c = Config::default();
        assert_eq!(c.search, "127.0.0.1:9101");
        assert_eq!(c.vacancies, "127.0.0.1:9102");
        assert_eq!(c.masks, "127.0.0.1:9201");
        assert_eq!(c.recommendations, "127.0.0.1:9202");
        assert_eq!(c.price, "127.0.0.1:9203");
        assert_eq!(c.stock, "127.0.0.1:9204");
        assert_eq!(c.media, "127.0.0.1:9205");
    }

    #[test]
    fn config_takes_set_non_empty_variables() {
        let c = Config::from_lookup(|v| match v {
            "PRICE_ADDR" => Some("10.0.0.1:80".into()),
            "STOCK_ADDR" => Some(String::new()),
            _ => None,
        });
        assert_eq!(c.price, "10.0.0.1:80");
        assert_eq!(c.stock, "127.0.0.1:9204");
    }

    #[test]
    fn client_header_shortens_the_deadline() {
        let start = Instant::now();
        let route = Duration::from_millis(500);
        let mut h = HeaderMap::new();
        assert_eq!(deadline(&h, start, route).ok(), Some(start + route));
        h.insert(DEADLINE_HEADER, HeaderValue::from_static(" 200 "));
        assert_eq!(
            deadline(&h, start, route).ok(),
            Some(start + Duration::from_millis(200))
        );
        h.insert(DEADLINE_HEADER, HeaderValue::from_static("9000"));
        assert_eq!(deadline(&h, start, route).ok(), Some(start + route));
        h.insert(DEADLINE_HEADER, HeaderValue::from_static("soon"));
        assert!(deadline(&h, start, route).is_err());
    }

    #[test]
    fn interpolation_and_join_render_like_jq() {
        use serde_json::json;
        assert_eq!(interpolate(&json!("card")), "card");
        assert_eq!(interpolate(&json!(101)), "101");
        assert_eq!(interpolate(&json!(null)), "null");
        assert_eq!(join(&[]), "");
        assert_eq!(join(&[json!("p1"), json!("p2")]), "p1,p2");
        assert_eq!(join(&[json!("a"), json!(null), json!(7)]), "a,,7");
    }
}
