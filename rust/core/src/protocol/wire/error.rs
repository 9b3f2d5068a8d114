//! How the codec reports a peer that broke the format.

use crate::base::error::Error;

/// A protocol error: the bytes cannot be a frame of this protocol.
pub(super) fn protocol(msg: String) -> Error {
    Error::Protocol(msg)
}
