//! The TCP front end out of file descriptors: connections are refused or wait, nothing panics or
//! spins, the upstream is not blamed, and everything works again once descriptors are free. Its own
//! test binary, because the descriptor limit is per process.

mod support;
mod tcp_support;

use std::time::Duration;

use tcp_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn set_fd_limit(soft: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a valid struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let old = lim.rlim_cur;
        lim.rlim_cur = soft as libc::rlim_t;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        old
    }
}

async fn ping(addr: std::net::SocketAddr) -> bool {
    let Ok(Ok(mut s)) =
        tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await
    else {
        return false;
    };
    if s.write_all(b"ping").await.is_err() {
        return false;
    }
    let mut buf = [0u8; 4];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut buf)).await,
        Ok(Ok(_))
    ) && &buf == b"ping"
}

#[tokio::test]
async fn out_of_descriptors_then_recovers() {
    let echo = Upstream::echo().await;
    let proxy = Proxy::start(&format!(
        "[[upstreams]]\nname = \"g\"\nservers = [\"{}\"]\nmax_fails = 1\n\n[[tcp]]\nlisten = \"127.0.0.1:0\"\nupstream = \"g\"\n",
        echo.addr
    ));
    assert!(ping(proxy.addr()).await);
    proxy.idle().await;
    // A few descriptors of headroom: each relayed connection needs four (client, accepted,
    // upstream, the echo's end; a ping is small, so it is copied and takes no pipe), so a handful
    // of clients exhausts the table.
    let old = set_fd_limit(fd_count() as u64 + 10);
    let mut held = Vec::new();
    let mut served = 0;
    for _ in 0..12 {
        if let Ok(Ok(mut s)) =
            tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(proxy.addr())).await
        {
            let _ = s.write_all(b"ping").await;
            let mut buf = [0u8; 4];
            if let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_millis(500), s.read_exact(&mut buf)).await
            {
                served += 1;
            }
            held.push(s);
        }
    }
    assert!(served < 12, "the limit never bit");
    drop(held);
    set_fd_limit(old);
    proxy.idle().await;
    // Back to normal, and the upstream was never blamed for our own shortage.
    for _ in 0..5 {
        assert!(ping(proxy.addr()).await);
    }
    let server = &proxy.groups.get("g").unwrap().servers()[0];
    assert_eq!(server.ejections(), 0);
    assert!(server.is_usable());

    // A connection that turns bulk while no pipe can be made keeps working by copying.
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.unwrap();
    // One descriptor of room: a pipe needs two.
    let old = set_fd_limit(fd_count() as u64 + 1);
    let body = support::pattern(2 << 20);
    let mut back = vec![0u8; body.len()];
    let (mut r, mut w) = s.split();
    let (sent, got) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(w.write_all(&body), r.read_exact(&mut back))
    })
    .await
    .expect("the bulk transfer stalled");
    set_fd_limit(old);
    sent.unwrap();
    got.unwrap();
    assert_eq!(support::sha256(&back), support::sha256(&body));
}
