//! The model set as a runtime of the gateway: its registration line, its start (the watcher),
//! readiness, `/__fanout/status` section and metric families.

use super::{ModelSet, ModelStatus};
use fanout_runtime::hist::HistogramSnapshot;
use std::sync::Arc;
use std::time::SystemTime;

/// The model set as a runtime of the gateway ([`crate::runtime`]): its line in the registry.
pub const RUNTIME: fanout_runtime::runtime::Registration = fanout_runtime::runtime::Registration {
    open: |cfg, prev| {
        if let Some((prev_cfg, prev)) = prev {
            // The same `models:` keeps the set: its versions, queues, counters and watcher.
            if prev_cfg.models == cfg.models && prev_cfg.file == cfg.file {
                return Ok(prev.clone());
            }
        }
        let set = ModelSet::open(&cfg.models, fanout_config::config_dir(&cfg.file).as_deref())
            .map_err(|e| e.in_file(&cfg.file))?;
        Ok(Arc::new(set))
    },
};

impl fanout_runtime::runtime::Runtime for ModelSet {
    fn start(self: Arc<Self>) -> Result<(), String> {
        self.watch()
            .map_err(|e| format!("starting the models.dir watcher: {e}"))
    }

    fn readiness(&self) -> Result<(), String> {
        ModelSet::readiness(self)
    }

    /// `models` (each model's version, loads and inference counters) and `models_watcher`.
    fn status(&self, now: SystemTime) -> Vec<(&'static str, serde_json::Value)> {
        let models: serde_json::Map<String, serde_json::Value> = ModelSet::status(self)
            .into_iter()
            .map(|m| (m.name.to_string(), model_json(&m, now)))
            .collect();
        let w = self.watcher();
        let watcher = serde_json::json!({
            "started": w.started,
            "running": w.running,
            "restarts": w.restarts,
            "last_panic": w.last_panic,
            "scans": self.scans(),
            // Why it is not ready (stopped, or stalled and what it is doing), else null.
            "problem": ModelSet::readiness(self).err(),
        });
        vec![
            ("models", serde_json::Value::Object(models)),
            ("models_watcher", watcher),
        ]
    }

    fn metrics(&self, now: SystemTime) -> Vec<fanout_runtime::runtime::Family> {
        use fanout_runtime::runtime::{Family, FamilyKind, Sample};
        let status = ModelSet::status(self);
        let model = |m: &ModelStatus| vec![("model", m.name.to_string())];
        let per_model = |name, help, kind, value: &dyn Fn(&ModelStatus) -> Sample| Family {
            name,
            help,
            kind,
            samples: status.iter().map(|m| (model(m), value(m))).collect(),
        };
        let by = |name,
                  help,
                  label: &'static str,
                  values: &dyn Fn(&ModelStatus) -> Vec<(&'static str, u64)>| {
            Family {
                name,
                help,
                kind: FamilyKind::Counter,
                samples: status
                    .iter()
                    .flat_map(|m| {
                        values(m).into_iter().map(move |(r, v)| {
                            (
                                vec![("model", m.name.to_string()), (label, r.to_string())],
                                Sample::Counter(v),
                            )
                        })
                    })
                    .collect(),
            }
        };
        vec![
            per_model(
                "fanout_model_rows",
                "Rows (one per request, or per for_each element) evaluated by a model",
                FamilyKind::Counter,
                &|m| Sample::Counter(m.rows),
            ),
            per_model(
                "fanout_model_batches",
                "Evaluations (batches) of a model: rows / batches is the mean batch",
                FamilyKind::Counter,
                &|m| Sample::Counter(m.batches),
            ),
            per_model(
                "fanout_model_batch_rows",
                "Rows per evaluation of a model",
                FamilyKind::Histogram,
                &|m| Sample::Histogram(m.batch_rows.clone()),
            ),
            per_model(
                "fanout_model_queue_seconds",
                "Time rows waited in a model's queue before their evaluation started",
                FamilyKind::Histogram,
                &|m| Sample::Histogram(m.queue_time.clone()),
            ),
            per_model(
                "fanout_model_compute_seconds",
                "Time one evaluation (a batch) of a model took on a compute pool thread",
                FamilyKind::Histogram,
                &|m| Sample::Histogram(m.compute_time.clone()),
            ),
            per_model(
                "fanout_model_pending_rows",
                "Rows waiting in a model's queue now",
                FamilyKind::Gauge,
                &|m| Sample::Gauge(m.pending as f64),
            ),
            by(
                "fanout_model_dropped_rows",
                "Rows not evaluated, by reason: queue_full (refused, 503 model_queue_full), expired (their deadline passed while waiting), cancelled (their request ended before: client gone, another step failed), failed (the evaluation failed)",
                "reason",
                &|m| {
                    vec![
                        ("queue_full", m.refused),
                        ("expired", m.expired),
                        ("cancelled", m.cancelled),
                        ("failed", m.failed),
                    ]
                },
            ),
            by(
                "fanout_model_loads",
                "Loads of a model file, by result (ok: swapped in; error: refused, the version serving goes on)",
                "result",
                &|m| vec![("ok", m.loads), ("error", m.load_failures)],
            ),
            Family {
                name: "fanout_model_version_age_seconds",
                help: "Seconds since the version of a model serving now was loaded (absent: none loaded)",
                kind: FamilyKind::Gauge,
                samples: status
                    .iter()
                    .filter_map(|m| {
                        let (_, at, _, _) = m.version.as_ref()?;
                        let age = now.duration_since(*at).unwrap_or_default();
                        Some((model(m), Sample::Gauge(age.as_secs_f64())))
                    })
                    .collect(),
            },
        ]
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

/// One model in `/__fanout/status`: its version, loads and inference counters.
fn model_json(m: &ModelStatus, now: SystemTime) -> serde_json::Value {
    let (version, age, width, kind) = match &m.version {
        Some((hash, at, width, kind)) => (
            Some(hash.clone()),
            Some(now.duration_since(*at).unwrap_or_default().as_secs_f64()),
            Some(*width),
            Some(*kind),
        ),
        None => (None, None, None, None),
    };
    serde_json::json!({
        "version": version,
        "age_s": age,
        "input_width": width,
        "kind": kind,
        "loads": m.loads,
        "load_failures": m.load_failures,
        "last_error": m.last_error,
        "rows": m.rows,
        "batches": m.batches,
        "inline": m.inline,
        "mean_batch": if m.batches > 0 { m.rows as f64 / m.batches as f64 } else { 0.0 },
        "pending": m.pending,
        "refused_queue_full": m.refused,
        "expired": m.expired,
        "cancelled": m.cancelled,
        "failed": m.failed,
        // At most (a bucket's upper bound), ms; null before the first row, or past 60 s.
        "queue_p50_ms": ms_bound(&m.queue_time, 0.5),
        "queue_p99_ms": ms_bound(&m.queue_time, 0.99),
        "compute_p50_ms": ms_bound(&m.compute_time, 0.5),
        "compute_p99_ms": ms_bound(&m.compute_time, 0.99),
    })
}

/// The `q`-quantile's bucket bound of a seconds histogram, in ms (`None`: empty or unbounded).
fn ms_bound(h: &HistogramSnapshot, q: f64) -> Option<f64> {
    h.quantile_bound(q)
        .filter(|b| b.is_finite())
        .map(|b| b * 1000.0)
}
