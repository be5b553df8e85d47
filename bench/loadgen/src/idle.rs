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
    pub nofile: u64,
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

pub async fn run(cfg: Config) -> Result<Report> {
    if !cfg.addr.ip().is_loopback() {
        bail!("refusing non-loopback target");
    }
    let biggest = cfg.levels.iter().copied().max().unwrap_or(0) as u64;
    let nofile = raise_nofile(biggest + 1024);
    if nofile < biggest + 64 {
        bail!("open-file limit {nofile} is too low for {biggest} connections");
    }
    let cfg = Arc::new(cfg);
    let req = Arc::new(if cfg.h2 {
        h2_request(&cfg)
    } else {
        h1_request(&cfg)
    });
    // One exchange first (a warm server and a pooled upstream), then the baseline.
    let warm = open_one(cfg.clone(), 0, req.clone()).await?;
    drop(warm);
    let baseline = settled_uss(cfg.pid, cfg.settle).await;
    let started = Instant::now();
    let open = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut levels = Vec::new();
    let mut opened = 0usize;
    let mut stopped_early = None;
    'levels: for &level in &cfg.levels {
        let t0 = Instant::now();
        while opened < level {
            if started.elapsed() > cfg.max_secs {
                stopped_early = Some(format!("time budget reached at {opened} connections"));
                break 'levels;
            }
            let batch = (level - opened).min(cfg.parallel.max(1));
            let mut tasks = Vec::with_capacity(batch);
            for n in opened..opened + batch {
                tasks.push(tokio::spawn(open_one(cfg.clone(), n, req.clone())));
            }
            opened += batch;
            for t in tasks {
                match t.await {
                    Ok(Ok(stream)) => {
                        open.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(hold(stream, cfg.h2, open.clone()));
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        let open_secs = t0.elapsed().as_secs_f64();
        let uss = settled_uss(cfg.pid, cfg.settle).await;
        let now_open = open.load(Ordering::Relaxed);
        let growth = uss.saturating_sub(baseline);
        levels.push(Level {
            connections: level,
            open: now_open,
            failed: failed.load(Ordering::Relaxed),
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
    Ok(Report {
        mode: "idle",
        protocol: if cfg.h2 { "h2c" } else { "http/1.1" },
        url_path: cfg.path.clone(),
        baseline_uss_kb: baseline,
        levels,
        nofile,
        stopped_early,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
