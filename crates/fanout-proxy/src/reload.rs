//! Config reload: a new config is read and compiled off the I/O workers, its new reference data
//! loaded, then swapped in atomically ([`Gateway::reload`]). Requests in flight finish on the
//! plan they started with; backends whose config did not change keep their whole stack — pools,
//! caches, breakers, balancer, limiter and batch windows. A config that does not compile (or
//! whose required reference data does not load) is refused with its `FILE:LINE:COL` messages and
//! the old one keeps serving.
//!
//! What lives as long as the process is not reloaded: `listen`, `server.*` (listener limits,
//! admission, compute pool threads, headers) and `telemetry.*` (exporter, access log); a reload that changes them applies everything else
//! and logs that those changes take effect at the next restart.

use crate::{Gateway, Live, route_table, stack, start_reference};
use fanout_config::{Config, ConfigErrors};
use fanout_flow::{Backend, Carry};
use fanout_layers::l2::L2;
use fanout_ops::metrics::Metrics;
use fanout_runtime::compute::ComputePool;
use fanout_transport::admission;
use http::HeaderName;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new config does not load or compile (its `FILE:LINE:COL` messages).
    #[error("the new config was refused; the old one keeps serving:\n{0}")]
    Config(#[from] ConfigErrors),
    /// An edge stage of the new config could not start (what it needs before it decides).
    #[error("the new config's edge stages could not start; the old config keeps serving: {0}")]
    Stage(String),
    /// The new config's required reference data could not be loaded.
    #[error("the new config's reference data did not load; the old config keeps serving: {0}")]
    Reference(String),
    /// The compile task could not run (the runtime is shutting down).
    #[error("the reload could not run: {0}")]
    Internal(String),
}

/// What a successful reload did.
#[derive(Debug, Clone, Default)]
pub struct ReloadReport {
    /// Backends whose stack (pools, caches, breakers, balancer) was kept.
    pub kept: Vec<String>,
    /// Backends built anew (new or changed).
    pub rebuilt: Vec<String>,
    /// Whether the reference data was kept (else the new datasets were loaded).
    pub reference_kept: bool,
    /// Process-level settings that changed but apply only at restart.
    pub needs_restart: Vec<String>,
}

/// Reload counters and the serializing lock.
#[derive(Default)]
pub(crate) struct Reloads {
    lock: tokio::sync::Mutex<()>,
    ok: AtomicU64,
    failed: AtomicU64,
    /// Unix time (ms) of the last successful reload; 0 before any.
    last_ok_ms: AtomicU64,
    last_error: std::sync::Mutex<Option<String>>,
    /// The last `history_cap` reloads, oldest first: (unix ms, the error of a refused one).
    history: std::sync::Mutex<std::collections::VecDeque<(u64, Option<String>)>>,
    /// `admin.ui.reload_history`: how many reloads [`Reloads::history_json`] lists.
    history_cap: usize,
}

impl Reloads {
    /// Counters and a history of at most `history_cap` reloads (`admin.ui.reload_history`).
    pub(crate) fn new(history_cap: usize) -> Reloads {
        Reloads {
            history_cap,
            ..Reloads::default()
        }
    }

    fn succeeded(&self) {
        self.ok.fetch_add(1, Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.last_ok_ms
            .store(now.as_millis() as u64, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.remember(None);
    }

    fn failed(&self, e: &ReloadError) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        self.remember(Some(e.to_string()));
    }

    fn remember(&self, error: Option<String>) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        if self.history_cap == 0 {
            return;
        }
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        while h.len() >= self.history_cap {
            h.pop_front();
        }
        h.push_back((now, error));
    }

    /// `{generation, reloads, failed, history: [{at_unix_ms, ok, error}]}` (newest first) for
    /// the live page: the generation is 1 for the config loaded at start, one more per
    /// successful reload.
    pub(crate) fn history_json(&self) -> serde_json::Value {
        let ok = self.ok.load(Ordering::Relaxed);
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let history: Vec<serde_json::Value> = h
            .iter()
            .rev()
            .map(|(at, e)| serde_json::json!({"at_unix_ms": at, "ok": e.is_none(), "error": e}))
            .collect();
        serde_json::json!({
            "generation": ok + 1,
            "reloads": ok,
            "failed": self.failed.load(Ordering::Relaxed),
            "history": history,
        })
    }

    /// `{reloads, failed, last_reload_unix_ms, last_error}` for the status endpoint.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "reloads": self.ok.load(Ordering::Relaxed),
            "failed": self.failed.load(Ordering::Relaxed),
            "last_reload_unix_ms": self.last_ok_ms.load(Ordering::Relaxed),
            "last_error": self.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        })
    }

    /// (successful reloads, refused reloads, unix time of the last success in seconds).
    pub fn counts(&self) -> (u64, u64, f64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.last_ok_ms.load(Ordering::Relaxed) as f64 / 1000.0,
        )
    }
}

/// A [`Live`] built from a config, with the process-level parts the first build creates.
pub(crate) struct Built {
    pub(crate) live: Live,
    pub(crate) compute: Arc<ComputePool>,
    pub(crate) deadline_header: HeaderName,
    pub(crate) report: ReloadReport,
}

/// Build the live part for `cfg`; with `prev`, keep the stacks, batch forms and reference data
/// of what did not change, and the running compute pool `compute`.
pub(crate) fn build_live(
    cfg: Config,
    prev: Option<&Live>,
    compute: Option<Arc<ComputePool>>,
    adm: &admission::Admission,
    metrics: Option<&Metrics>,
    registry: &crate::registry::Registry,
    listeners: &[Arc<fanout_transport::tls::TlsListener>],
) -> Result<Built, ConfigErrors> {
    let mut report = ReloadReport::default();
    // Every part is built even when another failed, so a config with mistakes in several
    // sections is refused with all of them (the flows, which need the backends, the protos
    // and the runtimes, only when those built).
    let mut errs: Vec<fanout_config::ConfigError> = Vec::new();
    let mut keep = |r: Result<(), ConfigErrors>| {
        if let Err(e) = r {
            errs.extend(e.0);
        }
    };
    // `telemetry:` is applied at start only, but a broken one is refused like any error.
    keep(crate::telemetry::Telemetry::new(&cfg).map(drop));
    let deadline_header = stack::deadline_header(&cfg).unwrap_or_else(|e| {
        errs.push(e);
        HeaderName::from_static("x-request-timeout")
    });
    let stacks = build_stacks(&cfg, prev, &deadline_header, &mut report);
    let protos = crate::grpc::load_protos(&cfg);
    // A runtime whose inputs did not change is kept (the models: versions, queues, counters,
    // watcher).
    let runtimes = crate::registry::open_runtimes(&cfg, prev.map(|p| (&*p.config, &p.runtimes)))
        .map_err(|e| ConfigErrors(vec![e]));
    // The stages may call the backends (a JWK set through a backend's client).
    let no_backends = HashMap::new();
    let stages = fanout_edge::StageSet::build(
        registry.stages(),
        &cfg,
        prev.map(|p| (&*p.config, &p.stages)),
        fanout_edge::Lent {
            redis: crate::l2::rate_limit_connection,
            backends: stacks.as_ref().map_or(&no_backends, |(s, _, _)| s),
            kept_backends: &report.kept,
            tls_of: fanout_transport::tls::request_tls,
            listeners,
        },
    );
    let (stacks, protos, runtimes, stages) = match (stacks, protos, runtimes, stages) {
        (Ok(s), Ok(p), Ok(r), Ok(st)) if errs.is_empty() => (s, p, r, st),
        (s, p, r, st) => {
            for e in [s.err(), p.err(), r.err(), st.err()].into_iter().flatten() {
                errs.extend(e.0);
            }
            fanout_config::locate(&mut errs, &cfg.source);
            return Err(ConfigErrors(errs));
        }
    };
    let (services, stacks, l2) = stacks;
    let mut carry = Carry {
        compute,
        protos,
        runtimes,
        ..Carry::default()
    };
    if let Some(prev) = prev {
        for name in &report.kept {
            if let Some(b) = prev.batches.get(name) {
                carry.batches.insert(name.clone(), b.clone());
            }
        }
        if reference_unchanged(&prev.config, &cfg, &report) {
            carry.reference = Some(prev.reference.clone());
            report.reference_kept = true;
        }
    }
    let plan = crate::registry::compile(&cfg, &services, carry).map_err(|mut e| {
        fanout_config::locate(&mut e.0, &cfg.source);
        e
    })?;
    let router = route_table(&cfg, &plan.routes)?;
    let pass = fanout_pass::compile(&cfg, &services, prev.map(|p| &p.pass)).map_err(|mut e| {
        fanout_config::locate(&mut e, &cfg.source);
        ConfigErrors(e)
    })?;
    let websockets = fanout_ws::compile(&cfg, prev.map(|p| &p.websockets)).map_err(|mut e| {
        fanout_config::locate(&mut e, &cfg.source);
        ConfigErrors(e)
    })?;
    let contract = fanout_openapi::Contract::compile(&cfg).map_err(|mut e| {
        fanout_config::locate(&mut e, &cfg.source);
        ConfigErrors(e)
    })?;
    let grpc = crate::grpc::services(&cfg, &plan.protos, &plan.routes)?;
    let mut grpc_services: Vec<String> = plan
        .routes
        .iter()
        .filter_map(|r| r.grpc.as_ref())
        .map(|g| g.method.desc.parent_service().full_name().to_string())
        .collect();
    grpc_services.sort();
    grpc_services.dedup();
    let caches = stacks
        .iter()
        .filter_map(|(n, s)| {
            let keys = plan.batches.get(n).and_then(|b| b.cache_stats());
            Some((n.clone(), s.cache.clone()?, keys))
        })
        .collect();
    let mut error_codes: Vec<Arc<str>> = plan
        .routes
        .iter()
        .flat_map(|r| r.steps.iter().flat_map(|s| s.answer_codes()))
        .collect();
    error_codes.sort();
    error_codes.dedup();
    let live = Live {
        router,
        reference: plan.reference.clone(),
        caches,
        stacks,
        services,
        batches: plan.batches.clone(),
        route_admission: admission::RouteTable::new(&cfg.routes, adm),
        l2,
        route_metrics: metrics.map(|m| m.route_table(&plan.routes)),
        ui_stats: cfg
            .admin
            .ui
            .enabled
            .then(|| fanout_ops::record::RouteStats::new(&plan.routes)),
        routes: plan.routes.clone(),
        error_codes,
        config: Arc::new(cfg),
        grpc,
        grpc_services,
        runtimes: plan.runtimes.clone(),
        coalesce: crate::coalesce::tables(&plan.routes),
        route_names: plan
            .routes
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect(),
        stages,
        pass,
        websockets,
        contract,
    };
    Ok(Built {
        live,
        compute: plan.compute,
        deadline_header,
        report,
    })
}

/// The config's authentication; a JWKS URL whose schedule did not change keeps its keys.
/// Backends by name for the flow compiler (the top of each stack), each stack's state, and
/// the shared Redis of the answer caches.
type Stacks = (
    HashMap<String, Arc<dyn Backend>>,
    Vec<(String, stack::StackStats)>,
    Option<Arc<L2>>,
);

/// Every backend's stack — the previous one when its config did not change — and every
/// backend config error at once.
fn build_stacks(
    cfg: &Config,
    prev: Option<&Live>,
    deadline_header: &HeaderName,
    report: &mut ReloadReport,
) -> Result<Stacks, ConfigErrors> {
    let mut services = HashMap::new();
    let mut stats = Vec::new();
    let mut errs = Vec::new();
    // One shared Redis for every backend's cache (one connection, one breaker), kept by a
    // reload that does not change `redis:`.
    let l2 = match prev {
        Some(p) if p.config.redis == cfg.redis => p.l2.clone(),
        _ => crate::l2::build(cfg.redis.as_ref()).unwrap_or_else(|e| {
            errs.push(e.in_file(&cfg.file));
            None
        }),
    };
    for (name, b) in &cfg.backends {
        let kept = prev.and_then(|p| {
            if !stack::unchanged(&p.config, cfg, name) {
                return None;
            }
            let service = p.services.get(name)?.clone();
            let s = p.stacks.iter().find(|(n, _)| n == name)?.1.clone();
            Some((service, s))
        });
        if let Some((service, s)) = kept {
            services.insert(name.clone(), service);
            stats.push((name.clone(), s));
            report.kept.push(name.clone());
            continue;
        }
        let shared = fanout_protocol::Shared {
            defaults: &cfg.defaults,
            deadline_header,
        };
        match stack::build(name, b, &shared, l2.as_ref()) {
            Ok(s) => {
                services.insert(name.clone(), s.service);
                stats.push((name.clone(), s.stats));
                report.rebuilt.push(name.clone());
            }
            Err(e) => errs.push(e.in_file(&cfg.file)),
        }
    }
    if errs.is_empty() {
        Ok((services, stats, l2))
    } else {
        Err(ConfigErrors(errs))
    }
}

/// The reference data can be kept: same datasets, and every backend they read kept its stack.
fn reference_unchanged(old: &Config, new: &Config, report: &ReloadReport) -> bool {
    old.reference == new.reference
        && new
            .reference
            .values()
            .all(|r| report.kept.contains(&r.http.backend.value))
}

/// Process-level settings of `new` that differ from `old` (applied only at restart).
fn restart_only(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if old.listen != new.listen {
        out.push("listen".to_string());
    }
    if old.server != new.server {
        out.push("server".to_string());
    }
    if old.telemetry != new.telemetry {
        out.push("telemetry".to_string());
    }
    if old.admin != new.admin {
        out.push("admin".to_string());
    }
    // The files are reloaded when they change (`tls.rs`); the settings at restart.
    if old.tls != new.tls {
        out.push("tls".to_string());
    }
    out
}

impl Gateway {
    /// Reload from the config file at `path` (read and compiled on the blocking pool, never on
    /// an I/O worker), then swap it in ([`Gateway::reload`]). Refusals are logged with their
    /// `FILE:LINE:COL` messages and counted; the old config keeps serving.
    pub async fn reload_file(
        &self,
        path: &str,
        vars: fn(&str) -> Option<String>,
    ) -> Result<ReloadReport, ReloadError> {
        let path = path.to_string();
        let loaded = tokio::task::spawn_blocking(move || Config::from_file(&path, &vars))
            .await
            .map_err(|e| ReloadError::Internal(e.to_string()));
        let cfg = match loaded {
            Ok(Ok(cfg)) => cfg,
            Ok(Err(e)) => return Err(self.refused(ReloadError::Config(e))),
            Err(e) => return Err(self.refused(e)),
        };
        self.reload(cfg).await
    }

    /// Swap in `cfg`: compile it on the blocking pool keeping the state of what did not change,
    /// load new reference data, then replace the live part atomically. `listen` and `server.*`
    /// keep their running values (see the module docs).
    pub async fn reload(&self, mut cfg: Config) -> Result<ReloadReport, ReloadError> {
        let _one_at_a_time = self.reloads.lock.lock().await;
        let prev = self.live();
        let needs_restart = restart_only(&prev.config, &cfg);
        cfg.server = prev.config.server.clone();
        cfg.listen = prev.config.listen.clone();
        cfg.telemetry = prev.config.telemetry.clone();
        cfg.admin = prev.config.admin.clone();
        let compute = self.compute.clone();
        let adm = self.admission.clone();
        let old = prev.clone();
        let metrics = self.record_metrics.then(|| self.metrics.clone());
        let registry = self.registry.clone();
        let listeners = self.tls_listeners();
        let built = tokio::task::spawn_blocking(move || {
            build_live(
                cfg,
                Some(&old),
                Some(compute),
                &adm,
                metrics.as_deref(),
                &registry,
                &listeners,
            )
        })
        .await;
        let built = match built {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => return Err(self.refused(ReloadError::Config(e))),
            Err(e) => return Err(self.refused(ReloadError::Internal(e.to_string()))),
        };
        crate::share_memory_budget(&built.live, &self.bodies);
        if let Err(e) = crate::check_backends(&built.live).await {
            self.retain_route_series(&prev);
            return Err(self.refused(ReloadError::Config(e)));
        }
        // What the new config's stages need before they decide (new JWK sets) is fetched
        // before it serves (kept ones are running); what cannot be refuses the reload, as
        // required reference data does.
        let unstarted = built.live.stages.start().await;
        if !unstarted.is_empty() {
            self.retain_route_series(&prev);
            return Err(self.refused(ReloadError::Stage(unstarted.join(", "))));
        }
        if !built.report.reference_kept
            && let Err(e) = start_reference(&built.live.reference).await
        {
            // The series the refused build created leave `/metrics`.
            self.retain_route_series(&prev);
            return Err(self.refused(ReloadError::Reference(e)));
        }
        let mut report = built.report;
        report.needs_restart = needs_restart;
        let live = Arc::new(built.live);
        self.live.store(live.clone());
        if let Err(e) = live.runtimes.start() {
            tracing::error!(error = %e, "a runtime did not start (the models.dir watcher: replaced files are not picked up)");
        }
        // The series of routes and steps the new config does not have leave `/metrics`.
        self.retain_route_series(&live);
        self.reloads.succeeded();
        self.metrics.config_reloaded(true);
        tracing::info!(
            kept = ?report.kept,
            rebuilt = ?report.rebuilt,
            reference_kept = report.reference_kept,
            "config reloaded"
        );
        if !report.needs_restart.is_empty() {
            tracing::warn!(
                settings = ?report.needs_restart,
                "config reload: these settings changed but take effect only at the next restart"
            );
        }
        Ok(report)
    }

    /// Keep only the per-route metric series of `live`'s table (under the reload lock: a table
    /// being built meanwhile would lose its series).
    fn retain_route_series(&self, live: &Live) {
        if let Some(table) = &live.route_metrics {
            self.metrics.retain(table);
        }
    }

    /// Count and log a refused reload.
    fn refused(&self, e: ReloadError) -> ReloadError {
        self.reloads.failed(&e);
        self.metrics.config_reloaded(false);
        tracing::error!(error = %e, "config reload refused");
        e
    }

    /// (successful reloads, refused reloads, unix time in seconds of the last success).
    pub fn reload_counts(&self) -> (u64, u64, f64) {
        self.reloads.counts()
    }
}
