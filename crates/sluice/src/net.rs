//! Socket-level services: multicast membership on a named interface and batched datagram receive.
//!
//! Everything here is synchronous setup or non-blocking syscalls; callers own the readiness
//! loop (the IPTV hub wraps the socket in `tokio::io::unix::AsyncFd`).

pub mod multicast;
pub mod recv;
