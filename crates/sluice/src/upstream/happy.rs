//! Happy Eyeballs connection racing (RFC 8305): addresses interleaved by family, a new attempt
//! every 250 ms (or as soon as one fails), first to connect wins, each attempt with its own timeout.
//! One black-holed address therefore costs a viewer 250 ms, not the whole connect budget.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::net::TcpStream;

/// Delay before the next attempt starts while earlier ones are still pending (RFC 8305 §5).
pub const STAGGER: Duration = Duration::from_millis(250);

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
    let order = interleave(addrs);
    let mut next = order.iter();
    let mut attempts = FuturesUnordered::new();
    let mut last_err = None;
    let start = |addr: SocketAddr| async move {
        match tokio::time::timeout(attempt_timeout, TcpStream::connect(addr)).await {
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
