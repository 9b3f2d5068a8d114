//! `ChannelSpec`: where a channel of an input gate reads from.

use creditflow_core::base::config::ChannelSpec as CoreSpec;
use pyo3::prelude::*;

use crate::args::count_arg;

/// Where a channel reads from: a subpartition of a partition in some environment.
#[pyclass(module = "creditflow._native", frozen, eq, hash, get_all)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ChannelSpec {
    /// Address of the environment owning the partition (its ``env.address``).
    address: String,
    /// The partition id.
    partition_id: String,
    /// The subpartition index.
    subpartition: usize,
}

impl ChannelSpec {
    pub(crate) fn from_core(s: &CoreSpec) -> ChannelSpec {
        ChannelSpec {
            address: s.address.clone(),
            partition_id: s.partition_id.clone(),
            subpartition: s.subpartition,
        }
    }

    pub(crate) fn to_core(&self) -> CoreSpec {
        CoreSpec {
            address: self.address.clone(),
            partition_id: self.partition_id.clone(),
            subpartition: self.subpartition,
        }
    }
}

#[pymethods]
impl ChannelSpec {
    #[new]
    fn new(address: String, partition_id: String, subpartition: i64) -> PyResult<Self> {
        let subpartition = count_arg(subpartition, "subpartition")?;
        Ok(ChannelSpec {
            address,
            partition_id,
            subpartition,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "ChannelSpec({:?}, {:?}, {})",
            self.address, self.partition_id, self.subpartition
        )
    }
}
