//! The simulated users, one loop per kind, each bounded by the run's end and a request count, and
//! each checking every byte it receives against what the origin sent (or, for decrypted DASH
//! media, against the first fault-free pass and the fixture's decoded frames).

use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client;
use crate::gen;
use crate::mcast;
use crate::origin::{self, HLS_SEGMENTS, HLS_SEGMENT_BYTES};
use crate::record::{Front, Log};

/// ClearKey pairs of the DASH fixture, as `key_id=…&key=…`.
pub struct Drm {
    pub keys: String,
    pub video_md5: Vec<String>,
}

pub struct Ctx {
    pub log: Arc<Log>,
    pub sluice: SocketAddr,
    pub tcp: SocketAddr,
    /// The media origin (not part of any group that gets killed).
    pub media: SocketAddr,
    pub password: String,
    pub group: SocketAddrV4,
    pub iptv_kbit_s: u64,
    pub drm: Drm,
    pub until: Instant,
    /// Fault windows open now (golden DASH hashes are taken only when zero).
    pub faults_open: AtomicUsize,
    pub work_dir: std::path::PathBuf,
}

impl Ctx {
    fn running(&self) -> bool {
        Instant::now() < self.until
    }

    fn pw(&self) -> String {
        format!("api_password={}", self.password)
    }
}

/// A small seeded generator for choosing objects.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

pub fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Requests per loop at most (with the pauses below, far above what the time bound allows).
const MAX_OPS: u64 = 1_000_000;
const LIMIT: Duration = Duration::from_secs(40);

/// GETs a generated object and checks status, length and every byte.
async fn fetch_gen(ctx: &Ctx, target: &str, seed: u64, size: u64) -> Result<u64, String> {
    let mut v = gen::Verifier::new(seed);
    let r = client::get(ctx.sluice, target, LIMIT, |c| {
        v.feed(c);
    })
    .await?;
    if r.status != 200 {
        return Err(format!("status {}", r.status));
    }
    if !v.ok() {
        return Err("mismatch".into());
    }
    if v.len() != size {
        return Err(format!("length {} of {size}", v.len()));
    }
    Ok(size)
}

/// Reverse proxy, both routes: `/plain/…` (group of two servers) or `/cached/…` (slice cache).
pub async fn reverse(ctx: Arc<Ctx>, cached: bool, id: u64) {
    let mut rng = Rng::new(0xC0FFEE + id);
    let (prefix, front, names, sizes): (&str, Front, u64, &[u64]) = if cached {
        (
            "/cached",
            Front::ReverseCached,
            24,
            &[65_536, 1_048_576, 4_194_304 + 123],
        )
    } else {
        (
            "/plain",
            Front::ReversePlain,
            64,
            &[16_384, 262_144, 1_048_576, 3_145_728],
        )
    };
    for _ in 0..MAX_OPS {
        if !ctx.running() {
            break;
        }
        let size = sizes[rng.below(sizes.len() as u64) as usize];
        let rest = format!("{size}/o{}", rng.below(names));
        let t = ctx.log.now();
        let r = fetch_gen(
            &ctx,
            &format!("{prefix}/gen/{rest}"),
            gen::seed(&rest),
            size,
        )
        .await;
        ctx.log.result(front, t, r);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// `/proxy/stream?d=…` of generated objects from the media origin.
pub async fn stream(ctx: Arc<Ctx>, id: u64) {
    let mut rng = Rng::new(0x5EA + id);
    for _ in 0..MAX_OPS {
        if !ctx.running() {
            break;
        }
        let size = [524_288u64, 2_097_152, 6_291_456 + 7][rng.below(3) as usize];
        let rest = format!("{size}/s{}", rng.below(1000));
        let d = enc(&format!("http://{}/media/gen/{rest}", ctx.media));
        let target = format!("/proxy/stream?d={d}&{}", ctx.pw());
        let t = ctx.log.now();
        let r = fetch_gen(&ctx, &target, gen::seed(&rest), size).await;
        ctx.log.result(Front::Stream, t, r);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The path and query of a URL sluice wrote into a playlist (absolute or not).
fn local_target(uri: &str) -> String {
    match uri.strip_prefix("http://") {
        Some(rest) => rest
            .find('/')
            .map_or("/".to_string(), |i| rest[i..].to_string()),
        None => uri.to_string(),
    }
}

fn uri_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// HLS player: proxied playlist, then every segment in order, each checked byte for byte.
pub async fn hls(ctx: Arc<Ctx>, id: u64) {
    let mut rng = Rng::new(0x415 + id);
    for _ in 0..MAX_OPS {
        if !ctx.running() {
            break;
        }
        let name = format!("v{}", rng.below(8));
        let t = ctx.log.now();
        let r = play_hls(&ctx, &name).await;
        ctx.log.result(Front::Hls, t, r);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn play_hls(ctx: &Ctx, name: &str) -> Result<u64, String> {
    let d = enc(&format!("http://{}/hls/{name}/index.m3u8", ctx.media));
    let (status, body) = client::get_body(
        ctx.sluice,
        &format!("/proxy/hls/manifest.m3u8?d={d}&{}", ctx.pw()),
        LIMIT,
    )
    .await?;
    if status != 200 {
        return Err(format!("playlist: status {status}"));
    }
    let uris = uri_lines(&String::from_utf8_lossy(&body));
    if uris.len() != HLS_SEGMENTS {
        return Err(format!("playlist: {} segments", uris.len()));
    }
    let mut total = body.len() as u64;
    for (i, uri) in uris.iter().enumerate() {
        let seed = origin::hls_segment_seed(name, i);
        total += fetch_gen(ctx, &local_target(uri), seed, HLS_SEGMENT_BYTES as u64)
            .await
            .map_err(|e| format!("segment: {e}"))?;
    }
    Ok(total)
}

/// Decrypted DASH bytes seen on the first fault-free pass, per (playlist, item).
type Golden = Mutex<HashMap<(usize, usize), [u8; 32]>>;

/// DASH-ClearKey player: `/proxy/mpd/manifest.m3u8` → each media playlist → init and segments.
/// Every item must be 200, carry no encryption boxes, and equal the first fault-free pass; every
/// few minutes the video track goes through ffmpeg and must decode to the fixture's frames.
pub async fn dash(ctx: Arc<Ctx>, id: u64) {
    let golden: Arc<Golden> = Arc::new(Mutex::new(HashMap::new()));
    let mut last_decode: Option<Instant> = None;
    for _ in 0..MAX_OPS {
        if !ctx.running() {
            break;
        }
        let decode = id == 0 && last_decode.is_none_or(|t| t.elapsed() > Duration::from_secs(180));
        let t = ctx.log.now();
        let r = play_dash(&ctx, &golden, decode).await;
        if decode && r.is_ok() {
            last_decode = Some(Instant::now());
        }
        ctx.log.result(Front::Dash, t, r);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
}

fn attr_uri(line: &str) -> Option<String> {
    let i = line.find("URI=\"")? + 5;
    let end = line[i..].find('"')?;
    Some(line[i..i + end].to_string())
}

async fn play_dash(ctx: &Ctx, golden: &Golden, decode: bool) -> Result<u64, String> {
    let d = enc(&format!("http://{}/drm/cenc/manifest.mpd", ctx.media));
    let target = format!(
        "/proxy/mpd/manifest.m3u8?d={d}&{}&{}",
        ctx.drm.keys,
        ctx.pw()
    );
    let (status, master) = client::get_body(ctx.sluice, &target, LIMIT).await?;
    if status != 200 {
        return Err(format!("master: status {status}"));
    }
    let master = String::from_utf8_lossy(&master).into_owned();
    // Variant streams (video) first, then renditions (audio).
    let mut playlists = uri_lines(&master);
    playlists.extend(
        master
            .lines()
            .filter(|l| l.starts_with("#EXT-X-MEDIA:"))
            .filter_map(attr_uri),
    );
    if playlists.len() < 2 {
        return Err(format!("master: {} media playlists", playlists.len()));
    }
    let fault_free = ctx.faults_open.load(Ordering::Relaxed) == 0;
    let mut total = master.len() as u64;
    let mut video = Vec::new();
    for (p, uri) in playlists.iter().enumerate() {
        let (status, text) = client::get_body(ctx.sluice, &local_target(uri), LIMIT).await?;
        if status != 200 {
            return Err(format!("media playlist: status {status}"));
        }
        let text = String::from_utf8_lossy(&text).into_owned();
        let mut items: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("#EXT-X-MAP"))
            .filter_map(attr_uri)
            .collect();
        let first_segment = items.len();
        items.extend(uri_lines(&text));
        if items.len() < 2 {
            return Err("media playlist: no segments".into());
        }
        for (k, item) in items.iter().enumerate() {
            let (status, body) = client::get_body(ctx.sluice, &local_target(item), LIMIT).await?;
            if status != 200 || body.is_empty() {
                return Err(format!("media: status {status}, {} bytes", body.len()));
            }
            let boxes: &[&[u8]] = if k < first_segment {
                &[b"encv", b"enca"]
            } else {
                &[b"senc"]
            };
            if boxes.iter().any(|b| body.windows(4).any(|w| w == *b)) {
                return Err("media: still encrypted".into());
            }
            let hash: [u8; 32] = Sha256::digest(&body).into();
            {
                let mut g = golden.lock().unwrap();
                match g.get(&(p, k)) {
                    Some(h) if *h != hash => {
                        return Err("decrypted bytes differ from the first pass".into())
                    }
                    None if fault_free => {
                        g.insert((p, k), hash);
                    }
                    _ => {}
                }
            }
            total += body.len() as u64;
            if p == 0 {
                video.extend_from_slice(&body);
            }
        }
    }
    if decode && fault_free {
        decode_video(ctx, &video).await?;
    }
    Ok(total)
}

/// ffmpeg decodes the first media playlist's init + segments: every frame must equal the source's.
async fn decode_video(ctx: &Ctx, track: &[u8]) -> Result<(), String> {
    if ctx.drm.video_md5.is_empty() {
        return Ok(());
    }
    let file = ctx.work_dir.join("dash-video.mp4");
    std::fs::write(&file, track).map_err(|e| format!("decode: {e}"))?;
    let out = tokio::process::Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(&file)
        .args(["-map", "0:v", "-f", "framemd5", "-"])
        .output()
        .await
        .map_err(|e| format!("decode: ffmpeg: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let got: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit(',').next())
        .map(str::trim)
        .collect();
    // The decoder may emit a few frames more at the start; the source's frames must be the tail.
    let want = &ctx.drm.video_md5;
    if !out.status.success() || got.len() < want.len() || got[got.len() - want.len()..] != want[..]
    {
        return Err(format!(
            "decode: {} frames, {} expected, differ or error",
            got.len(),
            ctx.drm.video_md5.len()
        ));
    }
    Ok(())
}

/// `[[tcp]]` relay to the echo group: 256 KiB out, the same 256 KiB back, checked.
pub async fn tcp(ctx: Arc<Ctx>, id: u64) {
    for n in 0..MAX_OPS {
        if !ctx.running() {
            break;
        }
        let t = ctx.log.now();
        let seed = gen::seed(&format!("tcp/{id}/{n}"));
        let r = match tokio::time::timeout(LIMIT, echo_once(ctx.tcp, seed, 262_144)).await {
            Ok(r) => r,
            Err(_) => Err("timeout".into()),
        };
        ctx.log.result(Front::Tcp, t, r);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

async fn echo_once(addr: SocketAddr, seed: u64, len: usize) -> Result<u64, String> {
    let s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {}", e.kind()))?;
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        let data = gen::bytes(seed, 0, len);
        for chunk in data.chunks(16_384) {
            wr.write_all(chunk).await?;
        }
        wr.shutdown().await?;
        Ok::<_, std::io::Error>(wr)
    });
    let mut v = gen::Verifier::new(seed);
    let mut buf = vec![0u8; 65_536];
    loop {
        let n = rd
            .read(&mut buf)
            .await
            .map_err(|e| format!("read: {}", e.kind()))?;
        if n == 0 {
            break;
        }
        v.feed(&buf[..n]);
    }
    writer
        .await
        .map_err(|_| "writer".to_string())?
        .map_err(|e| format!("write: {}", e.kind()))?;
    if !v.ok() {
        return Err("mismatch".into());
    }
    if v.len() != len as u64 {
        return Err(format!("length {} of {len}", v.len()));
    }
    Ok(len as u64)
}

/// IPTV viewer: watches the channel for 10–20 s; every TS packet must be the sender's, in order,
/// none missing.
pub async fn iptv(ctx: Arc<Ctx>, id: u64) {
    let mut rng = Rng::new(0x17 + id);
    for _ in 0..MAX_OPS {
        if !ctx.running() {
            break;
        }
        let secs = 10 + rng.below(11);
        let t = ctx.log.now();
        let r = watch(&ctx, Duration::from_secs(secs)).await;
        ctx.log.result(Front::Iptv, t, r);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[derive(Default)]
struct TsCheck {
    partial: Vec<u8>,
    last: Option<u64>,
    packets: u64,
    lost: u64,
    bad: u64,
}

impl TsCheck {
    fn feed(&mut self, mut c: &[u8]) {
        while !c.is_empty() {
            let take = (mcast::TS - self.partial.len()).min(c.len());
            self.partial.extend_from_slice(&c[..take]);
            c = &c[take..];
            if self.partial.len() == mcast::TS {
                let n = u64::from_be_bytes(self.partial[4..12].try_into().unwrap());
                if self.partial[..] != mcast::packet(n)[..] {
                    self.bad += 1;
                } else {
                    match self.last {
                        Some(l) if n != l + 1 => {
                            if n > l {
                                self.lost += n - l - 1;
                            } else {
                                self.bad += 1;
                            }
                        }
                        _ => {}
                    }
                    self.last = Some(n);
                    self.packets += 1;
                }
                self.partial.clear();
            }
        }
    }
}

async fn watch(ctx: &Ctx, secs: Duration) -> Result<u64, String> {
    let mut check = TsCheck::default();
    let target = format!("/rtp/{}?{}", ctx.group, ctx.pw());
    let r = client::get(ctx.sluice, &target, secs, |c| check.feed(c)).await;
    match r {
        Err(e) if e == "timeout" => {}
        Err(e) => return Err(e),
        Ok(r) if r.status != 200 => return Err(format!("status {}", r.status)),
        Ok(_) => return Err("stream ended".into()),
    }
    if check.bad > 0 {
        return Err(format!("{} packets wrong", check.bad));
    }
    if check.lost > 0 {
        return Err(format!("{} packets lost", check.lost));
    }
    // At least half of what the sender sent in the time watched (less a second to join).
    let expected = ctx.iptv_kbit_s * 125 * (secs.as_secs().saturating_sub(1));
    let bytes = check.packets * mcast::TS as u64;
    if bytes < expected / 2 {
        return Err(format!("{bytes} bytes, expected about {expected}"));
    }
    Ok(bytes)
}

/// After the load: one of each kind of operation must succeed again (nothing left broken).
pub async fn probe_all(ctx: &Ctx) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut note = |name: &str, r: Result<u64, String>| {
        if let Err(e) = &r {
            eprintln!("soak: recovery probe {name}: {e}");
        }
        out.push((
            format!("after the faults: {name} serves verified bytes"),
            r.is_ok(),
        ));
    };
    let mut cached = Ok(0);
    for size in [65_536u64, 1_048_576, 4_194_304 + 123] {
        for name in 0..4 {
            let rest = format!("{size}/o{name}");
            let r = fetch_gen(ctx, &format!("/cached/gen/{rest}"), gen::seed(&rest), size).await;
            if r.is_err() {
                cached = r;
            }
        }
    }
    note("reverse + cache (12 objects)", cached);
    note(
        "reverse (no cache)",
        fetch_gen(
            ctx,
            "/plain/gen/1048576/o1",
            gen::seed("1048576/o1"),
            1_048_576,
        )
        .await,
    );
    let d = enc(&format!("http://{}/media/gen/2097152/probe", ctx.media));
    note(
        "/proxy/stream",
        fetch_gen(
            ctx,
            &format!("/proxy/stream?d={d}&{}", ctx.pw()),
            gen::seed("2097152/probe"),
            2_097_152,
        )
        .await,
    );
    note("HLS player", play_hls(ctx, "v0").await);
    let golden = Mutex::new(HashMap::new());
    note(
        "DASH-ClearKey player (with an ffmpeg decode)",
        play_dash(ctx, &golden, true).await,
    );
    note(
        "[[tcp]] relay",
        echo_once(ctx.tcp, gen::seed("tcp/probe"), 262_144).await,
    );
    note("IPTV viewer", watch(ctx, Duration::from_secs(6)).await);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_viewer_check_counts_gaps_and_wrong_bytes_across_any_split() {
        let mut stream = Vec::new();
        for n in (5..20).filter(|n| *n != 9 && *n != 10) {
            stream.extend_from_slice(&mcast::packet(n));
        }
        stream[188 * 3 + 50] ^= 0xff;
        let mut c = TsCheck::default();
        for chunk in stream.chunks(100) {
            c.feed(chunk);
        }
        // Packet 8 is wrong (bad, and not taken as delivered), 9 and 10 never came: 3 lost.
        assert_eq!((c.packets, c.lost, c.bad), (12, 3, 1));
    }
}
