//! The values flowing between operators: dense row-major tensors of `f32` or `i64`.

use crate::onnx::{TensorProto, data_type};
use crate::{Cap, OpError};

/// A tensor's elements.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    /// Floats (`FLOAT`).
    F32(Vec<f32>),
    /// Integers (`INT64`, and `INT32` widened).
    I64(Vec<i64>),
}

/// A dense row-major tensor.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Tensor {
    pub shape: Vec<usize>,
    pub data: Data,
}

impl Tensor {
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        Tensor {
            shape,
            data: Data::F32(data),
        }
    }

    pub fn i64(shape: Vec<usize>, data: Vec<i64>) -> Tensor {
        Tensor {
            shape,
            data: Data::I64(data),
        }
    }

    pub fn len(&self) -> usize {
        match &self.data {
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
        }
    }

    pub fn floats(&self) -> Result<&[f32], OpError> {
        match &self.data {
            Data::F32(v) => Ok(v),
            Data::I64(_) => Err(OpError(
                "expected a float tensor, got an integer one".into(),
            )),
        }
    }

    pub fn ints(&self) -> Result<&[i64], OpError> {
        match &self.data {
            Data::I64(v) => Ok(v),
            Data::F32(_) => Err(OpError(
                "expected an integer tensor, got a float one".into(),
            )),
        }
    }

    /// `[rows, cols]` of a 2-D tensor; a 1-D tensor is one row.
    pub fn as_matrix(&self) -> Result<(usize, usize), OpError> {
        match self.shape.as_slice() {
            [c] => Ok((1, *c)),
            [r, c] => Ok((*r, *c)),
            s => Err(OpError(format!(
                "expected a 1-D or 2-D tensor, got shape {s:?}"
            ))),
        }
    }

    /// Decodes an initializer or a tensor attribute.
    pub fn from_proto(t: &TensorProto, limit: Cap<'_>) -> Result<Tensor, OpError> {
        if t.data_location == Some(1) {
            return Err(OpError(
                "tensors stored in external files are not supported".into(),
            ));
        }
        let raw = t.raw_data.as_deref();
        let mut shape = Vec::with_capacity(t.dims.len());
        for &d in &t.dims {
            let d = usize::try_from(d).map_err(|_| OpError(format!("negative dimension {d}")))?;
            shape.push(d);
        }
        let count = elements(&shape, limit)?;
        // The values present must be the shape's before any is copied.
        let present = match (t.data_type.unwrap_or(0), raw.is_some()) {
            (_, true) => None,
            (data_type::FLOAT, false) => Some(t.float_data.len()),
            (data_type::DOUBLE, false) => Some(t.double_data.len()),
            (data_type::INT64, false) => Some(t.int64_data.len()),
            (data_type::INT32, false) => Some(t.int32_data.len()),
            _ => None,
        };
        if let Some(p) = present.filter(|&p| p != count) {
            return Err(OpError(format!(
                "tensor {:?} has {p} elements, its shape {shape:?} needs {count}",
                t.name.as_deref().unwrap_or("")
            )));
        }
        let data = match t.data_type.unwrap_or(0) {
            data_type::FLOAT => Data::F32(match raw {
                Some(b) => le_chunks::<4>(b, count)?.map(f32::from_le_bytes).collect(),
                None => t.float_data.clone(),
            }),
            data_type::DOUBLE => Data::F32(match raw {
                Some(b) => le_chunks::<8>(b, count)?
                    .map(|c| f64::from_le_bytes(c) as f32)
                    .collect(),
                None => t.double_data.iter().map(|&v| v as f32).collect(),
            }),
            data_type::INT64 => Data::I64(match raw {
                Some(b) => le_chunks::<8>(b, count)?.map(i64::from_le_bytes).collect(),
                None => t.int64_data.clone(),
            }),
            data_type::INT32 => Data::I64(match raw {
                Some(b) => le_chunks::<4>(b, count)?
                    .map(|c| i64::from(i32::from_le_bytes(c)))
                    .collect(),
                None => t.int32_data.iter().map(|&v| i64::from(v)).collect(),
            }),
            other => {
                return Err(OpError(format!(
                    "tensor element type {other} is not supported"
                )));
            }
        };
        let tensor = Tensor { shape, data };
        if tensor.len() != count {
            return Err(OpError(format!(
                "tensor {:?} has {} elements, its shape {:?} needs {count}",
                t.name.as_deref().unwrap_or(""),
                tensor.len(),
                tensor.shape
            )));
        }
        Ok(tensor)
    }
}

fn le_chunks<const N: usize>(
    b: &[u8],
    count: usize,
) -> Result<impl Iterator<Item = [u8; N]> + '_, OpError> {
    if b.len() != count.saturating_mul(N) {
        return Err(OpError(format!(
            "raw tensor data of {} bytes for {count} elements",
            b.len()
        )));
    }
    Ok(b.chunks_exact(N).map(|c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    }))
}

/// The number of elements of `shape`, at most `limit.n` (the model's `max_tensor_elements`,
/// or less in the warm-up): the bound on every tensor an operator computes, checked before it
/// is allocated. An empty tensor's other dimensions count too (`[0, 2⁴⁰]` is refused): a later
/// operator may reduce the 0 away. The error names the limit.
pub(crate) fn elements(shape: &[usize], limit: Cap<'_>) -> Result<usize, OpError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| {
            acc.checked_mul(d.max(1)).filter(|&n| n <= limit.n)
        })
        .map(|_| shape.iter().product())
        .ok_or_else(|| {
            OpError(format!(
                "a tensor of shape {shape:?} is larger than {} ({} elements)",
                limit.name, limit.n
            ))
        })
}
