//! The keys of one direction of a TLS 1.3 connection (RFC 8446 §7): the AEAD key and IV derived
//! from a traffic secret, the sequence number that makes each record's nonce, and the next
//! generation of all three for KeyUpdate. The record layer ([`super::record`]) seals and
//! opens with them.

use std::io;

use aws_lc_rs::aead::{self, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use aws_lc_rs::hkdf;
use tokio_rustls::rustls::ConnectionTrafficSecrets;

/// An error for malformed or unusable TLS data.
pub(super) fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// One direction's keys: the traffic secret (for KeyUpdate), the AEAD key, the IV and the
/// sequence number of the next record.
pub(crate) struct Direction {
    aead: &'static aead::Algorithm,
    hkdf: hkdf::Algorithm,
    secret: Vec<u8>,
    pub(super) key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    pub(super) seq: u64,
}

/// An output length for HKDF-Expand.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label (RFC 8446 §7.1) with an empty context.
fn expand_label(alg: hkdf::Algorithm, secret: &[u8], label: &[u8], out: &mut [u8]) -> io::Result<()> {
    let prk = hkdf::Prk::new_less_safe(alg, secret);
    let len = (out.len() as u16).to_be_bytes();
    let label_len = [(6 + label.len()) as u8];
    let info: [&[u8]; 5] = [&len, &label_len, b"tls13 ", label, &[0]];
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| invalid("HKDF-Expand-Label failed"))
}

impl Direction {
    /// Keys from a traffic secret of the suite `suite` (the variant of rustls's extracted
    /// secrets), starting at sequence number `seq`.
    pub(crate) fn new(suite: &ConnectionTrafficSecrets, secret: &[u8], seq: u64) -> io::Result<Direction> {
        let (aead, hkdf) = match suite {
            ConnectionTrafficSecrets::Aes128Gcm { .. } => (&aead::AES_128_GCM, hkdf::HKDF_SHA256),
            ConnectionTrafficSecrets::Aes256Gcm { .. } => (&aead::AES_256_GCM, hkdf::HKDF_SHA384),
            ConnectionTrafficSecrets::Chacha20Poly1305 { .. } => {
                (&aead::CHACHA20_POLY1305, hkdf::HKDF_SHA256)
            }
            _ => return Err(invalid("unsupported TLS cipher suite")),
        };
        let mut d = Direction {
            aead,
            hkdf,
            secret: secret.to_vec(),
            key: LessSafeKey::new(
                UnboundKey::new(aead, &vec![0; aead.key_len()]).map_err(|_| invalid("AEAD key"))?,
            ),
            iv: [0; NONCE_LEN],
            seq,
        };
        d.derive()?;
        Ok(d)
    }

    /// Key and IV from the current secret.
    fn derive(&mut self) -> io::Result<()> {
        let mut key = vec![0; self.aead.key_len()];
        expand_label(self.hkdf, &self.secret, b"key", &mut key)?;
        expand_label(self.hkdf, &self.secret, b"iv", &mut self.iv)?;
        self.key = LessSafeKey::new(UnboundKey::new(self.aead, &key).map_err(|_| invalid("AEAD key"))?);
        Ok(())
    }

    /// Whether the key and IV are the ones rustls derived (`suite`'s): a check that the
    /// secrets logged and extracted belong together.
    pub(crate) fn matches(&self, suite: &ConnectionTrafficSecrets) -> bool {
        let (key, iv) = match suite {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv }
            | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
            | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
            _ => return false,
        };
        let mut ours = vec![0; self.aead.key_len()];
        expand_label(self.hkdf, &self.secret, b"key", &mut ours).is_ok()
            && ours == key.as_ref()
            && self.iv[..] == *iv.as_ref()
    }

    /// KeyUpdate: the next generation of secret, key and IV; the sequence restarts at 0.
    pub(super) fn update(&mut self) -> io::Result<()> {
        let mut next = vec![0; self.secret.len()];
        expand_label(self.hkdf, &self.secret, b"traffic upd", &mut next)?;
        self.secret = next;
        self.seq = 0;
        self.derive()
    }

    /// The nonce of the next record; counts it.
    pub(super) fn next_nonce(&mut self) -> io::Result<Nonce> {
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq = self
            .seq
            .checked_add(1)
            .ok_or_else(|| invalid("TLS sequence number exhausted"))?;
        Ok(Nonce::assume_unique_for_key(nonce))
    }
}
