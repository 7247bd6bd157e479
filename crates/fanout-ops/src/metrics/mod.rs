//! Prometheus metrics (`GET /metrics` on the admin listener; every name, type and label is in
//! docs/operations.md#metrics).
//!
//! Two kinds, so that the request path pays only for what must be counted per event:
//!
//! - **Recorded per event** (this module): requests by route, method and status class, their
//!   latency and in-flight count, partial answers, and each step's backend calls by outcome with
//!   their latency. The families live in [`Metrics`], created once per process (a config reload
//!   keeps them); each route's handles (counters, gauges, histograms) are resolved ONCE when the
//!   gateway is built ([`RouteTable`]), so recording is a few relaxed atomic additions — no label
//!   lookup, no allocation. Resolving a handle creates its series, so every route's and step's
//!   series exist with zero values from the start; when a reload swaps in a new table,
//!   [`Metrics::retain`] drops the series of routes and steps the new config no longer has.
//!   With `admin.metrics: false` there is no table and nothing is recorded.
//! - **Read at scrape time** (`fanout-proxy`'s `scrape.rs`): everything that already exists as counters or state
//!   (errors by code, balancer and addresses, breakers, retries, hedges, dedup, caches, batches,
//!   admission, connections, reference data, compute pool, stalls) and the process (`/proc`).
//!   They cost nothing between scrapes.
//!
//! Label values are bounded: `route` is the route's path pattern from the config (requests that
//! match no route are `unmatched`), `method` is the route's method (for unmatched requests one of
//! the standard methods or `other`), step and backend names come from the config.

pub mod process;

use fanout_flow::observe::Observer;
use fanout_flow::plan::StepPlan;
use fanout_flow::{CallClass, FlowError, Outcome, RoutePlan};
use fanout_runtime::hist::AtomicHistogram;
use http::{Method, StatusCode};
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Labels of one sample: (name, value) pairs, names fixed by the catalog.
pub type Labels<const N: usize> = [(&'static str, String); N];

/// A latency histogram handle: lock-free ([`AtomicHistogram`], 0.5 ms … 10 s), shown as a
/// Prometheus histogram in seconds.
#[derive(Debug, Clone)]
pub struct Hist(Arc<AtomicHistogram>);

impl Hist {
    fn new() -> Hist {
        Hist(Arc::new(AtomicHistogram::latency()))
    }

    /// Record one duration.
    #[inline]
    pub fn observe(&self, d: Duration) {
        self.0.record_duration(d);
    }
}

impl TypedMetric for Hist {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Hist {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.snapshot();
        encoder.encode_histogram::<NoLabelSet>(s.sum, s.count, &s.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

type HistFamily<const N: usize> = Family<Labels<N>, Hist, fn() -> Hist>;

/// The `status_class` label values, by `status / 100 - 1`.
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The `method` label values of unmatched requests (any other method is `other`).
const METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "other",
];

/// The `route` label of requests that match no route (path and method).
pub const UNMATCHED: &str = "unmatched";

/// The process-lived metric families (a reload re-resolves handles against the same ones),
/// and the registry they are encoded from.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<Labels<3>, Counter>,
    request_duration: HistFamily<2>,
    requests_in_flight: Family<Labels<1>, Gauge>,
    partial: Family<Labels<1>, Counter>,
    coalesced: Family<Labels<1>, Counter>,
    backend_calls: Family<Labels<3>, Counter>,
    backend_call_duration: HistFamily<2>,
    config_reloads: Family<Labels<1>, Counter>,
    config_last_success: Gauge<f64, AtomicU64>,
    /// The series of the per-route families created by [`Metrics::route_table`] and not yet
    /// dropped by [`Metrics::retain`].
    created: Mutex<Series>,
}

/// Label sets of the per-route families: those one [`RouteTable`] holds, or all created.
#[derive(Debug, Default, Clone)]
struct Series {
    /// `fanout_requests`.
    requests: HashSet<Labels<3>>,
    /// `fanout_request_duration_seconds`.
    durations: HashSet<Labels<2>>,
    /// `fanout_requests_in_flight` and `fanout_partial_responses`.
    routes: HashSet<Labels<1>>,
    /// `fanout_requests_coalesced` (routes that coalesce).
    coalesced: HashSet<Labels<1>>,
    /// `fanout_backend_calls`.
    calls: HashSet<Labels<3>>,
    /// `fanout_backend_call_duration_seconds`.
    call_durations: HashSet<Labels<2>>,
}

impl Series {
    fn extend(&mut self, other: &Series) {
        self.requests.extend(other.requests.iter().cloned());
        self.durations.extend(other.durations.iter().cloned());
        self.routes.extend(other.routes.iter().cloned());
        self.coalesced.extend(other.coalesced.iter().cloned());
        self.calls.extend(other.calls.iter().cloned());
        self.call_durations
            .extend(other.call_durations.iter().cloned());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every per-event family, registered; the config loaded at start counts as the last
    /// successful load (`fanout_config_last_reload_success_timestamp_seconds` = now).
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::default(),
            requests: Family::default(),
            request_duration: Family::new_with_constructor(Hist::new),
            requests_in_flight: Family::default(),
            partial: Family::default(),
            coalesced: Family::default(),
            backend_calls: Family::default(),
            backend_call_duration: Family::new_with_constructor(Hist::new),
            config_reloads: Family::default(),
            config_last_success: Gauge::default(),
            created: Mutex::default(),
        };
        m.register();
        for result in ["ok", "error"] {
            let _ = m.config_reloads.get_or_create(&[("result", result.into())]);
        }
        m.config_last_success.set(unix_now());
        m
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        r.register(
            "fanout_requests",
            "Requests answered, by route pattern, method and status class",
            self.requests.clone(),
        );
        r.register(
            "fanout_request_duration_seconds",
            "Time from a request's arrival to its answer, by route pattern and method",
            self.request_duration.clone(),
        );
        r.register(
            "fanout_requests_in_flight",
            "Requests being handled now, by route pattern",
            self.requests_in_flight.clone(),
        );
        r.register(
            "fanout_partial_responses",
            "Answers in which optional steps fell back to their default, by route pattern",
            self.partial.clone(),
        );
        r.register(
            "fanout_requests_coalesced",
            "Requests answered by a run of the flow that another identical request started \
             (whole-request coalescing), by route pattern",
            self.coalesced.clone(),
        );
        r.register(
            "fanout_backend_calls",
            "Backend calls made by steps, by backend, step and outcome class",
            self.backend_calls.clone(),
        );
        r.register(
            "fanout_backend_call_duration_seconds",
            "Time of a step's backend call as the flow saw it (cache, retries and hedges included)",
            self.backend_call_duration.clone(),
        );
        r.register(
            "fanout_config_reloads",
            "Config reloads, by result (ok, error)",
            self.config_reloads.clone(),
        );
        r.register(
            "fanout_config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful config load (the start, or the last reload)",
            self.config_last_success.clone(),
        );
    }

    /// The registry of the per-event families (encoded by `fanout-proxy`'s `scrape::encode`).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Count a config reload (`ok`: it was applied; the success time is now).
    pub fn config_reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.config_reloads
            .get_or_create(&[("result", result.into())])
            .inc();
        if ok {
            self.config_last_success.set(unix_now());
        }
    }

    /// The handles of every route of a plan, resolved now (once per build of the gateway). Their
    /// series exist from now on, with zero values until something is recorded.
    pub fn route_table(&self, routes: &[Arc<RoutePlan>]) -> RouteTable {
        let mut series = Series::default();
        let table = RouteTable {
            routes: routes.iter().map(|r| self.route(r, &mut series)).collect(),
            unmatched: METHODS.map(|m| self.requests_of(UNMATCHED, m, &mut series)),
            series,
        };
        self.created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(&table.series);
        table
    }

    /// Keep only the per-route series of `table` (the one now in use): the series of routes and
    /// steps that are not in it — removed by a reload, or created by a build that was refused —
    /// leave `/metrics`. Call it with the reloads serialized, after the swap (a table built
    /// meanwhile would lose its series).
    pub fn retain(&self, table: &RouteTable) {
        let mut created = self.created.lock().unwrap_or_else(|p| p.into_inner());
        let keep = &table.series;
        for l in created.requests.difference(&keep.requests) {
            self.requests.remove(l);
        }
        for l in created.durations.difference(&keep.durations) {
            self.request_duration.remove(l);
        }
        for l in created.routes.difference(&keep.routes) {
            self.requests_in_flight.remove(l);
            self.partial.remove(l);
        }
        for l in created.coalesced.difference(&keep.coalesced) {
            self.coalesced.remove(l);
        }
        for l in created.calls.difference(&keep.calls) {
            self.backend_calls.remove(l);
        }
        for l in created.call_durations.difference(&keep.call_durations) {
            self.backend_call_duration.remove(l);
        }
        *created = keep.clone();
    }

    fn requests_of(&self, route: &str, method: &str, series: &mut Series) -> RequestCounters {
        let by_class = STATUS_CLASSES.map(|class| {
            let labels: Labels<3> = [
                ("route", route.into()),
                ("method", method.into()),
                ("status_class", class.into()),
            ];
            let c = self.requests.get_or_create_owned(&labels);
            series.requests.insert(labels);
            c
        });
        let labels: Labels<2> = [("route", route.into()), ("method", method.into())];
        let duration = self.request_duration.get_or_create_owned(&labels);
        series.durations.insert(labels);
        RequestCounters { by_class, duration }
    }

    fn route(&self, r: &RoutePlan, series: &mut Series) -> RouteMetrics {
        let route: Labels<1> = [("route", r.path.clone())];
        let m = RouteMetrics {
            requests: self.requests_of(&r.path, r.method.as_str(), series),
            in_flight: self.requests_in_flight.get_or_create_owned(&route),
            partial: self.partial.get_or_create_owned(&route),
            coalesced: r.coalesces().then(|| {
                series.coalesced.insert(route.clone());
                self.coalesced.get_or_create_owned(&route)
            }),
            steps: r.steps.iter().map(|s| self.step(s, series)).collect(),
        };
        series.routes.insert(route);
        m
    }

    fn step(&self, s: &StepPlan, series: &mut Series) -> Option<StepMetrics> {
        let backend = s.backend()?.to_string();
        let step = s.name.to_string();
        let calls = CallClass::ALL.map(|class| {
            let labels: Labels<3> = [
                ("backend", backend.clone()),
                ("step", step.clone()),
                ("outcome", class.label().into()),
            ];
            let c = self.backend_calls.get_or_create_owned(&labels);
            series.calls.insert(labels);
            c
        });
        let labels: Labels<2> = [("backend", backend), ("step", step)];
        let duration = self.backend_call_duration.get_or_create_owned(&labels);
        series.call_durations.insert(labels);
        Some(StepMetrics { calls, duration })
    }
}

/// Seconds since the Unix epoch, now.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Requests of one (route, method): by status class, and their latency.
#[derive(Debug)]
struct RequestCounters {
    by_class: [Counter; 5],
    duration: Hist,
}

impl RequestCounters {
    fn record(&self, status: StatusCode, elapsed: Duration) {
        let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
        if let Some(c) = self.by_class.get(class) {
            c.inc();
        }
        self.duration.observe(elapsed);
    }
}

/// One route's handles, resolved when the gateway is built.
#[derive(Debug)]
pub struct RouteMetrics {
    requests: RequestCounters,
    in_flight: Gauge,
    partial: Counter,
    /// Requests answered by another request's run (`None`: the route does not coalesce).
    coalesced: Option<Counter>,
    /// By step index; `None` for steps that call no backend.
    steps: Vec<Option<StepMetrics>>,
}

/// One step's backend-call handles: a counter per outcome class, and the latency.
#[derive(Debug)]
struct StepMetrics {
    /// By [`CallClass::index`].
    calls: [Counter; CallClass::ALL.len()],
    duration: Hist,
}

impl RouteMetrics {
    /// A step's backend call ended (the [`Observer`] hook).
    #[inline]
    pub fn call_finished(
        &self,
        step: &StepPlan,
        elapsed: Duration,
        result: Result<(), &FlowError>,
    ) {
        let Some(Some(m)) = self.steps.get(step.index) else {
            return;
        };
        if let Some(c) = m.calls.get(fanout_flow::error::call_class(result).index()) {
            c.inc();
        }
        m.duration.observe(elapsed);
    }
}

impl Observer for RouteMetrics {
    fn call_finished(&self, step: &StepPlan, elapsed: Duration, result: Result<(), &FlowError>) {
        RouteMetrics::call_finished(self, step, elapsed, result);
    }
}

/// Every route's handles (by [`RoutePlan::index`]) and those of unmatched requests.
#[derive(Debug)]
pub struct RouteTable {
    routes: Vec<RouteMetrics>,
    /// By the index of the request's method in [`METHODS`].
    unmatched: [RequestCounters; 8],
    /// The label sets of every handle above (for [`Metrics::retain`]).
    series: Series,
}

impl RouteTable {
    /// Start recording one request with `method` that arrived at `start`.
    #[inline]
    pub fn request<'a>(
        table: Option<&'a RouteTable>,
        start: Instant,
        method: &Method,
    ) -> RequestRecord<'a> {
        RequestRecord {
            table,
            route: None,
            start,
            method: if table.is_some() {
                method_index(method)
            } else {
                0
            },
            done: false,
        }
    }
}

/// One request being recorded: created when it arrives, told its route, finished with its
/// status. Without a table (metrics off) every method does nothing.
#[derive(Debug)]
pub struct RequestRecord<'a> {
    table: Option<&'a RouteTable>,
    route: Option<&'a RouteMetrics>,
    start: Instant,
    /// The request's method, as an index into [`METHODS`] (for unmatched requests).
    method: usize,
    done: bool,
}

impl<'a> RequestRecord<'a> {
    /// When the request arrived.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// The request matched `route`: it is in flight there.
    #[inline]
    pub fn routed(&mut self, route: &RoutePlan) {
        if let Some(m) = self.table.and_then(|t| t.routes.get(route.index)) {
            m.in_flight.inc();
            self.route = Some(m);
        }
    }

    /// The route's handles (for the request's observer), once routed.
    pub fn route_metrics(&self) -> Option<&'a RouteMetrics> {
        self.route
    }

    /// The flow ran: an answer with steps that fell back counts as partial.
    #[inline]
    pub fn ran<E>(&self, out: &Result<Outcome, E>) {
        if let (Some(m), Ok(o)) = (self.route, out)
            && !o.partial.is_empty()
        {
            m.partial.inc();
        }
    }

    /// The request was answered by another request's run of the flow (coalesced).
    #[inline]
    pub fn coalesced(&self) {
        if let Some(c) = self.route.and_then(|m| m.coalesced.as_ref()) {
            c.inc();
        }
    }

    /// Not a request to count (the deprecated status endpoint on the client port).
    pub fn ignore(&mut self) {
        self.done = true;
    }

    /// The request is answered with `status`.
    #[inline]
    pub fn finish(&mut self, status: StatusCode) {
        if self.done {
            return;
        }
        self.done = true;
        let Some(table) = self.table else { return };
        let elapsed = self.start.elapsed();
        match self.route {
            Some(m) => {
                m.requests.record(status, elapsed);
                m.in_flight.dec();
            }
            None => {
                if let Some(c) = table.unmatched.get(self.method) {
                    c.record(status, elapsed);
                }
            }
        }
    }
}

impl Drop for RequestRecord<'_> {
    /// A request dropped before its answer (the client went away) leaves the in-flight gauge;
    /// it is not counted as answered.
    fn drop(&mut self) {
        if !self.done
            && let Some(m) = self.route
        {
            m.in_flight.dec();
        }
    }
}

/// The index of `m` in [`METHODS`] (the last, `other`, for any other method).
fn method_index(m: &Method) -> usize {
    METHODS
        .iter()
        .position(|&name| name == m.as_str())
        .unwrap_or(METHODS.len() - 1)
}
