//! The shared-secret proof of the handshake: HMAC-SHA256 challenge-response.
//!
//! Each side sends a fresh random nonce; the other side answers with
//! `HMAC-SHA256(secret, "creditflow-auth-v1" || role || nonce)`. The role byte differs for
//! the client's and the server's answer, so a peer cannot reflect one side's own tag back at
//! it. Tags are compared in constant time.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::base::error::{Error, Result};
use crate::protocol::wire::{AuthTag, Nonce};

/// Who computes the tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The connecting side (answers the server's nonce in AuthProof).
    Client = 1,
    /// The accepting side (answers the client's nonce in HelloAck).
    Server = 2,
}

const CONTEXT: &[u8] = b"creditflow-auth-v1";

/// A fresh random nonce.
pub(crate) fn nonce() -> Result<Nonce> {
    let mut n = Nonce::default();
    getrandom::fill(&mut n)
        .map_err(|e| Error::Authentication(format!("no randomness for the handshake nonce: {e}")))?;
    Ok(n)
}

fn mac(secret: &[u8], role: Role, nonce: &Nonce) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes keys of any length");
    m.update(CONTEXT);
    m.update(&[role as u8]);
    m.update(nonce);
    m
}

/// The tag `role` sends to answer `nonce`.
pub(crate) fn tag(secret: &[u8], role: Role, nonce: &Nonce) -> AuthTag {
    mac(secret, role, nonce).finalize().into_bytes().into()
}

/// Whether `tag` is `role`'s answer to `nonce` under `secret` (constant time).
pub(crate) fn verify(secret: &[u8], role: Role, nonce: &Nonce, tag: &AuthTag) -> bool {
    mac(secret, role, nonce).verify_slice(tag).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn right_secret_verifies_wrong_secret_and_reflection_do_not() {
        let n = nonce().unwrap();
        let t = tag(b"s3cret", Role::Server, &n);
        assert!(verify(b"s3cret", Role::Server, &n, &t));
        assert!(!verify(b"other", Role::Server, &n, &t));
        // The client's answer to the same nonce is a different tag: no reflection.
        assert!(!verify(b"s3cret", Role::Client, &n, &t));
        let mut bad = t;
        bad[0] ^= 1;
        assert!(!verify(b"s3cret", Role::Server, &n, &bad));
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
