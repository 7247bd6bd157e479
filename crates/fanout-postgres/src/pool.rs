//! A database's connection pool: fair waiting bounded by `max_waiters` and the call's time,
//! connections made and reconnected with backoff, statements checked, and a connection in use
//! (`InUse`) whose call ran out of time cancelled at the server and kept until known idle.

use super::*;

/// A database's connection pool.
pub struct Pool {
    pub(super) name: Arc<str>,
    /// `host:port` of the server (for spans; never the URL, which may hold a password).
    pub(super) address: String,
    pub(super) pg: tokio_postgres::Config,
    pub(super) connector: Connector,
    pub(super) cfg: PostgresConfig,
    pub(super) connect_timeout: Duration,
    pub(super) max_response_bytes: usize,
    pub(super) slots: Arc<Semaphore>,
    pub(super) waiting: AtomicUsize,
    pub(super) open: AtomicUsize,
    /// Connections being opened by a core that had none idle of its own ([`Pool::pick`]):
    /// with `open`, never more than `max_size`.
    pub(super) growing: AtomicUsize,
    pub(super) idle: Mutex<Vec<PooledConn>>,
    pub(super) health: Mutex<Health>,
    pub(super) wake: Notify,
    pub(super) reconnecting: std::sync::atomic::AtomicBool,
    /// The statements of the current config, checked when a connection is first made after the
    /// database was unreachable (`None` once checked).
    pub(super) unchecked: Mutex<Option<(Arc<fanout_config::Config>, Vec<StatementCheck>)>>,
    /// Why statements were refused when they were checked late (readiness reports it).
    pub(super) refused: Mutex<Option<String>>,
    /// The gateway's budget for in-flight data, which statements' answers take from as their
    /// rows arrive (set by the gateway once the pool is built).
    pub(super) memory: std::sync::OnceLock<Arc<fanout_protocol::bodies::BodyGate>>,
    /// Counters.
    pub counters: PoolCounters,
}

/// What [`Pool::pick`] found for a call.
enum Pick<'a> {
    /// An idle connection.
    Idle(PooledConn),
    /// None of this core's: open one (its place is held).
    Grow(Growing<'a>),
    /// None idle: open one (the call's slot is its place).
    None,
}

/// A place held for a connection being opened ([`Pool::pick`]), given back when dropped.
struct Growing<'a>(&'a AtomicUsize);

impl Drop for Growing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection in use, with its pool slot. Dropped before the statement finished (the call's
/// time ran out, or its request went away), it cancels the statement at the server and keeps
/// the slot until the connection is known idle again or closed.
pub(super) struct InUse {
    pub(super) pool: Arc<Pool>,
    pub(super) conn: Option<PooledConn>,
    pub(super) permit: Option<OwnedSemaphorePermit>,
}

impl InUse {
    /// Give the connection back (idle) and free the slot.
    pub(super) fn release(mut self) {
        if let Some(mut c) = self.conn.take() {
            c.idle_since = Instant::now();
            lock(&self.pool.idle).push(c);
        }
        self.permit.take();
    }

    /// The length of the row the connection's guard refused (0: none).
    pub(super) fn tripped(&self) -> usize {
        self.conn
            .as_ref()
            .map_or(0, |c| c.tripped.load(Ordering::Relaxed))
    }

    /// Close the connection (it broke) and free the slot.
    pub(super) fn discard(mut self) {
        if self.conn.take().is_some() {
            self.pool.closed_one();
        }
        self.permit.take();
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        let (Some(conn), Some(permit)) = (self.conn.take(), self.permit.take()) else {
            return;
        };
        let pool = self.pool.clone();
        pool.counters.cancelled.fetch_add(1, Ordering::Relaxed);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            pool.closed_one();
            return;
        };
        rt.spawn(async move {
            let _slot = permit;
            let token = conn.client.cancel_token();
            // Confirmed: the server closed the cancel request's connection, so the backend has
            // been signalled already — a signal still on its way could otherwise cancel the
            // *next* statement on this connection (a statement that had just finished when the
            // request arrived). Unconfirmed cancels (TLS, or no close in time) leave the
            // connection to be closed.
            let cancel = tokio::time::timeout(pool.connect_timeout, async {
                let sent = match (&pool.connector, &conn.peer) {
                    (Connector::Plain, Some(peer)) => return cancel_confirmed(&token, peer).await,
                    (Connector::Plain, None) => token.cancel_query(tokio_postgres::NoTls).await,
                    (Connector::Tls(t), _) => token.cancel_query(t.clone()).await,
                };
                sent.map(|()| false).map_err(|e| e.to_string())
            })
            .await;
            let confirmed = match cancel {
                Ok(Ok(confirmed)) => confirmed,
                Ok(Err(e)) => {
                    tracing::warn!(
                        database = %pool.name, error = %e,
                        "could not send the cancel request of a statement past its deadline; closing its connection"
                    );
                    false
                }
                Err(_) => {
                    tracing::warn!(
                        database = %pool.name,
                        "the cancel request of a statement past its deadline was not done within connect_timeout; closing its connection"
                    );
                    false
                }
            };
            // An empty statement answers after the cancelled one has ended: then the connection
            // is idle (and, with the cancel confirmed, safe to reuse). If it does not come back
            // soon, close the connection (the server ends the statement itself:
            // statement_timeout). The slot is held until then either way.
            let grace = pool.connect_timeout.max(Duration::from_secs(1));
            match tokio::time::timeout(grace, conn.client.simple_query("")).await {
                Ok(Ok(_)) if confirmed => {
                    let mut conn = conn;
                    conn.idle_since = Instant::now();
                    lock(&pool.idle).push(conn);
                }
                _ => {
                    drop(conn);
                    pool.closed_one();
                }
            }
        });
    }
}

impl Pool {
    /// The backend's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections idle in the pool now.
    pub fn idle(&self) -> usize {
        lock(&self.idle).len()
    }

    /// Calls waiting for a connection now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The pool's settings.
    pub fn settings(&self) -> &PostgresConfig {
        &self.cfg
    }

    /// Count statements' answers against `gate`'s memory budget (`server.bodies`); the first
    /// gate given stays (the gateway's, for as long as the process).
    pub fn share_memory_budget(&self, gate: &Arc<fanout_protocol::bodies::BodyGate>) {
        let _ = self.memory.set(gate.clone());
    }

    /// The statements of the config now in force: checked by [`Pool::check`] now, or when the
    /// database is reached if it is not now.
    pub fn set_statements(&self, cfg: Arc<fanout_config::Config>, checks: Vec<StatementCheck>) {
        *lock(&self.unchecked) = Some((cfg, checks));
        *lock(&self.refused) = None;
    }

    /// `Ok` when the database was reached and is not known to be down; else why not.
    pub fn readiness(&self) -> Result<(), String> {
        if let Some(r) = lock(&self.refused).as_ref() {
            return Err(r.clone());
        }
        let h = lock(&self.health);
        if h.down || !h.connected_once {
            return Err(format!(
                "database `{}` is not reachable{}",
                self.name,
                h.error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ));
        }
        Ok(())
    }

    /// The pool for `/__fanout/status`.
    pub fn status_json(&self) -> serde_json::Value {
        let h = lock(&self.health).clone();
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let by_core = self.idle_by_core();
        let mut v = serde_json::json!({
            "protocol": "postgres",
            "up": !h.down && h.connected_once,
            "error": h.error,
            "max_size": self.cfg.max_size,
            "open": self.open(),
            "idle": self.idle(),
            "in_use": self.open().saturating_sub(self.idle()),
            "waiting": self.waiting(),
            "max_waiters": self.cfg.max_waiters,
            "rejected_full": n(&c.rejected_full),
            "rejected_wait": n(&c.rejected_wait),
            "cancelled": n(&c.cancelled),
            "connects": n(&c.connects),
            "connect_failures": n(&c.connect_failures),
            "discarded": n(&c.discarded),
            "statements": n(&c.statements),
            "rows": n(&c.rows),
        });
        if let Some(by_core) = by_core {
            v["idle_by_core"] = by_core.into();
        }
        v
    }

    /// Per core (`server.runtime: per_core`), the idle connections each core's runtime runs, by
    /// core index; `None` when no idle connection is a core's.
    fn idle_by_core(&self) -> Option<Vec<usize>> {
        let idle = lock(&self.idle);
        let most = idle.iter().filter_map(|c| c.home).max()?;
        let mut n = vec![0; (most + 1).max(fanout_runtime::cores::shard_count())];
        for home in idle.iter().filter_map(|c| c.home) {
            if let Some(k) = n.get_mut(home) {
                *k += 1;
            }
        }
        Some(n)
    }

    /// What a client is told of a statement the server cancelled (SQLSTATE 57014) that the
    /// gateway did not: its `statement_timeout` (the server's message says so) or another
    /// session's cancel.
    pub(super) fn server_timeout(&self, message: &str) -> fanout_layers::backend::ServerTimeout {
        fanout_layers::backend::ServerTimeout(if message.contains("statement timeout") {
            format!(
                "the database stopped the statement at its statement_timeout ({} ms)",
                self.cfg.statement_timeout.0.as_millis()
            )
        } else {
            "the database cancelled the statement".to_string()
        })
    }

    pub(super) fn closed_one(&self) {
        self.counters.discarded.fetch_add(1, Ordering::Relaxed);
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Wait for a pool slot until `end` (capped by `max_wait`), FIFO, at most `max_waiters` waiting.
    pub(super) async fn acquire(&self, end: Instant) -> Result<OwnedSemaphorePermit, CallError> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            self.counters.wait.record(0);
            return Ok(p);
        }
        let waiting = self.waiting.fetch_add(1, Ordering::AcqRel);
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _w = Waiting(&self.waiting);
        if waiting >= self.cfg.max_waiters {
            self.counters.rejected_full.fetch_add(1, Ordering::Relaxed);
            return Err(CallError::new(
                CallErrorKind::Rejected(RejectReason::Pool),
                format!(
                    "database `{}`: all {} connections busy and {} calls already waiting (postgres.max_waiters)",
                    self.name, self.cfg.max_size, self.cfg.max_waiters
                ),
            ));
        }
        let started = Instant::now();
        let until = end.min(started + self.cfg.max_wait.0);
        let got = tokio::time::timeout_at(until, self.slots.clone().acquire_owned()).await;
        let waited = started.elapsed();
        self.counters.waits.fetch_add(1, Ordering::Relaxed);
        self.counters
            .wait_us_total
            .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        self.counters.wait.record_duration(waited);
        match got {
            Ok(Ok(p)) => Ok(p),
            _ => {
                self.counters.rejected_wait.fetch_add(1, Ordering::Relaxed);
                Err(CallError::new(
                    CallErrorKind::Rejected(RejectReason::Pool),
                    format!(
                        "database `{}`: no connection free within {:.0} ms (postgres.max_wait or the call's time)",
                        self.name,
                        waited.as_secs_f64() * 1000.0
                    ),
                ))
            }
        }
    }

    /// An idle connection that is still open (closing those idle past `idle_timeout`): the most
    /// recently idle one this core made (per core, its task runs on this thread: no other core
    /// is woken by the statement), else the most recently idle one of any core.
    pub(super) fn take_idle(&self) -> Option<PooledConn> {
        match self.pick(false) {
            Pick::Idle(c) => Some(c),
            Pick::Grow(_) | Pick::None => None,
        }
    }

    /// What a call on this core uses: [`Pool::take_idle`]'s connection, except that per core,
    /// when this core has no idle connection of its own and the pool may still grow, a new
    /// connection of this core ([`Pick::Grow`], counted against `max_size` until it is open)
    /// beats another core's idle one: every statement on that one would wake the other core
    /// twice (the statement to its task, the rows back).
    fn pick(&self, grow: bool) -> Pick<'_> {
        let here = fanout_runtime::cores::current();
        let mut idle = lock(&self.idle);
        loop {
            let own = idle.iter().rposition(|c| c.home == here);
            // Per core, one no core's (made at start or by the background reconnect) next: the
            // call replaces it with one of its own core.
            let own = own.or_else(|| {
                here.and(
                    grow.then(|| idle.iter().rposition(|c| c.home.is_none()))
                        .flatten(),
                )
            });
            let i = match own {
                Some(i) => i,
                None if grow
                    && here.is_some()
                    && self.open() + self.growing.load(Ordering::Relaxed) < self.cfg.max_size =>
                {
                    // Under the idle list's lock: two calls cannot both take the last place.
                    self.growing.fetch_add(1, Ordering::Relaxed);
                    return Pick::Grow(Growing(&self.growing));
                }
                None => match idle.len().checked_sub(1) {
                    Some(i) => i,
                    None => return Pick::None,
                },
            };
            let c = idle.remove(i);
            if c.client.is_closed() || c.idle_since.elapsed() > self.cfg.idle_timeout.0 {
                drop(c);
                self.closed_one();
                continue;
            }
            return Pick::Idle(c);
        }
    }

    /// Fail at once while the database is known to be down (until the next retry time).
    pub(super) fn fail_fast(&self) -> Option<CallError> {
        let h = lock(&self.health);
        let waiting = h.down && h.retry_at.is_some_and(|t| Instant::now() < t);
        waiting.then(|| {
            CallError::new(
                CallErrorKind::Connect,
                format!(
                    "database `{}` is unreachable{}",
                    self.name,
                    h.error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                ),
            )
        })
    }

    pub(super) fn mark_down(self: &Arc<Self>, why: String) {
        {
            let mut h = lock(&self.health);
            let min = self.cfg.reconnect_min.0;
            h.backoff = if h.down {
                (h.backoff * 2).clamp(min, self.cfg.reconnect_max.0)
            } else {
                min
            };
            // The log says why when the database goes down or the cause changes (not at every
            // retry of the same failure).
            if !h.down || h.error.as_deref() != Some(why.as_str()) {
                tracing::warn!(database = %self.name, error = %why, "database unreachable");
            }
            h.down = true;
            h.retry_at = Some(Instant::now() + h.backoff);
            h.error = Some(why);
        }
        // Idle connections of a database that went away are no good either.
        let stale: Vec<PooledConn> = std::mem::take(&mut *lock(&self.idle));
        for c in stale {
            drop(c);
            self.closed_one();
        }
        self.spawn_reconnect();
    }

    pub(super) fn mark_up(&self) {
        let mut h = lock(&self.health);
        if h.down {
            tracing::info!(database = %self.name, "database reachable again");
        }
        h.down = false;
        h.error = None;
        h.retry_at = None;
        h.connected_once = true;
    }

    /// Open a connection (counted in `open`; the caller holds a slot for it).
    pub(super) async fn connect(self: &Arc<Self>, end: Instant) -> Result<PooledConn, CallError> {
        // Every row is read through a guard that refuses one longer than the answer's cap from
        // its header (`guard.rs`). Plain connections: our socket (TCP or Unix, each server of
        // the URL in turn, as the driver tries them), handed to the driver; TLS: the decrypted
        // stream.
        let tripped = guard::Tripped::default();
        let limit = self.max_response_bytes;
        let attempt = async {
            match &self.connector {
                Connector::Plain => match connect_plain(&self.pg, limit, &tripped).await {
                    Some(Ok((client, to))) => Ok((client, Some(to))),
                    Some(Err(e)) => Err(e),
                    // No socket could be opened to any server: the driver's own attempt says
                    // why, in its terms.
                    None => self
                        .pg
                        .connect(tokio_postgres::NoTls)
                        .await
                        .map(|(c, conn)| {
                            tokio::spawn(conn);
                            (c, None)
                        }),
                },
                Connector::Tls(t) => {
                    let tls = guard::GuardTls::new(t.clone(), limit, tripped.clone());
                    self.pg.connect(tls).await.map(|(c, conn)| {
                        tokio::spawn(conn);
                        (c, None)
                    })
                }
            }
        };
        let attempt_started = Instant::now();
        let until = end.min(attempt_started + self.connect_timeout);
        let result = tokio::time::timeout_at(until, attempt).await;
        match result {
            Ok(Ok((client, peer))) => {
                self.counters.connects.fetch_add(1, Ordering::Relaxed);
                self.open.fetch_add(1, Ordering::Relaxed);
                self.mark_up();
                Ok(Box::new(Conn {
                    client,
                    prepared: HashMap::default(),
                    idle_since: Instant::now(),
                    tripped,
                    peer,
                    home: fanout_runtime::cores::current(),
                }))
            }
            Ok(Err(e)) => {
                self.counters
                    .connect_failures
                    .fetch_add(1, Ordering::Relaxed);
                let why = connect_error(&e, &self.address);
                self.mark_down(why.clone());
                Err(CallError::new(
                    CallErrorKind::Connect,
                    format!("database `{}`: cannot connect: {why}", self.name),
                )
                .with_source(e))
            }
            Err(_) => {
                self.counters
                    .connect_failures
                    .fetch_add(1, Ordering::Relaxed);
                let why = format!(
                    "timed out: no connection to {} within {:.0} ms",
                    self.address,
                    (until - attempt_started).as_secs_f64() * 1000.0
                );
                if until < end {
                    self.mark_down(why.clone());
                }
                Err(CallError::new(
                    CallErrorKind::Connect,
                    format!("database `{}`: {why}", self.name),
                ))
            }
        }
    }

    /// Reconnect in the background while the database is down (one task per pool at a time),
    /// so readiness turns green and calls stop failing fast as soon as it is back. The task
    /// tries when `retry_at` (set by [`Pool::mark_down`] from the backoff) has come, and only
    /// then: a wake-up ([`Pool::wake`]) makes it look at the state again, never try sooner.
    pub(super) fn spawn_reconnect(self: &Arc<Self>) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            // The task is running: this is a new failure (a call's, or the task's own attempt),
            // whose `retry_at` it reads when woken.
            self.wake.notify_one();
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.reconnecting.store(false, Ordering::Release);
            return;
        };
        let pool = Arc::downgrade(self);
        rt.spawn(async move {
            loop {
                let Some(p) = pool.upgrade() else { return };
                let (down, retry_at) = {
                    let h = lock(&p.health);
                    (h.down, h.retry_at)
                };
                if !down {
                    p.reconnecting.store(false, Ordering::Release);
                    // Down again between the look and the store: its `spawn_reconnect` saw this
                    // task running and started none, so this task goes on (unless one started).
                    if lock(&p.health).down && !p.reconnecting.swap(true, Ordering::AcqRel) {
                        continue;
                    }
                    return;
                }
                // Wait for the retry time, then look again: a wake-up (a failure's
                // `spawn_reconnect`, this task's own attempt's included, whose notification
                // is stored until the next wait) only means the state changed — usually a
                // later `retry_at`. Trying at every wake-up was a loop of attempts as fast
                // as the database refused them.
                if let Some(t) = retry_at
                    && Instant::now() < t
                {
                    let _ = tokio::time::timeout_at(t, p.wake.notified()).await;
                    continue;
                }
                // Take a slot, so the pool never opens more than max_size connections.
                let Ok(slot) = p.slots.clone().try_acquire_owned() else {
                    drop(p);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let far = Instant::now() + Duration::from_secs(3600);
                if let Ok(conn) = p.connect(far).await {
                    lock(&p.idle).push(conn);
                }
                drop(slot);
                let pending = lock(&p.unchecked).take();
                if let Some((cfg, checks)) = pending
                    && !lock(&p.health).down
                {
                    match p.check(&cfg, &checks).await {
                        Ok(errs) if !errs.is_empty() => {
                            for e in &errs {
                                tracing::error!(database = %p.name, "{e}");
                            }
                            *lock(&p.refused) = Some(format!(
                                "database `{}`: {} statement(s) refused (see the log); fix them and reload",
                                p.name,
                                errs.len()
                            ));
                        }
                        Ok(_) => {}
                        Err(_) => *lock(&p.unchecked) = Some((cfg, checks)),
                    }
                }
            }
        });
    }

    /// Connect (when the database is reachable) and prepare every statement: `Ok(errors)` names
    /// each statement Postgres refuses, a parameter count that does not match, a type the `sql`
    /// step cannot read or write; `Err`: the database could not be reached (readiness says so
    /// and the pool keeps retrying in the background).
    pub async fn check(
        self: &Arc<Self>,
        cfg: &fanout_config::Config,
        statements: &[StatementCheck],
    ) -> Result<Vec<ConfigError>, String> {
        let busy = self.connect_timeout.max(self.cfg.max_wait.0) + Duration::from_secs(5);
        let slot = match tokio::time::timeout(busy, self.slots.clone().acquire_owned()).await {
            Ok(Ok(s)) => s,
            _ => {
                return Err(format!(
                    "database `{}`: no connection free to check the statements",
                    self.name
                ));
            }
        };
        let end = Instant::now() + self.connect_timeout;
        let mut conn = match self.take_idle() {
            Some(c) => c,
            None => self.connect(end).await.map_err(|e| e.message)?,
        };
        *lock(&self.unchecked) = None;
        let mut errs = Vec::new();
        for s in statements {
            let at = |msg: String| ConfigError {
                path: None,
                file: cfg.file.clone(),
                pos: Some(s.query.pos),
                message: format!("{}: {msg}", s.owner),
                hint: None,
            };
            match conn.client.prepare(&s.query.value).await {
                Ok(stmt) => {
                    if stmt.params().len() != s.params {
                        errs.push(
                            at(format!(
                                "the statement has {} parameter(s) ($1…) but the step passes {}",
                                stmt.params().len(),
                                s.params
                            ))
                            .hint("`params:` lists one expression per `$n`, in order"),
                        );
                    }
                    for (i, ty) in stmt.params().iter().enumerate() {
                        if !types::supported(ty) {
                            errs.push(
                                at(format!(
                                    "parameter ${} has type {}, which sql steps cannot send",
                                    i + 1,
                                    ty.name()
                                ))
                                .hint("cast it in the statement, e.g. `$1::text::inet`"),
                            );
                        }
                    }
                    for c in stmt.columns() {
                        if !types::supported(c.type_()) {
                            errs.push(
                                at(format!(
                                    "column `{}` has type {}, which sql steps cannot read",
                                    c.name(),
                                    c.type_().name()
                                ))
                                .hint("cast it in the statement, e.g. `col::text`"),
                            );
                        }
                    }
                    conn.prepared
                        .insert(s.query.value.as_str().into(), prepared(stmt));
                }
                Err(e) => match e.as_db_error() {
                    Some(db) => {
                        let mut msg = format!("Postgres refused the statement: {}", db.message());
                        let mut pos = Some(s.query.pos);
                        if let Some(tokio_postgres::error::ErrorPosition::Original(p)) =
                            db.position()
                        {
                            // 1-based character offset into the statement.
                            let chars = (*p as usize).saturating_sub(1);
                            let offset: usize =
                                s.query.value.chars().take(chars).map(char::len_utf8).sum();
                            msg.push_str(&format!(" (at character {p} of the statement)"));
                            pos = Some(cfg.pos_in_scalar(s.query.pos, &s.query.value, offset));
                        }
                        errs.push(ConfigError {
                            path: None,
                            file: cfg.file.clone(),
                            pos,
                            message: format!("{}: {msg}", s.owner),
                            hint: db.hint().map(str::to_string),
                        });
                    }
                    None => {
                        drop(conn);
                        self.closed_one();
                        drop(slot);
                        return Err(format!("database `{}`: {}", self.name, error_chain(&e)));
                    }
                },
            }
        }
        conn.idle_since = Instant::now();
        lock(&self.idle).push(conn);
        drop(slot);
        Ok(errs)
    }

    /// Run one call: a slot (or a refusal), a connection, the statement.
    pub(super) async fn run(
        self: Arc<Self>,
        call: SqlCall,
        end: Instant,
    ) -> Result<CallResponse, CallError> {
        if let Some(e) = self.fail_fast() {
            return Err(e);
        }
        let permit = self.acquire(end).await?;
        let conn = match self.pick(true) {
            // Per core, a connection made outside the cores (at start, or by the background
            // reconnect: its task runs on the control thread, which every statement on it would
            // wake) is replaced by one of this core.
            Pick::Idle(c) if c.home.is_none() && fanout_runtime::cores::current().is_some() => {
                drop(c);
                self.closed_one();
                Box::pin(self.connect(end)).await?
            }
            Pick::Idle(c) => c,
            // Boxed: connecting (TLS included) is a large future that a call on an idle
            // connection would otherwise carry, and move, every time.
            Pick::None => Box::pin(self.connect(end)).await?,
            // Counted in `growing` until `connect` counts it in `open` (or fails).
            Pick::Grow(g) => {
                let c = Box::pin(self.connect(end)).await;
                drop(g);
                c?
            }
        };
        let mut in_use = InUse {
            pool: self.clone(),
            conn: Some(conn),
            permit: Some(permit),
        };
        let Some(conn) = in_use.conn.as_mut() else {
            return Err(CallError::new(CallErrorKind::Invalid, "no connection"));
        };
        let max = self.max_response_bytes;
        // No timer of its own: like every backend call, the caller bounds it (the step's
        // timeout, a shared call's limit), and dropping this future at that bound drops
        // `in_use`, which cancels the statement at the server.
        let done = execute(conn, &call, max, &self.counters, self.memory.get()).await;
        match done {
            Ok(Answer::Value(answer)) => {
                in_use.release();
                Ok(CallResponse {
                    status: StatusCode::OK,
                    body: Bytes::new(),
                    value: Some(answer),
                    parsed: None,
                })
            }
            Ok(Answer::Text(text)) => {
                in_use.release();
                Ok(response(StatusCode::OK, text))
            }
            Err(ExecError::Memory(budget)) => {
                // The rest of the rows are still coming: the connection is not idle.
                drop(in_use);
                Err(CallError::new(
                    CallErrorKind::Rejected(RejectReason::Memory),
                    format!(
                        "database `{}`: the rows passed the memory budget for in-flight data \
                         (server.bodies.memory_budget_bytes: {budget})",
                        self.name
                    ),
                ))
            }
            Err(ExecError::Param(n, problem)) => {
                in_use.release();
                let body = format!(r#"{{"param":{n},"problem":{}}}"#, json_str(&problem));
                Ok(response(StatusCode::BAD_REQUEST, body))
            }
            Err(ExecError::Column(problem)) => {
                // Not idle: dropping `in_use` cancels the rest and checks the connection.
                drop(in_use);
                let body = format!(r#"{{"sqlstate":"XX000","message":{}}}"#, json_str(&problem));
                Ok(response(StatusCode::INTERNAL_SERVER_ERROR, body))
            }
            Err(ExecError::TooLarge) => {
                // The rest of the rows are still coming: the connection is not idle.
                drop(in_use);
                Err(CallError::new(
                    CallErrorKind::BodyTooLarge,
                    format!(
                        "database `{}`: the rows are larger than max_response_bytes ({max})",
                        self.name
                    ),
                ))
            }
            Err(ExecError::Db(e)) => {
                let Some(db) = e.as_db_error() else {
                    in_use.discard();
                    return Err(CallError::new(CallErrorKind::Reset, error_chain(&e)));
                };
                let state = db.code().code();
                self.counters.errors.count(state);
                match crate::sqlstate::classify(state) {
                    Ok(sql) => {
                        in_use.release();
                        let status = sql.status();
                        let mut body = format!(
                            r#"{{"sqlstate":{},"message":{}"#,
                            json_str(state),
                            json_str(db.message())
                        );
                        if let Some(c) = db.constraint() {
                            body.push_str(&format!(r#","constraint":{}"#, json_str(c)));
                        }
                        body.push('}');
                        Ok(response(status, body))
                    }
                    Err(kind) => {
                        if kind == CallErrorKind::Timeout {
                            in_use.release();
                        } else {
                            in_use.discard();
                            self.mark_down(format!("{} (SQLSTATE {state})", db.message()));
                        }
                        let err = CallError::new(
                            kind,
                            format!(
                                "database `{}`: {} (SQLSTATE {state})",
                                self.name,
                                db.message()
                            ),
                        );
                        Err(if kind == CallErrorKind::Timeout {
                            // The server stopped it: our own cancels are sent past the call's
                            // time, which has then ended already.
                            err.with_source(self.server_timeout(db.message()))
                        } else {
                            err
                        })
                    }
                }
            }
            Err(ExecError::Broken(_)) if in_use.tripped() > 0 => {
                // The guard refused a row longer than the cap from its header and closed the
                // connection; the statement may still run at the server: cancel it there.
                let len = in_use.tripped();
                drop(in_use);
                Err(CallError::new(
                    CallErrorKind::BodyTooLarge,
                    format!(
                        "database `{}`: a row of {len} bytes is larger than max_response_bytes ({max})",
                        self.name
                    ),
                ))
            }
            Err(ExecError::Broken(e)) => {
                in_use.discard();
                let closed = e.is_closed();
                self.mark_down(error_chain(&e));
                Err(CallError::new(
                    if closed {
                        CallErrorKind::Reset
                    } else {
                        CallErrorKind::Connect
                    },
                    format!("database `{}`: connection lost: {e}", self.name),
                )
                .with_source(e))
            }
        }
    }
}

/// The pool against a real PostgreSQL (the test binary's one cluster, a database per test):
/// waiters bounded and refused at once, a wait bounded by the call's time, a statement past its
/// time cancelled at the server and its connection kept once the cancel is confirmed, and a
/// connection the server closed evicted and replaced.
#[cfg(test)]
mod tests {
    use super::*;
    use fanout_pgtemp::{PgCluster, PgDatabase};

    async fn database() -> PgDatabase {
        tokio::task::spawn_blocking(|| PgCluster::database().unwrap_or_else(|e| panic!("{e}")))
            .await
            .unwrap()
    }

    /// A pool of `max_size` connections and `max_waiters` waiters on `db`.
    fn pool(db: &PgDatabase, max_size: usize, max_waiters: usize, max_wait: &str) -> Arc<Pool> {
        let yaml = format!(
            "backends:\n  db:\n    protocol: postgres\n    url: \"{}\"\n    postgres: {{ max_size: {max_size}, max_waiters: {max_waiters}, max_wait: {max_wait} }}\nroutes: []\n",
            db.url()
        );
        let cfg = fanout_config::Config::from_yaml("fanout.yaml", &yaml, &|_| None)
            .unwrap_or_else(|e| panic!("{e}"));
        let b = &cfg.backends["db"];
        PgBackend::new("db", b, &cfg.defaults)
            .unwrap_or_else(|e| panic!("{e}"))
            .pool()
            .clone()
    }

    fn call(statement: &str) -> SqlCall {
        SqlCall {
            statement: statement.into(),
            params: fanout_layers::backend::SqlParams::new(),
            read_only: true,
            rows_only: true,
            single_row: false,
            max_depth: 64,
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn psql(db: &PgDatabase, sql: &str) -> String {
        tokio::task::block_in_place(|| db.psql(sql).unwrap_or_else(|e| panic!("{e}")))
    }

    /// Whether a statement starting with `prefix` is running in `db` now.
    fn running(db: &PgDatabase, prefix: &str) -> bool {
        psql(
            db,
            &format!(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' AND query LIKE '{prefix}%'"
            ),
        ) != "0"
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let give_up = Instant::now() + Duration::from_secs(30);
        while !f() {
            assert!(Instant::now() < give_up, "{what}: not within 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A database that cannot be reached is retried after `reconnect_min`, doubling up to
    /// `reconnect_max`, and never in a loop (it once was: 12 000–21 000 attempts a second, a
    /// core busy, with no traffic at all). On tokio's paused clock: the counts are exact.
    #[tokio::test(start_paused = true)]
    async fn an_unreachable_database_is_retried_with_backoff_not_in_a_loop() {
        // A "database" that accepts each connection and closes it at once: every attempt fails.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicU64::new(0));
        // Past this many attempts the test stops waiting (a loop never lets the clock move).
        const TOO_MANY: u64 = 40;
        let too_many = Arc::new(Notify::new());
        tokio::spawn({
            let (accepted, too_many) = (accepted.clone(), too_many.clone());
            async move {
                while let Ok((s, _)) = listener.accept().await {
                    drop(s);
                    if accepted.fetch_add(1, Ordering::Relaxed) + 1 == TOO_MANY {
                        too_many.notify_one();
                    }
                }
            }
        });
        let yaml = format!(
            "backends:\n  db:\n    protocol: postgres\n    url: \"postgres://app@127.0.0.1:{port}/app\"\n    connect_timeout: 1s\n    postgres: {{ reconnect_min: 100ms, reconnect_max: 5s }}\nroutes: []\n"
        );
        let cfg = fanout_config::Config::from_yaml("fanout.yaml", &yaml, &|_| None)
            .unwrap_or_else(|e| panic!("{e}"));
        let p = PgBackend::new("db", &cfg.backends["db"], &cfg.defaults)
            .unwrap_or_else(|e| panic!("{e}"))
            .pool()
            .clone();
        // The first attempt (as at start) fails; the pool then retries in the background.
        let started = Instant::now();
        let e = p.check(&cfg, &[]).await.expect_err("unreachable");
        assert!(e.contains("cannot connect"), "{e}");
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
            () = too_many.notified() => {}
        }
        let elapsed = started.elapsed().as_millis();
        let failures = p.counters.connect_failures.load(Ordering::Relaxed);
        let accepted = accepted.load(Ordering::Relaxed);
        // Attempts at 0, 0.1, 0.3, 0.7, 1.5, 3.1 and 6.3 s, then every 5 s: 17 in 60 s.
        assert!(
            (15..=19).contains(&failures),
            "{failures} failed attempts ({accepted} connections) in {elapsed} ms of the clock"
        );
        assert!(
            accepted <= failures + 1,
            "{accepted} connections, {failures} failures"
        );
        assert!(p.readiness().is_err());
        assert_eq!(p.open(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
    async fn waiters_are_bounded_and_the_one_too_many_is_refused_at_once() {
        let db = database().await;
        let p = pool(&db, 1, 1, "30s");
        // The one connection runs a statement until it is cancelled.
        let busy = tokio::spawn(p.clone().run(call("SELECT pg_sleep(300)"), far()));
        until("the first statement runs", || {
            running(&db, "SELECT pg_sleep(300)")
        })
        .await;
        // One waiter is allowed…
        let waiter = tokio::spawn(p.clone().run(call("SELECT 1 AS one"), far()));
        until("one call waits", || p.waiting() == 1).await;
        // …the next is refused at once, as the pool's refusal (a 503 `pool_exhausted`).
        let e = p
            .clone()
            .run(call("SELECT 2 AS two"), far())
            .await
            .expect_err("refused");
        assert_eq!(e.kind, CallErrorKind::Rejected(RejectReason::Pool), "{e}");
        assert_eq!(p.counters.rejected_full.load(Ordering::Relaxed), 1);
        // The first call's request goes away: its statement is cancelled, the waiter runs.
        busy.abort();
        let answer = waiter
            .await
            .unwrap()
            .expect("the waiter gets the connection");
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(p.counters.cancelled.load(Ordering::Relaxed), 1);
        assert_eq!(p.open(), 1, "one connection all along");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
    async fn a_wait_ends_at_the_calls_deadline_and_at_max_wait() {
        let db = database().await;
        let p = pool(&db, 1, 4, "300ms");
        let busy = tokio::spawn(p.clone().run(call("SELECT pg_sleep(300)"), far()));
        until("the first statement runs", || {
            running(&db, "SELECT pg_sleep(300)")
        })
        .await;
        // The call's own end comes before max_wait.
        let e = p
            .clone()
            .run(call("SELECT 1"), Instant::now() + Duration::from_millis(50))
            .await
            .expect_err("no connection before the call's end");
        assert_eq!(e.kind, CallErrorKind::Rejected(RejectReason::Pool), "{e}");
        // max_wait comes before the call's end.
        let e = p
            .clone()
            .run(call("SELECT 1"), far())
            .await
            .expect_err("no connection within max_wait");
        assert_eq!(e.kind, CallErrorKind::Rejected(RejectReason::Pool), "{e}");
        assert_eq!(p.counters.rejected_wait.load(Ordering::Relaxed), 2);
        assert_eq!(p.waiting(), 0);
        busy.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
    async fn a_statement_past_its_time_is_cancelled_at_the_server_and_its_connection_kept() {
        let db = database().await;
        let p = pool(&db, 1, 1, "30s");
        // The caller bounds the call (as the step's timeout does): dropping the future at the
        // bound cancels the statement at the server.
        let r = tokio::time::timeout(
            Duration::from_millis(300),
            p.clone().run(call("SELECT pg_sleep(300)"), far()),
        )
        .await;
        assert!(r.is_err(), "the statement outlived its bound");
        until("the statement is gone from the server", || {
            !running(&db, "SELECT pg_sleep(300)")
        })
        .await;
        assert_eq!(p.counters.cancelled.load(Ordering::Relaxed), 1);
        // The cancel was confirmed: the connection is idle again and reused, not replaced.
        until("the connection is back in the pool", || p.idle() == 1).await;
        let answer = p
            .clone()
            .run(call("SELECT 7 AS n"), far())
            .await
            .expect("answers");
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(
            p.counters.connects.load(Ordering::Relaxed),
            1,
            "the same connection"
        );
        assert_eq!(p.counters.discarded.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "tier 2 (./scripts/test): needs PostgreSQL"]
    async fn a_connection_the_server_closed_is_evicted_and_replaced() {
        let db = database().await;
        let p = pool(&db, 1, 1, "30s");
        let first = p
            .clone()
            .run(call("SELECT 1 AS n"), far())
            .await
            .expect("answers");
        assert_eq!(first.status, StatusCode::OK);
        assert_eq!(p.idle(), 1);
        // The server ends the idle connection (an administrator, a failover, idle timeout).
        psql(
            &db,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name <> 'psql'",
        );
        // The next call finds the connection gone (or the pool has noticed already and answers
        // `database_unavailable` at once while it reconnects in the background): the broken
        // connection is dropped, and calls answer again on a new one.
        let _ = p.clone().run(call("SELECT 2 AS n"), far()).await;
        let give_up = Instant::now() + Duration::from_secs(30);
        loop {
            match p.clone().run(call("SELECT 3 AS n"), far()).await {
                Ok(r) => {
                    assert_eq!(r.status, StatusCode::OK);
                    break;
                }
                Err(e) => assert!(Instant::now() < give_up, "no answer within 30 s: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            p.counters.connects.load(Ordering::Relaxed) >= 2,
            "a new connection replaced the closed one"
        );
        assert_eq!(p.open(), 1);
    }
}
