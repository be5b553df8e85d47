//! Test support: sluice started in-process on 127.0.0.1:0, a mock origin with one path per upstream
//! behaviour, and a small HTTP client.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice::config::Config;
use sluice::server::Server;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// A running sluice.
pub struct Sluice {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    pub done: tokio::task::JoinHandle<()>,
}

impl Sluice {
    pub async fn start(mut config: Config) -> Sluice {
        if config.server.listen.is_empty() {
            config.server.listen = vec!["127.0.0.1:0".parse().unwrap()];
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = sluice::app::App::new(&config).unwrap();
        let server = Server::from_listeners(vec![listener], &config.server, app).unwrap();
        let (tx, rx) = oneshot::channel();
        let done = tokio::spawn(server.run(async {
            let _ = rx.await;
        }));
        Sluice {
            addr,
            stop: Some(tx),
            done,
        }
    }

    /// Starts graceful shutdown.
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }

    pub fn url(&self, path_and_query: &str) -> String {
        format!("http://{}{}", self.addr, path_and_query)
    }
}

/// A config for tests: private upstreams allowed (the origin is on loopback), short timeouts.
pub fn test_config() -> Config {
    let mut c = Config::default();
    c.upstream.allow_private = true;
    c.upstream.header_timeout_secs = 2;
    c.upstream.idle_read_timeout_secs = 2;
    c.upstream.connect_timeout_secs = 2;
    c
}

/// Deterministic pseudo-random bytes (xorshift), so bodies can be checked by hash.
pub fn pattern(len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

pub fn sha256(b: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(b))
}

/// What the origin saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: http::HeaderMap,
}

/// The mock origin.
pub struct Origin {
    pub addr: SocketAddr,
    pub big: Bytes,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

pub const BIG_LEN: usize = 24 * 1024 * 1024 + 123;
pub const ETAG: &str = "\"v1\"";

impl Origin {
    pub async fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let big = pattern(BIG_LEN);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (b, s) = (big.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (b, s) = (b.clone(), s.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let (b, s) = (b.clone(), s.clone());
                        async move { Ok::<_, Infallible>(origin_handle(req, b, s, addr).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Origin { addr, big, seen }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn seen_path(&self, path: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.path == path)
            .cloned()
            .collect()
    }
}

fn full(b: impl Into<Bytes>) -> BoxBody {
    Full::new(b.into()).map_err(|n| match n {}).boxed()
}

async fn origin_handle(
    req: Request<Incoming>,
    big: Bytes,
    seen: Arc<Mutex<Vec<Seen>>>,
    addr: SocketAddr,
) -> Response<BoxBody> {
    let path = req.uri().path().to_string();
    seen.lock().unwrap().push(Seen {
        method: req.method().to_string(),
        path: path.clone(),
        headers: req.headers().clone(),
    });
    let head = req.method() == http::Method::HEAD;
    match path.as_str() {
        "/big" => ranged(&req, big, head),
        "/small" => Response::builder()
            .header("content-type", "text/plain")
            .header("server", "origin/1")
            .header("set-cookie", "a=b")
            .header("etag", ETAG)
            .body(full("hello"))
            .unwrap(),
        "/forbidden" => Response::builder()
            .status(StatusCode::FORBIDDEN)
            .header("content-type", "text/plain")
            .body(full("go away"))
            .unwrap(),
        "/hang" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Response::new(full(""))
        }
        "/reset" => {
            // Promises 1 MiB, sends 64 KiB, then fails the body: the connection is cut.
            // The pause lets the head and first chunk reach the wire before the failure.
            let chunks = futures_util::stream::unfold(0u32, |i| async move {
                match i {
                    0 => Some((Ok(Frame::data(Bytes::from(vec![7u8; 64 * 1024]))), 1)),
                    1 => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Some((Err(std::io::Error::other("origin reset")), 2))
                    }
                    _ => None,
                }
            });
            Response::builder()
                .header("content-length", (1024 * 1024).to_string())
                .body(StreamBody::new(chunks).boxed())
                .unwrap()
        }
        "/slow" => {
            // 12 chunks 400 ms apart: ~4.8 s, longer than every timeout in the test config.
            let s = futures_util::stream::unfold(0u32, |i| async move {
                if i == 12 {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(400)).await;
                Some((
                    Ok(Frame::data(Bytes::from(vec![b'a' + i as u8; 1000]))),
                    i + 1,
                ))
            });
            Response::builder()
                .header("content-type", "application/octet-stream")
                .body(StreamBody::new(s).boxed())
                .unwrap()
        }
        p if p.starts_with("/redirect/") => {
            let n: u32 = p["/redirect/".len()..].parse().unwrap_or(0);
            let to = if n == 0 {
                format!("http://{addr}/small")
            } else {
                format!("/redirect/{}", n - 1)
            };
            Response::builder()
                .status(StatusCode::FOUND)
                .header("location", to)
                .body(full(""))
                .unwrap()
        }
        _ => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(full("nope"))
            .unwrap(),
    }
}

/// Serves `body` honouring Range and If-Range like a file server.
fn ranged(req: &Request<Incoming>, body: Bytes, head: bool) -> Response<BoxBody> {
    let len = body.len() as u64;
    let if_range_ok = req
        .headers()
        .get("if-range")
        .is_none_or(|v| v.as_bytes() == ETAG.as_bytes());
    let range = req
        .headers()
        .get("range")
        .and_then(|v| v.to_str().ok())
        .filter(|_| if_range_ok)
        .and_then(|r| parse_range(r, len));
    let builder = Response::builder()
        .header("accept-ranges", "bytes")
        .header("content-type", "video/mp4")
        .header("etag", ETAG);
    let (builder, slice) = match range {
        Some((a, b)) => (
            builder
                .status(StatusCode::PARTIAL_CONTENT)
                .header("content-range", format!("bytes {a}-{b}/{len}")),
            body.slice(a as usize..=b as usize),
        ),
        None => (builder.status(StatusCode::OK), body),
    };
    let builder = builder.header("content-length", slice.len().to_string());
    builder
        .body(if head { full("") } else { full(slice) })
        .unwrap()
}

fn parse_range(r: &str, len: u64) -> Option<(u64, u64)> {
    let spec = r.strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        return Some((len.saturating_sub(n), len - 1));
    }
    let a: u64 = a.parse().ok()?;
    let b: u64 = if b.is_empty() {
        len - 1
    } else {
        b.parse::<u64>().ok()?.min(len - 1)
    };
    (a <= b).then_some((a, b))
}

/// A tiny client: one request, whole body collected (or the error that cut it).
pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Result<Bytes, String>,
}

pub async fn request(method: &str, url: &str, headers: &[(&str, &str)]) -> Reply {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client
        .request(b.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string());
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn get(url: &str) -> Reply {
    request("GET", url, &[]).await
}

/// Percent-encodes a URL for the `d` parameter.
pub fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The answer of `request`, how long it took and the longest a 2 ms timer on this test's one
/// runtime thread (which also runs sluice) waited meanwhile: about the time a build held it.
pub async fn stall_while<T>(
    request: impl std::future::Future<Output = T>,
) -> (T, Duration, Duration) {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ticking = done.clone();
    let ticker = tokio::spawn(async move {
        let mut worst = Duration::ZERO;
        let mut last = std::time::Instant::now();
        while !ticking.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(2)).await;
            worst = worst.max(last.elapsed());
            last = std::time::Instant::now();
        }
        worst
    });
    let started = std::time::Instant::now();
    let answer = request.await;
    let took = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    (answer, took, ticker.await.unwrap())
}

/// An origin on a raw socket: reads one request head, writes `response` as it is and closes
/// (for answers hyper's server would not write: conflicting framing, odd fields).
pub async fn raw_origin(response: &'static [u8]) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = c.write_all(response).await;
                let _ = c.shutdown().await;
            });
        }
    });
    addr
}
