//! The model step (`model: {name, features | input}`): evaluates the features (jq) into one row
//! of numbers — one row per element with `for_each` — and queues the rows on the model's slot
//! ([`crate::runtime`]), which evaluates them in batches on the compute pool. The value is
//! [`crate::runtime::output_value`]'s: `{label, probabilities}` or `{value}` / `{values}`.
//!
//! The kind's line in the gateway's list of step kinds is [`STEP_KIND`] (`fanout-proxy`'s
//! `STEP_KINDS`); the model set it reads is the runtime [`crate::runtime::RUNTIME`].

use crate::runtime::{ModelSlot, RunError, kind_name};
use fanout_config::{ConfigError, Step};
use fanout_expr::{Expr, Num, Rc, Val, kind_phrase};
use fanout_flow::kind::{
    Env, ErrorClass, ErrorKind, FlowError, Prepared, Registration, SLOT_INDEX, SLOT_ITEM,
    SLOT_REQUEST, StepArgs, StepCx, StepIo, StepKind, StepWork, Yielded, eval, eval_item, expr_err,
    yielded,
};
use fanout_layers::outcome::CallClass;
use fanout_runtime::compute::ComputePool;
use futures_util::future::BoxFuture;
use std::cell::RefCell;
use std::sync::Arc;
use tokio::time::Instant;

/// A model's queue of waiting rows is full (503; gRPC `RESOURCE_EXHAUSTED`).
static MODEL_QUEUE_FULL: ErrorClass = ErrorClass {
    grpc: Some(fanout_grpc::Code::ResourceExhausted),
    ..ErrorClass::new("model_queue_full", 503, CallClass::RejectedPool)
};
/// A model failed to evaluate its input (500).
static MODEL_FAILED: ErrorClass = ErrorClass::new("model_failed", 500, CallClass::Other);
/// A row built from the client's data is not a row of numbers of the model's width — a
/// feature not a number, an input of the wrong length, also inside `for_each` (400).
static BAD_MODEL_INPUT: ErrorClass = ErrorClass::new("bad_model_input", 400, CallClass::Status4xx);

/// The `model` step kind: its line in the gateway's list of step kinds.
pub const STEP_KIND: Registration = Registration {
    compile,
    errors: &[&MODEL_QUEUE_FULL, &MODEL_FAILED, &BAD_MODEL_INPUT],
};

/// How a row is built; with each expression, whether what it gives is the client's data (it
/// reads only `$request`, or `$item`/`$index` of a `for_each` over `$request` alone): a bad
/// value is then the client's fault (400 `bad_model_input`), else the flow's (500).
enum Features {
    /// One expression per feature (the count checked against the model's width at load).
    Each(Vec<(Expr, bool)>),
    /// One expression giving the whole row (an array; its length checked per request).
    Row(Expr, bool),
}

/// A compiled `model` step.
struct ModelStep {
    slot: Arc<ModelSlot>,
    features: Features,
    compute: Arc<ComputePool>,
}

impl StepKind for ModelStep {
    fn work(&self) -> StepWork {
        let v = self.slot.current();
        let model = self.slot.name();
        let kind = v.as_ref().map_or("", |v| kind_name(v.model.kind()));
        let width = v.as_ref().map_or(0, |v| v.model.input_width());
        let version = v.as_ref().map(|v| v.hash.clone()).unwrap_or_default();
        StepWork {
            text: format!(
                "model {model} ({kind}, {width} features, version {version}) on the compute pool, batched with other requests' rows"
            ),
            label: format!("model {model} · {kind} · {width} features"),
            io: StepIo::Compute { per_item: "row" },
        }
    }

    fn prepare(
        &self,
        step: &StepArgs<'_>,
        env: &Env,
        items: Option<Arc<Vec<Val>>>,
        deadline: Instant,
    ) -> Result<Prepared, Yielded> {
        let name = step.name;
        // The version read now is the one the request runs on, whatever is swapped in later.
        let Some(version) = self.slot.current() else {
            return Ok(Prepared::Done(Err(FlowError::new(
                ErrorKind::Class(&MODEL_FAILED),
                format!("model `{}` has no loaded version", self.slot.name()),
            )
            .in_step(name))));
        };
        let width = version.model.input_width();
        let n = items.as_ref().map_or(1, |i| i.len());
        let mut rows = Vec::with_capacity(n * width);
        let one = |item: Option<(&Val, usize)>, rows: &mut Vec<f32>| {
            self.row(name, env, item, width, rows)
        };
        match &items {
            None => {
                if let Err(e) = one(None, &mut rows)? {
                    return Ok(Prepared::Done(Err(e)));
                }
            }
            Some(list) => {
                for (k, it) in list.iter().enumerate() {
                    if let Err(e) = one(Some((it, k)), &mut rows)? {
                        return Ok(Prepared::Done(Err(e)));
                    }
                }
            }
        }
        if n == 0 {
            return Ok(Prepared::Done(Ok(Val::Arr(Vec::new().into()))));
        }
        let (slot, compute, name) = (self.slot.clone(), self.compute.clone(), name.clone());
        let run = move |trace| -> BoxFuture<'static, Result<Vec<Val>, FlowError>> {
            fanout_layers::boxed::pinned(|| async move {
                // Queued from the worker that runs the step (never from a compute thread: a
                // `max_delay` timer needs the runtime).
                let rx = slot
                    .submit(version, rows, n, deadline.into_std(), &compute, trace)
                    .map_err(|e| run_error(&slot, &name, e))?;
                match rx.await {
                    Ok(Ok(vals)) => Ok(vals),
                    Ok(Err(e)) => Err(run_error(&slot, &name, e)),
                    Err(_) => Err(run_error(
                        &slot,
                        &name,
                        RunError::Pool(fanout_runtime::compute::ComputeError::Stopped),
                    )),
                }
            })
        };
        Ok(Prepared::Task(Box::new(run), items))
    }
}

impl ModelStep {
    /// Append one row's features to `rows`.
    fn row(
        &self,
        name: &Arc<str>,
        env: &Env,
        item: Option<(&Val, usize)>,
        width: usize,
        rows: &mut Vec<f32>,
    ) -> Result<Result<(), FlowError>, Yielded> {
        let ev = |e: &Expr| match item {
            Some((it, k)) => eval_item(e, env, &Val::Null, it, k),
            None => eval(e, env, &Val::Null),
        };
        match &self.features {
            Features::Each(list) => {
                for (i, (e, from_request)) in list.iter().enumerate() {
                    let v = match yielded(ev(e))? {
                        Ok(v) => v,
                        Err(e) => {
                            let what = format!("features[{i}]");
                            return Ok(Err(expr_err(name, &what, e)));
                        }
                    };
                    match number(&v) {
                        Some(x) => rows.push(x),
                        None => {
                            return Ok(Err(bad_feature(
                                name,
                                *from_request,
                                item,
                                format!("features[{i}] is {}, not a number", not_a_feature(&v)),
                            )));
                        }
                    }
                }
            }
            Features::Row(e, from_request) => {
                let v = match yielded(ev(e))? {
                    Ok(v) => v,
                    Err(e) => return Ok(Err(expr_err(name, "input", e))),
                };
                let Val::Arr(list) = &v else {
                    return Ok(Err(bad_feature(
                        name,
                        *from_request,
                        item,
                        format!(
                            "input is {}, not an array of {width} numbers",
                            kind_phrase(&v)
                        ),
                    )));
                };
                if list.len() != width {
                    return Ok(Err(bad_feature(
                        name,
                        *from_request,
                        item,
                        format!(
                            "input has {} values; model `{}` takes {width}",
                            list.len(),
                            self.slot.name()
                        ),
                    )));
                }
                if item.is_none() && LAST_ROW.with(|c| c.extend_if_same(list, rows)) {
                    return Ok(Ok(()));
                }
                let start = rows.len();
                for (i, x) in list.iter().enumerate() {
                    match number(x) {
                        Some(x) => rows.push(x),
                        None => {
                            return Ok(Err(bad_feature(
                                name,
                                *from_request,
                                item,
                                format!("input[{i}] is {}, not a number", not_a_feature(x)),
                            )));
                        }
                    }
                }
                if item.is_none() {
                    LAST_ROW.with(|c| c.keep(list, &rows[start..]));
                }
            }
        }
        Ok(Ok(()))
    }
}

/// The longest input row [`LAST_ROW`] keeps.
const LAST_ROW_MAX: usize = 256;

thread_local! {
    /// The last input row converted on this thread, with the array it came from. The model
    /// steps of one request that read the same array (ten models scoring `$request.body.features`)
    /// convert it once: the first step converts it, the next ones find the same array (the same
    /// allocation, which this keeps alive, so it cannot be another array at that address) and
    /// copy its numbers. One row of at most [`LAST_ROW_MAX`] numbers per thread.
    static LAST_ROW: LastRow = const { LastRow { row: RefCell::new(None) } };
}

/// An array, and its numbers as a model's input row.
type Converted = (Rc<Vec<Val>>, Vec<f32>);

struct LastRow {
    row: RefCell<Option<Converted>>,
}

impl LastRow {
    /// Append the kept numbers of `list` to `rows` when `list` is the array they came from.
    fn extend_if_same(&self, list: &Rc<Vec<Val>>, rows: &mut Vec<f32>) -> bool {
        match &*self.row.borrow() {
            Some((kept, numbers)) if Rc::ptr_eq(kept, list) => {
                rows.extend_from_slice(numbers);
                true
            }
            _ => false,
        }
    }

    /// Keep `numbers`, converted from `list` (its buffer reused).
    fn keep(&self, list: &Rc<Vec<Val>>, numbers: &[f32]) {
        if numbers.len() > LAST_ROW_MAX {
            return;
        }
        let Ok(mut row) = self.row.try_borrow_mut() else {
            return;
        };
        match &mut *row {
            Some((kept, buf)) => {
                *kept = list.clone();
                buf.clear();
                buf.extend_from_slice(numbers);
            }
            None => *row = Some((list.clone(), numbers.to_vec())),
        }
    }
}

/// A feature's number: numbers, booleans as 1 or 0, and `null` as a missing value (NaN: tree
/// ensembles take their missing-value branches; other models answer `null`).
fn number(v: &Val) -> Option<f32> {
    match v {
        Val::Null => Some(f32::NAN),
        Val::Num(n) => {
            let x = match n {
                Num::Int(i) => *i as f32,
                Num::Float(f) => *f as f32,
                // A literal kept as written: parsed from its text, without formatting it.
                Num::Dec(s) => s.parse::<f64>().ok()? as f32,
                Num::BigInt(_) => n.to_string().parse::<f64>().ok()? as f32,
            };
            x.is_finite().then_some(x)
        }
        Val::Bool(b) => Some(f32::from(u8::from(*b))),
        _ => None,
    }
}

/// What a value that is not a feature's number ([`number`]) is: a number is one out of a 32-bit
/// float's range.
fn not_a_feature(v: &Val) -> &'static str {
    match v {
        Val::Num(_) => "a number out of range",
        v => kind_phrase(v),
    }
}

/// A row that is not numbers of the model's width: the client's fault (400 `bad_model_input`)
/// when it came from the client's data, else the flow's (500). Inside `for_each`, the message
/// names the element (`$item` number `k`, from 0, as features and inputs are).
fn bad_feature(
    name: &Arc<str>,
    from_request: bool,
    item: Option<(&Val, usize)>,
    message: String,
) -> FlowError {
    let kind = if from_request {
        ErrorKind::Class(&BAD_MODEL_INPUT)
    } else {
        ErrorKind::Expression
    };
    let message = match item {
        Some((_, k)) => format!("element {k} of for_each: {message}"),
        None => message,
    };
    FlowError::new(kind, message).in_step(name)
}

fn run_error(slot: &ModelSlot, step: &Arc<str>, e: RunError) -> FlowError {
    let model = slot.name();
    match e {
        RunError::QueueFull(n) => FlowError::new(
            ErrorKind::Class(&MODEL_QUEUE_FULL),
            format!("model `{model}` has {n} rows waiting (models.batch.queue); try again"),
        ),
        RunError::Expired => FlowError::new(
            ErrorKind::DeadlineExceeded,
            format!("the deadline passed while waiting for model `{model}`"),
        ),
        RunError::Pool(e) => FlowError::new(ErrorKind::Overloaded, e.to_string()),
        RunError::Failed(detail) => {
            let mut e = FlowError::new(
                ErrorKind::Class(&MODEL_FAILED),
                format!("model `{model}` failed to evaluate the input"),
            );
            e.detail = Some(detail);
            e
        }
    }
    .in_step(step)
}

/// `model:`.
fn compile(sc: &mut StepCx<'_, '_>, step: &Step) -> Option<Option<Box<dyn StepKind>>> {
    let m = step.model.as_ref()?;
    let step_name = sc.name().value.clone();
    let item_ok = sc.in_each();
    let mut ok = true;
    // `$item`/`$index` are the client's data when the step's `for_each` reads `$request` alone.
    let only_request =
        |e: &Expr| !e.vars().is_empty() && e.vars().iter().all(|&v| v == SLOT_REQUEST);
    let items_from_request = step
        .for_each
        .as_ref()
        .is_some_and(|src| sc.compiled(src).is_some_and(only_request));
    let from_request = |e: &Expr| {
        !e.vars().is_empty()
            && e.vars().iter().all(|&v| {
                v == SLOT_REQUEST || (items_from_request && (v == SLOT_ITEM || v == SLOT_INDEX))
            })
    };
    let features = match (&m.input, m.features.is_empty()) {
        (Some(src), true) => match sc.expr(Some(src), item_ok) {
            Some(e) => {
                let r = from_request(&e);
                Some(Features::Row(e, r))
            }
            None => None,
        },
        (None, false) => {
            let mut list = Vec::with_capacity(m.features.len());
            for f in &m.features {
                match sc.expr(Some(f), item_ok) {
                    Some(e) => {
                        let r = from_request(&e);
                        list.push((e, r));
                    }
                    None => ok = false,
                }
            }
            Some(Features::Each(list))
        }
        _ => {
            sc.error(
                ConfigError::at(
                    m.name.pos,
                    format!("step `{step_name}`: a `model` step needs exactly one of `features` and `input`"),
                )
                .hint("`features: [.a, .b]` (one expression per feature) or `input: .row` (an array)"),
            );
            None
        }
    };
    let models = sc
        .runtimes()
        .get::<crate::runtime::ModelSet>()
        .map(|set| crate::runtime::slots(&set))
        .unwrap_or_default();
    let slot = match models.get(&m.name.value) {
        None => {
            let known: Vec<&str> = models.keys().map(String::as_str).collect();
            let close = fanout_config::closest(&m.name.value, known.iter().copied());
            let hint = match (&sc.config().models.dir, close) {
                (None, _) => "set `models.dir` to the directory of the NAME.onnx files".to_string(),
                (Some(_), Some(c)) => format!("did you mean `{c}`?"),
                (Some(d), None) if known.is_empty() => format!("`{}` holds no .onnx file", d.value),
                (Some(_), None) => format!("the models are: {}", known.join(", ")),
            };
            sc.error(
                ConfigError::at(
                    m.name.pos,
                    format!(
                        "step `{step_name}`: no model `{}` in models.dir",
                        m.name.value
                    ),
                )
                .hint(hint),
            );
            None
        }
        Some(slot) => match slot.current() {
            None => {
                let err = slot.last_error().unwrap_or_default();
                sc.error(ConfigError::at(
                    m.name.pos,
                    format!(
                        "step `{step_name}`: model `{}` did not load: {err}",
                        m.name.value
                    ),
                ));
                None
            }
            Some(v) => {
                if let Some(Features::Each(list)) = &features
                    && list.len() != v.model.input_width()
                {
                    sc.error(
                        ConfigError::at(
                            m.name.pos,
                            format!(
                                "step `{step_name}`: model `{}` takes {} features; the step gives {}",
                                m.name.value,
                                v.model.input_width(),
                                list.len()
                            ),
                        )
                        .hint("one expression per feature, in the order the model was trained on"),
                    );
                    ok = false;
                }
                Some(slot.clone())
            }
        },
    };
    let (Some(features), Some(slot), true) = (features, slot, ok) else {
        return Some(None);
    };
    Some(Some(Box::new(ModelStep {
        slot,
        features,
        compute: sc.compute().clone(),
    })))
}
