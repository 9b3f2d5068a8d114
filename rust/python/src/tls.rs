//! `TLSConfig`: the PEM files of an environment's TLS (see `creditflow_core::base::config::TlsSettings`).

use std::path::PathBuf;

use creditflow_core::base::config::TlsSettings;
use pyo3::prelude::*;

/// TLS for every connection of a ``NetworkEnvironment`` (rustls): ``cert`` and ``key`` are
/// the PEM files of the certificate chain this environment presents and its private key;
/// ``ca`` the PEM file of the certificates it trusts: CA certificates peers' certificates
/// must chain to, or peers' certificates themselves (a certificate in ``ca`` is trusted as
/// it is, so a self-signed one made by ``openssl req -x509`` works as ``cert`` and ``ca`` on
/// every side). With ``client_auth=True`` (default) TLS is mutual: servers also require a
/// client certificate ``ca`` trusts. Certificates must be valid for the host part of the
/// addresses peers use. ``creditflow certs`` makes a CA and node certificates.
#[pyclass(module = "creditflow._native", frozen, name = "TLSConfig")]
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) settings: TlsSettings,
}

#[pymethods]
impl TlsConfig {
    #[new]
    #[pyo3(signature = (cert, key, ca, *, client_auth = true))]
    fn new(cert: PathBuf, key: PathBuf, ca: PathBuf, client_auth: bool) -> Self {
        TlsConfig {
            settings: TlsSettings {
                cert,
                key,
                ca,
                client_auth,
            },
        }
    }

    /// The certificate chain file.
    #[getter]
    fn cert(&self) -> PathBuf {
        self.settings.cert.clone()
    }

    /// The private key file.
    #[getter]
    fn key(&self) -> PathBuf {
        self.settings.key.clone()
    }

    /// The CA certificates file.
    #[getter]
    fn ca(&self) -> PathBuf {
        self.settings.ca.clone()
    }

    /// Whether TLS is mutual.
    #[getter]
    fn client_auth(&self) -> bool {
        self.settings.client_auth
    }

    fn __repr__(&self) -> String {
        let s = &self.settings;
        format!(
            "TLSConfig(cert={:?}, key={:?}, ca={:?}, client_auth={})",
            s.cert.display().to_string(),
            s.key.display().to_string(),
            s.ca.display().to_string(),
            if s.client_auth { "True" } else { "False" }
        )
    }
}
