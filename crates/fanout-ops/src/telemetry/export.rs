//! The span queue and the export task: finished sampled spans go into a bounded queue (never
//! waited for: when it is full the span is dropped and counted), and one tokio task sends them
//! in batches of at most `max_batch`, at least every `batch_delay`, over OTLP/HTTP protobuf,
//! each export bounded by `export_timeout` (a failed batch is dropped and counted: traces are
//! best effort and must not pile up in memory).
//!
//! The SDK's own batch processors are not used: the thread-based one cannot drive the hyper
//! client, and neither says how many spans it dropped.

use fanout_config::TracingConfig;
use futures_util::FutureExt;
use opentelemetry::Context;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Counters of the span queue and the exports.
#[derive(Debug, Default)]
pub struct ExportStats {
    queued: AtomicU64,
    dropped: AtomicU64,
    exported: AtomicU64,
    failed: AtomicU64,
    failed_exports: AtomicU64,
}

impl ExportStats {
    /// `{queued, dropped, exported, failed, failed_exports}`: spans put in the queue, dropped
    /// because it was full, exported, lost in failed exports; and the failed export requests.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "queued": self.queued.load(Relaxed),
            "dropped": self.dropped.load(Relaxed),
            "exported": self.exported.load(Relaxed),
            "failed": self.failed.load(Relaxed),
            "failed_exports": self.failed_exports.load(Relaxed),
        })
    }
}

/// Puts finished sampled spans in the queue.
#[derive(Debug)]
pub struct QueueProcessor {
    tx: mpsc::Sender<SpanData>,
    stats: Arc<ExportStats>,
}

/// Asks the export task to send everything queued now.
pub struct Handle {
    flush: mpsc::Sender<oneshot::Sender<()>>,
    timeout: Duration,
}

impl Handle {
    /// Send what is queued; returns when it is sent or after the export timeout.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.flush.send(tx).await.is_ok() {
            let _ = tokio::time::timeout(self.timeout, rx).await;
        }
    }
}

impl QueueProcessor {
    /// The processor, its export task (spawned: call inside the runtime) and their counters.
    pub fn start(
        cfg: &TracingConfig,
        resource: &Resource,
    ) -> Result<(QueueProcessor, Handle, Arc<ExportStats>), String> {
        let mut exporter = exporter(cfg)?;
        exporter.set_resource(resource);
        let (tx, rx) = mpsc::channel(cfg.queue_size.max(1));
        let (flush, flushes) = mpsc::channel(4);
        let stats = Arc::new(ExportStats::default());
        let task = ExportTask {
            max_batch: cfg.max_batch.max(1),
            delay: cfg.batch_delay.0,
            timeout: cfg.export_timeout.0,
            stats: stats.clone(),
        };
        tokio::spawn(task.run(exporter, rx, flushes));
        let handle = Handle {
            flush,
            timeout: cfg.export_timeout.0,
        };
        let processor = QueueProcessor {
            tx,
            stats: stats.clone(),
        };
        Ok((processor, handle, stats))
    }
}

/// The OTLP/HTTP protobuf exporter over hyper (http or https: rustls with the web PKI roots).
fn exporter(cfg: &TracingConfig) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup for the OTLP exporter failed: {e}"))?
        .with_root_certificates(rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        })
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    let client = opentelemetry_http::hyper::HyperClient::new(connector, cfg.export_timeout.0, None);
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_endpoint(cfg.otlp_endpoint.value.clone())
        .with_timeout(cfg.export_timeout.0)
        .with_headers(
            cfg.headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
        .build()
        .map_err(|e| format!("the OTLP exporter: {e}"))
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        match self.tx.try_send(span) {
            Ok(()) => self.stats.queued.fetch_add(1, Relaxed),
            Err(_) => self.stats.dropped.fetch_add(1, Relaxed),
        };
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

struct ExportTask {
    max_batch: usize,
    delay: Duration,
    timeout: Duration,
    stats: Arc<ExportStats>,
}

impl ExportTask {
    /// Until every sender is gone: wait for a span (or a flush), gather a batch for at most
    /// `delay`, export it.
    async fn run<E: SpanExporter>(
        self,
        exporter: E,
        mut rx: mpsc::Receiver<SpanData>,
        mut flushes: mpsc::Receiver<oneshot::Sender<()>>,
    ) {
        let mut batch = Vec::with_capacity(self.max_batch);
        loop {
            let flushed = tokio::select! {
                n = rx.recv_many(&mut batch, self.max_batch) => {
                    if n == 0 {
                        break;
                    }
                    None
                }
                Some(done) = flushes.recv() => Some(done),
            };
            if let Some(done) = flushed {
                // Everything queued now, batch by batch.
                while FutureExt::now_or_never(rx.recv_many(&mut batch, self.max_batch))
                    .is_some_and(|n| n > 0)
                {
                    self.export(&exporter, &mut batch).await;
                }
                self.export(&exporter, &mut batch).await;
                let _ = done.send(());
                continue;
            }
            let until = Instant::now() + self.delay;
            while batch.len() < self.max_batch {
                let room = self.max_batch - batch.len();
                tokio::select! {
                    n = rx.recv_many(&mut batch, room) => if n == 0 { break },
                    _ = tokio::time::sleep_until(until) => break,
                }
            }
            self.export(&exporter, &mut batch).await;
        }
    }

    async fn export<E: SpanExporter>(&self, exporter: &E, batch: &mut Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        let spans = std::mem::replace(batch, Vec::with_capacity(self.max_batch));
        match tokio::time::timeout(self.timeout, exporter.export(spans)).await {
            Ok(Ok(())) => {
                self.stats.exported.fetch_add(n, Relaxed);
            }
            Ok(Err(e)) => self.failed(n, &e.to_string()),
            Err(_) => self.failed(n, "timed out"),
        }
    }

    fn failed(&self, n: u64, why: &str) {
        self.stats.failed.fetch_add(n, Relaxed);
        if self
            .stats
            .failed_exports
            .fetch_add(1, Relaxed)
            .is_multiple_of(100)
        {
            tracing::warn!(
                spans = n,
                "exporting spans failed (every 100th failure is logged): {why}"
            );
        }
    }
}
