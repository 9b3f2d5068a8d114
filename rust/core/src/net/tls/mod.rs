//! TLS under the creditflow handshake: rustls does the TLS 1.3 handshake (`handshake`), then
//! the connection's records are sealed and opened by our own record layer on its read and
//! write halves (`record`), so a data payload is encrypted straight from its segment. Peers'
//! certificates are checked by `verify` (WebPKI, plus certificates pinned in `ca`).

mod handshake;
mod keys;
mod record;
mod verify;

pub(crate) use handshake::{first_byte, Tls, TLS_HANDSHAKE_RECORD};
