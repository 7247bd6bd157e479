//! The closed-loop mode (`parallel-calls`): C clients, each on its own keep-alive HTTP/1.1
//! connection, each sending its next request as soon as the previous answer arrived — the model
//! of the Kotlin article's JMH threads. A cell is one route × client count × target: a warm-up,
//! then a measured window of fixed length; the clients finish the operation they are in when the
//! window ends, so every measured operation is whole and the stub's counters (reset between the
//! two) divide exactly into calls per operation.
//!
//! This is not the open model of the other scenarios: a closed loop slows down with the server
//! (coordinated omission by design). That is what the article measured — time per operation at a
//! given concurrency — and the figures are reported as such, never as a capacity.

use crate::model::{ARTICLE, ClosedLoop, LabError};
use crate::procstat::{self, ProcSample};
use crate::report::{self, ClosedRun, Floor, LabReport};
use crate::runner::{Caps, Fut, Lab, Measure, order};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// Length of one iteration, the unit of the error estimate: a measured window of 10 s gives 10
/// iterations per round (JMH's iterations are its measurement windows too).
pub const ITERATION_S: f64 = 1.0;

/// A client gives up on an operation after this long (the routes' deadline is 10 s).
const OP_TIMEOUT: Duration = Duration::from_secs(15);

/// One client's keep-alive HTTP/1.1 connection; reopened after a failure.
pub struct Conn {
    addr: SocketAddr,
    sender: Option<SendRequest<Empty<Bytes>>>,
}

impl Conn {
    /// A connection to `addr`, opened on first use.
    pub fn new(addr: SocketAddr) -> Conn {
        Conn { addr, sender: None }
    }

    async fn connect(&mut self) -> Result<&mut SendRequest<Empty<Bytes>>, String> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = tokio::net::TcpStream::connect(self.addr)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            stream
                .set_nodelay(true)
                .map_err(|e| format!("nodelay: {e}"))?;
            let (sender, conn) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(conn);
            self.sender = Some(sender);
        }
        self.sender
            .as_mut()
            .ok_or_else(|| "no connection".to_string())
    }

    /// `GET path`: (status, body). A failure closes the connection.
    pub async fn get(&mut self, path: &str) -> Result<(u16, Bytes), String> {
        let host = self.addr.to_string();
        let r = async {
            let s = self.connect().await?;
            s.ready().await.map_err(|e| format!("connection: {e}"))?;
            let req = Request::get(path)
                .header(http::header::HOST, host)
                .body(Empty::new())
                .map_err(|e| format!("request: {e}"))?;
            let resp = s
                .send_request(req)
                .await
                .map_err(|e| format!("request: {e}"))?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?
                .to_bytes();
            Ok((status, body))
        }
        .await;
        if r.is_err() {
            self.sender = None;
        }
        r
    }
}

/// One operation of a measured window.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    /// When it ended, seconds after the window began.
    pub end_s: f64,
    /// How long it took, µs.
    pub latency_us: u64,
    /// A 200 answer with the expected `count`.
    pub ok: bool,
}

/// What the clients of one window did.
#[derive(Debug, Default)]
pub struct Window {
    /// Every operation started in the window (all ended: the clients finish theirs).
    pub ops: Vec<Op>,
    /// Failures by kind (`status 503`, `timeout`, `connection`, `wrong answer`).
    pub error_kinds: BTreeMap<String, u64>,
    /// The first failure, as text.
    pub first_error: Option<String>,
    /// From the start to the last operation's end, s.
    pub elapsed_s: f64,
}

/// What an answer must be: a 200 whose JSON `count` is `calls`.
fn check(status: u16, body: &[u8], calls: u64) -> Result<(), (String, String)> {
    if status != 200 {
        let snippet = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err((format!("status {status}"), format!("{status}: {snippet}")));
    }
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    if v["count"].as_u64() != Some(calls) {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err((
            "wrong answer".into(),
            format!("expected count {calls}: {text}"),
        ));
    }
    Ok(())
}

/// Drive `conns.len()` clients, one per connection, on `path` for `secs`: each sends its next
/// `GET` when the previous answer arrived; none starts after the window. Returns the
/// connections (to be reused) and what happened.
pub async fn drive(conns: Vec<Conn>, path: &str, secs: f64, calls: u64) -> (Vec<Conn>, Window) {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in conns {
        let path = path.to_string();
        tasks.spawn(async move {
            let mut ops = Vec::new();
            let mut errors: Vec<(String, String)> = Vec::new();
            while Instant::now() < end {
                let t = Instant::now();
                let outcome = match tokio::time::timeout(OP_TIMEOUT, conn.get(&path)).await {
                    Ok(Ok((status, body))) => check(status, &body, calls),
                    Ok(Err(e)) => Err(("connection".into(), e)),
                    Err(_) => {
                        conn.sender = None;
                        Err(("timeout".into(), format!("no answer within {OP_TIMEOUT:?}")))
                    }
                };
                let now = Instant::now();
                ops.push(Op {
                    end_s: now.duration_since(start).as_secs_f64(),
                    latency_us: now.duration_since(t).as_micros() as u64,
                    ok: outcome.is_ok(),
                });
                if let Err(e) = outcome {
                    errors.push(e);
                    // Not a busy loop against a dead target.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            (conn, ops, errors)
        });
    }
    let mut w = Window::default();
    let mut conns = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let Ok((conn, ops, errors)) = r else { continue };
        conns.push(conn);
        w.ops.extend(ops);
        for (kind, text) in errors {
            *w.error_kinds.entry(kind).or_insert(0) += 1;
            w.first_error.get_or_insert(text);
        }
    }
    w.elapsed_s = start.elapsed().as_secs_f64();
    (conns, w)
}

/// Mean latency (ms) of the operations that ended in each [`ITERATION_S`] window; the
/// operations that ended after the last whole window (the clients finishing theirs) count in the
/// last one. Windows without an operation are left out.
pub fn iteration_means(ops: &[Op], secs: f64) -> Vec<f64> {
    let n = ((secs / ITERATION_S).floor() as usize).max(1);
    let mut sum = vec![0.0f64; n];
    let mut count = vec![0u64; n];
    for op in ops {
        let i = ((op.end_s / ITERATION_S).floor() as usize).min(n - 1);
        sum[i] += op.latency_us as f64 / 1000.0;
        count[i] += 1;
    }
    sum.iter()
        .zip(&count)
        .filter(|(_, c)| **c > 0)
        .map(|(s, c)| s / *c as f64)
        .collect()
}

/// Busy and total jiffies of the whole machine (`/proc/stat`, first line).
fn machine_jiffies() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    // idle + iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// [`crate::model::Mode::ClosedLoop`].
pub(crate) struct ClosedLoopRun(pub(crate) ClosedLoop);

impl Measure for ClosedLoopRun {
    /// A closed-loop scenario warms up and measures in its own way: no capacity search.
    fn open_model(&self) -> bool {
        false
    }

    fn measure<'a>(&'a self, lab: &'a mut Lab, _caps: &'a Caps) -> Fut<'a, Result<(), LabError>> {
        Box::pin(closed_loop(lab, &self.0))
    }

    fn targets_stopped<'a>(&'a self, lab: &'a mut Lab) -> Fut<'a, ()> {
        Box::pin(async move {
            lab.floor = closed_floor(lab, &self.0).await;
        })
    }

    fn report(&self, lab: &mut Lab, rep: &mut LabReport) {
        let (warmup_s, measure_s) = lab.plan.closed;
        report::attach_closed_loop(
            rep,
            report::ClosedLoopReport {
                warmup_s,
                measure_s,
                iteration_s: ITERATION_S,
                rounds: closed_rounds(lab),
                calls_per_op: self.0.calls_per_op,
                error_method: report::CLOSED_ERROR_METHOD.to_string(),
                floor: lab.floor.take(),
                jvm: std::mem::take(&mut lab.jvm),
                not_run: std::mem::take(&mut lab.not_run),
                article: ARTICLE.to_vec(),
                runs: std::mem::take(&mut lab.closed_runs),
            },
        );
    }
}

/// Every cell of every round, then nothing else: no capacity search, no open-model load.
async fn closed_loop(lab: &mut Lab, cl: &ClosedLoop) -> Result<(), LabError> {
    // The JVM's JIT compiles the hot paths during the first thousands of requests: the Java
    // targets get the lab's JVM warm-up (as java-threads does), split over the routes at the
    // highest client count; the others a short one.
    let most = cl.clients.iter().copied().max().unwrap_or(1);
    for ti in 0..lab.targets.len() {
        let secs = if lab.targets[ti].name.starts_with("java-") {
            lab.plan.jvm_warmup_s
        } else {
            1.0
        };
        for (_, path) in cl.routes {
            let conns = (0..most).map(|_| Conn::new(lab.targets[ti].addr)).collect();
            let per_route = secs / cl.routes.len().max(1) as f64;
            drive(conns, path, per_route, cl.calls_per_op).await;
        }
    }
    let rounds = closed_rounds(lab);
    let cells: Vec<(&str, &str, usize)> = cl
        .routes
        .iter()
        .flat_map(|(name, path)| cl.clients.iter().map(move |c| (*name, *path, *c)))
        .collect();
    for round in 0..rounds {
        for (ci, (route, path, clients)) in cells.iter().enumerate() {
            // A B, B A, … within each cell; the next cell and the next round start the other
            // way round.
            for ti in order(lab.targets.len(), round + ci) {
                closed_cell(lab, ti, round, route, path, *clients, cl.calls_per_op).await?;
            }
        }
    }
    Ok(())
}

/// Rounds of a closed-loop run: `--trials`, else 1 (quick) or 3.
fn closed_rounds(lab: &Lab) -> usize {
    lab.opts
        .trials
        .unwrap_or(if lab.opts.quick { 1 } else { 3 })
        .max(1)
}

/// One cell: warm-up, then the measured window (stub counters reset, `/proc` read before and
/// after, the target sampled every 100 ms for threads and RSS).
async fn closed_cell(
    lab: &mut Lab,
    ti: usize,
    round: usize,
    route: &str,
    path: &str,
    clients: usize,
    calls: u64,
) -> Result<(), LabError> {
    let (warmup_s, measure_s) = lab.plan.closed;
    let addr = lab.targets[ti].addr;
    let pid = lab.targets[ti].proc.pid().unwrap_or(0);
    let stub_pid = lab.stubs.proc.as_ref().and_then(|p| p.pid());
    let conns: Vec<Conn> = (0..clients).map(|_| Conn::new(addr)).collect();
    let (conns, _) = drive(conns, path, warmup_s, calls).await;
    lab.stubs.reset().await?;
    let t_start = lab.t0.elapsed().as_secs_f64();
    let me = std::process::id();
    let cpu = |pid: u32| procstat::cpu_total_us(pid).unwrap_or(0);
    let (target0, stub0, lab0) = (cpu(pid), stub_pid.map(cpu), cpu(me));
    let ctx0 = procstat::sample(pid).unwrap_or_default().ctx_switches;
    let machine0 = machine_jiffies();
    let sampler = procstat::Sampler::start(pid, Duration::from_millis(100));
    let (_, w) = drive(conns, path, measure_s, calls).await;
    let samples: Vec<ProcSample> = sampler.finish();
    let after = procstat::sample(pid).unwrap_or_default();
    let (target1, stub1, lab1) = (cpu(pid), stub_pid.map(cpu), cpu(me));
    let machine1 = machine_jiffies();
    let (stub_calls, _) = lab.stubs.totals().await?;
    let ops = w.ops.len() as u64;
    // The machine's busy share, and the part of it that was neither the target, the stub nor
    // the clients (another tenant, the idle targets): (busy %, others %).
    let ours_us = target1.saturating_sub(target0)
        + stub0.zip(stub1).map_or(0, |(a, b)| b.saturating_sub(a))
        + lab1.saturating_sub(lab0);
    let busy = machine0.zip(machine1).and_then(|((b0, t0), (b1, t1))| {
        let total = t1.checked_sub(t0).filter(|t| *t > 0)? as f64;
        let busy = b1.saturating_sub(b0) as f64;
        let ours = ours_us as f64 * procstat::clock_ticks() as f64 / 1e6;
        Some((
            busy * 100.0 / total,
            ((busy - ours) * 100.0 / total).max(0.0),
        ))
    });
    let per_op = |d: u64| d as f64 / 1000.0 / ops.max(1) as f64;
    let mut lat: Vec<u64> = w.ops.iter().map(|o| o.latency_us).collect();
    lat.sort_unstable();
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0.0, |v| *v as f64 / 1000.0)
    };
    let errors = w.ops.iter().filter(|o| !o.ok).count() as u64;
    let run = ClosedRun {
        target: lab.targets[ti].name.clone(),
        route: route.to_string(),
        clients,
        round,
        t_start,
        measure_s,
        elapsed_s: w.elapsed_s,
        ops,
        errors,
        error_kinds: w.error_kinds,
        first_error: w.first_error,
        ops_per_s: ops as f64 / w.elapsed_s.max(1e-9),
        mean_ms: if lat.is_empty() {
            0.0
        } else {
            lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1000.0
        },
        p50_ms: pick(0.5),
        p99_ms: pick(0.99),
        max_ms: pick(1.0),
        iterations_ms: iteration_means(&w.ops, measure_s),
        cpu_ms_per_op: per_op(target1.saturating_sub(target0)),
        stub_calls,
        stub_calls_per_op: stub_calls as f64 / ops.max(1) as f64,
        stub_cpu_ms_per_op: stub0.zip(stub1).map(|(a, b)| per_op(b.saturating_sub(a))),
        lab_cpu_ms_per_op: per_op(lab1.saturating_sub(lab0)),
        machine_busy_pct: busy.map(|(busy, _)| busy),
        others_busy_pct: busy.map(|(_, others)| others),
        ctx_switches_per_op: after.ctx_switches.saturating_sub(ctx0) as f64 / ops.max(1) as f64,
        threads_max: samples
            .iter()
            .map(|s| s.threads)
            .chain([after.threads])
            .max()
            .unwrap_or(0),
        rss_max_mb: samples
            .iter()
            .map(|s| s.rss_bytes)
            .chain([after.rss_bytes])
            .max()
            .unwrap_or(0) as f64
            / 1e6,
        latencies_us: lat,
    };
    tracing::info!(target = %run.target, route, clients, round, ops = run.ops, mean_ms = run.mean_ms, errors = run.errors, cpu_ms_per_op = run.cpu_ms_per_op, "closed-loop cell");
    lab.closed_runs.push(run);
    Ok(())
}

/// The floor: one stub call made by the lab itself, closed loop on one keep-alive connection
/// (after a warm-up). Sequential: `calls` × its mean; parallel: one call. `None` when a call
/// fails or the service is unknown.
async fn closed_floor(lab: &Lab, cl: &ClosedLoop) -> Option<Floor> {
    let addr = lab
        .stubs
        .services
        .iter()
        .find(|(s, _)| s == cl.service)
        .map(|(_, a)| *a)?;
    let mut conn = Conn::new(addr);
    let secs = if lab.opts.quick { 1.0 } else { 5.0 };
    let mut lat = Vec::new();
    let warm_until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < warm_until {
        conn.get(cl.call_path).await.ok()?;
    }
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        let t = Instant::now();
        let (status, _) = conn.get(cl.call_path).await.ok()?;
        if status != 200 {
            return None;
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    let mean = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Some(Floor {
        path: format!("{} {}", cl.service, cl.call_path),
        calls: lat.len() as u64,
        one_call_mean_ms: mean,
        one_call_p50_ms: pick(0.5),
        one_call_p99_ms: pick(0.99),
        sequential_ms: mean * cl.calls_per_op as f64,
        parallel_ms: mean,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(end_s: f64, ms: u64) -> Op {
        Op {
            end_s,
            latency_us: ms * 1000,
            ok: true,
        }
    }

    #[test]
    fn iterations_are_whole_seconds_and_the_tail_counts_in_the_last() {
        let ops = [
            op(0.2, 10),
            op(0.9, 20),
            op(1.5, 30),
            op(2.99, 40),
            op(3.2, 60),
        ];
        // Window 3 s: [0,1) [1,2) [2,3+): the op ending at 3.2 s (a client finishing) is in the last.
        assert_eq!(iteration_means(&ops, 3.0), vec![15.0, 30.0, 50.0]);
        // An empty window is left out.
        assert_eq!(
            iteration_means(&[op(0.5, 10), op(2.5, 30)], 3.0),
            vec![10.0, 30.0]
        );
        // A window shorter than an iteration is one iteration.
        assert_eq!(
            iteration_means(&[op(0.5, 10), op(0.7, 20)], 0.5),
            vec![15.0]
        );
    }

    #[test]
    fn an_answer_is_checked_for_status_and_count() {
        assert!(check(200, br#"{"count":100,"sum":4950}"#, 100).is_ok());
        assert_eq!(
            check(200, br#"{"count":99}"#, 100).map_err(|e| e.0),
            Err("wrong answer".to_string())
        );
        assert_eq!(
            check(503, b"busy", 100).map_err(|e| e.0),
            Err("status 503".to_string())
        );
        assert!(check(200, b"not json", 100).is_err());
    }

    #[tokio::test]
    async fn clients_run_closed_loop_on_their_own_connections() {
        // A stub answering after 2 ms: 2 clients for 0.3 s, each on one keep-alive connection.
        let yaml = "services:\n  s:\n    listen: 127.0.0.1:0\n    routes:\n      - path: /op\n        latency: 2ms\n        body: '{count: 3}'\n";
        let none = |_: &str| None;
        let stubs = fanout_stub::load("stubs.yaml", yaml, &none).unwrap_or_else(|e| panic!("{e}"));
        let server = stubs.start().await.unwrap_or_else(|e| panic!("{e}"));
        let addr = server
            .addr("s")
            .unwrap_or_else(|| panic!("the service's address"));
        let conns = vec![Conn::new(addr), Conn::new(addr)];
        let (conns, w) = drive(conns, "/op", 0.3, 3).await;
        assert_eq!(conns.len(), 2);
        assert!(w.ops.len() >= 2, "{w:?}");
        assert!(w.ops.iter().all(|o| o.ok), "{w:?}");
        assert!(w.error_kinds.is_empty());
        let stats = server.stats("s").unwrap_or_else(|| panic!("stats"));
        assert_eq!(stats.connections_total, 2, "one connection per client");
        // A wrong count is an error, counted by kind.
        let (_, w) = drive(conns, "/op", 0.05, 4).await;
        assert!(w.ops.iter().all(|o| !o.ok));
        assert!(w.error_kinds.contains_key("wrong answer"), "{w:?}");
    }
}
