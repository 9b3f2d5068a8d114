//! The environment's settings as Python gives them, checked and turned into an `EnvConfig`:
//! one conversion for `NetworkEnvironment(...)` and `HostService(...)`, whose settings are the
//! same (the core's table, `creditflow_core::env::settings`).

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::time::Duration;

use creditflow_core::base::config::{Backoff, Limits, TlsSettings};
use creditflow_core::serde::Compression;
use creditflow_core::{base::units, EnvConfig, FlowControl};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString};

use crate::args::count_arg;
use crate::tls::TlsConfig;

/// Every setting of the table, as the constructor received it (before any check).
pub(crate) struct EnvArgs<'a, 'py> {
    pub memory: Option<&'a Bound<'py, PyAny>>,
    pub segment_size: Option<&'a Bound<'py, PyAny>>,
    pub bind: &'a str,
    pub secret: Option<&'a Bound<'py, PyAny>>,
    pub flow_control: &'a str,
    pub buffer_timeout: f64,
    pub exclusive_buffers: i64,
    pub floating_buffers: i64,
    pub insecure: bool,
    pub local_handoff: bool,
    pub request_backoff_initial: f64,
    pub request_backoff_max: f64,
    pub advertise: Option<String>,
    pub handshake_timeout: f64,
    pub max_connections: i64,
    pub max_channels_per_connection: i64,
    pub max_outstanding_requests: i64,
    pub tls: Option<Bound<'py, TlsConfig>>,
    pub peer_timeout: f64,
    pub overdraft_buffers: i64,
    pub debloat: bool,
    pub debloat_target: f64,
    pub debloat_min_buffer: i64,
    pub spill_dir: Option<PathBuf>,
    pub max_spill: Option<&'a Bound<'py, PyAny>>,
    pub wire_compression: Option<&'a str>,
    pub shared_memory: bool,
}

impl EnvArgs<'_, '_> {
    /// The config these settings make; a `ValueError` (or `TypeError`) naming the first bad
    /// one. Listening beyond loopback unprotected is refused unless `insecure`.
    pub(crate) fn config(self) -> PyResult<EnvConfig> {
        let mut config = EnvConfig::default();
        if let Some(m) = self.memory {
            config.memory = bytes_arg(m, "memory")?;
        }
        if let Some(s) = self.segment_size {
            config.segment_size = bytes_arg(s, "segment_size")?;
        }
        config.bind = self.bind.to_string();
        config.secret = secret_arg(self.secret)?;
        config.tls = self.tls.map(|t| t.get().settings.clone());
        check_exposure(
            self.bind,
            config.secret.as_deref(),
            config.tls.as_ref(),
            self.insecure,
        )?;
        config.flow_control = flow_control_arg(self.flow_control)?;
        config.buffer_timeout = secs(self.buffer_timeout, "buffer_timeout")?;
        config.exclusive_buffers = count_arg(self.exclusive_buffers, "exclusive_buffers")?;
        config.floating_buffers = count_arg(self.floating_buffers, "floating_buffers")?;
        config.local_handoff = self.local_handoff;
        config.request_backoff = Backoff {
            initial: positive_secs(self.request_backoff_initial, "request_backoff_initial")?,
            max: secs(self.request_backoff_max, "request_backoff_max")?,
        };
        config.advertise = self.advertise;
        config.handshake_timeout = positive_secs(self.handshake_timeout, "handshake_timeout")?;
        config.limits = Limits {
            max_connections: count_arg(self.max_connections, "max_connections")?,
            max_channels_per_connection: count_arg(
                self.max_channels_per_connection,
                "max_channels_per_connection",
            )?,
            max_outstanding_requests: count_arg(self.max_outstanding_requests, "max_outstanding_requests")?,
        };
        config.peer_timeout = secs(self.peer_timeout, "peer_timeout")?;
        config.overdraft_buffers = count_arg(self.overdraft_buffers, "overdraft_buffers")?;
        config.debloat = self.debloat;
        config.debloat_target = positive_secs(self.debloat_target, "debloat_target")?;
        config.debloat_min_buffer = count_arg(self.debloat_min_buffer, "debloat_min_buffer")?;
        config.spill_dir = self.spill_dir;
        if let Some(m) = self.max_spill {
            config.max_spill = Some(bytes_arg(m, "max_spill")? as u64);
        }
        config.wire_compression = wire_compression_arg(self.wire_compression)?;
        config.shared_memory = self.shared_memory;
        Ok(config)
    }
}

/// `flow_control`: "credit" or "tcp".
fn flow_control_arg(value: &str) -> PyResult<FlowControl> {
    match value {
        "credit" => Ok(FlowControl::Credit),
        "tcp" => Ok(FlowControl::Tcp),
        other => Err(PyValueError::new_err(format!(
            "flow_control must be \"credit\" or \"tcp\", got {other:?}"
        ))),
    }
}

/// A duration argument in seconds that must not be zero either.
fn positive_secs(v: f64, name: &str) -> PyResult<Duration> {
    let d = secs(v, name)?;
    if d.is_zero() {
        return Err(PyValueError::new_err(format!("{name} must be positive")));
    }
    Ok(d)
}

/// Reads a byte size given as an int or a string with a unit.
pub(crate) fn bytes_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    if let Ok(i) = value.cast::<PyInt>() {
        let v: i64 = i.extract()?;
        return usize::try_from(v).map_err(|_| {
            PyValueError::new_err(format!("{name} must be a non-negative number of bytes, got {v}"))
        });
    }
    if let Ok(s) = value.cast::<PyString>() {
        return units::parse_bytes(s.to_str()?).map_err(|e| PyValueError::new_err(format!("{name}: {e}")));
    }
    Err(PyTypeError::new_err(format!(
        "{name} must be an int (bytes) or a string such as \"64MiB\""
    )))
}

fn is_loopback(bind: &str) -> bool {
    match bind.to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// A `secret` argument: bytes or str, not empty.
fn secret_arg(secret: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<u8>>> {
    let secret = match secret {
        None => None,
        Some(s) => {
            if let Ok(s) = s.cast::<PyString>() {
                Some(s.to_str()?.as_bytes().to_vec())
            } else if let Ok(b) = s.extract::<Vec<u8>>() {
                Some(b)
            } else {
                return Err(PyTypeError::new_err("secret must be bytes or str"));
            }
        }
    };
    if matches!(&secret, Some(s) if s.is_empty()) {
        return Err(PyValueError::new_err("secret must not be empty"));
    }
    Ok(secret)
}

/// Refuses to listen beyond loopback with neither a secret nor mutual TLS, unless `insecure`.
fn check_exposure(
    bind: &str,
    secret: Option<&[u8]>,
    tls: Option<&TlsSettings>,
    insecure: bool,
) -> PyResult<()> {
    let mutual_tls = tls.is_some_and(|t| t.client_auth);
    if secret.is_none() && !mutual_tls && !insecure && !is_loopback(bind) {
        return Err(PyValueError::new_err(format!(
            "refusing to bind {bind:?} without a secret or mutual TLS: anyone who can reach it could read \
             your data. Pass secret=... (shared by all peers) or tls=TLSConfig(...), bind a loopback \
             address, or pass insecure=True"
        )));
    }
    Ok(())
}

/// A duration argument in seconds: finite and not negative.
pub(crate) fn secs(v: f64, name: &str) -> PyResult<Duration> {
    if v.is_finite() && v >= 0.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(PyValueError::new_err(format!(
            "{name} must be a non-negative number of seconds, got {v}"
        )))
    }
}

/// `wire_compression`: None, "lz4" or "zstd".
fn wire_compression_arg(value: Option<&str>) -> PyResult<Option<Compression>> {
    Compression::parse(value).map_err(|_| {
        PyValueError::new_err(format!(
            "wire_compression must be None, \"lz4\" or \"zstd\", got {:?}",
            value.unwrap_or_default()
        ))
    })
}
