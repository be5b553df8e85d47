//! Test fixtures for the IPTV gateway: an in-process server, a loopback multicast sender,
//! TS/RTP generators, and `/proc/net/igmp` inspection.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use sluice::iptv::{Iptv, IptvConfig};
use sluice::upstream::Upstream;
use socket2::{SockAddr, Socket};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// Test defaults: short timers, no configured interface (every URL says `?iface=lo`).
pub fn config() -> IptvConfig {
    IptvConfig {
        linger_ms: 200,
        no_data_timeout_ms: 3000,
        flush_interval_ms: 5,
        recv_buffer_bytes: 16 * 1024 * 1024,
        // Every URL names `lo`; the mock FCC servers are on loopback.
        interfaces: vec!["lo".into()],
        // The mock FCC servers are on loopback.
        fcc: sluice::iptv::fcc::FccConfig {
            servers: vec!["127.0.0.0/8".parse().unwrap()],
            ..Default::default()
        },
        ..IptvConfig::default()
    }
}

pub struct Gateway {
    pub addr: SocketAddr,
    pub iptv: Arc<Iptv>,
    registry: Registry,
}

impl Gateway {
    pub async fn start(config: IptvConfig) -> Gateway {
        let mut registry = Registry::default();
        // The guide and playlist come from origins on loopback, which the address guard
        // refuses unless told otherwise.
        let upstream_config = sluice::config::UpstreamConfig {
            allow_private: true,
            ..Default::default()
        };
        let upstream = Upstream::new(&upstream_config, &mut registry).unwrap();
        let iptv = Iptv::new(config, upstream, &mut registry).expect("valid config");
        Gateway::serve_with(iptv, registry).await
    }

    /// Serves a front end built by the test (its own upstream settings).
    pub async fn serve(iptv: Arc<Iptv>) -> Gateway {
        Gateway::serve_with(iptv, Registry::default()).await
    }

    async fn serve_with(iptv: Arc<Iptv>, registry: Registry) -> Gateway {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(accept(listener, iptv.clone()));
        Gateway {
            addr,
            iptv,
            registry,
        }
    }

    pub async fn get(&self, path: &str) -> Response<Incoming> {
        get(self.addr, path).await
    }

    pub fn spawn_get(&self, path: &str) -> tokio::task::JoinHandle<Response<Incoming>> {
        let (addr, path) = (self.addr, path.to_string());
        tokio::spawn(async move { get(addr, &path).await })
    }

    /// Sends a request and never reads the answer: a viewer whose player froze.
    pub async fn stalled_get(&self, path: &str) -> TcpStream {
        let mut tcp = TcpStream::connect(self.addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: gw.test\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.unwrap();
        tcp
    }

    pub async fn status(&self) -> serde_json::Value {
        let body = read_bytes(self.get("/status.json").await, usize::MAX).await;
        serde_json::from_slice(&body).unwrap()
    }

    pub fn metrics(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }
}

async fn accept(listener: TcpListener, iptv: Arc<Iptv>) {
    loop {
        let Ok((tcp, peer)) = listener.accept().await else {
            return;
        };
        let iptv = iptv.clone();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let iptv = iptv.clone();
            async move {
                let (mut parts, _) = req.into_parts();
                parts.extensions.insert(peer);
                Ok::<_, Infallible>(iptv.handle(parts).await)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

pub async fn get(addr: SocketAddr, path: &str) -> Response<Incoming> {
    get_as(addr, path, "gw.test").await
}

/// [`get`] with another `Host` (a whole sluice without a password answers only loopback names).
pub async fn get_as(addr: SocketAddr, path: &str, host: &str) -> Response<Incoming> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", host)
        .body(Empty::<Bytes>::new())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("response within 10 s")
        .unwrap()
}

/// Reads until `limit` bytes, the end of the body, or 20 s.
pub async fn read_bytes(resp: Response<Incoming>, limit: usize) -> Vec<u8> {
    let mut body = resp.into_body();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while out.len() < limit {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
            }
            Ok(Some(Err(_))) | Ok(None) | Err(_) => break,
        }
    }
    out
}

pub async fn read_text(resp: Response<Incoming>) -> String {
    String::from_utf8(read_bytes(resp, usize::MAX).await).unwrap()
}

/// A multicast sender pinned to `lo`.
pub struct Sender {
    sock: Socket,
    dest: SockAddr,
}

impl Sender {
    pub fn new(group: &str, port: u16) -> Sender {
        let sock = sluice::net::multicast::sender("lo", false).unwrap();
        let dest = SocketAddrV4::new(group.parse().unwrap(), port);
        Sender {
            sock,
            dest: dest.into(),
        }
    }

    /// A sender whose datagrams carry another loopback source address (for SSM filtering).
    pub fn from_source(group: &str, port: u16, source: &str) -> Sender {
        let s = Sender::new(group, port);
        let src: Ipv4Addr = source.parse().unwrap();
        s.sock.bind(&SocketAddrV4::new(src, 0).into()).unwrap();
        s
    }

    pub fn send_one(&self, datagram: &[u8]) {
        self.sock.send_to(datagram, &self.dest).unwrap();
    }

    pub fn send_raw(&self, datagrams: &[Vec<u8>]) {
        for (i, d) in datagrams.iter().enumerate() {
            self.send_one(d);
            pace(i, 16);
        }
    }

    /// Sends payloads as RTP with consecutive sequence numbers from `first_seq`.
    pub fn send_rtp(&self, payloads: &[Vec<u8>], first_seq: u16) {
        send_rtp(&self.sock, &self.dest, payloads, first_seq, 16);
    }

    /// Same, from a thread, at `per_ms` datagrams per millisecond.
    pub fn spawn_rtp(&self, payloads: Vec<Vec<u8>>, first_seq: u16) -> std::thread::JoinHandle<()> {
        self.spawn_rtp_paced(payloads, first_seq, 16)
    }

    pub fn spawn_rtp_paced(
        &self,
        payloads: Vec<Vec<u8>>,
        first_seq: u16,
        per_ms: usize,
    ) -> std::thread::JoinHandle<()> {
        let sock = self.sock.try_clone().unwrap();
        let dest = self.dest.clone();
        std::thread::spawn(move || send_rtp(&sock, &dest, &payloads, first_seq, per_ms))
    }
}

fn send_rtp(sock: &Socket, dest: &SockAddr, payloads: &[Vec<u8>], first_seq: u16, per_ms: usize) {
    for (i, p) in payloads.iter().enumerate() {
        let seq = first_seq.wrapping_add(i as u16);
        sock.send_to(&rtp(seq, p), dest).unwrap();
        pace(i, per_ms);
    }
}

/// Sleeps a millisecond every `per_ms` datagrams, so bursts stay well inside socket buffers.
fn pace(i: usize, per_ms: usize) {
    if (i + 1).is_multiple_of(per_ms) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// An RTP v2 packet (payload type 33, MP2T) around `payload`.
pub fn rtp(seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x80, 33];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&(u32::from(seq) * 3000).to_be_bytes());
    p.extend_from_slice(&0x5eed_0001u32.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// `n` datagram payloads of 7 TS packets each on `pid`, continuity counters running, payload
/// bytes varying; `keyframe = Some((datagram, packet))` marks one random-access point.
pub fn ts_datagrams(n: usize, pid: u16, keyframe: Option<(usize, usize)>) -> Vec<Vec<u8>> {
    let mut cc = 0u8;
    (0..n)
        .map(|d| {
            let mut out = Vec::with_capacity(7 * 188);
            for k in 0..7 {
                let mut p = [0u8; 188];
                p[0] = 0x47;
                p[1] = (pid >> 8) as u8 & 0x1f;
                p[2] = pid as u8;
                p[3] = 0x10 | cc;
                cc = (cc + 1) & 0x0f;
                for (j, b) in p[4..].iter_mut().enumerate() {
                    *b = (d * 7 + k + j * 31) as u8;
                }
                if keyframe == Some((d, k)) {
                    p[1] |= 0x40;
                    p[3] = 0x30 | (p[3] & 0x0f);
                    p[4] = 7;
                    p[5] = 0x40;
                }
                out.extend_from_slice(&p);
            }
            out
        })
        .collect()
}

/// `Users` of each membership of `group` on `lo` in `/proc/net/igmp` (one entry per hub).
pub fn igmp_memberships(group: &str) -> Vec<u32> {
    let ip: Ipv4Addr = group.parse().unwrap();
    // The kernel prints the address as a host-order (little-endian) hex word.
    let hex = format!("{:08X}", u32::from_le_bytes(ip.octets()));
    let text = std::fs::read_to_string("/proc/net/igmp").unwrap();
    let mut device = String::new();
    let mut users = Vec::new();
    for line in text.lines().skip(1) {
        if !line.starts_with('\t') {
            device = line.split_whitespace().nth(1).unwrap_or("").to_string();
            continue;
        }
        let mut cols = line.split_whitespace();
        if device == "lo" && cols.next() == Some(hex.as_str()) {
            users.push(cols.next().and_then(|u| u.parse().ok()).unwrap_or(0));
        }
    }
    users
}

/// Waits (at most 5 s) until `group` is, or is no longer, joined on `lo`.
pub async fn wait_joined(group: &str, joined: bool) {
    for _ in 0..500 {
        if igmp_memberships(group).is_empty() != joined {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{group} joined on lo should be {joined}");
}

pub async fn head(addr: SocketAddr, path: &str) -> Response<Incoming> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::head(path)
        .header("host", "gw.test")
        .body(Empty::<Bytes>::new())
        .unwrap();
    send.send_request(req).await.unwrap()
}

/// An origin that answers every request with `text` (a playlist host).
pub async fn serve_text(text: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                    Bytes::from_static(text.as_bytes()),
                )))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), svc),
            );
        }
    });
    addr
}

/// IPv6 groups joined on `lo`, as the hex strings `/proc/net/igmp6` prints.
pub fn igmp6_on_lo() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/net/igmp6").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.get(1) == Some(&"lo")).then(|| cols.get(2).map(|s| s.to_string()))?
        })
        .collect()
}
