//! Reverse proxy test support: sluice in-process with a handle on its app (for reloads), origins
//! built from a closure on 127.0.0.1:0 (HTTP/1.1 and h2c, upgrades allowed), an echo origin that
//! reports what it received, a raw HTTP/1.1 origin that answers with given bytes and records the
//! heads it is sent, and a raw TCP client for malformed requests.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice::app::App;
use sluice::config::Config;
use sluice::server::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

pub fn full(b: impl Into<Bytes>) -> BoxBody {
    Full::new(b.into()).map_err(|n| match n {}).boxed()
}

/// A running sluice.
pub struct Proxy {
    pub addr: SocketAddr,
    pub app: Arc<App>,
    stop: Option<oneshot::Sender<()>>,
}

impl Proxy {
    pub async fn start(config: Config) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = App::new(&config).unwrap();
        let server = Server::from_listeners(vec![listener], &config.server, app.clone()).unwrap();
        let (tx, rx) = oneshot::channel();
        tokio::spawn(server.run(async {
            let _ = rx.await;
        }));
        Proxy {
            addr,
            app,
            stop: Some(tx),
        }
    }

    pub fn url(&self, p: &str) -> String {
        format!("http://{}{}", self.addr, p)
    }
}

/// A config with one reverse route to the origin `o` (upstream `app`) and `server` as its
/// `[server]` lines.
pub fn route_config(o: SocketAddr, server: &str) -> Config {
    config(&format!(
        r#"
[server]
{server}
[[upstreams]]
name = "app"
servers = ["{o}"]
[[routes]]
upstream = "app"
"#
    ))
}

/// sluice serving `config` until the sender is used (or dropped): its address, the sender, and
/// its run, which ends once the drain that follows has ended.
pub async fn serve_until_stopped(
    config: &Config,
) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = App::new(config).unwrap();
    let server = Server::from_listeners(vec![listener], &config.server, app).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));
    (addr, stop, run)
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Parses a TOML config for tests (loopback listener, validated).
pub fn config(text: &str) -> Config {
    let mut c = Config::parse_file(text).unwrap();
    c.server.listen = vec!["127.0.0.1:0".parse().unwrap()];
    c.validate().unwrap();
    c
}

/// Serves `handler` on 127.0.0.1:0 (HTTP/1.1 and h2c, with upgrades).
pub async fn origin<F, Fut>(handler: F) -> SocketAddr
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<BoxBody>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let h = handler.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let h = h.clone();
                    async move { Ok::<_, Infallible>(h(req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// An origin that answers with a JSON report of the request: method, path, headers (in order,
/// lowercase), body length and sha256, and its own name. `GET /size/N` answers N pattern bytes.
pub async fn echo(name: &'static str) -> SocketAddr {
    origin(move |req: Request<Incoming>| async move {
        let path = req.uri().path().to_string();
        if let Some(n) = path.strip_prefix("/size/") {
            let n: usize = n.parse().unwrap();
            let mut resp = Response::new(full(pattern(n)));
            resp.headers_mut()
                .insert("x-origin", http::HeaderValue::from_static(name));
            return resp;
        }
        let (parts, body) = req.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let headers: Vec<(String, String)> = parts
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_string()))
            .collect();
        let report = serde_json::json!({
            "origin": name,
            "method": parts.method.as_str(),
            "path": parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or(""),
            "headers": headers,
            "len": bytes.len(),
            "sha256": sha256(&bytes),
        });
        let mut resp = Response::new(full(report.to_string()));
        let h = resp.headers_mut();
        h.insert(
            "content-type",
            http::HeaderValue::from_static("application/json"),
        );
        h.insert("x-origin", http::HeaderValue::from_static(name));
        h.insert("x-internal", http::HeaderValue::from_static("secret"));
        h.insert("connection", http::HeaderValue::from_static("x-hop"));
        h.insert("x-hop", http::HeaderValue::from_static("1"));
        resp
    })
    .await
}

/// A reply, whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Result<Bytes, String>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(self.body.as_ref().unwrap()).unwrap()
    }

    /// The value of a header the origin saw (from an echo report), if it saw exactly one.
    pub fn seen(&self, name: &str) -> Option<String> {
        let j = self.json();
        let all: Vec<String> = j["headers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p[0] == name)
            .map(|p| p[1].as_str().unwrap().to_string())
            .collect();
        assert!(all.len() <= 1, "{name} seen {} times", all.len());
        all.into_iter().next()
    }
}

/// One request with an optional body through a fresh HTTP/1.1 client.
pub async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: BoxBody) -> Reply {
    let client =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http::<BoxBody>();
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(20),
        client.request(b.body(body).unwrap()),
    )
    .await
    .expect("request timed out")
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

/// An h2c (prior knowledge) client connection to `addr`, its connection task spawned.
pub async fn h2_client(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<BoxBody> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

pub async fn get(url: &str, headers: &[(&str, &str)]) -> Reply {
    send("GET", url, headers, full(Bytes::new())).await
}

/// Writes `bytes` on a new connection and reads until the server closes it or `wait` passes.
pub async fn raw(addr: SocketAddr, bytes: &[u8], wait: Duration) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Deterministic pseudo-random bytes.
pub fn pattern(len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len + 8);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
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

/// A body streamed in `chunk`-sized frames (chunked on the wire).
pub fn streamed(data: Bytes, chunk: usize) -> BoxBody {
    let frames: Vec<Result<hyper::body::Frame<Bytes>, std::io::Error>> = (0..data.len())
        .step_by(chunk)
        .map(|i| {
            Ok(hyper::body::Frame::data(
                data.slice(i..(i + chunk).min(data.len())),
            ))
        })
        .collect();
    http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed()
}

/// A free loopback port nothing listens on.
pub async fn dead_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// What a raw origin answers to one request target.
pub type Answer = Arc<dyn Fn(&str) -> Vec<u8> + Send + Sync>;

/// A raw HTTP/1.1 origin: records every request head byte for byte, counts its connections, and
/// answers with the bytes `answer` gives for the target; closes after an answer that holds
/// `close-now` in its first 4 KiB.
pub async fn raw_origin(
    answer: Answer,
) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>, Arc<AtomicUsize>) {
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let seen = heads.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let seen = seen.clone();
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let end = loop {
                        if let Some(i) = find(&buf, b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head: Vec<u8> = buf.drain(..end).collect();
                    let target = String::from_utf8_lossy(&head)
                        .split(' ')
                        .nth(1)
                        .unwrap_or("")
                        .to_string();
                    seen.lock().unwrap().push(head);
                    let out = answer(&target);
                    let closes = find(&out[..out.len().min(4096)], b"close-now").is_some();
                    if s.write_all(&out).await.is_err() || closes {
                        return;
                    }
                }
            });
        }
    });
    (addr, heads, accepted)
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A chunked HTTP/1.1 answer (dated, announcing an `x-sum` trailer) of `body` in pieces of
/// `piece` bytes, each with a chunk extension, ending with the `trailer` lines.
pub fn chunked(body: &[u8], piece: usize, trailer: &str) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\n\r\n".to_vec();
    for p in body.chunks(piece) {
        out.extend_from_slice(format!("{:x};ext=1\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("0\r\n{trailer}\r\n").as_bytes());
    out
}
