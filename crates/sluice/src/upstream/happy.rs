//! Happy Eyeballs connection racing (RFC 8305): addresses interleaved by family, a new attempt
//! every 250 ms (or as soon as one fails), first to connect wins, each attempt with its own timeout.
//! One black-holed address therefore costs a viewer 250 ms, not the whole connect budget.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::net::TcpStream;

use super::resolve::Resolver;

/// Delay before the next attempt starts while earlier ones are still pending (RFC 8305 §5).
pub const STAGGER: Duration = Duration::from_millis(250);

/// Addresses of one name tried at most, after interleaving: a name with thousands of records
/// that all refuse cost a SYN to each of them per connection.
pub const MAX_ATTEMPTS: usize = 16;

/// The resolver of dials that have no connector of their own (the reverse proxy's servers, health
/// checks): one for the process, so its cache serves every connection to the same name.
pub fn resolver() -> &'static Resolver {
    static SHARED: OnceLock<Resolver> = OnceLock::new();
    SHARED.get_or_init(Resolver::from_system)
}

/// `host:port` (`[v6]:port` for an IPv6 literal) as its host and port.
pub fn split_host_port(addr: &str) -> io::Result<(&str, u16)> {
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr:?} is not host:port"),
        )
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let port = port.parse::<u16>().map_err(|_| bad())?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']').ok_or_else(bad)?,
        None if host.contains(':') => return Err(bad()),
        None => host,
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

/// Resolves `addr` (`host:port`) through the shared [`resolver`] and connects to the first of its
/// addresses that answers, each attempt within `attempt_timeout` (the caller's deadline bounds
/// the whole).
pub async fn connect_name(addr: &str, attempt_timeout: Duration) -> io::Result<TcpStream> {
    let (host, port) = split_host_port(addr)?;
    let addrs = resolver().lookup(host, port).await?;
    connect(&addrs, STAGGER, attempt_timeout).await
}

/// Orders addresses as RFC 8305 §4 asks: alternate families, starting with the first family given
/// (the resolver's preference), keeping the order within each family.
pub fn interleave(addrs: &[SocketAddr]) -> Vec<SocketAddr> {
    let Some(first) = addrs.first() else {
        return Vec::new();
    };
    let first_v6 = first.is_ipv6();
    let (mut a, mut b): (Vec<SocketAddr>, Vec<SocketAddr>) =
        addrs.iter().partition(|x| x.is_ipv6() == first_v6);
    a.reverse();
    b.reverse();
    let mut out = Vec::with_capacity(addrs.len());
    while !a.is_empty() || !b.is_empty() {
        out.extend(a.pop());
        out.extend(b.pop());
    }
    out
}

/// Connects to the first of `addrs` that answers.
pub async fn connect(
    addrs: &[SocketAddr],
    stagger: Duration,
    attempt_timeout: Duration,
) -> io::Result<TcpStream> {
    connect_with(addrs, stagger, attempt_timeout, TcpStream::connect).await
}

/// The addresses tried, in order: [`interleave`]d, at most [`MAX_ATTEMPTS`] of them.
fn attempt_order(addrs: &[SocketAddr]) -> Vec<SocketAddr> {
    let mut order = interleave(addrs);
    order.truncate(MAX_ATTEMPTS);
    order
}

/// [`connect`], each attempt made by `dial`.
pub async fn connect_with<T, F, Fut>(
    addrs: &[SocketAddr],
    stagger: Duration,
    attempt_timeout: Duration,
    dial: F,
) -> io::Result<T>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: Future<Output = io::Result<T>>,
{
    let order = attempt_order(addrs);
    let mut next = order.iter();
    let mut attempts = FuturesUnordered::new();
    let mut last_err = None;
    let dial = &dial;
    let start = |addr: SocketAddr| async move {
        match tokio::time::timeout(attempt_timeout, dial(addr)).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection attempt timed out",
            )),
        }
    };
    let timer = tokio::time::sleep(stagger);
    tokio::pin!(timer);
    let mut remaining = true;
    if let Some(addr) = next.next() {
        attempts.push(start(*addr));
        timer.as_mut().reset(tokio::time::Instant::now() + stagger);
    }
    loop {
        if attempts.is_empty() {
            match next.next() {
                Some(addr) => {
                    attempts.push(start(*addr));
                    timer.as_mut().reset(tokio::time::Instant::now() + stagger);
                }
                None => {
                    return Err(last_err.unwrap_or_else(|| {
                        io::Error::new(io::ErrorKind::NotFound, "no addresses")
                    }))
                }
            }
        }
        tokio::select! {
            Some(result) = attempts.next() => match result {
                Ok(stream) => return Ok(stream),
                Err(e) => {
                    last_err = Some(e);
                    // A failure starts the next attempt at once (RFC 8305 §5).
                    if let Some(addr) = next.next() {
                        attempts.push(start(*addr));
                        timer.as_mut().reset(tokio::time::Instant::now() + stagger);
                    } else {
                        remaining = false;
                    }
                }
            },
            () = timer.as_mut(), if remaining => {
                match next.next() {
                    Some(addr) => {
                        attempts.push(start(*addr));
                        timer.as_mut().reset(tokio::time::Instant::now() + stagger);
                    }
                    None => remaining = false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn interleaves_families() {
        let got = interleave(&[a("[::1]:1"), a("[::2]:1"), a("[::3]:1"), a("1.0.0.1:1")]);
        assert_eq!(
            got,
            vec![a("[::1]:1"), a("1.0.0.1:1"), a("[::2]:1"), a("[::3]:1")]
        );
        assert!(interleave(&[]).is_empty());
    }

    /// A listener whose accept queue is full drops further SYNs: a real black hole on loopback.
    fn black_hole() -> (socket2::Socket, Vec<std::net::TcpStream>, SocketAddr) {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(&a("127.0.0.1:0").into()).unwrap();
        sock.listen(0).unwrap();
        let addr = sock.local_addr().unwrap().as_socket().unwrap();
        // Fill the queue; the kernel then ignores new SYNs.
        let mut fillers = Vec::new();
        for _ in 0..4 {
            if let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                fillers.push(s);
            }
        }
        (sock, fillers, addr)
    }

    #[tokio::test]
    async fn black_holed_first_address_costs_one_stagger() {
        let (_hole, _fill, dead) = black_hole();
        let good = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let good_addr = good.local_addr().unwrap();
        let t = Instant::now();
        let s = connect(&[dead, good_addr], STAGGER, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(s.peer_addr().unwrap(), good_addr);
        // Far below the 5 s attempt timeout the black hole would otherwise have cost.
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }

    /// A name with thousands of addresses that all refuse costs at most `MAX_ATTEMPTS`
    /// connection attempts, over both families, not one per address.
    #[tokio::test]
    async fn at_most_max_attempts_addresses_are_tried() {
        let many: Vec<SocketAddr> = (0..4000u32)
            .map(|i| {
                let ip = if i % 2 == 0 {
                    std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i))
                } else {
                    std::net::IpAddr::from(std::net::Ipv6Addr::from(
                        0x2001_0db8u128 << 96 | u128::from(i),
                    ))
                };
                SocketAddr::new(ip, 80)
            })
            .collect();
        let tried = std::sync::Mutex::new(Vec::new());
        let err = connect_with(&many, STAGGER, Duration::from_secs(5), |addr| {
            tried.lock().unwrap().push(addr);
            async { Err::<(), _>(io::Error::new(io::ErrorKind::ConnectionRefused, "refused")) }
        })
        .await
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        let tried = tried.into_inner().unwrap();
        assert_eq!(tried.len(), MAX_ATTEMPTS, "{} attempts", tried.len());
        assert_eq!(tried, interleave(&many)[..MAX_ATTEMPTS]);
        assert!(tried.iter().any(|a| a.is_ipv4()) && tried.iter().any(|a| a.is_ipv6()));
    }

    #[test]
    fn host_port_splits() {
        assert_eq!(split_host_port("a.example:80").unwrap(), ("a.example", 80));
        assert_eq!(split_host_port("[::1]:8080").unwrap(), ("::1", 8080));
        assert_eq!(split_host_port("10.0.0.1:1").unwrap(), ("10.0.0.1", 1));
        for bad in ["a.example", "::1:80", "[::1:80", ":80", "a:99999", "a:x"] {
            assert!(split_host_port(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn refused_address_moves_on_at_once_and_all_failing_reports_error() {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let good = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let good_addr = good.local_addr().unwrap();
        let s = connect(
            &[closed, good_addr],
            Duration::from_secs(30),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(s.peer_addr().unwrap(), good_addr);
        let err = connect(&[closed], STAGGER, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    }
}
