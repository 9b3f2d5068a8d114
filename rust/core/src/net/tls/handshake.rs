//! TLS between environments (rustls, aws-lc-rs backend), under the creditflow handshake: the TLS
//! handshake comes first, then Hello/HelloAck/AuthProof run inside it (with or without a
//! shared secret). Both sides verify the other's certificate against the configured CA
//! (mutual TLS unless `client_auth` is off, in which case only the server proves itself);
//! a certificate that is itself in `ca` is trusted as it is (pinning, `super::verify`), and a
//! refused certificate is reported as a sentence naming the file and the fix.
//! TLS 1.3 only: both ends are creditflow.
//!
//! rustls does the handshake; the records after it are [`super::record`]'s, on the same
//! keys (standard TLS 1.3 records, so the wire does not change). Each side switches where
//! nothing from the peer can be in flight, else records rustls already read would be lost.
//! The client switches as soon as its handshake is done (servers send no session tickets, and
//! nothing else until the client speaks), sends one byte in our records and waits for the
//! server's; the server reads that byte through rustls (the client sends nothing more until it
//! is answered), switches, and answers in our records. The keys and sequence numbers come from rustls
//! (`dangerous_extract_secrets`), the traffic secrets that KeyUpdate needs from a key log of
//! the connection's own; the keys derived from those secrets must equal rustls's.
//!
//! A plaintext peer and a TLS peer refuse each other with a clear error: a TLS listener looks
//! at the first byte (a TLS handshake record starts with 22) and answers a plaintext peer with
//! a creditflow ErrorResponse it can read; a plaintext listener closes on a TLS ClientHello
//! and says so in its log, and the TLS client reports that the peer did not answer in TLS.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, RootCertStore};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::keys::Direction;
use super::record::{RecordReader, RecordWriter, Shared};
use super::verify::{alert_of, explain, ClientVerifier, Files, Peer, ServerVerifier};
use crate::base::config::TlsSettings;
use crate::base::error::{Error, Result};

/// The first byte of a TLS record carrying a handshake message (a ClientHello).
pub(crate) const TLS_HANDSHAKE_RECORD: u8 = 22;

/// The byte each side sends through rustls before switching to our records.
const SWITCH: u8 = 0xcf;

/// The read half of a TLS connection after the handshake.
pub(crate) type TlsReader = RecordReader<OwnedReadHalf>;
/// The write half of a TLS connection after the handshake.
pub(crate) type TlsWriter = RecordWriter<OwnedWriteHalf>;

/// The TLS 1.3 application traffic secrets of one connection, from rustls's key log hook.
#[derive(Debug, Default)]
struct TrafficSecrets {
    client: Mutex<Option<Vec<u8>>>,
    server: Mutex<Option<Vec<u8>>>,
}

impl rustls::KeyLog for TrafficSecrets {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        let slot = match label {
            "CLIENT_TRAFFIC_SECRET_0" => &self.client,
            "SERVER_TRAFFIC_SECRET_0" => &self.server,
            _ => return,
        };
        *slot.lock().unwrap() = Some(secret.to_vec());
    }

    fn will_log(&self, label: &str) -> bool {
        matches!(label, "CLIENT_TRAFFIC_SECRET_0" | "SERVER_TRAFFIC_SECRET_0")
    }
}

fn switch_error(e: impl std::fmt::Display) -> Error {
    Error::ConnectionLost(format!("TLS: switching to the data phase failed: {e}"))
}

/// Our halves of a connection whose handshake is done and quiet: keys and sequence numbers
/// from rustls, traffic secrets from the key log (`we_are_client` picks which is whose).
fn split(
    tcp: TcpStream,
    conn: impl Into<rustls::Connection>,
    secrets: &TrafficSecrets,
    we_are_client: bool,
) -> Result<(TlsReader, TlsWriter)> {
    let mut conn: rustls::Connection = conn.into();
    let mut probe = [0u8; 1];
    match std::io::Read::read(&mut conn.reader(), &mut probe) {
        Ok(0) => return Err(switch_error("the peer closed the connection")),
        Ok(_) => return Err(switch_error("the peer sent data before the switch")),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(e) => return Err(switch_error(e)),
    }
    let extracted = conn.dangerous_extract_secrets().map_err(switch_error)?;
    let take = |slot: &Mutex<Option<Vec<u8>>>| {
        slot.lock()
            .unwrap()
            .take()
            .ok_or_else(|| switch_error("rustls logged no traffic secret"))
    };
    let (client, server) = (take(&secrets.client)?, take(&secrets.server)?);
    let (ours, theirs) = if we_are_client {
        (client, server)
    } else {
        (server, client)
    };
    let (tx_seq, tx_keys) = &extracted.tx;
    let (rx_seq, rx_keys) = &extracted.rx;
    let tx = Direction::new(tx_keys, &ours, *tx_seq).map_err(switch_error)?;
    let rx = Direction::new(rx_keys, &theirs, *rx_seq).map_err(switch_error)?;
    if !tx.matches(tx_keys) || !rx.matches(rx_keys) {
        return Err(switch_error("the logged secrets do not give rustls's keys"));
    }
    let (r, w) = tcp.into_split();
    let shared = Arc::new(Shared::default());
    Ok((
        RecordReader::new(r, rx, shared.clone()),
        RecordWriter::new(w, tx, shared),
    ))
}

async fn read_switch<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Result<()> {
    match s.read_u8().await {
        Ok(SWITCH) => Ok(()),
        Ok(b) => Err(switch_error(format!("unexpected byte {b:#x}"))),
        Err(e) => Err(switch_error(e)),
    }
}

async fn write_switch<S: tokio::io::AsyncWrite + Unpin>(s: &mut S) -> Result<()> {
    s.write_all(&[SWITCH]).await.map_err(switch_error)?;
    s.flush().await.map_err(switch_error)
}

/// The loaded configuration of an environment; each connection gets a copy with a key log
/// of its own.
pub(crate) struct Tls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    /// The files messages name.
    files: Files,
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
        let pinned: Arc<[CertificateDer<'static>]> = certs(&s.ca, "the CA certificates (ca)")?.into();
        for ca in pinned.iter() {
            roots
                .add(ca.clone())
                .map_err(|e| invalid(&s.ca, "the CA certificates (ca)", e))?;
        }
        let roots = Arc::new(roots);
        let tls_error = |e: rustls::Error| Error::InvalidArgument(format!("tls: {e}"));
        let algorithms = provider.signature_verification_algorithms;

        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?;
        let server = if s.client_auth {
            let webpki =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                    .build()
                    .map_err(|e| Error::InvalidArgument(format!("tls: client verifier: {e}")))?;
            server.with_client_cert_verifier(Arc::new(ClientVerifier::new(
                pinned.clone(),
                webpki,
                algorithms,
            )))
        } else {
            server.with_no_client_auth()
        }
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(tls_error)?;

        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| Error::InvalidArgument(format!("tls: server verifier: {e}")))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ServerVerifier::new(pinned, webpki, algorithms)));
        let mut client = if s.client_auth {
            client.with_client_auth_cert(chain, key).map_err(tls_error)?
        } else {
            client.with_no_client_auth()
        };
        let mut server = server;
        // Nothing after the handshake but our records: no session tickets, and the keys
        // handed over to `record`.
        server.send_tls13_tickets = 0;
        server.enable_secret_extraction = true;
        client.enable_secret_extraction = true;
        Ok(Tls {
            server: Arc::new(server),
            client: Arc::new(client),
            files: Files {
                cert: s.cert.clone(),
                ca: s.ca.clone(),
            },
        })
    }

    /// A failed handshake's error with `peer` as the error a user reads (`verify::explain`).
    fn handshake_error(&self, e: &std::io::Error, peer: Peer<'_>) -> Error {
        let rustls_error = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
        let what = match (rustls_error, alert_of(e)) {
            (Some(r), _) => explain(r, peer, &self.files),
            (None, Some(alert)) => explain(&rustls::Error::AlertReceived(alert), peer, &self.files),
            (None, None) => e.to_string(),
        };
        let with = match peer {
            Peer::Server(a) => a.to_string(),
            Peer::Client(a) => format!("client {a}"),
        };
        Error::Authentication(format!("TLS handshake with {with} failed: {what}"))
    }

    /// The server side of the TLS handshake with the client at `peer`, then the switch to
    /// our records.
    pub(crate) async fn accept(&self, stream: TcpStream) -> Result<(TlsReader, TlsWriter)> {
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string());
        let secrets = Arc::new(TrafficSecrets::default());
        let mut config = (*self.server).clone();
        config.key_log = secrets.clone();
        let mut tls = TlsAcceptor::from(Arc::new(config))
            .accept(stream)
            .await
            .map_err(|e| self.handshake_error(&e, Peer::Client(&peer)))?;
        read_switch(&mut tls).await?;
        let (tcp, conn) = tls.into_inner();
        let (r, mut w) = split(tcp, conn, &secrets, false)?;
        write_switch(&mut w).await?;
        Ok((r, w))
    }

    /// The client side of the TLS handshake with `addr` (`host:port`; the server's
    /// certificate must be valid for `host`), then the switch to our records.
    pub(crate) async fn connect(&self, addr: &str, stream: TcpStream) -> Result<(TlsReader, TlsWriter)> {
        let name = server_name(addr)?;
        let secrets = Arc::new(TrafficSecrets::default());
        let mut config = (*self.client).clone();
        config.key_log = secrets.clone();
        let connector = TlsConnector::from(Arc::new(config));
        let tls = connector
            .connect(name, stream)
            .await
            .map_err(|e| self.handshake_error(&e, Peer::Server(addr)))?;
        let (tcp, conn) = tls.into_inner();
        let (mut r, mut w) = split(tcp, conn, &secrets, true)?;
        write_switch(&mut w).await?;
        // A server that refuses our certificate (TLS 1.3: after our side of the handshake is
        // done) says so with an alert here.
        match r.read_u8().await {
            Ok(SWITCH) => {}
            Ok(b) => return Err(switch_error(format!("unexpected byte {b:#x}"))),
            Err(e) if alert_of(&e).is_some() => return Err(self.handshake_error(&e, Peer::Server(addr))),
            // The alert lost to a reset: perhaps a refusal, perhaps the server went away (so
            // still a lost connection, which callers may retry).
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                return Err(switch_error(format!(
                    "{e}; if the server refused this environment's certificate (cert={}), its \
                     log says why",
                    self.files.cert.display()
                )));
            }
            Err(e) => return Err(switch_error(e)),
        }
        Ok((r, w))
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
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    use tokio::io::{AsyncRead, AsyncWrite};
    use tokio::net::TcpListener;

    /// Mutual TLS from a CA and a certificate for 127.0.0.1 it signed, read from PEM files in a
    /// directory removed once they are loaded.
    fn tls() -> Arc<Tls> {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca_cert, &ca_key)
            .unwrap();
        let write = |name: &str, pem: String| {
            let p = dir.join(name);
            std::fs::write(&p, pem).unwrap();
            p
        };
        let settings = TlsSettings {
            cert: write("cert.pem", leaf.pem()),
            key: write("key.pem", key.serialize_pem()),
            ca: write("ca.pem", ca_cert.pem()),
            client_auth: true,
        };
        Arc::new(Tls::new(&settings).unwrap())
    }

    fn pattern(n: usize, salt: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 13 + i / 509 + salt) as u8).collect()
    }

    /// Writes `data` in pieces of up to 50,000 bytes, then shuts down (close_notify).
    async fn send<W: AsyncWrite + Unpin>(mut w: W, data: Vec<u8>) {
        for piece in data.chunks(50_000) {
            w.write_all(piece).await.unwrap();
        }
        w.shutdown().await.unwrap();
    }

    async fn receive<R: AsyncRead + Unpin>(mut r: R) -> Vec<u8> {
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn both_sides_switch_to_our_records_and_rekey() {
        let tls = tls();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (to_client, to_server) = (pattern(1_000_000, 1), pattern(700_000, 2));
        let server = {
            let (tls, to_client, to_server) = (tls.clone(), to_client.clone(), to_server.clone());
            tokio::spawn(async move {
                let (stream, _) = listener.accept().await.unwrap();
                let (r, mut w) = tls.accept(stream).await.unwrap();
                w.set_records_per_key(5);
                let ((), got) = tokio::join!(send(w, to_client), receive(r));
                assert!(got == to_server, "the server got other bytes");
            })
        };
        let stream = TcpStream::connect(&addr).await.unwrap();
        let (r, mut w) = tls.connect(&addr, stream).await.unwrap();
        w.set_records_per_key(3);
        let ((), got) = tokio::join!(send(w, to_server), receive(r));
        assert!(got == to_client, "the client got other bytes");
        server.await.unwrap();
    }

    /// The wire is standard TLS 1.3: the server keeps using rustls after the handshake while
    /// the client uses our records, each way, with KeyUpdates from both.
    #[tokio::test]
    async fn our_records_interoperate_with_rustls_both_ways() {
        let tls = tls();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (to_client, to_server) = (pattern(600_000, 3), pattern(900_000, 4));
        let server = {
            let (tls, to_client, to_server) = (tls.clone(), to_client.clone(), to_server.clone());
            tokio::spawn(async move {
                let (stream, _) = listener.accept().await.unwrap();
                let mut s = TlsAcceptor::from(tls.server.clone())
                    .accept(stream)
                    .await
                    .unwrap();
                read_switch(&mut s).await.unwrap();
                write_switch(&mut s).await.unwrap();
                // rustls from here on: read what the client sends (with its KeyUpdates),
                // then send with KeyUpdates of rustls's own.
                let mut got = vec![0u8; to_server.len()];
                s.read_exact(&mut got).await.unwrap();
                assert!(
                    got == to_server,
                    "rustls read other bytes than our records carried"
                );
                for piece in to_client.chunks(100_000) {
                    s.get_mut().1.refresh_traffic_keys().unwrap();
                    s.write_all(piece).await.unwrap();
                }
                s.shutdown().await.unwrap();
                let mut rest = Vec::new();
                s.read_to_end(&mut rest).await.unwrap();
                assert!(rest.is_empty(), "close_notify ends the stream");
            })
        };
        let stream = TcpStream::connect(&addr).await.unwrap();
        let (r, mut w) = tls.connect(&addr, stream).await.unwrap();
        w.set_records_per_key(4);
        for piece in to_server.chunks(50_000) {
            w.write_all(piece).await.unwrap();
        }
        w.flush().await.unwrap();
        let got = receive(r).await;
        assert!(got == to_client, "our records read other bytes than rustls sent");
        w.shutdown().await.unwrap();
        server.await.unwrap();
    }

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
