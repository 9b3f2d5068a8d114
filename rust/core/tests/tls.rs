//! TLS between two environments over loopback, with certificates made here (rcgen): a mutual
//! TLS exchange delivers everything, plaintext and TLS peers refuse each other with a clear
//! error on both sides, and a certificate from another CA is refused. Certificates pinned in
//! `ca` (the everyday self-signed `CA:TRUE` one) are trusted as they are, still checked for
//! their validity period and host name; every refusal says which file and how to fix it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use creditflow_core::base::config::TlsSettings;
use creditflow_core::base::error::Error;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

mod support;

use support::{spec, wait};

/// A CA and one certificate it signed for localhost / 127.0.0.1, as PEM files in `dir`.
fn pki(dir: &Path, name: &str) -> TlsSettings {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, format!("{name} CA"));
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca_cert, &ca_key)
        .unwrap();
    let write = |file: &str, pem: String| {
        let p = dir.join(format!("{name}-{file}"));
        std::fs::write(&p, pem).unwrap();
        p
    };
    TlsSettings {
        cert: write("cert.pem", leaf.pem()),
        key: write("key.pem", key.serialize_pem()),
        ca: write("ca.pem", ca_cert.pem()),
        client_auth: true,
    }
}

/// A self-signed certificate with `CA:TRUE` (what `openssl req -x509` makes) for `names`,
/// valid from `not_before` to `not_after` (years), as `dir/name-{cert,key}.pem`; `ca` is the
/// certificate itself (pinned).
fn self_signed(dir: &Path, name: &str, names: &[&str], years: (i32, i32)) -> TlsSettings {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "localhost");
    params.not_before = rcgen::date_time_ymd(years.0, 1, 1);
    params.not_after = rcgen::date_time_ymd(years.1, 1, 1);
    let cert = params.self_signed(&key).unwrap();
    let write = |file: &str, pem: String| {
        let p = dir.join(format!("{name}-{file}"));
        std::fs::write(&p, pem).unwrap();
        p
    };
    let cert = write("cert.pem", cert.pem());
    TlsSettings {
        ca: cert.clone(),
        cert,
        key: write("key.pem", key.serialize_pem()),
        client_auth: true,
    }
}

/// The PEM files `files` one after the other in `dir/name`.
fn bundle(dir: &Path, name: &str, files: &[&Path]) -> PathBuf {
    let path = dir.join(name);
    let pem: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    std::fs::write(&path, pem).unwrap();
    path
}

/// A valid everyday self-signed certificate for localhost and 127.0.0.1.
fn everyday(dir: &Path, name: &str) -> TlsSettings {
    self_signed(dir, name, &["localhost", "127.0.0.1"], (2020, 2100))
}

/// The error of an exchange that must fail, as its message: an authentication error that
/// names the TLS handshake and shows no rustls debug formatting.
fn refusal(producer: &NetworkEnvironment, consumer: &NetworkEnvironment) -> String {
    let err = exchange(producer, consumer, 5).unwrap_err();
    let Error::Authentication(m) = &err else {
        panic!("not an authentication error: {err:?}")
    };
    assert!(m.contains("TLS handshake"), "{m}");
    for debug in ["OtherError", "Other(", "InvalidCertificate", "Context {"] {
        assert!(!m.contains(debug), "rustls debug formatting in {m:?}");
    }
    // Shown with --no-capture: the messages as a user reads them.
    eprintln!("refused: {m}");
    m.clone()
}

fn env(tls: Option<TlsSettings>) -> NetworkEnvironment {
    NetworkEnvironment::new(EnvConfig {
        memory: 4 << 20,
        tls,
        secret: Some(b"s3cret".to_vec()),
        // What TLS protects goes over TCP: between environments of one host the frames would
        // otherwise move to shared memory after the TLS handshake.
        shared_memory: false,
        ..EnvConfig::default()
    })
    .unwrap()
}

fn batch(start: i64, n: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from_iter_values(start..start + n as i64))],
    )
    .unwrap()
}

/// Writes `n` batches into "p" of `producer` and reads them in `consumer`; the rows read,
/// or the gate's error.
fn exchange(
    producer: &NetworkEnvironment,
    consumer: &NetworkEnvironment,
    n: usize,
) -> Result<Vec<i64>, Error> {
    let part = producer.create_partition("p", 1).unwrap();
    let spec = spec(producer, "p", 0);
    let mut gate = consumer.create_input_gate(vec![spec]).unwrap();
    let writer = std::thread::spawn(move || {
        let mut w = RecordWriter::new(part, Partitioner::Forward);
        for i in 0..n {
            if w.write(&batch((i * 1000) as i64, 1000), &mut wait(30)).is_err() {
                return;
            }
        }
        let _ = w.close();
    });
    let mut rows = Vec::new();
    let result = loop {
        match gate.next(&mut wait(30)) {
            Ok(Some(b)) => {
                let k = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                rows.extend(k.values().iter().copied());
            }
            Ok(None) => break Ok(rows),
            Err(e) => break Err(e),
        }
    };
    gate.close();
    if let Some(p) = producer.partition("p") {
        p.release();
    }
    writer.join().unwrap();
    result
}

#[test]
fn a_mutual_tls_exchange_delivers_everything_in_order() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let tls = pki(dir, "ok");
    let (producer, consumer) = (env(Some(tls.clone())), env(Some(tls)));
    let rows = exchange(&producer, &consumer, 50).unwrap();
    assert_eq!(rows, (0..50_000).collect::<Vec<i64>>());
}

#[test]
fn a_plaintext_peer_is_refused_by_a_tls_listener_with_a_clear_error() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let (producer, consumer) = (env(Some(pki(dir, "srv"))), env(None));
    let err = exchange(&producer, &consumer, 5).unwrap_err();
    assert!(
        matches!(&err, Error::Authentication(m) if m.contains("requires TLS")),
        "{err}"
    );
}

#[test]
fn a_tls_client_is_refused_by_a_plaintext_listener_with_a_clear_error() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let (producer, consumer) = (env(None), env(Some(pki(dir, "cli"))));
    let err = exchange(&producer, &consumer, 5).unwrap_err();
    assert!(
        matches!(&err, Error::Authentication(m) if m.contains("did not answer in TLS")),
        "{err}"
    );
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let (producer, consumer) = (env(Some(pki(dir, "a"))), env(Some(pki(dir, "b"))));
    let m = refusal(&producer, &consumer);
    assert!(m.contains("is not trusted"), "{m}");
}

#[test]
fn a_self_signed_ca_certificate_pinned_in_ca_works_both_ways() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    // The same certificate everywhere, as a guide's `openssl req -x509` one is used.
    let tls = everyday(dir, "same");
    let (producer, consumer) = (env(Some(tls.clone())), env(Some(tls)));
    assert_eq!(
        exchange(&producer, &consumer, 20).unwrap(),
        (0..20_000).collect::<Vec<i64>>()
    );
    // Two different ones, each side pinning both: the server pins the client's certificate
    // and the client the server's.
    let (a, b) = (everyday(dir, "a"), everyday(dir, "b"));
    let both = bundle(dir, "both.pem", &[&a.cert, &b.cert]);
    let with_ca = |t: TlsSettings| TlsSettings {
        ca: both.clone(),
        ..t
    };
    let (producer, consumer) = (env(Some(with_ca(a))), env(Some(with_ca(b))));
    assert_eq!(
        exchange(&producer, &consumer, 20).unwrap(),
        (0..20_000).collect::<Vec<i64>>()
    );
}

#[test]
fn a_pinned_certificate_that_expired_is_refused_with_a_clear_message() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let tls = self_signed(dir, "old", &["localhost", "127.0.0.1"], (2019, 2021));
    let (producer, consumer) = (env(Some(tls.clone())), env(Some(tls.clone())));
    let m = refusal(&producer, &consumer);
    assert!(m.contains("expired on 2021-01-01 00:00:00 UTC"), "{m}");
    assert!(m.contains(&format!("ca={}", tls.ca.display())), "{m}");
    assert!(m.contains("creditflow certs"), "{m}");
}

#[test]
fn a_pinned_certificate_for_another_host_is_refused_with_a_clear_message() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let tls = self_signed(dir, "elsewhere", &["db.example.com", "10.1.2.3"], (2020, 2100));
    let (producer, consumer) = (env(Some(tls.clone())), env(Some(tls)));
    let m = refusal(&producer, &consumer);
    assert!(m.contains("is not valid for \"127.0.0.1\""), "{m}");
    assert!(m.contains("DNS:db.example.com, IP:10.1.2.3"), "{m}");
    assert!(m.contains("subjectAltName includes 127.0.0.1"), "{m}");
}

#[test]
fn an_unknown_certificate_is_refused_naming_the_ca_file() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    // Node certificates of another CA.
    let (a, b) = (pki(dir, "mine"), pki(dir, "theirs"));
    let (producer, consumer) = (env(Some(a)), env(Some(b.clone())));
    let m = refusal(&producer, &consumer);
    assert!(m.contains("the certificate of the server at 127.0.0.1:"), "{m}");
    assert!(
        m.contains(&format!("is not trusted: it is not in ca={}", b.ca.display())),
        "{m}"
    );
    assert!(m.contains("Fix: add to ca="), "{m}");
    // Another everyday self-signed certificate (with the same name, CN=localhost).
    let (a, b) = (everyday(dir, "my-own"), everyday(dir, "their-own"));
    let (producer, consumer) = (env(Some(a)), env(Some(b.clone())));
    let m = refusal(&producer, &consumer);
    assert!(m.contains("is a CA certificate (basicConstraints CA:TRUE"), "{m}");
    assert!(
        m.contains(&format!("itself in ca={}, and it is not", b.ca.display())),
        "{m}"
    );
}

#[test]
fn a_server_refusing_our_certificate_is_reported_naming_our_cert_file() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let (server, client) = (everyday(dir, "server"), everyday(dir, "client"));
    // The client trusts the server; the server knows nothing of the client.
    let both = bundle(dir, "client-trusts.pem", &[&client.cert, &server.cert]);
    let client = TlsSettings { ca: both, ..client };
    let (producer, consumer) = (env(Some(server)), env(Some(client.clone())));
    let m = refusal(&producer, &consumer);
    assert!(
        m.contains(&format!(
            "refused this environment's certificate (cert={})",
            client.cert.display()
        )),
        "{m}"
    );
    assert!(m.contains("into the server's ca= file"), "{m}");
}

#[test]
fn a_ca_certificate_signed_by_a_trusted_ca_but_not_pinned_is_refused_with_a_clear_message() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let mut tls = pki(dir, "root");
    let ca_key = KeyPair::generate().unwrap();
    let mut root = CertificateParams::new(Vec::<String>::new()).unwrap();
    root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let root_cert = root.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    leaf.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let leaf = leaf.signed_by(&key, &root_cert, &ca_key).unwrap();
    std::fs::write(&tls.cert, leaf.pem()).unwrap();
    std::fs::write(&tls.key, key.serialize_pem()).unwrap();
    std::fs::write(&tls.ca, root_cert.pem()).unwrap();
    tls.client_auth = false;
    let (producer, consumer) = (env(Some(tls.clone())), env(Some(tls.clone())));
    let m = refusal(&producer, &consumer);
    assert!(m.contains("is a CA certificate (basicConstraints CA:TRUE"), "{m}");
    assert!(
        m.contains(&format!("itself (its cert= file) to ca={}", tls.ca.display())),
        "{m}"
    );
}

#[test]
fn missing_pem_files_are_a_clear_error_at_construction() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let mut tls = pki(dir, "x");
    tls.key = dir.join("no-such-key.pem");
    let err = NetworkEnvironment::new(EnvConfig {
        tls: Some(tls),
        ..EnvConfig::default()
    })
    .err()
    .unwrap();
    assert!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("no-such-key.pem") && m.contains("key")),
        "{err}"
    );
}
