//! The access log as an edge stage (`telemetry.access_log`, docs/operations.md): one JSON line
//! per request, of every route kind and of answers made before routing (a CORS preflight, a
//! refused encoding), written after the answer phase — so `bytes_out` is what the client is
//! sent (compressed or not) and `duration_ms` includes the answer's encoding. Sampling is
//! decided on arrival ([`EdgeStage::log_want`]); degraded and failed answers are logged
//! whatever the sample says unless `always_log_degraded` is off.
//!
//! The writer (a thread of its own behind a bounded queue: `fanout_ops::telemetry::access_log`)
//! is started with the gateway and kept across reloads (`telemetry` is applied at start only).
//! Its counters are the status endpoint's `access_log` section.

use crate::{BuildCx, Done, EdgeStage, LogWant, Registration, RequestHead, RouteKind, Step};
use fanout_config::{AccessLogConfig, ConfigError, ConfigErrors};
use fanout_ops::telemetry::access_log::{self, AccessLog, Line};
use futures_util::future::BoxFuture;
use std::sync::{Arc, OnceLock};

/// The stage's line in the registry.
pub const STAGE: Registration = Registration {
    name: "access_log",
    section: false,
    codes: &[],
    build,
    schema: None,
};

/// The access log of a serving gateway (off: no logging phase, its status `null`).
struct AccessLogStage {
    cfg: AccessLogConfig,
    /// The writer, once started (shared with the stage it replaces on a reload).
    log: Arc<OnceLock<AccessLog>>,
}

fn build(cx: &BuildCx<'_>) -> Result<Option<Arc<dyn EdgeStage>>, ConfigErrors> {
    let cfg = &cx.config.telemetry.access_log;
    if !(0.0..=1.0).contains(&cfg.sample_ratio) {
        let path = "telemetry.access_log.sample_ratio";
        return Err(ConfigErrors(vec![
            ConfigError::at_path(path, format!("{path} must be between 0.0 and 1.0"))
                .hint("1.0 keeps everything, 0.1 one in ten, 0.0 nothing"),
        ]));
    }
    // `telemetry` is applied at start only: a reload keeps the running writer.
    let log = cx
        .prev
        .and_then(|p| p.as_any().downcast_ref::<AccessLogStage>())
        .map_or_else(|| Arc::new(OnceLock::new()), |p| p.log.clone());
    Ok(Some(Arc::new(AccessLogStage {
        cfg: cfg.clone(),
        log,
    })))
}

impl EdgeStage for AccessLogStage {
    fn applies(&self, _route: usize, _kind: RouteKind) -> bool {
        false
    }

    fn on_request<'a>(&'a self, _head: &'a mut RequestHead<'_>) -> Step<'a> {
        Step::Next
    }

    fn logs(&self) -> bool {
        self.cfg.enabled
    }

    fn log_want(&self) -> LogWant {
        match self.log.get() {
            Some(l) => LogWant {
                line: l.sampled(),
                if_degraded: l.always_log_degraded,
            },
            None => LogWant::default(),
        }
    }

    fn on_logged(&self, want: LogWant, done: &Done<'_>) {
        let Some(log) = self.log.get() else {
            return;
        };
        if !want.takes(done) {
            return;
        }
        log.write(&Line {
            time: access_log::rfc3339(done.arrived),
            request_id: done.request_id,
            method: done.method.as_str(),
            route: done.route,
            path: done.path,
            client: done.client.map(|ip| ip.to_string()),
            tls_client: done.tls_client,
            status: done.status.as_u16(),
            duration_ms: (done.duration.as_secs_f64() * 1e6).round() / 1e3,
            bytes_in: done.bytes_in,
            bytes_out: done.bytes_out.unwrap_or(0),
            error: done.error,
            error_step: done.error_step,
            partial: done.partial,
        });
    }

    fn start(&self) -> BoxFuture<'_, Vec<String>> {
        Box::pin(async move {
            if !self.cfg.enabled || self.log.get().is_some() {
                return Vec::new();
            }
            match AccessLog::start(&self.cfg) {
                Ok(l) => {
                    let _ = self.log.set(l);
                    Vec::new()
                }
                Err(e) => vec![e],
            }
        })
    }

    fn readiness(&self) -> Result<(), String> {
        match self.log.get() {
            Some(_) => Ok(()),
            None if !self.cfg.enabled => Ok(()),
            None => Err("the access log's output is not open (telemetry.access_log.output)".into()),
        }
    }

    fn status_json(&self) -> Option<serde_json::Value> {
        Some(
            self.log
                .get()
                .map_or(serde_json::Value::Null, AccessLog::status_json),
        )
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
