//! Structural checks of a loaded config that need no knowledge of flows.

use crate::{Config, ConfigError, Located, MissingPolicy, Pos, StatusAction, StatusPattern, Step};

impl Config {
    /// A `grpc:` route's path is `/package.Service/Method` and its method POST; a route needs
    /// a `path` or a `grpc` method, not both.
    pub(crate) fn normalize_grpc_routes(&mut self, errs: &mut Vec<ConfigError>) {
        for r in &mut self.routes {
            let Some(g) = &r.grpc else {
                if r.path.value.is_empty() && r.path.pos.line == 0 {
                    errs.push(
                        ConfigError::at(
                            r.method.pos,
                            "a route needs a `path` (or a `grpc` method)",
                        )
                        .hint(
                            "write e.g. `path: /vacancies/{id}`, or `grpc: demo.v1.Users/GetUser`",
                        ),
                    );
                }
                continue;
            };
            if r.path.pos.line != 0 {
                errs.push(
                    ConfigError::at(r.path.pos, "a `grpc` route has no `path`")
                        .hint("its path is `/package.Service/Method`; remove `path`"),
                );
            }
            if r.method.pos.line != 0 && !r.method.value.eq_ignore_ascii_case("POST") {
                errs.push(
                    ConfigError::at(r.method.pos, "a `grpc` route's method is POST")
                        .hint("remove `method`"),
                );
            }
            let name = g.value.trim().trim_start_matches('/');
            let ok = name
                .split_once('/')
                .is_some_and(|(s, m)| !s.is_empty() && !m.is_empty() && !m.contains('/'));
            if !ok {
                errs.push(
                    ConfigError::at(g.pos, format!("`{}` is not a gRPC method name", g.value))
                        .hint("write `package.Service/Method`, e.g. `demo.v1.Users/GetUser`"),
                );
            }
            r.path = Located {
                value: format!("/{name}"),
                pos: g.pos,
                used: g.used,
                quoted: g.quoted,
            };
            r.method = Located {
                value: "POST".into(),
                pos: r.method.pos,
                used: r.method.used,
                quoted: false,
            };
        }
    }

    pub(crate) fn check(&self, errs: &mut Vec<ConfigError>) {
        self.admin.check(errs);
        for cors in self
            .routes
            .iter()
            .filter_map(|r| r.cors.as_ref())
            .chain(self.defaults.cors.as_ref())
        {
            cors.check(errs);
        }
        let mut seen: Vec<(&str, &str, Pos)> = Vec::new();
        for r in &self.routes {
            let method = r.method.value.to_ascii_uppercase();
            if !r.path.value.starts_with('/') {
                errs.push(
                    ConfigError::at(
                        r.path.pos,
                        format!("route path `{}` must start with `/`", r.path.value),
                    )
                    .hint("write e.g. `/vacancies/{id}`"),
                );
            }
            if let Some((_, _, first)) = seen
                .iter()
                .find(|(m, p, _)| m.eq_ignore_ascii_case(&method) && *p == r.path.value)
            {
                // Where each route is used: a route repeated through a YAML alias has the
                // same text (`pos`) as the one it repeats.
                errs.push(
                    ConfigError::at(
                        r.path.used,
                        format!(
                            "duplicate route {method} {} (first defined at line {})",
                            r.path.value, first.line
                        ),
                    )
                    .hint("each method + path may appear once; merge the two routes"),
                );
            } else {
                seen.push((r.method.value.as_str(), r.path.value.as_str(), r.path.used));
            }
            for (name, step) in &r.flow {
                step_check(name, step, errs);
            }
            crate::pass::check_route(r, self.server.connections.send_timeout, errs);
            crate::websocket::check_route(r, errs);
            crate::graphql::check_route(r, errs);
            // a resolver's shape, as a step's (its name is `Type.field`, checked against the
            // schema by the flow compiler)
            for (name, step) in r.graphql.iter().flat_map(|g| &g.resolvers) {
                let as_step = Located {
                    value: "resolver".to_string(),
                    ..name.clone()
                };
                step_check(&as_step, step, errs);
            }
            crate::stream::check_route(r, &self.backends, errs);
        }
        self.compression.check(errs);
        self.admission_check(errs);
        self.drain_check(errs);
        for (at, tls) in [("tls", &self.tls), ("admin.tls", &self.admin.tls)] {
            if let Some(t) = tls {
                t.check(at, errs);
            }
        }
        self.expressions_check(errs);
        self.models.limits.check(errs);
        if let Some(r) = &self.redis {
            r.check(errs);
        }
        crate::ratelimit::check(self, errs);
        for (name, b) in &self.backends {
            let urls: Vec<&Located<String>> = b.url.iter().chain(b.urls.iter()).collect();
            if urls.is_empty() {
                errs.push(
                    ConfigError {
                        path: None,
                        file: String::new(),
                        pos: None,
                        message: format!("backend `{name}` has no `url` or `urls`"),
                        hint: None,
                    }
                    .hint("add `url: http://host:port`"),
                );
            }
            let mut bad = |what: String, hint: &str| {
                errs.push(
                    ConfigError {
                        path: None,
                        file: String::new(),
                        pos: None,
                        message: format!("backend `{name}`: {what}"),
                        hint: None,
                    }
                    .hint(hint),
                )
            };
            if let Some(r) = &b.retry {
                if !(1..=5).contains(&r.attempts) {
                    bad(
                        format!("retry.attempts must be 1–5 (is {})", r.attempts),
                        "attempts counts the first call too; 2 means one retry",
                    );
                }
                if !(r.budget.ratio >= 0.0 && r.budget.ratio <= 1.0)
                    || r.budget.min_per_second < 0.0
                {
                    bad(
                        "retry.budget.ratio must be in [0, 1] and min_per_second ≥ 0".into(),
                        "e.g. `budget: {ratio: 0.2, min_per_second: 10}`",
                    );
                }
                if r.budget.ttl.0.is_zero() {
                    bad(
                        "retry.budget.ttl must be positive".into(),
                        "e.g. `ttl: 10s`",
                    );
                }
            }
            if let Some(h) = &b.hedge {
                if !(h.percentile > 0.0 && h.percentile < 100.0) {
                    bad(
                        format!(
                            "hedge.percentile must be between 0 and 100 (is {})",
                            h.percentile
                        ),
                        "e.g. `percentile: 95`",
                    );
                }
                if !(h.max_extra > 0.0 && h.max_extra <= 1.0) {
                    bad(
                        format!("hedge.max_extra must be in (0, 1] (is {})", h.max_extra),
                        "e.g. `max_extra: 0.1` allows 10 % extra calls",
                    );
                }
            }
            if b.outlier.consecutive_failures == 0 || b.outlier.max_ejected_percent > 100 {
                bad(
                    "outlier.consecutive_failures must be ≥ 1 and max_ejected_percent ≤ 100".into(),
                    "or turn it off with `outlier: {enabled: false}`",
                );
            }
            if b.cache.as_ref().is_some_and(|c| c.l2) && self.redis.is_none() {
                bad(
                    "cache.l2 needs a top-level `redis:` section".into(),
                    "add `redis: {url: \"${REDIS_URL}\"}` or remove `l2: true`",
                );
            }
            if b.balance.decay.0.is_zero() {
                bad("balance.decay must be positive".into(), "e.g. `decay: 10s`");
            }
            // A protocol other than HTTP checks its own settings and URL (`Backend::check_protocol`).
            if b.check_protocol(name, &urls, errs) {
                continue;
            }
            for u in urls {
                let v = &u.value;
                let ok = (v.starts_with("http://") || v.starts_with("https://"))
                    && v.split("://").nth(1).is_some_and(|rest| {
                        let host = rest.split('/').next().unwrap_or("");
                        !host.is_empty()
                    });
                if !ok {
                    errs.push(
                        ConfigError::at(u.pos, format!("backend `{name}`: invalid URL `{v}`"))
                            .hint("use http://host:port or https://host[:port], optionally with a base path"),
                    );
                }
            }
        }
    }
}

fn step_check(name: &Located<String>, step: &Step, errs: &mut Vec<ConfigError>) {
    let kinds = step.http.is_some() as u8
        + step.grpc.is_some() as u8
        + step.sql.is_some() as u8
        + step.model.is_some() as u8
        + step.value.is_some() as u8
        + step.fail.is_some() as u8;
    if kinds != 1 {
        errs.push(
            ConfigError::at(
                name.pos,
                format!(
                    "step `{}` must have exactly one of `http`, `grpc`, `sql`, `model`, `value` or `fail` (has {kinds})",
                    name.value
                ),
            )
            .hint("a step calls a backend (`http:`, `grpc:` or `sql:`), runs a model (`model:`), computes a value (`value:`) or ends the request with a client answer (`fail:`)"),
        );
    }
    if let Some(f) = &step.fail {
        let mut no = |what: &str, set: bool| {
            if set {
                errs.push(
                    ConfigError::at(
                        name.pos,
                        format!("step `{}`: a `fail` step cannot have `{what}`", name.value),
                    )
                    .hint("a `fail` step only decides (with `when`) whether the request ends with its answer"),
                );
            }
        };
        no("optional", step.optional);
        no("for_each", step.for_each.is_some());
        no("result", step.result.is_some());
        no("default", step.default.is_some());
        no("on_status", !step.on_status.is_empty());
        no("missing", !matches!(step.missing, MissingPolicy::Fail));
        no("compute", step.compute);
        if !(400..=599).contains(&f.status.value) {
            errs.push(
                ConfigError::at(
                    f.status.pos,
                    format!("fail.status {} must be within 400–599", f.status.value),
                )
                .hint("e.g. 400 for invalid input, 404, 409, 422"),
            );
        }
        if !valid_code(&f.code.value) {
            errs.push(
                ConfigError::at(f.code.pos, format!("invalid fail.code `{}`", f.code.value))
                    .hint("codes are 1–64 lower-case letters, digits and `_`, e.g. `invalid_id`"),
            );
        }
    }
    if step.http.is_none() && step.grpc.is_none() && step.sql.is_none() {
        if let Some((k, _)) = step.on_status.iter().next() {
            errs.push(
                ConfigError::at(
                    k.pos,
                    format!(
                        "step `{}`: `on_status` needs an `http`, `grpc` or `sql` step",
                        name.value
                    ),
                )
                .hint("`on_status` maps the statuses a backend answers; this step calls none"),
            );
        }
        if !matches!(step.missing, MissingPolicy::Fail) {
            errs.push(
                ConfigError::at(
                    name.pos,
                    format!("step `{}`: `missing` needs an `http` step", name.value),
                )
                .hint("`missing` applies to keys a batch lookup did not find and to 404s of `for_each` calls"),
            );
        }
    }
    for (k, a) in &step.on_status {
        if let StatusAction::Answer { code: Some(c), .. } = a
            && !valid_code(c)
        {
            errs.push(
                ConfigError::at(k.pos, format!("invalid on_status code `{c}`")).hint(
                    "codes are 1–64 lower-case letters, digits and `_`, e.g. `order_not_found`",
                ),
            );
        }
        if matches!(k.value, StatusPattern::Exact(s) if s < 300)
            || matches!(k.value, StatusPattern::Class(c) if c < 3)
        {
            errs.push(
                ConfigError::at(
                    k.pos,
                    format!(
                        "on_status `{}`: only statuses ≥ 300 reach `on_status`",
                        k.value
                    ),
                )
                .hint("2xx answers are successes; map 3xx, 4xx or 5xx statuses"),
            );
        }
    }
    let valid = name
        .value
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name
            .value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        errs.push(
            ConfigError::at(name.pos, format!("invalid step name `{}`", name.value))
                .hint("step names are identifiers (letters, digits, `_`) because expressions read them as `$name`"),
        );
    }
    if ["request", "item", "index", "ref", "ENV", "__loc__"].contains(&name.value.as_str()) {
        errs.push(
            ConfigError::at(name.pos, format!("step name `{}` is reserved", name.value))
                .hint("choose another name; `$request`, `$item`, `$index` and `$ref` are built in"),
        );
    }
    if step.concurrency == Some(0) {
        errs.push(ConfigError::at(
            name.pos,
            "`concurrency` must be at least 1",
        ));
    }
}

/// An `error.code` written in the config: 1–64 of `a-z 0-9 _`.
pub fn valid_code(c: &str) -> bool {
    (1..=64).contains(&c.len())
        && c.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl Config {
    fn expressions_check(&self, errs: &mut Vec<ConfigError>) {
        let x = &self.server.expressions;
        let mut bad = |what: String| {
            errs.push(
                ConfigError {
                    path: None,
                    file: String::new(),
                    pos: None,
                    message: format!("server.expressions: {what}"),
                    hint: None,
                }
                .hint("see docs/config.md, `server.expressions`"),
            )
        };
        if !(1..=1000).contains(&x.max_depth) {
            bad(format!(
                "max_depth must be within 1..=1000 (is {})",
                x.max_depth
            ));
        }
        for (name, v) in [
            ("max_ops", x.max_ops),
            ("inline_ops", x.inline_ops),
            ("max_elements", x.max_elements as u64),
            ("max_string_bytes", x.max_string_bytes as u64),
        ] {
            if v == 0 {
                bad(format!("{name} must be at least 1"));
            }
        }
    }

    fn drain_check(&self, errs: &mut Vec<ConfigError>) {
        let (spread, grace) = (self.server.drain_spread.0, self.server.shutdown_grace.0);
        if !spread.is_zero() && spread >= grace {
            errs.push(
                ConfigError::at_path(
                    "server.drain_spread",
                    format!(
                        "server.drain_spread ({}) must be shorter than server.shutdown_grace ({}): \
                         the last stream to end needs time to finish its event or close handshake",
                        crate::format_duration(spread),
                        crate::format_duration(grace)
                    ),
                )
                .hint("e.g. `drain_spread: 20s` with `shutdown_grace: 30s`"),
            );
        }
    }

    fn admission_check(&self, errs: &mut Vec<ConfigError>) {
        let a = &self.server.admission;
        let mut bad = |what: String, hint: &str| {
            errs.push(
                ConfigError {
                    path: None,
                    file: String::new(),
                    pos: None,
                    message: format!("server.admission: {what}"),
                    hint: None,
                }
                .hint(hint),
            )
        };
        if a.max_concurrency == 0 {
            bad(
                "max_concurrency must be at least 1".into(),
                "e.g. `max_concurrency: 1024`",
            );
        }
        for (n, v) in [
            ("normal", a.shares.normal),
            ("sheddable", a.shares.sheddable),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                bad(
                    format!("shares.{n} must be in (0, 1] (is {v})"),
                    "a share is the part of the limit a class may fill, e.g. 0.5",
                );
            }
        }
        if let Some(ad) = &a.adaptive {
            if ad.min == 0 || ad.min > ad.initial || ad.initial > a.max_concurrency {
                bad(
                    format!(
                        "adaptive limit needs 1 ≤ min ≤ initial ≤ max_concurrency (min {}, initial {}, max_concurrency {})",
                        ad.min, ad.initial, a.max_concurrency
                    ),
                    "e.g. `adaptive: {min: 8, initial: 20}` with `max_concurrency: 1024`",
                );
            }
            let tolerance_ok = ad.tolerance >= 1.0;
            if !(tolerance_ok && ad.smoothing > 0.0 && ad.smoothing <= 1.0) {
                bad(
                    "adaptive.tolerance must be ≥ 1 and smoothing in (0, 1]".into(),
                    "defaults: tolerance 1.5, smoothing 0.2",
                );
            }
            if ad.window.0.is_zero() || ad.long_window == 0 {
                bad(
                    "adaptive.window and long_window must be positive".into(),
                    "defaults: window 100ms, long_window 600",
                );
            }
        }
        for r in &self.routes {
            if r.admission.max_concurrency == Some(0) {
                errs.push(ConfigError::at(
                    r.path.pos,
                    format!(
                        "route {}: admission.max_concurrency must be at least 1",
                        r.path.value
                    ),
                ));
            }
        }
    }
}

/// `url` as it may be shown (status, `/ui`, logs, `explain`): its userinfo (`user:password@`),
/// a credential, replaced by `***@`. Text that is no `scheme://` URL is returned as it is.
pub fn shown_url(url: &str) -> std::borrow::Cow<'_, str> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.into();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]).into(),
        None => url.into(),
    }
}

/// Whether `name` (lowercase) is a header that frames the message or the connection: fanout
/// writes these itself from the body it sends, and a flow or config that set them could make
/// the length a peer reads differ from the bytes sent (a desynchronised connection, request
/// smuggling).
pub fn framing_header(name: &str) -> bool {
    const FRAMING: [&str; 8] = [
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "te",
        "trailer",
    ];
    FRAMING.iter().any(|f| name.eq_ignore_ascii_case(f))
}

#[cfg(test)]
mod shown_url_tests {
    use super::*;

    #[test]
    fn userinfo_is_never_shown() {
        assert_eq!(
            shown_url("http://user:s3cr3t@127.0.0.1:18963/api?x=a@b"),
            "http://***@127.0.0.1:18963/api?x=a@b"
        );
        assert_eq!(shown_url("https://p%40ss@h@host/"), "https://***@host/");
        assert_eq!(
            shown_url("http://127.0.0.1:1/x@y"),
            "http://127.0.0.1:1/x@y"
        );
        assert_eq!(shown_url("not a url"), "not a url");
        assert!(framing_header("Content-Length") && !framing_header("x-len"));
    }
}
