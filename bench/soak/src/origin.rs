//! The HTTP origin: generated objects, a synthetic HLS VOD and the ClearKey DASH fixture, served by a
//! small HTTP/1.1 server whose fault mode (reset mid-body, stall, garbage) switches at run time and
//! which can be killed and restarted on the same port.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::gen;

/// How every response misbehaves while a fault window is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Healthy = 0,
    /// Head and half the body, then a TCP reset.
    Reset = 1,
    /// Head and half the body, then nothing until the mode changes.
    Stall = 2,
    /// Bytes that are not HTTP, then close.
    Garbage = 3,
}

/// Segments in the synthetic HLS VOD and bytes per segment (whole TS packets).
pub const HLS_SEGMENTS: usize = 6;
pub const HLS_SEGMENT_BYTES: usize = 188 * 1200;

/// One origin server: shared content, a fault switch, and a listener that can be killed.
pub struct Origin {
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
    files: Arc<HashMap<String, Vec<u8>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Origin {
    /// Binds on loopback and serves. `files` maps request paths to fixed bodies (the DASH fixture).
    pub async fn start(
        files: Arc<HashMap<String, Vec<u8>>>,
        mode: Arc<AtomicU8>,
    ) -> Result<Arc<Self>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let origin = Arc::new(Origin {
            addr,
            mode,
            files,
            task: Mutex::new(None),
        });
        origin.spawn(listener);
        Ok(origin)
    }

    fn spawn(self: &Arc<Self>, listener: TcpListener) {
        let me = self.clone();
        let task = tokio::spawn(async move {
            // Connections live in the set, so aborting this task (kill) closes every one of them.
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    r = listener.accept() => if let Ok((s, _)) = r {
                        let me = me.clone();
                        conns.spawn(async move { let _ = me.serve(s).await; });
                    },
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        *self.task.lock().unwrap() = Some(task);
    }

    /// Stops listening and drops every open connection (the "server killed" fault).
    pub fn kill(&self) {
        if let Some(t) = self.task.lock().unwrap().take() {
            t.abort();
        }
    }

    /// Listens again on the same port.
    pub async fn restart(self: &Arc<Self>) -> Result<()> {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).context("rebinding a killed origin"),
            }
        };
        self.spawn(listener);
        Ok(())
    }

    fn mode(&self) -> Mode {
        match self.mode.load(Ordering::Relaxed) {
            1 => Mode::Reset,
            2 => Mode::Stall,
            3 => Mode::Garbage,
            _ => Mode::Healthy,
        }
    }

    async fn serve(&self, mut s: TcpStream) -> Result<()> {
        let mut buf = Vec::with_capacity(4096);
        loop {
            let head = match read_head(&mut s, &mut buf).await? {
                Some(h) => h,
                None => return Ok(()),
            };
            let Some(req) = Request::parse(&head) else {
                s.write_all(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await?;
                return Ok(());
            };
            if !self.respond(&mut s, &req).await? {
                return Ok(());
            }
        }
    }

    /// Writes one response; false when the connection must end.
    async fn respond(&self, s: &mut TcpStream, req: &Request) -> Result<bool> {
        let Some(body) = self.content(&req.path) else {
            s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                .await?;
            return Ok(true);
        };
        let mode = self.mode();
        if mode == Mode::Garbage {
            s.write_all(
                b"\x16\x03\x01 this is no HTTP answer \xff\xfe\r\n\r\nHTTP/9.9 abc\r\n\r\n",
            )
            .await?;
            return Ok(false);
        }
        let total = body.len();
        let (status, start, end) = match req.range.map(|r| r.resolve(total)) {
            None => ("200 OK", 0, total),
            Some(Some((a, b))) => ("206 Partial Content", a, b),
            Some(None) => {
                let h = format!("HTTP/1.1 416 Range Not Satisfiable\r\ncontent-range: bytes */{total}\r\ncontent-length: 0\r\n\r\n");
                s.write_all(h.as_bytes()).await?;
                return Ok(true);
            }
        };
        let mut head = format!(
            "HTTP/1.1 {status}\r\ncontent-length: {}\r\naccept-ranges: bytes\r\ncache-control: public, max-age=600\r\n\
             etag: \"{:x}\"\r\nlast-modified: Mon, 02 Nov 2026 10:00:00 GMT\r\ncontent-type: {}\r\n",
            end - start,
            gen::seed(&req.path),
            content_type(&req.path)
        );
        if status.starts_with("206") {
            head.push_str(&format!(
                "content-range: bytes {start}-{}/{total}\r\n",
                end - 1
            ));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).await?;
        if req.head_only {
            return Ok(true);
        }
        let slice = &body.bytes(start, end);
        if mode == Mode::Healthy {
            s.write_all(slice).await?;
            return Ok(true);
        }
        s.write_all(&slice[..slice.len() / 2]).await?;
        if mode == Mode::Stall {
            for _ in 0..1200 {
                if self.mode() != Mode::Stall {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        } else {
            // Linger 0: the close sends a reset instead of a FIN.
            let _ = socket2::SockRef::from(&*s).set_linger(Some(Duration::ZERO));
        }
        Ok(false)
    }

    fn content(&self, path: &str) -> Option<Body> {
        if let Some(f) = self.files.get(path) {
            return Some(Body::Fixed(f.clone()));
        }
        // /…/gen/<size>/<name>: `size` generated bytes of the object named by the whole path tail.
        if let Some(i) = path.find("/gen/") {
            let rest = &path[i + 5..];
            let size: usize = rest.split('/').next()?.parse().ok()?;
            return Some(Body::Gen {
                seed: gen::seed(rest),
                len: size,
            });
        }
        // /hls/<name>/index.m3u8 and /hls/<name>/seg<i>.ts
        let rest = path.strip_prefix("/hls/")?;
        let (name, file) = rest.split_once('/')?;
        if file == "index.m3u8" {
            let mut p = String::from("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-PLAYLIST-TYPE:VOD\n");
            for i in 0..HLS_SEGMENTS {
                p.push_str(&format!("#EXTINF:2.000,\nseg{i}.ts\n"));
            }
            p.push_str("#EXT-X-ENDLIST\n");
            return Some(Body::Fixed(p.into_bytes()));
        }
        let i: usize = file
            .strip_prefix("seg")?
            .strip_suffix(".ts")?
            .parse()
            .ok()?;
        (i < HLS_SEGMENTS).then(|| Body::Gen {
            seed: hls_segment_seed(name, i),
            len: HLS_SEGMENT_BYTES,
        })
    }
}

/// The seed of segment `i` of the synthetic HLS VOD `name`.
pub fn hls_segment_seed(name: &str, i: usize) -> u64 {
    gen::seed(&format!("hls/{name}/{i}"))
}

fn content_type(path: &str) -> &'static str {
    if path.ends_with(".m3u8") {
        "application/vnd.apple.mpegurl"
    } else if path.ends_with(".mpd") {
        "application/dash+xml"
    } else if path.ends_with(".ts") {
        "video/mp2t"
    } else if path.ends_with(".mp4") || path.ends_with(".m4s") {
        "video/mp4"
    } else {
        "application/octet-stream"
    }
}

enum Body {
    Fixed(Vec<u8>),
    Gen { seed: u64, len: usize },
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::Fixed(v) => v.len(),
            Body::Gen { len, .. } => *len,
        }
    }

    fn bytes(&self, start: usize, end: usize) -> Vec<u8> {
        match self {
            Body::Fixed(v) => v[start..end].to_vec(),
            Body::Gen { seed, .. } => gen::bytes(*seed, start as u64, end - start),
        }
    }
}

struct Request {
    path: String,
    head_only: bool,
    range: Option<Range>,
}

#[derive(Clone, Copy)]
struct Range {
    first: u64,
    last: Option<u64>,
}

impl Range {
    /// The half-open byte span of a single range, None when unsatisfiable.
    fn resolve(self, total: usize) -> Option<(usize, usize)> {
        let first = self.first as usize;
        let end = self.last.map_or(total, |l| (l as usize + 1).min(total));
        (first < total && first < end).then_some((first, end))
    }
}

impl Request {
    fn parse(head: &str) -> Option<Request> {
        let mut lines = head.split("\r\n");
        let mut parts = lines.next()?.split(' ');
        let method = parts.next()?;
        let target = parts.next()?;
        let path = target.split('?').next()?.to_string();
        let mut range = None;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if name.eq_ignore_ascii_case("range") {
                let spec = value.trim().strip_prefix("bytes=")?;
                let (a, b) = spec.split_once('-')?;
                range = Some(Range {
                    first: a.parse().ok()?,
                    last: b.parse().ok(),
                });
            }
        }
        Some(Request {
            path,
            head_only: method == "HEAD",
            range,
        })
    }
}

/// Reads up to the end of a request head (no request bodies here); None on a clean close.
async fn read_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<String>> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).into_owned();
            buf.drain(..i + 4);
            return Ok(Some(head));
        }
        if buf.len() > 65536 {
            anyhow::bail!("request head too large");
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Loads every file under `dir` as `/<prefix>/<relative path>`.
pub fn load_dir(dir: &Path, prefix: &str, into: &mut HashMap<String, Vec<u8>>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let key = format!("{prefix}/{name}");
        if entry.file_type()?.is_dir() {
            load_dir(&entry.path(), &key, into)?;
        } else {
            into.insert(key, std::fs::read(entry.path())?);
        }
    }
    Ok(())
}
