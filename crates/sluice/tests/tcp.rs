//! The TCP front end against real sockets on 127.0.0.1: bytes both ways, half-close, resets,
//! failing upstreams, timeouts, PROXY protocol, SNI routing, limits, fd leaks, group behaviour.

mod self_signed;
mod support;
mod tcp_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use self_signed::SelfSigned;
use sluice_http::proxy_protocol;
use support::{pattern, sha256};
use tcp_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn bytes_both_ways_are_identical_small_and_multi_megabyte() {
    let echo = Upstream::echo().await;
    let proxy = Proxy::start(&one_group(&quoted(&[echo.addr]), ""));
    assert_eq!(
        echo_through(proxy.addr(), b"Hello, world!").await,
        b"Hello, world!"
    );
    let big = pattern(8 * 1024 * 1024 + 17);
    let back = echo_through(proxy.addr(), &big).await;
    assert_eq!(back.len(), big.len());
    assert_eq!(sha256(&back), sha256(&big));
    // Four at once, different sizes.
    let sizes = [1usize, 65_536, 1_000_003, 3 << 20];
    let runs = sizes.map(|n| {
        let addr = proxy.addr();
        tokio::spawn(async move {
            let body = pattern(n);
            sha256(&echo_through(addr, &body).await) == sha256(&body)
        })
    });
    for r in runs {
        assert!(r.await.unwrap());
    }
    proxy.idle().await;
    let m = proxy.metrics();
    let total = 13 + big.len() + sizes.iter().sum::<usize>();
    assert!(
        m.contains(&format!(
            "sluice_tcp_received_bytes_total{{listener=\"127.0.0.1:0\"}} {total}"
        )),
        "{m}"
    );
    assert!(m.contains(&format!(
        "sluice_tcp_sent_bytes_total{{listener=\"127.0.0.1:0\"}} {total}"
    )));
    assert!(
        m.contains("sluice_tcp_connections_ended_total{listener=\"127.0.0.1:0\",how=\"closed\"} 6")
    );
}

#[tokio::test]
async fn client_half_close_lets_the_answer_flow() {
    // The server reads to EOF (the client's FIN must arrive), then answers and closes.
    let (up, mut got) = Upstream::recorder("world").await;
    let proxy = Proxy::start(&one_group(&quoted(&[up.addr]), ""));
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"hello").await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(read_all(&mut s, 5).await.unwrap(), b"world");
    assert_eq!(got.recv().await.unwrap(), b"hello");
}

#[tokio::test]
async fn upstream_half_close_lets_the_client_keep_sending() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let up = Upstream::spawn(move |mut s| {
        let tx = tx.clone();
        async move {
            s.write_all(b"banner").await.unwrap();
            s.shutdown().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            tx.send(got).unwrap();
        }
    })
    .await;
    let proxy = Proxy::start(&one_group(&quoted(&[up.addr]), ""));
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    // The server's FIN reaches the client as EOF...
    assert_eq!(read_all(&mut s, 5).await.unwrap(), b"banner");
    // ...and the client can still send after it.
    let late = pattern(300_000);
    s.write_all(&late).await.unwrap();
    s.shutdown().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sha256(&got), sha256(&late));
}

#[tokio::test]
async fn upstream_reset_reaches_the_client_as_reset() {
    let up = Upstream::spawn(|s| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    })
    .await;
    let proxy = Proxy::start(&one_group(&quoted(&[up.addr]), ""));
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap();
    assert_eq!(
        r.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset)
    );
    proxy.idle().await;
    assert!(proxy
        .metrics()
        .contains("sluice_tcp_connections_ended_total{listener=\"127.0.0.1:0\",how=\"reset\"} 1"));
}

#[tokio::test]
async fn client_reset_reaches_the_upstream_as_reset() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let up = Upstream::spawn(move |mut s| {
        let tx = tx.clone();
        async move {
            let mut buf = vec![0u8; 1024];
            let mut result = Ok(0);
            loop {
                match s.read(&mut buf).await {
                    Ok(0) => break,
                    Ok(n) => result = Ok(n),
                    Err(e) => {
                        result = Err(e.kind());
                        break;
                    }
                }
            }
            tx.send(result).unwrap();
        }
    })
    .await;
    let proxy = Proxy::start(&one_group(&quoted(&[up.addr]), ""));
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"some bytes").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(s);
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, Err(std::io::ErrorKind::ConnectionReset));
}

#[tokio::test]
async fn refused_server_is_skipped_and_ejected() {
    let dead = closed_port().await;
    let echo = Upstream::echo().await;
    let proxy = Proxy::start(&one_group(
        &quoted(&[dead, echo.addr]),
        "max_fails = 1\nfail_timeout_secs = 30",
    ));
    for _ in 0..4 {
        assert_eq!(echo_through(proxy.addr(), b"ping").await, b"ping");
    }
    let g = proxy.groups.get("g").unwrap();
    let dead_server = g
        .servers()
        .iter()
        .find(|s| s.addr() == dead.to_string())
        .unwrap();
    assert!(dead_server.is_ejected());
    assert_eq!(dead_server.ejections(), 1);
    // Ejected after one failure: the other three connections never tried it.
    let m = proxy.metrics();
    assert!(
        m.contains(&format!(
            "sluice_tcp_server_connect_failures_total{{group=\"g\",server=\"{dead}\"}} 1"
        )),
        "{m}"
    );
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn black_holed_server_times_out_then_the_next_answers() {
    let (hole, _socket, _fillers) = black_hole().await;
    let echo = Upstream::echo().await;
    let mut config = one_group(&quoted(&[hole, echo.addr]), "max_fails = 0");
    config.push_str("connect_timeout_secs = 1\n");
    let proxy = Proxy::start(&config);
    // Round robin starts at the black hole for the first connection.
    let started = Instant::now();
    assert_eq!(
        echo_through(proxy.addr(), b"late but here").await,
        b"late but here"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

#[tokio::test]
async fn nothing_usable_closes_the_client() {
    let dead = closed_port().await;
    let proxy = Proxy::start(&one_group(&quoted(&[dead]), ""));
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(read_all(&mut s, 5).await.unwrap(), b"");
    proxy.idle().await;
    assert!(proxy.metrics().contains(
        "sluice_tcp_connections_refused_total{listener=\"127.0.0.1:0\",reason=\"connect_failed\"} 1"
    ));
}

#[tokio::test]
async fn silent_client_is_closed_after_the_idle_timeout() {
    let echo = Upstream::echo().await;
    let mut config = one_group(&quoted(&[echo.addr]), "");
    config.push_str("idle_timeout_secs = 1\n");
    let proxy = Proxy::start(&config);
    let started = Instant::now();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(read_all(&mut s, 5).await.unwrap(), b"");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // Traffic resets the idle clock: 3 exchanges 600 ms apart outlive the 1 s timeout.
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        s.write_all(b"tick").await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"tick");
    }
    proxy.idle().await;
    assert!(proxy.metrics().contains(
        "sluice_tcp_connections_ended_total{listener=\"127.0.0.1:0\",how=\"idle_timeout\"} 2"
    ));
}

#[tokio::test]
async fn total_timeout_ends_a_busy_connection() {
    let echo = Upstream::echo().await;
    let mut config = one_group(&quoted(&[echo.addr]), "");
    config.push_str("total_timeout_secs = 1\n");
    let proxy = Proxy::start(&config);
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 4];
    let ended = loop {
        if s.write_all(b"busy").await.is_err() {
            break true;
        }
        match s.read_exact(&mut buf).await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => break true,
        }
        if started.elapsed() > Duration::from_secs(5) {
            break false;
        }
    };
    assert!(ended);
    assert!(started.elapsed() < Duration::from_secs(3));
}

fn proxy_in(trusted: &str, extra: &str, servers: &str) -> String {
    format!(
        "[[upstreams]]\nname = \"g\"\nservers = [{servers}]\n\n[[tcp]]\nlisten = \"127.0.0.1:0\"\nupstream = \"g\"\naccept_proxy = true\ntrusted_proxies = [\"{trusted}\"]\n{extra}\n"
    )
}

#[tokio::test]
async fn proxy_header_from_trusted_peer_is_consumed_and_forwarded() {
    let (up, mut got) = Upstream::recorder("ok").await;
    let proxy = Proxy::start(&proxy_in(
        "127.0.0.0/8",
        "send_proxy = \"v1\"",
        &quoted(&[up.addr]),
    ));
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    let client = "203.0.113.7:4242".parse().unwrap();
    let dst = "198.51.100.1:5432".parse().unwrap();
    // A v2 header in, split across two writes, payload right behind it.
    let header = proxy_protocol::encode_v2(client, dst);
    s.write_all(&header[..7]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.write_all(&[&header[7..], b"payload".as_slice()].concat())
        .await
        .unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(read_all(&mut s, 5).await.unwrap(), b"ok");
    let seen = got.recv().await.unwrap();
    // The upstream sees a v1 line with the real client, then exactly the payload.
    assert_eq!(
        String::from_utf8_lossy(&seen),
        "PROXY TCP4 203.0.113.7 198.51.100.1 4242 5432\r\npayload"
    );
}

#[tokio::test]
async fn send_proxy_v1_and_v2_carry_the_client_address() {
    for version in ["v1", "v2"] {
        let (up, mut got) = Upstream::recorder("ok").await;
        let mut config = one_group(&quoted(&[up.addr]), "");
        config.push_str(&format!("send_proxy = \"{version}\"\n"));
        let proxy = Proxy::start(&config);
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let me = s.local_addr().unwrap();
        s.write_all(b"data").await.unwrap();
        s.shutdown().await.unwrap();
        read_all(&mut s, 5).await.unwrap();
        let seen = got.recv().await.unwrap();
        let proxy_protocol::Parsed::Complete(h) = proxy_protocol::parse(&seen).unwrap() else {
            panic!("incomplete header: {seen:?}");
        };
        assert_eq!(
            h.addresses,
            proxy_protocol::Addresses::Tcp {
                source: me,
                destination: proxy.addr(),
            },
            "{version}"
        );
        assert_eq!(&seen[h.len..], b"data");
    }
}

#[tokio::test]
async fn malformed_or_untrusted_proxy_headers_are_refused() {
    let echo = Upstream::echo().await;
    let proxy = Proxy::start(&proxy_in("127.0.0.0/8", "", &quoted(&[echo.addr])));
    for bad in [
        &b"PROXY TCP4 1.2.3.4 5.6.7.8 99999 1\r\nhello"[..],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\r\n\r\n\0\r\nQUIT\n\x31\x11\x00\x0c",
    ] {
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.write_all(bad).await.unwrap();
        let got = read_all(&mut s, 5).await.unwrap_or_default();
        assert_eq!(got, b"");
    }
    // A peer outside trusted_proxies is refused even with a valid header.
    let strict = Proxy::start(&proxy_in("10.0.0.0/8", "", &quoted(&[echo.addr])));
    let mut s = TcpStream::connect(strict.addr()).await.unwrap();
    let header =
        proxy_protocol::encode_v1("1.1.1.1:1".parse().unwrap(), "2.2.2.2:2".parse().unwrap());
    let _ = s.write_all(&[&header[..], b"hello"].concat()).await;
    assert_eq!(read_all(&mut s, 5).await.unwrap_or_default(), b"");
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 0);
    proxy.idle().await;
    strict.idle().await;
    assert!(proxy.metrics().contains(
        "sluice_tcp_connections_refused_total{listener=\"127.0.0.1:0\",reason=\"bad_proxy_header\"} 3"
    ));
    assert!(strict.metrics().contains(
        "sluice_tcp_connections_refused_total{listener=\"127.0.0.1:0\",reason=\"untrusted_proxy\"} 1"
    ));
}

#[tokio::test]
async fn sni_routes_a_split_client_hello_and_refuses_garbage() {
    let (a, mut a_got) = Upstream::recorder("A").await;
    let (b, mut b_got) = Upstream::recorder("B").await;
    let (d, _d_got) = Upstream::recorder("D").await;
    let config = format!(
        "[[upstreams]]\nname = \"a\"\nservers = [\"{}\"]\n[[upstreams]]\nname = \"b\"\nservers = [\"{}\"]\n\
         [[upstreams]]\nname = \"d\"\nservers = [\"{}\"]\n\n[[tcp]]\nlisten = \"127.0.0.1:0\"\nupstream = \"d\"\n\
         sni = [{{ server_name = \"a.example.com\", upstream = \"a\" }}, {{ server_name = \"*.b.example\", upstream = \"b\" }}]\n",
        a.addr, b.addr, d.addr
    );
    let proxy = Proxy::start(&config);
    for (name, want) in [
        ("a.example.com", "A"),
        ("x.y.b.example", "B"),
        ("other.example", "D"),
    ] {
        let hello = client_hello(name);
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.set_nodelay(true).unwrap();
        // Five writes with pauses: the proxy must reassemble the hello from several segments.
        for piece in hello.chunks(hello.len() / 5 + 1) {
            s.write_all(piece).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s.write_all(b"after").await.unwrap();
        s.shutdown().await.unwrap();
        assert_eq!(
            read_all(&mut s, 5).await.unwrap(),
            want.as_bytes(),
            "{name}"
        );
        if want == "A" {
            assert_eq!(a_got.recv().await.unwrap(), [&hello[..], b"after"].concat());
        }
        if want == "B" {
            assert_eq!(b_got.recv().await.unwrap(), [&hello[..], b"after"].concat());
        }
    }
    // Plain text instead of TLS: closed, no upstream contacted.
    let before = a.accepted.load(Ordering::SeqCst)
        + b.accepted.load(Ordering::SeqCst)
        + d.accepted.load(Ordering::SeqCst);
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(read_all(&mut s, 5).await.unwrap_or_default(), b"");
    let after = a.accepted.load(Ordering::SeqCst)
        + b.accepted.load(Ordering::SeqCst)
        + d.accepted.load(Ordering::SeqCst);
    assert_eq!(before, after);
    proxy.idle().await;
    assert!(proxy.metrics().contains(
        "sluice_tcp_connections_refused_total{listener=\"127.0.0.1:0\",reason=\"not_tls\"} 1"
    ));
}

#[tokio::test]
async fn max_connections_pauses_accept_until_a_slot_frees() {
    let echo = Upstream::echo().await;
    let mut config = one_group(&quoted(&[echo.addr]), "");
    config.push_str("max_connections = 1\n");
    let proxy = Proxy::start(&config);
    let mut first = TcpStream::connect(proxy.addr()).await.unwrap();
    first.write_all(b"one").await.unwrap();
    let mut buf = [0u8; 3];
    first.read_exact(&mut buf).await.unwrap();
    // The second connects (kernel backlog) but is not served while the first is open.
    let mut second = TcpStream::connect(proxy.addr()).await.unwrap();
    second.write_all(b"two").await.unwrap();
    let waited =
        tokio::time::timeout(Duration::from_millis(400), second.read_exact(&mut buf)).await;
    assert!(
        waited.is_err(),
        "second connection was served above the limit"
    );
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 1);
    drop(first);
    tokio::time::timeout(Duration::from_secs(3), second.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"two");
}

/// Reads the name line a `named` upstream sends first.
async fn which(addr: std::net::SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while s.read_exact(&mut byte).await.is_ok() && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}

#[tokio::test]
async fn weighted_balancing_and_backup() {
    let up = Arc::new(AtomicBool::new(true));
    let x = Upstream::named("x", up.clone()).await;
    let y = Upstream::named("y", up.clone()).await;
    let z = Upstream::named("z", up.clone()).await;
    let servers = format!(
        "{{ addr = \"{}\", weight = 2 }}, \"{}\", {{ addr = \"{}\", backup = true }}",
        x.addr, y.addr, z.addr
    );
    let proxy = Proxy::start(&one_group(&servers, ""));
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for _ in 0..9 {
        *seen.entry(which(proxy.addr()).await).or_default() += 1;
    }
    assert_eq!((seen["x"], seen["y"], seen.get("z")), (6, 3, None));
    // Both primaries down: the backup serves.
    let g = proxy.groups.get("g").unwrap();
    g.servers()[0].set_healthy(false);
    g.servers()[1].set_healthy(false);
    assert_eq!(which(proxy.addr()).await, "z");
    g.servers()[1].set_healthy(true);
    assert_eq!(which(proxy.addr()).await, "y");
}

#[tokio::test]
async fn least_conn_and_client_ip_hash() {
    let up = Arc::new(AtomicBool::new(true));
    let x = Upstream::named("x", up.clone()).await;
    let y = Upstream::named("y", up.clone()).await;
    let servers = quoted(&[x.addr, y.addr]);
    let lc = Proxy::start(&one_group(&servers, "balance = \"least_conn\""));
    // Hold one connection open: the next ones all go to the other server.
    let mut held = TcpStream::connect(lc.addr()).await.unwrap();
    let mut line = [0u8; 2];
    held.read_exact(&mut line).await.unwrap();
    let busy = String::from_utf8_lossy(&line[..1]).to_string();
    for _ in 0..4 {
        assert_ne!(which(lc.addr()).await, busy);
        // Let the proxy see that connection close, so only `held` is in flight.
        while lc.tcp.connections() > 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let h = Proxy::start(&one_group(
        &servers,
        "balance = \"hash\"\nhash_key = \"client_ip\"",
    ));
    let first = which(h.addr()).await;
    for _ in 0..5 {
        assert_eq!(which(h.addr()).await, first);
    }
}

#[tokio::test]
async fn active_health_check_takes_a_server_out_and_back() {
    let x_up = Arc::new(AtomicBool::new(true));
    let x = Upstream::named("x", x_up.clone()).await;
    let y = Upstream::named("y", Arc::new(AtomicBool::new(true))).await;
    let proxy = Proxy::start(&one_group(
        &quoted(&[x.addr, y.addr]),
        "health_check = { kind = \"http\", path = \"/healthz\", interval_secs = 1, timeout_secs = 1, rise = 1, fall = 1 }",
    ));
    let _checks = sluice::upstream::group::health::spawn(&proxy.groups);
    let g = proxy.groups.get("g").unwrap();
    let x_server = Arc::clone(&g.servers()[0]);
    x_up.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    while x_server.is_healthy() {
        assert!(Instant::now() < deadline, "x never marked down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..4 {
        assert_eq!(which(proxy.addr()).await, "y");
    }
    let m = proxy.metrics();
    assert!(
        m.contains(&format!(
            "sluice_upstream_server_up{{group=\"g\",server=\"{}\"}} 0",
            x.addr
        )),
        "{m}"
    );
    assert!(m.contains(&format!(
        "sluice_upstream_server_up{{group=\"g\",server=\"{}\"}} 1",
        y.addr
    )));
    assert!(m.contains("# TYPE sluice_upstream_server_ejections counter"));
    assert!(
        m.contains("sluice_upstream_server_ejections_total{group=\"g\""),
        "{m}"
    );
    x_up.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !x_server.is_healthy() {
        assert!(Instant::now() < deadline, "x never marked up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut names: Vec<String> = Vec::new();
    for _ in 0..4 {
        names.push(which(proxy.addr()).await);
    }
    assert!(names.contains(&"x".to_string()), "{names:?}");
}

/// A server that requires the PROXY protocol (as nginx with `proxy_protocol` does, behind a
/// `[[tcp]]` listener's `send_proxy`) refuses a check without the header; with the health
/// check's `send_proxy` each check opens with a v2 LOCAL header and the server stays in.
#[tokio::test]
async fn a_health_check_can_speak_the_proxy_protocol() {
    // Answers 200 to a request after a PROXY v2 header; closes at once on anything else.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let locals = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = locals.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 16];
                if s.read_exact(&mut head).await.is_err() || head[..12] != *b"\r\n\r\n\0\r\nQUIT\n"
                {
                    return;
                }
                // Version 2, command LOCAL (0x20); then the address block's length.
                if head[12] == 0x20 {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
                let skip = u16::from_be_bytes([head[14], head[15]]) as usize;
                let mut rest = vec![0u8; skip];
                if s.read_exact(&mut rest).await.is_err() {
                    return;
                }
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            });
        }
    });
    for (send_proxy, stays_up) in [(false, false), (true, true)] {
        let proxy = Proxy::start(&one_group(
            &quoted(&[addr]),
            &format!(
                "health_check = {{ kind = \"http\", interval_secs = 1, timeout_secs = 1, \
                 rise = 1, fall = 1, send_proxy = {send_proxy} }}"
            ),
        ));
        let _checks = sluice::upstream::group::health::spawn(&proxy.groups);
        let server = Arc::clone(&proxy.groups.get("g").unwrap().servers()[0]);
        let deadline = Instant::now() + Duration::from_millis(2500);
        while Instant::now() < deadline && server.is_healthy() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(server.is_healthy(), stays_up, "send_proxy = {send_proxy}");
    }
    assert!(locals.load(Ordering::SeqCst) >= 2, "no LOCAL header came");
}

#[tokio::test]
async fn reload_keeps_established_connections_and_switches_new_ones() {
    let up = Arc::new(AtomicBool::new(true));
    let x = Upstream::named("x", up.clone()).await;
    let y = Upstream::named("y", up.clone()).await;
    let echo = Upstream::echo().await;
    let config = |group_server: std::net::SocketAddr, extra_listener: bool| {
        let mut c = format!(
            "[[upstreams]]\nname = \"g\"\nservers = [\"{group_server}\"]\n[[upstreams]]\nname = \"e\"\nservers = [\"{}\"]\n\n\
             [[tcp]]\nname = \"main\"\nlisten = \"127.0.0.1:0\"\nupstream = \"g\"\n",
            echo.addr
        );
        if extra_listener {
            c.push_str("\n[[tcp]]\nname = \"extra\"\nlisten = \"127.0.0.1:0\"\nupstream = \"e\"\n");
        }
        c
    };
    let proxy = Proxy::start(&config(x.addr, true));
    let main = proxy.tcp.local_addr("main").unwrap();
    let extra = proxy.tcp.local_addr("extra").unwrap();
    assert_eq!(which(main).await, "x");
    // A connection on the listener about to be removed stays up through the reload.
    let mut held = TcpStream::connect(extra).await.unwrap();
    held.write_all(b"before").await.unwrap();
    let mut buf = [0u8; 6];
    held.read_exact(&mut buf).await.unwrap();

    let second = sluice::config::Config::parse_file(&config(y.addr, false)).unwrap();
    let groups = Arc::new(
        sluice::upstream::group::Groups::rebuild(&second.upstreams, Some(&proxy.groups)).unwrap(),
    );
    proxy.tcp.apply(&second.tcp, groups).unwrap();
    // Same socket for "main", new group for new connections; "extra" no longer accepts.
    assert_eq!(proxy.tcp.local_addr("main"), Some(main));
    assert_eq!(which(main).await, "y");
    assert!(proxy.tcp.local_addr("extra").is_none());
    assert!(TcpStream::connect(extra).await.is_err());
    held.write_all(b"after!").await.unwrap();
    held.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"after!");
}

/// A reload that renames a listener, or swaps two listeners' addresses, takes over the running
/// sockets: binding the same port afresh would fail while the old socket holds it, and refused
/// the whole reload. Established connections stay up; new ones are served under the new names.
#[tokio::test]
async fn a_reload_renames_listeners_and_swaps_their_addresses() {
    let up = Arc::new(AtomicBool::new(true));
    let x = Upstream::named("x", up.clone()).await;
    let y = Upstream::named("y", up.clone()).await;
    let config = |listeners: &[(&str, &str, &str)]| {
        let mut c = format!(
            "[[upstreams]]\nname = \"x\"\nservers = [\"{}\"]\n\
             [[upstreams]]\nname = \"y\"\nservers = [\"{}\"]\n",
            x.addr, y.addr
        );
        for (name, listen, upstream) in listeners {
            c.push_str(&format!(
                "\n[[tcp]]\nname = \"{name}\"\nlisten = \"{listen}\"\nupstream = \"{upstream}\"\n"
            ));
        }
        c
    };
    let proxy = Proxy::start(&config(&[
        ("a", "127.0.0.1:0", "x"),
        ("b", "127.0.0.1:0", "y"),
    ]));
    let reload = |text: String| {
        let next = sluice::config::Config::parse_file(&text).unwrap();
        next.validate().unwrap();
        let groups = Arc::new(
            sluice::upstream::group::Groups::rebuild(&next.upstreams, Some(&proxy.groups)).unwrap(),
        );
        proxy.tcp.apply(&next.tcp, groups)
    };
    let one = proxy.tcp.local_addr("a").unwrap();
    let two = proxy.tcp.local_addr("b").unwrap();
    let (one_s, two_s) = (one.to_string(), two.to_string());
    assert_eq!(which(one).await, "x");
    assert_eq!(which(two).await, "y");
    let mut held = TcpStream::connect(one).await.unwrap();
    let mut line = [0u8; 2];
    held.read_exact(&mut line).await.unwrap();
    assert_eq!(&line, b"x\n");

    // Rename "a" to "renamed" on the same address.
    reload(config(&[("renamed", &one_s, "x"), ("b", &two_s, "y")])).unwrap();
    assert_eq!(
        proxy.tcp.local_addrs(),
        vec![("b".to_string(), two), ("renamed".to_string(), one)]
    );
    assert_eq!(which(one).await, "x");
    let m = proxy.metrics();
    assert!(
        m.contains("sluice_tcp_connections_accepted_total{listener=\"renamed\"} 1"),
        "{m}"
    );

    // Swap the two addresses (and with them, which upstream each port reaches).
    reload(config(&[("renamed", &two_s, "x"), ("b", &one_s, "y")])).unwrap();
    assert_eq!(
        proxy.tcp.local_addrs(),
        vec![("b".to_string(), one), ("renamed".to_string(), two)]
    );
    assert_eq!(which(one).await, "y");
    assert_eq!(which(two).await, "x");
    let m = proxy.metrics();
    assert!(
        m.contains("sluice_tcp_connections_accepted_total{listener=\"b\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("sluice_tcp_connections_accepted_total{listener=\"renamed\"} 2"),
        "{m}"
    );
    // The connection from before both reloads is still open: the socket it came through was
    // never closed, only renamed.
    wait_connections(&proxy, 1).await;
    drop(held);
    wait_connections(&proxy, 0).await;
}

/// `POST /admin/reload` on `http` with `password`; the status and the whole answer.
async fn admin_reload(http: std::net::SocketAddr, password: &str) -> (u16, String) {
    let mut s = TcpStream::connect(http).await.unwrap();
    let head = format!(
        "POST /admin/reload HTTP/1.1\r\nHost: 127.0.0.1\r\napi_password: {password}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let answer = String::from_utf8(read_all(&mut s, 10).await.unwrap()).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

/// A reload is all or nothing over every part: one that changes the API password and adds a
/// `[[tcp]]` listener on a port already taken is refused as a whole, naming the listener, and
/// the old password stays. Before, the TCP part bound its sockets in its commit, after the other
/// parts had applied: the password changed, the listener was missing with only a log line, and
/// the answer was `reloaded: true`.
#[tokio::test]
async fn a_reload_whose_tcp_listener_cannot_bind_applies_nothing() {
    let echo = Upstream::echo().await;
    let http = closed_port().await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let late = taken.local_addr().unwrap();
    let config = |password: &str, with_late: bool| {
        let mut c = format!(
            "[server]\nlisten = [\"{http}\"]\n\n[auth]\napi_password = \"{password}\"\n\n\
             [[upstreams]]\nname = \"e\"\nservers = [\"{}\"]\n\n\
             [[tcp]]\nname = \"main\"\nlisten = \"127.0.0.1:0\"\nupstream = \"e\"\n",
            echo.addr
        );
        if with_late {
            c.push_str(&format!(
                "\n[[tcp]]\nname = \"late\"\nlisten = \"{late}\"\nupstream = \"e\"\n"
            ));
        }
        c
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    std::fs::write(&file, config("old-pw", false)).unwrap();
    let flags = sluice::config::Overrides::default();
    let loaded = sluice::config::Config::load(Some(&file), std::iter::empty(), &flags).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(sluice::serve_reloadable(
        loaded,
        Some((Some(file.clone()), flags)),
        async {
            let _ = rx.await;
        },
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(http).await.is_err() {
        assert!(Instant::now() < deadline, "sluice did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    std::fs::write(&file, config("new-pw", true)).unwrap();
    let (status, answer) = admin_reload(http, "old-pw").await;
    assert_eq!(status, 422, "{answer}");
    assert!(answer.contains(r#""reloaded":false"#), "{answer}");
    assert!(
        answer.contains(r#"[[tcp]] \"late\": cannot listen on"#),
        "{answer}"
    );
    assert!(!answer.contains("new-pw"), "{answer}");
    // The password did not change.
    assert_eq!(admin_reload(http, "new-pw").await.0, 403);

    // Once the port is free, the same reload goes through: the new password and listener both.
    drop(taken);
    let (status, answer) = admin_reload(http, "old-pw").await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(r#""reloaded":true"#), "{answer}");
    assert_eq!(echo_through(late, b"late listener").await, b"late listener");
    assert_eq!(admin_reload(http, "old-pw").await.0, 403);

    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Waits (at most 5 s) until the proxy holds `n` connections.
async fn wait_connections(proxy: &Proxy, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.tcp.connections() != n {
        assert!(
            Instant::now() < deadline,
            "{} connections open, waited for {n}",
            proxy.tcp.connections()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Lowering `max_connections` on a reload counts the connections already open: with 4 open and
/// the limit lowered to 2, a newcomer waits until only 1 is left. Raising it again frees slots at
/// once. Before, a changed limit was a fresh count, so the newcomer was served at once (6 open
/// under a limit of 2 at worst).
#[tokio::test]
async fn lowering_max_connections_counts_the_connections_open() {
    let echo = Upstream::echo().await;
    let config = |max: usize| {
        let mut c = one_group(&quoted(&[echo.addr]), "");
        c.push_str(&format!("max_connections = {max}\n"));
        sluice::config::Config::parse_file(&c).unwrap()
    };
    let proxy = Proxy::start(&format!(
        "{}max_connections = 4\n",
        one_group(&quoted(&[echo.addr]), "")
    ));
    let addr = proxy.addr();
    let mut open = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert!(echoes(&mut s, b"held").await);
        open.push(s);
    }
    proxy
        .tcp
        .apply(&config(2).tcp, Arc::clone(&proxy.groups))
        .unwrap();
    assert_eq!(proxy.addr(), addr, "the listener kept its socket");

    let mut newcomer = TcpStream::connect(addr).await.unwrap();
    newcomer.write_all(b"new!").await.unwrap();
    let mut buf = [0u8; 4];
    assert!(
        unanswered(&mut newcomer).await,
        "served with 4 open under a limit of 2"
    );
    open.truncate(2);
    wait_connections(&proxy, 2).await;
    assert!(
        unanswered(&mut newcomer).await,
        "served with 2 open under a limit of 2"
    );
    open.truncate(1);
    tokio::time::timeout(Duration::from_secs(5), newcomer.read_exact(&mut buf))
        .await
        .expect("not served with 1 open under a limit of 2")
        .unwrap();
    assert_eq!(&buf, b"new!");

    // 2 open; raised to 3, one more is served at once and the next waits.
    proxy
        .tcp
        .apply(&config(3).tcp, Arc::clone(&proxy.groups))
        .unwrap();
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(echoes(&mut third, b"3rd!").await);
    let mut fourth = TcpStream::connect(addr).await.unwrap();
    fourth.write_all(b"4th!").await.unwrap();
    assert!(
        unanswered(&mut fourth).await,
        "served with 3 open under a limit of 3"
    );
}

/// The slot the accept loop holds for the next connection counts too: with 2 open under a limit
/// of 3 (the loop holding the third slot) and the limit lowered to 1, a newcomer waits until none
/// is left open.
#[tokio::test]
async fn lowering_max_connections_takes_back_the_slot_held_for_the_next_connection() {
    let echo = Upstream::echo().await;
    let text = |max: usize| {
        format!(
            "{}max_connections = {max}\n",
            one_group(&quoted(&[echo.addr]), "")
        )
    };
    let proxy = Proxy::start(&text(3));
    let addr = proxy.addr();
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert!(echoes(&mut s, b"held").await);
        open.push(s);
    }
    let lowered = sluice::config::Config::parse_file(&text(1)).unwrap();
    proxy
        .tcp
        .apply(&lowered.tcp, Arc::clone(&proxy.groups))
        .unwrap();
    let mut newcomer = TcpStream::connect(addr).await.unwrap();
    newcomer.write_all(b"new!").await.unwrap();
    let mut buf = [0u8; 4];
    assert!(
        unanswered(&mut newcomer).await,
        "served with 2 open under a limit of 1"
    );
    open.truncate(1);
    wait_connections(&proxy, 1).await;
    assert!(
        unanswered(&mut newcomer).await,
        "served with 1 open under a limit of 1"
    );
    open.clear();
    tokio::time::timeout(Duration::from_secs(5), newcomer.read_exact(&mut buf))
        .await
        .expect("not served with none open under a limit of 1")
        .unwrap();
    assert_eq!(&buf, b"new!");
}

#[tokio::test]
async fn graceful_shutdown_drains_then_closes() {
    let echo = Upstream::echo().await;
    let proxy = Proxy::start(&one_group(&quoted(&[echo.addr]), ""));
    let addr = proxy.addr();
    let mut open = TcpStream::connect(addr).await.unwrap();
    open.write_all(b"x").await.unwrap();
    let mut b = [0u8; 1];
    open.read_exact(&mut b).await.unwrap();
    let started = Instant::now();
    let tcp = &proxy.tcp;
    let shutdown = tcp.shutdown(Duration::from_secs(1));
    let client = async {
        // Still relaying during the grace period...
        tokio::time::sleep(Duration::from_millis(200)).await;
        open.write_all(b"y").await.unwrap();
        open.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"y");
        // ...and new connections are no longer accepted.
        assert!(TcpStream::connect(addr).await.is_err());
        // After the grace period the connection is closed.
        read_all(&mut open, 5).await.unwrap_or_default()
    };
    let ((), rest) = tokio::join!(shutdown, client);
    assert_eq!(rest, b"");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

/// A forced shutdown ends a connection still connecting to servers that drop SYNs, right after
/// the grace period. Before, the connect loop ran outside the race with the shutdown: three
/// black holes with the default 5 s connect timeout held `shutdown` for 15 s past its grace.
#[tokio::test]
async fn shutdown_does_not_wait_for_connects_in_progress() {
    let holes = [black_hole().await, black_hole().await, black_hole().await];
    let addrs: Vec<_> = holes.iter().map(|h| h.0).collect();
    let proxy = Proxy::start(&one_group(&quoted(&addrs), "max_fails = 0"));
    // The session is past its handshake and connecting.
    let client = TcpStream::connect(proxy.addr()).await.unwrap();
    forced_shutdown_ends_it(&proxy, client, "the connects").await;
    drop(holes);
}

/// With one session open (`client`'s), a forced shutdown after a 200 ms grace returns within
/// 2 s, the client sees the end, and the session is booked as ended by the shutdown.
async fn forced_shutdown_ends_it(proxy: &Proxy, mut client: TcpStream, waiting_for: &str) {
    for _ in 0..100 {
        if proxy.tcp.connections() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(proxy.tcp.connections(), 1);
    let started = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(4),
        proxy.tcp.shutdown(Duration::from_millis(200)),
    )
    .await
    .unwrap_or_else(|_| panic!("shutdown waited for {waiting_for}"));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(read_all(&mut client, 5).await.unwrap(), b"");
    proxy.idle().await;
    let metrics = proxy.metrics();
    assert!(
        metrics.contains(
            "sluice_tcp_connections_ended_total{listener=\"127.0.0.1:0\",how=\"shutdown\"} 1"
        ),
        "{metrics}"
    );
}

/// Held by the tests that start TLS-terminating listeners: each `TcpProxy::apply` lets go of the
/// TLS sessions of every listener it does not hold (one `TcpProxy` per process), so one test's
/// start would drop the sessions another test expects to resume.
static TLS_LISTENERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A forced shutdown ends a connection still in its TLS handshake right after the grace period.
/// Before, the handshake ran outside the race with the shutdown: a client that connects and
/// sends nothing held `shutdown` for the whole `handshake_timeout_secs` (60 s here).
#[tokio::test]
async fn shutdown_does_not_wait_for_handshakes_in_progress() {
    let _apart = TLS_LISTENERS.lock().await;
    let SelfSigned { cert, key, .. } = SelfSigned::new(&["localhost"]);
    let echo = Upstream::echo().await;
    let config = format!(
        "[[upstreams]]\nname = \"e\"\nservers = [\"{}\"]\n\n\
         [[tcp]]\nlisten = \"127.0.0.1:0\"\nupstream = \"e\"\nhandshake_timeout_secs = 60\n\
         tls_cert = {:?}\ntls_key = {:?}\n",
        echo.addr,
        cert.path(),
        key.path()
    );
    let proxy = Proxy::start(&config);
    // Connects and never sends its ClientHello.
    let client = TcpStream::connect(proxy.addr()).await.unwrap();
    forced_shutdown_ends_it(&proxy, client, "the handshake").await;
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn tls_termination_relays_plain_bytes_and_routes_by_sni() {
    let _apart = TLS_LISTENERS.lock().await;
    let SelfSigned { der, cert, key } = SelfSigned::new(&["localhost"]);
    let echo = Upstream::echo().await;
    let (other, _) = Upstream::recorder("other").await;
    let config = format!(
        "[[upstreams]]\nname = \"e\"\nservers = [\"{}\"]\n[[upstreams]]\nname = \"o\"\nservers = [\"{}\"]\n\n\
         [[tcp]]\nlisten = \"127.0.0.1:0\"\nupstream = \"o\"\nsni = [{{ server_name = \"localhost\", upstream = \"e\" }}]\n\
         tls_cert = {:?}\ntls_key = {:?}\n",
        echo.addr,
        other.addr,
        cert.path(),
        key.path()
    );
    let proxy = Proxy::start(&config);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.into()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let body = pattern(2 * 1024 * 1024 + 3);
    let (mut r, mut w) = tokio::io::split(&mut tls);
    let write = async {
        w.write_all(&body).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let read = async {
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        out
    };
    let ((), back) = tokio::join!(write, read);
    assert_eq!(sha256(&back), sha256(&body));
    assert_eq!(other.accepted.load(Ordering::SeqCst), 0);
    // Plain text on a TLS listener: refused, nothing relayed.
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let _ = read_all(&mut s, 5).await;
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 1);
}

/// A TLS-terminated connection that is idle holds no copy buffer (64 KiB per direction): not
/// after the handshake, before any byte, nor once its bytes have gone through; they are taken
/// only while bytes flow, which still arrive whole both ways. Before, each direction allocated
/// its buffer when the relay started: 128 KiB per idle connection, 1.3 GB for 10,000.
#[tokio::test]
async fn idle_tls_connections_hold_no_copy_buffer() {
    // Also keeps every other TLS relay of this binary away from the process-wide count.
    let _apart = TLS_LISTENERS.lock().await;
    let SelfSigned { der, cert, key } = SelfSigned::new(&["localhost"]);
    let echo = Upstream::echo().await;
    let config = format!(
        "[[upstreams]]\nname = \"e\"\nservers = [\"{}\"]\n\n\
         [[tcp]]\nlisten = \"127.0.0.1:0\"\nupstream = \"e\"\ntls_cert = {:?}\ntls_key = {:?}\n",
        echo.addr,
        cert.path(),
        key.path()
    );
    let proxy = Proxy::start(&config);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.into()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    const IDLE: usize = 20;
    let mut conns = Vec::new();
    for _ in 0..IDLE {
        let tcp = TcpStream::connect(proxy.addr()).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        conns.push(connector.connect(name, tcp).await.unwrap());
    }
    // Every relay has started (its upstream connected) and settled.
    for _ in 0..200 {
        if echo.accepted.load(Ordering::SeqCst) == IDLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(echo.accepted.load(Ordering::SeqCst), IDLE);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        sluice::net::splice::copy_buffers(),
        0,
        "idle after the handshake"
    );
    // Bytes through one connection, which then stays open and idle: its buffers are given back.
    let (mut r, mut w) = tokio::io::split(conns.remove(0));
    let msg = pattern(300 * 1024 + 7);
    let mut back = vec![0u8; msg.len()];
    let (wrote, read) = tokio::join!(w.write_all(&msg), r.read_exact(&mut back));
    wrote.unwrap();
    read.unwrap();
    assert_eq!(sha256(&back), sha256(&msg));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        sluice::net::splice::copy_buffers(),
        0,
        "idle after a transfer"
    );
    // Then a bulk transfer to the end of the same connection, byte-exact.
    let body = pattern(3 * 1024 * 1024 + 5);
    let write = async {
        w.write_all(&body).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let read = async {
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        out
    };
    let ((), back) = tokio::join!(write, read);
    assert_eq!(sha256(&back), sha256(&body));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(sluice::net::splice::copy_buffers(), 0);
    drop(conns);
}

/// A TLS session resumes only at the listener that issued it: a client redirected with its
/// session for one name to a `[[tcp]]` listener whose certificate does not cover that name gets a
/// full handshake there (and its certificate check fails), instead of resuming into that
/// listener's backend with no certificate shown (an ALPACA-style cross-service attack). Before,
/// every TLS listener shared one ticket key and session cache, and the resumption succeeded.
#[tokio::test]
async fn a_tls_session_resumes_only_at_the_listener_that_issued_it() {
    let _apart = TLS_LISTENERS.lock().await;
    let (www, mqtt) = (
        SelfSigned::new(&["www.test"]),
        SelfSigned::new(&["mqtt.test"]),
    );
    let echo = Upstream::echo().await;
    let config = format!(
        "[[upstreams]]\nname = \"e\"\nservers = [\"{}\"]\n\n\
         [[tcp]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\nupstream = \"e\"\n\
         tls_cert = {:?}\ntls_key = {:?}\n\n\
         [[tcp]]\nname = \"mqtt\"\nlisten = \"127.0.0.1:0\"\nupstream = \"e\"\n\
         tls_cert = {:?}\ntls_key = {:?}\n",
        echo.addr,
        www.cert.path(),
        www.key.path(),
        mqtt.cert.path(),
        mqtt.key.path(),
    );
    let proxy = Proxy::start(&config);
    let addr = |name: &str| {
        proxy
            .tcp
            .local_addrs()
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
    };
    let mut roots = rustls::RootCertStore::empty();
    roots.add(www.der.clone().into()).unwrap();
    roots.add(mqtt.der.clone().into()).unwrap();
    // One client config: its session store remembers what each server name was given.
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    // An echo through the web listener for `www.test` (reading the answer takes in the ticket),
    // twice: the second resumes.
    let echo_through = |at: std::net::SocketAddr| {
        let connector = connector.clone();
        async move {
            let tcp = TcpStream::connect(at).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("www.test").unwrap();
            let mut tls = connector.connect(name, tcp).await?;
            tls.write_all(b"ping").await?;
            let mut back = [0; 4];
            tls.read_exact(&mut back).await?;
            assert_eq!(&back, b"ping");
            Ok::<_, std::io::Error>(tls.get_ref().1.handshake_kind())
        }
    };
    assert_eq!(
        echo_through(addr("web")).await.unwrap(),
        Some(rustls::HandshakeKind::Full)
    );
    assert_eq!(
        echo_through(addr("web")).await.unwrap(),
        Some(rustls::HandshakeKind::Resumed)
    );
    // The same session offered to the mqtt listener: a full handshake, whose certificate is not
    // for `www.test`.
    let e = echo_through(addr("mqtt")).await.unwrap_err();
    assert!(e.to_string().contains("certificate"), "{e}");
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 2);

    // A reload that keeps the web listener's files keeps its sessions; one that points it at
    // other files (the same certificate, copied) lets them go: a full handshake.
    let reload = |text: &str| {
        let c = sluice::config::Config::parse_file(text).unwrap();
        let groups = Arc::new(
            sluice::upstream::group::Groups::rebuild(&c.upstreams, Some(&proxy.groups)).unwrap(),
        );
        proxy.tcp.apply(&c.tcp, groups).unwrap();
    };
    // (The mqtt attempt used up the client's one ticket: a connection first, for a new one.)
    echo_through(addr("web")).await.unwrap();
    reload(&config);
    assert_eq!(
        echo_through(addr("web")).await.unwrap(),
        Some(rustls::HandshakeKind::Resumed)
    );
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("www.pem"), dir.path().join("www.key"));
    std::fs::copy(www.cert.path(), &cert).unwrap();
    std::fs::copy(www.key.path(), &key).unwrap();
    reload(
        &config
            .replace(&format!("{:?}", www.cert.path()), &format!("{cert:?}"))
            .replace(&format!("{:?}", www.key.path()), &format!("{key:?}")),
    );
    assert_eq!(
        echo_through(addr("web")).await.unwrap(),
        Some(rustls::HandshakeKind::Full)
    );
}

#[tokio::test]
async fn serve_starts_tcp_listeners_next_to_http() {
    let echo = Upstream::echo().await;
    let port = closed_port().await.port();
    let text = format!(
        "[server]\nlisten = [\"127.0.0.1:0\"]\n\n[[upstreams]]\nname = \"e\"\nservers = [\"{}\"]\n\n\
         [[tcp]]\nlisten = \"127.0.0.1:{port}\"\nupstream = \"e\"\n",
        echo.addr
    );
    let config = sluice::config::Config::parse_file(&text).unwrap();
    config.validate().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(sluice::serve(config, async {
        let _ = rx.await;
    }));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut s = loop {
        if let Ok(s) = TcpStream::connect(addr).await {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    s.write_all(b"through serve").await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(read_all(&mut s, 5).await.unwrap(), b"through serve");
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Sends `msg` on `s` and reads it back (an echo upstream behind the proxy).
/// The 4 bytes sent on `s` do not come back within 400 ms (a connection the listener has not
/// served).
async fn unanswered(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4];
    tokio::time::timeout(Duration::from_millis(400), s.read_exact(&mut buf))
        .await
        .is_err()
}

async fn echoes(s: &mut TcpStream, msg: &[u8]) -> bool {
    if s.write_all(msg).await.is_err() {
        return false;
    }
    let mut back = vec![0u8; msg.len()];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back)).await,
        Ok(Ok(_))
    ) && back == msg
}

/// One address cannot hold every slot of a listener (and an upstream connection each): past
/// `max_connections_per_ip` its new connections are closed at once, before any upstream is
/// contacted, while another address is still served. Before, `[[tcp]]` listeners had no per-IP
/// share, so one address opening `max_connections` idle connections stopped the listener for all.
#[tokio::test]
async fn one_address_holds_at_most_its_share_of_a_listener() {
    let echo = Upstream::echo().await;
    let mut config = one_group(&quoted(&[echo.addr]), "");
    // Loopback is exempt by default; here it is not.
    config.push_str("max_connections_per_ip = 2\nper_ip_exempt = [\"10.0.0.0/8\"]\n");
    let proxy = Proxy::start(&config);
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(echoes(&mut s, b"held").await);
        held.push(s);
    }
    let mut third = TcpStream::connect(proxy.addr()).await.unwrap();
    let _ = third.write_all(b"third").await;
    assert_eq!(read_all(&mut third, 5).await.unwrap_or_default(), b"");
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 2);
    // Another address is served.
    let mut other = connect_from("127.0.0.2", proxy.addr()).await;
    assert!(echoes(&mut other, b"other").await);
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 3);
    // Places are given back when connections end.
    drop(held);
    drop(other);
    proxy.idle().await;
    let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(echoes(&mut again, b"again").await);
    drop(again);
    proxy.idle().await;
    assert!(proxy.metrics().contains(
        "sluice_tcp_connections_refused_total{listener=\"127.0.0.1:0\",reason=\"per_ip\"} 1"
    ));
}

/// A reload that changes `max_connections_per_ip` (or `per_ip_exempt`) counts the connections
/// already open: with 2 held under a share of 2, raised to 3, the address may open one more, not
/// three; with the share lowered to 1, it is refused until it holds none; connections opened while
/// exempt count once the exemption ends. Before, a changed share was a fresh count, so the address
/// held its new share again on top of what it held.
#[tokio::test]
async fn a_reload_that_changes_the_share_counts_the_connections_open() {
    let echo = Upstream::echo().await;
    let config = |share: usize, exempt: &str| {
        let mut c = one_group(&quoted(&[echo.addr]), "");
        // Loopback is exempt by default; here it is not, unless `exempt` says so.
        c.push_str(&format!(
            "max_connections_per_ip = {share}\nper_ip_exempt = [\"{exempt}\"]\n"
        ));
        c
    };
    let reload = |proxy: &Proxy, text: String| {
        let next = sluice::config::Config::parse_file(&text).unwrap();
        proxy
            .tcp
            .apply(&next.tcp, Arc::clone(&proxy.groups))
            .unwrap();
    };
    let proxy = Proxy::start(&config(2, "10.0.0.0/8"));
    let addr = proxy.addr();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert!(echoes(&mut s, b"held").await);
        held.push(s);
    }
    let refused = || async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(b"more").await;
        read_all(&mut s, 5).await.unwrap_or_default().is_empty()
    };

    reload(&proxy, config(3, "10.0.0.0/8"));
    assert_eq!(proxy.addr(), addr, "the listener kept its socket");
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(echoes(&mut third, b"3rd!").await);
    held.push(third);
    assert!(refused().await, "a 4th served under a share of 3");
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 3);
    // Open connections are not cut by the reload.
    for s in &mut held {
        assert!(echoes(s, b"kept").await);
    }

    // Lowered to 1 with 3 open: refused until none is left.
    reload(&proxy, config(1, "10.0.0.0/8"));
    held.truncate(1);
    wait_connections(&proxy, 1).await;
    assert!(refused().await, "served with 1 open under a share of 1");
    held.clear();
    proxy.idle().await;
    let mut one = TcpStream::connect(addr).await.unwrap();
    assert!(echoes(&mut one, b"one!").await);

    // Opened while exempt, counted once the exemption ends.
    reload(&proxy, config(1, "127.0.0.0/8"));
    let mut exempt = TcpStream::connect(addr).await.unwrap();
    assert!(echoes(&mut exempt, b"free").await);
    reload(&proxy, config(2, "10.0.0.0/8"));
    assert!(refused().await, "served with 2 open under a share of 2");
    drop(one);
    wait_connections(&proxy, 1).await;
    let mut again = TcpStream::connect(addr).await.unwrap();
    assert!(echoes(&mut again, b"agn!").await);
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 6);
}

/// Behind a trusted proxy every client arrives from the proxy's address: the share is then
/// counted by the PROXY header's source address.
#[tokio::test]
async fn behind_a_trusted_proxy_the_share_is_the_header_source() {
    let echo = Upstream::echo().await;
    let proxy = Proxy::start(&proxy_in(
        "127.0.0.0/8",
        "max_connections_per_ip = 1\nper_ip_exempt = []",
        &quoted(&[echo.addr]),
    ));
    let dst = "198.51.100.1:5432".parse().unwrap();
    let from = |client: &str| {
        let header = proxy_protocol::encode_v2(client.parse().unwrap(), dst);
        let addr = proxy.addr();
        async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(&header).await.unwrap();
            s
        }
    };
    let mut a = from("203.0.113.7:1000").await;
    assert!(echoes(&mut a, b"a").await);
    let mut a2 = from("203.0.113.7:1001").await;
    let _ = a2.write_all(b"a2").await;
    assert_eq!(read_all(&mut a2, 5).await.unwrap_or_default(), b"");
    let mut b = from("203.0.113.8:1000").await;
    assert!(echoes(&mut b, b"b").await);
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 2);
}

/// One IPv6 /48 cannot hold every slot by spreading its connections over its /64s (65,536 of
/// them, free from a tunnel broker): past 16 shares over the whole /48 (`SHARES_PER_48`) its new
/// connections are closed at once, whichever /64 they come from, while another /48 is served.
/// Counted by PROXY header source, the one way a test on loopback can come from many /64s.
/// Before, each /64 held a full share: at a share of 100 a /57 filled 10,000 slots.
#[tokio::test]
async fn one_ipv6_48_holds_at_most_16_shares_over_its_64s() {
    let echo = Upstream::echo().await;
    let proxy = Proxy::start(&proxy_in(
        "127.0.0.0/8",
        "max_connections_per_ip = 1\nper_ip_exempt = []",
        &quoted(&[echo.addr]),
    ));
    let dst = "198.51.100.1:5432".parse().unwrap();
    let from = |client: String| {
        let header = proxy_protocol::encode_v2(client.parse().unwrap(), dst);
        let addr = proxy.addr();
        async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(&header).await.unwrap();
            s
        }
    };
    // Sixteen /64s of 2001:db8:1::/48, one connection each: all served.
    let mut held = Vec::new();
    for net in 0..16 {
        let mut s = from(format!("[2001:db8:1:{net:x}::1]:1000")).await;
        assert!(echoes(&mut s, b"held").await, "/64 number {net}");
        held.push(s);
    }
    // A seventeenth /64 of the same /48, with nothing open in its own /64: refused.
    let mut more = from("[2001:db8:1:ff::1]:1000".to_string()).await;
    let _ = more.write_all(b"more").await;
    assert_eq!(read_all(&mut more, 5).await.unwrap_or_default(), b"");
    // Another /48 is served.
    let mut other = from("[2001:db8:2::1]:1000".to_string()).await;
    assert!(echoes(&mut other, b"othr").await);
    assert_eq!(echo.accepted.load(Ordering::SeqCst), 17);
    // A place given back lets another /64 of the /48 in.
    held.pop();
    wait_connections(&proxy, 16).await;
    let mut again = from("[2001:db8:1:ff::1]:1000".to_string()).await;
    assert!(echoes(&mut again, b"agn!").await);
    drop((held, other, again));
    proxy.idle().await;
    assert!(proxy.metrics().contains(
        "sluice_tcp_connections_refused_total{listener=\"127.0.0.1:0\",reason=\"per_ip\"} 1"
    ));
}

/// A PROXY v1 header sent in one write with the payload behind it is parsed and the payload
/// reaches the upstream intact; a header trickled a byte per write still works. (How many reads
/// the header takes is counted by `tcp::session`'s
/// `a_proxy_header_in_one_write_takes_one_peek_and_one_read`.)
#[tokio::test]
async fn a_proxy_v1_header_with_its_payload_in_one_write_or_trickled() {
    let (up, mut got) = Upstream::recorder("ok").await;
    let proxy = Proxy::start(&proxy_in("127.0.0.0/8", "", &quoted(&[up.addr])));
    let header = proxy_protocol::encode_v1(
        "[2001:db8::7]:4242".parse().unwrap(),
        "[2001:db8::1]:5432".parse().unwrap(),
    );
    let body = pattern(1 << 20);
    for trickle in [false, true] {
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        if trickle {
            s.set_nodelay(true).unwrap();
            for b in &header {
                s.write_all(std::slice::from_ref(b)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            s.write_all(&body).await.unwrap();
        } else {
            s.write_all(&[&header[..], &body[..]].concat())
                .await
                .unwrap();
        }
        s.shutdown().await.unwrap();
        assert_eq!(
            read_all(&mut s, 5).await.unwrap(),
            b"ok",
            "trickle {trickle}"
        );
        let seen = got.recv().await.unwrap();
        assert_eq!(sha256(&seen), sha256(&body), "trickle {trickle}");
    }
}

/// A ClientHello whose server_name is an IPv6 literal (some clients send one against RFC 6066)
/// goes to the listener's default upstream, as a hello without SNI does. Before, it was refused
/// as `not_tls`, before any upstream was contacted. (Other names that are not host names are
/// still refused: `client_hello` unit tests.)
#[tokio::test]
async fn a_hello_naming_no_host_goes_to_the_default_upstream() {
    let (a, _a_got) = Upstream::recorder("A").await;
    let (d, mut d_got) = Upstream::recorder("D").await;
    let config = format!(
        "[[upstreams]]\nname = \"a\"\nservers = [\"{}\"]\n[[upstreams]]\nname = \"d\"\nservers = [\"{}\"]\n\n\
         [[tcp]]\nlisten = \"127.0.0.1:0\"\nupstream = \"d\"\n\
         sni = [{{ server_name = \"*.b.example\", upstream = \"a\" }}]\n",
        a.addr, d.addr
    );
    let proxy = Proxy::start(&config);
    for name in [&b"fe80::1"[..], b"[2001:db8::1]"] {
        // rustls sends no IP literal: its hello for a placeholder of the same length, with the
        // name put in its place.
        let placeholder = "q".repeat(name.len());
        let mut hello = client_hello(&placeholder);
        let at = hello
            .windows(name.len())
            .position(|w| w == placeholder.as_bytes())
            .unwrap();
        hello[at..at + name.len()].copy_from_slice(name);
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.write_all(&[&hello[..], b"after"].concat()).await.unwrap();
        s.shutdown().await.unwrap();
        let label = String::from_utf8_lossy(name);
        assert_eq!(
            read_all(&mut s, 5).await.unwrap_or_default(),
            b"D",
            "{label}"
        );
        assert_eq!(
            d_got.recv().await.unwrap(),
            [&hello[..], b"after"].concat(),
            "{label}"
        );
    }
    assert_eq!(a.accepted.load(Ordering::SeqCst), 0);
}

/// A ClientHello cut into more TLS records than any real client uses is refused like any other
/// malformed hello, before any upstream is contacted; the same hello in 2 records is routed.
/// Before, 16 KiB in 1-byte records (one per segment) cost a parse of every record per segment.
#[tokio::test]
async fn sni_refuses_a_hello_cut_into_many_records() {
    let (a, mut a_got) = Upstream::recorder("A").await;
    let config = format!(
        "[[upstreams]]\nname = \"a\"\nservers = [\"{}\"]\n\n[[tcp]]\nlisten = \"127.0.0.1:0\"\n\
         sni = [{{ server_name = \"a.example.com\", upstream = \"a\" }}]\n",
        a.addr
    );
    let proxy = Proxy::start(&config);
    let hello = client_hello("a.example.com");
    let two = in_records(&hello, 2);
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(&two).await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(read_all(&mut s, 5).await.unwrap(), b"A");
    assert_eq!(a_got.recv().await.unwrap(), two);
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(&in_records(&hello, 40)).await.unwrap();
    assert_eq!(read_all(&mut s, 5).await.unwrap_or_default(), b"");
    assert_eq!(a.accepted.load(Ordering::SeqCst), 1);
    proxy.idle().await;
    assert!(proxy.metrics().contains(
        "sluice_tcp_connections_refused_total{listener=\"127.0.0.1:0\",reason=\"not_tls\"} 1"
    ));
}

/// A TLS client that closes its TCP stream without close_notify has ended its stream: the
/// upstream gets a FIN (not a reset) and its answer still reaches the client. Before, rustls's
/// UnexpectedEof ended the relay as an error and both sides were reset, losing the answer.
#[tokio::test]
async fn tls_client_close_without_close_notify_is_an_end_of_stream() {
    let _apart = TLS_LISTENERS.lock().await;
    let SelfSigned { der, cert, key } = SelfSigned::new(&["localhost"]);
    let (up, mut got) = Upstream::recorder("reply").await;
    let config = format!(
        "[[upstreams]]\nname = \"r\"\nservers = [\"{}\"]\n\n\
         [[tcp]]\nlisten = \"127.0.0.1:0\"\nupstream = \"r\"\ntls_cert = {:?}\ntls_key = {:?}\n",
        up.addr,
        cert.path(),
        key.path()
    );
    let proxy = Proxy::start(&config);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.into()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"hello").await.unwrap();
    tls.flush().await.unwrap();
    // The TCP write side closed under TLS: a FIN with no close_notify before it.
    tls.get_mut().0.shutdown().await.unwrap();
    let mut back = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut back)).await;
    assert_eq!(got.recv().await.unwrap(), b"hello");
    assert!(matches!(read, Ok(Ok(5))), "{read:?}");
    assert_eq!(back, b"reply");
    proxy.idle().await;
    assert!(proxy
        .metrics()
        .contains("sluice_tcp_connections_ended_total{listener=\"127.0.0.1:0\",how=\"closed\"} 1"));
}

/// A black hole on `[::1]` (a listener whose accept queue is full drops further SYNs, as
/// `black_hole` builds one on 127.0.0.1) and an echo server on `127.0.0.1` at the same port, so a
/// `.localhost` name's first address (`::1`, in the resolver's RFC 6761 order) is silent and its
/// second answers. The echo server's connections are counted; `None` without an IPv6 loopback.
#[allow(clippy::type_complexity)]
async fn silent_v6_then_echo_v4() -> Option<(
    u16,
    socket2::Socket,
    Vec<TcpStream>,
    tokio::task::JoinHandle<()>,
    Arc<std::sync::atomic::AtomicUsize>,
)> {
    for _ in 0..20 {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None).ok()?;
        socket.set_only_v6(true).ok()?;
        let v6: std::net::SocketAddr = "[::1]:0".parse().unwrap();
        socket.bind(&v6.into()).ok()?;
        socket.listen(0).unwrap();
        let hole = socket.local_addr().unwrap().as_socket().unwrap();
        let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.1", hole.port())).await else {
            continue; // The port is taken on IPv4: another pair.
        };
        let mut fillers = Vec::new();
        for _ in 0..4 {
            if let Ok(Ok(s)) =
                tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(hole)).await
            {
                fillers.push(s);
            }
        }
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let echo = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
        return Some((hole.port(), socket, fillers, echo, accepted));
    }
    None
}

/// Finding: a `[[tcp]]` server given by a name was looked up with `getaddrinfo` on each new
/// connection (outside the shared resolver: no cache, no bound on blocking lookups, `.localhost`
/// left to DNS) and its addresses tried one after the other, the first holding the connect until
/// `connect_timeout_secs` ran out, so a first address that drops SYNs failed the connection and
/// the next was never tried. The name goes through the shared resolver (`app.localhost` is `::1`
/// then `127.0.0.1`, RFC 6761) and its addresses are raced as Happy Eyeballs does: the silent
/// `::1` costs a stagger and `127.0.0.1` answers.
#[tokio::test]
async fn a_server_name_whose_first_address_is_silent_connects_to_the_next() {
    let Some((port, _hole, _fillers, echo, accepted)) = silent_v6_then_echo_v4().await else {
        panic!("this test needs the IPv6 loopback address (::1) on lo");
    };
    let mut config = one_group(&format!("\"app.localhost:{port}\""), "max_fails = 0");
    config.push_str("connect_timeout_secs = 5\n");
    let proxy = Proxy::start(&config);
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    // Errors are read below: a connection refused is closed (or reset) unread.
    let _ = s.write_all(b"by name").await;
    let _ = s.shutdown().await;
    let got = read_all(&mut s, 30).await;
    assert_eq!(
        got.as_deref().ok(),
        Some(&b"by name"[..]),
        "the next address was never reached: {got:?}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    let m = proxy.metrics();
    assert!(!m.contains("reason=\"connect_failed\""), "{m}");
    echo.abort();
}

/// A TLS client for `der`'s certificate (named `localhost`) connected to `addr`.
async fn tls_client(
    der: Vec<u8>,
    addr: std::net::SocketAddr,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.into()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

/// An upstream that sends `chunk` bytes per write for as long as it can, drains whatever the
/// client sends, and sets the flag once its connection is closed (either way).
async fn firehose(chunk: usize) -> (Upstream, Arc<AtomicBool>) {
    let closed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&closed);
    let up = Upstream::spawn(move |s| {
        let flag = Arc::clone(&flag);
        async move {
            let (mut r, mut w) = s.into_split();
            let drain = async {
                let mut buf = [0u8; 1024];
                while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
            };
            let send = async {
                let bytes = vec![b'x'; chunk];
                while w.write_all(&bytes).await.is_ok() {}
            };
            tokio::select! {
                () = drain => {}
                () = send => {}
            }
            flag.store(true, Ordering::SeqCst);
        }
    })
    .await;
    (up, closed)
}

/// A TLS client that never reads what the upstream sends cannot hold its connection by sending
/// a byte the other way now and then: the write toward it makes no progress for
/// `idle_timeout_secs` and the connection ends, as idle. Before, the relay waited on that write
/// for good (holding the 64 KiB copy buffer and rustls's records) while each client byte reset the
/// idle timer. A client that reads slowly but steadily is not cut.
#[tokio::test]
async fn a_tls_client_that_stops_reading_is_cut_whatever_it_sends() {
    let _apart = TLS_LISTENERS.lock().await;
    let SelfSigned { der, cert, key } = SelfSigned::new(&["localhost"]);
    let (trickle, trickle_closed) = firehose(1).await;
    let (bulk, bulk_closed) = firehose(4096).await;
    let config = format!(
        "[[upstreams]]\nname = \"t\"\nservers = [\"{}\"]\n[[upstreams]]\nname = \"b\"\nservers = [\"{}\"]\n\n\
         [[tcp]]\nname = \"stall\"\nlisten = \"127.0.0.1:0\"\nupstream = \"t\"\nidle_timeout_secs = 1\n\
         tls_cert = {:?}\ntls_key = {:?}\n\n\
         [[tcp]]\nname = \"slow\"\nlisten = \"127.0.0.1:0\"\nupstream = \"b\"\nidle_timeout_secs = 3\n\
         tls_cert = {:?}\ntls_key = {:?}\n",
        trickle.addr,
        bulk.addr,
        cert.path(),
        key.path(),
        cert.path(),
        key.path()
    );
    let proxy = Proxy::start(&config);

    // Never reads; sends a byte every quarter of the idle timeout. Within 40 of them (ten idle
    // timeouts) the upstream's connection is gone.
    let mut deaf = tls_client(der.clone(), proxy.tcp.local_addr("stall").unwrap()).await;
    let mut sent = 0;
    while !trickle_closed.load(Ordering::SeqCst) {
        assert!(
            sent < 40,
            "still relaying after {sent} client bytes ({} idle timeouts) to a client that reads nothing",
            sent / 4
        );
        if deaf.write_all(b".").await.is_err() || deaf.flush().await.is_err() {
            break;
        }
        sent += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Counted as an idle end.
    for _ in 0..100 {
        if proxy.metrics().contains(
            "sluice_tcp_connections_ended_total{listener=\"stall\",how=\"idle_timeout\"} 1",
        ) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        proxy.metrics().contains(
            "sluice_tcp_connections_ended_total{listener=\"stall\",how=\"idle_timeout\"} 1"
        ),
        "{}",
        proxy.metrics()
    );

    // Reads 512 KiB every twelfth of the idle timeout and sends nothing: only its reads keep the
    // writes toward it moving, through 24 reads (two idle timeouts). (Slow next to loopback, and
    // fast enough that the kernel's send buffer toward it, up to 4 MiB, turns writable again
    // well within the timeout.)
    let mut slow = tls_client(der, proxy.tcp.local_addr("slow").unwrap()).await;
    let mut buf = vec![0u8; 512 * 1024];
    for i in 0..24 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let read = tokio::time::timeout(Duration::from_secs(10), slow.read_exact(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(_))), "read {i}: {read:?}");
        assert!(!bulk_closed.load(Ordering::SeqCst), "cut after {i} reads");
    }
    drop(slow);
    drop(deaf);
    proxy.idle().await;
}

/// A connection accepted before a reload, whose TLS handshake completes after it, is relayed to
/// the servers of the group as the reload left it: the reload moved `g` from A to B, and the
/// client's bytes reach B. Before, the connection kept the groups of its accept and reached A, a
/// server the reload had removed (counted on the old generation's servers).
#[tokio::test]
async fn a_handshake_finished_after_a_reload_reaches_the_reloaded_group() {
    let _apart = TLS_LISTENERS.lock().await;
    let SelfSigned { der, cert, key } = SelfSigned::new(&["localhost"]);
    let (a, mut a_got) = Upstream::recorder("a").await;
    let (b, mut b_got) = Upstream::recorder("b").await;
    let config = |server: std::net::SocketAddr| {
        format!(
            "[[upstreams]]\nname = \"g\"\nservers = [\"{server}\"]\n\n\
             [[tcp]]\nname = \"t\"\nlisten = \"127.0.0.1:0\"\nupstream = \"g\"\n\
             tls_cert = {:?}\ntls_key = {:?}\n",
            cert.path(),
            key.path()
        )
    };
    let proxy = Proxy::start(&config(a.addr));
    // Connected, accepted (its session started under the first settings), and holding its
    // handshake: nothing sent yet.
    let tcp = TcpStream::connect(proxy.addr()).await.unwrap();
    wait_connections(&proxy, 1).await;
    let accepted = "sluice_tcp_connections_accepted_total{listener=\"t\"} 1";
    for _ in 0..500 {
        if proxy.metrics().contains(accepted) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(proxy.metrics().contains(accepted), "{}", proxy.metrics());

    let second = sluice::config::Config::parse_file(&config(b.addr)).unwrap();
    let groups = Arc::new(
        sluice::upstream::group::Groups::rebuild(&second.upstreams, Some(&proxy.groups)).unwrap(),
    );
    proxy.tcp.apply(&second.tcp, groups).unwrap();

    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.into()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"after the reload").await.unwrap();
    tls.shutdown().await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut answer)).await;
    assert_eq!(
        (
            String::from_utf8_lossy(&answer).into_owned(),
            a.accepted.load(Ordering::SeqCst)
        ),
        ("b".to_string(), 0),
        "relayed to the server the reload removed"
    );
    assert_eq!(b_got.recv().await.unwrap(), b"after the reload");
    assert!(a_got.try_recv().is_err());
    drop(tls);
    proxy.idle().await;
}
