//! 64-bit atomics on every target: the standard library's where the CPU has them, and
//! portable-atomic's (a short lock per access) on 32-bit MIPS routers, which have none.

#[cfg(target_has_atomic = "64")]
pub use std::sync::atomic::AtomicU64;

#[cfg(not(target_has_atomic = "64"))]
pub use portable_atomic::AtomicU64;
