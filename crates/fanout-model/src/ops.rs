//! The operators other than tree ensembles: the dense ops of exported MLPs (default domain) and
//! the linear ops of ai.onnx.ml. Numerics follow onnxruntime's CPU kernels (f32 throughout, the
//! same post transforms), so outputs agree with it to about 1e-7.

use crate::attrs::{Attrs, index};
use crate::tensor::{Data, Tensor, elements};
use crate::{Cap, OpError};

/// `post_transform` of the ai.onnx.ml operators.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Post {
    None,
    Logistic,
    Softmax,
    SoftmaxZero,
    Probit,
}

impl Post {
    pub fn parse(s: &str) -> Result<Post, OpError> {
        Ok(match s {
            "NONE" => Post::None,
            "LOGISTIC" => Post::Logistic,
            "SOFTMAX" => Post::Softmax,
            "SOFTMAX_ZERO" => Post::SoftmaxZero,
            "PROBIT" => Post::Probit,
            _ => return Err(OpError(format!("post_transform {s:?} is not supported"))),
        })
    }

    /// Applies the transform to one row of scores (onnxruntime's `write_scores` for 2+ scores).
    pub fn apply(self, row: &mut [f32]) {
        match self {
            Post::None => {}
            Post::Logistic => row.iter_mut().for_each(|v| *v = logistic(*v)),
            Post::Probit => row.iter_mut().for_each(|v| *v = probit(*v)),
            Post::Softmax => softmax(row),
            Post::SoftmaxZero => softmax_zero(row),
        }
    }
}

/// `a · b + acc` rounded once, as a fused multiply-add: what onnxruntime's GEMM kernels (MLAS,
/// FMA on every x86-64 CPU since 2013 and on ARM64) compute for each product of a dot product,
/// summed in order. Past the largest float it differs from a product then a sum: `3.4e38 · 2`
/// is not an infinity before it is added, so `inf + -inf` (NaN) never arises from finite
/// numbers — an MLP given the largest floats answers onnxruntime's label and probabilities
/// (`1`, `1.0`), not `null`. Computed in f64, where the f32 product is exact; one rounding to
/// f32 after the sum (a double rounding, 1 ulp away from the fused result once in ~2²⁹ sums).
/// `f32::mul_add` would be exact too, but without the `fma` target feature it is a call into
/// libm, 20 times slower than this.
#[inline(always)]
pub(crate) fn fused(a: f32, b: f32, acc: f32) -> f32 {
    (f64::from(a) * f64::from(b) + f64::from(acc)) as f32
}

/// onnxruntime's `ComputeLogistic`.
pub(crate) fn logistic(val: f32) -> f32 {
    let v = 1.0 / (1.0 + (-val.abs()).exp());
    if val < 0.0 { 1.0 - v } else { v }
}

/// onnxruntime's `ComputeProbit` (with its approximate inverse error function).
pub(crate) fn probit(val: f32) -> f32 {
    let x = 2.0 * val - 1.0;
    let sgn = if x < 0.0 { -1.0f32 } else { 1.0 };
    let x = (1.0 - x) * (1.0 + x);
    let log = x.ln();
    let v = 2.0 / (std::f32::consts::PI * 0.147) + 0.5 * log;
    let v2 = 1.0 / 0.147 * log;
    let v3 = -v + (v * v - v2).sqrt();
    std::f32::consts::SQRT_2 * sgn * v3.sqrt()
}

/// Softmax of one row, with the maximum subtracted first.
pub(crate) fn softmax(row: &mut [f32]) {
    let max = row
        .iter()
        .fold(-f32::MAX, |m, &v| if v > m { v } else { m });
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    row.iter_mut().for_each(|v| *v /= sum);
}

/// onnxruntime's `ComputeSoftmaxZero`: zeros stay (scaled) zeros.
fn softmax_zero(row: &mut [f32]) {
    let max = row
        .iter()
        .fold(-f32::MAX, |m, &v| if v > m { v } else { m });
    let exp_neg_max = (-max).exp();
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        if *v > 0.000_000_1 || *v < -0.000_000_1 {
            *v = (*v - max).exp();
            sum += *v;
        } else {
            *v *= exp_neg_max;
        }
    }
    row.iter_mut().for_each(|v| *v /= sum);
}

/// An element-wise binary operator with numpy broadcasting.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

/// `Normalizer`'s norm.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Norm {
    Max,
    L1,
    L2,
}

/// A linear model's weights: `scores = x · coefficientsᵀ + intercepts`.
#[derive(Clone, Debug)]
pub(crate) struct Linear {
    /// `targets × features`, row-major.
    pub coefficients: Vec<f32>,
    pub intercepts: Vec<f32>,
    pub targets: usize,
    pub features: usize,
    pub post: Post,
}

impl Linear {
    fn new(
        coefficients: &[f32],
        intercepts: &[f32],
        targets: usize,
        post: Post,
    ) -> Result<Linear, OpError> {
        if targets == 0 || coefficients.is_empty() || !coefficients.len().is_multiple_of(targets) {
            return Err(OpError(format!(
                "{} coefficients do not make {targets} rows",
                coefficients.len()
            )));
        }
        let intercepts = match intercepts.len() {
            0 => vec![0.0; targets],
            n if n == targets => intercepts.to_vec(),
            n => return Err(OpError(format!("{n} intercepts for {targets} targets"))),
        };
        Ok(Linear {
            coefficients: coefficients.to_vec(),
            intercepts,
            targets,
            features: coefficients.len() / targets,
            post,
        })
    }

    /// Raw scores, `rows × targets`.
    fn scores(&self, x: &Tensor) -> Result<(usize, Vec<f32>), OpError> {
        let (rows, cols) = x.as_matrix()?;
        if cols != self.features {
            return Err(OpError(format!(
                "input has {cols} columns, the coefficients {}",
                self.features
            )));
        }
        let xs = x.floats()?;
        let mut out = Vec::with_capacity(rows * self.targets);
        for r in xs.chunks_exact(cols.max(1)).take(rows) {
            for (t, w) in self.coefficients.chunks_exact(cols.max(1)).enumerate() {
                // Products then sums (vectorised); only a sum that overflowed is computed again
                // as onnxruntime's fused multiply-adds ([`fused`]): the two differ only there.
                let mut dot = r.iter().zip(w).fold(0.0f32, |s, (a, b)| s + a * b);
                if !dot.is_finite() {
                    dot = r.iter().zip(w).fold(0.0f32, |s, (a, b)| fused(*a, *b, s));
                }
                out.push(dot + self.intercepts[t]);
            }
        }
        Ok((rows, out))
    }
}

/// The element type a `Cast` makes; booleans are integer tensors of 0 and 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum CastTo {
    Float,
    Int,
    Bool,
}

/// An operator other than the tree ensembles, with its attributes parsed.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Identity,
    Cast(CastTo),
    Reshape {
        allow_zero: bool,
    },
    Flatten {
        axis: i64,
    },
    MatMul,
    Gemm {
        alpha: f32,
        beta: f32,
        trans_a: bool,
        trans_b: bool,
    },
    Binary(Binary),
    Relu,
    Sigmoid,
    Tanh,
    Exp,
    Reciprocal,
    /// `Not` of a boolean (0/1 integer) tensor.
    Not,
    Concat {
        axis: i64,
    },
    /// `ReduceSum`; `axes` from the attribute before opset 13, else from the second input.
    ReduceSum {
        axes: Option<Vec<i64>>,
        keepdims: bool,
        noop_with_empty_axes: bool,
    },
    /// `Softmax`; `legacy` for opset < 13 (coerced to 2-D at `axis`).
    Softmax {
        axis: i64,
        legacy: bool,
    },
    ArgMax {
        axis: i64,
        keepdims: bool,
        last: bool,
    },
    ArrayFeatureExtractor,
    Scaler {
        offset: Vec<f32>,
        scale: Vec<f32>,
    },
    Normalizer(Norm),
    LinearClassifier {
        linear: Linear,
        labels: Vec<i64>,
    },
    LinearRegressor(Linear),
}

impl Op {
    /// Parses the operator of a default-domain node; `None` for an operator not implemented.
    pub fn standard(op: &str, a: &Attrs<'_>, opset: i64) -> Result<Option<Op>, OpError> {
        Ok(Some(match op {
            "Identity" => Op::Identity,
            "Cast" => Op::Cast(match a.int("to", 0) {
                1 | 11 => CastTo::Float,
                6 | 7 => CastTo::Int,
                9 => CastTo::Bool,
                t => {
                    return Err(OpError(format!(
                        "Cast to element type {t} is not supported"
                    )));
                }
            }),
            "Reshape" => Op::Reshape {
                allow_zero: a.int("allowzero", 0) != 0,
            },
            "Flatten" => Op::Flatten {
                axis: a.int("axis", 1),
            },
            "MatMul" => Op::MatMul,
            "Gemm" => Op::Gemm {
                alpha: a.float("alpha", 1.0),
                beta: a.float("beta", 1.0),
                trans_a: a.int("transA", 0) != 0,
                trans_b: a.int("transB", 0) != 0,
            },
            "Add" => Op::Binary(Binary::Add),
            "Sub" => Op::Binary(Binary::Sub),
            "Mul" => Op::Binary(Binary::Mul),
            "Div" => Op::Binary(Binary::Div),
            "Relu" => Op::Relu,
            "Sigmoid" => Op::Sigmoid,
            "Tanh" => Op::Tanh,
            "Exp" => Op::Exp,
            "Reciprocal" => Op::Reciprocal,
            "Not" => Op::Not,
            "Concat" => {
                if !a.has("axis") {
                    return Err(OpError("Concat without an axis".into()));
                }
                Op::Concat {
                    axis: a.int("axis", 0),
                }
            }
            "ReduceSum" => Op::ReduceSum {
                axes: (opset < 13).then(|| a.ints("axes").to_vec()),
                keepdims: a.int("keepdims", 1) != 0,
                noop_with_empty_axes: a.int("noop_with_empty_axes", 0) != 0,
            },
            "Softmax" => Op::Softmax {
                axis: a.int("axis", if opset >= 13 { -1 } else { 1 }),
                legacy: opset < 13,
            },
            "ArgMax" => Op::ArgMax {
                axis: a.int("axis", 0),
                keepdims: a.int("keepdims", 1) != 0,
                last: a.int("select_last_index", 0) != 0,
            },
            _ => return Ok(None),
        }))
    }

    /// Parses the operator of an ai.onnx.ml node other than the tree ensembles.
    pub fn ml(op: &str, a: &Attrs<'_>) -> Result<Option<Op>, OpError> {
        Ok(Some(match op {
            "ArrayFeatureExtractor" => Op::ArrayFeatureExtractor,
            "Scaler" => Op::Scaler {
                offset: a.floats("offset").to_vec(),
                scale: a.floats("scale").to_vec(),
            },
            "Normalizer" => Op::Normalizer(match a.string("norm", "MAX")?.as_str() {
                "MAX" => Norm::Max,
                "L1" => Norm::L1,
                "L2" => Norm::L2,
                n => return Err(OpError(format!("norm {n:?} is not supported"))),
            }),
            "LinearClassifier" => {
                if a.has("classlabels_strings") {
                    return Err(OpError("string class labels are not supported".into()));
                }
                let intercepts = a.floats("intercepts");
                let labels = a.ints("classlabels_ints").to_vec();
                let targets = if intercepts.is_empty() {
                    labels.len()
                } else {
                    intercepts.len()
                };
                let linear = Linear::new(
                    a.floats("coefficients"),
                    intercepts,
                    targets,
                    Post::parse(&a.string("post_transform", "NONE")?)?,
                )?;
                if targets == 1 && labels.len() == 2 && linear.post == Post::Probit {
                    return Err(OpError(
                        "a binary classifier of one score row with post_transform PROBIT is not supported".into(),
                    ));
                }
                if targets > 1 && labels.len() != targets {
                    return Err(OpError(format!(
                        "{} class labels for {targets} score rows",
                        labels.len()
                    )));
                }
                Op::LinearClassifier { linear, labels }
            }
            "LinearRegressor" => {
                let targets = index(a.int("targets", 1), "targets")?;
                Op::LinearRegressor(Linear::new(
                    a.floats("coefficients"),
                    a.floats("intercepts"),
                    targets,
                    Post::parse(&a.string("post_transform", "NONE")?)?,
                )?)
            }
            _ => return Ok(None),
        }))
    }

    /// Number of outputs the operator produces.
    pub fn outputs(&self) -> usize {
        match self {
            Op::LinearClassifier { .. } => 2,
            _ => 1,
        }
    }

    /// Evaluates the operator on its inputs (`None` for an omitted optional input); a tensor it
    /// would compute of more than `limit` elements is an error, found before it is allocated.
    pub fn eval(&self, inputs: &[Option<&Tensor>], limit: Cap<'_>) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        Ok(vec![match self {
            Op::Identity => x.clone(),
            Op::Cast(to) => match (&x.data, to) {
                (Data::F32(v), CastTo::Int) => {
                    Tensor::i64(x.shape.clone(), v.iter().map(|&f| f as i64).collect())
                }
                // NaN is true, as in C++.
                (Data::F32(v), CastTo::Bool) => Tensor::i64(
                    x.shape.clone(),
                    v.iter().map(|&f| i64::from(f != 0.0)).collect(),
                ),
                (Data::I64(v), CastTo::Bool) => Tensor::i64(
                    x.shape.clone(),
                    v.iter().map(|&i| i64::from(i != 0)).collect(),
                ),
                (Data::I64(v), CastTo::Float) => {
                    Tensor::f32(x.shape.clone(), v.iter().map(|&i| i as f32).collect())
                }
                _ => x.clone(),
            },
            Op::Reshape { allow_zero } => {
                reshape(x, input(inputs, 1)?.ints()?, *allow_zero, limit)?
            }
            Op::Flatten { axis } => {
                let axis = norm_axis(*axis, x.shape.len() + 1)?;
                let outer = x.shape[..axis].iter().product();
                let inner = x.shape[axis..].iter().product();
                Tensor {
                    shape: vec![outer, inner],
                    data: x.data.clone(),
                }
            }
            Op::MatMul => {
                let b = input(inputs, 1)?;
                let (m, k) = match x.shape.as_slice() {
                    [m, k] => (*m, *k),
                    s => {
                        return Err(OpError(format!(
                            "MatMul of a tensor of shape {s:?} is not supported"
                        )));
                    }
                };
                let (k2, n) = match b.shape.as_slice() {
                    [k2, n] => (*k2, *n),
                    s => {
                        return Err(OpError(format!(
                            "MatMul by a tensor of shape {s:?} is not supported"
                        )));
                    }
                };
                if k != k2 {
                    return Err(OpError(format!("MatMul of {m}×{k} by {k2}×{n}")));
                }
                Tensor::f32(
                    vec![m, n],
                    matmul(x.floats()?, b.floats()?, (m, k, n), (false, false), limit)?,
                )
            }
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            } => gemm(
                x,
                input(inputs, 1)?,
                inputs.get(2).copied().flatten(),
                *alpha,
                *beta,
                (*trans_a, *trans_b),
                limit,
            )?,
            Op::Binary(op) => broadcast(*op, x, input(inputs, 1)?, limit)?,
            // NaN stays NaN, as in onnxruntime (`f32::max` would make it 0).
            Op::Relu => map(x, |v| if v < 0.0 { 0.0 } else { v })?,
            // exp(-|v|) only: never an infinity in the sum, never 1/inf.
            Op::Sigmoid => map(x, logistic)?,
            Op::Tanh => map(x, f32::tanh)?,
            Op::Exp => map(x, f32::exp)?,
            Op::Reciprocal => map(x, |v| 1.0 / v)?,
            Op::Not => Tensor::i64(
                x.shape.clone(),
                x.ints()?.iter().map(|&i| i64::from(i == 0)).collect(),
            ),
            Op::Concat { axis } => concat(inputs, *axis, limit)?,
            Op::ReduceSum {
                axes,
                keepdims,
                noop_with_empty_axes,
            } => {
                let axes = match (axes, inputs.get(1).copied().flatten()) {
                    (Some(a), _) => a.as_slice(),
                    (None, Some(t)) => t.ints()?,
                    (None, None) => &[],
                };
                if axes.is_empty() && *noop_with_empty_axes {
                    x.clone()
                } else {
                    reduce_sum(x, axes, *keepdims, limit)?
                }
            }
            Op::Softmax { axis, legacy } => {
                let rank = x.shape.len();
                let axis = norm_axis(*axis, rank)?;
                let (outer, dim, inner) = if *legacy {
                    (
                        x.shape[..axis].iter().product(),
                        x.shape[axis..].iter().product(),
                        1,
                    )
                } else {
                    (
                        x.shape[..axis].iter().product::<usize>(),
                        x.shape[axis],
                        x.shape[axis + 1..].iter().product(),
                    )
                };
                let mut v = x.floats()?.to_vec();
                if inner == 1 {
                    v.chunks_exact_mut(dim.max(1)).for_each(softmax);
                } else {
                    let mut lane = vec![0.0f32; dim];
                    for o in 0..outer {
                        for i in 0..inner {
                            for (d, l) in lane.iter_mut().enumerate() {
                                *l = v[(o * dim + d) * inner + i];
                            }
                            softmax(&mut lane);
                            for (d, l) in lane.iter().enumerate() {
                                v[(o * dim + d) * inner + i] = *l;
                            }
                        }
                    }
                }
                Tensor::f32(x.shape.clone(), v)
            }
            Op::ArgMax {
                axis,
                keepdims,
                last,
            } => argmax(x, *axis, *keepdims, *last)?,
            Op::ArrayFeatureExtractor => {
                array_feature_extractor(x, input(inputs, 1)?.ints()?, limit)?
            }
            Op::Scaler { offset, scale } => {
                let (_, cols) = x.as_matrix()?;
                let pick = |v: &[f32], j: usize, d: f32| -> Result<f32, OpError> {
                    match v.len() {
                        0 => Ok(d),
                        1 => Ok(v[0]),
                        n if n == cols => Ok(v[j]),
                        n => Err(OpError(format!(
                            "Scaler with {n} values for {cols} columns"
                        ))),
                    }
                };
                let mut out = to_floats(x);
                for (i, v) in out.iter_mut().enumerate() {
                    let j = i % cols.max(1);
                    *v = (*v - pick(offset, j, 0.0)?) * pick(scale, j, 1.0)?;
                }
                Tensor::f32(x.shape.clone(), out)
            }
            Op::Normalizer(norm) => {
                let (_, cols) = x.as_matrix()?;
                let mut out = to_floats(x);
                for row in out.chunks_exact_mut(cols.max(1)) {
                    if let Norm::L2 = norm {
                        // As onnxruntime: ±sqrt(v² / Σv²), so a square past the largest float
                        // is inf / inf there (NaN), not v / inf (0).
                        let sum: f32 = row.iter().map(|v| v * v).sum();
                        if sum != 0.0 {
                            for v in row.iter_mut() {
                                let r = (*v * *v / sum).sqrt();
                                *v = if *v < 0.0 { -r } else { r };
                            }
                        }
                        continue;
                    }
                    let n = match norm {
                        Norm::Max => row.iter().fold(-f32::MAX, |m, &v| m.max(v)),
                        Norm::L1 | Norm::L2 => row.iter().map(|v| v.abs()).sum(),
                    };
                    // A norm of 0 leaves the row as it is, as in onnxruntime (NaN stays NaN).
                    if n != 0.0 {
                        row.iter_mut().for_each(|v| *v /= n);
                    }
                }
                Tensor::f32(x.shape.clone(), out)
            }
            Op::LinearClassifier { linear, labels } => return linear_classifier(linear, labels, x),
            Op::LinearRegressor(linear) => {
                let (rows, mut scores) = linear.scores(x)?;
                if linear.targets > 1 {
                    scores
                        .chunks_exact_mut(linear.targets)
                        .for_each(|r| linear.post.apply(r));
                } else if linear.post == Post::Probit {
                    scores.iter_mut().for_each(|v| *v = probit(*v));
                }
                Tensor::f32(vec![rows, linear.targets], scores)
            }
        }])
    }
}

fn input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Result<&'a Tensor, OpError> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| OpError(format!("input {i} is missing")))
}

fn to_floats(x: &Tensor) -> Vec<f32> {
    match &x.data {
        Data::F32(v) => v.clone(),
        Data::I64(v) => v.iter().map(|&i| i as f32).collect(),
    }
}

fn map(x: &Tensor, f: impl Fn(f32) -> f32) -> Result<Tensor, OpError> {
    Ok(Tensor::f32(
        x.shape.clone(),
        x.floats()?.iter().map(|&v| f(v)).collect(),
    ))
}

fn norm_axis(axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(OpError(format!("axis {axis} out of range for rank {rank}")));
    }
    Ok(a as usize)
}

/// `c[m×n] = a[m×k] · b[k×n]`, either transposed as stored; each sum of products in order of
/// `k`, as fused multiply-adds ([`fused`]).
fn matmul(
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
    (ta, tb): (bool, bool),
    limit: Cap<'_>,
) -> Result<Vec<f32>, OpError> {
    let mut c = vec![0.0f32; elements(&[m, n], limit)?];
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        // Products then sums, vectorised; a row where a sum overflowed (an infinity or a NaN
        // from `inf + -inf`) is computed again as onnxruntime's fused multiply-adds ([`fused`]),
        // which differ from this only there. The choice is the row's own: a row's result does
        // not depend on its batch.
        for fuse in [false, true] {
            if fuse {
                if row.iter().all(|v| v.is_finite()) {
                    break;
                }
                row.fill(0.0);
            }
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                match (tb, fuse) {
                    (true, false) => row
                        .iter_mut()
                        .enumerate()
                        .for_each(|(j, cv)| *cv += av * b[j * k + p]),
                    (false, false) => row
                        .iter_mut()
                        .zip(&b[p * n..(p + 1) * n])
                        .for_each(|(cv, bv)| *cv += av * bv),
                    (true, true) => row
                        .iter_mut()
                        .enumerate()
                        .for_each(|(j, cv)| *cv = fused(av, b[j * k + p], *cv)),
                    (false, true) => row
                        .iter_mut()
                        .zip(&b[p * n..(p + 1) * n])
                        .for_each(|(cv, bv)| *cv = fused(av, *bv, *cv)),
                }
            }
        }
    }
    Ok(c)
}

fn gemm(
    a: &Tensor,
    b: &Tensor,
    c: Option<&Tensor>,
    alpha: f32,
    beta: f32,
    (ta, tb): (bool, bool),
    limit: Cap<'_>,
) -> Result<Tensor, OpError> {
    let (ar, ac) = match a.shape.as_slice() {
        [r, c] => (*r, *c),
        s => return Err(OpError(format!("Gemm of a tensor of shape {s:?}"))),
    };
    let (br, bc) = match b.shape.as_slice() {
        [r, c] => (*r, *c),
        s => return Err(OpError(format!("Gemm by a tensor of shape {s:?}"))),
    };
    let (m, k) = if ta { (ac, ar) } else { (ar, ac) };
    let (k2, n) = if tb { (bc, br) } else { (br, bc) };
    if k != k2 {
        return Err(OpError(format!("Gemm of {m}×{k} by {k2}×{n}")));
    }
    let mut y = matmul(a.floats()?, b.floats()?, (m, k, n), (ta, tb), limit)?;
    y.iter_mut().for_each(|v| *v *= alpha);
    let mut out = Tensor::f32(vec![m, n], y);
    if let Some(c) = c {
        let scaled = Tensor::f32(
            c.shape.clone(),
            c.floats()?.iter().map(|v| v * beta).collect(),
        );
        out = broadcast(Binary::Add, &out, &scaled, limit)?;
        if out.shape != [m, n] {
            return Err(OpError(format!(
                "Gemm bias of shape {:?} for {m}×{n}",
                c.shape
            )));
        }
    }
    Ok(out)
}

/// Element-wise `a op b` with numpy broadcasting.
fn broadcast(op: Binary, a: &Tensor, b: &Tensor, limit: Cap<'_>) -> Result<Tensor, OpError> {
    let (av, bv) = (a.floats()?, b.floats()?);
    let f = |x: f32, y: f32| match op {
        Binary::Add => x + y,
        Binary::Sub => x - y,
        Binary::Mul => x * y,
        Binary::Div => x / y,
    };
    if a.shape == b.shape {
        return Ok(Tensor::f32(
            a.shape.clone(),
            av.iter().zip(bv).map(|(&x, &y)| f(x, y)).collect(),
        ));
    }
    let rank = a.shape.len().max(b.shape.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        let mut v = vec![1; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (sa, sb) = (pad(&a.shape), pad(&b.shape));
    let mut shape = Vec::with_capacity(rank);
    for (&x, &y) in sa.iter().zip(&sb) {
        shape.push(match (x, y) {
            _ if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(OpError(format!(
                    "shapes {:?} and {:?} do not broadcast",
                    a.shape, b.shape
                )));
            }
        });
    }
    // Strides of each input in the output's index space (0 along a broadcast dimension).
    let strides = |s: &[usize]| -> Vec<usize> {
        let mut st = vec![0; rank];
        let mut acc = 1;
        for d in (0..rank).rev() {
            st[d] = if s[d] == 1 { 0 } else { acc };
            acc *= s[d];
        }
        st
    };
    let (ta, tb) = (strides(&sa), strides(&sb));
    let total = elements(&shape, limit)?;
    let mut out = Vec::with_capacity(total);
    let mut idx = vec![0usize; rank];
    for _ in 0..total {
        let (mut ia, mut ib) = (0, 0);
        for d in 0..rank {
            ia += idx[d] * ta[d];
            ib += idx[d] * tb[d];
        }
        out.push(f(av[ia], bv[ib]));
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(Tensor::f32(shape, out))
}

fn reshape(x: &Tensor, spec: &[i64], allow_zero: bool, limit: Cap<'_>) -> Result<Tensor, OpError> {
    let mut shape = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        shape.push(match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                1
            }
            0 if !allow_zero => *x
                .shape
                .get(i)
                .ok_or_else(|| OpError("Reshape copies a missing dimension".into()))?,
            d => index(d, "Reshape dimension")?,
        });
    }
    let known = elements(&shape, limit)?;
    if let Some(i) = infer {
        if known == 0 || !x.len().is_multiple_of(known) {
            return Err(OpError(format!("cannot reshape {:?} to {spec:?}", x.shape)));
        }
        shape[i] = x.len() / known;
    } else if known != x.len() {
        return Err(OpError(format!("cannot reshape {:?} to {spec:?}", x.shape)));
    }
    Ok(Tensor {
        shape,
        data: x.data.clone(),
    })
}

fn argmax(x: &Tensor, axis: i64, keepdims: bool, last: bool) -> Result<Tensor, OpError> {
    let axis = norm_axis(axis, x.shape.len())?;
    let outer: usize = x.shape[..axis].iter().product();
    let dim = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let v = to_floats(x);
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best = 0;
            for d in 1..dim {
                let (cur, max) = (
                    v[(o * dim + d) * inner + i],
                    v[(o * dim + best) * inner + i],
                );
                if cur > max || (last && cur == max) {
                    best = d;
                }
            }
            out.push(best as i64);
        }
    }
    let mut shape = x.shape.clone();
    if keepdims {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Ok(Tensor::i64(shape, out))
}

/// onnxruntime's `ArrayFeatureExtractor`: picks `indices` along the last axis of `x`; a 1-D `x`
/// gives `[1, len(indices)]`.
fn array_feature_extractor(x: &Tensor, indices: &[i64], limit: Cap<'_>) -> Result<Tensor, OpError> {
    let stride = *x
        .shape
        .last()
        .ok_or_else(|| OpError("ArrayFeatureExtractor of a scalar".into()))?;
    let idx = indices
        .iter()
        .map(|&i| {
            index(i, "index").and_then(|i| {
                if i < stride {
                    Ok(i)
                } else {
                    Err(OpError(format!(
                        "index {i} is past the last column ({stride} columns)"
                    )))
                }
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut shape = if x.shape.len() == 1 {
        vec![1, stride]
    } else {
        x.shape.clone()
    };
    if let Some(l) = shape.last_mut() {
        *l = idx.len();
    }
    // The rows of `x` times the indices: checked before the output grows.
    elements(&shape, limit)?;
    let pick = |rows: &mut dyn FnMut(usize)| {
        for r in 0..x.len() / stride.max(1) {
            for &i in &idx {
                rows(r * stride + i);
            }
        }
    };
    Ok(match &x.data {
        Data::F32(v) => {
            let mut out = Vec::new();
            pick(&mut |i| out.push(v[i]));
            Tensor::f32(shape, out)
        }
        Data::I64(v) => {
            let mut out = Vec::new();
            pick(&mut |i| out.push(v[i]));
            Tensor::i64(shape, out)
        }
    })
}

/// onnxruntime's `LinearClassifier`: the label is the best raw score; one score row with two
/// labels is a binary model whose first class is added: `[1 - s, s]`, or `[1 - σ(s), σ(s)]`
/// with LOGISTIC (SOFTMAX and SOFTMAX_ZERO leave the score raw there, as onnxruntime does;
/// PROBIT is refused at load: onnxruntime writes one value per row into two columns).
fn linear_classifier(linear: &Linear, labels: &[i64], x: &Tensor) -> Result<Vec<Tensor>, OpError> {
    let (rows, mut scores) = linear.scores(x)?;
    let t = linear.targets;
    let mut out_labels = Vec::with_capacity(rows);
    if t == 1 {
        let (pos, neg) = if labels.len() == 2 {
            (labels[1], labels[0])
        } else {
            (1, 0)
        };
        out_labels.extend(scores.iter().map(|&s| if s > 0.0 { pos } else { neg }));
        if labels.len() == 2 {
            let two: Vec<f32> = scores
                .iter()
                .flat_map(|&s| match linear.post {
                    Post::Logistic => {
                        let p = logistic(s);
                        [1.0 - p, p]
                    }
                    _ => [1.0 - s, s],
                })
                .collect();
            return Ok(vec![
                Tensor::i64(vec![rows], out_labels),
                Tensor::f32(vec![rows, 2], two),
            ]);
        }
        if linear.post == Post::Probit {
            scores.iter_mut().for_each(|v| *v = probit(*v));
        }
    } else {
        for row in scores.chunks_exact_mut(t) {
            let mut best = 0;
            for j in 1..t {
                if row[j] > row[best] {
                    best = j;
                }
            }
            out_labels.push(labels[best]);
            linear.post.apply(row);
        }
    }
    Ok(vec![
        Tensor::i64(vec![rows], out_labels),
        Tensor::f32(vec![rows, t], scores),
    ])
}

/// `Concat` along `axis` of tensors of one element type whose other dimensions are equal.
fn concat(inputs: &[Option<&Tensor>], axis: i64, limit: Cap<'_>) -> Result<Tensor, OpError> {
    let parts = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| OpError(format!("input {i} is missing"))))
        .collect::<Result<Vec<_>, _>>()?;
    let first = parts
        .first()
        .ok_or_else(|| OpError("Concat of no tensors".into()))?;
    let rank = first.shape.len();
    let axis = norm_axis(axis, rank)?;
    let mut shape = first.shape.clone();
    shape[axis] = 0;
    for p in &parts {
        let same = p.shape.len() == rank
            && (0..rank).all(|d| d == axis || p.shape[d] == first.shape[d])
            && std::mem::discriminant(&p.data) == std::mem::discriminant(&first.data);
        if !same {
            return Err(OpError(format!(
                "Concat of shapes {:?} and {:?} along axis {axis}",
                first.shape, p.shape
            )));
        }
        shape[axis] = shape[axis]
            .checked_add(p.shape[axis])
            .ok_or_else(|| OpError("Concat too large".into()))?;
    }
    let total = elements(&shape, limit)?;
    let outer: usize = first.shape[..axis].iter().product();
    // Each part contributes a chunk of `shape[axis..]` elements per outer index.
    let chunk = |p: &Tensor| p.shape[axis..].iter().product::<usize>();
    fn join<T: Copy>(parts: &[&[T]], chunks: &[usize], outer: usize, total: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(total);
        for o in 0..outer {
            for (p, &c) in parts.iter().zip(chunks) {
                out.extend_from_slice(&p[o * c..(o + 1) * c]);
            }
        }
        out
    }
    let chunks: Vec<usize> = parts.iter().map(|p| chunk(p)).collect();
    Ok(match &first.data {
        Data::F32(_) => {
            let v = parts
                .iter()
                .map(|p| p.floats())
                .collect::<Result<Vec<_>, _>>()?;
            Tensor::f32(shape, join(&v, &chunks, outer, total))
        }
        Data::I64(_) => {
            let v = parts
                .iter()
                .map(|p| p.ints())
                .collect::<Result<Vec<_>, _>>()?;
            Tensor::i64(shape, join(&v, &chunks, outer, total))
        }
    })
}

/// `ReduceSum` of a float tensor over `axes` (all of them when empty).
fn reduce_sum(x: &Tensor, axes: &[i64], keepdims: bool, limit: Cap<'_>) -> Result<Tensor, OpError> {
    let rank = x.shape.len();
    let mut reduced = vec![axes.is_empty(); rank];
    for &a in axes {
        reduced[norm_axis(a, rank)?] = true;
    }
    let kept: Vec<usize> = x
        .shape
        .iter()
        .zip(&reduced)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    // Row-major strides of the output (with the reduced dimensions kept as 1).
    let mut strides = vec![0usize; rank];
    let mut acc = 1usize;
    for d in (0..rank).rev() {
        strides[d] = if reduced[d] { 0 } else { acc };
        acc = acc.saturating_mul(kept[d]);
    }
    let xs = x.floats()?;
    let mut out = vec![0.0f32; elements(&kept, limit)?];
    let mut idx = vec![0usize; rank];
    for &v in xs {
        let o: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out[o] += v;
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < x.shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    let shape = if keepdims {
        kept
    } else {
        x.shape
            .iter()
            .zip(&reduced)
            .filter(|(_, r)| !**r)
            .map(|(&d, _)| d)
            .collect()
    };
    Ok(Tensor::f32(shape, out))
}
