//! TLS between environments (rustls, aws-lc-rs backend), under the creditflow handshake: the TLS
//! handshake comes first, then Hello/HelloAck/AuthProof run inside it (with or without a
//! shared secret). Both sides verify the other's certificate against the configured CA
//! (mutual TLS unless `client_auth` is off, in which case only the server proves itself).
//!
//! A plaintext peer and a TLS peer refuse each other with a clear error: a TLS listener looks
//! at the first byte (a TLS handshake record starts with 22) and answers a plaintext peer with
//! a creditflow ErrorResponse it can read; a plaintext listener closes on a TLS ClientHello
//! and says so in its log, and the TLS client reports that the peer did not answer in TLS.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, RootCertStore};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::{Error, Result};

/// The first byte of a TLS record carrying a handshake message (a ClientHello).
pub(crate) const TLS_HANDSHAKE_RECORD: u8 = 22;

/// Bytes read from the socket at a time under TLS. rustls asks its transport for at most
/// 4 KiB per read, so without this buffer a 16 KiB TLS record costs four system calls and
/// a 32 KiB segment eight; with it one read takes many records, and rustls's small reads
/// are copies out of this buffer.
const SOCKET_READ_BUFFER: usize = 64 * 1024;

/// What TLS runs over: the TCP stream with a read buffer (writes pass straight through).
pub(crate) type TlsTransport = tokio::io::BufReader<TcpStream>;

fn buffered(stream: TcpStream) -> TlsTransport {
    tokio::io::BufReader::with_capacity(SOCKET_READ_BUFFER, stream)
}

/// TLS settings of an environment: PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The certificate chain this environment presents (leaf first).
    pub cert: PathBuf,
    /// The private key of `cert` (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA certificates peers' certificates must chain to.
    pub ca: PathBuf,
    /// Mutual TLS: a server requires a client certificate signed by `ca`, and a client
    /// presents `cert`. Off: only servers prove themselves.
    pub client_auth: bool,
}

/// The loaded configuration: one acceptor and one connector per environment.
pub(crate) struct Tls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

fn invalid(path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("tls: cannot read {what} from {}: {e}", path.display()))
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| invalid(path, what, e))?;
    if certs.is_empty() {
        return Err(invalid(path, what, "no PEM certificate in the file"));
    }
    Ok(certs)
}

impl Tls {
    /// Loads the PEM files and builds both sides' configurations.
    pub(crate) fn new(s: &TlsSettings) -> Result<Tls> {
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        // AES-128-GCM first (the default puts AES-256 first): the fastest suite with AES-NI,
        // and ample for the data carried here; the others stay available to peers.
        provider
            .cipher_suites
            .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        let provider = Arc::new(provider);
        let chain = certs(&s.cert, "the certificate (cert)")?;
        let key =
            PrivateKeyDer::from_pem_file(&s.key).map_err(|e| invalid(&s.key, "the private key (key)", e))?;
        let mut roots = RootCertStore::empty();
        for ca in certs(&s.ca, "the CA certificates (ca)")? {
            roots
                .add(ca)
                .map_err(|e| invalid(&s.ca, "the CA certificates (ca)", e))?;
        }
        let roots = Arc::new(roots);
        let tls_error = |e: rustls::Error| Error::InvalidArgument(format!("tls: {e}"));

        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(tls_error)?;
        let server = if s.client_auth {
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                    .build()
                    .map_err(|e| Error::InvalidArgument(format!("tls: client verifier: {e}")))?;
            server.with_client_cert_verifier(verifier)
        } else {
            server.with_no_client_auth()
        }
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(tls_error)?;

        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls_error)?
            .with_root_certificates(roots);
        let client = if s.client_auth {
            client.with_client_auth_cert(chain, key).map_err(tls_error)?
        } else {
            client.with_no_client_auth()
        };
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }

    /// The server side of the TLS handshake.
    pub(crate) async fn accept(
        &self,
        stream: TcpStream,
    ) -> Result<tokio_rustls::server::TlsStream<TlsTransport>> {
        self.acceptor
            .accept(buffered(stream))
            .await
            .map_err(|e| Error::Authentication(format!("TLS handshake failed: {e}")))
    }

    /// The client side of the TLS handshake with `addr` (`host:port`); the server's
    /// certificate must be valid for `host`.
    pub(crate) async fn connect(
        &self,
        addr: &str,
        stream: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TlsTransport>> {
        let name = server_name(addr)?;
        self.connector.connect(name, buffered(stream)).await.map_err(|e| {
            let hint = if e.to_string().contains("InvalidContentType")
                || e.to_string().contains("corrupt message")
            {
                " (the peer did not answer in TLS: does it have tls=... configured?)"
            } else {
                ""
            };
            Error::Authentication(format!("TLS handshake with {addr} failed: {e}{hint}"))
        })
    }
}

/// The host of `host:port` (`[v6]:port`) as the name the server's certificate must match.
fn server_name(addr: &str) -> Result<ServerName<'static>> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| Error::InvalidArgument(format!("tls: {host:?} is not a valid server name: {e}")))
}

/// The first byte a new connection sends, without taking it from the stream; `None` if it
/// closed first.
pub(crate) async fn first_byte(stream: &TcpStream) -> Option<u8> {
    let mut b = [0u8; 1];
    match stream.peek(&mut b).await {
        Ok(1) => Some(b[0]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_the_host_part() {
        assert!(matches!(
            server_name("127.0.0.1:80").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("[::1]:80").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("example.com:80").unwrap(),
            ServerName::DnsName(_)
        ));
    }
}
