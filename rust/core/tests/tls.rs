//! TLS between two environments over loopback, with certificates made here (rcgen): a mutual
//! TLS exchange delivers everything, plaintext and TLS peers refuse each other with a clear
//! error on both sides, and a certificate from another CA is refused.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use creditflow_core::base::config::ChannelSpec;
use creditflow_core::base::config::TlsSettings;
use creditflow_core::base::error::Error;
use creditflow_core::base::wait::Wait;
use creditflow_core::env::{EnvConfig, NetworkEnvironment};
use creditflow_core::partition::partitioner::Partitioner;
use creditflow_core::partition::writer::RecordWriter;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// A directory of its own per call, removed at the end of the process by nobody: the files
/// are a few KiB under the system temp dir.
fn scratch_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "creditflow-tls-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

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

fn env(tls: Option<TlsSettings>) -> NetworkEnvironment {
    NetworkEnvironment::new(EnvConfig {
        memory: 4 << 20,
        tls,
        secret: Some(b"s3cret".to_vec()),
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

fn wait() -> Wait<'static> {
    Wait::timeout(Some(Duration::from_secs(30)), "tls test")
}

/// Writes `n` batches into "p" of `producer` and reads them in `consumer`; the rows read,
/// or the gate's error.
fn exchange(
    producer: &NetworkEnvironment,
    consumer: &NetworkEnvironment,
    n: usize,
) -> Result<Vec<i64>, Error> {
    let part = producer.create_partition("p", 1).unwrap();
    let spec = ChannelSpec {
        address: producer.address().into(),
        partition_id: "p".into(),
        subpartition: 0,
    };
    let mut gate = consumer.create_input_gate(vec![spec]).unwrap();
    let writer = std::thread::spawn(move || {
        let mut w = RecordWriter::new(part, Partitioner::Forward);
        for i in 0..n {
            if w.write(&batch((i * 1000) as i64, 1000), &mut wait()).is_err() {
                return;
            }
        }
        let _ = w.close();
    });
    let mut rows = Vec::new();
    let result = loop {
        match gate.next(&mut wait()) {
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
    let dir = scratch_dir();
    let tls = pki(&dir, "ok");
    let (producer, consumer) = (env(Some(tls.clone())), env(Some(tls)));
    let rows = exchange(&producer, &consumer, 50).unwrap();
    assert_eq!(rows, (0..50_000).collect::<Vec<i64>>());
}

#[test]
fn a_plaintext_peer_is_refused_by_a_tls_listener_with_a_clear_error() {
    let dir = scratch_dir();
    let (producer, consumer) = (env(Some(pki(&dir, "srv"))), env(None));
    let err = exchange(&producer, &consumer, 5).unwrap_err();
    assert!(
        matches!(&err, Error::Authentication(m) if m.contains("requires TLS")),
        "{err}"
    );
}

#[test]
fn a_tls_client_is_refused_by_a_plaintext_listener_with_a_clear_error() {
    let dir = scratch_dir();
    let (producer, consumer) = (env(None), env(Some(pki(&dir, "cli"))));
    let err = exchange(&producer, &consumer, 5).unwrap_err();
    assert!(
        matches!(&err, Error::Authentication(m) if m.contains("did not answer in TLS")),
        "{err}"
    );
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let dir = scratch_dir();
    let (producer, consumer) = (env(Some(pki(&dir, "a"))), env(Some(pki(&dir, "b"))));
    let err = exchange(&producer, &consumer, 5).unwrap_err();
    assert!(
        matches!(&err, Error::Authentication(m) if m.contains("TLS handshake")),
        "{err}"
    );
}

#[test]
fn missing_pem_files_are_a_clear_error_at_construction() {
    let dir = scratch_dir();
    let mut tls = pki(&dir, "x");
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
