//! The TCP front end leaks no file descriptor: after hundreds of connections the process has as
//! many open as before. Its own test binary, because the count is per process and other tests
//! open sockets in parallel.

mod support;
mod tcp_support;

use std::time::Duration;

use support::pattern;
use tcp_support::*;

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
