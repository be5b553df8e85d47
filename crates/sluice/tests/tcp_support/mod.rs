//! TCP test support: the TCP front end started in-process from TOML, and small upstream servers
//! with one behaviour each (echo, name announcer, recorder, health endpoint).
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use sluice::config::Config;
use sluice::tcp::{TcpMetrics, TcpProxy};
use sluice::upstream::group::Groups;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running TCP front end.
pub struct Proxy {
    pub tcp: TcpProxy,
    pub groups: Arc<Groups>,
    pub registry: Registry,
}

impl Proxy {
    /// Starts every `[[tcp]]` listener of `toml` (which also holds its `[[upstreams]]`).
    pub fn start(toml: &str) -> Proxy {
        let config = Config::parse_file(toml).unwrap();
        config.validate().unwrap();
        let mut registry = Registry::with_prefix("sluice");
        let metrics = TcpMetrics::register(&mut registry);
        let group_metrics = sluice::upstream::group::metrics::GroupMetrics::register(&mut registry);
        let groups = Arc::new(Groups::new(&config.upstreams).unwrap());
        group_metrics.track(&groups);
        let tcp = TcpProxy::new(metrics);
        tcp.apply(&config.tcp, Arc::clone(&groups)).unwrap();
        Proxy {
            tcp,
            groups,
            registry,
        }
    }

    /// The address of the only (or first) listener.
    pub fn addr(&self) -> SocketAddr {
        self.tcp.local_addrs()[0].1
    }

    pub fn metrics(&self) -> String {
        sluice::metrics::render(&self.registry)
    }

    /// Waits until no connection is open in the proxy.
    pub async fn idle(&self) {
        for _ in 0..200 {
            if self.tcp.connections() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("proxy still has {} connections", self.tcp.connections());
    }
}

/// An upstream server on 127.0.0.1:0 running `handler` per connection, counting connections.
pub struct Upstream {
    pub addr: SocketAddr,
    pub accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub async fn spawn<F, Fut>(handler: F) -> Upstream
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(handler(stream));
            }
        });
        Upstream {
            addr,
            accepted,
            task,
        }
    }

    /// Echoes everything back; passes the client's FIN on after the echo.
    pub async fn echo() -> Upstream {
        Upstream::spawn(|mut s| async move {
            let (mut r, mut w) = s.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        })
        .await
    }

    /// Writes `name\n` at once, then answers health-check GETs with 200 or 503 per `up`.
    pub async fn named(name: &'static str, up: Arc<AtomicBool>) -> Upstream {
        Upstream::spawn(move |mut s| {
            let up = Arc::clone(&up);
            async move {
                let mut first = [0u8; 4];
                // Health checks speak first; relayed clients wait for the name.
                match tokio::time::timeout(Duration::from_millis(50), s.peek(&mut first)).await {
                    Ok(Ok(4)) if &first == b"GET " => {
                        let mut buf = vec![0u8; 1024];
                        let _ = s.read(&mut buf).await;
                        let status = if up.load(Ordering::SeqCst) {
                            "200 OK"
                        } else {
                            "503 Service Unavailable"
                        };
                        let _ = s
                            .write_all(
                                format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n")
                                    .as_bytes(),
                            )
                            .await;
                    }
                    _ => {
                        let _ = s.write_all(format!("{name}\n").as_bytes()).await;
                        let mut sink = Vec::new();
                        let _ = s.read_to_end(&mut sink).await;
                    }
                }
            }
        })
        .await
    }

    /// Reads until EOF, then answers `name <bytes received as hex>`... via `report`.
    pub async fn recorder(
        name: &'static str,
    ) -> (Upstream, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let up = Upstream::spawn(move |mut s| {
            let tx = tx.clone();
            async move {
                let mut got = Vec::new();
                let _ = s.read_to_end(&mut got).await;
                let _ = s.write_all(name.as_bytes()).await;
                let _ = tx.send(got);
            }
        })
        .await;
        (up, rx)
    }
}

/// A loopback port nothing listens on.
pub async fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

/// A listener whose accept queue is full, so a new connect hangs (its SYN is dropped): a
/// black-holed server on loopback. Keep the returned value alive for the duration.
pub async fn black_hole() -> (SocketAddr, socket2::Socket, Vec<TcpStream>) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.listen(0).unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
        {
            fillers.push(s);
        }
    }
    (addr, socket, fillers)
}

/// Open file descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Reads to EOF with a deadline.
pub async fn read_all(s: &mut TcpStream, secs: u64) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(secs), s.read_to_end(&mut out))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out"))??;
    Ok(out)
}

/// The TLS ClientHello rustls sends for `server_name` (no certificates needed: the handshake never
/// goes further).
pub fn client_hello(server_name: &str) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

/// A config with one group `g` of `servers` (plus `extra` group keys) and one TCP listener on it.
pub fn one_group(servers: &str, extra: &str) -> String {
    format!(
        "[[upstreams]]\nname = \"g\"\nservers = [{servers}]\n{extra}\n\n[[tcp]]\nlisten = \"127.0.0.1:0\"\nupstream = \"g\"\n"
    )
}

/// `addrs` as a TOML list body of quoted strings.
pub fn quoted(addrs: &[std::net::SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sends `body` and reads the echo concurrently; returns the echo.
pub async fn echo_through(addr: std::net::SocketAddr, body: &[u8]) -> Vec<u8> {
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

/// Connects to `addr` from `local` (any address of 127/8: Linux routes all of it on lo), so a
/// test can be a second client address.
pub async fn connect_from(local: &str, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// `hello` (one TLS record, as rustls sends it) re-cut into `n` records: `n - 1` of one byte,
/// then the rest.
pub fn in_records(hello: &[u8], n: usize) -> Vec<u8> {
    let msg = &hello[5..];
    let mut out = Vec::new();
    for chunk in msg[..n - 1].chunks(1).chain([&msg[n - 1..]]) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}
