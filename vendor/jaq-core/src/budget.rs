//! fanout: the evaluation budget (not part of upstream jaq).
//!
//! Every evaluation runs under a [`Scope`] installed on its thread. The interpreter charges
//! *ops* at every filter entry ([`enter`]) and for every value that flows through a loop
//! where no filter runs per element ([`tick`]); natives charge bulk work with [`charge`]
//! (e.g. one op per 256 bytes copied). Ops are granted in chunks of [`CHUNK`] from a
//! [`Shared`] budget (one per request, shared by threads); the deadline and the cancel flag
//! are checked at each grant. Size and depth limits ([`Limits`]) are read by the sites that
//! build values. The interpreter's recursion is guarded by the remaining stack.
//!
//! A stop ([`Stop`]) is *sticky*: once a limit is hit, every later charge of the scope fails,
//! so an error caught by `try` cannot let the evaluation continue. Natives that can only
//! return an ordinary error record the stop with [`fail`] and return [`Stop::error`].
//!
//! Without an installed scope, a thread uses a default budget of [`DEFAULT_MAX_OPS`] ops
//! (never replenished) and the default limits.

use alloc::string::String;
use core::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// Ops granted at a time; the deadline and the cancel flag are checked at each grant.
pub const CHUNK: u64 = 1024;
/// Ops of a thread that runs filters without an installed [`Scope`].
pub const DEFAULT_MAX_OPS: u64 = 10_000_000;
/// Stack kept free below the interpreter's recursion, plus [`STACK_PER_LEVEL`] per level of
/// `max_depth` (walks over values recurse once per level).
pub const STACK_RED_ZONE: usize = 128 * 1024;
/// Stack reserved per level of value nesting (see [`STACK_RED_ZONE`]).
pub const STACK_PER_LEVEL: usize = 384;

/// Size and depth limits of values built during an evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// No value may be nested deeper than this (scalars have depth 0, `[]` depth 1).
    pub max_depth: usize,
    /// No array or object may have more elements than this.
    pub max_elements: usize,
    /// No string may be longer than this many bytes.
    pub max_string_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_depth: 128,
            max_elements: 1_000_000,
            max_string_bytes: 16 << 20,
        }
    }
}

/// Why an evaluation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The shared ops budget is used up.
    Ops,
    /// The scope's own cap of ops (see [`Scope::enter`] `yield_at`) is used up.
    Yield,
    /// [`Shared::cancel`] was called.
    Cancelled,
    /// The deadline passed.
    Deadline,
    /// A value would be nested deeper than `max_depth`.
    TooDeep,
    /// The interpreter's recursion exhausted the stack.
    Stack,
    /// A string of this many bytes would exceed `max_string_bytes`.
    String(usize),
    /// An array or object of this many elements would exceed `max_elements`.
    Elements(usize),
}

impl Stop {
    /// An ordinary jaq error describing the stop (the scope's stop is what counts).
    pub fn error<V: From<String>>(self) -> crate::Error<V> {
        crate::Error::str(alloc::format!("evaluation stopped: {self:?}"))
    }

    /// The same as an exception.
    pub fn exn<'a, V: From<String>>(self) -> crate::Exn<'a, V> {
        crate::Exn::from(self.error())
    }
}

/// A budget shared by every evaluation of one request (and so by threads).
#[derive(Debug)]
pub struct Shared {
    max_ops: u64,
    used: AtomicU64,
    cancelled: AtomicBool,
    deadline: Option<Instant>,
}

impl Shared {
    /// A budget of `max_ops` ops, optionally until `deadline`.
    pub fn new(max_ops: u64, deadline: Option<Instant>) -> Self {
        Self {
            max_ops,
            used: AtomicU64::new(0),
            cancelled: AtomicBool::new(false),
            deadline,
        }
    }

    /// Make every evaluation using this budget stop at its next check.
    pub fn cancel(&self) {
        self.cancelled.store(true, Relaxed)
    }

    /// Whether [`Self::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Relaxed)
    }

    /// Ops used so far (granted to evaluations minus what they gave back).
    pub fn used_ops(&self) -> u64 {
        self.used.load(Relaxed).min(self.max_ops)
    }

    /// The ops budget.
    pub fn max_ops(&self) -> u64 {
        self.max_ops
    }

    /// The deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Take up to `n` ops; returns how many were taken.
    fn take(&self, n: u64) -> u64 {
        let prev = self.used.fetch_add(n, Relaxed);
        let avail = self.max_ops.saturating_sub(prev);
        if avail < n {
            // give back what is over the budget
            self.used.fetch_sub(n - avail, Relaxed);
        }
        avail.min(n)
    }
}

/// State read on every charge: const-initialised, no destructor (cheap thread-local access).
struct Hot {
    /// Ops left in the current grant (already counted as used in [`Shared`]); 0 → slow path.
    left: Cell<u64>,
    /// Lowest stack address the interpreter may recurse to; `usize::MAX` until known.
    floor: Cell<usize>,
    /// The first stop of the current scope.
    stopped: Cell<Option<Stop>>,
    /// Whether a scope is installed (bulk charges of comparisons apply only then).
    active: Cell<bool>,
    max_depth: Cell<usize>,
    max_elements: Cell<usize>,
    max_string_bytes: Cell<usize>,
    /// Nesting level of the value being updated by `|=`, `=`, … (see [`Level`]).
    level: Cell<usize>,
    /// Units of [`work`] not yet charged.
    pending: Cell<usize>,
}

struct Cold {
    shared: Option<Arc<Shared>>,
    /// Ops the scope may still be granted (its own cap).
    local_left: u64,
    /// Whether reaching the scope's own cap is [`Stop::Yield`] (else [`Stop::Ops`]).
    yields: bool,
}

std::thread_local! {
    static HOT: Hot = const {
        Hot {
            left: Cell::new(0),
            floor: Cell::new(usize::MAX),
            stopped: Cell::new(None),
            active: Cell::new(false),
            max_depth: Cell::new(128),
            max_elements: Cell::new(1_000_000),
            max_string_bytes: Cell::new(16 << 20),
            level: Cell::new(0),
            pending: Cell::new(0),
        }
    };
    static COLD: RefCell<Cold> = const {
        RefCell::new(Cold { shared: None, local_left: 0, yields: false })
    };
}

/// An approximation of the stack pointer (the address of a local).
#[inline(always)]
fn stack_pointer() -> usize {
    let marker = 0u8;
    core::ptr::addr_of!(marker) as usize
}

/// Record a stop (the first one of a scope wins) and return the recorded one.
#[cold]
pub fn fail(stop: Stop) -> Stop {
    HOT.with(|h| {
        h.left.set(0);
        match h.stopped.get() {
            Some(s) => s,
            None => {
                h.stopped.set(Some(stop));
                stop
            }
        }
    })
}

/// The stop of the current scope, if any.
pub fn stopped() -> Option<Stop> {
    HOT.with(|h| h.stopped.get())
}

/// The limits in force on this thread.
#[inline]
pub fn limits() -> Limits {
    HOT.with(|h| Limits {
        max_depth: h.max_depth.get(),
        max_elements: h.max_elements.get(),
        max_string_bytes: h.max_string_bytes.get(),
    })
}

/// `max_depth` in force on this thread.
#[inline]
pub fn max_depth() -> usize {
    HOT.with(|h| h.max_depth.get())
}

/// Charge one op and check the stack: at every entry of the interpreter's recursion.
#[inline(always)]
pub fn enter() -> Result<(), Stop> {
    HOT.with(|h| {
        let n = h.left.get();
        let sp = stack_pointer();
        if n != 0 && sp > h.floor.get() {
            h.left.set(n - 1);
            Ok(())
        } else {
            slow_enter(h, sp)
        }
    })
}

#[cold]
#[inline(never)]
fn slow_enter(h: &Hot, sp: usize) -> Result<(), Stop> {
    if h.floor.get() == usize::MAX {
        set_floor(h, sp);
    }
    if sp <= h.floor.get() {
        return Err(fail(Stop::Stack));
    }
    let n = h.left.get();
    if n != 0 {
        h.left.set(n - 1);
        return Ok(());
    }
    charge_slow(h, 1)
}

/// Charge one op (a value flowing through a loop).
#[inline(always)]
pub fn tick() -> Result<(), Stop> {
    HOT.with(|h| {
        let n = h.left.get();
        if n != 0 {
            h.left.set(n - 1);
            Ok(())
        } else {
            charge_slow(h, 1)
        }
    })
}

/// Charge `n` ops of bulk work.
#[inline]
pub fn charge(n: u64) -> Result<(), Stop> {
    HOT.with(|h| {
        let left = h.left.get();
        if n <= left && left != 0 {
            h.left.set(left - n);
            Ok(())
        } else {
            charge_slow(h, n)
        }
    })
}

/// Charge one op per `per` units of work when `units` is large (small work is covered by
/// the op that does it).
#[inline]
pub fn charge_units(units: usize, per: usize) -> Result<(), Stop> {
    if units >= per.saturating_mul(8) {
        charge((units / per) as u64)
    } else {
        Ok(())
    }
}

/// Charge bulk work of an infallible operation (comparisons, hashing) when a scope is
/// installed; returns `true` if the budget is exhausted (the caller may cut its work short).
#[inline]
pub fn charge_quiet(units: usize, per: usize) -> bool {
    if units < per.saturating_mul(8) {
        return false;
    }
    HOT.with(|h| h.active.get()) && charge((units / per) as u64).is_err()
}

/// Record `units` of work of an infallible walk over values (comparing, hashing, checking
/// depth: one unit per element visited); one op is charged per 8 units. Only counts when a
/// scope is installed. Returns `true` if the budget is exhausted (the caller may cut its work
/// short if that keeps its result meaningful).
#[inline]
pub fn work(units: usize) -> bool {
    HOT.with(|h| {
        if !h.active.get() {
            return false;
        }
        let p = h.pending.get() + units;
        if p < 1024 {
            h.pending.set(p);
            return false;
        }
        h.pending.set(0);
        let n = (p / 8) as u64;
        let left = h.left.get();
        if n <= left && left != 0 {
            h.left.set(left - n);
            false
        } else {
            charge_slow(h, n).is_err()
        }
    })
}

/// Whether the current scope has stopped.
#[inline]
pub fn exhausted() -> bool {
    HOT.with(|h| h.stopped.get().is_some())
}

fn set_floor(h: &Hot, sp: usize) {
    // asked once per scope: the stack may be a segment made by `stacker::grow`
    let limit = match stacker::remaining_stack() {
        Some(r) => sp.saturating_sub(r),
        // unknown: assume 1 MiB below here
        None => sp.saturating_sub(1 << 20),
    };
    let reserve = STACK_RED_ZONE + h.max_depth.get().saturating_mul(STACK_PER_LEVEL);
    h.floor.set(limit.saturating_add(reserve));
}

#[cold]
#[inline(never)]
fn charge_slow(h: &Hot, n: u64) -> Result<(), Stop> {
    if let Some(s) = h.stopped.get() {
        return Err(s);
    }
    let left = h.left.get();
    let need = n - left.min(n);
    let active = h.active.get();
    let r = COLD.with(|c| {
        let mut c = c.borrow_mut();
        let Cold {
            shared,
            local_left,
            yields,
            ..
        } = &mut *c;
        if shared.is_none() && !active {
            // no scope installed: a default budget for this thread
            *shared = Some(Arc::new(Shared::new(DEFAULT_MAX_OPS, None)));
            *local_left = u64::MAX;
        }
        if let Some(s) = shared {
            if s.is_cancelled() {
                return Err(Stop::Cancelled);
            }
            if let Some(d) = s.deadline {
                if Instant::now() >= d {
                    return Err(Stop::Deadline);
                }
            }
        }
        let want = need.max(CHUNK).min(*local_left);
        let got = match shared {
            Some(s) => s.take(want),
            None => want,
        };
        *local_left -= got;
        if got < need {
            h.left.set(0);
            let shared_left = shared.as_ref().is_none_or(|s| s.used_ops() < s.max_ops);
            return Err(if got == want && *yields && shared_left {
                Stop::Yield
            } else {
                Stop::Ops
            });
        }
        h.left.set(got - need);
        Ok(())
    });
    r.map_err(fail)
}

/// Check that a string of `n` bytes may be built.
#[inline]
pub fn check_string(n: usize) -> Result<(), Stop> {
    if n > HOT.with(|h| h.max_string_bytes.get()) {
        Err(fail(Stop::String(n)))
    } else {
        Ok(())
    }
}

/// Check that an array or object of `n` elements may be built.
#[inline]
pub fn check_elements(n: usize) -> Result<(), Stop> {
    if n > HOT.with(|h| h.max_elements.get()) {
        Err(fail(Stop::Elements(n)))
    } else {
        Ok(())
    }
}

/// An evaluation's budget, installed on its thread until dropped.
pub struct Scope {
    prev_active: bool,
    prev_limits: Limits,
    prev_shared: Option<Arc<Shared>>,
    prev_local: u64,
    prev_yields: bool,
    prev_stopped: Option<Stop>,
    prev_left: u64,
    prev_level: usize,
}

impl Scope {
    /// Install a scope: ops come from `shared` (if given), at most `cap` of them for this
    /// scope; when the cap is reached the stop is [`Stop::Yield`] if `yields`, else
    /// [`Stop::Ops`].
    pub fn enter(shared: Option<Arc<Shared>>, limits: Limits, cap: u64, yields: bool) -> Scope {
        // the first grant (the deadline is checked at the next one)
        let first = CHUNK.min(cap);
        let first = match &shared {
            Some(s) if s.is_cancelled() => 0,
            Some(s) => s.take(first),
            None => first,
        };
        let (prev_shared, prev_local, prev_yields) = COLD.with(|c| {
            let mut c = c.borrow_mut();
            let prev = (c.shared.take(), c.local_left, c.yields);
            c.shared = shared;
            c.local_left = cap - first;
            c.yields = yields;
            prev
        });
        HOT.with(|h| {
            let prev_limits = Limits {
                max_depth: h.max_depth.get(),
                max_elements: h.max_elements.get(),
                max_string_bytes: h.max_string_bytes.get(),
            };
            let scope = Scope {
                prev_active: h.active.replace(true),
                prev_limits,
                prev_shared,
                prev_local,
                prev_yields,
                prev_stopped: h.stopped.replace(None),
                prev_left: h.left.replace(first),
                prev_level: h.level.replace(0),
            };
            h.pending.set(0);
            h.max_depth.set(limits.max_depth);
            h.max_elements.set(limits.max_elements);
            h.max_string_bytes.set(limits.max_string_bytes);
            // recompute the stack floor for this `max_depth`
            h.floor.set(usize::MAX);
            scope
        })
    }

    /// Why the evaluation stopped, if it did.
    pub fn stopped(&self) -> Option<Stop> {
        stopped()
    }

    /// Tell the scope how much stack is left here (e.g. from `stacker::remaining_stack`),
    /// which it would otherwise ask for at its first check.
    pub fn stack_remaining(&self, remaining: usize) {
        let sp = stack_pointer();
        HOT.with(|h| {
            let reserve = STACK_RED_ZONE + h.max_depth.get().saturating_mul(STACK_PER_LEVEL);
            h.floor
                .set(sp.saturating_sub(remaining).saturating_add(reserve));
        })
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let left = HOT.with(|h| {
            let left = h.left.replace(self.prev_left);
            h.active.set(self.prev_active);
            h.stopped.set(self.prev_stopped);
            h.level.set(self.prev_level);
            h.max_depth.set(self.prev_limits.max_depth);
            h.max_elements.set(self.prev_limits.max_elements);
            h.max_string_bytes.set(self.prev_limits.max_string_bytes);
            h.floor.set(usize::MAX);
            left
        });
        COLD.with(|c| {
            let mut c = c.borrow_mut();
            if let Some(s) = &c.shared {
                // give back the unused part of the last grant
                s.used.fetch_sub(left, Relaxed);
            }
            c.shared = self.prev_shared.take();
            c.local_left = self.prev_local;
            c.yields = self.prev_yields;
        });
    }
}

/// The nesting level of the value an update (`|=`, `=`, `+=`, …) is working on, relative to
/// the value being updated: paths step into children with [`Level::down`].
pub struct Level(());

impl Level {
    /// Step one level down (until the guard is dropped); fails if that is deeper than
    /// `max_depth` (no value there could exist or be created).
    #[inline]
    pub fn down() -> Result<Level, Stop> {
        HOT.with(|h| {
            let l = h.level.get() + 1;
            if l > h.max_depth.get() {
                return Err(fail(Stop::TooDeep));
            }
            h.level.set(l);
            Ok(Level(()))
        })
    }

    /// The current level.
    #[inline]
    pub fn get() -> usize {
        HOT.with(|h| h.level.get())
    }
}

impl Drop for Level {
    #[inline]
    fn drop(&mut self) {
        HOT.with(|h| h.level.set(h.level.get().saturating_sub(1)))
    }
}
