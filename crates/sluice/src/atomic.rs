//! 64-bit atomics on every target: the standard library's where the CPU has them, and
//! portable-atomic's (a short lock per access) on 32-bit MIPS routers, which have none.
//!
//! The same goes for metrics: prometheus-client's `Counter` and `Gauge` fall back to 32 bits
//! on such targets (a byte counter would wrap after 4 GiB), so every module takes its counters
//! and gauges from here: `u64` and `i64` wherever it runs.

#[cfg(target_has_atomic = "64")]
pub use std::sync::atomic::AtomicU64;

#[cfg(not(target_has_atomic = "64"))]
pub use portable_atomic::AtomicU64;

/// A Prometheus counter of `u64` on every target.
#[cfg(target_has_atomic = "64")]
pub type Counter = prometheus_client::metrics::counter::Counter<u64>;
/// A Prometheus gauge of `i64` on every target.
#[cfg(target_has_atomic = "64")]
pub type Gauge = prometheus_client::metrics::gauge::Gauge<i64>;

/// A Prometheus counter of `u64` on every target.
#[cfg(not(target_has_atomic = "64"))]
pub type Counter = prometheus_client::metrics::counter::Counter<u64, wide::WideU64>;
/// A Prometheus gauge of `i64` on every target.
#[cfg(not(target_has_atomic = "64"))]
pub type Gauge = prometheus_client::metrics::gauge::Gauge<i64, wide::WideI64>;

/// prometheus-client's value traits over portable-atomic's 64-bit types (only built where the
/// standard library has none).
#[cfg(not(target_has_atomic = "64"))]
mod wide {
    use portable_atomic::{AtomicI64, Ordering::Relaxed};
    use prometheus_client::metrics::{counter, gauge};

    #[derive(Debug, Default)]
    pub struct WideU64(super::AtomicU64);

    impl counter::Atomic<u64> for WideU64 {
        fn inc(&self) -> u64 {
            self.0.fetch_add(1, Relaxed)
        }
        fn inc_by(&self, v: u64) -> u64 {
            self.0.fetch_add(v, Relaxed)
        }
        fn get(&self) -> u64 {
            self.0.load(Relaxed)
        }
    }

    #[derive(Debug, Default)]
    pub struct WideI64(AtomicI64);

    impl gauge::Atomic<i64> for WideI64 {
        fn inc(&self) -> i64 {
            self.0.fetch_add(1, Relaxed)
        }
        fn inc_by(&self, v: i64) -> i64 {
            self.0.fetch_add(v, Relaxed)
        }
        fn dec(&self) -> i64 {
            self.0.fetch_sub(1, Relaxed)
        }
        fn dec_by(&self, v: i64) -> i64 {
            self.0.fetch_sub(v, Relaxed)
        }
        fn set(&self, v: i64) -> i64 {
            self.0.swap(v, Relaxed)
        }
        fn get(&self) -> i64 {
            self.0.load(Relaxed)
        }
    }
}
