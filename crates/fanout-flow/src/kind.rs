//! What a crate needs to bring a step kind of its own (`sql` in its protocol's crate, `model`
//! in `fanout-model`): the [`StepKind`] trait, its compile context ([`StepCx`]), the
//! evaluation of expressions, performing one backend call and reading its answer, and the kind's
//! line ([`Registration`]) in the list of kinds the compiler is given ([`crate::compile_with`];
//! the gateway's is `fanout-proxy`'s `STEP_KINDS`). The engine's own kinds (`http`, keyed
//! lookups, `grpc`, `fail`, `value`) are made of the same parts.

pub use crate::call::{
    CallTarget, Env, FIRST_STEP_SLOT, MayYield, SLOT_INDEX, SLOT_ITEM, SLOT_REF, SLOT_REQUEST,
    Yielded, eval, eval_item, expr_err, fetch_answer, parse_answer, yielded,
};
pub use crate::ctx::unknown_backend;
pub use crate::error::{ErrorClass, ErrorKind, FlowError, INVALID_CALL};
pub use crate::plan::compile_flow;
pub use crate::step::{
    Compile, Prepared, Registration, StepArgs, StepCx, StepIo, StepKind, StepWork, Task,
    error_kinds, prepare_calls,
};
