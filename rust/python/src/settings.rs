//! `settings()`: the core's table of environment settings (`creditflow_core::env::settings`), for
//! the tests and tools that check the constructor, the stub and the docs against it.

use creditflow_core::env::settings::{Setting as CoreSetting, SETTINGS};
use pyo3::prelude::*;

/// One setting of ``NetworkEnvironment(...)``: its name, default, unit and docs.
#[pyclass(module = "creditflow._native", name = "Setting", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The keyword argument's name.
    name: &'static str,
    /// The parameter's type annotation, as the stub writes it.
    py_type: &'static str,
    /// The constructor's default, as a Python literal (``None``, ``0.1``, ``"credit"``).
    default: &'static str,
    /// What a ``None`` default stands for, as a Python literal (``"64MiB"``), or None.
    means: Option<&'static str>,
    /// What the value measures (``"bytes"``, ``"seconds"``, ``"buffers"``, ...).
    unit: &'static str,
    /// Whether the parameter is keyword-only.
    keyword_only: bool,
    /// One line of docs (Markdown).
    doc: &'static str,
}

impl From<&CoreSetting> for Setting {
    fn from(s: &CoreSetting) -> Self {
        let CoreSetting {
            name,
            py_type,
            default,
            means,
            unit,
            keyword_only,
            doc,
        } = *s;
        Setting {
            name,
            py_type,
            default,
            means,
            unit: unit.as_str(),
            keyword_only,
            doc,
        }
    }
}

#[pymethods]
impl Setting {
    fn __repr__(&self) -> String {
        format!(
            "Setting(name={:?}, default={}, unit={:?}, keyword_only={})",
            self.name,
            self.means.unwrap_or(self.default),
            self.unit,
            if self.keyword_only { "True" } else { "False" }
        )
    }
}

/// Every setting of ``NetworkEnvironment(...)``, in parameter order.
#[pyfunction]
pub fn settings() -> Vec<Setting> {
    SETTINGS.iter().map(Setting::from).collect()
}
