//! The load every mode uses: one trial (one or more generators against one target, with CPU,
//! stub calls and `/proc` figures), the capacity search, the warm-up, and the waits between
//! trials.

use super::{Caps, Lab, Load, LoadOpts};
use crate::model::{LAG_THRESHOLD, LabError, OVERLOAD_SEARCH_LAG_MS, Trial};
use crate::{java, procstat};
use fanout_load::{LoadSpec, Schedule};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

impl Lab {
    /// Measure the run: an open-model mode gets every target warmed up (without recording) and
    /// its capacity searched, then the mode's measured trials; a closed loop measures in its own
    /// way. Returns the capacities found.
    pub(crate) async fn measure(&mut self) -> Result<BTreeMap<String, f64>, LabError> {
        let kind = self.kind.clone();
        if !kind.open_model() {
            let none = Caps {
                by_target: BTreeMap::new(),
                base: 100.0,
            };
            kind.measure(self, &none).await?;
            return Ok(none.by_target);
        }
        self.warm_up().await?;
        let caps = self.capacities(kind.searches_capacity()).await?;
        let min_cap = caps.values().copied().fold(f64::INFINITY, f64::min);
        let caps = Caps {
            base: if min_cap.is_finite() && min_cap > 0.0 {
                min_cap
            } else {
                100.0
            },
            by_target: caps,
        };
        kind.measure(self, &caps).await?;
        Ok(caps.by_target)
    }

    /// Warm up every target (connections, caches) without recording. The JVM gets longer: its
    /// JIT compiles the hot paths during the first thousands of requests, and the compiler
    /// threads would otherwise compete with the first search steps.
    async fn warm_up(&mut self) -> Result<(), LabError> {
        for ti in 0..self.targets.len() {
            let name = &self.targets[ti].name;
            let (rate, secs) = if name == "java-threads" || java::pool_size(name).is_some() {
                (200.0, self.plan.jvm_warmup_s)
            } else {
                (100.0, 1.0)
            };
            // A database-bound scenario serves tens of requests per second: a warm-up above that
            // would leave a backlog behind in a target that queues.
            let rate = if self.scenario.database.is_some() {
                10.0
            } else {
                rate
            };
            self.trial(ti, "warmup", 0, Self::schedule(rate, secs))
                .await?;
        }
        self.trials.retain(|t| t.phase != "warmup");
        self.warmup_end = self.t0.elapsed().as_secs_f64();
        Ok(())
    }

    /// Each target's capacity: searched (`searches`), or given by `--capacity`; none for a
    /// mode that runs at its own rate.
    async fn capacities(&mut self, searches: bool) -> Result<BTreeMap<String, f64>, LabError> {
        let mut caps = BTreeMap::new();
        if let Some(c) = self.opts.capacity.filter(|_| searches) {
            self.warnings.push(format!(
                "capacity given (--capacity {c:.0}): no capacity search; the levels are fractions of {c:.0} req/s for every target"
            ));
            for t in &self.targets {
                caps.insert(t.name.clone(), c);
            }
        } else if searches {
            for ti in 0..self.targets.len() {
                let c = self.capacity(ti).await?;
                caps.insert(self.targets[ti].name.clone(), c);
            }
        }
        Ok(caps)
    }

    pub(crate) fn schedule(rate: f64, secs: f64) -> String {
        format!("const({:.1},{}ms)", rate.max(1.0), (secs * 1000.0) as u64)
    }

    pub(crate) async fn trial(
        &mut self,
        ti: usize,
        phase: &str,
        round: usize,
        schedule: String,
    ) -> Result<Trial, LabError> {
        let load = Load {
            route: None,
            requests: self.scenario.requests.clone(),
            schedule,
        };
        let opts = self.kind.load_opts();
        let mut v = self
            .run_loads(ti, phase, round, None, vec![load], opts)
            .await?;
        v.pop()
            .ok_or_else(|| LabError::Load("internal: a trial produced no result".into()))
    }

    /// Run `loads` against target `ti` at the same time (one generator each) and record one
    /// trial per load. CPU time and stub calls are per request over all loads together.
    pub(crate) async fn run_loads(
        &mut self,
        ti: usize,
        phase: &str,
        round: usize,
        stage: Option<&str>,
        loads: Vec<Load>,
        opts: LoadOpts,
    ) -> Result<Vec<Trial>, LabError> {
        let target = &self.targets[ti];
        self.stubs.reset().await?;
        let pid = target.proc.pid().unwrap_or(0);
        let me = std::process::id();
        let t_start = self.t0.elapsed().as_secs_f64();
        let mut runs = Vec::new();
        let mut meta = Vec::new();
        // With pre-opened connections, CPU counts from the moment they are open (the schedule's
        // start), not from their handshakes.
        let mut started = Vec::new();
        for load in loads {
            let on_start = (opts.open_connections > 0).then(|| {
                let n = std::sync::Arc::new(tokio::sync::Notify::new());
                started.push(n.clone());
                n
            });
            let sched =
                Schedule::parse(&load.schedule).map_err(|e| LabError::Load(e.to_string()))?;
            let spec = LoadSpec {
                target: format!(
                    "{}://{}",
                    if target.tls { "https" } else { "http" },
                    target.addr
                ),
                requests: load.requests,
                schedule: sched,
                protocol: self.scenario.protocol(),
                max_connections: opts.max_connections,
                open_connections: opts.open_connections,
                on_start,
                timeout: opts.timeout,
                lag_threshold: LAG_THRESHOLD,
                drain: opts.drain,
                // The lab's self-signed certificate ([`crate::certs`]).
                tls: fanout_load::TlsOptions {
                    insecure: target.tls,
                    ..fanout_load::TlsOptions::default()
                },
                count_events: false,
            };
            meta.push((load.route, load.schedule));
            runs.push(tokio::spawn(
                async move { fanout_load::run(&spec, None).await },
            ));
        }
        for n in &started {
            // (A run that failed to start never notifies: its error comes from its task below.)
            let _ = tokio::time::timeout(Duration::from_secs(30), n.notified()).await;
        }
        let before = procstat::sample(pid).unwrap_or_default();
        let gen_before = procstat::sample(me).unwrap_or_default();
        let sampler = opts.sample.then(|| {
            if self.kind.light_sampling() {
                procstat::Sampler::start_light(pid, Duration::from_millis(100))
            } else {
                procstat::Sampler::start(pid, Duration::from_millis(100))
            }
        });
        let mut reports = Vec::new();
        for r in runs {
            let rep = r
                .await
                .map_err(|e| LabError::Load(format!("generator task: {e}")))?
                .map_err(|e| LabError::Load(e.to_string()))?;
            reports.push(rep);
        }
        let samples = sampler.map(procstat::Sampler::finish).unwrap_or_default();
        let t_end = self.t0.elapsed().as_secs_f64();
        let after = procstat::sample(pid).unwrap_or_default();
        let gen_after = procstat::sample(me).unwrap_or_default();
        let (backend_total, overshoot) = self.stubs.totals().await?;
        let completed_all = reports.iter().map(|r| r.completed).sum::<u64>().max(1) as f64;
        let cpu = after.cpu_us.saturating_sub(before.cpu_us) as f64 / completed_all;
        let gen_cpu = gen_after.cpu_us.saturating_sub(gen_before.cpu_us) as f64 / completed_all;
        let ctx = after.ctx_switches.saturating_sub(before.ctx_switches) as f64 / completed_all;
        let mut out = Vec::new();
        for ((route, schedule), rep) in meta.into_iter().zip(reports) {
            let dur = rep.duration_s.max(1e-9);
            let offered_rate = rep.offered as f64 / dur;
            let achieved_rate = rep.ok as f64 / dur;
            let p99 = rep.latency_ms.p99;
            let passed_slo = rep.valid
                && rep.error_rate <= 0.01
                && p99 <= self.scenario.slo_p99_ms
                && achieved_rate >= 0.95 * offered_rate;
            let t = Trial {
                target: target.name.clone(),
                phase: phase.into(),
                round,
                t_start,
                t_end,
                schedule,
                offered_rate,
                achieved_rate,
                p50_ms: rep.latency_ms.p50,
                p99_ms: p99,
                error_rate: rep.error_rate,
                cpu_us_per_request: cpu,
                generator_cpu_us_per_request: gen_cpu,
                backend_calls_per_request: backend_total as f64 / completed_all,
                ctx_switches_per_request: ctx,
                stub_overshoot_p99_us: overshoot,
                threads: after.threads,
                rss_mb: after.rss_bytes as f64 / 1e6,
                valid: rep.valid,
                invalid_reason: rep.invalid_reason.clone(),
                passed_slo,
                lag_p99_ms: rep.lag_ms.p99,
                route,
                stage: stage.map(str::to_string),
                phase_bounds: Vec::new(),
                samples: samples.clone(),
                load: rep,
            };
            tracing::info!(target = %t.target, phase, stage, rate = t.offered_rate, p99 = t.p99_ms, cpu_us = t.cpu_us_per_request, valid = t.valid, "trial");
            out.push(t);
        }
        self.trials.extend(out.iter().cloned());
        Ok(out)
    }

    /// Step up (doubling) then bisect to the highest rate meeting the SLO.
    /// One step of the capacity search: the trial and whether it passed. A step that missed the
    /// SLO only because the generator fell behind (the target met latency, errors and rate) is
    /// repeated once: on a shared machine that is usually a moment of contention.
    ///
    /// The overload and models scenarios accept a step whose generator lagged up to
    /// [`OVERLOAD_SEARCH_LAG_MS`] if the target met the SLO: latency counts from the intended
    /// send time, so the lag is charged to the target, never in its favour — and a capacity
    /// understated by the generator would make "3×" no overload at all.
    pub(crate) async fn search_step(
        &mut self,
        ti: usize,
        rate: f64,
    ) -> Result<(Trial, bool), LabError> {
        self.search_step_of(ti, rate, self.plan.step_s).await
    }

    /// [`Self::search_step`] lasting `secs`.
    pub(crate) async fn search_step_of(
        &mut self,
        ti: usize,
        rate: f64,
        secs: f64,
    ) -> Result<(Trial, bool), LabError> {
        let mut t = self
            .trial(ti, "search", 0, Self::schedule(rate, secs))
            .await?;
        let slo = self.scenario.slo_p99_ms;
        let target_ok = |t: &Trial| {
            t.error_rate <= 0.01 && t.p99_ms <= slo && t.achieved_rate >= 0.95 * t.offered_rate
        };
        // Overload and models scenarios put a heavy generator (1 000 gRPC connections for the
        // models) on the machine with the target: its lag is the machine's, not the target's.
        let lag_tolerated = self.kind.lag_tolerated();
        let tolerable = |t: &Trial| lag_tolerated && t.lag_p99_ms <= OVERLOAD_SEARCH_LAG_MS;
        if !t.passed_slo && !t.valid && target_ok(&t) && !tolerable(&t) {
            t = self
                .trial(ti, "search", 0, Self::schedule(rate, secs))
                .await?;
        }
        let tolerated = !t.passed_slo && target_ok(&t) && tolerable(&t);
        if tolerated {
            let note = format!(
                "{}: capacity search steps were accepted with generator lag up to {OVERLOAD_SEARCH_LAG_MS} ms (lag p99 {:.1} ms at {rate:.0} req/s; the lag counts in the latency)",
                t.target, t.lag_p99_ms
            );
            if !self
                .warnings
                .iter()
                .any(|w| w.starts_with(&format!("{}: capacity search steps", t.target)))
            {
                self.warnings.push(note);
            }
        }
        let passed = t.passed_slo || tolerated;
        if !passed && self.kind.sustained_capacity() {
            self.wait_idle(ti, Duration::from_secs(30)).await;
        }
        Ok((t, passed))
    }

    pub(crate) async fn capacity(&mut self, ti: usize) -> Result<f64, LabError> {
        let (mut pass, mut fail) = (0.0f64, None::<f64>);
        let mut rate = 250.0;
        for _ in 0..8 {
            let (t, passed) = self.search_step(ti, rate).await?;
            if passed {
                pass = rate;
                rate *= 2.0;
            } else {
                if !t.valid {
                    self.warnings.push(format!(
                        "{}: the generator could not keep {rate:.0} req/s ({}); capacity is a lower bound",
                        t.target,
                        t.invalid_reason.clone().unwrap_or_default()
                    ));
                }
                fail = Some(rate);
                break;
            }
        }
        // A capacity below the first step: halve until a step passes (database-bound scenarios
        // serve tens of requests per second, not hundreds).
        if pass == 0.0 {
            let mut lo = fail.unwrap_or(rate);
            for _ in 0..6 {
                lo /= 2.0;
                let (_, passed) = self.search_step(ti, lo).await?;
                if passed {
                    pass = lo;
                    break;
                }
                fail = Some(lo);
            }
        }
        if let Some(mut hi) = fail {
            for _ in 0..self.plan.bisect {
                let mid = (pass + hi) / 2.0;
                let (_, passed) = self.search_step(ti, mid).await?;
                if passed {
                    pass = mid;
                } else {
                    hi = mid;
                }
            }
        }
        // Models: the highest rate the machine *sustains* — the rate found must pass once more,
        // for as long as a measured trial lasts (one short step passing at the edge is luck on a
        // shared machine), else 10 % lower.
        if self.kind.sustained_capacity() && pass > 0.0 {
            let mut confirmed = false;
            for _ in 0..4 {
                let (_, passed) = self.search_step_of(ti, pass, self.plan.trial_s).await?;
                if passed {
                    confirmed = true;
                    break;
                }
                pass *= 0.9;
            }
            if !confirmed {
                let name = self.targets[ti].name.clone();
                self.warnings.push(format!(
                    "{name}: no capacity-search rate passed twice; {pass:.0} req/s is not confirmed"
                ));
            }
        }
        Ok(pass)
    }

    /// Wait (up to `within`) until target `ti` used less than 5 % of a core over 250 ms.
    pub(crate) async fn wait_idle(&self, ti: usize, within: Duration) {
        let pid = self.targets[ti].proc.pid().unwrap_or(0);
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let a = procstat::sample(pid).map_or(0, |s| s.cpu_us);
            tokio::time::sleep(Duration::from_millis(250)).await;
            let b = procstat::sample(pid).map_or(0, |s| s.cpu_us);
            if b.saturating_sub(a) < 12_500 {
                return;
            }
        }
    }
}
