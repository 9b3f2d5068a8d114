//! Buffer debloating (Flink 1.14+, FLIP-183; `taskmanager.network.memory.buffer-debloat.*`):
//! the size at which producers cut buffers, chosen by the consuming gate so that the data in
//! flight to it drains in about `target` at the rate the gate consumes.
//!
//! This module is the calculator only, with no I/O and no clock of its own: the gate feeds it
//! monotonic totals (bytes consumed, time spent idle) with the time of the call, so tests drive
//! it with made-up instants. Every [`DebloatConfig::period`] it takes a throughput sample
//! (bytes consumed per second of time *not* spent waiting for data, as Flink's
//! `ThroughputCalculator`), smooths it with an exponential moving average over
//! [`DebloatConfig::samples`] samples, and computes
//!
//! ```text
//! size = clamp(throughput × target / buffers, min_buffer, max_buffer)
//! ```
//!
//! where `buffers` is the number of buffers that can be in flight to the gate (its exclusive
//! and floating credit). A size is announced only when it differs from the last announced one
//! by at least [`DebloatConfig::threshold`] of it (damping: Flink's `threshold-percentages`).
//! Segments stay full-size in the pools; only the point at which a producer finishes a buffer
//! moves.

use std::time::{Duration, Instant};

use crate::base::config::DebloatConfig;

/// The buffer size for which `buffers` buffers hold `throughput × target` bytes, clamped to
/// `[min, max]` (`min <= max`). Monotone non-decreasing in `throughput`; `buffers == 0`
/// counts as one buffer.
pub fn buffer_size(throughput: f64, target: Duration, buffers: usize, min: usize, max: usize) -> usize {
    let ideal = throughput.max(0.0) * target.as_secs_f64() / buffers.max(1) as f64;
    // `as` saturates (and maps NaN to 0), so huge products land on `max`.
    (ideal as usize).clamp(min, max)
}

/// Whether `new` differs from `last` by at least `threshold × last` (the damping rule).
pub fn is_significant(last: usize, new: usize, threshold: f64) -> bool {
    new != last && last.abs_diff(new) as f64 >= threshold * last as f64
}

/// The calculator of one gate.
#[derive(Debug, Clone)]
pub struct Debloater {
    config: DebloatConfig,
    /// Time and totals of the last sample (or of the start).
    last: (Instant, u64, Duration),
    /// Smoothed bytes per second; `None` before the first sample.
    throughput: Option<f64>,
    /// The size last announced (the segment size until the first announcement).
    announced: usize,
    /// The size the last sample computed (announced or not).
    desired: usize,
}

impl Debloater {
    /// A calculator started at `now`, with nothing consumed and no time idle so far.
    /// The config must be valid ([`DebloatConfig::validate`]).
    pub fn new(config: DebloatConfig, now: Instant) -> Debloater {
        Debloater {
            config,
            last: (now, 0, Duration::ZERO),
            throughput: None,
            announced: config.max_buffer,
            desired: config.max_buffer,
        }
    }

    /// The settings.
    pub fn config(&self) -> &DebloatConfig {
        &self.config
    }

    /// Called at `now` with the gate's totals since it started: bytes consumed and time spent
    /// waiting for data (both monotonic), and the buffers that can be in flight to it. Takes a
    /// sample once a period has passed since the last one; returns the size to announce when
    /// the new size is a significant change from the last announced one.
    pub fn update(
        &mut self,
        now: Instant,
        bytes_total: u64,
        idle_total: Duration,
        buffers: usize,
    ) -> Option<usize> {
        let (t, bytes, idle) = self.last;
        let elapsed = now.saturating_duration_since(t);
        if elapsed < self.config.period {
            return None;
        }
        self.last = (now, bytes_total.max(bytes), idle_total.max(idle));
        let consumed = bytes_total.saturating_sub(bytes);
        let busy = elapsed.saturating_sub(idle_total.saturating_sub(idle));
        if busy.is_zero() {
            // Idle the whole period: nothing says how fast the gate could consume.
            return None;
        }
        let sample = consumed as f64 / busy.as_secs_f64();
        let alpha = 2.0 / (f64::from(self.config.samples) + 1.0);
        let smoothed = match self.throughput {
            None => sample,
            Some(prev) => prev + alpha * (sample - prev),
        };
        self.throughput = Some(smoothed);
        let c = &self.config;
        self.desired = buffer_size(smoothed, c.target, buffers, c.min_buffer, c.max_buffer);
        if is_significant(self.announced, self.desired, c.threshold) {
            self.announced = self.desired;
            Some(self.desired)
        } else {
            None
        }
    }

    /// The smoothed throughput in bytes per second (0 before the first sample).
    pub fn throughput(&self) -> f64 {
        self.throughput.unwrap_or(0.0)
    }

    /// The size last announced (the maximum before any announcement).
    pub fn announced(&self) -> usize {
        self.announced
    }

    /// The size the last sample computed, announced or not.
    pub fn desired(&self) -> usize {
        self.desired
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::base::config::{DEFAULT_DEBLOAT_MIN_BUFFER, DEFAULT_DEBLOAT_PERIOD};
    use crate::base::error::Error;
    use proptest::prelude::*;

    const SEG: usize = 32 << 10;
    const MS: Duration = Duration::from_millis(1);

    fn config() -> DebloatConfig {
        DebloatConfig {
            samples: 1, // no smoothing: each sample is the throughput
            ..DebloatConfig::new(SEG)
        }
    }

    /// A fake clock: `t(ms)` is the start plus `ms` milliseconds.
    fn clock() -> impl Fn(u64) -> Instant {
        let start = Instant::now();
        move |ms| start + Duration::from_millis(ms)
    }

    #[test]
    fn nothing_happens_before_a_period_has_passed() {
        let t = clock();
        let mut d = Debloater::new(config(), t(0));
        assert_eq!(d.update(t(199), 1 << 20, Duration::ZERO, 16), None);
        assert_eq!(d.throughput(), 0.0);
        assert_eq!(d.announced(), SEG);
    }

    #[test]
    fn a_slow_gate_announces_throughput_times_target_over_buffers() {
        let t = clock();
        let mut d = Debloater::new(config(), t(0));
        // 16 KiB in 200 ms = 80 KiB/s; 1 s of it over 16 buffers = 5 KiB per buffer.
        let size = d.update(t(200), 16 << 10, Duration::ZERO, 16);
        assert_eq!(size, Some(5 << 10));
        assert!((d.throughput() - 81920.0).abs() < 1e-6);
        assert_eq!(d.announced(), 5 << 10);
    }

    #[test]
    fn idle_time_does_not_count_as_slowness() {
        let t = clock();
        let mut d = Debloater::new(config(), t(0));
        // 8 KiB in 100 ms of busy time (the other 100 ms waiting for data): 80 KiB/s.
        d.update(t(200), 8 << 10, 100 * MS, 16);
        assert!((d.throughput() - 81920.0).abs() < 1e-6);
        // A period spent entirely idle takes no sample.
        assert_eq!(d.update(t(400), 8 << 10, 300 * MS, 16), None);
        assert!((d.throughput() - 81920.0).abs() < 1e-6);
    }

    #[test]
    fn changes_under_the_threshold_are_not_announced() {
        let t = clock();
        let mut d = Debloater::new(config(), t(0));
        assert_eq!(d.update(t(200), 16 << 10, Duration::ZERO, 16), Some(5120));
        // +20%: computed, not announced.
        assert_eq!(d.update(t(400), (16 << 10) + 19661, Duration::ZERO, 16), None);
        assert_eq!(d.desired(), 6144);
        assert_eq!(d.announced(), 5120);
        // +50% of the announced size: announced.
        assert_eq!(
            d.update(t(600), (16 << 10) + 19661 + 24576, Duration::ZERO, 16),
            Some(7680)
        );
    }

    #[test]
    fn sizes_are_clamped_to_the_minimum_and_the_segment() {
        let t = clock();
        let mut d = Debloater::new(config(), t(0));
        assert_eq!(
            d.update(t(200), 10, Duration::ZERO, 16),
            Some(DEFAULT_DEBLOAT_MIN_BUFFER)
        );
        // A fast gate goes back to whole segments.
        assert_eq!(d.update(t(400), 10 + (1 << 30), Duration::ZERO, 16), Some(SEG));
        assert_eq!(d.update(t(600), 20 + (2 << 30), Duration::ZERO, 16), None);
    }

    #[test]
    fn the_average_follows_a_step_in_throughput_gradually() {
        let t = clock();
        let mut d = Debloater::new(
            DebloatConfig {
                samples: 3, // alpha = 0.5
                ..DebloatConfig::new(SEG)
            },
            t(0),
        );
        d.update(t(200), 20_000, Duration::ZERO, 1); // 100 kB/s
        d.update(t(400), 20_000, Duration::ZERO, 1); // 0 kB/s
        assert!((d.throughput() - 50_000.0).abs() < 1e-6);
        d.update(t(600), 20_000, Duration::ZERO, 1);
        assert!((d.throughput() - 25_000.0).abs() < 1e-6);
    }

    #[test]
    fn invalid_settings_name_the_setting() {
        let msg = |c: DebloatConfig| match c.validate() {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        };
        let ok = DebloatConfig::new(SEG);
        ok.validate().unwrap();
        assert!(msg(DebloatConfig {
            target: Duration::ZERO,
            ..ok
        })
        .contains("debloat_target"));
        assert!(msg(DebloatConfig { min_buffer: 0, ..ok }).contains("debloat_min_buffer"));
        assert!(msg(DebloatConfig {
            min_buffer: SEG + 1,
            ..ok
        })
        .contains("32768"));
        assert!(msg(DebloatConfig { samples: 0, ..ok }).contains("sample"));
        assert!(msg(DebloatConfig {
            threshold: f64::NAN,
            ..ok
        })
        .contains("threshold"));
    }

    fn cfg_strategy() -> impl Strategy<Value = DebloatConfig> {
        (1u64..5000, 1usize..4096, 0usize..(1 << 20), 1u32..30, 0.0f64..1.0).prop_map(
            |(target_ms, min, extra, samples, threshold)| DebloatConfig {
                target: Duration::from_millis(target_ms),
                min_buffer: min,
                max_buffer: min + extra,
                period: DEFAULT_DEBLOAT_PERIOD,
                samples,
                threshold,
            },
        )
    }

    proptest! {
        /// Whatever the throughput, target and buffer count, the size is within bounds.
        #[test]
        fn size_is_within_bounds(
            c in cfg_strategy(),
            throughput in prop_oneof![0.0f64..1e12, Just(f64::INFINITY), Just(f64::NAN), Just(-1.0)],
            buffers in 0usize..100_000,
        ) {
            let s = buffer_size(throughput, c.target, buffers, c.min_buffer, c.max_buffer);
            prop_assert!(c.min_buffer <= s && s <= c.max_buffer);
        }

        /// More throughput never means smaller buffers.
        #[test]
        fn size_is_monotone_in_throughput(
            c in cfg_strategy(),
            a in 0.0f64..1e10,
            b in 0.0f64..1e10,
            buffers in 1usize..10_000,
        ) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let s_lo = buffer_size(lo, c.target, buffers, c.min_buffer, c.max_buffer);
            let s_hi = buffer_size(hi, c.target, buffers, c.min_buffer, c.max_buffer);
            prop_assert!(s_lo <= s_hi, "{lo} -> {s_lo}, {hi} -> {s_hi}");
        }

        /// Over any sequence of samples, every announcement is within bounds and differs from
        /// the previous announced size by at least the threshold; the announced size only
        /// changes through an announcement.
        #[test]
        fn announcements_are_bounded_and_damped(
            c in cfg_strategy(),
            steps in proptest::collection::vec((0u64..1000, 0u64..(4 << 20), 0u64..300, 1usize..64), 1..60),
        ) {
            let start = Instant::now();
            let mut d = Debloater::new(c, start);
            let (mut now, mut bytes, mut idle) = (start, 0u64, Duration::ZERO);
            let mut last = d.announced();
            for (dt_ms, more, idle_ms, buffers) in steps {
                now += Duration::from_millis(dt_ms);
                bytes += more;
                idle += Duration::from_millis(idle_ms.min(dt_ms));
                match d.update(now, bytes, idle, buffers) {
                    Some(size) => {
                        prop_assert!(c.min_buffer <= size && size <= c.max_buffer);
                        prop_assert!(size != last);
                        prop_assert!(last.abs_diff(size) as f64 >= c.threshold * last as f64);
                        prop_assert_eq!(d.announced(), size);
                        last = size;
                    }
                    None => prop_assert_eq!(d.announced(), last),
                }
                prop_assert!(d.throughput() >= 0.0 && d.throughput().is_finite());
            }
        }
    }
}
