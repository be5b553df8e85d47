//! Idle mode: memory per idle keep-alive connection. Opens N connections to a server (spread over
//! several 127.0.0.x source addresses, since one source address has fewer than 30,000 ports), each
//! sends one GET and reads its whole answer, then stays open and silent. The server's process
//! tree USS is read before and after each level, once it has settled; the growth divided by the
//! connections still open is the memory one idle connection costs.
//!
//! HTTP/1.1 and HTTP/2 by prior knowledge (h2c) are spoken by hand on the raw socket: the client
//! side of an idle connection is then a socket and a task with a 64-byte buffer, so 50,000 of
//! them fit beside the servers on a small machine. Each connection's task keeps reading: a close
//! by the server is counted, and HTTP/2 `SETTINGS` and `PING` frames are acknowledged so a live
//! server never takes the client for dead.

use crate::procstat;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

#[derive(Debug, Clone)]
pub struct Config {
    pub addr: SocketAddr,
    pub host: String,
    pub path: String,
    pub expect_len: u64,
    /// Cumulative connection counts to measure at, ascending.
    pub levels: Vec<usize>,
    pub h2: bool,
    /// Source addresses 127.0.0.2 … 127.0.0.(1 + sources).
    pub sources: u8,
    /// Connections being opened at once.
    pub parallel: usize,
    pub settle: Duration,
    pub pid: u32,
    pub max_secs: Duration,
}

#[derive(Debug, Serialize)]
pub struct Level {
    pub connections: usize,
    /// Connections open (not closed by the server) when the memory was read.
    pub open: u64,
    pub failed: u64,
    pub uss_kb: u64,
    pub growth_kb: u64,
    /// USS growth over the baseline per open connection, in KiB.
    pub kb_per_conn: f64,
    pub open_secs: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub protocol: &'static str,
    pub url_path: String,
    pub baseline_uss_kb: u64,
    pub levels: Vec<Level>,
    /// This process's open-file limit.
    pub nofile: u64,
    /// Client processes the connections were spread over (this one and its helpers).
    pub procs: usize,
    pub stopped_early: Option<String>,
}

/// Raises this process's open-file limit (soft and hard) to `want` when allowed.
pub fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        if lim.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want,
                rlim_max: want.max(lim.rlim_max),
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                lim.rlim_cur = lim.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
}

/// The server's tree USS once it stops moving (two reads 300 ms apart within 64 KiB), bounded.
async fn settled_uss(pid: u32, settle: Duration) -> u64 {
    tokio::time::sleep(settle).await;
    let mut last = procstat::tree_uss_kb(pid);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = procstat::tree_uss_kb(pid);
        if now.abs_diff(last) < 64 {
            return now;
        }
        last = now;
    }
    last
}

fn h1_request(cfg: &Config) -> Vec<u8> {
    format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: sluice-loadgen\r\n\r\n",
        cfg.path, cfg.host
    )
    .into_bytes()
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The client preface, an empty SETTINGS, and one GET on stream 1 (HPACK literals, no Huffman).
fn h2_request(cfg: &Config) -> Vec<u8> {
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    for (index, value) in [(0x44u8, &cfg.path), (0x41u8, &cfg.host)] {
        // Literal with incremental indexing, indexed name (:path, :authority).
        block.push(index);
        block.push(u8::try_from(value.len()).unwrap_or(127).min(127));
        block.extend_from_slice(value.as_bytes());
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4 | 0x1, 1, &block)); // END_HEADERS | END_STREAM
    out
}

/// Reads one HTTP/1.1 answer with a Content-Length body.
async fn h1_exchange(stream: &mut TcpStream, req: &[u8], expect_len: u64) -> Result<()> {
    stream.write_all(req).await?;
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            bail!("closed before the answer");
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            if !head.starts_with("http/1.1 200") {
                bail!("status");
            }
            let len: u64 = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .context("no content-length")?;
            if len != expect_len {
                bail!("length");
            }
            let want = end + 4 + len as usize;
            while buf.len() < want {
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    bail!("closed inside the body");
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(());
        }
        if buf.len() > 64 * 1024 {
            bail!("head too long");
        }
    }
}

/// Reads HTTP/2 frames until stream 1 ends; acknowledges SETTINGS and PING on the way.
async fn h2_exchange(stream: &mut TcpStream, req: &[u8], expect_len: u64) -> Result<()> {
    stream.write_all(req).await?;
    let mut body = 0u64;
    loop {
        let mut head = [0u8; 9];
        stream.read_exact(&mut head).await?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).await?;
        match kind {
            0x4 if flags & 0x1 == 0 => stream.write_all(&frame(0x4, 0x1, 0, &[])).await?,
            0x6 if flags & 0x1 == 0 => stream.write_all(&frame(0x6, 0x1, 0, &payload)).await?,
            0x7 => bail!("GOAWAY"),
            0x3 if id == 1 => bail!("RST_STREAM"),
            0x0 if id == 1 => body += len as u64,
            _ => {}
        }
        if id == 1 && (kind == 0x0 || kind == 0x1) && flags & 0x1 != 0 {
            if body != expect_len {
                bail!("length");
            }
            return Ok(());
        }
    }
}

/// Keeps a connection open and silent; answers HTTP/2 SETTINGS/PING; counts the close.
async fn hold(mut stream: TcpStream, h2: bool, open: Arc<AtomicU64>) {
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) if h2 && n >= 9 && buf[3] == 0x6 && buf[4] & 0x1 == 0 && n >= 17 => {
                let _ = stream.write_all(&frame(0x6, 0x1, 0, &buf[9..17])).await;
            }
            Ok(n) if h2 && n >= 9 && buf[3] == 0x4 && buf[4] & 0x1 == 0 => {
                let _ = stream.write_all(&frame(0x4, 0x1, 0, &[])).await;
            }
            Ok(_) => {}
        }
    }
    open.fetch_sub(1, Ordering::Relaxed);
}

async fn open_one(cfg: Arc<Config>, n: usize, req: Arc<Vec<u8>>) -> Result<TcpStream> {
    let source = Ipv4Addr::new(127, 0, 0, 2 + (n % usize::from(cfg.sources.max(1))) as u8);
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(source), 0))?;
    let mut stream = tokio::time::timeout(Duration::from_secs(10), socket.connect(cfg.addr))
        .await
        .context("connect timeout")??;
    stream.set_nodelay(true)?;
    let exchange = async {
        if cfg.h2 {
            h2_exchange(&mut stream, &req, cfg.expect_len).await
        } else {
            h1_exchange(&mut stream, &req, cfg.expect_len).await
        }
    };
    tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .context("request timeout")??;
    Ok(stream)
}

/// Connections this process holds open: opened in parallel batches, each then held by its own
/// task (`hold`), which counts it out when the server closes it.
pub struct Holder {
    cfg: Arc<Config>,
    req: Arc<Vec<u8>>,
    /// Connections attempted so far (open, closed since, or failed).
    opened: usize,
    open: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl Holder {
    pub fn new(cfg: Arc<Config>) -> Self {
        let req = Arc::new(if cfg.h2 {
            h2_request(&cfg)
        } else {
            h1_request(&cfg)
        });
        Holder {
            cfg,
            req,
            opened: 0,
            open: Arc::new(AtomicU64::new(0)),
            failed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// One exchange on a connection that is closed again (a warm server and a pooled upstream).
    pub async fn warm(&self) -> Result<()> {
        drop(open_one(self.cfg.clone(), 0, self.req.clone()).await?);
        Ok(())
    }

    pub fn attempted(&self) -> usize {
        self.opened
    }

    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Opens connections until `target` were attempted; false when `deadline` came first.
    pub async fn open_to(&mut self, target: usize, deadline: Instant) -> bool {
        while self.opened < target {
            if Instant::now() > deadline {
                return false;
            }
            let batch = (target - self.opened).min(self.cfg.parallel.max(1));
            let mut tasks = Vec::with_capacity(batch);
            for n in self.opened..self.opened + batch {
                tasks.push(tokio::spawn(open_one(
                    self.cfg.clone(),
                    n,
                    self.req.clone(),
                )));
            }
            self.opened += batch;
            for t in tasks {
                match t.await {
                    Ok(Ok(stream)) => {
                        self.open.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(hold(stream, self.cfg.h2, self.open.clone()));
                    }
                    _ => {
                        self.failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        true
    }
}

/// This process's part of `level` connections when `procs` processes share them (process
/// `index`; the first process is 0).
pub fn share(level: usize, index: usize, procs: usize) -> usize {
    let procs = procs.max(1);
    level * (index + 1) / procs - level * index / procs
}

/// Measures memory per idle connection at each level; the connections are spread over this
/// process and `workers` (helper processes, `idle_workers`), so that no process needs more
/// descriptors than its open-file limit allows.
pub async fn run(cfg: Config, mut workers: crate::idle_workers::Workers) -> Result<Report> {
    if !cfg.addr.ip().is_loopback() {
        bail!("refusing non-loopback target");
    }
    let procs = workers.len() + 1;
    let biggest = cfg.levels.iter().copied().max().unwrap_or(0);
    let mine = share(biggest, 0, procs) as u64;
    let nofile = raise_nofile(mine + 1024);
    if nofile < mine + 64 {
        bail!("open-file limit {nofile} is too low for {mine} connections");
    }
    let cfg = Arc::new(cfg);
    let mut holder = Holder::new(cfg.clone());
    holder.warm().await?;
    let baseline = settled_uss(cfg.pid, cfg.settle).await;
    let deadline = Instant::now() + cfg.max_secs;
    let mut levels = Vec::new();
    let mut stopped_early = None;
    for &level in &cfg.levels {
        let t0 = Instant::now();
        workers.open_to(level)?;
        let on_time = holder.open_to(share(level, 0, procs), deadline).await;
        let theirs = workers.replies().await?;
        if !on_time || theirs.stopped {
            let attempted = holder.opened + theirs.attempted;
            stopped_early = Some(format!("time budget reached at {attempted} connections"));
            break;
        }
        let open_secs = t0.elapsed().as_secs_f64();
        let uss = settled_uss(cfg.pid, cfg.settle).await;
        // The connections still open once the memory settled (the server may have closed some).
        let theirs = workers.counts().await?;
        let now_open = holder.open() + theirs.open;
        let growth = uss.saturating_sub(baseline);
        levels.push(Level {
            connections: level,
            open: now_open,
            failed: holder.failed() + theirs.failed,
            uss_kb: uss,
            growth_kb: growth,
            kb_per_conn: if now_open > 0 {
                growth as f64 / now_open as f64
            } else {
                0.0
            },
            open_secs,
        });
    }
    drop(workers);
    Ok(Report {
        mode: "idle",
        protocol: if cfg.h2 { "h2c" } else { "http/1.1" },
        url_path: cfg.path.clone(),
        baseline_uss_kb: baseline,
        levels,
        nofile,
        procs,
        stopped_early,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_the_level() {
        for (level, procs) in [(19_000, 2), (5_000, 3), (7, 4), (0, 2), (10, 1)] {
            let parts: Vec<usize> = (0..procs).map(|i| share(level, i, procs)).collect();
            assert_eq!(parts.iter().sum::<usize>(), level);
            assert!(parts.iter().max().unwrap() - parts.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn h2_request_is_a_preface_settings_and_one_headers_frame() {
        let cfg = Config {
            addr: "127.0.0.1:1".parse().unwrap(),
            host: "a".into(),
            path: "/x".into(),
            expect_len: 0,
            levels: vec![],
            h2: true,
            sources: 1,
            parallel: 1,
            settle: Duration::ZERO,
            pid: 0,
            max_secs: Duration::ZERO,
        };
        let r = h2_request(&cfg);
        assert!(r.starts_with(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
        let settings = &r[24..33];
        assert_eq!(settings, &[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let headers = &r[33..];
        assert_eq!(&headers[3..9], &[1, 5, 0, 0, 0, 1]);
        assert_eq!(
            &headers[9..],
            &[0x82, 0x86, 0x44, 2, b'/', b'x', 0x41, 1, b'a']
        );
        assert_eq!(headers[2] as usize, headers.len() - 9);
    }
}
