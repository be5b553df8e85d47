//! Socket-level services: multicast membership on a named interface, batched datagram receive,
//! the splice relay of the TCP front end (and the spliced bodies of `/proxy/stream`), and
//! connections counted per client address.
//!
//! The socket code here is synchronous setup or non-blocking syscalls; callers own the readiness
//! loop (the IPTV hub wraps the socket in `tokio::io::unix::AsyncFd`). The per-address count is
//! plain bookkeeping under a lock.

#[cfg(feature = "iptv")]
pub mod multicast;
pub mod per_ip;
#[cfg(feature = "iptv")]
pub mod recv;
pub mod splice;
