//! The TCP front end leaks no file descriptor: after hundreds of connections the process has as
//! many open as before. Its own test binary, because the count is per process and other tests
//! open sockets in parallel.

mod support;
mod tcp_support;

use std::time::Duration;

use support::pattern;
use tcp_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn one_group(servers: &str, extra: &str) -> String {
    format!(
        "[[upstreams]]\nname = \"g\"\nservers = [{servers}]\n{extra}\n\n[[tcp]]\nlisten = \"127.0.0.1:0\"\nupstream = \"g\"\n"
    )
}

fn quoted(addrs: &[std::net::SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sends `body` and reads the echo concurrently; returns the echo.
async fn echo_through(addr: std::net::SocketAddr, body: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = s.split();
    let write = async {
        w.write_all(body).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let read = async {
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        out
    };
    let ((), out) = tokio::join!(write, read);
    out
}

#[tokio::test]
async fn file_descriptors_return_to_baseline() {
    let echo = Upstream::echo().await;
    let proxy = Proxy::start(&one_group(&quoted(&[echo.addr]), ""));
    let batch = |n: usize| {
        let addr = proxy.addr();
        async move {
            let runs: Vec<_> = (0..n)
                .map(|i| {
                    tokio::spawn(async move {
                        echo_through(addr, &pattern(1000 + i * 7919)).await.len()
                    })
                })
                .collect();
            for r in runs {
                r.await.unwrap();
            }
        }
    };
    // Warm up: the pipe pool and the runtime reach their steady state.
    batch(20).await;
    proxy.idle().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let baseline = fd_count();
    for _ in 0..10 {
        batch(20).await;
    }
    proxy.idle().await;
    let mut now = fd_count();
    for _ in 0..50 {
        if now == baseline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        now = fd_count();
    }
    assert_eq!(
        now, baseline,
        "fds: baseline {baseline}, after 200 connections {now}"
    );
}
