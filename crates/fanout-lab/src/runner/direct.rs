//! The direct path: the critical path's stub calls made by the lab itself, without a target, for
//! the report's "direct" baseline.

use super::Lab;
use crate::report;
use std::time::Duration;
use tokio::time::Instant;

impl Lab {
    /// Latency of calling the critical path's stub routes directly, one after the other (HTTP/1.1
    /// GETs; a gRPC scenario's calls over one h2c connection per stub, every answer checked for
    /// `grpc-status: 0`). `None` when a call fails.
    ///
    /// HTTP paths are measured like the targets: sequences started on an open-model schedule at
    /// the lowest rate the targets' 50 % level offered (so the stubs are as busy as in the
    /// trials: an idle stub wakes up later for each timer and would make the floor look higher),
    /// latency from each sequence's intended start, after a warm-up.
    pub(crate) async fn direct(&self) -> Option<report::Direct> {
        if self.scenario.critical_path.is_empty() && self.grpc_direct.is_empty() {
            return None;
        }
        // `--quick`: 100 samples (at ≥ 50/s: 2 s), enough for the report's p50 beside a quick
        // run's indicative figures.
        let n = if self.opts.quick { 100 } else { 1500 };
        let addr_of = |svc: &str| {
            self.stubs
                .services
                .iter()
                .find(|(s, _)| s == svc)
                .map(|(_, a)| *a)
        };
        let mut samples = Vec::with_capacity(n);
        let path: Vec<String>;
        if self.grpc_direct.is_empty() {
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<http_body_util::Empty<bytes::Bytes>>();
            let mut uris = Vec::new();
            for (svc, path) in &self.scenario.critical_path {
                let addr = addr_of(svc)?;
                uris.push(format!("http://{addr}{path}").parse::<::http::Uri>().ok()?);
            }
            let uris = std::sync::Arc::new(uris);
            let rate = self
                .trials
                .iter()
                .filter(|t| t.phase == "level-50" && t.offered_rate > 0.0)
                .map(|t| t.offered_rate)
                .fold(f64::INFINITY, f64::min);
            let rate = if rate.is_finite() {
                rate.min(1000.0)
            } else {
                100.0
            };
            // A quick run (a debug build whose 50 % level may be a few requests per second) takes
            // its direct samples at 50/s at least, so it ends in seconds, not minutes.
            let rate = if self.opts.quick {
                rate.max(50.0)
            } else {
                rate
            };
            let warmup = n / 10;
            let every = Duration::from_secs_f64(1.0 / rate);
            let t0 = tokio::time::Instant::now();
            let mut runs = tokio::task::JoinSet::new();
            for i in 0..warmup + n {
                let intended = t0 + every * i as u32;
                tokio::time::sleep_until(intended).await;
                let (client, uris) = (client.clone(), uris.clone());
                runs.spawn(async move {
                    for uri in uris.iter() {
                        let resp = client.get(uri.clone()).await.ok()?;
                        http_body_util::BodyExt::collect(resp.into_body())
                            .await
                            .ok()?;
                    }
                    let ms = intended.elapsed().as_secs_f64() * 1000.0;
                    Some((i >= warmup).then_some(ms))
                });
            }
            while let Some(r) = runs.join_next().await {
                if let Some(ms) = r.ok()?? {
                    samples.push(ms);
                }
            }
            path = self
                .scenario
                .critical_path
                .iter()
                .map(|(s, p)| format!("{s} {p}"))
                .collect();
        } else {
            // TCP_NODELAY: HTTP/2 writes a request's HEADERS and DATA frames separately; with
            // Nagle on, the second waits for the peer's delayed ACK (~40 ms).
            let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
            connector.set_nodelay(true);
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .http2_only(true)
                    .build::<_, http_body_util::Full<bytes::Bytes>>(connector);
            for _ in 0..n {
                let start = Instant::now();
                for (svc, r) in &self.grpc_direct {
                    let addr = addr_of(svc)?;
                    let mut req = ::http::Request::builder()
                        .method(r.method.clone())
                        .uri(format!("http://{addr}{}", r.path));
                    for (k, v) in &r.headers {
                        req = req.header(k.as_str(), v.as_str());
                    }
                    let req = req.body(http_body_util::Full::new(r.body.clone())).ok()?;
                    let (parts, body) = client.request(req).await.ok()?.into_parts();
                    let got = http_body_util::BodyExt::collect(body).await.ok()?;
                    let status = got
                        .trailers()
                        .and_then(|t| t.get("grpc-status"))
                        .or_else(|| parts.headers.get("grpc-status"))
                        .map(|v| v.as_bytes().to_vec());
                    if status.as_deref() != Some(b"0".as_slice()) {
                        return None;
                    }
                }
                samples.push(start.elapsed().as_secs_f64() * 1000.0);
            }
            path = self
                .grpc_direct
                .iter()
                .map(|(s, r)| format!("{s} {}", r.path))
                .collect();
        }
        samples.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            samples
                .get(((samples.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        Some(report::Direct {
            path,
            p50_ms: pick(0.5),
            p99_ms: pick(0.99),
        })
    }
}
