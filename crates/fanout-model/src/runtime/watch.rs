//! The model set: every model of `models.dir`, opened at once and watched by one supervised
//! thread that loads what changed.

#[cfg(any(test, feature = "test-hooks"))]
use super::hooks;
use super::slot::{FileSig, ModelSlot, Scheduler};
use super::{FORMATS, Format, ModelStatus, lock, panic_text};
use fanout_config::{ConfigError, ModelsConfig};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Every model of `models.dir`, by name.
pub struct ModelSet {
    cfg: ModelsConfig,
    sched: Arc<Scheduler>,
    dir: Option<PathBuf>,
    slots: Mutex<BTreeMap<String, Arc<ModelSlot>>>,
    watching: AtomicBool,
    scans: AtomicU64,
    watcher: Mutex<WatcherStatus>,
    /// When the watcher last finished a scan or started to wait, and what it does since.
    beat: Mutex<(Instant, &'static str)>,
}

/// The state of the thread that watches `models.dir`, for `/readyz` and the status endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatcherStatus {
    /// Whether the watcher was started (a set without `models.dir`, or not serving, has none).
    pub started: bool,
    /// Whether it watches now: `false` from a panic until its restart.
    pub running: bool,
    /// Times it was restarted after a panic.
    pub restarts: u64,
    /// The message of its last panic, if any.
    pub last_panic: Option<String>,
}

/// The first wait before a panicked watcher is restarted; it doubles on each panic in a row, up
/// to [`RESTART_MAX`], and is back to this after a scan that completes.
const RESTART_FIRST: Duration = Duration::from_millis(100);
/// The longest wait before a panicked watcher is restarted.
const RESTART_MAX: Duration = Duration::from_secs(5);

impl Default for ModelSet {
    fn default() -> Self {
        ModelSet {
            cfg: ModelsConfig::default(),
            sched: Arc::default(),
            dir: None,
            slots: Mutex::new(BTreeMap::new()),
            watching: AtomicBool::new(false),
            scans: AtomicU64::new(0),
            watcher: Mutex::new(WatcherStatus::default()),
            beat: Mutex::new((Instant::now(), "starting")),
        }
    }
}

impl ModelSet {
    /// Load every model of `cfg.dir` (relative to `base`, the config file's directory). A file
    /// that does not load is kept as a slot without a version (its error in the status; a step
    /// naming it is a config error). An unreadable directory is a config error.
    pub fn open(cfg: &ModelsConfig, base: Option<&Path>) -> Result<ModelSet, ConfigError> {
        let mut set = ModelSet {
            cfg: cfg.clone(),
            ..ModelSet::default()
        };
        let Some(dir) = &cfg.dir else {
            return Ok(set);
        };
        let path = base.map_or_else(|| PathBuf::from(&dir.value), |b| b.join(&dir.value));
        if let Err(e) = std::fs::read_dir(&path) {
            return Err(ConfigError::at(
                dir.pos,
                format!("models.dir `{}` cannot be read: {e}", dir.value),
            )
            .hint("a directory of NAME.onnx files, relative to the config file"));
        }
        set.dir = Some(path);
        // A load that panics is a refused file (`offer`); this is a panic anywhere else.
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| set.scan(true))) {
            return Err(ConfigError::at(
                dir.pos,
                format!(
                    "models.dir `{}` could not be scanned: {}",
                    dir.value,
                    panic_text(&*p)
                ),
            ));
        }
        Ok(set)
    }

    /// The model `name`, if its file exists (loaded or not).
    pub fn get(&self, name: &str) -> Option<Arc<ModelSlot>> {
        lock(&self.slots).get(name).cloned()
    }

    /// Every model's state, by name.
    pub fn status(&self) -> Vec<ModelStatus> {
        lock(&self.slots).values().map(|s| s.status()).collect()
    }

    /// Directory scans so far (tests wait for one to pass).
    pub fn scans(&self) -> u64 {
        self.scans.load(Relaxed)
    }

    /// The watcher's state.
    pub fn watcher(&self) -> WatcherStatus {
        lock(&self.watcher).clone()
    }

    /// `Err` (why) while the watcher, once started, is stopped or stalled: no added or replaced
    /// model file would be loaded (`/readyz` answers not ready). A stopped (panicked) watcher is
    /// restarted on its own; a stalled one is waited for — it is blocked in the system (a hung
    /// file system), where a replacement would block too.
    pub fn readiness(&self) -> Result<(), String> {
        let w = lock(&self.watcher);
        if !w.started {
            return Ok(());
        }
        if w.running {
            let (at, doing) = *lock(&self.beat);
            let quiet = at.elapsed();
            if quiet > self.cfg.poll.0 + self.cfg.stall_timeout.0 {
                return Err(format!(
                    "the models.dir watcher has not finished a scan for {:.0} s (models.poll + \
                     models.stall_timeout: {:.0} s); it is {doing}",
                    quiet.as_secs_f64(),
                    (self.cfg.poll.0 + self.cfg.stall_timeout.0).as_secs_f64()
                ));
            }
            return Ok(());
        }
        Err(format!(
            "the models.dir watcher stopped ({}); it is being restarted (restarts so far: {})",
            w.last_panic.as_deref().unwrap_or("it panicked"),
            w.restarts
        ))
    }

    /// Start the thread that watches the directory (once; it ends when the set is dropped):
    /// it rescans on file-system events (inotify on Linux) and every `models.poll` whatever
    /// happens (events can be missing: network file systems, some volume mounts), and sooner
    /// while a changed file settles.
    pub fn watch(self: &Arc<Self>) -> std::io::Result<()> {
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        if self.watching.swap(true, Relaxed) {
            return Ok(());
        }
        let weak: Weak<ModelSet> = Arc::downgrade(self);
        let poll = self.cfg.poll.0.max(Duration::from_millis(10));
        let settle = self.cfg.settle.0.max(Duration::from_millis(10));
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
        // Events only wake the thread; a full channel means a wake-up is pending already.
        // Accesses are not changes — and the scan's own reads of the directory are accesses.
        let events = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
            if e.is_ok_and(|e| matches!(e.kind, notify::EventKind::Access(_))) {
                return;
            }
            let _ = tx.try_send(());
        })
        .and_then(|mut w| {
            notify::Watcher::watch(&mut w, &dir, notify::RecursiveMode::NonRecursive)?;
            Ok(w)
        });
        let events = match events {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "models.dir: no file-system events; polling every models.poll");
                None
            }
        };
        {
            let mut w = lock(&self.watcher);
            w.started = true;
            w.running = true;
        }
        let spawned = std::thread::Builder::new()
            .name("fanout-models".into())
            .spawn(move || {
                let _events = events; // dropped (unwatched) when the thread ends
                // Supervised: a panic ends the watch loop, not the thread; the loop is restarted
                // (at once scanning) after a wait that grows while it keeps panicking.
                let mut backoff = RESTART_FIRST;
                let mut first_wait = poll;
                loop {
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        watch_loop(&weak, &rx, first_wait, poll, settle, &mut backoff)
                    }));
                    let Err(panic) = run else { return }; // the set was dropped
                    let message = panic_text(&*panic);
                    match weak.upgrade() {
                        Some(set) => {
                            tracing::error!(error = %message, restart_in = ?backoff, "the models.dir watcher panicked; restarting it");
                            let mut w = lock(&set.watcher);
                            w.running = false;
                            w.last_panic = Some(message);
                        }
                        None => return,
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(RESTART_MAX);
                    let Some(set) = weak.upgrade() else { return };
                    let mut w = lock(&set.watcher);
                    w.running = true;
                    w.restarts += 1;
                    first_wait = Duration::ZERO;
                }
            });
        if let Err(e) = spawned {
            let mut w = lock(&self.watcher);
            w.started = false;
            w.running = false;
            self.watching.store(false, Relaxed);
            return Err(e);
        }
        Ok(())
    }

    /// The watcher is alive and about to do `what` (reading files, waiting).
    fn beat(&self, what: &'static str) {
        *lock(&self.beat) = (Instant::now(), what);
    }

    /// Look at every `*.onnx` file of the directory and load what is new or changed (at start:
    /// at once; later: once settled). Returns whether a changed file is still settling.
    fn scan(&self, at_start: bool) -> bool {
        let Some(dir) = &self.dir else { return false };
        let files = match list(dir) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "models.dir cannot be read");
                self.scans.fetch_add(1, Relaxed);
                return false;
            }
        };
        let mut settling = false;
        let settle = self.cfg.settle.0;
        for (name, path, format, meta) in files {
            let sig = FileSig::of(&meta);
            let slot = {
                let mut slots = lock(&self.slots);
                match slots.get(&name) {
                    Some(s) => s.clone(),
                    None => {
                        if slots.len() >= self.cfg.max_models {
                            tracing::warn!(model = %name, max = self.cfg.max_models, "models.max_models reached: file ignored");
                            continue;
                        }
                        let s = Arc::new(ModelSlot::new(
                            &name,
                            self.cfg.batch_of(&name),
                            self.sched.clone(),
                        ));
                        slots.insert(name.clone(), s.clone());
                        s
                    }
                }
            };
            let ready = {
                let mut l = lock(&slot.load);
                if l.sig == Some(sig) || l.failed_sig == Some(sig) {
                    l.settling = None;
                    false
                } else if at_start || settle.is_zero() {
                    true
                } else {
                    match l.settling {
                        Some((s, since)) if s == sig => since.elapsed() >= settle,
                        _ => {
                            l.settling = Some((sig, Instant::now()));
                            false
                        }
                    }
                }
            };
            if !ready {
                settling |= lock(&slot.load).settling.is_some();
                continue;
            }
            let too_large = |len: u64| {
                format!(
                    "the file has {len} bytes, more than models.max_file_bytes ({})",
                    self.cfg.max_file_bytes
                )
            };
            if sig.len > self.cfg.max_file_bytes {
                slot.fail(sig, too_large(sig.len));
                continue;
            }
            self.beat("reading and loading a model file");
            match std::fs::read(&path) {
                // The file grew between its metadata and its reading.
                Ok(bytes) if bytes.len() as u64 > self.cfg.max_file_bytes => {
                    slot.fail(sig, too_large(bytes.len() as u64));
                }
                Ok(bytes) => {
                    slot.offer(format, &bytes, sig, &self.cfg);
                }
                Err(e) => slot.fail(sig, format!("the file cannot be read: {e}")),
            }
        }
        self.scans.fetch_add(1, Relaxed);
        settling
    }
}

/// The watcher's loop: scan on file-system events (`rx`) and every `poll`, sooner while a file
/// settles; the first scan after `first_wait`. Returns when the set is dropped.
fn watch_loop(
    weak: &Weak<ModelSet>,
    rx: &std::sync::mpsc::Receiver<()>,
    first_wait: Duration,
    poll: Duration,
    settle: Duration,
    backoff: &mut Duration,
) {
    let mut wait = first_wait;
    loop {
        if let Some(set) = weak.upgrade() {
            set.beat("waiting for a change or the next poll");
        }
        match rx.recv_timeout(wait) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(wait),
        }
        let Some(set) = weak.upgrade() else { return };
        #[cfg(any(test, feature = "test-hooks"))]
        if let Some(dir) = &set.dir
            && dir.join(hooks::WATCHER_PANICS).exists()
        {
            panic!("test hook: {} is in models.dir", hooks::WATCHER_PANICS);
        }
        set.beat("scanning the directory");
        #[cfg(any(test, feature = "test-hooks"))]
        while let Some(dir) = &set.dir
            && dir.join(hooks::WATCHER_HANGS).exists()
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let settling = set.scan(false);
        *backoff = RESTART_FIRST;
        wait = if settling { settle.min(poll) } else { poll };
    }
}

/// The model files of `dir` — `NAME.EXT` for each extension of [`FORMATS`]; hidden files, such
/// as a temporary file being written, are not models — with their format and metadata.
fn list(dir: &Path) -> std::io::Result<Vec<(String, PathBuf, &'static Format, std::fs::Metadata)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some((stem, format)) = FORMATS.iter().find_map(|f| {
            let stem = name.strip_suffix(f.extension)?.strip_suffix('.')?;
            Some((stem, f))
        }) else {
            continue;
        };
        if stem.is_empty() || stem.starts_with('.') {
            continue;
        }
        // Follows symlinks (Kubernetes mounts ConfigMaps and volumes through them).
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_file() {
            out.push((stem.to_string(), path, format, meta));
        }
    }
    // One file per name (another extension of the same name is ignored).
    out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    out.dedup_by(|b, a| a.0 == b.0);
    Ok(out)
}

/// Slots by name for the compiler (a plain map: compiling touches no lock per step).
pub fn slots(set: &ModelSet) -> HashMap<String, Arc<ModelSlot>> {
    lock(&set.slots)
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::testing::MODEL;
    use fanout_config::Dur;

    fn watched_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fanout-models-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn watched(dir: &Path) -> Arc<ModelSet> {
        let cfg = ModelsConfig {
            dir: Some(fanout_config::Located::unknown(dir.display().to_string())),
            poll: Dur::millis(20),
            settle: Dur::millis(20),
            ..ModelsConfig::default()
        };
        let set = Arc::new(ModelSet::open(&cfg, None).unwrap());
        set.watch().unwrap();
        set
    }

    /// Wait for a condition (a watcher thread's doing), failing after 30 s.
    fn wait(what: &str, mut ok: impl FnMut() -> bool) {
        let give_up = Instant::now() + Duration::from_secs(30);
        while !ok() {
            if Instant::now() > give_up {
                panic!("timed out waiting for: {what}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_loader_that_panics_refuses_its_file_and_the_next_file_loads() {
        let dir = watched_dir("loader-panics");
        // At open: refused, counted.
        std::fs::write(dir.join("a.panics"), b"x").unwrap();
        let set = watched(&dir);
        let a = set.get("a").unwrap().status();
        assert_eq!((a.loads, a.load_failures), (0, 1));
        assert!(
            a.last_error
                .as_deref()
                .unwrap_or_default()
                .contains("panicked"),
            "{a:?}"
        );
        // In the watcher: refused, and a good file dropped after it is loaded.
        std::fs::write(dir.join("b.panics"), b"x").unwrap();
        wait("b refused", || {
            set.get("b").is_some_and(|s| s.status().load_failures == 1)
        });
        std::fs::write(dir.join("c.onnx"), MODEL).unwrap();
        wait("c loaded", || {
            set.get("c").and_then(|s| s.current()).is_some()
        });
        assert_eq!(set.watcher().restarts, 0);
        assert_eq!(set.readiness(), Ok(()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_watcher_blocked_in_a_scan_is_not_ready_until_it_finishes_one() {
        let dir = watched_dir("watcher-hangs");
        let cfg = ModelsConfig {
            dir: Some(fanout_config::Located::unknown(dir.display().to_string())),
            poll: Dur::millis(20),
            settle: Dur::millis(10),
            stall_timeout: Dur::millis(300),
            ..ModelsConfig::default()
        };
        let set = Arc::new(ModelSet::open(&cfg, None).unwrap());
        set.watch().unwrap();
        let scans = set.scans();
        wait("a scan", || set.scans() > scans);
        assert_eq!(set.readiness(), Ok(()));
        std::fs::write(dir.join(hooks::WATCHER_HANGS), b"").unwrap();
        wait("not ready", || set.readiness().is_err());
        let why = set.readiness().unwrap_err();
        assert!(why.contains("has not finished a scan"), "{why}");
        assert!(why.contains("scanning the directory"), "{why}");
        assert_eq!(
            set.watcher().restarts,
            0,
            "a blocked watcher is not replaced"
        );
        std::fs::remove_file(dir.join(hooks::WATCHER_HANGS)).unwrap();
        wait("ready again", || set.readiness().is_ok());
        std::fs::write(dir.join("m.onnx"), MODEL).unwrap();
        wait("m loaded", || {
            set.get("m").and_then(|s| s.current()).is_some()
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_watcher_that_panics_is_not_ready_until_it_is_restarted() {
        let dir = watched_dir("watcher-panics");
        let set = watched(&dir);
        assert_eq!(set.readiness(), Ok(()));
        std::fs::write(dir.join(hooks::WATCHER_PANICS), b"").unwrap();
        wait("not ready", || set.readiness().is_err());
        let why = set.readiness().unwrap_err();
        assert!(why.contains("models.dir watcher"), "{why}");
        assert!(why.contains("test hook"), "{why}");
        std::fs::remove_file(dir.join(hooks::WATCHER_PANICS)).unwrap();
        wait("ready again", || set.readiness().is_ok());
        assert!(set.watcher().restarts >= 1);
        // It loads files again.
        std::fs::write(dir.join("m.onnx"), MODEL).unwrap();
        wait("m loaded", || {
            set.get("m").and_then(|s| s.current()).is_some()
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_watcher_rescans_on_changes_only_not_on_reads_of_the_directory() {
        let dir = std::env::temp_dir().join(format!("fanout-models-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.onnx"), MODEL).unwrap();
        let cfg = ModelsConfig {
            dir: Some(fanout_config::Located::unknown(dir.display().to_string())),
            poll: Dur::secs(3600),
            settle: Dur::millis(0),
            ..ModelsConfig::default()
        };
        let set = Arc::new(ModelSet::open(&cfg, None).unwrap());
        set.watch().unwrap();
        // Reads of the directory (as every scan makes) are no change.
        for _ in 0..50 {
            let _ = std::fs::read_dir(&dir).unwrap().count();
            let _ = std::fs::read(dir.join("a.onnx")).unwrap();
        }
        // A change is: the new model is loaded on its event (the poll is an hour away).
        std::fs::write(dir.join(".b.tmp"), MODEL).unwrap();
        std::fs::rename(dir.join(".b.tmp"), dir.join("b.onnx")).unwrap();
        let t = Instant::now();
        while set.get("b").and_then(|s| s.current()).is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "b.onnx was not loaded"
            );
            std::thread::yield_now();
        }
        let scans = set.scans();
        // The scan at open, and a few for the temporary file's events and the rename (events
        // that arrive while a scan runs are merged into one wake-up): never one per read, and
        // never a scan woken by the previous scan's own reads (that loop makes dozens here).
        assert!(scans <= 8, "{scans} scans");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
