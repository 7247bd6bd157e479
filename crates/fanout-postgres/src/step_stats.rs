//! The per-step counters of `sql` steps (rows received, errors by SQLSTATE class) and where the
//! metrics read them: [`StepCounters`], the runtime the `sql` kind registers each step's counters
//! with as it is compiled ([`STEP_COUNTERS`], a line in `fanout-proxy`'s `RUNTIMES`). The classes
//! are shared with the pool's per-database counters, so both count an error under the same name.

use crate::sqlstate::{SQLSTATE_CLASSES, class_index, sqlstate_of};
use fanout_flow::kind::FlowError;
use fanout_runtime::runtime::{Family, FamilyKind, Registration, Runtime, Sample};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

/// Counts of SQL errors by class.
#[derive(Debug, Default)]
pub struct ErrorsByClass([AtomicU64; SQLSTATE_CLASSES.len() + 1]);

impl ErrorsByClass {
    /// Count an error of SQLSTATE `state`.
    pub fn count(&self, state: &str) {
        if let Some(a) = self.0.get(class_index(state)) {
            a.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every class by name (then `other`), zero until counted.
    pub fn by_class(&self) -> Vec<(&'static str, u64)> {
        SQLSTATE_CLASSES
            .iter()
            .map(|(_, name)| *name)
            .chain(["other"])
            .zip(self.0.iter().map(|a| a.load(Ordering::Relaxed)))
            .collect()
    }
}

/// What one `sql` step received: rows in its answers, SQL errors by class. A cached or shared
/// answer counts for every step that received it.
#[derive(Debug, Default)]
pub struct SqlStats {
    rows: AtomicU64,
    errors: ErrorsByClass,
}

impl SqlStats {
    /// Rows received.
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// SQL errors received, by class.
    pub fn errors(&self) -> &ErrorsByClass {
        &self.errors
    }

    pub(crate) fn add_rows(&self, n: u64) {
        self.rows.fetch_add(n, Ordering::Relaxed);
    }

    /// Count `e` if the database answered it with a SQLSTATE.
    pub(crate) fn add_error(&self, e: &FlowError) {
        if let Some(state) = sqlstate_of(e) {
            self.errors.count(state);
        }
    }
}

/// One step's counters, with the names its series carry.
struct Counted {
    backend: Arc<str>,
    step: Arc<str>,
    stats: Arc<SqlStats>,
}

/// The counters of the `sql` steps of one config, by step identity (`METHOD PATH STEP`): each
/// step registers its own as it is compiled ([`StepCounters::register`]); the metrics read them
/// from here ([`Runtime::metrics`]: `fanout_db_step_rows`, `fanout_db_step_errors`). Opened anew
/// for every config; a reload's takes over the counters of the steps the new config keeps, so
/// their series continue.
#[derive(Default)]
pub struct StepCounters {
    steps: Mutex<BTreeMap<String, Counted>>,
    /// The counters of the config before (a reload), by step identity.
    before: HashMap<String, Arc<SqlStats>>,
}

/// The `sql` steps' counters as a runtime of the gateway: its line in `fanout-proxy`'s
/// `RUNTIMES`.
pub const STEP_COUNTERS: Registration = Registration {
    open: |_, prev| {
        let before = prev
            .and_then(|(_, r)| r.clone().as_any().downcast::<StepCounters>().ok())
            .map(|prev| {
                lock(&prev.steps)
                    .iter()
                    .map(|(k, c)| (k.clone(), c.stats.clone()))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Arc::new(StepCounters {
            steps: Mutex::default(),
            before,
        }))
    },
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl StepCounters {
    /// The counters of step `key` (`METHOD PATH STEP`), named `step` and calling `backend`:
    /// those it had under the config before, or new ones.
    pub(crate) fn register(
        &self,
        key: String,
        backend: &Arc<str>,
        step: &Arc<str>,
    ) -> Arc<SqlStats> {
        let stats = self.before.get(&key).cloned().unwrap_or_default();
        let counted = Counted {
            backend: backend.clone(),
            step: step.clone(),
            stats: stats.clone(),
        };
        lock(&self.steps).insert(key, counted);
        stats
    }
}

impl Runtime for StepCounters {
    fn start(self: Arc<Self>) -> Result<(), String> {
        Ok(())
    }

    fn status(&self, _: SystemTime) -> Vec<(&'static str, serde_json::Value)> {
        Vec::new()
    }

    /// Per step, summed over the routes that have a step of that name on that database (the
    /// labels of the other per-step families), every series from the start.
    fn metrics(&self, _: SystemTime) -> Vec<Family> {
        type Sums = (u64, Vec<(&'static str, u64)>);
        let mut sums: BTreeMap<(Arc<str>, Arc<str>), Sums> = BTreeMap::new();
        for c in lock(&self.steps).values() {
            let e = sums
                .entry((c.backend.clone(), c.step.clone()))
                .or_insert_with(|| (0, Vec::new()));
            e.0 += c.stats.rows();
            let errors = c.stats.errors().by_class();
            if e.1.is_empty() {
                e.1 = errors;
            } else {
                for (sum, (_, n)) in e.1.iter_mut().zip(errors) {
                    sum.1 += n;
                }
            }
        }
        let labels = |b: &str, s: &str| vec![("backend", b.to_string()), ("step", s.to_string())];
        vec![
            Family {
                name: "fanout_db_step_rows",
                help: "Rows received by each sql step (a cached or shared answer counts for every step it reaches)",
                kind: FamilyKind::Counter,
                samples: sums
                    .iter()
                    .map(|((b, s), (rows, _))| (labels(b, s), Sample::Counter(*rows)))
                    .collect(),
            },
            Family {
                name: "fanout_db_step_errors",
                help: "SQL errors received by each sql step, by SQLSTATE class",
                kind: FamilyKind::Counter,
                samples: sums
                    .iter()
                    .flat_map(|((b, s), (_, errors))| {
                        errors.iter().map(move |(class, n)| {
                            let mut l = labels(b, s);
                            l.push(("class", class.to_string()));
                            (l, Sample::Counter(*n))
                        })
                    })
                    .collect(),
            },
        ]
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlstate::{CONFLICT, DATABASE_BUSY};
    use fanout_flow::kind::ErrorKind;
    use fanout_layers::backend::{CallError, CallErrorKind};

    #[test]
    fn the_sqlstate_of_an_answer_or_a_failed_call_is_counted_by_class() {
        let stats = SqlStats::default();
        let mut conflict = FlowError::new(ErrorKind::Class(&CONFLICT), "conflict");
        conflict.detail = Some(r#"{"sqlstate":"23505","message":"duplicate key"}"#.into());
        let mut retry = FlowError::new(ErrorKind::Class(&DATABASE_BUSY), "try again");
        retry.source = Some(Arc::new(CallError::new(
            CallErrorKind::Timeout,
            "database `db`: could not serialize access (SQLSTATE 40001)",
        )));
        let plain = FlowError::new(
            ErrorKind::Class(&crate::step::DATABASE_UNAVAILABLE),
            "unreachable",
        );
        for e in [&conflict, &retry, &retry, &plain] {
            stats.add_error(e);
        }
        assert_eq!(sqlstate_of(&conflict), Some("23505"));
        assert_eq!(sqlstate_of(&plain), None);
        let counts = stats.errors().by_class();
        assert_eq!(counts.len(), SQLSTATE_CLASSES.len() + 1);
        let of = |name: &str| counts.iter().find(|(n, _)| *n == name).map(|(_, c)| *c);
        assert_eq!(of("integrity_constraint_violation"), Some(1));
        assert_eq!(of("transaction_rollback"), Some(2));
        assert_eq!(of("other"), Some(0));
        assert_eq!(class_index("XX000"), SQLSTATE_CLASSES.len());
    }

    /// A reload's counters take over those of the steps the new config keeps (by identity), and
    /// only those: a removed step's series end, a new step's start at zero.
    #[test]
    fn a_reload_keeps_the_counters_of_the_steps_it_keeps() {
        let cfg = fanout_config::Config::from_yaml("fanout.yaml", "routes: []\n", &|_: &str| None)
            .unwrap();
        let (db, s) = (Arc::<str>::from("db"), Arc::<str>::from("s"));
        let first = (STEP_COUNTERS.open)(&cfg, None).unwrap();
        let counters = first.clone().as_any().downcast::<StepCounters>().unwrap();
        counters.register("GET /a s".into(), &db, &s).add_rows(3);
        counters.register("GET /gone s".into(), &db, &s).add_rows(5);
        let rows = |r: &Arc<dyn Runtime>| match &r.metrics(SystemTime::now())[0].samples[..] {
            [(labels, Sample::Counter(n))] => (labels.clone(), *n),
            _ => panic!("one series expected"),
        };
        assert_eq!(
            rows(&first).1,
            8,
            "summed over the routes with a step `s` on `db`"
        );
        let second = (STEP_COUNTERS.open)(&cfg, Some((&cfg, &first))).unwrap();
        let kept = second.clone().as_any().downcast::<StepCounters>().unwrap();
        assert_eq!(kept.register("GET /a s".into(), &db, &s).rows(), 3);
        assert_eq!(kept.register("GET /new s".into(), &db, &s).rows(), 0);
        let (labels, n) = rows(&second);
        assert_eq!(n, 3);
        assert_eq!(
            labels,
            vec![("backend", "db".to_string()), ("step", "s".to_string())]
        );
    }
}
