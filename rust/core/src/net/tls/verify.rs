//! Certificate verification: the WebPKI verifiers of rustls, plus pinning, plus messages a
//! user can act on.
//!
//! Pinning: a peer whose certificate is byte for byte one of the certificates in `ca` is
//! trusted as it is (still checked for its validity period and, when it is a server's, for
//! the name the client connected to), like a JDK trust store trusts a certificate it holds.
//! This is what makes the certificate most guides make (`openssl req -x509 ...`, a
//! self-signed certificate with `CA:TRUE`) work when given as `cert` and `ca` on both sides;
//! plain WebPKI refuses it as a CA used as an end entity. Every other certificate goes
//! through the WebPKI verifiers unchanged (chains to a CA in `ca`). The signatures of the
//! handshake itself are always verified with the provider's algorithms.
//!
//! [`explain`] turns a rustls error of a failed handshake into a sentence that says what is
//! wrong, with which file (`cert=...`, `ca=...`), and how to fix it.

use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::crypto::{
    verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms,
};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_rustls::rustls::{
    self, AlertDescription, CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme,
};

/// Whether `cert` is one of the `pinned` certificates, byte for byte.
fn is_pinned(pinned: &[CertificateDer<'static>], cert: &CertificateDer<'_>) -> bool {
    pinned.iter().any(|p| p.as_ref() == cert.as_ref())
}

/// The checks a pinned certificate still gets: it parses, and `now` is in its validity
/// period.
fn check_pinned(cert: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
    ParsedCertificate::try_from(cert)?;
    let (not_before, not_after) = validity(cert.as_ref()).ok_or(CertificateError::BadEncoding)?;
    if now.as_secs() < not_before {
        return Err(CertificateError::NotValidYetContext {
            time: now,
            not_before: UnixTime::since_unix_epoch(std::time::Duration::from_secs(not_before)),
        }
        .into());
    }
    if now.as_secs() > not_after {
        return Err(CertificateError::ExpiredContext {
            time: now,
            not_after: UnixTime::since_unix_epoch(std::time::Duration::from_secs(not_after)),
        }
        .into());
    }
    Ok(())
}

/// The methods both verifiers share: the signatures of the handshake itself are verified with
/// the provider's algorithms (`self.algorithms`), pinned certificate or not.
macro_rules! handshake_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(message, cert, dss, &self.algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls13_signature(message, cert, dss, &self.algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algorithms.supported_schemes()
        }
    };
}

/// The server verifier of a client: pinned certificates in `ca` first, then WebPKI.
#[derive(Debug)]
pub(crate) struct ServerVerifier {
    pinned: Arc<[CertificateDer<'static>]>,
    webpki: Arc<WebPkiServerVerifier>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerVerifier {
    pub(crate) fn new(
        pinned: Arc<[CertificateDer<'static>]>,
        webpki: Arc<WebPkiServerVerifier>,
        algorithms: WebPkiSupportedAlgorithms,
    ) -> ServerVerifier {
        ServerVerifier {
            pinned,
            webpki,
            algorithms,
        }
    }
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if is_pinned(&self.pinned, end_entity) {
            check_pinned(end_entity, now)?;
            let cert = ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_name(&cert, server_name)?;
            return Ok(ServerCertVerified::assertion());
        }
        self.webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    handshake_signatures!();
}

/// The client verifier of a server (mutual TLS): pinned certificates in `ca` first, then
/// WebPKI. Like WebPKI's, it checks no name: a client's address says nothing about it.
#[derive(Debug)]
pub(crate) struct ClientVerifier {
    pinned: Arc<[CertificateDer<'static>]>,
    webpki: Arc<dyn ClientCertVerifier>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientVerifier {
    pub(crate) fn new(
        pinned: Arc<[CertificateDer<'static>]>,
        webpki: Arc<dyn ClientCertVerifier>,
        algorithms: WebPkiSupportedAlgorithms,
    ) -> ClientVerifier {
        ClientVerifier {
            pinned,
            webpki,
            algorithms,
        }
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.webpki.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.webpki.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if is_pinned(&self.pinned, end_entity) {
            check_pinned(end_entity, now)?;
            return Ok(ClientCertVerified::assertion());
        }
        self.webpki.verify_client_cert(end_entity, intermediates, now)
    }

    handshake_signatures!();
}

// ------------------------------------------------------------------------ validity period

/// One DER element at the start of `d`: its tag, its contents and what follows it.
fn tlv(d: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, d) = d.split_first()?;
    let (&first, mut d) = d.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || d.len() < n {
            return None;
        }
        let len = d[..n].iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        d = &d[n..];
        len
    };
    (d.len() >= len).then(|| (tag, &d[..len], &d[len..]))
}

/// The validity period of a DER certificate (RFC 5280 4.1.2.5) as UNIX seconds: notBefore
/// and notAfter. `None` if it does not parse.
fn validity(cert: &[u8]) -> Option<(u64, u64)> {
    const SEQUENCE: u8 = 0x30;
    const VERSION: u8 = 0xa0;
    let (SEQUENCE, cert, _) = tlv(cert)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = tlv(cert)? else {
        return None;
    };
    let (tag, _, after_version) = tlv(tbs)?;
    let rest = if tag == VERSION { after_version } else { tbs };
    let (_, _, rest) = tlv(rest)?; // serialNumber
    let (_, _, rest) = tlv(rest)?; // signature
    let (_, _, rest) = tlv(rest)?; // issuer
    let (SEQUENCE, period, _) = tlv(rest)? else {
        return None;
    };
    let (tag_before, before, rest) = tlv(period)?;
    let (tag_after, after, _) = tlv(rest)?;
    Some((der_time(tag_before, before)?, der_time(tag_after, after)?))
}

/// A DER UTCTime (tag 23, `YYMMDDHHMMSSZ`) or GeneralizedTime (tag 24, `YYYYMMDDHHMMSSZ`)
/// as UNIX seconds (0 for times before 1970).
fn der_time(tag: u8, s: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(s).ok()?.strip_suffix('Z')?;
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (year, rest) = match (tag, s.len()) {
        (23, 12) => {
            let yy: i64 = s[..2].parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &s[2..])
        }
        (24, 14) => (s[..4].parse().ok()?, &s[4..]),
        _ => return None,
    };
    let n = |i: usize| rest[i..i + 2].parse::<i64>().ok();
    let (month, day, hour, minute, second) = (n(0)?, n(2)?, n(4)?, n(6)?, n(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Some(u64::try_from(secs).unwrap_or(0))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `secs` (UNIX) as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    // Inverse of days_from_civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

// ------------------------------------------------------------------------------ messages

/// The files of an environment's TLS settings that messages name.
#[derive(Debug, Clone)]
pub(crate) struct Files {
    pub(crate) cert: PathBuf,
    pub(crate) ca: PathBuf,
}

/// The other end of a handshake, for messages.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Peer<'a> {
    /// We are the client; the server at this address.
    Server(&'a str),
    /// We are the server; the client from this address.
    Client(&'a str),
}

impl Peer<'_> {
    fn role(self) -> &'static str {
        match self {
            Peer::Server(_) => "server",
            Peer::Client(_) => "client",
        }
    }

    /// "the server at ADDR" / "the client at ADDR".
    fn who(self) -> String {
        match self {
            Peer::Server(a) | Peer::Client(a) => format!("the {} at {a}", self.role()),
        }
    }
}

/// A name of a certificate's subjectAltName as webpki reports it (`DnsName("x")`,
/// `IpAddress(1.2.3.4)`) in openssl's notation (`DNS:x`, `IP:1.2.3.4`).
fn san(presented: &str) -> String {
    let inner = |prefix: &str| {
        presented
            .strip_prefix(prefix)
            .and_then(|s| s.strip_suffix(')'))
            .map(|s| s.trim_matches('"').to_string())
    };
    if let Some(n) = inner("DnsName(") {
        format!("DNS:{n}")
    } else if let Some(n) = inner("IpAddress(") {
        format!("IP:{n}")
    } else if let Some(n) = inner("UniformResourceIdentifier(") {
        format!("URI:{n}")
    } else {
        presented.to_string()
    }
}

/// What is wrong with the peer's certificate, which `verify_*_cert` refused with `e`; and
/// how to fix it.
fn refused_theirs(e: &CertificateError, peer: Peer<'_>, files: &Files) -> String {
    let (who, role) = (peer.who(), peer.role());
    let ca = files.ca.display();
    let trust_fix = format!(
        "Fix: add to ca={ca} the CA certificate that signed the {role}'s certificate, or, for a \
         self-signed certificate, the {role}'s certificate itself (its cert= file)"
    );
    let remake = format!(
        "Fix: give the {role} a new certificate (cert= and key=, e.g. made with `creditflow certs`) \
         and put it, or the CA that signed it, into ca={ca}"
    );
    #[allow(deprecated)]
    match e {
        CertificateError::UnknownIssuer => format!(
            "the certificate of {who} is not trusted: it is not in ca={ca}, and no certificate in \
             ca={ca} signed it. {trust_fix}"
        ),
        CertificateError::ExpiredContext { time, not_after } => format!(
            "the certificate of {who} expired on {} (it is now {}). {remake}",
            utc(not_after.as_secs()),
            utc(time.as_secs())
        ),
        CertificateError::Expired => format!(
            "the certificate of {who} (or of a CA in its chain) has expired or has an invalid \
             validity period. {remake}"
        ),
        CertificateError::NotValidYetContext { time, not_before } => format!(
            "the certificate of {who} is not valid before {} (it is now {}). Fix: check the clocks \
             of both hosts, or give the {role} a certificate valid from now",
            utc(not_before.as_secs()),
            utc(time.as_secs())
        ),
        CertificateError::NotValidYet => format!(
            "the certificate of {who} (or of a CA in its chain) is not valid yet. Fix: check the \
             clocks of both hosts, or give the {role} a certificate valid from now"
        ),
        CertificateError::NotValidForNameContext { expected, presented } => {
            let expected = expected.to_str();
            let names = if presented.is_empty() {
                "it names no host in its subjectAltName".to_string()
            } else {
                let names: Vec<String> = presented.iter().map(|p| san(p)).collect();
                format!("it is for {}", names.join(", "))
            };
            format!(
                "the certificate of {who} is not valid for {expected:?}, the host this environment \
                 connects to ({names}). Fix: connect to a host the certificate names, or give the \
                 {role} a certificate whose subjectAltName includes {expected} (e.g. `creditflow \
                 certs --out DIR {expected}`)"
            )
        }
        CertificateError::NotValidForName => format!(
            "the certificate of {who} is not valid for the host this environment connects to. Fix: \
             connect to a host the certificate names, or give the {role} a certificate whose \
             subjectAltName includes that host"
        ),
        CertificateError::BadSignature => format!(
            "a signature on the certificate of {who} does not verify with the CA certificate in \
             ca={ca} that has the issuer's name: ca={ca} holds another CA of the same name (made \
             again since?). {trust_fix}"
        ),
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            let usage = match peer {
                Peer::Server(_) => "serverAuth",
                Peer::Client(_) => "clientAuth",
            };
            format!(
                "the certificate of {who} is not for TLS {role} authentication (its \
                 extendedKeyUsage lacks {usage}). Fix: give the {role} a certificate with both \
                 serverAuth and clientAuth (`creditflow certs` makes such)"
            )
        }
        CertificateError::UnsupportedSignatureAlgorithm
        | CertificateError::UnsupportedSignatureAlgorithmContext { .. }
        | CertificateError::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => format!(
            "the certificate of {who} (or a CA certificate in its chain) is signed with an \
             algorithm that is not accepted (such as SHA-1 or MD5). Fix: make the certificates \
             again with SHA-256 (`creditflow certs` does)"
        ),
        CertificateError::BadEncoding => format!(
            "the certificate of {who} is not a valid X.509 certificate. Fix: check the {role}'s \
             cert= file (PEM, leaf first)"
        ),
        CertificateError::Other(other) => {
            let inner: &(dyn std::error::Error + 'static) = &*other.0;
            match inner.downcast_ref::<webpki::Error>() {
                Some(webpki::Error::CaUsedAsEndEntity) => format!(
                    "the certificate of {who} is a CA certificate (basicConstraints CA:TRUE, as \
                     `openssl req -x509` makes), which identifies a peer only when it is itself \
                     in ca={ca}, and it is not. Fix: add the {role}'s certificate itself (its \
                     cert= file) to ca={ca}, or give the {role} a node certificate signed by a CA \
                     in ca={ca} (`creditflow certs`)"
                ),
                Some(webpki::Error::EndEntityUsedAsCa) => format!(
                    "the certificate of {who} is signed by a certificate that is not a CA \
                     (basicConstraints CA:FALSE). Fix: sign node certificates with a CA \
                     certificate and put that CA into ca={ca} (`creditflow certs` does)"
                ),
                Some(w) => format!("the certificate of {who} was refused ({w:?}). {trust_fix}"),
                None => format!("the certificate of {who} was refused: {inner}. {trust_fix}"),
            }
        }
        other => format!("the certificate of {who} was refused: {other}. {trust_fix}"),
    }
}

/// Why the peer refused our certificate, from the alert it sent; and how to fix it.
fn refused_ours(alert: AlertDescription, peer: Peer<'_>, files: &Files) -> String {
    let (who, role) = (peer.who(), peer.role());
    let cert = files.cert.display();
    let why = match alert {
        AlertDescription::CertificateRequired => {
            return format!(
                "{who} requires a client certificate (its client_auth=True) and this environment \
                 sent none (client_auth=False). Fix: set the same client_auth on both sides"
            );
        }
        AlertDescription::UnknownCA => format!(
            "it does not trust it: neither cert={cert} nor the CA that signed it is in the {role}'s \
             ca= file"
        ),
        AlertDescription::CertificateExpired => {
            "it has expired or is not valid yet (or the clocks differ)".to_string()
        }
        AlertDescription::BadCertificate => "it is malformed or not valid for this host".to_string(),
        AlertDescription::DecryptError => {
            format!("a signature on it does not verify with the CA in the {role}'s ca= file")
        }
        AlertDescription::UnsupportedCertificate => {
            "it is not for this use (its extendedKeyUsage)".to_string()
        }
        AlertDescription::CertificateUnknown => format!(
            "it is not acceptable (for example a CA certificate that is not itself in the {role}'s \
             ca= file)"
        ),
        AlertDescription::AccessDenied => "access denied".to_string(),
        other => format!("TLS alert {other:?}"),
    };
    format!(
        "{who} refused this environment's certificate (cert={cert}): {why}. Fix: put the CA that \
         signed cert={cert}, or for a self-signed certificate cert={cert} itself, into the {role}'s \
         ca= file, and check that the certificate is valid; the {role}'s log says more"
    )
}

/// A failed handshake's rustls error `e` with `peer` as a sentence naming the file at fault
/// and the fix, for a user (no rustls debug formatting).
pub(crate) fn explain(e: &rustls::Error, peer: Peer<'_>, files: &Files) -> String {
    match e {
        rustls::Error::InvalidCertificate(ce) => refused_theirs(ce, peer, files),
        rustls::Error::AlertReceived(alert) => refused_ours(*alert, peer, files),
        rustls::Error::NoCertificatesPresented => match peer {
            Peer::Client(_) => format!(
                "{} presented no certificate, but this environment requires one (client_auth=True). \
                 Fix: set the same client_auth on both sides",
                peer.who()
            ),
            Peer::Server(_) => format!("{} presented no certificate", peer.who()),
        },
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => format!(
            "{} did not answer in TLS (does it have tls=... configured?)",
            peer.who()
        ),
        other => format!("{}: {other}", peer.who()),
    }
}

/// The TLS alert a record reader reports (`record`), if `e` is one.
pub(crate) fn alert_of(e: &std::io::Error) -> Option<AlertDescription> {
    e.get_ref()?
        .downcast_ref::<super::record::PeerAlert>()
        .map(|a| AlertDescription::from(a.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_times_and_dates_round_trip() {
        assert_eq!(der_time(23, b"700101000000Z"), Some(0));
        assert_eq!(der_time(23, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(der_time(24, b"20240229120000Z"), Some(1_709_208_000));
        assert_eq!(der_time(24, b"20240229120000"), None);
        assert_eq!(der_time(23, b"20240229120000Z"), None);
        assert_eq!(utc(1_709_208_000), "2024-02-29 12:00:00 UTC");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
    }

    #[test]
    fn validity_comes_from_the_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2001, 2, 3);
        params.not_after = rcgen::date_time_ymd(2051, 6, 7);
        let cert = params.self_signed(&key).unwrap();
        let (before, after) = validity(cert.der()).unwrap();
        assert_eq!(utc(before), "2001-02-03 00:00:00 UTC");
        assert_eq!(utc(after), "2051-06-07 00:00:00 UTC");
        assert_eq!(validity(&cert.der()[..40]), None);
    }

    #[test]
    fn subject_alt_names_read_like_openssl() {
        assert_eq!(san("DnsName(\"localhost\")"), "DNS:localhost");
        assert_eq!(san("IpAddress(127.0.0.1)"), "IP:127.0.0.1");
        assert_eq!(san("DirectoryName"), "DirectoryName");
    }
}
