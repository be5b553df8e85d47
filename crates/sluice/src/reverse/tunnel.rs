//! Upgraded connections (WebSocket over HTTP/1.1 Upgrade or HTTP/2 extended CONNECT): bytes copied
//! both ways until either side closes or nothing moves for the idle timeout; each open tunnel holds
//! a place in its client's share of tunnels and in the process's ([`Tunnels`]), kept over a
//! reload.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_util::either::Either;

use crate::net::per_ip::{network_of, release, site_of, SHARES_PER_48};

/// The bounds on open tunnels: each holds an upstream socket for as long as it lasts, and an
/// HTTP/2 (or HTTP/3) connection carries up to `h2_max_concurrent_streams` of them, so the
/// connection limits alone let one address hold 256 connections × 100 streams = 25,600 upstream
/// sockets while `max_connections` counted 256. A tunnel therefore takes a place in its client's
/// share (`max_tunnels_per_ip`, by default `max_connections_per_ip`, counted as connections are
/// and with the same exemptions) and one of the process's (the descriptor budget
/// `max_connections` comes from), before its upstream is dialled.
///
/// The bounds belong to one config; the counts to the process: a reload makes new bounds over
/// the same counts ([`Tunnels::reloaded`]), so the tunnels open keep their places under them.
pub struct Tunnels {
    counts: Arc<Counts>,
    per_client: usize,
    exempt: Vec<ipnet::IpNet>,
    max_open: usize,
}

/// The tunnels open, over the process and by client, shared by every reload of the bounds.
/// (`net::per_ip::PerIp` counts the same way, but its share is fixed when it is made: a new
/// share there is a new count, which forgot the tunnels open.)
#[derive(Debug, Default)]
struct Counts {
    open: AtomicUsize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// Counted tunnels by client (an IPv4 address, an IPv6 /64); an entry leaves at zero.
    by_client: HashMap<IpAddr, usize>,
    /// Counted tunnels by IPv6 /48, against [`SHARES_PER_48`] shares; an entry leaves at zero.
    by_48: HashMap<Ipv6Addr, usize>,
}

/// Why a tunnel was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The client holds its share of tunnels.
    Client,
    /// The process holds as many tunnels as its descriptors allow.
    Full,
}

/// One open tunnel's places (its client's and the process's), given back when dropped.
#[derive(Debug)]
pub struct Place {
    counts: Arc<Counts>,
    /// The client (and IPv6 /48) it is counted under; `None` when it was taken exempt or with
    /// no per-client bound, and so is counted in the process's cap only.
    client: Option<(IpAddr, Option<Ipv6Addr>)>,
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some((client, site)) = &self.client {
            let mut held = self.counts.held.lock().unwrap_or_else(|e| e.into_inner());
            release(&mut held.by_client, client);
            if let Some(site) = site {
                release(&mut held.by_48, site);
            }
        }
        self.counts.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Tunnels {
    /// At most `per_client` tunnels per client (0: no limit; counted as `max_connections_per_ip`
    /// counts connections, IPv6 by /64 and /48), except for `exempt` clients, and at most
    /// `max_open` over the process (0: no limit).
    pub fn new(per_client: usize, exempt: Vec<ipnet::IpNet>, max_open: usize) -> Tunnels {
        Tunnels {
            counts: Arc::default(),
            per_client,
            exempt,
            max_open,
        }
    }

    /// The bounds a server config sets: `max_tunnels_per_ip` (by default
    /// `max_connections_per_ip`) and `per_ip_exempt` for each client, and `max_connections` (by
    /// default the descriptor budget) over the process.
    pub fn for_server(config: &crate::server::config::ServerConfig) -> Tunnels {
        Tunnels::new(
            config.tunnels_per_ip(),
            config.per_ip_exempt.clone(),
            match config.max_connections {
                0 => crate::server::listener::connections_for_fd_limit(
                    crate::server::listener::nofile_limit(),
                ),
                n => n,
            },
        )
    }

    /// The bounds `config` sets over the tunnels these count, for a reload: the tunnels open
    /// keep their places, and a client holding more than a lowered bound is refused until it
    /// holds fewer (its open tunnels are not cut). A tunnel counts under the bounds it was
    /// opened with: one opened exempt is not counted until it ends.
    pub fn reloaded(&self, config: &crate::server::config::ServerConfig) -> Tunnels {
        Tunnels {
            counts: self.counts.clone(),
            ..Tunnels::for_server(config)
        }
    }

    /// Takes a place for a tunnel of `client`'s.
    pub fn take(&self, client: IpAddr) -> Result<Place, Refused> {
        let taken = self.counts.open.fetch_add(1, Ordering::AcqRel);
        // Gives the process's place back if refused below.
        let mut place = Place {
            counts: self.counts.clone(),
            client: None,
        };
        if self.max_open > 0 && taken >= self.max_open {
            return Err(Refused::Full);
        }
        let ip = client.to_canonical();
        if self.exempt.iter().any(|n| n.contains(&ip)) {
            return Ok(place);
        }
        let (key, site) = (network_of(ip), site_of(ip));
        let mut held = self.counts.held.lock().unwrap_or_else(|e| e.into_inner());
        let Held { by_client, by_48 } = &mut *held;
        // With no per-client bound (0) the tunnel is still counted: the share is live, and a
        // reload that sets one counts the tunnels opened while there was none.
        let full = self.per_client > 0
            && (by_client.get(&key).is_some_and(|&n| n >= self.per_client)
                || site.is_some_and(|site| {
                    by_48
                        .get(&site)
                        .is_some_and(|&n| n >= self.per_client.saturating_mul(SHARES_PER_48))
                }));
        if full {
            return Err(Refused::Client);
        }
        *by_client.entry(key).or_insert(0) += 1;
        if let Some(site) = site {
            *by_48.entry(site).or_insert(0) += 1;
        }
        place.client = Some((key, site));
        Ok(place)
    }

    /// Tunnels open now.
    pub fn open(&self) -> usize {
        self.counts.open.load(Ordering::Acquire)
    }
}

/// The client's end of a tunnel: a connection hyper upgraded (HTTP/1.1 Upgrade, or extended
/// CONNECT on hyper's HTTP/2 server), or an extended CONNECT stream of sluice's own HTTP/2 server.
pub enum Down {
    Hyper(OnUpgrade),
    Stream(crate::server::h2_tunnel::TunnelIo),
}

/// Waits for both upgrades, then copies until close or idle; `hold` (in-flight marks, metrics) is
/// released when the tunnel ends.
pub fn spawn<H: Send + 'static>(down: Down, up: OnUpgrade, idle: Duration, hold: H) {
    tokio::spawn(async move {
        let down = async move {
            match down {
                Down::Hyper(on) => on.await.map(|d| Either::Left(TokioIo::new(d))),
                Down::Stream(io) => Ok(Either::Right(io)),
            }
        };
        let (down, up) = match tokio::join!(down, up) {
            (Ok(d), Ok(u)) => (d, u),
            (d, u) => {
                tracing::debug!(down = ?d.err(), up = ?u.err(), "upgrade did not complete");
                return;
            }
        };
        let start = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let mut down = Watched {
            io: down,
            last: last.clone(),
            start,
        };
        let mut up = Watched {
            io: TokioIo::new(up),
            last: last.clone(),
            start,
        };
        let copy = tokio::io::copy_bidirectional(&mut down, &mut up);
        tokio::pin!(copy);
        let mut tick = tokio::time::interval(idle.min(Duration::from_secs(1)));
        loop {
            tokio::select! {
                r = &mut copy => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "tunnel ended with an error");
                    }
                    break;
                }
                _ = tick.tick() => {
                    let quiet = start.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
                    if quiet >= idle.as_millis() as u64 {
                        tracing::debug!("tunnel idle for {} s; closing", idle.as_secs());
                        break;
                    }
                }
            }
        }
        drop(hold);
    });
}

/// A stream that records when bytes last moved.
struct Watched<T> {
    io: T,
    last: Arc<AtomicU64>,
    start: Instant,
}

impl<T> Watched<T> {
    fn touch(&self) {
        self.last
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Each client holds at most its share of tunnels, the process at most its cap (exempt
    /// clients too); a refused take holds nothing, and every place comes back on drop.
    #[test]
    fn tunnels_are_bounded_per_client_and_over_the_process() {
        let t = Tunnels::new(2, vec!["10.0.0.0/8".parse().unwrap()], 5);
        let a = [
            t.take(ip("192.0.2.1")).unwrap(),
            t.take(ip("192.0.2.1")).unwrap(),
        ];
        assert_eq!(t.take(ip("192.0.2.1")).unwrap_err(), Refused::Client);
        // An IPv6 client is counted by its /64, as connections are.
        let b = t.take(ip("2001:db8::1")).unwrap();
        let c = t.take(ip("2001:db8::2")).unwrap();
        assert_eq!(t.take(ip("2001:db8::3")).unwrap_err(), Refused::Client);
        assert_eq!(t.open(), 4);
        let d = t.take(ip("198.51.100.1")).unwrap();
        // The process holds 5: another client, even an exempt one, waits for a place.
        assert_eq!(t.take(ip("198.51.100.2")).unwrap_err(), Refused::Full);
        assert_eq!(t.take(ip("10.1.2.3")).unwrap_err(), Refused::Full);
        assert_eq!(t.open(), 5);
        drop(a);
        let exempt: Vec<_> = (0..2).map(|_| t.take(ip("10.1.2.3")).unwrap()).collect();
        assert_eq!(t.take(ip("192.0.2.1")).unwrap_err(), Refused::Full);
        drop((b, c, d, exempt));
        assert_eq!(t.open(), 0);
        let again = [
            t.take(ip("192.0.2.1")).unwrap(),
            t.take(ip("192.0.2.1")).unwrap(),
        ];
        assert_eq!(t.open(), 2);
        drop(again);
        // No limits at all: nothing is refused.
        let free = Tunnels::new(0, Vec::new(), 0);
        let held: Vec<_> = (0..1000)
            .map(|_| free.take(ip("192.0.2.1")).unwrap())
            .collect();
        assert_eq!(free.open(), 1000);
        drop(held);
        assert_eq!(free.open(), 0);
    }

    /// A reload's bounds count the tunnels open under the old ones: a raised share lets in only
    /// the difference, a lowered one refuses until the client holds fewer (its open tunnels
    /// stay), a lowered process cap counts every tunnel open, and the places taken under the old
    /// bounds come back to the shared count. Before, a reload that changed the bounds started
    /// from zero: a client holding its share got a whole new one on top.
    #[test]
    fn a_reload_counts_the_tunnels_open() {
        let server = |per_ip: Option<usize>, max: usize| crate::server::config::ServerConfig {
            max_connections_per_ip: 3,
            max_tunnels_per_ip: per_ip,
            max_connections: max,
            ..Default::default()
        };
        let first = Tunnels::for_server(&server(Some(2), 100));
        let client = ip("192.0.2.1");
        let held = [first.take(client).unwrap(), first.take(client).unwrap()];
        assert_eq!(first.take(client).unwrap_err(), Refused::Client);
        // Raised to 3 (the key unset: max_connections_per_ip): one more, not three.
        let raised = first.reloaded(&server(None, 100));
        let third = raised.take(client).unwrap();
        assert_eq!(raised.take(client).unwrap_err(), Refused::Client);
        assert_eq!(raised.open(), 3);
        // Lowered to 1: refused until fewer than 1 are open, none cut.
        let lowered = raised.reloaded(&server(Some(1), 100));
        assert_eq!(lowered.take(client).unwrap_err(), Refused::Client);
        drop(held);
        assert_eq!(lowered.take(client).unwrap_err(), Refused::Client);
        drop(third);
        let one = lowered.take(client).unwrap();
        // A process cap of 2 counts the tunnels of every client open.
        let capped = lowered.reloaded(&server(Some(0), 2));
        let other = capped.take(ip("198.51.100.1")).unwrap();
        assert_eq!(capped.take(ip("198.51.100.2")).unwrap_err(), Refused::Full);
        drop((one, other));
        assert_eq!(capped.open(), 0);
        // Tunnels opened with no per-client bound (0) are counted all the same: a reload that
        // sets one refuses a client already holding it.
        let unbounded = capped.reloaded(&server(Some(0), 100));
        let two = [
            unbounded.take(client).unwrap(),
            unbounded.take(client).unwrap(),
        ];
        let bounded = unbounded.reloaded(&server(Some(2), 100));
        assert_eq!(bounded.take(client).unwrap_err(), Refused::Client);
        drop(two);
        assert_eq!(bounded.open(), 0);
        assert!(capped.counts.held.lock().unwrap().by_client.is_empty());
    }
}
