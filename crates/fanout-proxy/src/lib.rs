//! fanout's inbound side: the server ([`server`]), the request lifecycle, reloads, `/metrics`
//! ([`scrape`]), each backend's stack ([`stack`]) over the client its protocol builds
//! ([`PROTOCOLS`]: `fanout-client` for HTTP and gRPC, `fanout-postgres`), and [`Gateway`], which
//! ties a compiled plan to a router. Connections and overload (admission, TLS, cores, the
//! watchdog) are `fanout-transport`'s; metric families, telemetry, health and the live page's
//! recorder are `fanout-ops`'s.

#![forbid(unsafe_code)]

pub mod admin;
mod answer;
pub(crate) mod coalesce;
mod grpc;
mod grpc_compression;
pub mod l2;
mod lifecycle;
mod merge;
pub mod observe;
mod pass;
pub mod registry;
pub mod reload;
mod request_body;
pub mod scrape;
pub mod server;
pub mod stack;
mod streamed;
pub mod telemetry;
pub mod ui;
mod websocket;

use arc_swap::ArcSwap;
use fanout_config::{AdminConfig, Config, ConfigError, ConfigErrors, ServerConfig};
use fanout_flow::reference::ReferenceSet;
use fanout_flow::{Backend, RoutePlan};
use fanout_layers::cache::CacheStats;
use fanout_ops::{errlog, health, metrics, record};
use fanout_transport::{admission, conn, cores, tls, watchdog};
use http::HeaderName;
use std::collections::HashMap;
use std::sync::Arc;

pub use fanout_client::HttpBackend;
/// The in-flight memory gate (request bodies, database rows), shared with the protocols.
pub use fanout_protocol::bodies;
pub use grpc::load_protos;
pub(crate) use registry::PROTOCOLS;
pub use server::{serve, serve_per_core};

/// A ready-to-serve gateway. What a config reload replaces (routes, plans, backend stacks,
/// reference data) is the [`Live`] part, swapped atomically; the rest lives as long as the
/// process (listener limits, admission, connections, compute pool, counters).
pub struct Gateway {
    /// The current config's routes, backends and reference data (see [`reload`]).
    live: ArcSwap<Live>,
    /// Config reloads: serialized, counted.
    reloads: reload::Reloads,
    limits: ServerConfig,
    deadline_header: HeaderName,
    watchdog: std::sync::OnceLock<Arc<watchdog::Watchdog>>,
    /// The serving cores, once a per-core gateway serves (`server.runtime: per_core`).
    cores: std::sync::OnceLock<Arc<cores::Cores>>,
    compute: Arc<fanout_runtime::compute::ComputePool>,
    admission: admission::Admission,
    /// Client connections: cap, timeouts, counters.
    conns: Arc<conn::Connections>,
    /// Request bodies: reader cap and memory budget.
    bodies: Arc<bodies::BodyGate>,
    /// Requests whose handler panicked (answered 500).
    panics: std::sync::atomic::AtomicU64,
    /// Error answers by code.
    errors: server::ErrorCounts,
    /// Request ids: the client's when valid, else generated.
    /// Caps the failed-request log lines per second.
    error_log: errlog::LogThrottle,
    /// Traces, the access log, `Server-Timing`.
    telemetry: telemetry::Telemetry,
    /// The address from the config.
    pub listen: String,
    /// The admin listener's settings (`admin:`).
    pub admin: AdminConfig,
    /// Metric families (process-lived; each `Live` resolves its route handles against them).
    metrics: Arc<metrics::Metrics>,
    /// `admin.metrics`: whether requests and calls are recorded.
    record_metrics: bool,
    /// Liveness and readiness flags (process-lived).
    health: Arc<health::Health>,
    /// TLS on the client listener (`tls:`) and on the admin listener (`admin.tls`).
    pub tls: Option<Arc<tls::TlsListener>>,
    /// TLS on the admin listener.
    pub admin_tls: Option<Arc<tls::TlsListener>>,
    /// Where the flows' branches are recorded (`fanout test --coverage`); `None` when serving.
    coverage: Option<Arc<fanout_flow::coverage::Coverage>>,
    /// The live page's last slow and failed requests (`None` with `admin.ui.enabled: false`).
    recent: Option<record::Recent>,
    /// The components it was built from (a reload builds the new config's from the same).
    registry: Arc<registry::Registry>,
    /// The shutdown as event streams see it (`fanout_pass::sse`): started when connections
    /// drain, it ends each stream at its next event boundary.
    drain: Arc<fanout_pass::sse::Drain>,
    /// Open WebSockets (`fanout-ws`): the process's cap, the drain, the gauge.
    websockets: Arc<fanout_ws::counters::Hub>,
}

/// What one config gives the gateway, replaced as a whole on reload: in-flight requests keep
/// the `Live` they started with (an `Arc`), new ones get the new one.
pub struct Live {
    router: matchit::Router<Vec<Arc<RoutePlan>>>,
    reference: Arc<ReferenceSet>,
    /// Answer caches (per backend) and per-key caches (of its batch form).
    caches: Vec<(String, Arc<CacheStats>, Option<Arc<CacheStats>>)>,
    /// Each backend's layer state, in config order.
    stacks: Vec<(String, stack::StackStats)>,
    /// Each backend's stack (its top), kept by the next reload when its config is unchanged.
    services: HashMap<String, Arc<dyn Backend>>,
    /// Batch forms by backend, kept like the stacks.
    batches: HashMap<String, Arc<fanout_flow::batch::BatchPlan>>,
    route_admission: admission::RouteTable,
    /// The shared Redis of the answer caches (`redis:`), kept by reloads that do not change it.
    l2: Option<Arc<fanout_layers::l2::L2>>,
    /// The routes' metric handles (`None` with `admin.metrics: false`).
    route_metrics: Option<metrics::RouteTable>,
    /// The live page's per-route and per-step numbers (`None` with `admin.ui.enabled: false`).
    ui_stats: Option<record::RouteStats>,
    /// The compiled routes, by route index (the live page draws their graphs).
    routes: Vec<Arc<RoutePlan>>,
    /// The `error.code`s the config's steps answer with (`fail`, `on_status`), sorted: each has a
    /// `fanout_errors_total` series from the start.
    error_codes: Vec<Arc<str>>,
    /// The config this was built from (compared with the next one on reload).
    config: Arc<Config>,
    /// Server reflection over the gRPC routes' services (`None` without gRPC routes).
    grpc: Option<Arc<grpc::GrpcServices>>,
    /// The services the gRPC routes serve (health checks answer for them).
    grpc_services: Vec<String>,
    /// The runtimes step kinds use (the models of `models.dir`), kept by reloads that do not
    /// change what they read.
    runtimes: fanout_flow::runtime::Runtimes,
    /// The live runs of each route that coalesces, by route index (`coalesce.rs`): a table per
    /// loaded config, so a request never shares a run of another config.
    coalesce: Vec<Option<coalesce::Runs>>,
    /// `METHOD path` of each route, by route index (the status endpoint's names).
    route_names: Vec<String>,
    /// The edge stages of this config and which routes run them (`fanout-edge`).
    stages: fanout_edge::StageSet,
    /// The pass-through routes, by route index (`fanout-pass`).
    pass: fanout_pass::PassRoutes,
    /// The WebSocket routes, by route index (`fanout-ws`).
    websockets: fanout_ws::WsRoutes,
    /// The routes' declared schemas, compiled, and the OpenAPI document (`fanout-openapi`).
    contract: fanout_openapi::Contract,
}

impl Gateway {
    /// Build everything from a loaded config: each backend's stack (no network I/O), the plan,
    /// the router, admission — with new metric families and health flags.
    pub fn build(cfg: &Config) -> Result<Gateway, ConfigErrors> {
        Gateway::build_in(cfg, registry::Registry::standard())
    }

    /// [`Gateway::build`] from the components of `registry` (the standard ones plus, say, an
    /// edge stage of the program that embeds the gateway).
    pub fn build_in(cfg: &Config, registry: registry::Registry) -> Result<Gateway, ConfigErrors> {
        let metrics = Arc::new(metrics::Metrics::new());
        Gateway::build_with_registry(cfg, metrics, Arc::new(health::Health::new()), registry)
    }

    /// [`Gateway::build`] with the process-lived parts given: the metric families (route
    /// handles are resolved against them, so series continue across rebuilds) and the health
    /// flags.
    pub fn build_with(
        cfg: &Config,
        metrics: Arc<metrics::Metrics>,
        health: Arc<health::Health>,
    ) -> Result<Gateway, ConfigErrors> {
        Gateway::build_with_registry(cfg, metrics, health, registry::Registry::standard())
    }

    /// [`Gateway::build_with`] from the components of `registry`.
    pub fn build_with_registry(
        cfg: &Config,
        metrics: Arc<metrics::Metrics>,
        health: Arc<health::Health>,
        registry: registry::Registry,
    ) -> Result<Gateway, ConfigErrors> {
        let registry = Arc::new(registry);
        let adm = admission::Admission::new(&cfg.server.admission);
        let record = cfg.admin.metrics.then_some(&*metrics);
        let listener_tls = |name, t: &Option<fanout_config::ListenerTls>| {
            t.as_ref()
                .map(|t| tls::TlsListener::new(name, t).map(Arc::new))
                .transpose()
                .map_err(|e| ConfigErrors::from(e.in_file(&cfg.file)))
        };
        let (tls, admin_tls) = (
            listener_tls("main", &cfg.tls)?,
            listener_tls("admin", &cfg.admin.tls)?,
        );
        let listeners: Vec<_> = [&tls, &admin_tls].into_iter().flatten().cloned().collect();
        // The build checks `telemetry` too, with every other section's errors.
        let built =
            reload::build_live(cfg.clone(), None, None, &adm, record, &registry, &listeners)?;
        let telemetry = telemetry::Telemetry::new(cfg)?;
        let bodies = Arc::new(bodies::BodyGate::new(&cfg.server.bodies));
        share_memory_budget(&built.live, &bodies);
        Ok(Gateway {
            live: ArcSwap::from_pointee(built.live),
            reloads: reload::Reloads::new(cfg.admin.ui.reload_history),
            limits: cfg.server.clone(),
            deadline_header: built.deadline_header,
            watchdog: std::sync::OnceLock::new(),
            cores: std::sync::OnceLock::new(),
            compute: built.compute,
            admission: adm,
            conns: Arc::new(conn::Connections::new(&cfg.server)),
            bodies,
            panics: std::sync::atomic::AtomicU64::new(0),
            errors: server::ErrorCounts::default(),
            error_log: errlog::LogThrottle::new(cfg.server.error_log_per_second),
            telemetry,
            listen: cfg.listen.clone(),
            admin: cfg.admin.clone(),
            metrics,
            record_metrics: cfg.admin.metrics,
            health,
            tls,
            admin_tls,
            coverage: None,
            recent: cfg
                .admin
                .ui
                .enabled
                .then(|| record::Recent::new(&cfg.admin.ui)),
            registry,
            drain: fanout_pass::sse::Drain::spread_over(cfg.server.drain_spread.0),
            websockets: Arc::new(
                fanout_ws::counters::Hub::new(cfg.server.websockets.max_connections)
                    .with_drain_spread(cfg.server.drain_spread.0),
            ),
        })
    }

    /// Record into `coverage` which routes run and which branches their steps take
    /// (`fanout test --coverage`). Set before the gateway serves.
    pub fn record_coverage(&mut self, coverage: Arc<fanout_flow::coverage::Coverage>) {
        self.coverage = Some(coverage);
    }

    /// `server.drain_delay`: how long to stay up, not ready, before draining.
    pub fn drain_delay(&self) -> std::time::Duration {
        self.limits.drain_delay.0
    }

    /// The current config's part of the gateway.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// The process-lived metric families (for the parts that count into them: config reloads,
    /// the L2 cache).
    pub fn metrics(&self) -> &Arc<metrics::Metrics> {
        &self.metrics
    }

    /// The health flags: set listening when the client listener is up, draining on shutdown.
    pub fn health(&self) -> &Arc<health::Health> {
        &self.health
    }

    /// How requests are spread over the cores (`server.runtime`, read at start).
    pub fn runtime_kind(&self) -> fanout_config::RuntimeKind {
        self.limits.runtime
    }

    /// What the loaded config may not mean (`FILE:LINE:COL: warning: …`): printed by `fanout
    /// validate`, logged when a config is loaded; never a reason to refuse it.
    pub fn config_warnings(&self) -> Vec<ConfigError> {
        let live = self.live();
        live.stages.warnings()
    }

    /// The edge stages route `route` (its index in the config) runs, in order, each with what it
    /// does there, a line each (`fanout explain`).
    pub fn edge_stages_of(&self, route: usize) -> (Vec<String>, Vec<String>) {
        let live = self.live();
        let kind = match live.routes.get(route).is_some_and(|r| r.grpc.is_some()) {
            true => fanout_edge::RouteKind::Grpc,
            false => fanout_edge::RouteKind::Http,
        };
        let (names, lines) = live.stages.explain(route, kind);
        (names.into_iter().map(str::to_string).collect(), lines)
    }

    /// `Ok` when ready to take traffic (`/readyz`), else why not.
    pub fn readiness(&self) -> Result<(), String> {
        let live = self.live();
        self.health.readiness(&live.reference)?;
        live.runtimes.readiness()?;
        live.stages.readiness()?;
        for (_, s) in &live.stacks {
            s.client.readiness()?;
        }
        Ok(())
    }

    /// Start the background work of a serving gateway, inside the runtime: the stall watchdog,
    /// the compute pool, the span exporter and access log writer (when configured), then the
    /// reference data (see [`Gateway::start_reference`]).
    pub async fn start(&self) -> Result<(), String> {
        let threshold = self.limits.stall_threshold.0;
        self.watchdog
            .get_or_init(|| watchdog::Watchdog::spawn(threshold));
        fanout_flow::activity::set_threshold(threshold);
        self.compute
            .start()
            .map_err(|e| format!("starting the compute pool: {e}"))?;
        self.telemetry.start()?;
        // The certificate files are watched from before the listeners serve.
        for t in [&self.tls, &self.admin_tls].into_iter().flatten() {
            t.watch();
        }
        self.live().runtimes.start()?;
        check_backends(&self.live())
            .await
            .map_err(|e| e.to_string())?;
        // What the stages need before they decide (the JWK sets): fetched before ready; what
        // fails is retried in the background, and the gateway is not ready until it succeeds.
        for why in self.live().stages.start().await {
            tracing::warn!(target: "fanout::edge", "{why}");
        }
        self.start_reference().await
    }

    /// Load the reference data (a required dataset that fails to load is an error naming it), then
    /// keep refreshing it in the background. Call once, inside the runtime, before serving.
    pub async fn start_reference(&self) -> Result<(), String> {
        start_reference(&self.live().reference).await
    }

    /// The TLS listeners (main, admin) the gateway serves.
    pub(crate) fn tls_listeners(&self) -> Vec<Arc<tls::TlsListener>> {
        [&self.tls, &self.admin_tls]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// `GET /__fanout/status`: reference data with the age of each dataset.
    pub fn status_json(&self) -> serde_json::Value {
        let now = std::time::SystemTime::now();
        let live = self.live();
        let reference: serde_json::Map<String, serde_json::Value> = live
            .reference
            .status()
            .into_iter()
            .map(|(name, s)| {
                // A load that landed after `now` was read is 0 s old, not of unknown age.
                let age = s
                    .loaded_at
                    .map(|t| now.duration_since(t).unwrap_or_default().as_secs_f64());
                (
                    name.to_string(),
                    serde_json::json!({
                        "loaded": s.loaded_at.is_some(),
                        "age_s": age,
                        "loads": s.loads,
                        "failures": s.failures,
                        "last_error": s.last_error,
                    }),
                )
            })
            .collect();
        let caches: serde_json::Map<String, serde_json::Value> = live
            .caches
            .iter()
            .map(|(n, answers, keys)| {
                (
                    n.clone(),
                    serde_json::json!({
                        "answers": answers.counters(),
                        "keys": keys.as_ref().map(|k| k.counters()),
                    }),
                )
            })
            .collect();
        let runtime = match self.watchdog.get() {
            Some(w) => {
                serde_json::json!({
                    "stalls": w.stalls(),
                    "max_stall_ms": w.max_stall_ms(),
                    "cpu_starvations": w.starvations(),
                    "flow_stalls": fanout_flow::activity::stalls(),
                    "flow_max_stall_ms": fanout_flow::activity::max_stall_ms(),
                    "compute": self.compute.status(),
                    "kind": self.limits.runtime.as_str(),
                    "cores": self.cores.get().map(|c| c.status()),
                })
            }
            None => serde_json::Value::Null,
        };
        let backends: serde_json::Map<String, serde_json::Value> = live
            .stacks
            .iter()
            .map(|(n, r)| (n.clone(), r.status_json()))
            .collect();
        let mut status = serde_json::json!({
            "reference": reference,
            "caches": caches,
            "backends": backends,
            "runtime": runtime,
            "admission": self.admission.status(),
            "connections": self.conns.status(),
            "bodies": self.bodies.status(),
            "panics": self.panics.load(std::sync::atomic::Ordering::Relaxed),
            "errors": self.errors.json(),
            "config": self.reloads.json(),
            "telemetry": self.telemetry.status_json(),
            "coalesce": live.coalesce_json(),
            "sse": live.pass.sse_json(),
            "websockets": self.websockets.status_json(&live.websockets),
        });
        // Each runtime's sections (`models`, `models_watcher`), each edge stage's.
        if let Some(o) = status.as_object_mut() {
            for (name, value) in live.stages.status_json() {
                o.insert(name.into(), value);
            }
            for r in live.runtimes.iter() {
                for (key, value) in r.status(now) {
                    o.insert(key.into(), value);
                }
            }
        }
        status
    }
}

impl Live {
    /// `METHOD path` of route `index` (empty for an index of no route).
    pub(crate) fn route_name(&self, index: usize) -> &str {
        self.route_names.get(index).map_or("", String::as_str)
    }

    /// `{routes: {"METHOD path": {runs, coalesced, reruns, in_flight}}, coalesced}` for the
    /// routes that coalesce (counts since this config was loaded).
    fn coalesce_json(&self) -> serde_json::Value {
        let mut total = 0;
        let routes: serde_json::Map<String, serde_json::Value> = self
            .coalesce
            .iter()
            .zip(&self.route_names)
            .filter_map(|(runs, name)| {
                let c = runs.as_ref()?.counters();
                total += c.coalesced;
                Some((name.clone(), serde_json::to_value(c).unwrap_or_default()))
            })
            .collect();
        serde_json::json!({ "coalesced": total, "routes": routes })
    }
}

/// Load a reference set (a required dataset that fails to load is an error naming it), then
/// keep refreshing it in the background (the refresh ends when the set is dropped).
async fn start_reference(reference: &Arc<ReferenceSet>) -> Result<(), String> {
    if reference.is_empty() {
        return Ok(());
    }
    reference.load_all().await?;
    reference.spawn_refresh();
    Ok(())
}

/// The router: one entry per path pattern, holding that path's routes (one per method).
fn route_table(
    cfg: &Config,
    routes: &[Arc<RoutePlan>],
) -> Result<matchit::Router<Vec<Arc<RoutePlan>>>, ConfigErrors> {
    let mut by_path: Vec<(String, Vec<Arc<RoutePlan>>)> = Vec::new();
    for r in routes {
        match by_path.iter_mut().find(|(p, _)| *p == r.path) {
            Some((_, v)) => v.push(r.clone()),
            None => by_path.push((r.path.clone(), vec![r.clone()])),
        }
    }
    let mut router = matchit::Router::new();
    let mut errs = Vec::new();
    for (path, plans) in by_path {
        if let Err(e) = router.insert(path.clone(), plans) {
            let pos = cfg
                .routes
                .iter()
                .find(|r| r.path.value == path)
                .map(|r| r.path.pos)
                .unwrap_or_default();
            errs.push(
                ConfigError::at(pos, format!("route path `{path}` conflicts with another route: {e}"))
                    .hint("`{name}` captures one segment and `{*rest}` the rest; two patterns may not overlap ambiguously")
                    .in_file(&cfg.file),
            );
        }
    }
    if errs.is_empty() {
        Ok(router)
    } else {
        Err(ConfigErrors(errs))
    }
}

/// The backends' answers take from the gateway's budget for in-flight data, like request
/// bodies (`server.bodies.memory_budget_bytes`), where their protocol holds them.
pub(crate) fn share_memory_budget(live: &Live, gate: &Arc<bodies::BodyGate>) {
    for (_, s) in &live.stacks {
        s.client.share_memory_budget(gate);
    }
}

/// Each backend protocol's check of a loaded config ([`fanout_protocol::ProtocolClient::check`]: a
/// `sql` step's statement is prepared on its database, and one the database refuses is a config
/// error at its line). A backend that cannot be reached is not an error here: the gateway is not
/// ready until it is, and its client checks again when it connects.
pub async fn check_backends(live: &Live) -> Result<(), ConfigErrors> {
    let mut errs = Vec::new();
    for (name, s) in &live.stacks {
        match s.client.check(name, &live.config).await {
            Ok(mut e) => errs.append(&mut e),
            Err(why) => tracing::warn!(
                backend = %name,
                error = %why,
                "backend unreachable: not ready until it is (the config is checked against it when it connects)"
            ),
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(errs))
    }
}
