//! The metrics text writer the gateway's `/metrics` and every protocol's metric families write
//! with: families of samples, each a [`Value`], encoded by prometheus-client (OpenMetrics text).

use fanout_runtime::hist::HistogramSnapshot;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, MetricEncoder, NoLabelSet};
pub use prometheus_client::metrics::MetricType;
use std::fmt;

/// One sample's value.
pub enum Value {
    /// A counter.
    Counter(u64),
    /// A counter of a fractional quantity (CPU seconds).
    CounterF(f64),
    /// A gauge.
    Gauge(f64),
    /// A histogram.
    Histogram(HistogramSnapshot),
}

impl Value {
    fn encode(&self, mut m: MetricEncoder<'_>) -> fmt::Result {
        match self {
            Value::Counter(v) => m.encode_counter::<NoLabelSet, u64, u64>(v, None),
            Value::CounterF(v) => m.encode_counter::<NoLabelSet, f64, f64>(v, None),
            Value::Gauge(v) => m.encode_gauge(v),
            Value::Histogram(s) => {
                m.encode_histogram::<NoLabelSet>(s.sum, s.count, &s.buckets, None)
            }
        }
    }

    fn metric_type(&self) -> MetricType {
        match self {
            Value::Counter(_) | Value::CounterF(_) => MetricType::Counter,
            Value::Gauge(_) => MetricType::Gauge,
            Value::Histogram(_) => MetricType::Histogram,
        }
    }
}

/// Writes families: a descriptor (`# HELP`, `# TYPE`) then its samples.
pub struct Out<'a>(DescriptorEncoder<'a>);

impl<'a> Out<'a> {
    /// A writer of `encoder`'s families.
    pub fn new(encoder: DescriptorEncoder<'a>) -> Out<'a> {
        Out(encoder)
    }

    /// A family with labels; `ty` is its type even when it has no samples.
    pub fn family<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        ty: MetricType,
        samples: impl IntoIterator<Item = (L, Value)>,
    ) -> fmt::Result {
        let mut m = self.0.encode_descriptor(name, help, None, ty)?;
        for (labels, v) in samples {
            v.encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// A metric without labels.
    pub fn single(&mut self, name: &str, help: &str, v: Value) -> fmt::Result {
        let m = self
            .0
            .encode_descriptor(name, help, None, v.metric_type())?;
        v.encode(m)
    }
}
