//! The compile context shared by the flow compiler (`plan`) and every step kind's compiler
//! (`step/`): the config, the errors found so far (each with its position and a hint), the
//! compute pool, and the helpers that compile one expression, method or header name.

use fanout_config::{Config, ConfigError, ExprSrc, Located, Pos};
use fanout_expr::Expr;
use fanout_runtime::compute::ComputePool;
use http::{HeaderName, Method};
use std::sync::Arc;

/// The compile context: the config, the errors found so far, the compute pool.
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a Config,
    /// The config's compiled `.proto` files (gRPC routes and steps).
    pub(crate) protos: Arc<fanout_grpc::ProtoSet>,
    pub(crate) errs: Vec<ConfigError>,
    pub(crate) compute: Arc<ComputePool>,
    /// The parts of `$request` read by the expressions compiled since the route's compile began.
    pub(crate) request_use: fanout_expr::request::RequestUse,
    /// `METHOD PATH` of the route being compiled (the start of its steps' keys).
    pub(crate) route_key: String,
    /// The runtimes step kinds use ([`crate::plan::Carry::runtimes`]).
    pub(crate) runtimes: crate::runtime::Runtimes,
}

impl Ctx<'_> {
    pub(crate) fn expr(&mut self, src: &ExprSrc, scope: &[&str]) -> Option<Expr> {
        self.expr_hiding(src, scope, &[])
    }

    /// [`Ctx::expr`] where the `hidden` names of `scope` are refused by a later check (`$item`
    /// outside `for_each`), so hints do not offer them.
    pub(crate) fn expr_hiding(
        &mut self,
        src: &ExprSrc,
        scope: &[&str],
        hidden: &[&str],
    ) -> Option<Expr> {
        match Expr::compile_hinting(&src.value, scope, hidden) {
            Ok(e) => {
                if scope.contains(&"request") {
                    self.request_use.add(&e.request_use());
                }
                Some(e)
            }
            Err(e) => {
                let pos = self.cfg.pos_in_scalar(src.pos, &src.value, e.offset);
                let mut err = ConfigError::at(
                    pos,
                    format!("in expression `{}`: {}", short(&src.value), e.message),
                );
                let text = src.value.trim();
                let hint = if text.starts_with('/') && e.message.contains("invalid jq syntax") {
                    // `path: '/orders'`: a literal where an expression is expected
                    let quoted = format!("{:?}", text);
                    format!(
                        "this field is a jq expression, so a fixed text is a jq string: write \
                         `'{quoted}'` (with a value: `'\"/orders/\\($request.params.id)\"'`)"
                    )
                } else {
                    e.hint.unwrap_or_else(|| {
                        "expressions are jq (docs/config.md#expressions): check brackets, quotes and `|`".into()
                    })
                };
                err = err.hint(hint);
                self.errs.push(err);
                None
            }
        }
    }
    /// Position of the first character of an expression.
    pub(crate) fn at(&self, src: &ExprSrc) -> Pos {
        self.cfg.pos_in_scalar(src.pos, &src.value, 0)
    }
    pub(crate) fn method(&mut self, m: &Located<String>) -> Option<Method> {
        match Method::from_bytes(m.value.to_ascii_uppercase().as_bytes()) {
            Ok(m) => Some(m),
            Err(_) => {
                self.errs.push(
                    ConfigError::at(m.pos, format!("invalid HTTP method `{}`", m.value))
                        .hint("use GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS"),
                );
                None
            }
        }
    }
    /// A header a flow sets (`respond.headers`, a step's `headers` or `metadata`): a valid name,
    /// and never one that frames the message (`content-length`, `transfer-encoding`,
    /// `connection`, …: fanout writes those from what it sends).
    pub(crate) fn header_name(&mut self, name: &str, pos: Pos) -> Option<HeaderName> {
        if fanout_config::framing_header(name) {
            self.errs.push(
                ConfigError::at(
                    pos,
                    format!("header `{name}` frames the message; a flow may not set it"),
                )
                .hint(
                    "fanout writes content-length, transfer-encoding, connection, keep-alive, \
                     upgrade, te and trailer itself from the body it sends: remove it",
                ),
            );
            return None;
        }
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(h) => Some(h),
            Err(_) => {
                self.errs.push(
                    ConfigError::at(pos, format!("invalid header name `{name}`"))
                        .hint("header names are ASCII tokens such as `x-user-id`"),
                );
                None
            }
        }
    }
}

/// An "unknown backend" error with a hint: the closest declared name, else the declared names.
pub fn unknown_backend(cfg: &Config, pos: Pos, prefix: &str, name: &str) -> ConfigError {
    let mut known: Vec<&str> = cfg.backends.keys().map(String::as_str).collect();
    known.sort_unstable();
    let hint = match fanout_config::did_you_mean(name, known.iter()) {
        Some(d) => d,
        None if known.is_empty() => "declare it under `backends:`".to_string(),
        None => format!("declared backends: {}", known.join(", ")),
    };
    ConfigError::at(pos, format!("{prefix}unknown backend `{name}`")).hint(hint)
}

fn short(s: &str) -> String {
    let one_line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > 60 {
        format!("{}…", one_line.chars().take(57).collect::<String>())
    } else {
        one_line
    }
}
