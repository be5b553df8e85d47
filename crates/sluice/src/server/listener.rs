//! Listening sockets, the open-file limit, and an accept loop that pauses at a connection limit
//! or when the process runs out of file descriptors.
//!
//! Every front end that accepts TCP (the HTTP server, the TCP proxy) goes through
//! [`Acceptor::accept`], so "how many client connections may be open" is one number per listener
//! set, enforced the same way: at the limit the loop stops calling `accept(2)` and waits for a
//! connection to close. New clients then queue in the kernel's backlog instead of being accepted
//! and dropped, and nothing spins.
//!
//! Binding prefers an inherited socket for the same address: one systemd passed in (`LISTEN_FDS`,
//! socket activation) or one the previous process handed over on a binary upgrade
//! (`server::upgrade`). Every listening socket is recorded, so an upgrade can hand them all on.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use crate::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::atomic::Counter;
use crate::atomic::Gauge;
use crate::net::per_ip::IpPlace;
pub use crate::net::per_ip::PerIp;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub mod inherited;

/// Binds `addr` with `SO_REUSEADDR` and a deep backlog (or takes the inherited socket for it).
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    if let Some(inherited) = inherited::take(addr) {
        inherited.set_nonblocking(true)?;
        inherited::record(&inherited);
        return TcpListener::from_std(inherited);
    }
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    inherited::record(&socket);
    TcpListener::from_std(socket.into())
}

/// Binds `addr` with `SO_REUSEPORT` as well, for the per-core runtime model: every core binds its
/// own socket to the same address and the kernel spreads new connections over them. Returns a
/// standard (non-blocking) listener, so the core's own runtime registers it.
pub fn bind_reuseport(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    if let Some(inherited) = inherited::take(addr) {
        inherited.set_nonblocking(true)?;
        inherited::record(&inherited);
        return Ok(inherited);
    }
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    inherited::record(&socket);
    Ok(socket.into())
}

/// Descriptors kept back from the connection budget for listeners, multicast sockets, config
/// and playlist files, logs and the like.
const RESERVED_FDS: u64 = 64;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (the default soft limit of 1024 caps a
/// proxy at a few hundred viewers) and returns the soft limit in force afterwards.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            let e = io::Error::last_os_error();
            tracing::warn!(soft = before, hard = lim.rlim_max, error = %e, "cannot raise the open-file limit");
            return Ok(before);
        }
        tracing::info!(
            from = before,
            to = lim.rlim_cur,
            "raised the open-file limit (RLIMIT_NOFILE) to its hard limit"
        );
    }
    Ok(lim.rlim_cur)
}

/// The connection limit derived from the open-file limit: each proxied client costs about two
/// descriptors (its own and an upstream one), after a reserve for everything else.
pub fn connections_for_fd_limit(nofile: u64) -> usize {
    let usable = nofile.saturating_sub(RESERVED_FDS).max(2) / 2;
    usize::try_from(usable).unwrap_or(usize::MAX).max(1)
}

/// The current soft `RLIMIT_NOFILE`, without changing it.
pub fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    lim.rlim_cur
}

/// What an acceptor reports: pauses at the limit and the connections open now.
#[derive(Clone, Debug, Default)]
pub struct AcceptMetrics {
    /// Times accepting paused because `max` connections were open.
    pub paused: Counter,
    /// Connections open now (holding a slot).
    pub open: Gauge,
}

impl AcceptMetrics {
    /// Creates the acceptor's families and registers them in `registry`.
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = AcceptMetrics::default();
        registry.register(
            "downstream_accept_paused",
            "Times accepting paused because server.max_connections connections were open",
            m.paused.clone(),
        );
        registry.register(
            "downstream_open_connections",
            "Client connections open now",
            m.open.clone(),
        );
        m
    }
}

/// Accepts connections while fewer than `max` are open; shared by every listener of one front
/// end so the limit covers them together.
#[derive(Clone, Debug)]
pub struct Acceptor {
    slots: Arc<Semaphore>,
    max: usize,
    metrics: AcceptMetrics,
    /// When the last warning was logged (seconds since `born`, plus 1; 0 = never), so a
    /// server saturated for hours logs once a minute, not once per accept.
    warned: Arc<AtomicU64>,
    born: Instant,
    per_ip: Arc<PerIp>,
}

/// One open connection's slot; dropping it (connection closed) lets the acceptor take another.
/// Every open connection's task holds one, so it is kept to three pointers: the acceptor's
/// semaphore (the permit itself is forgotten and given back on drop) and the per-IP place,
/// boxed, since only a connection from a counted address has one.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Semaphore>,
    _ip: Option<Box<IpPlace>>,
    open: Gauge,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, ip: Option<IpPlace>, open: Gauge) -> Slot {
        let slots = permit.semaphore().clone();
        debug_assert_eq!(permit.num_permits(), 1);
        permit.forget();
        Slot {
            slots,
            _ip: ip.map(Box::new),
            open,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.add_permits(1);
        self.open.dec();
    }
}

/// The HTTP listeners' per-IP share (`server.max_connections_per_ip`, `per_ip_exempt`), for
/// TCP and QUIC connections alike: an IPv6 client is counted by its /64, as a `[[tcp]]`
/// listener and the media request share count it, since one host is commonly given a whole /64
/// and, counted address by address, would hold a share per address.
pub fn client_share(max: usize, exempt: Vec<ipnet::IpNet>) -> Arc<PerIp> {
    PerIp::by_network(max, exempt)
}

impl Acceptor {
    /// An acceptor that keeps at most `max` connections open (at least 1).
    pub fn new(max: usize, metrics: AcceptMetrics) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            metrics,
            warned: Arc::new(AtomicU64::new(0)),
            born: Instant::now(),
            per_ip: Arc::default(),
        }
    }

    /// Also caps the connections of each client IP (`server.max_connections_per_ip`).
    pub fn per_ip(mut self, per_ip: Arc<PerIp>) -> Self {
        self.per_ip = per_ip;
        self
    }

    fn warn_throttled(&self) {
        let now = self.born.elapsed().as_secs() + 1;
        let last = self.warned.load(Ordering::Relaxed);
        if (last == 0 || now >= last + 60)
            && self
                .warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                max = self.max,
                "connection limit reached: not accepting until a connection closes (logged at most once a minute; see sluice_downstream_accept_paused_total)"
            );
        }
    }

    /// The limit in force.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Waits for a free slot, then accepts one connection. At the limit, nothing is accepted
    /// (clients wait in the backlog) until a slot is released; the pause is counted once.
    pub async fn accept(&self, listener: &TcpListener) -> (TcpStream, SocketAddr, Slot) {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.metrics.paused.inc();
                self.warn_throttled();
                self.slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the acceptor never closes its semaphore")
            }
        };
        loop {
            let (stream, peer) = accept(listener).await;
            let Some(place) = self.per_ip.take(peer.ip()) else {
                // Over its share: closed at once (the client sees a reset or EOF), and the
                // slot goes to the next connection.
                tracing::debug!(%peer, "connection closed: max_connections_per_ip reached");
                drop(stream);
                continue;
            };
            self.metrics.open.inc();
            let slot = Slot::new(permit, place, self.metrics.open.clone());
            return (stream, peer, slot);
        }
    }
}

/// Why [`Acceptor::try_slot`] refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// `server.max_connections` connections are open.
    Connections,
    /// The client's IP holds `server.max_connections_per_ip` already.
    PerIp,
}

impl Acceptor {
    /// A slot for a connection that arrives without `accept(2)` (a QUIC connection attempt),
    /// taken at once or refused: the same two limits TCP connections meet, counted together
    /// with them.
    pub fn try_slot(&self, ip: std::net::IpAddr) -> Result<Slot, Full> {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            self.metrics.paused.inc();
            self.warn_throttled();
            return Err(Full::Connections);
        };
        let place = self.per_ip.take(ip).ok_or(Full::PerIp)?;
        self.metrics.open.inc();
        Ok(Slot::new(permit, place, self.metrics.open.clone()))
    }
}

/// Accepts one connection. Errors that mean "out of resources" pause the loop instead of spinning;
/// per-connection errors (the client reset before accept) are skipped.
pub async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return (stream, peer);
            }
            Err(e) if is_resource_exhaustion(&e) => {
                tracing::warn!(error = %e, "accept: out of resources, pausing 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => tracing::debug!(error = %e, "accept failed"),
        }
    }
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The share the server builds (`client_share`) counts an IPv6 client by its /64: a second
    /// address of the same /64 finds the one place taken, another /64 does not; an IPv4-mapped
    /// address is its IPv4 one.
    #[test]
    fn the_http_share_counts_an_ipv6_client_by_its_64() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let acceptor =
            Acceptor::new(16, AcceptMetrics::default()).per_ip(client_share(1, Vec::new()));
        let held = acceptor.try_slot(ip("2001:db8:0:1::1")).unwrap();
        assert_eq!(
            acceptor.try_slot(ip("2001:db8:0:1:ffff::9")).unwrap_err(),
            Full::PerIp,
            "a second address of the /64 had a share of its own"
        );
        let other = acceptor.try_slot(ip("2001:db8:0:2::1")).unwrap();
        let v4 = acceptor.try_slot(ip("192.0.2.1")).unwrap();
        assert_eq!(
            acceptor.try_slot(ip("::ffff:192.0.2.1")).unwrap_err(),
            Full::PerIp
        );
        drop(held);
        assert!(acceptor.try_slot(ip("2001:db8:0:1::77")).is_ok());
        drop((other, v4));
    }

    #[test]
    fn derived_limit_leaves_a_reserve_and_counts_two_fds_per_client() {
        assert_eq!(connections_for_fd_limit(1024), 480);
        assert_eq!(connections_for_fd_limit(1_048_576), 524_256);
        assert_eq!(connections_for_fd_limit(10), 1);
        assert_eq!(connections_for_fd_limit(0), 1);
    }
}
