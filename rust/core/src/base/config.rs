//! The settings types that more than one layer reads: how channels are named and retried
//! ([`ChannelSpec`], [`Backoff`]), flow control, the serving side's [`Limits`], TLS files and
//! buffer debloating. Plain values with their defaults and checks; the environment's
//! `EnvConfig` is made of them, the network and the gates read them.

use std::path::PathBuf;
use std::time::Duration;

use crate::base::error::{Error, Result};

/// Flow control between environments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowControl {
    /// Flink ≥ 1.5: senders send only with the receiver's credit.
    Credit,
    /// Flink ≤ 1.4: no credit, TCP's window pushes back (comparison mode).
    Tcp,
}

/// Which subpartition of which partition, where.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChannelSpec {
    /// Address of the environment owning the partition (`env.address`).
    pub address: String,
    /// Partition id.
    pub partition_id: String,
    /// Subpartition index.
    pub subpartition: usize,
}

/// Backoff for partition requests (Flink's `taskmanager.network.request-backoff.*`).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// First retry delay.
    pub initial: Duration,
    /// Largest delay; after a retry at this delay fails, the request fails.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }
}

/// The serving side's limits (settings of the same names on the environment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once, the ones still in their handshake included.
    pub max_connections: usize,
    /// Channels (partition requests being served) per connection.
    pub max_channels_per_connection: usize,
    /// Answers to one connection's requests (PartitionNotFound, errors, backlog
    /// announcements) queued but not yet written, because the peer does not read them.
    pub max_outstanding_requests: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 512,
            max_channels_per_connection: 16384,
            max_outstanding_requests: 4096,
        }
    }
}

impl Limits {
    /// Fails with [`Error::InvalidArgument`] if a limit is 0.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("max_connections", self.max_connections),
            ("max_channels_per_connection", self.max_channels_per_connection),
            ("max_outstanding_requests", self.max_outstanding_requests),
        ] {
            if v == 0 {
                return Err(Error::InvalidArgument(format!("{name} must be at least 1")));
            }
        }
        Ok(())
    }
}

/// TLS settings of an environment: PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The certificate chain this environment presents (leaf first).
    pub cert: PathBuf,
    /// The private key of `cert` (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The certificates this environment trusts: CA certificates peers' certificates must
    /// chain to, or peers' certificates themselves (pinned: trusted as they are, with their
    /// validity period and, for servers, the host name checked).
    pub ca: PathBuf,
    /// Mutual TLS: a server requires a client certificate signed by `ca`, and a client
    /// presents `cert`. Off: only servers prove themselves.
    pub client_auth: bool,
}

/// Settings of the buffer debloating calculator ([`crate::protocol::debloat`]). See the Python `NetworkEnvironment` for the user-facing docs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DebloatConfig {
    /// How long the data in flight to a gate should take to drain (Flink's
    /// `buffer-debloat.target`, default 1 s).
    pub target: Duration,
    /// Smallest buffer size announced, in bytes (default 256).
    pub min_buffer: usize,
    /// Largest buffer size: the segment size.
    pub max_buffer: usize,
    /// Time between throughput samples (Flink's `buffer-debloat.period`, 200 ms).
    pub period: Duration,
    /// Samples the throughput average spans (Flink's `buffer-debloat.samples`, 20).
    pub samples: u32,
    /// Relative change of the size below which nothing is announced (0.25: 25%).
    pub threshold: f64,
}

/// Smallest buffer size debloating announces by default, in bytes.
pub const DEFAULT_DEBLOAT_MIN_BUFFER: usize = 256;
/// Time between debloating's throughput samples by default.
pub const DEFAULT_DEBLOAT_PERIOD: Duration = Duration::from_millis(200);
/// Samples of debloating's moving average by default.
pub const DEFAULT_DEBLOAT_SAMPLES: u32 = 20;
/// Relative change of the buffer size debloating announces by default.
pub const DEFAULT_DEBLOAT_THRESHOLD: f64 = 0.25;

impl DebloatConfig {
    /// Flink's defaults (1 s target, 256-byte minimum, 200 ms period, 20 samples, 25%) for
    /// buffers of at most `segment_size` bytes.
    pub fn new(segment_size: usize) -> DebloatConfig {
        DebloatConfig {
            target: Duration::from_secs(1),
            min_buffer: DEFAULT_DEBLOAT_MIN_BUFFER,
            max_buffer: segment_size,
            period: DEFAULT_DEBLOAT_PERIOD,
            samples: DEFAULT_DEBLOAT_SAMPLES,
            threshold: DEFAULT_DEBLOAT_THRESHOLD,
        }
    }

    /// Fails with [`Error::InvalidArgument`] naming the setting when one is out of range.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidArgument(msg));
        if self.target.is_zero() {
            return bad("debloat_target must be a positive number of seconds".into());
        }
        if self.min_buffer == 0 || self.min_buffer > self.max_buffer {
            return bad(format!(
                "debloat_min_buffer must be between 1 and the segment size ({} bytes), got {}",
                self.max_buffer, self.min_buffer
            ));
        }
        if self.period.is_zero() {
            return bad("the debloat period must be positive".into());
        }
        if self.samples == 0 {
            return bad("the debloat average needs at least one sample".into());
        }
        if !(self.threshold.is_finite() && self.threshold >= 0.0) {
            return bad(format!(
                "the debloat threshold must be a non-negative fraction, got {}",
                self.threshold
            ));
        }
        Ok(())
    }
}
