//! CORS (`cors:` in the defaults or a route; docs/config.md#cors), an edge stage of the arrival
//! phase: a browser's preflight `OPTIONS` is answered here, before routing, authentication or
//! any flow; every other request of a config that uses CORS gets `Vary: Origin` on its answer,
//! and a request from an allowed origin the CORS headers — whatever makes the answer (the flow,
//! a refusal, a 404). Policies are compiled once per config.

use crate::{Arrival, BuildCx, Early, EdgeStage, Registration, RequestHead, RouteKind, Step};
use fanout_config::{ConfigErrors, Cors};
use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The stage's registration line.
pub const STAGE: Registration = Registration {
    name: "cors",
    section: false,
    codes: &["cors_refused"],
    build,
    schema: None,
};

/// The answer headers a page may read when `expose_headers` is not set (besides the request id
/// header, added per gateway).
const EXPOSED_BY_DEFAULT: &[&str] = &[
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
    "www-authenticate",
    "server-timing",
];

/// The most request headers a preflight may name (`Access-Control-Request-Headers`); a longer
/// list is refused.
const MAX_REQUESTED_HEADERS: usize = 64;

/// One route's compiled `cors:`.
struct CorsPolicy {
    any_origin: bool,
    null_origin: bool,
    /// Exact origins, lower case.
    exact: Vec<String>,
    /// Patterns: (scheme, host labels with `*` for one label, `:port` or empty), lower case.
    patterns: Vec<(String, Vec<String>, String)>,
    methods: Vec<Method>,
    methods_value: HeaderValue,
    any_header: bool,
    /// Allowed request headers, lower case.
    headers: Vec<String>,
    expose: Option<HeaderValue>,
    credentials: bool,
    max_age: HeaderValue,
}

/// The CORS policies of a loaded config, by route index, and the defaults' (for answers that
/// match no route: 404, 405).
pub struct CorsStage {
    by_route: Vec<Option<Arc<CorsPolicy>>>,
    default: Option<Arc<CorsPolicy>>,
    /// Whether any route or the defaults use CORS (else the stage has no arrival phase).
    any: bool,
    /// Preflights answered, allowed and refused (the status endpoint), since the config was
    /// loaded.
    preflights: [AtomicU64; 2],
}

/// `(method, path)` of each route of the config, as the gateway routes it (a gRPC method is
/// `POST /package.Service/Method`).
fn route_keys(cfg: &fanout_config::Config) -> Vec<(Method, String)> {
    cfg.routes
        .iter()
        .map(|r| match &r.grpc {
            Some(g) => (Method::POST, format!("/{}", g.value)),
            None => (
                Method::from_bytes(r.method.value.trim().as_bytes()).unwrap_or(Method::GET),
                r.path.value.clone(),
            ),
        })
        .collect()
}

/// Compile every route's `cors` (or the defaults'). The config was checked at load (`Cors::check`); a value that still does not fit a
/// header is left out.
fn build(cx: &BuildCx<'_>) -> Result<Option<Arc<dyn EdgeStage>>, ConfigErrors> {
    let cfg = cx.config;
    let rid_header = &cfg.server.request_id_header;
    let keys = route_keys(cfg);
    let compile = |c: &Cors, path: &str| -> Option<Arc<CorsPolicy>> {
        if !c.enabled {
            return None;
        }
        let path_methods: Vec<Method> = keys
            .iter()
            .filter(|(_, p)| p == path)
            .map(|(m, _)| m.clone())
            .collect();
        Some(Arc::new(CorsPolicy::compile(c, &path_methods, rid_header)))
    };
    let by_route: Vec<Option<Arc<CorsPolicy>>> = cfg
        .routes
        .iter()
        .zip(&keys)
        .map(|(rc, (_, path))| {
            let c = rc.cors.as_ref().or(cfg.defaults.cors.as_ref())?;
            compile(c, path)
        })
        .collect();
    let default = cfg.defaults.cors.as_ref().and_then(|c| {
        let mut all: Vec<Method> = keys.iter().map(|(m, _)| m.clone()).collect();
        all.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        all.dedup();
        c.enabled
            .then(|| Arc::new(CorsPolicy::compile(c, &all, rid_header)))
    });
    // Built without CORS too (its status section is `null` then), but with no arrival phase:
    // nothing runs per request.
    let any = default.is_some() || by_route.iter().any(Option::is_some);
    Ok(Some(Arc::new(CorsStage {
        by_route,
        default,
        any,
        preflights: Default::default(),
    })))
}

impl CorsStage {
    /// The policy of the route `method` matches among the routes at the request's path; for
    /// a path with no such method, the policy of a route on the path; for no route, the
    /// defaults'.
    fn policy(&self, arrival: &mut Arrival<'_>, method: &Method) -> Option<&Arc<CorsPolicy>> {
        let routes = arrival.routes();
        if routes.is_empty() {
            return self.default.as_ref();
        }
        let of = |i: usize| self.by_route.get(i).and_then(Option::as_ref);
        match routes.iter().find(|r| r.method == *method) {
            Some(r) => of(r.index),
            None => routes.iter().find_map(|r| of(r.index)),
        }
    }

    /// A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) to a CORS
    /// route: 204 with the allow headers, or 403 `cors_refused` naming what is not allowed (an
    /// origin, a method, a header). `None` for any other request (an `OPTIONS` to a route
    /// without CORS goes on to routing: 405, or the route's own `OPTIONS`).
    fn preflight(&self, arrival: &mut Arrival<'_>) -> Option<Early> {
        if *arrival.method != Method::OPTIONS {
            return None;
        }
        let h = arrival.headers;
        let origin = h.get(ORIGIN)?;
        let asked = h.get(ACCESS_CONTROL_REQUEST_METHOD)?;
        let asked_method = Method::from_bytes(asked.as_bytes()).ok();
        let policy = match &asked_method {
            Some(m) => self.policy(arrival, m),
            None => self.policy(arrival, &Method::OPTIONS),
        }?;
        let vary = [
            HeaderValue::from_static("Origin"),
            HeaderValue::from_static(
                "Access-Control-Request-Method, Access-Control-Request-Headers",
            ),
        ];
        Some(match policy.preflight(origin, asked_method.as_ref(), h) {
            Ok(mut headers) => {
                self.preflights[0].fetch_add(1, Ordering::Relaxed);
                for v in vary {
                    headers.append(VARY, v);
                }
                Early::Answer {
                    status: StatusCode::NO_CONTENT,
                    headers,
                }
            }
            Err(why) => {
                self.preflights[1].fetch_add(1, Ordering::Relaxed);
                let mut r = crate::Rejection::new(StatusCode::FORBIDDEN, "cors_refused", why);
                for v in vary {
                    r = r.header(VARY, v);
                }
                Early::Refuse(r)
            }
        })
    }
}

impl EdgeStage for CorsStage {
    fn applies(&self, _route: usize, _kind: RouteKind) -> bool {
        // Arrival phase only: nothing to do on the request head.
        false
    }

    fn on_request<'a>(&'a self, _head: &'a mut RequestHead<'_>) -> Step<'a> {
        Step::Next
    }

    fn arrives(&self) -> bool {
        self.any
    }

    fn on_arrival(&self, arrival: &mut Arrival<'_>) -> Early {
        if let Some(done) = self.preflight(arrival) {
            return done;
        }
        // A shared cache must not serve one origin's answer to another: `Vary: Origin` on
        // every answer of a config that uses CORS, whether or not this request came from a
        // page.
        arrival.answer_header(VARY, HeaderValue::from_static("Origin"), true);
        let Some(origin) = arrival.headers.get(ORIGIN) else {
            return Early::Next;
        };
        let Some(p) = self.policy(arrival, arrival.method) else {
            return Early::Next;
        };
        if !p.allows_origin(origin) {
            return Early::Next;
        }
        let (allow, credentials, expose) = (
            p.allow_origin_value(origin),
            p.credentials,
            p.expose.clone(),
        );
        arrival.answer_header(ACCESS_CONTROL_ALLOW_ORIGIN, allow, false);
        if credentials {
            arrival.answer_header(
                ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
                false,
            );
        }
        if let Some(e) = expose {
            arrival.answer_header(ACCESS_CONTROL_EXPOSE_HEADERS, e, false);
        }
        Early::Next
    }

    fn status_json(&self) -> Option<serde_json::Value> {
        if !self.any {
            return Some(serde_json::Value::Null);
        }
        Some(serde_json::json!({
            "preflights_allowed": self.preflights[0].load(Ordering::Relaxed),
            "preflights_refused": self.preflights[1].load(Ordering::Relaxed),
        }))
    }

    fn explain(&self, route: usize) -> Vec<String> {
        match self.by_route.get(route).and_then(Option::as_ref) {
            Some(p) => vec![format!(
                "cors: {} origin(s){}, methods {}{}",
                p.exact.len()
                    + p.patterns.len()
                    + usize::from(p.any_origin)
                    + usize::from(p.null_origin),
                if p.any_origin { " (any)" } else { "" },
                p.methods_value.to_str().unwrap_or(""),
                if p.credentials {
                    ", with credentials"
                } else {
                    ""
                }
            )],
            None => Vec::new(),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl CorsPolicy {
    fn compile(c: &Cors, path_methods: &[Method], rid_header: &str) -> CorsPolicy {
        let mut exact = Vec::new();
        let mut patterns = Vec::new();
        let (mut any_origin, mut null_origin) = (false, false);
        for o in &c.origins {
            let o = o.value.trim().to_ascii_lowercase();
            if o == "*" {
                any_origin = true;
            } else if o == "null" {
                null_origin = true;
            } else if o.contains('*') {
                if let Some(p) = split_origin(&o) {
                    patterns.push((p.0.to_string(), labels(p.1), p.2.to_string()));
                }
            } else {
                exact.push(o);
            }
        }
        let mut methods: Vec<Method> = if c.methods.is_empty() {
            path_methods.to_vec()
        } else {
            c.methods
                .iter()
                .filter_map(|m| Method::from_bytes(m.value.trim().as_bytes()).ok())
                .collect()
        };
        methods.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        methods.dedup();
        let joined = methods
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        let headers: Vec<String> = c
            .headers
            .iter()
            .map(|h| h.value.trim().to_ascii_lowercase())
            .collect();
        let expose: Vec<String> = match &c.expose_headers {
            Some(list) => list.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
            None => std::iter::once(rid_header.to_ascii_lowercase())
                .chain(EXPOSED_BY_DEFAULT.iter().map(|s| s.to_string()))
                .collect(),
        };
        CorsPolicy {
            any_origin,
            null_origin,
            exact,
            patterns,
            methods_value: HeaderValue::from_str(&joined)
                .unwrap_or_else(|_| HeaderValue::from_static("GET")),
            methods,
            any_header: headers.iter().any(|h| h == "*"),
            headers,
            expose: (!expose.is_empty())
                .then(|| HeaderValue::from_str(&expose.join(", ")).ok())
                .flatten(),
            credentials: c.credentials,
            max_age: HeaderValue::from(c.max_age.0.as_secs()),
        }
    }

    fn allows_origin(&self, origin: &HeaderValue) -> bool {
        let Ok(o) = origin.to_str() else {
            return false;
        };
        if o == "null" {
            return self.null_origin;
        }
        if self.any_origin {
            return true;
        }
        let o = o.to_ascii_lowercase();
        if self.exact.contains(&o) {
            return true;
        }
        let Some((scheme, host, port)) = split_origin(&o) else {
            return false;
        };
        let got = labels(host);
        self.patterns.iter().any(|(s, want, p)| {
            *s == scheme
                && *p == port
                && want.len() == got.len()
                && want
                    .iter()
                    .zip(&got)
                    .all(|(w, g)| (w == "*" && !g.is_empty()) || w == g)
        })
    }

    /// `*` for any origin without credentials; else the origin itself.
    fn allow_origin_value(&self, origin: &HeaderValue) -> HeaderValue {
        if self.any_origin && !self.credentials {
            HeaderValue::from_static("*")
        } else {
            origin.clone()
        }
    }

    /// The preflight's allow headers, or why it is refused (safe for the client: it names
    /// what the page asked for).
    fn preflight(
        &self,
        origin: &HeaderValue,
        method: Option<&Method>,
        h: &HeaderMap,
    ) -> Result<HeaderMap, String> {
        if !self.allows_origin(origin) {
            return Err(format!(
                "origin `{}` may not call this route (cors.origins)",
                String::from_utf8_lossy(origin.as_bytes())
            ));
        }
        if !method.is_some_and(|m| self.methods.contains(m)) {
            return Err(format!(
                "method `{}` is not allowed from other origins on this path (cors.methods)",
                method.map(|m| m.as_str().to_string()).unwrap_or_else(|| {
                    h.get(ACCESS_CONTROL_REQUEST_METHOD)
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .unwrap_or_default()
                })
            ));
        }
        let mut out = HeaderMap::new();
        let asked = h
            .get_all(ACCESS_CONTROL_REQUEST_HEADERS)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty());
        let mut names = Vec::new();
        for name in asked {
            if names.len() == MAX_REQUESTED_HEADERS {
                return Err(format!(
                    "more than {MAX_REQUESTED_HEADERS} request headers asked for"
                ));
            }
            let lower = name.to_ascii_lowercase();
            // `*` never covers `authorization` (the Fetch standard).
            let ok = self.headers.contains(&lower)
                || (self.any_header && !self.credentials && lower != "authorization");
            if !ok {
                return Err(format!(
                    "request header `{lower}` is not allowed from other origins (cors.headers)"
                ));
            }
            names.push(lower);
        }
        out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, self.allow_origin_value(origin));
        if self.credentials {
            out.insert(
                ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        out.insert(ACCESS_CONTROL_ALLOW_METHODS, self.methods_value.clone());
        if !names.is_empty()
            && let Ok(v) = HeaderValue::from_str(&names.join(", "))
        {
            out.insert(ACCESS_CONTROL_ALLOW_HEADERS, v);
        }
        out.insert(ACCESS_CONTROL_MAX_AGE, self.max_age.clone());
        Ok(out)
    }
}

/// `scheme://host[:port]` → (scheme, host, `:port` or empty).
fn split_origin(o: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = o.split_once("://")?;
    match rest.rfind(':') {
        Some(i) if !rest[i..].contains(']') => Some((scheme, &rest[..i], &rest[i..])),
        _ => Some((scheme, rest, "")),
    }
}

fn labels(host: &str) -> Vec<String> {
    host.split('.').map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanout_config::Located;

    fn policy(origins: &[&str], credentials: bool) -> CorsPolicy {
        let c = Cors {
            enabled: true,
            origins: origins
                .iter()
                .map(|o| Located::unknown(o.to_string()))
                .collect(),
            methods: vec![],
            headers: vec![Located::unknown("authorization".into())],
            expose_headers: None,
            credentials,
            max_age: fanout_config::Dur::secs(600),
        };
        CorsPolicy::compile(&c, &[Method::GET], "x-request-id")
    }

    fn allows(p: &CorsPolicy, o: &str) -> bool {
        p.allows_origin(&HeaderValue::from_str(o).unwrap())
    }

    #[test]
    fn origins_match_exactly_or_by_one_label() {
        let p = policy(&["https://app.example.com", "https://*.example.org"], false);
        assert!(allows(&p, "https://app.example.com"));
        assert!(allows(&p, "HTTPS://APP.example.com"));
        assert!(!allows(&p, "http://app.example.com"));
        assert!(!allows(&p, "https://app.example.com:8443"));
        assert!(!allows(&p, "https://app.example.com.evil.net"));
        assert!(allows(&p, "https://eu.example.org"));
        assert!(!allows(&p, "https://a.b.example.org"));
        assert!(!allows(&p, "https://example.org"));
        assert!(!allows(&p, "https://eu.example.org.evil.net"));
        assert!(!allows(&p, "null"));
        let any = policy(&["*"], false);
        assert!(allows(&any, "https://anything.test"));
        assert!(!allows(&any, "null"), "`null` only when listed");
        assert!(allows(&policy(&["null"], false), "null"));
    }

    #[test]
    fn any_origin_is_echoed_only_with_credentials() {
        let o = HeaderValue::from_static("https://a.test");
        assert_eq!(policy(&["*"], false).allow_origin_value(&o), "*");
        let p = policy(&["https://a.test"], true);
        assert_eq!(p.allow_origin_value(&o), "https://a.test");
    }

    #[test]
    fn a_preflight_names_what_it_refuses() {
        let p = policy(&["https://a.test"], false);
        let o = HeaderValue::from_static("https://a.test");
        let mut h = HeaderMap::new();
        h.insert(
            ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_static("Authorization, X-Secret"),
        );
        let e = p.preflight(&o, Some(&Method::GET), &h).unwrap_err();
        assert!(e.contains("x-secret"), "{e}");
        let e = p.preflight(&o, Some(&Method::DELETE), &h).unwrap_err();
        assert!(e.contains("DELETE"), "{e}");
        h.insert(
            ACCESS_CONTROL_REQUEST_HEADERS,
            HeaderValue::from_static("authorization"),
        );
        let ok = p.preflight(&o, Some(&Method::GET), &h).unwrap();
        assert_eq!(ok[ACCESS_CONTROL_ALLOW_HEADERS], "authorization");
        assert_eq!(ok[ACCESS_CONTROL_ALLOW_METHODS], "GET");
        assert_eq!(ok[ACCESS_CONTROL_MAX_AGE], "600");
        let e = p
            .preflight(
                &HeaderValue::from_static("https://b.test"),
                Some(&Method::GET),
                &h,
            )
            .unwrap_err();
        assert!(e.contains("https://b.test"), "{e}");
    }
}
