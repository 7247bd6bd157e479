//! Faults of a route: with a probability, answer a request in a broken way — a status code, a
//! TCP reset, no answer at all, a dribbled body, malformed JSON, a connection closed after
//! the headers, or a gRPC status.
//!
//! Faults are tried in order; each is an independent draw, and the first that fires wins (at
//! most one per request). The server executes them (see `server.rs`); this module holds the
//! compiled form and the draw.

use crate::config::{FAULT_KINDS, FaultAction, FaultConfig, GrpcCode, SlowBodyConfig};
use fanout_config::{Dur, Located};
use fanout_expr::Expr;
use fanout_grpc::Code;
use http::StatusCode;
use rand::Rng;
use std::time::Duration;

/// Most pieces a slow body may be sent in.
pub const MAX_SLOW_BODY_CHUNKS: u32 = 65_536;

/// A compiled fault: what happens, and how often.
#[derive(Debug, Clone)]
pub struct Fault {
    /// Probability that it fires for a request that reaches it, 0..1.
    pub p: f64,
    /// What happens.
    pub kind: FaultKind,
}

/// What a fault does when it fires.
#[derive(Debug, Clone)]
pub enum FaultKind {
    /// Answer `status` with `body` (a jq expression over `$request`) or
    /// `{"error": "injected fault", "status": STATUS}`.
    Status {
        /// The status.
        status: StatusCode,
        /// Body expression.
        body: Option<Expr>,
    },
    /// Reset the connection (`SO_LINGER` 0, then close: the client sees a TCP RST).
    Reset,
    /// Never answer.
    Hang,
    /// Headers at once, then the body in `chunks` pieces, the last one `duration` after the
    /// headers.
    SlowBody {
        /// Number of pieces.
        chunks: u32,
        /// Time over which they are spread.
        duration: Duration,
    },
    /// Status 200 and a truncated, invalid JSON body.
    Malformed,
    /// Status and headers with a `content-length`, then the connection closes (HTTP/2: the
    /// stream is reset) without the body.
    CloseAfterHeaders,
    /// A trailers-only gRPC answer with this status (an HTTP route answers the HTTP status the
    /// code maps to, [`Code::http_status`]).
    GrpcStatus {
        /// The code.
        code: Code,
        /// The `grpc-message`; `None`: `injected fault`.
        message: Option<String>,
    },
}

impl FaultKind {
    /// The kind's name as written in the config and reported in the stats (`status`,
    /// `reset`, `hang`, `slow_body`, `malformed`, `close_after_headers`, `grpc_status`).
    pub fn name(&self) -> &'static str {
        FAULT_KINDS[self.index()]
    }

    /// Index of the kind in [`FAULT_KINDS`] (for the per-kind counters).
    pub(crate) fn index(&self) -> usize {
        match self {
            FaultKind::Status { .. } => 0,
            FaultKind::Reset => 1,
            FaultKind::Hang => 2,
            FaultKind::SlowBody { .. } => 3,
            FaultKind::Malformed => 4,
            FaultKind::CloseAfterHeaders => 5,
            FaultKind::GrpcStatus { .. } => 6,
        }
    }
}

/// Why a fault config is invalid.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FaultProblem {
    pub(crate) message: String,
    pub(crate) hint: String,
    /// Set when the problem is in the `body` expression: the byte offset inside it.
    pub(crate) body_offset: Option<usize>,
}

impl FaultProblem {
    fn new(message: impl Into<String>, hint: impl Into<String>) -> Self {
        FaultProblem {
            message: message.into(),
            hint: hint.into(),
            body_offset: None,
        }
    }
}

impl Fault {
    /// Check and compile a fault config.
    pub(crate) fn compile(c: &FaultConfig) -> Result<Fault, FaultProblem> {
        if !(c.p.is_finite() && (0.0..=1.0).contains(&c.p)) {
            return Err(FaultProblem::new(
                format!("fault probability {} is not within 0..1", c.p),
                "`p` is a probability: 0 never fires, 1 always does",
            ));
        }
        let kind = match &c.action {
            FaultAction::Status { status, body } => {
                let status = StatusCode::from_u16(*status).map_err(|_| {
                    FaultProblem::new(
                        format!("invalid fault status {status}"),
                        "a status is a number from 100 to 999",
                    )
                })?;
                let body = match body {
                    None => None,
                    Some(src) => {
                        Some(
                            Expr::compile(&src.value, &["request"]).map_err(|e| FaultProblem {
                                message: format!("fault body expression: {}", e.message),
                                hint: e.hint.unwrap_or_else(|| {
                                    "a body is a jq expression over `$request`".into()
                                }),
                                body_offset: Some(e.offset),
                            })?,
                        )
                    }
                };
                FaultKind::Status { status, body }
            }
            FaultAction::Reset => FaultKind::Reset,
            FaultAction::Hang => FaultKind::Hang,
            FaultAction::SlowBody(s) => {
                if !(1..=MAX_SLOW_BODY_CHUNKS).contains(&s.chunks) {
                    return Err(FaultProblem::new(
                        format!(
                            "slow_body needs 1 to {MAX_SLOW_BODY_CHUNKS} chunks, got {}",
                            s.chunks
                        ),
                        "e.g. `{slow_body: {chunks: 10, duration: 1s}}`",
                    ));
                }
                FaultKind::SlowBody {
                    chunks: s.chunks,
                    duration: s.duration.0,
                }
            }
            FaultAction::Malformed => FaultKind::Malformed,
            FaultAction::CloseAfterHeaders => FaultKind::CloseAfterHeaders,
            FaultAction::GrpcStatus { code, message } => FaultKind::GrpcStatus {
                code: code.0,
                message: message.clone().filter(|m| !m.is_empty()),
            },
        };
        Ok(Fault { p: c.p, kind })
    }

    /// The config form of this fault (what `GET /__stub/routes` shows).
    pub fn to_config(&self) -> FaultConfig {
        let action = match &self.kind {
            FaultKind::Status { status, body } => FaultAction::Status {
                status: status.as_u16(),
                body: body
                    .as_ref()
                    .map(|e| Located::unknown(e.source().to_string())),
            },
            FaultKind::Reset => FaultAction::Reset,
            FaultKind::Hang => FaultAction::Hang,
            FaultKind::SlowBody { chunks, duration } => FaultAction::SlowBody(SlowBodyConfig {
                chunks: *chunks,
                duration: Dur(*duration),
            }),
            FaultKind::Malformed => FaultAction::Malformed,
            FaultKind::CloseAfterHeaders => FaultAction::CloseAfterHeaders,
            FaultKind::GrpcStatus { code, message } => FaultAction::GrpcStatus {
                code: GrpcCode(*code),
                message: message.clone(),
            },
        };
        FaultConfig { p: self.p, action }
    }
}

/// Draw which fault (if any) fires: each in order with its own probability; the first that
/// fires wins.
pub fn pick<'a, R: Rng + ?Sized>(faults: &'a [Fault], rng: &mut R) -> Option<&'a Fault> {
    faults
        .iter()
        .find(|f| f.p >= 1.0 || (f.p > 0.0 && rng.random::<f64>() < f.p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn fault(p: f64, kind: FaultKind) -> Fault {
        Fault { p, kind }
    }

    #[test]
    fn faults_are_tried_in_order_with_independent_draws() {
        let faults = [fault(0.5, FaultKind::Reset), fault(0.5, FaultKind::Hang)];
        let mut rng = SmallRng::seed_from_u64(1);
        let mut counts = [0usize; 3];
        for _ in 0..10_000 {
            match pick(&faults, &mut rng).map(|f| &f.kind) {
                Some(FaultKind::Reset) => counts[0] += 1,
                Some(FaultKind::Hang) => counts[1] += 1,
                _ => counts[2] += 1,
            }
        }
        // 0.5, then 0.5 · 0.5, then none 0.25.
        assert!((4700..5300).contains(&counts[0]), "{counts:?}");
        assert!((2200..2800).contains(&counts[1]), "{counts:?}");
        assert!((2200..2800).contains(&counts[2]), "{counts:?}");
        let never = [fault(0.0, FaultKind::Reset)];
        let always = [fault(1.0, FaultKind::Malformed)];
        for _ in 0..1000 {
            assert!(pick(&never, &mut rng).is_none());
            assert!(pick(&always, &mut rng).is_some());
        }
    }

    #[test]
    fn compile_checks_probability_chunks_and_body() {
        let parse = |s: &str| -> FaultConfig { serde_json::from_str(s).expect("parses") };
        let e = Fault::compile(&parse(r#"{"reset": {}, "p": 1.5}"#)).expect_err("p > 1");
        assert!(e.message.contains("1.5"), "{e:?}");
        let e = Fault::compile(&parse(r#"{"slow_body": {"chunks": 0, "duration": "1s"}}"#))
            .expect_err("0 chunks");
        assert!(e.message.contains("chunks"), "{e:?}");
        let e = Fault::compile(&parse(r#"{"status": 503, "body": "{a: $nope}"}"#))
            .expect_err("bad body");
        assert_eq!(e.body_offset, Some(4), "{e:?}");
        let e = Fault::compile(&parse(r#"{"status": 1000}"#)).expect_err("bad status");
        assert!(e.message.contains("1000"), "{e:?}");
        let f = Fault::compile(&parse(r#"{"status": 503, "p": 0.25, "body": "{a: 1}"}"#))
            .expect("valid");
        assert_eq!(f.kind.name(), "status");
        assert_eq!(
            f.to_config(),
            parse(r#"{"status": 503, "p": 0.25, "body": "{a: 1}"}"#)
        );
    }
}
