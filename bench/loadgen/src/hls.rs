//! HLS players: each fetches the playlist through the proxy, then every segment URL the
//! playlist it received names, in order, as fast as possible, on one keep-alive connection.
//!
//! A master playlist is followed to its highest-bandwidth variant and, when that variant names
//! an audio group with its own playlist, to that rendition too; the two tracks' segments are then
//! fetched interleaved (video 1, audio 1, video 2, ...), after their `EXT-X-MAP` init sections.
//! With `check_fmp4`, each player's init sections and first segment of each track must be
//! well-formed fragmented MP4 with no trace of encryption left (no `encv`/`enca`/`sinf` in the
//! init, no `senc` in any `traf`): that is what a proxy that decrypts ClearKey must hand out.
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
    pub check_fmp4: bool,
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
    pub init_sections: u64,
    pub checked_bodies: u64,
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
    pub check_fmp4: bool,
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

/// The value of attribute `name` in a tag's attribute list (quotes removed).
fn attr(list: &str, name: &str) -> Option<String> {
    let mut rest = list;
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], q[end + 1..].trim_start_matches(','))
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], after[end..].trim_start_matches(','))
        };
        if key.trim() == name {
            return Some(value.to_string());
        }
        rest = next;
    }
    None
}

/// From a master playlist: the URI of the highest-bandwidth variant, and the URI of its audio
/// rendition (the group's DEFAULT=YES one, else its first) when that has a playlist of its own.
fn pick_variant(text: &str) -> Option<(String, Option<String>)> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut best: Option<(u64, String, Option<String>)> = None;
    for (i, l) in lines.iter().enumerate() {
        let Some(attrs) = l.strip_prefix("#EXT-X-STREAM-INF:") else {
            continue;
        };
        let Some(uri) = lines[i + 1..]
            .iter()
            .find(|u| !u.is_empty() && !u.starts_with('#'))
        else {
            continue;
        };
        let bw = attr(attrs, "BANDWIDTH")
            .and_then(|b| b.parse().ok())
            .unwrap_or(0);
        if best.as_ref().is_none_or(|b| bw > b.0) {
            best = Some((bw, uri.to_string(), attr(attrs, "AUDIO")));
        }
    }
    let (_, video, group) = best?;
    let audio = group.and_then(|g| {
        let renditions: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("#EXT-X-MEDIA:"))
            .filter(|a| attr(a, "TYPE").as_deref() == Some("AUDIO"))
            .filter(|a| attr(a, "GROUP-ID").as_deref() == Some(g.as_str()))
            .collect();
        let chosen = renditions
            .iter()
            .find(|a| attr(a, "DEFAULT").as_deref() == Some("YES"))
            .or(renditions.first())?;
        attr(chosen, "URI")
    });
    Some((video, audio))
}

/// The `EXT-X-MAP` URI of a media playlist, if any.
fn init_uri(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("#EXT-X-MAP:"))
        .and_then(|a| attr(a, "URI"))
}

/// Boxes of an ISO BMFF byte range as (type, payload); None if the sizes do not add up.
fn boxes(mut data: &[u8]) -> Option<Vec<([u8; 4], &[u8])>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        if data.len() < 8 {
            return None;
        }
        let kind: [u8; 4] = data[4..8].try_into().ok()?;
        let (size, header) = match u32::from_be_bytes(data[..4].try_into().ok()?) {
            0 => (data.len(), 8),
            1 => {
                let big = data.get(8..16)?;
                (
                    usize::try_from(u64::from_be_bytes(big.try_into().ok()?)).ok()?,
                    16,
                )
            }
            n => (n as usize, 8),
        };
        if size < header || size > data.len() {
            return None;
        }
        out.push((kind, &data[header..size]));
        data = &data[size..];
    }
    Some(out)
}

/// Checks that a body a decrypting proxy returned is clear fragmented MP4: it parses as boxes,
/// an init section (`moov`) names no protected sample entry or scheme, and a media segment has
/// `moof` and `mdat` with no `senc` left in any track fragment.
fn check_fmp4(body: &[u8], media: bool) -> Result<(), &'static str> {
    let top = boxes(body).ok_or("fmp4_malformed")?;
    let has = |k: &[u8; 4]| top.iter().any(|(t, _)| t == k);
    for (_, moov) in top.iter().filter(|(t, _)| t == b"moov") {
        if [b"encv", b"enca", b"sinf"]
            .iter()
            .any(|k| moov.windows(4).any(|w| w == *k))
        {
            return Err("fmp4_init_encrypted");
        }
    }
    if !media {
        return if has(b"moov") {
            Ok(())
        } else {
            Err("fmp4_no_moov")
        };
    }
    if !has(b"moof") || !has(b"mdat") {
        return Err("fmp4_no_moof");
    }
    for (_, moof) in top.iter().filter(|(t, _)| t == b"moof") {
        let children = boxes(moof).ok_or("fmp4_malformed")?;
        for (_, traf) in children.iter().filter(|(t, _)| t == b"traf") {
            let inner = boxes(traf).ok_or("fmp4_malformed")?;
            if inner.iter().any(|(t, _)| t == b"senc") {
                return Err("fmp4_senc_left");
            }
        }
    }
    Ok(())
}

#[derive(Default)]
struct PlayerResult {
    seg_times: Vec<Duration>,
    manifest_time: Option<Duration>,
    segments: u64,
    bytes: u64,
    inits: u64,
    checked: u64,
    error: Option<String>,
}

async fn fetch_text(
    f: &mut Fetcher,
    url: &str,
    timeout: Duration,
    what: &str,
) -> Result<String, String> {
    match tokio::time::timeout(timeout, f.get(url, true)).await {
        Ok(Ok((_, body))) => Ok(String::from_utf8_lossy(&body).into_owned()),
        Ok(Err(e)) => Err(format!("{what}_{e}")),
        Err(_) => Err(format!("{what}_timeout")),
    }
}

async fn play(
    url: Arc<String>,
    expect: usize,
    check: bool,
    timeout: Duration,
    go: Arc<Barrier>,
) -> PlayerResult {
    let mut r = PlayerResult::default();
    if let Err(e) = play_inner(&mut r, &url, expect, check, timeout, go).await {
        r.error = Some(e);
    }
    r
}

async fn play_inner(
    r: &mut PlayerResult,
    url: &str,
    expect: usize,
    check: bool,
    timeout: Duration,
    go: Arc<Barrier>,
) -> Result<(), String> {
    let mut f = Fetcher { conn: None };
    go.wait().await;
    let t0 = Instant::now();
    let text = fetch_text(&mut f, url, timeout, "manifest").await?;
    // Each followed media playlist as (its URL, its text).
    let mut tracks = Vec::new();
    if text.contains("#EXT-X-STREAM-INF") {
        let (video, audio) = pick_variant(&text).ok_or("master_no_variant")?;
        for u in std::iter::once(video).chain(audio) {
            let u = resolve(url, &u);
            let t = fetch_text(&mut f, &u, timeout, "media_playlist").await?;
            tracks.push((u, t));
        }
    } else {
        tracks.push((url.to_string(), text));
    }
    r.manifest_time = Some(t0.elapsed());
    let lists: Vec<Vec<String>> = tracks
        .iter()
        .map(|(base, t)| segment_uris(t).iter().map(|u| resolve(base, u)).collect())
        .collect();
    if lists.iter().map(Vec::len).sum::<usize>() != expect
        || tracks.iter().any(|(_, t)| t.contains("#EXT-X-STREAM-INF"))
    {
        return Err("manifest_segments".into());
    }
    // Init sections first, then the tracks' segments interleaved; bounded: one request per
    // listed URL, each with a timeout.
    for (base, t) in &tracks {
        let Some(u) = init_uri(t) else { continue };
        let body = match tokio::time::timeout(timeout, f.get(&resolve(base, &u), check)).await {
            Ok(Ok((0, _))) => return Err("init_empty".into()),
            Ok(Ok((_, body))) => body,
            Ok(Err(e)) => return Err(format!("init_{e}")),
            Err(_) => return Err("init_timeout".into()),
        };
        r.inits += 1;
        if check {
            check_fmp4(&body, false)?;
            r.checked += 1;
        }
    }
    let longest = lists.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..longest {
        for seg in lists.iter().filter_map(|l| l.get(i)) {
            let keep = check && i == 0;
            let t = Instant::now();
            match tokio::time::timeout(timeout, f.get(seg, keep)).await {
                Ok(Ok((n, body))) if n > 0 => {
                    r.seg_times.push(t.elapsed());
                    r.segments += 1;
                    r.bytes += n;
                    if keep {
                        check_fmp4(&body, true)?;
                        r.checked += 1;
                    }
                }
                Ok(Ok(_)) => return Err("segment_empty".into()),
                Ok(Err(e)) => return Err(format!("segment_{e}")),
                Err(_) => return Err("segment_timeout".into()),
            }
        }
    }
    Ok(())
}

async fn level(cfg: &Config, c: usize) -> LevelReport {
    let url = Arc::new(cfg.url.clone());
    let go = Arc::new(Barrier::new(c + 1));
    let tasks: Vec<_> = (0..c)
        .map(|_| {
            let (url, go) = (url.clone(), go.clone());
            tokio::spawn(play(
                url,
                cfg.expect_segments,
                cfg.check_fmp4,
                cfg.timeout,
                go,
            ))
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
    let (mut inits, mut checked) = (0, 0);
    if all.len() < c {
        *kinds.entry("level_timeout".to_string()).or_default() += c - all.len();
    }
    for p in all {
        segs.extend(p.seg_times);
        manifests.extend(p.manifest_time);
        segments += p.segments;
        inits += p.inits;
        checked += p.checked;
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
        init_sections: inits,
        checked_bodies: checked,
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
        check_fmp4: cfg.check_fmp4,
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

    #[test]
    fn follows_master_to_best_variant_and_its_audio() {
        let master = "#EXTM3U\n\
            #EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"aud\",NAME=\"a,b\",DEFAULT=YES,URI=\"a.m3u8\"\n\
            #EXT-X-STREAM-INF:BANDWIDTH=100,CODECS=\"avc1.4d401f,mp4a.40.2\",AUDIO=\"aud\"\n\
            low.m3u8\n\
            #EXT-X-STREAM-INF:BANDWIDTH=900,AUDIO=\"aud\"\n\
            high.m3u8\n";
        assert_eq!(
            pick_variant(master),
            Some(("high.m3u8".into(), Some("a.m3u8".into())))
        );
        assert_eq!(
            pick_variant("#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=5\nv.m3u8\n"),
            Some(("v.m3u8".into(), None))
        );
        assert_eq!(
            init_uri("#EXT-X-MAP:URI=\"/init?x=1\"\n"),
            Some("/init?x=1".into())
        );
    }

    fn mp4_box(kind: &[u8; 4], payload: &[u8]) -> Vec<u8> {
        let mut b = ((payload.len() + 8) as u32).to_be_bytes().to_vec();
        b.extend_from_slice(kind);
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn checks_clear_fmp4() {
        let traf = |inner: &[u8]| mp4_box(b"moof", &mp4_box(b"traf", inner));
        let clear = [traf(&mp4_box(b"trun", &[0; 4])), mp4_box(b"mdat", &[1; 9])].concat();
        assert_eq!(check_fmp4(&clear, true), Ok(()));
        let enc = [traf(&mp4_box(b"senc", &[0; 4])), mp4_box(b"mdat", &[1; 9])].concat();
        assert_eq!(check_fmp4(&enc, true), Err("fmp4_senc_left"));
        assert_eq!(check_fmp4(&clear[..10], true), Err("fmp4_malformed"));
        let init = mp4_box(b"moov", &mp4_box(b"avc1", &[0; 4]));
        assert_eq!(check_fmp4(&init, false), Ok(()));
        let init = mp4_box(b"moov", &mp4_box(b"encv", &[0; 4]));
        assert_eq!(check_fmp4(&init, false), Err("fmp4_init_encrypted"));
    }
}
