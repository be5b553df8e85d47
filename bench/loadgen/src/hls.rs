//! HLS players: each fetches the media playlist through the proxy, then every segment URL the
//! playlist it received names, in order, as fast as possible, on one keep-alive connection.
//!
//! All players of a level are released together; the level's wall time runs from the release
//! to the last player's last segment. Only loopback URLs are followed.

use crate::client::Target;
use crate::procstat::{Background, TreeSampler, Usage};
use crate::stats::Latency;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::Barrier;

#[derive(Debug, Clone)]
pub struct Config {
    pub url: String,
    pub levels: Vec<usize>,
    pub expect_segments: usize,
    pub timeout: Duration,
    pub max_secs: Duration,
    pub pid: Option<u32>,
    pub sample_interval: Duration,
}

#[derive(Debug, Serialize)]
pub struct LevelReport {
    pub c: usize,
    pub wall_s: f64,
    pub players_ok: usize,
    pub segments: u64,
    pub bytes: u64,
    pub segments_per_s: f64,
    pub throughput_mb_s: f64,
    pub segment_latency: Latency,
    pub manifest_latency: Latency,
    pub errors: usize,
    pub error_kinds: BTreeMap<String, usize>,
    pub usage: Option<Usage>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub url: String,
    pub expect_segments: usize,
    pub levels: Vec<LevelReport>,
}

/// One keep-alive connection, reopened when the server closed it or the authority changed.
struct Fetcher {
    conn: Option<(SocketAddr, SendRequest<Empty<Bytes>>)>,
}

impl Fetcher {
    async fn get(&mut self, url: &str, keep: bool) -> Result<(u64, Bytes), String> {
        let t = Target::parse(url).map_err(|_| "url".to_string())?;
        let reuse = matches!(&mut self.conn, Some((a, s)) if *a == t.addr && !s.is_closed());
        if !reuse {
            let stream = TcpStream::connect(t.addr).await.map_err(|_| "connect")?;
            stream.set_nodelay(true).map_err(|_| "connect")?;
            let (sender, conn) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|_| "handshake")?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.conn = Some((t.addr, sender));
        }
        let Some((_, sender)) = self.conn.as_mut() else {
            return Err("connect".into());
        };
        sender.ready().await.map_err(|_| "connect")?;
        let req = http::Request::get(t.path_and_query.as_str())
            .header(http::header::HOST, t.host.as_str())
            .header(http::header::USER_AGENT, "sluice-loadgen")
            .body(Empty::<Bytes>::new())
            .map_err(|_| "request")?;
        let resp = sender.send_request(req).await.map_err(|_| "send")?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let (mut n, mut kept) = (0u64, BytesMut::new());
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| "body")?;
            if let Some(d) = frame.data_ref() {
                n += d.len() as u64;
                if keep {
                    kept.extend_from_slice(d);
                }
            }
        }
        if status != 200 {
            self.conn = None;
            return Err(format!("status_{status}"));
        }
        Ok((n, kept.freeze()))
    }
}

/// Resolves a playlist line against the playlist's URL.
fn resolve(base: &str, line: &str) -> String {
    if line.starts_with("http://") || line.starts_with("https://") {
        return line.to_string();
    }
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let origin_end = base[after_scheme..]
        .find('/')
        .map_or(base.len(), |i| after_scheme + i);
    if line.starts_with('/') {
        return format!("{}{}", &base[..origin_end], line);
    }
    let path_end = base.find('?').unwrap_or(base.len());
    let dir_end = base[..path_end].rfind('/').map_or(path_end, |i| i + 1);
    format!("{}{}", &base[..dir_end.max(origin_end)], line)
}

/// URIs of the media segments in a playlist: every non-blank line that is not a tag.
fn segment_uris(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[derive(Default)]
struct PlayerResult {
    seg_times: Vec<Duration>,
    manifest_time: Option<Duration>,
    segments: u64,
    bytes: u64,
    error: Option<String>,
}

async fn play(
    url: Arc<String>,
    expect: usize,
    timeout: Duration,
    go: Arc<Barrier>,
) -> PlayerResult {
    let mut r = PlayerResult::default();
    let mut f = Fetcher { conn: None };
    go.wait().await;
    let t0 = Instant::now();
    let text = match tokio::time::timeout(timeout, f.get(&url, true)).await {
        Ok(Ok((_, body))) => String::from_utf8_lossy(&body).into_owned(),
        Ok(Err(e)) => {
            r.error = Some(format!("manifest_{e}"));
            return r;
        }
        Err(_) => {
            r.error = Some("manifest_timeout".into());
            return r;
        }
    };
    r.manifest_time = Some(t0.elapsed());
    let uris = segment_uris(&text);
    if uris.len() != expect || text.contains("#EXT-X-STREAM-INF") {
        r.error = Some("manifest_segments".into());
        return r;
    }
    // Bounded: one request per listed segment, each with a timeout.
    for u in uris {
        let seg = resolve(&url, &u);
        let t = Instant::now();
        match tokio::time::timeout(timeout, f.get(&seg, false)).await {
            Ok(Ok((n, _))) if n > 0 => {
                r.seg_times.push(t.elapsed());
                r.segments += 1;
                r.bytes += n;
            }
            Ok(Ok(_)) => {
                r.error = Some("segment_empty".into());
                return r;
            }
            Ok(Err(e)) => {
                r.error = Some(format!("segment_{e}"));
                return r;
            }
            Err(_) => {
                r.error = Some("segment_timeout".into());
                return r;
            }
        }
    }
    r
}

async fn level(cfg: &Config, c: usize) -> LevelReport {
    let url = Arc::new(cfg.url.clone());
    let go = Arc::new(Barrier::new(c + 1));
    let tasks: Vec<_> = (0..c)
        .map(|_| {
            let (url, go) = (url.clone(), go.clone());
            tokio::spawn(play(url, cfg.expect_segments, cfg.timeout, go))
        })
        .collect();
    let sampler = cfg
        .pid
        .map(|pid| Background::run(TreeSampler::start(pid), cfg.sample_interval));
    go.wait().await;
    let start = Instant::now();
    let all = tokio::time::timeout(cfg.max_secs, async {
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap_or_else(|_| PlayerResult {
                error: Some("panic".into()),
                ..Default::default()
            }));
        }
        out
    })
    .await
    .unwrap_or_default();
    let wall = start.elapsed().as_secs_f64();
    let usage = sampler.map(Background::stop);
    let mut kinds = BTreeMap::new();
    let (mut segs, mut bytes, mut ok) = (Vec::new(), 0u64, 0usize);
    let mut manifests = Vec::new();
    let mut segments = 0;
    if all.len() < c {
        *kinds.entry("level_timeout".to_string()).or_default() += c - all.len();
    }
    for p in all {
        segs.extend(p.seg_times);
        manifests.extend(p.manifest_time);
        segments += p.segments;
        bytes += p.bytes;
        match p.error {
            Some(e) => *kinds.entry(e).or_default() += 1,
            None => ok += 1,
        }
    }
    let per_s = |x: f64| if wall > 0.0 { x / wall } else { 0.0 };
    LevelReport {
        c,
        wall_s: wall,
        players_ok: ok,
        segments,
        bytes,
        segments_per_s: per_s(segments as f64),
        throughput_mb_s: per_s(bytes as f64) / 1e6,
        segment_latency: Latency::from_samples(&segs),
        manifest_latency: Latency::from_samples(&manifests),
        errors: kinds.values().sum(),
        error_kinds: kinds,
        usage,
    }
}

pub async fn run(cfg: Config) -> Report {
    let mut levels = Vec::new();
    for &c in &cfg.levels {
        levels.push(level(&cfg, c.max(1)).await);
    }
    Report {
        mode: "hls",
        url: cfg.url.clone(),
        expect_segments: cfg.expect_segments,
        levels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_playlist_lines() {
        let base = "http://127.0.0.1:9/proxy/hls/manifest.m3u8?d=x";
        assert_eq!(
            resolve(base, "http://127.0.0.1:9/a.ts"),
            "http://127.0.0.1:9/a.ts"
        );
        assert_eq!(
            resolve(base, "/proxy/hls/segment.ts?d=y"),
            "http://127.0.0.1:9/proxy/hls/segment.ts?d=y"
        );
        assert_eq!(
            resolve(base, "seg1.ts"),
            "http://127.0.0.1:9/proxy/hls/seg1.ts"
        );
        assert_eq!(
            segment_uris("#EXTM3U\n#EXTINF:2,\n a.ts \n\n#EXT-X-ENDLIST\n"),
            vec!["a.ts"]
        );
    }
}
