//! 64-bit atomics on every target: the standard library's where the CPU has them, and
//! portable-atomic's (a short lock per access) on 32-bit MIPS routers, which have none.

#[cfg(target_has_atomic = "64")]
pub use std::sync::atomic::AtomicU64;

#[cfg(not(target_has_atomic = "64"))]
pub use portable_atomic::AtomicU64;

/// A metric's value as `u64`, whatever width prometheus-client gives counters and gauges on
/// this target (32 bits without 64-bit atomics).
pub fn widen<T: Into<u64>>(value: T) -> u64 {
    value.into()
}
