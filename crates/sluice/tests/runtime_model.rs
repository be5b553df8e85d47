//! `server.runtime = "per-core"`: one current-thread runtime per core, each with its own
//! `SO_REUSEPORT` listener. The reverse proxy, the media front end and the IPTV gateway all serve
//! correct bytes under it, connections spread over the cores, and shutdown stops every runtime.

mod iptv_support;
mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::Digest;
use sluice::config::Config;
use sluice::runtime::RuntimeModel;
use sluice::server::Server;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A sluice bound with `Server::bind` (per-core needs its own sockets).
struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
}

async fn start(mut config: Config, model: RuntimeModel, threads: usize) -> Running {
    config.server.listen = vec!["127.0.0.1:0".parse().unwrap()];
    config.server.runtime = model;
    config.server.threads = threads;
    config.server.shutdown_grace_secs = 2;
    config.validate().unwrap();
    let app = sluice::app::App::new(&config).unwrap();
    let server = Server::bind(&config.server, app).unwrap();
    let addr = server.local_addrs()[0];
    let (tx, rx) = oneshot::channel();
    let done = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    Running {
        addr,
        stop: Some(tx),
        done,
    }
}

impl Running {
    /// Stops the server and waits for every runtime to finish.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), &mut self.done)
            .await
            .expect("server stops within the grace period")
            .unwrap();
    }
}

/// An origin answering every request with the SHA-256 of its body and the path.
async fn hashing_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let path = req.uri().path().to_string();
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let text = format!("{path} {:x}", sha2::Sha256::digest(&body));
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(text))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// Names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_proxy_under_per_core() {
    let origin = hashing_origin().await;
    let config = Config::parse_file(&format!(
        r#"
[[upstreams]]
name = "app"
servers = ["{origin}"]

[[routes]]
path = "/"
upstream = "app"
"#
    ))
    .unwrap();
    let running = start(config, RuntimeModel::PerCore, 2).await;
    // Both runtimes run (a thread names itself once it starts).
    let mut names = thread_names();
    for _ in 0..100 {
        if ["sluice-core-0", "sluice-core-1"]
            .iter()
            .all(|c| names.iter().any(|n| n == c))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        names = thread_names();
    }
    for core in ["sluice-core-0", "sluice-core-1"] {
        assert!(names.iter().any(|n| n == core), "{names:?}");
    }
    // Many connections (the kernel spreads them over both sockets), each a keep-alive client
    // sending several bodies: every answer is the hash of exactly the bytes sent.
    let mut tasks = Vec::new();
    for c in 0..16u8 {
        let addr = running.addr;
        tasks.push(tokio::spawn(async move {
            let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .build_http::<Full<Bytes>>();
            for r in 0..4u8 {
                let body = support::pattern(50_000 + usize::from(c) * 1000 + usize::from(r));
                let want = format!("/c{c}/r{r} {:x}", sha2::Sha256::digest(&body));
                let req = http::Request::post(format!("http://{addr}/c{c}/r{r}"))
                    .body(Full::new(body))
                    .unwrap();
                let resp = client.request(req).await.unwrap();
                assert_eq!(resp.status(), 200);
                let got = resp.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(got, want.as_bytes());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // The CL+TE screen runs on per-core connections too.
    let reply = support_raw(
        running.addr,
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    let addr = running.addr;
    running.stop().await;
    // Every runtime's sockets are closed: with one left open, some connects would succeed.
    for _ in 0..8 {
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}

/// Writes `bytes` on a new connection and reads until the server closes it (at most 5 s).
async fn support_raw(addr: SocketAddr, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_and_iptv_under_per_core() {
    let origin = support::Origin::start().await;
    let mut config = support::test_config();
    config.iptv.interface = None;
    config.iptv.interfaces = vec!["lo".into()];
    let running = start(config, RuntimeModel::PerCore, 2).await;
    // Media: a 24 MB stream through /proxy/stream, byte for byte, from several connections.
    let url = format!(
        "http://{}/proxy/stream?d={}",
        running.addr,
        support::enc(&origin.url("/big"))
    );
    let want = support::sha256(&origin.big);
    let mut fetches = Vec::new();
    for _ in 0..3 {
        let url = url.clone();
        fetches.push(tokio::spawn(async move { support::get(&url).await }));
    }
    for f in fetches {
        let reply = f.await.unwrap();
        assert_eq!(reply.status, 200);
        assert_eq!(support::sha256(reply.body.as_ref().unwrap()), want);
    }
    // IPTV: several viewers of one channel, on whichever runtimes their connections landed,
    // share one hub and each get the whole stream.
    let group = "239.71.9.1";
    let path = format!("/rtp/{group}:46901?iface=lo");
    let stream = iptv_support::ts_datagrams(200, 0x101, None);
    let total: usize = stream.iter().map(Vec::len).sum();
    let sender = iptv_support::Sender::new(group, 46901);
    let (addr, p) = (running.addr, path.clone());
    let first = tokio::spawn(async move { iptv_support::get_as(addr, &p, "127.0.0.1").await });
    iptv_support::wait_joined(group, true).await;
    sender.send_rtp(&stream[..1], 0);
    let mut viewers = vec![first.await.unwrap()];
    for _ in 1..4 {
        viewers.push(iptv_support::get_as(running.addr, &path, "127.0.0.1").await);
    }
    sender.send_rtp(&stream[1..], 1);
    let want = sha2::Sha256::digest(stream.concat());
    for v in viewers {
        assert_eq!(v.status(), 200);
        let got = iptv_support::read_bytes(v, total).await;
        assert_eq!(got.len(), total);
        assert_eq!(sha2::Sha256::digest(&got), want);
    }
    running.stop().await;
}

#[tokio::test]
async fn work_stealing_stays_the_default() {
    assert_eq!(Config::default().server.runtime, RuntimeModel::WorkStealing);
    let origin = hashing_origin().await;
    let config = Config::parse_file(&format!(
        "[server]\nruntime = \"work-stealing\"\n[[upstreams]]\nname = \"a\"\nservers = [\"{origin}\"]\n[[routes]]\npath = \"/\"\nupstream = \"a\"\n"
    ))
    .unwrap();
    let running = start(config, RuntimeModel::WorkStealing, 0).await;
    let reply = support::get(&format!("http://{}/x", running.addr)).await;
    let want = format!("/x {:x}", sha2::Sha256::digest(b""));
    assert_eq!(reply.body.unwrap(), want.as_bytes());
    running.stop().await;
    let err = Config::parse_file("[server]\nruntime = \"threaded\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("per-core"), "{err}");
}
