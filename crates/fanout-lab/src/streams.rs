//! `fanout lab pass-small | pass-bulk | sse-events` (issue 71, acceptance "Cost"): what fanout's
//! pass-through routes cost beside nginx doing the same work in the same run. One stub service
//! (the origin) serves a 1 KiB answer, a 64 MiB download and an event stream; fanout forwards
//! them with `pass:` routes, nginx with `proxy_pass` to an `upstream` with `keepalive` (HTTP/1.1,
//! `Connection ""`, buffering off for the download and the stream, no access log — fanout writes
//! none either — and as many worker processes as fanout has worker threads: one per core). The
//! same open-model load goes to each in interleaved trials (ABBA); per trial the target's CPU
//! (user+sys from `/proc`, nginx's master and workers summed) is divided by what it delivered:
//!
//! - `pass-small`: CPU-µs per request (1 KiB answers, 2 000 req/s over 64 connections);
//! - `pass-bulk`: CPU-seconds per GB streamed (64 MiB answers without a length, 2 per second);
//! - `sse-events`: CPU-ms per 1 000 events delivered (streams of 1 000 events of 108 bytes, one
//!   every 5 ms, 20 new streams per second: about 100 open at once), the events counted by the
//!   generator as it reads them ([`fanout_load::LoadSpec::count_events`]).
//!
//! The nginx target runs only when an `nginx` executable is found ([`find_nginx`]); without it
//! the report says `not run: …` and fanout is measured alone.

use crate::process::{Proc, ProcessError, free_addr};
use crate::procstat;
use crate::svg::esc;
use fanout_load::{LoadReport, LoadSpec, RequestTemplate, Schedule};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `fanout lab pass-small`: 1 KiB answers through a pass-through route.
pub const SMALL: &str = "pass-small";
/// `fanout lab pass-bulk`: 64 MiB downloads through a pass-through route.
pub const BULK: &str = "pass-bulk";
/// `fanout lab sse-events`: Server-Sent Events streams through a pass-through route.
pub const SSE: &str = "sse-events";
/// The scenarios of this module.
pub const NAMES: [&str; 3] = [SMALL, BULK, SSE];

/// The nginx target's name.
pub const NGINX: &str = "nginx";
/// Where the Debian package puts nginx (looked for first, then `nginx` on `PATH`).
pub const NGINX_BIN: &str = "/usr/sbin/nginx";
/// The targets these scenarios run by default (and the only ones they take).
pub const TARGETS: [&str; 2] = ["fanout", NGINX];

/// Bytes of the small answer.
pub const SMALL_BYTES: u64 = 1024;
/// Bytes of one chunk of the download (an event-stream block of 64 KiB, sent as
/// `application/octet-stream`).
pub const BULK_CHUNK: u64 = 65_536;
/// Chunks per download: 64 MiB.
pub const BULK_CHUNKS: u64 = 1024;
/// Events per stream.
pub const EVENTS_PER_STREAM: u64 = 1000;
/// The data of every event (its block is `data: …\n\n`: 108 bytes).
const EVENT_DATA: &str = r#"{"type":"price","symbol":"FNOUT","bid":101.25,"ask":101.27,"seq":10,"note":"lab event (100 bytes)."}"#;
/// The wait before each event.
pub const EVENT_DELAY_MS: u64 = 5;

/// Which of the three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// [`SMALL`].
    Small,
    /// [`BULK`].
    Bulk,
    /// [`SSE`].
    Sse,
}

impl Kind {
    /// The scenario named `name`, if it is one of these.
    pub fn of(name: &str) -> Option<Kind> {
        match name {
            SMALL => Some(Kind::Small),
            BULK => Some(Kind::Bulk),
            SSE => Some(Kind::Sse),
            _ => None,
        }
    }

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Small => SMALL,
            Kind::Bulk => BULK,
            Kind::Sse => SSE,
        }
    }

    /// The path requested (the same on the stub, fanout and nginx).
    pub fn path(self) -> &'static str {
        match self {
            Kind::Small => "/small",
            Kind::Bulk => "/bulk",
            Kind::Sse => "/events",
        }
    }

    /// The cost's unit.
    pub fn unit(self) -> &'static str {
        match self {
            Kind::Small => "CPU µs per request",
            Kind::Bulk => "CPU s per GB",
            Kind::Sse => "CPU ms per 1 000 events",
        }
    }

    /// Body bytes of one complete answer.
    pub fn answer_bytes(self) -> u64 {
        match self {
            Kind::Small => SMALL_BYTES,
            Kind::Bulk => BULK_CHUNK * BULK_CHUNKS,
            Kind::Sse => EVENTS_PER_STREAM * event_block_len(),
        }
    }
}

/// Bytes of one event block on the wire (`data: …\n\n`).
pub fn event_block_len() -> u64 {
    (EVENT_DATA.len() + "data: \n\n".len()) as u64
}

/// The stub config: the origin's three routes (`${ORIGIN_ADDR}`).
pub fn stubs_yaml() -> String {
    // The small answer: a JSON object of exactly SMALL_BYTES bytes.
    let head = r#"{"id":7,"name":"item","pad":""#;
    let tail = r#""}"#;
    let pad = "x".repeat(SMALL_BYTES as usize - head.len() - tail.len());
    let small = format!("{head}{pad}{tail}");
    // One download chunk: `data: ` + filler + a blank line = BULK_CHUNK bytes.
    let filler = "b".repeat(BULK_CHUNK as usize - "data: \n\n".len());
    format!(
        r#"# `fanout lab {SMALL} | {BULK} | {SSE}`: the origin behind fanout and nginx.
services:
  origin:
    listen: "${{ORIGIN_ADDR:-127.0.0.1:9601}}"
    routes:
      - path: /small
        raw_body: '{small}'
      - path: /bulk                 # 64 MiB without a length (chunked), 64 KiB at a time
        headers: {{content-type: application/octet-stream}}
        sse:
          repeat: {BULK_CHUNKS}
          events:
            - data: "{filler}"
      - path: /events               # {EVENTS_PER_STREAM} events, one every {EVENT_DELAY_MS} ms
        sse:
          repeat: {EVENTS_PER_STREAM}
          events:
            - data: '{EVENT_DATA}'
              delay: {EVENT_DELAY_MS}ms
"#
    )
}

/// fanout: the three paths as pass-through routes to the origin.
pub const GATEWAY: &str = r#"# `fanout lab pass-small | pass-bulk | sse-events`: pass-through routes to the origin.
listen: "${LISTEN:-127.0.0.1:8080}"
backends:
  origin:
    url: "http://${ORIGIN_ADDR:-127.0.0.1:9601}"
routes:
  - path: /small
    pass: {backend: origin}
  - path: /bulk
    pass: {backend: origin}
  - path: /events
    pass: {backend: origin}
"#;

/// nginx's config for a run in `dir`: `workers` worker processes, listening on `listen`,
/// `proxy_pass` to the origin at `origin` over kept-alive HTTP/1.1 connections; the forwarding
/// fields fanout adds by default (`X-Forwarded-For`/`-Proto`/`-Host`, `Via` both ways) added
/// too, so both do the same work.
pub fn nginx_conf(dir: &Path, workers: usize, listen: &str, origin: &str) -> String {
    let d = dir.display();
    format!(
        r#"# `fanout lab {SMALL} | {BULK} | {SSE}`: nginx doing what fanout's pass-through routes do.
worker_processes {workers};
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {d}/nginx-tmp/client;
    proxy_temp_path {d}/nginx-tmp/proxy;
    fastcgi_temp_path {d}/nginx-tmp/fastcgi;
    uwsgi_temp_path {d}/nginx-tmp/uwsgi;
    scgi_temp_path {d}/nginx-tmp/scgi;
    # Client connections kept as long as fanout keeps them (idle 60 s, no request cap).
    keepalive_timeout 60s;
    keepalive_requests 1000000;
    upstream origin {{
        server {origin};
        keepalive 256;
        keepalive_requests 1000000;
        keepalive_timeout 90s;
    }}
    server {{
        listen {listen};
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
        proxy_set_header X-Forwarded-Host $host;
        proxy_set_header Via "1.1 nginx";
        add_header Via "1.1 nginx" always;
        location = /small {{
            proxy_pass http://origin;
        }}
        location = /bulk {{
            proxy_pass http://origin;
            proxy_buffering off;
        }}
        location = /events {{
            proxy_pass http://origin;
            proxy_buffering off;
        }}
    }}
}}
"#
    )
}

/// The nginx executable: [`NGINX_BIN`], else `nginx` on `PATH`; `None` when there is none.
pub fn find_nginx() -> Option<PathBuf> {
    let deb = PathBuf::from(NGINX_BIN);
    if deb.is_file() {
        return Some(deb);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("nginx"))
            .find(|p| p.is_file())
    })
}

/// What to run.
#[derive(Debug, Clone)]
pub struct StreamsOptions {
    /// Which scenario.
    pub kind: Kind,
    /// Requests (downloads, streams) started per second.
    pub rate: f64,
    /// Rounds (each: every target once, ABBA order).
    pub rounds: usize,
    /// Length of each trial's schedule (the answers under way at its end are waited for).
    pub trial: Duration,
    /// Most client connections (HTTP/1.1, one request in flight each).
    pub connections: usize,
    /// The targets, in order: `fanout`, `nginx`.
    pub targets: Vec<String>,
    /// Worker threads of fanout (one runtime per core) = nginx's worker processes.
    pub workers: usize,
    /// The nginx executable; `None`: not found (the nginx target is not run).
    pub nginx_bin: Option<PathBuf>,
    /// Output directory.
    pub out: PathBuf,
    /// The fanout executable (stub and gateway).
    pub fanout_bin: PathBuf,
    /// The command line, for the report.
    pub command: String,
    /// `--quick`.
    pub quick: bool,
}

impl StreamsOptions {
    /// The defaults of `kind`: 5 rounds of 10 s (`--quick`: 2 of 2 s; `pass-small` 3 s), both
    /// targets, nginx where [`find_nginx`] finds it.
    pub fn new(
        kind: Kind,
        quick: bool,
        out: PathBuf,
        fanout_bin: PathBuf,
        command: String,
    ) -> StreamsOptions {
        let (rate, connections) = match kind {
            Kind::Small => (2000.0, 64),
            Kind::Bulk => (2.0, 16),
            Kind::Sse => (20.0, 512),
        };
        let quick_s = if kind == Kind::Small { 3 } else { 2 };
        StreamsOptions {
            kind,
            rate,
            rounds: if quick { 2 } else { 5 },
            trial: Duration::from_secs(if quick { quick_s } else { 10 }),
            connections,
            targets: TARGETS.iter().map(|t| t.to_string()).collect(),
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            nginx_bin: find_nginx(),
            out,
            fanout_bin,
            command,
            quick,
        }
    }
}

/// One trial of one target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamTrial {
    /// Round number (0-based).
    pub round: usize,
    /// `fanout` or `nginx`.
    pub target: String,
    /// Requests the schedule asked for.
    pub offered: u64,
    /// 2xx answers read to their end.
    pub ok: u64,
    /// Requests without a 2xx answer read to its end (other statuses, errors, timeouts).
    pub failed: u64,
    /// Body bytes received.
    pub bytes: u64,
    /// Events received (`sse-events`; else `null`).
    pub events: Option<u64>,
    /// Whether every answer was complete: `bytes = ok × answer_bytes` (and for `sse-events`,
    /// `events = ok × 1 000`) with nothing failed.
    pub complete: bool,
    /// The target's CPU time over the trial (user+sys, µs; nginx: master and workers).
    pub cpu_us: u64,
    /// The cost in the scenario's unit ([`Kind::unit`]); `null` when nothing was delivered.
    pub cost: Option<f64>,
    /// Latency p50 from the intended send time to the answer's end, ms.
    pub p50_ms: f64,
    /// p99 of the same, ms.
    pub p99_ms: f64,
    /// Whether the generator kept its schedule.
    pub generator_on_schedule: bool,
    /// The wall time of the trial (schedule and drain), s.
    pub elapsed_s: f64,
}

/// A target's figures over the rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetCost {
    /// The target.
    pub target: String,
    /// Median cost over its trials, and the range.
    pub median: f64,
    /// Lowest trial.
    pub min: f64,
    /// Highest trial.
    pub max: f64,
    /// Trials measured.
    pub n: usize,
    /// Failed requests over all trials.
    pub failed: u64,
    /// Trials whose answers were not all complete.
    pub incomplete: usize,
    /// Trials whose generator fell behind.
    pub generator_behind: usize,
}

/// `report.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamsReport {
    /// `pass-small`, `pass-bulk` or `sse-events`.
    pub scenario: String,
    /// In words.
    pub about: String,
    /// The command line.
    pub command: String,
    /// `--quick`.
    pub quick: bool,
    /// The cost's unit.
    pub unit: String,
    /// Requests (downloads, streams) per second.
    pub rate: f64,
    /// Seconds per trial's schedule.
    pub trial_s: f64,
    /// Most client connections.
    pub connections: usize,
    /// fanout's worker threads = nginx's worker processes.
    pub workers: usize,
    /// Body bytes of one complete answer.
    pub answer_bytes: u64,
    /// Events per stream (`sse-events`).
    pub events_per_stream: Option<u64>,
    /// The nginx executable and its version, when it ran.
    pub nginx: Option<String>,
    /// Targets asked for that did not run, with why.
    pub not_run: BTreeMap<String, String>,
    /// Every trial, in the order run.
    pub trials: Vec<StreamTrial>,
    /// Per target that ran.
    pub costs: Vec<TargetCost>,
    /// fanout's median cost ÷ nginx's (when both ran).
    pub ratio_of_medians: Option<f64>,
    /// The median over the rounds of fanout's trial ÷ nginx's trial of the same round.
    pub ratio_per_round: Option<f64>,
    /// The acceptance line (fanout ≤ nginx), with whether it held.
    pub acceptance: Vec<(String, bool)>,
}

/// What can stop the run.
#[derive(Debug, thiserror::Error)]
pub enum StreamsError {
    /// A process did not start or become ready.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A file could not be written, or a port found.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The load generator refused the spec.
    #[error("load: {0}")]
    Load(String),
    /// A target the scenario does not take.
    #[error("unknown target `{0}` for this scenario: it takes fanout and nginx")]
    Target(String),
}

fn io(p: &Path) -> impl FnOnce(std::io::Error) -> StreamsError + '_ {
    move |e| StreamsError::Io(p.display().to_string(), e)
}

/// One running target: its name, address and the processes whose CPU is its cost.
struct Running {
    name: String,
    addr: std::net::SocketAddr,
    pids: Vec<u32>,
    /// nginx's workers: stopped by their master ([`Running::stop`]), killed by pid if the run
    /// ends another way (dropped), so none outlives the lab.
    workers: Vec<u32>,
    proc: Option<Proc>,
}

impl Running {
    /// Stop the target: nginx's master is asked to stop its workers (a SIGKILL would orphan
    /// them), and waited for.
    async fn stop(mut self) {
        if let Some(p) = self.proc.take() {
            if self.workers.is_empty() {
                p.stop().await;
            } else {
                p.terminate(Duration::from_secs(10)).await;
            }
        }
        kill_left(&std::mem::take(&mut self.workers));
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        kill_left(&self.workers);
    }
}

/// SIGKILL the processes of `pids` that are still nginx workers of this run's (checked by their
/// `/proc/PID/stat` parent: ours, or init once orphaned, and their name).
fn kill_left(pids: &[u32]) {
    for &pid in pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if !stat.contains("(nginx)") {
            continue;
        }
        if let Ok(p) = i32::try_from(pid) {
            // SAFETY: kill(2) on a pid just seen to be an nginx process.
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
    }
}

/// Run the scenario and write `report.json` and `report.html` into `opts.out`.
pub async fn run(opts: StreamsOptions) -> Result<StreamsReport, StreamsError> {
    if let Some(t) = opts.targets.iter().find(|t| !TARGETS.contains(&t.as_str())) {
        return Err(StreamsError::Target(t.clone()));
    }
    std::fs::create_dir_all(&opts.out).map_err(io(&opts.out))?;
    let origin = free_addr().map_err(io(&opts.out))?;
    let mut env = HashMap::new();
    env.insert("ORIGIN_ADDR".to_string(), origin.to_string());
    let stubs_file = opts.out.join("stubs.yaml");
    std::fs::write(&stubs_file, stubs_yaml()).map_err(io(&stubs_file))?;
    let s = |v: &str| v.to_string();
    let mut stub = Proc::spawn(
        "stubs",
        &opts.fanout_bin,
        &[s("stub"), s("--config"), stubs_file.display().to_string()],
        &env,
        &opts.out.join("stubs.log"),
    )?;
    stub.wait_ready(origin, "/small", Duration::from_secs(15))
        .await?;

    let mut running: Vec<Running> = Vec::new();
    let mut not_run = BTreeMap::new();
    let mut nginx_version = None;
    for t in &opts.targets {
        match t.as_str() {
            "fanout" => {
                let addr = free_addr().map_err(io(&opts.out))?;
                let mut env = env.clone();
                env.insert("LISTEN".to_string(), addr.to_string());
                let f = opts.out.join("fanout.yaml");
                std::fs::write(&f, GATEWAY).map_err(io(&f))?;
                let mut p = Proc::spawn(
                    "fanout",
                    &opts.fanout_bin,
                    &[
                        s("serve"),
                        s("--config"),
                        f.display().to_string(),
                        s("--admin-listen"),
                        s("127.0.0.1:0"),
                    ],
                    &env,
                    &opts.out.join("fanout.log"),
                )?;
                p.wait_ready(addr, "/small", Duration::from_secs(15))
                    .await?;
                let pids = p.pid().into_iter().collect();
                running.push(Running {
                    name: t.clone(),
                    addr,
                    pids,
                    workers: Vec::new(),
                    proc: Some(p),
                });
            }
            _ => {
                let Some(bin) = &opts.nginx_bin else {
                    not_run.insert(
                        t.clone(),
                        format!(
                            "no nginx ({NGINX_BIN} or nginx on PATH; Debian: apt-get install nginx)"
                        ),
                    );
                    continue;
                };
                let addr = free_addr().map_err(io(&opts.out))?;
                let dir = opts.out.join("nginx");
                let tmp = dir.join("nginx-tmp");
                std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
                let dir = std::fs::canonicalize(&dir).map_err(io(&dir))?;
                let conf = dir.join("nginx.conf");
                std::fs::write(
                    &conf,
                    nginx_conf(&dir, opts.workers, &addr.to_string(), &origin.to_string()),
                )
                .map_err(io(&conf))?;
                nginx_version = Some(nginx_version_of(bin));
                let mut p = Proc::spawn(
                    NGINX,
                    bin,
                    &[
                        s("-p"),
                        dir.display().to_string(),
                        s("-e"),
                        dir.join("nginx-error.log").display().to_string(),
                        s("-c"),
                        conf.display().to_string(),
                        s("-g"),
                        s("daemon off;"),
                    ],
                    &HashMap::new(),
                    &opts.out.join("nginx.log"),
                )?;
                if let Err(e) = p.wait_ready(addr, "/small", Duration::from_secs(15)).await {
                    // Stopped by its master's hand: a SIGKILL would orphan the workers.
                    p.terminate(Duration::from_secs(10)).await;
                    return Err(e.into());
                }
                // The master and its workers (started before it answered).
                let mut pids: Vec<u32> = p.pid().into_iter().collect();
                let workers = p.pid().map(procstat::children_of).unwrap_or_default();
                pids.extend(&workers);
                running.push(Running {
                    name: t.clone(),
                    addr,
                    pids,
                    workers,
                    proc: Some(p),
                });
            }
        }
    }

    // Warm-up: connections both ways, caches; not measured.
    let warm = Duration::from_secs(1);
    for r in &running {
        load(&opts, r.addr, warm).await?;
    }
    let mut trials = Vec::new();
    for round in 0..opts.rounds {
        let mut order: Vec<usize> = (0..running.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let r = &running[i];
            let cpu0 = procstat::group_cpu_total_us(&r.pids);
            let rep = load(&opts, r.addr, opts.trial).await?;
            let cpu1 = procstat::group_cpu_total_us(&r.pids);
            let cpu_us = match (cpu0, cpu1) {
                (Some(a), Some(b)) => b.saturating_sub(a),
                _ => 0,
            };
            trials.push(trial(opts.kind, round, &r.name, &rep, cpu_us));
        }
    }
    for r in running {
        r.stop().await;
    }
    stub.stop().await;

    let rep = summarise(&opts, trials, not_run, nginx_version);
    let json = serde_json::to_string_pretty(&rep).unwrap_or_default();
    let jf = opts.out.join("report.json");
    std::fs::write(&jf, &json).map_err(io(&jf))?;
    let hf = opts.out.join("report.html");
    std::fs::write(&hf, html(&rep, &json)).map_err(io(&hf))?;
    Ok(rep)
}

/// `nginx -v`'s line (it prints to stderr), with the path.
fn nginx_version_of(bin: &Path) -> String {
    let v = std::process::Command::new(bin)
        .arg("-v")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
        .unwrap_or_default();
    format!("{v} ({})", bin.display())
}

async fn load(
    opts: &StreamsOptions,
    addr: std::net::SocketAddr,
    len: Duration,
) -> Result<LoadReport, StreamsError> {
    let schedule = Schedule::parse(&format!("const({},{}ms)", opts.rate, len.as_millis()))
        .map_err(|e| StreamsError::Load(e.to_string()))?;
    let mut spec = LoadSpec::new(format!("http://{addr}"), schedule);
    spec.requests = vec![RequestTemplate::get(opts.kind.path())];
    spec.max_connections = opts.connections;
    // A download or a stream lasts seconds; the small answers get the usual bound.
    let bound = match opts.kind {
        Kind::Small => Duration::from_secs(5),
        Kind::Bulk | Kind::Sse => Duration::from_secs(60),
    };
    spec.timeout = bound;
    spec.drain = bound;
    spec.count_events = opts.kind == Kind::Sse;
    fanout_load::run(&spec, None)
        .await
        .map_err(|e| StreamsError::Load(e.to_string()))
}

/// The trial's figures; its cost from `cpu_us` and what was delivered.
pub fn trial(kind: Kind, round: usize, target: &str, r: &LoadReport, cpu_us: u64) -> StreamTrial {
    let failed = r.offered.saturating_sub(r.ok);
    let cpu = cpu_us as f64;
    let cost = match kind {
        Kind::Small => (r.ok > 0).then(|| cpu / r.ok as f64),
        // CPU-seconds per 10⁹ bytes.
        Kind::Bulk => (r.bytes_received > 0).then(|| (cpu / 1e6) / (r.bytes_received as f64 / 1e9)),
        // CPU-ms per 1 000 events.
        Kind::Sse => r
            .events
            .filter(|&e| e > 0)
            .map(|e| (cpu / 1e3) / (e as f64 / 1e3)),
    };
    let events_ok = match kind {
        Kind::Sse => r.events == Some(r.ok * EVENTS_PER_STREAM),
        _ => true,
    };
    StreamTrial {
        round,
        target: target.to_string(),
        offered: r.offered,
        ok: r.ok,
        failed,
        bytes: r.bytes_received,
        events: r.events,
        complete: failed == 0 && r.bytes_received == r.ok * kind.answer_bytes() && events_ok,
        cpu_us,
        cost,
        p50_ms: r.latency_ms.p50,
        p99_ms: r.latency_ms.p99,
        generator_on_schedule: r.valid,
        elapsed_s: r.elapsed_s,
    }
}

/// The median of `v` (0 when empty).
fn median(v: Vec<f64>) -> f64 {
    crate::report::Stat::of(v).median
}

/// About the scenario, in words.
fn about(o: &StreamsOptions) -> String {
    let what = match o.kind {
        Kind::Small => format!("{SMALL_BYTES}-byte answers (Content-Length)"),
        Kind::Bulk => format!(
            "{} MiB downloads without a length (chunked, 64 KiB pieces)",
            Kind::Bulk.answer_bytes() >> 20
        ),
        Kind::Sse => format!(
            "event streams: {EVENTS_PER_STREAM} events of {} bytes each, one every {EVENT_DELAY_MS} ms",
            event_block_len()
        ),
    };
    format!(
        "{what} from one stub origin through a pass-through route: fanout (pass:) vs nginx (proxy_pass to a keep-alive upstream{}), {} per second, {} worker(s) each, interleaved (ABBA)",
        if o.kind == Kind::Small {
            ""
        } else {
            ", proxy_buffering off"
        },
        o.rate,
        o.workers
    )
}

/// Medians per target, the ratio, the acceptance line.
pub fn summarise(
    opts: &StreamsOptions,
    trials: Vec<StreamTrial>,
    not_run: BTreeMap<String, String>,
    nginx: Option<String>,
) -> StreamsReport {
    let mut names: Vec<String> = Vec::new();
    for t in &trials {
        if !names.contains(&t.target) {
            names.push(t.target.clone());
        }
    }
    let costs: Vec<TargetCost> = names
        .iter()
        .map(|n| {
            let mine: Vec<&StreamTrial> = trials.iter().filter(|t| &t.target == n).collect();
            let v: Vec<f64> = mine.iter().filter_map(|t| t.cost).collect();
            let n_costs = v.len();
            let stat = crate::report::Stat::of(v);
            TargetCost {
                target: n.clone(),
                median: stat.median,
                min: stat.min,
                max: stat.max,
                n: n_costs,
                failed: mine.iter().map(|t| t.failed).sum(),
                incomplete: mine.iter().filter(|t| !t.complete).count(),
                generator_behind: mine.iter().filter(|t| !t.generator_on_schedule).count(),
            }
        })
        .collect();
    let of = |n: &str| costs.iter().find(|c| c.target == n && c.n > 0);
    let ratio_of_medians = match (of("fanout"), of(NGINX)) {
        (Some(f), Some(g)) if g.median > 0.0 => Some(f.median / g.median),
        _ => None,
    };
    let per_round: Vec<f64> = (0..opts.rounds)
        .filter_map(|round| {
            let c = |n: &str| {
                trials
                    .iter()
                    .find(|t| t.round == round && t.target == n)
                    .and_then(|t| t.cost)
            };
            match (c("fanout"), c(NGINX)) {
                (Some(f), Some(g)) if g > 0.0 => Some(f / g),
                _ => None,
            }
        })
        .collect();
    let ratio_per_round = (!per_round.is_empty()).then(|| median(per_round));
    let unit = opts.kind.unit();
    let acceptance = match (of("fanout"), of(NGINX), ratio_of_medians) {
        (Some(f), Some(g), Some(r)) => vec![(
            format!(
                "fanout ≤ nginx in {unit}: {:.3} vs {:.3} (×{r:.2}, median of {} rounds)",
                f.median, g.median, f.n
            ),
            f.median <= g.median,
        )],
        _ => vec![],
    };
    StreamsReport {
        scenario: opts.kind.name().to_string(),
        about: about(opts),
        command: opts.command.clone(),
        quick: opts.quick,
        unit: unit.to_string(),
        rate: opts.rate,
        trial_s: opts.trial.as_secs_f64(),
        connections: opts.connections,
        workers: opts.workers,
        answer_bytes: opts.kind.answer_bytes(),
        events_per_stream: (opts.kind == Kind::Sse).then_some(EVENTS_PER_STREAM),
        nginx,
        not_run,
        trials,
        costs,
        ratio_of_medians,
        ratio_per_round,
        acceptance,
    }
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_string(), |c| format!("{c:.3}"))
}

/// The text printed at the end of a run.
pub fn text_summary(rep: &StreamsReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}: {}", rep.scenario, rep.about);
    let _ = writeln!(
        s,
        "{:>5} {:>8} {:>8} {:>6} {:>6} {:>14} {:>10} {:>9} {:>9} {:>12}",
        "round", "target", "offered", "ok", "failed", "bytes", "events", "p50 ms", "p99 ms", "cost"
    );
    for t in &rep.trials {
        let _ = writeln!(
            s,
            "{:>5} {:>8} {:>8} {:>6} {:>6} {:>14} {:>10} {:>9.2} {:>9.2} {:>12}{}{}",
            t.round,
            t.target,
            t.offered,
            t.ok,
            t.failed,
            t.bytes,
            t.events.map_or_else(|| "—".to_string(), |e| e.to_string()),
            t.p50_ms,
            t.p99_ms,
            fmt_opt(t.cost),
            if t.complete { "" } else { "  (incomplete)" },
            if t.generator_on_schedule {
                ""
            } else {
                "  (generator behind schedule)"
            }
        );
    }
    for c in &rep.costs {
        let _ = writeln!(
            s,
            "{}: {:.3} {} (median of {}; {:.3}–{:.3}), failed {}, incomplete trials {}",
            c.target, c.median, rep.unit, c.n, c.min, c.max, c.failed, c.incomplete
        );
    }
    if let (Some(m), Some(r)) = (rep.ratio_of_medians, rep.ratio_per_round) {
        let _ = writeln!(
            s,
            "fanout ÷ nginx: {m:.2} (ratio of medians), {r:.2} (median of per-round ratios)"
        );
    }
    for (t, why) in &rep.not_run {
        let _ = writeln!(s, "WARNING: {t}: not run — {why}");
    }
    for (line, ok) in &rep.acceptance {
        let _ = writeln!(s, "{} {line}", if *ok { "PASS" } else { "FAIL" });
    }
    s
}

pub(crate) fn html(rep: &StreamsReport, json: &str) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>fanout lab: {name}</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#111;max-width:1100px}}table{{border-collapse:collapse;margin:12px 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f0f0f0}}.warn{{background:#fff3cd;border:1px solid #e0c060;padding:8px;margin:8px 0}}code{{background:#f4f4f4;padding:1px 4px}}</style></head><body>
<h1>fanout lab — {name}</h1><p>{about}.</p><p>Command: <code>{cmd}</code></p>"#,
        name = esc(&rep.scenario),
        about = esc(&rep.about),
        cmd = esc(&rep.command),
    );
    for (t, why) in &rep.not_run {
        let _ = write!(
            h,
            r#"<div class="warn">{}: not run — {}</div>"#,
            esc(t),
            esc(why)
        );
    }
    h.push_str("<h2>Acceptance</h2><ul>");
    for (line, ok) in &rep.acceptance {
        let _ = write!(
            h,
            "<li>{} {}</li>",
            if *ok { "PASS" } else { "FAIL" },
            esc(line)
        );
    }
    let _ = write!(
        h,
        "</ul><h2>Cost ({})</h2><table><tr><th>target</th><th>median</th><th>min</th><th>max</th><th>trials</th><th>failed</th><th>incomplete trials</th></tr>",
        esc(&rep.unit)
    );
    for c in &rep.costs {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.target),
            c.median,
            c.min,
            c.max,
            c.n,
            c.failed,
            c.incomplete
        );
    }
    h.push_str("</table><h2>Trials</h2><table><tr><th>round</th><th>target</th><th>offered</th><th>ok</th><th>failed</th><th>bytes</th><th>events</th><th>CPU ms</th><th>cost</th><th>p50 ms</th><th>p99 ms</th><th>complete</th></tr>");
    for t in &rep.trials {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{}</td></tr>",
            t.round,
            esc(&t.target),
            t.offered,
            t.ok,
            t.failed,
            t.bytes,
            t.events.map_or_else(|| "—".to_string(), |e| e.to_string()),
            t.cpu_us as f64 / 1e3,
            fmt_opt(t.cost),
            t.p50_ms,
            t.p99_ms,
            t.complete
        );
    }
    let _ = write!(
        h,
        "</table><details><summary>report.json</summary><pre>{}</pre></details></body></html>",
        esc(json)
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(round: usize, target: &str, cost: f64) -> StreamTrial {
        StreamTrial {
            round,
            target: target.into(),
            offered: 10,
            ok: 10,
            failed: 0,
            bytes: 10 * SMALL_BYTES,
            events: None,
            complete: true,
            cpu_us: 100,
            cost: Some(cost),
            p50_ms: 1.0,
            p99_ms: 2.0,
            generator_on_schedule: true,
            elapsed_s: 1.0,
        }
    }

    fn opts(kind: Kind) -> StreamsOptions {
        StreamsOptions::new(kind, true, "x".into(), "f".into(), "c".into())
    }

    #[test]
    fn the_stub_config_loads_and_its_answers_have_the_sizes_counted() {
        let yaml = stubs_yaml();
        fanout_stub::load_in("stubs.yaml", &yaml, &|_| None, None).expect("stubs");
        assert_eq!(event_block_len(), 108);
        assert_eq!(Kind::Bulk.answer_bytes(), 64 << 20);
        assert_eq!(Kind::Sse.answer_bytes(), 108_000);
        for k in NAMES {
            let k = Kind::of(k).unwrap();
            assert_eq!(Kind::of(k.name()), Some(k));
            assert!(GATEWAY.contains(&format!("path: {}", k.path())));
        }
    }

    #[test]
    fn nginx_proxies_to_a_keep_alive_upstream_without_buffering_streams() {
        let c = nginx_conf(Path::new("/tmp/x"), 2, "127.0.0.1:1", "127.0.0.1:2");
        for line in [
            "worker_processes 2;",
            "keepalive 256;",
            "proxy_http_version 1.1;",
            "proxy_set_header Connection \"\";",
            "access_log off;",
            "listen 127.0.0.1:1;",
            "server 127.0.0.1:2;",
        ] {
            assert!(c.contains(line), "{line}: {c}");
        }
        assert_eq!(c.matches("proxy_buffering off;").count(), 2);
    }

    #[test]
    fn costs_are_per_what_was_delivered_and_compared_per_round() {
        let r = |ok: u64, bytes: u64, events: Option<u64>| {
            let mut r = LoadReport {
                target: "http://127.0.0.1:9".into(),
                protocol: fanout_load::Protocol::Http1,
                schedule: "const(4,1000ms)".into(),
                duration_s: 1.0,
                elapsed_s: 1.0,
                offered: 4,
                sent: 4,
                completed: 4,
                ok: 4,
                rejected: 0,
                partial: 0,
                offered_rps: 4.0,
                achieved_rps: 4.0,
                status_classes: Default::default(),
                errors: Default::default(),
                grpc_status: None,
                grpc_missing_status: None,
                error_rate: 0.0,
                latency_ms: Default::default(),
                ok_latency_ms: Default::default(),
                rejected_latency_ms: Default::default(),
                service_ms: Default::default(),
                lag_ms: Default::default(),
                late_fraction: 0.0,
                valid: true,
                invalid_reason: None,
                connections_opened: 1,
                max_connections_used: 1,
                bytes_received: 0,
                events: None,
                seconds: vec![],
                by_send_second: vec![],
                second_histograms: vec![],
                latency_hist: fanout_load::empty_histogram(),
                service_hist: fanout_load::empty_histogram(),
                lag_hist: fanout_load::empty_histogram(),
            };
            r.ok = ok;
            r.bytes_received = bytes;
            r.events = events;
            r
        };
        // 4 streams of 1 000 events for 2 s of CPU: 500 ms per 1 000 events.
        let sse = trial(
            Kind::Sse,
            0,
            "fanout",
            &r(4, 4 * 108_000, Some(4000)),
            2_000_000,
        );
        assert!((sse.cost.unwrap() - 500.0).abs() < 1e-9);
        assert!(sse.complete);
        // An event missing: incomplete.
        let short = trial(Kind::Sse, 0, "fanout", &r(4, 4 * 108_000, Some(3999)), 1);
        assert!(!short.complete);
        // 2 downloads of 64 MiB for 0.5 s of CPU.
        let bulk = trial(Kind::Bulk, 0, NGINX, &r(4, 4 << 26, None), 500_000);
        assert!((bulk.cost.unwrap() - 0.5 / (f64::from(1u32 << 28) / 1e9)).abs() < 1e-9);
        assert!(bulk.complete);
        let small = trial(Kind::Small, 0, "fanout", &r(4, 4096, None), 100);
        assert_eq!(small.cost, Some(25.0));

        let rep = summarise(
            &opts(Kind::Small),
            vec![
                t(0, "fanout", 30.0),
                t(0, NGINX, 40.0),
                t(1, NGINX, 50.0),
                t(1, "fanout", 20.0),
            ],
            BTreeMap::new(),
            None,
        );
        assert_eq!(rep.costs.len(), 2);
        assert!((rep.costs[0].median - 25.0).abs() < 1e-9);
        assert!((rep.ratio_of_medians.unwrap() - 25.0 / 45.0).abs() < 1e-9);
        assert!((rep.ratio_per_round.unwrap() - (0.75 + 0.4) / 2.0).abs() < 1e-9);
        assert!(rep.acceptance[0].1, "{:?}", rep.acceptance);
        assert!(text_summary(&rep).contains("PASS fanout ≤ nginx"));
        assert!(html(&rep, "{}").contains("<h2>Trials</h2>"));
    }

    #[test]
    fn without_nginx_fanout_runs_alone_and_the_report_says_why() {
        let mut not_run = BTreeMap::new();
        not_run.insert(NGINX.to_string(), "no nginx".to_string());
        let rep = summarise(&opts(Kind::Bulk), vec![t(0, "fanout", 1.0)], not_run, None);
        assert!(rep.acceptance.is_empty());
        assert_eq!(rep.ratio_of_medians, None);
        assert!(text_summary(&rep).contains("WARNING: nginx: not run — no nginx"));
    }
}
