//! Upgraded connections (WebSocket over HTTP/1.1 Upgrade or HTTP/2 extended CONNECT): bytes copied
//! both ways until either side closes or nothing moves for the idle timeout; each open tunnel holds
//! a place in its client's share of tunnels and in the process's ([`Tunnels`]).

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_util::either::Either;

/// The bounds on open tunnels: each holds an upstream socket for as long as it lasts, and an
/// HTTP/2 (or HTTP/3) connection carries up to `h2_max_concurrent_streams` of them, so the
/// connection limits alone let one address hold 256 connections × 100 streams = 25,600 upstream
/// sockets while `max_connections` counted 256. A tunnel therefore takes a place in its client's
/// share (`net::per_ip`, the mechanism `max_connections_per_ip` counts connections with, by the
/// same share and exemptions) and one of the process's (the descriptor budget `max_connections`
/// comes from), before its upstream is dialled.
pub struct Tunnels {
    per_client: Arc<crate::net::per_ip::PerIp>,
    open: Arc<AtomicUsize>,
    max_open: usize,
    /// The server settings these bounds were made from (`max_connections_per_ip`,
    /// `per_ip_exempt`, `max_connections`): a reload that keeps them keeps the counts.
    made_from: (usize, Vec<ipnet::IpNet>, usize),
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
    _client: Option<crate::net::per_ip::IpPlace>,
    open: Arc<AtomicUsize>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Tunnels {
    /// At most `per_client` tunnels per client (0: no limit; counted as `max_connections_per_ip`
    /// counts connections, IPv6 by /64 and /48), except for `exempt` clients, and at most
    /// `max_open` over the process (0: no limit).
    pub fn new(per_client: usize, exempt: Vec<ipnet::IpNet>, max_open: usize) -> Tunnels {
        Tunnels {
            made_from: (per_client, exempt.clone(), max_open),
            per_client: crate::net::per_ip::PerIp::by_network(per_client, exempt),
            open: Arc::new(AtomicUsize::new(0)),
            max_open,
        }
    }

    /// The bounds a server config sets: `max_connections_per_ip` and `per_ip_exempt` for each
    /// client, and `max_connections` (by default the descriptor budget) over the process.
    pub fn for_server(config: &crate::server::config::ServerConfig) -> Tunnels {
        let mut t = Tunnels::new(
            config.max_connections_per_ip,
            config.per_ip_exempt.clone(),
            match config.max_connections {
                0 => crate::server::listener::connections_for_fd_limit(
                    crate::server::listener::nofile_limit(),
                ),
                n => n,
            },
        );
        t.made_from.2 = config.max_connections;
        t
    }

    /// Whether `config` sets the bounds these were made from (a reload keeps them, and the
    /// tunnels they count).
    pub fn same_bounds(&self, config: &crate::server::config::ServerConfig) -> bool {
        self.made_from
            == (
                config.max_connections_per_ip,
                config.per_ip_exempt.clone(),
                config.max_connections,
            )
    }

    /// Takes a place for a tunnel of `client`'s.
    pub fn take(&self, client: IpAddr) -> Result<Place, Refused> {
        let taken = self.open.fetch_add(1, Ordering::AcqRel);
        if self.max_open > 0 && taken >= self.max_open {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::Full);
        }
        match self.per_client.take(client) {
            Some(place) => Ok(Place {
                _client: place,
                open: self.open.clone(),
            }),
            None => {
                self.open.fetch_sub(1, Ordering::AcqRel);
                Err(Refused::Client)
            }
        }
    }

    /// Tunnels open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
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
}
