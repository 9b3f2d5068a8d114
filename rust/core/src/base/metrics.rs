//! Cheap counters and time meters, read on demand (Flink's `Counter`, `TimerGauge`,
//! back-pressure levels).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The transport a connection's channels use, as metrics name it (both sides: the receiving
/// channel and the subpartition that sends to it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ChannelTransport {
    /// Frames over the TCP (or TLS) connection.
    #[default]
    Tcp,
    /// Frames through shared-memory rings.
    Shm,
}

impl ChannelTransport {
    /// `"tcp"` or `"shm"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelTransport::Tcp => "tcp",
            ChannelTransport::Shm => "shm",
        }
    }
}

/// How long the last window a meter reports covers.
pub const METER_WINDOW: Duration = Duration::from_secs(1);

/// Measures the share of wall time spent in some state (blocked on a buffer, waiting for
/// data) over the last [`METER_WINDOW`], as milliseconds per second.
#[derive(Debug)]
pub struct TimeMeter {
    epoch: Instant,
    /// Nanoseconds spent in the state by finished intervals.
    total_ns: AtomicU64,
    /// Start of the running interval as ns since `epoch` + 1; 0 when not in the state.
    running_since: AtomicU64,
    /// (time, total) samples of the last windows, oldest first.
    samples: Mutex<Vec<(Instant, u64)>>,
}

impl Default for TimeMeter {
    fn default() -> Self {
        let epoch = Instant::now();
        TimeMeter {
            epoch,
            total_ns: AtomicU64::new(0),
            running_since: AtomicU64::new(0),
            samples: Mutex::new(vec![(epoch, 0)]),
        }
    }
}

impl TimeMeter {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// Enters the state. Returns a guard that leaves it when dropped.
    pub fn start(&self) -> TimeMeterGuard<'_> {
        self.running_since.store(self.now_ns(), Ordering::SeqCst);
        TimeMeterGuard { meter: self }
    }

    /// Enters the state unless already in it, for a state that outlasts a scope (a caller
    /// that polls, and learns it waits only once it finds nothing); [`TimeMeter::leave`] ends it.
    pub fn enter(&self) {
        let _ = self
            .running_since
            .compare_exchange(0, self.now_ns(), Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Leaves the state, if in it.
    pub fn leave(&self) {
        self.stop();
    }

    fn stop(&self) {
        let since = self.running_since.swap(0, Ordering::SeqCst);
        if since != 0 {
            self.total_ns
                .fetch_add(self.now_ns().saturating_sub(since), Ordering::SeqCst);
        }
    }

    /// Total time ever spent in the state, including a running interval.
    pub fn total(&self) -> Duration {
        let since = self.running_since.load(Ordering::SeqCst);
        let running = if since == 0 {
            0
        } else {
            self.now_ns().saturating_sub(since)
        };
        Duration::from_nanos(self.total_ns.load(Ordering::SeqCst) + running)
    }

    /// Records a sample; called periodically (every ~250 ms by the environment's flusher)
    /// so that [`TimeMeter::ms_per_second`] covers the last second.
    pub fn tick(&self) {
        let now = Instant::now();
        let total = self.total().as_nanos() as u64;
        let mut s = self.samples.lock().unwrap();
        s.push((now, total));
        // Keep the newest sample at least METER_WINDOW old, and everything after it.
        while s.len() > 2 && now.duration_since(s[1].0) >= METER_WINDOW {
            s.remove(0);
        }
    }

    /// Milliseconds per second spent in the state over (about) the last second.
    pub fn ms_per_second(&self) -> f64 {
        let now = Instant::now();
        let total = self.total().as_nanos() as u64;
        let s = self.samples.lock().unwrap();
        // The newest sample that is at least a window old, else the oldest.
        let base = s
            .iter()
            .rev()
            .find(|(t, _)| now.duration_since(*t) >= METER_WINDOW)
            .unwrap_or(&s[0]);
        let dt = now.duration_since(base.0).as_secs_f64();
        if dt <= 0.0 {
            return 0.0;
        }
        ((total.saturating_sub(base.1)) as f64 / 1e6 / dt).clamp(0.0, 1000.0)
    }
}

/// Leaves the meter's state on drop.
pub struct TimeMeterGuard<'a> {
    meter: &'a TimeMeter,
}

impl Drop for TimeMeterGuard<'_> {
    fn drop(&mut self) {
        self.meter.stop();
    }
}

/// Flink's back-pressure levels from the ratio of time blocked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackpressureLevel {
    /// ratio <= 0.10
    Ok,
    /// ratio <= 0.50
    Low,
    /// ratio > 0.50
    High,
}

impl BackpressureLevel {
    /// Level for `ms_per_second` of backpressured time.
    pub fn from_ms_per_second(ms: f64) -> BackpressureLevel {
        let ratio = ms / 1000.0;
        if ratio <= 0.10 {
            BackpressureLevel::Ok
        } else if ratio <= 0.50 {
            BackpressureLevel::Low
        } else {
            BackpressureLevel::High
        }
    }

    /// "OK", "LOW" or "HIGH".
    pub fn as_str(&self) -> &'static str {
        match self {
            BackpressureLevel::Ok => "OK",
            BackpressureLevel::Low => "LOW",
            BackpressureLevel::High => "HIGH",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_flinks_thresholds() {
        assert_eq!(
            BackpressureLevel::from_ms_per_second(100.0),
            BackpressureLevel::Ok
        );
        assert_eq!(
            BackpressureLevel::from_ms_per_second(100.1),
            BackpressureLevel::Low
        );
        assert_eq!(
            BackpressureLevel::from_ms_per_second(500.0),
            BackpressureLevel::Low
        );
        assert_eq!(
            BackpressureLevel::from_ms_per_second(500.1),
            BackpressureLevel::High
        );
    }

    #[test]
    fn meter_reports_time_in_state_over_the_last_second() {
        let m = TimeMeter::default();
        {
            let _g = m.start();
            std::thread::sleep(Duration::from_millis(300));
        }
        m.tick();
        let v = m.ms_per_second();
        assert!(v > 200.0 && v <= 1000.0, "{v}");
        std::thread::sleep(Duration::from_millis(1100));
        m.tick();
        assert!(m.ms_per_second() < 50.0, "old blocking drops out of the window");
        let _g = m.start();
        std::thread::sleep(Duration::from_millis(1100));
        m.tick();
        assert!(m.ms_per_second() > 800.0, "a running interval counts");
    }
}
