//! `/proxy/mpd/*` against a running sluice and a file-serving origin holding real Shaka Packager
//! ClearKey packages: exact playlists, decrypted init and segments that ffmpeg decodes to exactly
//! the clear source's frames (also with ffmpeg reading the sluice master playlist itself), key
//! errors, token mode, single-flight and prefetch.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::{enc, get, stall_while, test_config, Sluice};
use tokio::net::TcpListener;

const VIDEO_KID: &str = "6d76f25cb17f5e16b8eaef6bbf582d8e";
const VIDEO_KEY: &str = "ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41";
const AUDIO_KID: &str = "1fba7ed02bb85aa8b8c0dbf0d1ac2e7a";
const AUDIO_KEY: &str = "4c2d8a6e3e5b9a7c1d0f2e4b6a8c9d1e";

// === file origin ===

/// One request the origin saw.
#[derive(Debug, Clone)]
struct Hit {
    path: String,
    range: Option<String>,
    headers: http::HeaderMap,
}

/// Serves a directory with Range support, logs every request (path and Range), and can be slowed
/// down to make requests overlap.
struct FileOrigin {
    addr: SocketAddr,
    root: tempfile::TempDir,
    log: Arc<Mutex<Vec<Hit>>>,
    delay_ms: Arc<AtomicU64>,
}

impl FileOrigin {
    async fn start() -> FileOrigin {
        let root = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (dir, l, d) = (root.path().to_path_buf(), log.clone(), delay_ms.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (dir, l, d) = (dir.clone(), l.clone(), d.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let (dir, l, d) = (dir.clone(), l.clone(), d.clone());
                        async move { Ok::<_, Infallible>(serve_file(req, &dir, &l, &d).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FileOrigin {
            addr,
            root,
            log,
            delay_ms,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    fn put(&self, path: &str, bytes: &[u8]) {
        let file = self.root.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, bytes).unwrap();
    }

    /// Copies one fixture package (`cenc`, `cbcs`, ...) under `name/`, with a static MPD.
    fn put_package(&self, variant: &str) {
        let src = fixtures().join(variant);
        for track in ["video", "audio"] {
            for entry in std::fs::read_dir(src.join(track)).unwrap() {
                let entry = entry.unwrap();
                let name = entry.file_name().into_string().unwrap();
                self.put(
                    &format!("{variant}/{track}/{name}"),
                    &std::fs::read(entry.path()).unwrap(),
                );
            }
        }
        let mpd = std::fs::read_to_string(src.join("manifest.mpd")).unwrap();
        self.put(
            &format!("{variant}/manifest.mpd"),
            to_static(&mpd).as_bytes(),
        );
    }

    /// Requests for `path`.
    fn hits(&self, path: &str) -> Vec<Hit> {
        let want = format!("/{path}");
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.path == want)
            .cloned()
            .collect()
    }
}

async fn serve_file(
    req: Request<Incoming>,
    dir: &Path,
    log: &Mutex<Vec<Hit>>,
    delay_ms: &AtomicU64,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let range = req
        .headers()
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    log.lock().unwrap().push(Hit {
        path: path.clone(),
        range: range.clone(),
        headers: req.headers().clone(),
    });
    let delay = delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let file = dir.join(path.trim_start_matches('/'));
    let Ok(body) = std::fs::read(&file).map(Bytes::from) else {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"no such file")))
            .unwrap();
    };
    let len = body.len();
    let slice = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .filter(|&(a, b)| a <= b && a < len);
    match slice {
        Some((a, b)) => {
            let b = b.min(len - 1);
            Response::builder()
                .status(StatusCode::PARTIAL_CONTENT)
                .header("content-range", format!("bytes {a}-{b}/{len}"))
                .body(Full::new(body.slice(a..=b)))
                .unwrap()
        }
        None => Response::new(Full::new(body)),
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sluice-media/tests/fixtures/drm")
}

/// The packager wrote a live MPD whose window has long passed; the same content as on-demand.
fn to_static(mpd: &str) -> String {
    let mut out = mpd.replace(
        "type=\"dynamic\"",
        "type=\"static\" mediaPresentationDuration=\"PT2S\"",
    );
    for attr in [
        "publishTime",
        "availabilityStartTime",
        "minimumUpdatePeriod",
        "timeShiftBufferDepth",
    ] {
        let needle = format!(" {attr}=\"");
        if let Some(at) = out.find(&needle) {
            let end = out[at + needle.len()..].find('"').unwrap() + at + needle.len() + 1;
            out.replace_range(at..end, "");
        }
    }
    out
}

// === helpers ===

fn hex_keys() -> String {
    format!("key_id={VIDEO_KID},{AUDIO_KID}&key={VIDEO_KEY},{AUDIO_KEY}")
}

async fn text(url: &str) -> String {
    let r = get(url).await;
    let body = r.body.unwrap();
    assert_eq!(r.status, 200, "{url}: {}", String::from_utf8_lossy(&body));
    String::from_utf8(body.to_vec()).unwrap()
}

async fn bytes(url: &str) -> Bytes {
    let r = get(url).await;
    let body = r.body.unwrap();
    assert_eq!(r.status, 200, "{url}: {}", String::from_utf8_lossy(&body));
    body
}

/// URI lines and `#EXT-X-MAP`/`#EXT-X-MEDIA` URIs of a playlist, in order.
fn uris(playlist: &str) -> Vec<String> {
    playlist
        .lines()
        .filter_map(|l| {
            if let Some(at) = l.find("URI=\"") {
                let rest = &l[at + 5..];
                Some(rest[..rest.find('"').unwrap()].to_string())
            } else if !l.starts_with('#') && !l.is_empty() {
                Some(l.to_string())
            } else {
                None
            }
        })
        .collect()
}

fn require_ffmpeg() {
    assert!(
        Command::new("ffmpeg").arg("-version").output().is_ok(),
        "ffmpeg is required: apt-get update && apt-get install -y ffmpeg"
    );
}

fn expected(name: &str) -> Vec<String> {
    std::fs::read_to_string(fixtures().join(name))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// One md5 per decoded frame of the first `kind` stream (`v` or `a`) of `input`.
fn frame_hashes(input: &str, kind: &str) -> Vec<String> {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-i", input, "-map"])
        .arg(format!("0:{kind}:0"))
        .args(["-f", "framemd5", "-"])
        .output()
        .expect("ffmpeg runs");
    assert!(
        out.status.success(),
        "ffmpeg failed on {input}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.rsplit(',').next().unwrap().trim().to_string())
        .collect()
}

/// Video frames must equal the source's; audio too after the AAC priming frame that a DASH init
/// (no edit list) exposes.
fn assert_frames(input: &str, kind: &str) {
    let got = frame_hashes(input, kind);
    let (want, extra) = match kind {
        "v" => (expected("source-video.md5"), 0),
        _ => (expected("source-audio.md5"), 1),
    };
    assert_eq!(got.len(), want.len() + extra, "{input} {kind}: frame count");
    assert!(
        got[extra..] == want[..],
        "{input} {kind}: decoded frames differ from the clear source"
    );
}

/// [`assert_frames`] off the runtime's thread: ffmpeg may be reading from the sluice under test.
async fn check_frames(input: &str, kind: &'static str) {
    let input = input.to_string();
    tokio::task::spawn_blocking(move || assert_frames(&input, kind))
        .await
        .unwrap();
}

fn master_url(s: &Sluice, o: &FileOrigin, variant: &str, keys: &str) -> String {
    let d = enc(&o.url(&format!("{variant}/manifest.mpd")));
    s.url(&format!("/proxy/mpd/manifest.m3u8?d={d}&{keys}"))
}

/// The media playlists of a master, video first.
async fn media_playlists(master: &str) -> Vec<String> {
    let mut out = Vec::new();
    for uri in uris(&text(master).await) {
        out.push(text(&uri).await);
    }
    out.sort_by_key(|p| !p.contains("video"));
    out
}

/// Fetches a media playlist's map and segments through sluice and writes them to one file.
async fn download_track(playlist: &str, file: &Path) {
    let mut all = Vec::new();
    for uri in uris(playlist) {
        all.extend_from_slice(&bytes(&uri).await);
    }
    std::fs::write(file, all).unwrap();
}

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

// === playlists ===

#[tokio::test]
async fn master_and_media_playlists_are_exact() {
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let s = Sluice::start(test_config()).await;
    let master = text(&master_url(&s, &o, "cenc", &hex_keys())).await;
    let keys = format!("key_id={VIDEO_KID}%2C{AUDIO_KID}&key={VIDEO_KEY}%2C{AUDIO_KEY}");
    let mpd = enc(&o.url("cenc/manifest.mpd"));
    let base = format!("http://{}/proxy/mpd/playlist.m3u8?d={mpd}", s.addr);
    let want = format!(
        "#EXTM3U\n#EXT-X-VERSION:6\n#EXT-X-INDEPENDENT-SEGMENTS\n\
         #EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\",NAME=\"1\",DEFAULT=YES,AUTOSELECT=YES,\
         CHANNELS=\"1\",URI=\"{base}&profile_id=0_1_56543&{keys}\"\n\
         #EXT-X-STREAM-INF:BANDWIDTH=200263,RESOLUTION=160x90,FRAME-RATE=25.000,\
         CODECS=\"avc1.4d400b,mp4a.40.2\",AUDIO=\"audio\"\n\
         {base}&profile_id=1_0_143720&{keys}\n"
    );
    assert_eq!(master, want);

    let video = text(&format!("{base}&profile_id=1_0_143720&{keys}")).await;
    let init = enc(&o.url("cenc/video/init.mp4"));
    let seg = |n: u32| {
        format!(
            "http://{}/proxy/mpd/segment.mp4?init_url={init}&segment_url={}&use_map=true\
             &mime_type=video%2Fmp4&is_live=false&{keys}",
            s.addr,
            enc(&o.url(&format!("cenc/video/{n}.m4s")))
        )
    };
    let want = format!(
        "#EXTM3U\n#EXT-X-VERSION:6\n#EXT-X-TARGETDURATION:1\n#EXT-X-MEDIA-SEQUENCE:1\n\
         #EXT-X-PLAYLIST-TYPE:VOD\n#EXT-X-INDEPENDENT-SEGMENTS\n\
         #EXT-X-MAP:URI=\"http://{}/proxy/mpd/init.mp4?init_url={init}&mime_type=video%2Fmp4\
         &is_live=false&{keys}\"\n\
         #EXTINF:1.000,\n{}\n#EXTINF:1.000,\n{}\n#EXT-X-ENDLIST\n",
        s.addr,
        seg(1),
        seg(2)
    );
    assert_eq!(video, want);
}

/// An MPD past 256 KiB is parsed on the blocking pool: the same master playlist as the small one.
#[tokio::test]
async fn a_large_mpd_gives_the_same_playlist() {
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let small = to_static(&std::fs::read_to_string(fixtures().join("cenc/manifest.mpd")).unwrap());
    let padding = format!("<!-- {} -->", "x".repeat(300 * 1024));
    let large = small.replacen("<Period", &format!("{padding}<Period"), 1);
    assert!(large.len() > 300 * 1024);
    o.put("large/manifest.mpd", large.as_bytes());
    let s = Sluice::start(test_config()).await;
    let want = text(&master_url(&s, &o, "cenc", &hex_keys())).await;
    let got = text(&master_url(&s, &o, "large", &hex_keys())).await;
    let want = want.replace("cenc%2Fmanifest.mpd", "large%2Fmanifest.mpd");
    assert!(got.starts_with("#EXTM3U"), "{got}");
    assert_eq!(got, want);
}

// === decryption ===

async fn check_decrypted_tracks(variant: &str) {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    o.put_package(variant);
    let s = Sluice::start(test_config()).await;
    let playlists = media_playlists(&master_url(&s, &o, variant, &hex_keys())).await;
    assert_eq!(playlists.len(), 2);
    for (playlist, kind) in playlists.iter().zip(["v", "a"]) {
        let file = tmp(&format!("dash-{variant}-{kind}.mp4"));
        download_track(playlist, &file).await;
        check_frames(file.to_str().unwrap(), kind).await;
    }
}

#[tokio::test]
async fn cenc_init_and_segments_decode_to_the_source_frames() {
    check_decrypted_tracks("cenc").await;
}

#[tokio::test]
async fn cbcs_init_and_segments_decode_to_the_source_frames() {
    check_decrypted_tracks("cbcs").await;
}

#[tokio::test]
async fn chunked_segments_decrypt_every_fragment() {
    check_decrypted_tracks("cbcs-chunked").await;
    check_decrypted_tracks("cenc-chunked").await;
}

#[tokio::test]
async fn ffmpeg_plays_the_sluice_master_playlist() {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let s = Sluice::start(test_config()).await;
    let url = master_url(&s, &o, "cenc", &hex_keys());
    check_frames(&url, "v").await;
    check_frames(&url, "a").await;
}

#[tokio::test]
async fn segment_without_map_carries_its_init() {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    o.put_package("cbcs");
    let s = Sluice::start(test_config()).await;
    // The shape MediaFlow gives on-demand playlists: no use_map, init + segment in each body.
    let mut all = Vec::new();
    for n in 1..=2 {
        let url = s.url(&format!(
            "/proxy/mpd/segment.mp4?init_url={}&segment_url={}&mime_type=video/mp4&{}",
            enc(&o.url("cbcs/video/init.mp4")),
            enc(&o.url(&format!("cbcs/video/{n}.m4s"))),
            hex_keys()
        ));
        let body = bytes(&url).await;
        assert_eq!(&body[4..8], b"ftyp");
        let init_len = bytes(&s.url(&format!(
            "/proxy/mpd/init.mp4?init_url={}&{}",
            enc(&o.url("cbcs/video/init.mp4")),
            hex_keys()
        )))
        .await
        .len();
        all.extend_from_slice(if n == 1 { &body } else { &body[init_len..] });
    }
    let file = tmp("dash-nomap.mp4");
    std::fs::write(&file, all).unwrap();
    check_frames(file.to_str().unwrap(), "v").await;
}

/// One file per track (init, a `sidx`, then the fragments) addressed by SegmentBase.
fn put_segment_base(o: &FileOrigin) {
    let mut mpd = String::from(
        "<?xml version=\"1.0\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" \
         xmlns:cenc=\"urn:mpeg:cenc:2013\" type=\"static\" mediaPresentationDuration=\"PT2S\">\
         <Period>",
    );
    for (track, timescale, kid, codecs) in [
        (
            "video",
            12800u32,
            "6d76f25c-b17f-5e16-b8ea-ef6bbf582d8e",
            "avc1.4d400b",
        ),
        (
            "audio",
            48000,
            "1fba7ed0-2bb8-5aa8-b8c0-dbf0d1ac2e7a",
            "mp4a.40.2",
        ),
    ] {
        let dir = fixtures().join("cenc").join(track);
        let init = std::fs::read(dir.join("init.mp4")).unwrap();
        let mut fragments = Vec::new();
        for n in 1..=2 {
            let seg = std::fs::read(dir.join(format!("{n}.m4s"))).unwrap();
            fragments.push((top_boxes_from(&seg, b"moof"), sidx_duration(&seg)));
        }
        let sidx = sidx_box(timescale, &fragments);
        let mut file = init.clone();
        file.extend_from_slice(&sidx);
        for (f, _) in &fragments {
            file.extend_from_slice(f);
        }
        o.put(&format!("base/{track}.mp4"), &file);
        let (a, b) = (init.len(), init.len() + sidx.len() - 1);
        mpd.push_str(&format!(
            "<AdaptationSet id=\"{track}\" contentType=\"{track}\" mimeType=\"{track}/mp4\">\
             <ContentProtection schemeIdUri=\"urn:mpeg:dash:mp4protection:2011\" value=\"cenc\" \
             cenc:default_KID=\"{kid}\"/>\
             <Representation id=\"r\" bandwidth=\"100000\" codecs=\"{codecs}\" width=\"160\" \
             height=\"90\"><BaseURL>{track}.mp4</BaseURL>\
             <SegmentBase indexRange=\"{a}-{b}\"><Initialization range=\"0-{}\"/></SegmentBase>\
             </Representation></AdaptationSet>",
            a - 1
        ));
    }
    mpd.push_str("</Period></MPD>");
    o.put("base/manifest.mpd", mpd.as_bytes());
}

/// The bytes of `data` from its first `kind` box on.
fn top_boxes_from(data: &[u8], kind: &[u8; 4]) -> Vec<u8> {
    let mut at = 0;
    while at + 8 <= data.len() {
        let size = u32::from_be_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        if &data[at + 4..at + 8] == kind {
            return data[at..].to_vec();
        }
        at += size;
    }
    panic!("no {kind:?} box");
}

/// The subsegment duration recorded in a segment's own `sidx`.
fn sidx_duration(seg: &[u8]) -> u32 {
    let sidx = top_boxes_from(seg, b"sidx");
    // version 0: header 8, version/flags 4, reference_ID 4, timescale 4, ept 4, first_offset 4,
    // reserved 2, count 2, then reference (4) and duration (4).
    u32::from_be_bytes(sidx[36..40].try_into().unwrap())
}

fn sidx_box(timescale: u32, fragments: &[(Vec<u8>, u32)]) -> Vec<u8> {
    let mut body = vec![0, 0, 0, 0]; // version 0, flags
    body.extend_from_slice(&1u32.to_be_bytes()); // reference_ID
    body.extend_from_slice(&timescale.to_be_bytes());
    body.extend_from_slice(&0u32.to_be_bytes()); // earliest_presentation_time
    body.extend_from_slice(&0u32.to_be_bytes()); // first_offset
    body.extend_from_slice(&0u16.to_be_bytes());
    body.extend_from_slice(&(fragments.len() as u16).to_be_bytes());
    for (bytes, duration) in fragments {
        body.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        body.extend_from_slice(&duration.to_be_bytes());
        body.extend_from_slice(&0x9000_0000u32.to_be_bytes()); // starts with SAP type 1
    }
    let mut out = ((body.len() + 8) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(b"sidx");
    out.extend_from_slice(&body);
    out
}

#[tokio::test]
async fn segment_base_tracks_use_the_sidx_and_decode() {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    put_segment_base(&o);
    let s = Sluice::start(test_config()).await;
    let master = master_url(&s, &o, "base", &hex_keys());
    let playlists = media_playlists(&master).await;
    assert!(playlists[0].contains("segment_range="), "{}", playlists[0]);
    for (playlist, kind) in playlists.iter().zip(["v", "a"]) {
        assert_eq!(uris(playlist).len(), 3, "map + 2 fragments: {playlist}");
        let file = tmp(&format!("dash-base-{kind}.mp4"));
        download_track(playlist, &file).await;
        check_frames(file.to_str().unwrap(), kind).await;
    }
    // The sidx, init and fragment ranges all come from the slice cache: the file (well under one
    // 1 MiB slice) was fetched once, with a slice `Range`.
    let hits = o.hits("base/video.mp4");
    assert!(
        hits.len() == 1
            && hits
                .iter()
                .all(|h| h.range.as_deref() == Some("bytes=0-1048575")),
        "{hits:?}"
    );
    check_frames(&master, "v").await;
}

#[tokio::test]
async fn live_mpd_becomes_a_sliding_playlist_that_decrypts() {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    // The packager's live MPD, with its clock moved to 20 s ago so both segments are in the window.
    let mpd = std::fs::read_to_string(fixtures().join("cenc/manifest.mpd")).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let at = mpd.find("availabilityStartTime=\"").unwrap() + "availabilityStartTime=\"".len();
    let end = at + mpd[at..].find('"').unwrap();
    let mut live = mpd.clone();
    live.replace_range(
        at..end,
        &sluice_media::dash::format_datetime((now - 20.0).floor()),
    );
    o.put("cenc/live.mpd", live.as_bytes());
    let s = Sluice::start(test_config()).await;
    let master = s.url(&format!(
        "/proxy/mpd/manifest.m3u8?d={}&{}",
        enc(&o.url("cenc/live.mpd")),
        hex_keys()
    ));
    let playlists = media_playlists(&master).await;
    for (playlist, kind) in playlists.iter().zip(["v", "a"]) {
        assert!(!playlist.contains("#EXT-X-ENDLIST"), "{playlist}");
        assert!(playlist.contains("#EXT-X-START:TIME-OFFSET=-18,PRECISE=YES"));
        assert!(playlist.contains("#EXT-X-PROGRAM-DATE-TIME:"));
        assert!(playlist.contains("is_live=true"));
        let file = tmp(&format!("dash-live-{kind}.mp4"));
        download_track(playlist, &file).await;
        check_frames(file.to_str().unwrap(), kind).await;
    }
}

#[tokio::test]
async fn head_and_metrics() {
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let s = Sluice::start(test_config()).await;
    let url = master_url(&s, &o, "cenc", &hex_keys());
    let r = support::request("HEAD", &url, &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/vnd.apple.mpegurl");
    assert!(r.body.unwrap().is_empty());
    // The alias without the extension, served from the cached MPD.
    text(&url.replace("manifest.m3u8", "manifest")).await;
    assert_eq!(o.hits("cenc/manifest.mpd").len(), 1);
    let metrics = text(&s.url("/metrics")).await;
    for family in [
        "sluice_media_cache_hits_total{kind=\"mpd\"} 1",
        "sluice_media_cache_misses_total{kind=\"mpd\"} 1",
        "sluice_cache_tier_bytes{tier=\"memory\"} ",
        "sluice_media_prefetches_total ",
        "sluice_media_decrypt_seconds_count ",
    ] {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
}

// === keys ===

#[tokio::test]
async fn protected_mpd_without_key_names_the_kids() {
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let s = Sluice::start(test_config()).await;
    for endpoint in ["manifest.m3u8", "playlist.m3u8"] {
        let url = s.url(&format!(
            "/proxy/mpd/{endpoint}?d={}&profile_id=1_0_143720",
            enc(&o.url("cenc/manifest.mpd"))
        ));
        let r = get(&url).await;
        assert_eq!(r.status, 400);
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(
            body.contains(VIDEO_KID) && body.contains(AUDIO_KID),
            "{body}"
        );
    }
}

#[tokio::test]
async fn a_track_without_its_key_is_refused_with_its_kid() {
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let s = Sluice::start(test_config()).await;
    // Two keys, neither for audio.
    let keys = format!(
        "key_id={VIDEO_KID},00000000000000000000000000000001&key={VIDEO_KEY},\
         00000000000000000000000000000001"
    );
    for endpoint in ["init.mp4", "segment.mp4"] {
        let url = s.url(&format!(
            "/proxy/mpd/{endpoint}?init_url={}&segment_url={}&use_map=true&{keys}",
            enc(&o.url("cenc/audio/init.mp4")),
            enc(&o.url("cenc/audio/1.m4s")),
        ));
        let r = get(&url).await;
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert_eq!(r.status, 400, "{body}");
        assert!(body.contains(AUDIO_KID), "{body}");
    }
}

#[tokio::test]
async fn base64_keys_and_kid_key_lists_decrypt_the_same() {
    let o = FileOrigin::start().await;
    o.put_package("cbcs");
    let s = Sluice::start(test_config()).await;
    let b64 = |hex: &str| {
        let raw: Vec<u8> = (0..16)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
    };
    let forms = [
        hex_keys(),
        format!(
            "key_id={},{}&key={},{}",
            b64(VIDEO_KID),
            b64(AUDIO_KID),
            b64(VIDEO_KEY),
            b64(AUDIO_KEY)
        ),
        format!("key={VIDEO_KID}:{VIDEO_KEY},{AUDIO_KID}:{AUDIO_KEY}"),
    ];
    let mut bodies = Vec::new();
    for keys in &forms {
        let url = s.url(&format!(
            "/proxy/mpd/segment.mp4?init_url={}&segment_url={}&use_map=true&{keys}",
            enc(&o.url("cbcs/audio/init.mp4")),
            enc(&o.url("cbcs/audio/2.m4s")),
        ));
        bodies.push(bytes(&url).await);
    }
    let raw = std::fs::read(fixtures().join("cbcs/audio/2.m4s")).unwrap();
    assert_ne!(bodies[0][..], raw[..], "decrypted");
    assert!(bodies.iter().all(|b| *b == bodies[0]));
}

#[tokio::test]
async fn token_mode_keeps_keys_and_password_out_of_child_urls() {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let mut config = test_config();
    config.auth.api_password = "server-pw".into();
    let s = Sluice::start(config).await;
    let master = format!(
        "{}&api_password=server-pw&h_referer=https%3A%2F%2Fsite.example%2F",
        master_url(&s, &o, "cenc", &hex_keys())
    );
    let text_master = text(&master).await;
    let mut all = text_master.clone();
    for playlist in media_playlists(&master).await {
        all.push_str(&playlist);
    }
    for secret in [VIDEO_KEY, AUDIO_KEY, VIDEO_KID, "server-pw", "site.example"] {
        assert!(!all.contains(secret), "{secret} in a child URL:\n{all}");
    }
    assert!(uris(&all).iter().all(|u| u.contains("/_token_")));
    // The token children still play, and the referer went upstream with every fetch.
    check_frames(&master, "v").await;
    let hits = o.hits("cenc/video/2.m4s");
    assert!(!hits.is_empty());
    assert!(hits.iter().all(|h| h
        .headers
        .get("referer")
        .is_some_and(|v| v == "https://site.example/")));
}

// === cache and prefetch ===

#[tokio::test]
async fn concurrent_requests_for_one_segment_fetch_it_once() {
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let s = Sluice::start(test_config()).await;
    o.delay_ms.store(300, Ordering::SeqCst);
    let url = s.url(&format!(
        "/proxy/mpd/segment.mp4?init_url={}&segment_url={}&use_map=true&{}",
        enc(&o.url("cenc/video/init.mp4")),
        enc(&o.url("cenc/video/1.m4s")),
        hex_keys()
    ));
    let (a, b) = tokio::join!(bytes(&url), bytes(&url));
    assert_eq!(a, b);
    assert_eq!(o.hits("cenc/video/1.m4s").len(), 1);
    assert_eq!(o.hits("cenc/video/init.mp4").len(), 1);
    // And a later request is a cache hit.
    assert_eq!(bytes(&url).await, a);
    assert_eq!(o.hits("cenc/video/1.m4s").len(), 1);
}

/// Twenty viewers asking for one protected segment at once, and one more later, cost one
/// decryption: the clear segment is shared (it was one per viewer). Another key list is
/// decrypted on its own.
#[tokio::test]
async fn viewers_of_one_segment_share_one_decryption() {
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let s = Sluice::start(test_config()).await;
    let url = |keys: &str| {
        s.url(&format!(
            "/proxy/mpd/segment.mp4?init_url={}&segment_url={}&use_map=true&{keys}",
            enc(&o.url("cenc/video/init.mp4")),
            enc(&o.url("cenc/video/1.m4s")),
        ))
    };
    let decrypts = || async {
        let metrics = text(&s.url("/metrics")).await;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("sluice_media_decrypt_seconds_count "))
            .map(|v| v.trim().parse::<u64>().unwrap())
            .unwrap_or(0)
    };
    let shared = url(&hex_keys());
    let bodies = futures_util::future::join_all((0..20).map(|_| bytes(&shared))).await;
    assert!(bodies.iter().all(|b| *b == bodies[0]));
    assert_eq!(bytes(&shared).await, bodies[0]);
    assert_eq!(decrypts().await, 1);
    // The video key alone (the audio KID is not needed here): another key list, its own run.
    let own = url(&format!("key_id={VIDEO_KID}&key={VIDEO_KEY}"));
    assert_eq!(bytes(&own).await, bodies[0]);
    assert_eq!(decrypts().await, 2);
}

/// The same for `segment.ts`: twenty viewers of one protected segment as MPEG-TS cost one
/// decryption and one remux between them (both were once per viewer), and get the same bytes.
#[tokio::test]
async fn viewers_of_one_ts_segment_share_one_decryption_and_remux() {
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let s = Sluice::start(test_config()).await;
    let url = s.url(&format!(
        "/proxy/mpd/segment.ts?init_url={}&segment_url={}&{}",
        enc(&o.url("cenc/video/init.mp4")),
        enc(&o.url("cenc/video/1.m4s")),
        hex_keys()
    ));
    let count = |name: &'static str| {
        let s = &s;
        async move {
            let metrics = text(&s.url("/metrics")).await;
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().parse::<u64>().unwrap())
                .unwrap_or(0)
        }
    };
    let bodies = futures_util::future::join_all((0..20).map(|_| bytes(&url))).await;
    assert!(bodies[0].len() > 1000 && bodies[0].len() % 188 == 0);
    assert_eq!(bodies[0][0], 0x47);
    assert!(bodies.iter().all(|b| *b == bodies[0]));
    assert_eq!(bytes(&url).await, bodies[0]);
    assert_eq!(count("sluice_media_decrypt_seconds_count ").await, 1);
    assert_eq!(count("sluice_media_remux_seconds_count ").await, 1);
    assert_eq!(o.hits("cenc/video/1.m4s").len(), 1);
}

/// A clear on-demand MPD of `n` one-second segments with distinct bodies.
fn put_clear_series(o: &FileOrigin, n: u32) {
    o.put(
        "series/manifest.mpd",
        format!(
            "<?xml version=\"1.0\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" \
             type=\"static\" mediaPresentationDuration=\"PT{n}S\"><Period>\
             <AdaptationSet id=\"1\" mimeType=\"video/mp4\">\
             <SegmentTemplate timescale=\"1000\" duration=\"1000\" startNumber=\"1\" \
             media=\"seg-$Number$.m4s\" initialization=\"init.mp4\"/>\
             <Representation id=\"v\" bandwidth=\"1000\" codecs=\"avc1.4d400b\" width=\"160\" \
             height=\"90\"/></AdaptationSet></Period></MPD>"
        )
        .as_bytes(),
    );
    for i in 1..=n {
        o.put(
            &format!("series/seg-{i}.m4s"),
            format!("segment {i}").as_bytes(),
        );
    }
}

#[tokio::test]
async fn prefetch_fetches_the_next_segments_once() {
    let o = FileOrigin::start().await;
    put_clear_series(&o, 8);
    let s = Sluice::start(test_config()).await;
    let playlist = text(&s.url(&format!(
        "/proxy/mpd/playlist.m3u8?d={}&profile_id=1_v_1000&h_x-test=yes",
        enc(&o.url("series/manifest.mpd"))
    )))
    .await;
    let segments: Vec<String> = uris(&playlist)
        .into_iter()
        .filter(|u| u.contains("segment.mp4"))
        .collect();
    assert_eq!(segments.len(), 8);
    assert_eq!(bytes(&segments[0]).await, "segment 1");
    let depth = 3; // media.prefetch_segments default
    let fetched = |i: u32| o.hits(&format!("series/seg-{i}.m4s")).len();
    for _ in 0..100 {
        if (2..=depth + 1).all(|i| fetched(i) == 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 2..=depth + 1 {
        assert_eq!(fetched(i), 1, "segment {i} prefetched once");
    }
    assert_eq!(fetched(depth + 2), 0, "no further than the prefetch depth");
    // Prefetch sent the player's headers.
    for i in 1..=depth + 1 {
        let hits = o.hits(&format!("series/seg-{i}.m4s"));
        assert!(hits[0].headers.get("x-test").is_some_and(|v| v == "yes"));
    }
    for (i, url) in segments.iter().enumerate().skip(1).take(depth as usize) {
        assert_eq!(bytes(url).await, format!("segment {}", i + 1));
        assert_eq!(
            fetched(i as u32 + 1),
            1,
            "segment {} served from the cache",
            i + 1
        );
    }
    let mut counts = HashMap::new();
    for hit in o.log.lock().unwrap().iter() {
        *counts.entry(hit.path.clone()).or_insert(0) += 1;
    }
    assert!(counts.values().all(|&c| c == 1), "{counts:?}");
}

/// A HEAD on a segment of a registered playlist answers with the GET's head but fetches nothing
/// ahead (as the HLS segment path); the GET that follows does. `sluice_media_prefetches_total`
/// counts fetches ahead as they start, before the answer is sent.
#[tokio::test]
async fn head_on_a_segment_fetches_nothing_ahead() {
    let o = FileOrigin::start().await;
    put_clear_series(&o, 8);
    let s = Sluice::start(test_config()).await;
    let playlist = text(&s.url(&format!(
        "/proxy/mpd/playlist.m3u8?d={}&profile_id=1_v_1000",
        enc(&o.url("series/manifest.mpd"))
    )))
    .await;
    let segments: Vec<String> = uris(&playlist)
        .into_iter()
        .filter(|u| u.contains("segment.mp4"))
        .collect();
    let prefetches = || async {
        text(&s.url("/metrics"))
            .await
            .lines()
            .find_map(|l| l.strip_prefix("sluice_media_prefetches_total "))
            .map(|v| v.trim().parse::<u64>().unwrap())
            .unwrap_or(0)
    };
    let fetched = |i: u32| o.hits(&format!("series/seg-{i}.m4s")).len();
    let r = support::request("HEAD", &segments[0], &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-length"], "9");
    assert!(r.body.unwrap().is_empty());
    assert_eq!(prefetches().await, 0);
    // A GET of segment 5 fetches 6, 7 and 8 ahead; by the time they have arrived, anything the
    // HEAD had started would have too.
    assert_eq!(bytes(&segments[4]).await, "segment 5");
    assert_eq!(prefetches().await, 3);
    for _ in 0..100 {
        if (6..=8).all(|i| fetched(i) == 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!((6..=8).map(fetched).collect::<Vec<_>>(), [1, 1, 1]);
    assert_eq!(fetched(1), 1, "the HEAD's own segment");
    assert_eq!((2..=4).map(fetched).collect::<Vec<_>>(), [0, 0, 0]);
}

// === errors ===

#[tokio::test]
async fn bad_mpd_and_upstream_errors() {
    let o = FileOrigin::start().await;
    o.put("bad.mpd", b"<html>not an mpd</html>");
    let s = Sluice::start(test_config()).await;
    let r = get(&s.url(&format!(
        "/proxy/mpd/manifest.m3u8?d={}",
        enc(&o.url("bad.mpd"))
    )))
    .await;
    assert_eq!(r.status, 502);
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(body.contains("not an MPD"), "{body}");
    let r = get(&s.url(&format!(
        "/proxy/mpd/manifest.m3u8?d={}",
        enc(&o.url("missing.mpd"))
    )))
    .await;
    assert_eq!(r.status, 404);
    let r = get(&s.url(&format!(
        "/proxy/mpd/segment.mp4?segment_url={}&use_map=true",
        enc(&o.url("missing.m4s"))
    )))
    .await;
    assert_eq!(r.status, 404);
    let r = get(&s.url("/proxy/mpd/segment.mp4?init_url=x")).await;
    assert_eq!(r.status, 400);
}

// === MPEG-TS remux (remux_to_ts) ===

/// Downloads every URI of a media playlist, checking each body is MPEG-TS on its own (whole
/// packets, PAT then PMT first) and the continuity counters run on across segments requested in
/// order.
async fn download_ts_track(playlist: &str, file: &Path) {
    use sluice_media::mpegts::{parse_header, Continuity, PACKET_LEN};
    assert!(!playlist.contains("#EXT-X-MAP"), "{playlist}");
    let mut all = Vec::new();
    let uris = uris(playlist);
    assert_eq!(uris.len(), 2, "{playlist}");
    let mut cc = Continuity::default();
    for uri in uris {
        assert!(uri.contains("/proxy/mpd/segment.ts?"), "{uri}");
        let r = get(&uri).await;
        assert_eq!(r.status, 200, "{uri}");
        assert_eq!(r.headers["content-type"], "video/mp2t");
        let body = r.body.unwrap();
        assert_eq!(body.len() % PACKET_LEN, 0);
        let pids: Vec<u16> = body
            .chunks(PACKET_LEN)
            .map(|p| parse_header(p).expect("TS packet").pid)
            .collect();
        assert_eq!(&pids[..2], &[0, 0x1000], "PAT, PMT open every segment");
        assert!(pids[2..].iter().all(|&p| p == 0x100), "one elementary PID");
        assert_eq!(cc.check(&body), 0, "continuity up to the end of {uri}");
        all.extend_from_slice(&body);
    }
    std::fs::write(file, all).unwrap();
}

/// The codec names ffprobe reports for `file` (it lists the program's streams and then the
/// file's, so each name once).
fn probe_codecs(file: &Path) -> String {
    let out = Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-show_entries",
            "stream=codec_name",
            "-of",
            "csv=p=0",
        ])
        .arg(file)
        .output()
        .expect("ffprobe runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect();
    names.dedup();
    names.join(",")
}

async fn check_remuxed_tracks(variant: &str) {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    o.put_package(variant);
    let s = Sluice::start(test_config()).await;
    let fmp4 = media_playlists(&master_url(&s, &o, variant, &hex_keys())).await;
    let keys = format!("{}&remux_to_ts=1", hex_keys());
    let master = master_url(&s, &o, variant, &keys);
    let ts = media_playlists(&master).await;
    assert_eq!(ts.len(), 2);
    for ((ts, fmp4), (kind, codec)) in ts.iter().zip(&fmp4).zip([("v", "h264"), ("a", "aac")]) {
        let ts_file = tmp(&format!("remux-{variant}-{kind}.ts"));
        download_ts_track(ts, &ts_file).await;
        assert_eq!(probe_codecs(&ts_file), codec);
        let mp4_file = tmp(&format!("remux-{variant}-{kind}.mp4"));
        download_track(fmp4, &mp4_file).await;
        let (a, b) = (ts_file.clone(), mp4_file.clone());
        let (got, want) = tokio::task::spawn_blocking(move || {
            (
                frame_hashes(a.to_str().unwrap(), kind),
                frame_hashes(b.to_str().unwrap(), kind),
            )
        })
        .await
        .unwrap();
        assert_eq!(
            got, want,
            "{variant} {kind}: TS frames equal the fMP4 path's"
        );
        check_frames(ts_file.to_str().unwrap(), kind).await;
    }
    // A player given only the master (ffmpeg's HLS demuxer here) plays the TS renditions.
    check_frames(&master, "v").await;
    check_frames(&master, "a").await;
}

#[tokio::test]
async fn cenc_remuxed_to_ts_decodes_like_the_fmp4_path() {
    check_remuxed_tracks("cenc").await;
}

#[tokio::test]
async fn cbcs_remuxed_to_ts_decodes_like_the_fmp4_path() {
    check_remuxed_tracks("cbcs").await;
}

#[tokio::test]
async fn remux_default_comes_from_config_and_requests_override_it() {
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let mut config = test_config();
    config.media.remux_to_ts = true;
    let s = Sluice::start(config).await;
    let on = media_playlists(&master_url(&s, &o, "cenc", &hex_keys())).await;
    assert!(
        uris(&on[0]).iter().all(|u| u.contains("/segment.ts?")),
        "{}",
        on[0]
    );
    let off = format!("{}&remux_to_ts=0", hex_keys());
    let off = media_playlists(&master_url(&s, &o, "cenc", &off)).await;
    assert!(off[0].contains("#EXT-X-MAP"), "{}", off[0]);
    assert!(uris(&off[0])
        .iter()
        .skip(1)
        .all(|u| u.contains("/segment.mp4?")));
}

#[tokio::test]
async fn remux_refusals_are_clear() {
    let o = FileOrigin::start().await;
    o.put_package("cenc");
    let s = Sluice::start(test_config()).await;
    let seg = enc(&o.url("cenc/video/1.m4s"));
    let init = enc(&o.url("cenc/video/init.mp4"));
    // No init: the remuxer has no track configuration.
    let r = get(&s.url(&format!("/proxy/mpd/segment.ts?segment_url={seg}"))).await;
    assert_eq!(r.status, 400);
    // Encrypted and no keys.
    let r = get(&s.url(&format!(
        "/proxy/mpd/segment.ts?init_url={init}&segment_url={seg}"
    )))
    .await;
    assert_eq!(r.status, 400);
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(body.contains("pass key_id and key"), "{body}");
    // Not a segment at all.
    o.put("junk.m4s", b"\x00\x00\x00\x10moofjunkjunk");
    let r = get(&s.url(&format!(
        "/proxy/mpd/segment.ts?init_url={init}&segment_url={}&{}",
        enc(&o.url("junk.m4s")),
        hex_keys()
    )))
    .await;
    assert_eq!(r.status, 502);
}

#[tokio::test]
async fn clear_hevc_ac3_eac3_remux_decodes_like_the_fmp4_path() {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    let src = fixtures().join("../remux/hevc-ac3");
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        o.put(
            &format!("clear/{name}"),
            &std::fs::read(entry.path()).unwrap(),
        );
    }
    let s = Sluice::start(test_config()).await;
    // The master offers one audio rendition (AC-3); the E-AC-3 one is asked for by profile.
    let playlists = |extra: &'static str| {
        let master = master_url(&s, &o, "clear", extra);
        async move {
            let mut uris = uris(&text(&master).await);
            assert_eq!(uris.len(), 2, "video and one audio rendition");
            uris.sort_by_key(|u| !u.contains("profile_id=0_0_"));
            let eac3 = uris[1].replace("profile_id=1_1_96000", "profile_id=2_2_96000");
            assert_ne!(eac3, uris[1]);
            uris.push(eac3);
            let mut out = Vec::new();
            for uri in uris {
                out.push(text(&uri).await);
            }
            out
        }
    };
    let fmp4 = playlists("").await;
    let ts = playlists("remux_to_ts=1").await;
    let mut codecs = Vec::new();
    for (i, (ts, fmp4)) in ts.iter().zip(&fmp4).enumerate() {
        let kind = if i == 0 { "v" } else { "a" };
        let ts_file = tmp(&format!("remux-clear-{i}.ts"));
        let mut all = Vec::new();
        for uri in uris(ts) {
            assert!(uri.contains("/proxy/mpd/segment.ts?"), "{uri}");
            all.extend_from_slice(&bytes(&uri).await);
        }
        std::fs::write(&ts_file, all).unwrap();
        codecs.push(probe_codecs(&ts_file));
        let mp4_file = tmp(&format!("remux-clear-{i}.mp4"));
        download_track(fmp4, &mp4_file).await;
        let (a, b) = (ts_file.clone(), mp4_file.clone());
        let (got, want) = tokio::task::spawn_blocking(move || {
            (
                frame_hashes(a.to_str().unwrap(), kind),
                frame_hashes(b.to_str().unwrap(), kind),
            )
        })
        .await
        .unwrap();
        assert!(!got.is_empty());
        assert_eq!(got, want, "rendition {i}: TS frames equal the fMP4 path's");
    }
    codecs.sort();
    assert_eq!(codecs, ["ac3", "eac3", "hevc"]);
}

#[tokio::test]
async fn token_mode_ts_children_are_scoped_sealed_tokens_that_play() {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    o.put_package("cbcs");
    let mut config = test_config();
    config.auth.api_password = "server-pw".into();
    let s = Sluice::start(config).await;
    let master = format!(
        "{}&api_password=server-pw",
        master_url(&s, &o, "cbcs", &format!("{}&remux_to_ts=1", hex_keys()))
    );
    let playlists = media_playlists(&master).await;
    let segments: Vec<String> = playlists.iter().flat_map(|p| uris(p)).collect();
    assert_eq!(segments.len(), 4);
    for uri in &segments {
        assert!(
            uri.contains("/_token_") && uri.ends_with("/proxy/mpd/segment.ts"),
            "{uri}"
        );
        for secret in [VIDEO_KEY, AUDIO_KEY, "server-pw"] {
            assert!(!uri.contains(secret));
        }
    }
    // The remuxed children play through the tokens alone.
    check_frames(&master, "v").await;
    check_frames(&master, "a").await;
    // A segment.ts token opens the DASH family only, and its parameters are fixed.
    let (prefix, _) = segments[0].split_once("/proxy/mpd/").unwrap();
    let elsewhere = get(&format!(
        "{prefix}/proxy/stream?d={}",
        enc(&o.url("cbcs/video/1.m4s"))
    ))
    .await;
    assert_eq!(elsewhere.status, 401);
    let added = get(&format!("{}?remux_to_ts=0", segments[0])).await;
    assert_eq!(added.status, 401);
}

/// One Period of [`live_periods_mpd`]: id, start (seconds), first `$Number$`, segments.
type LivePeriod<'a> = (&'a str, u32, u32, u32);

/// A live MPD of clear one-file-per-segment tracks whose Periods all restart `$Number$` at
/// `start_number`: `(id, start secs, start number, segments)`; segment `N` of Period `p` holds
/// the text `p-N`, its init `p-init`.
fn live_periods_mpd(ast: &str, periods: &[LivePeriod]) -> String {
    let mut out = format!(
        "<?xml version=\"1.0\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" type=\"dynamic\" \
         availabilityStartTime=\"{ast}\" minimumUpdatePeriod=\"PT1S\" \
         timeShiftBufferDepth=\"PT600S\">"
    );
    for (id, start, first, count) in periods {
        out.push_str(&format!(
            "<Period id=\"{id}\" start=\"PT{start}S\"><AdaptationSet id=\"1\" \
             mimeType=\"video/mp4\"><SegmentTemplate timescale=\"1\" startNumber=\"{first}\" \
             media=\"{id}-$Number$.m4s\" initialization=\"{id}-init.mp4\"><SegmentTimeline>\
             <S t=\"0\" d=\"2\" r=\"{}\"/></SegmentTimeline></SegmentTemplate>\
             <Representation id=\"v\" bandwidth=\"1000\" codecs=\"avc1.4d400b\" width=\"160\" \
             height=\"90\"/></AdaptationSet></Period>",
            count - 1
        ));
    }
    out.push_str("</MPD>");
    out
}

/// A live MPD adds a Period that restarts `$Number$` at 1, then its first Period leaves the
/// window, then another Period arrives. Over those reloads a player must see a media sequence
/// that never goes back, the same number for the same segment on every reload, one
/// `EXT-X-DISCONTINUITY` and a new `EXT-X-MAP` at each Period, and a discontinuity sequence that
/// counts the Periods gone from the window.
#[tokio::test]
async fn a_live_period_that_restarts_numbers_never_sends_the_media_sequence_back() {
    let o = FileOrigin::start().await;
    for (id, first, count) in [("a", 50, 5), ("b", 1, 5), ("c", 1, 2)] {
        o.put(
            &format!("live/{id}-init.mp4"),
            format!("{id}-init").as_bytes(),
        );
        for n in first..first + count {
            o.put(
                &format!("live/{id}-{n}.m4s"),
                format!("{id}-{n}").as_bytes(),
            );
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let ast = sluice_media::dash::format_datetime((now - 120.0).floor());
    let mut config = test_config();
    config.media.mpd_live_playlist_depth = 4;
    // Start 4 s behind the edge: the start offset must not widen the four-segment window.
    config.media.live_start_offset = -4.0;
    let s = Sluice::start(config).await;
    let playlist = s.url(&format!(
        "/proxy/mpd/playlist.m3u8?d={}&profile_id=1_v_1000",
        enc(&o.url("live/manifest.mpd"))
    ));
    // (Periods in the MPD, then what the playlist must list: media sequence, discontinuity
    // sequence, and the segments with a discontinuity before each `|`.)
    let updates: [(&[LivePeriod], u64, u64, &str); 4] = [
        (&[("a", 80, 50, 5)], 51, 0, "a-51 a-52 a-53 a-54"),
        (
            &[("a", 80, 50, 5), ("b", 90, 1, 3)],
            54,
            0,
            "a-54 | b-1 b-2 b-3",
        ),
        (&[("b", 90, 1, 5)], 56, 1, "b-2 b-3 b-4 b-5"),
        (
            &[("b", 90, 1, 5), ("c", 100, 1, 2)],
            58,
            1,
            "b-4 b-5 | c-1 c-2",
        ),
    ];
    for (i, (periods, sequence, discontinuity, listed)) in updates.into_iter().enumerate() {
        o.put(
            "live/manifest.mpd",
            live_periods_mpd(&ast, periods).as_bytes(),
        );
        if i > 0 {
            // Past the MPD's minimumUpdatePeriod, so sluice fetches the new one.
            tokio::time::sleep(Duration::from_millis(2100)).await;
        }
        let m3u8 = text(&playlist).await;
        let tag = |name: &str| {
            m3u8.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.parse::<u64>().unwrap())
        };
        assert_eq!(
            tag("#EXT-X-MEDIA-SEQUENCE:"),
            Some(sequence),
            "update {i}:\n{m3u8}"
        );
        assert_eq!(
            tag("#EXT-X-DISCONTINUITY-SEQUENCE:").unwrap_or(0),
            discontinuity,
            "update {i}:\n{m3u8}"
        );
        // What each line points at, fetched through sluice.
        let mut seen = Vec::new();
        let mut maps = Vec::new();
        for line in m3u8.lines() {
            if line == "#EXT-X-DISCONTINUITY" {
                seen.push("|".to_string());
            } else if let Some(rest) = line.strip_prefix("#EXT-X-MAP:URI=\"") {
                let body = bytes(rest.trim_end_matches('"')).await;
                maps.push(String::from_utf8(body.to_vec()).unwrap());
            } else if !line.starts_with('#') && !line.is_empty() {
                let body = bytes(line).await;
                seen.push(String::from_utf8(body.to_vec()).unwrap());
            }
        }
        assert_eq!(seen.join(" "), listed, "update {i}:\n{m3u8}");
        let periods_listed: Vec<String> = listed
            .split(' ')
            .filter(|s| *s != "|")
            .map(|s| format!("{}-init", &s[..1]))
            .fold(Vec::new(), |mut v, p| {
                if v.last() != Some(&p) {
                    v.push(p);
                }
                v
            });
        assert_eq!(maps, periods_listed, "update {i}: one map per Period");
        // The same segment has the same number on every reload: a-N is N, b-N is 54 + N, c-N
        // is 59 + N (each Period continues one past the last segment before it).
        for (at, name) in seen.iter().filter(|s| *s != "|").enumerate() {
            let (period, n) = name.split_once('-').unwrap();
            let n: u64 = n.parse().unwrap();
            let want = match period {
                "a" => n,
                "b" => 54 + n,
                _ => 59 + n,
            };
            assert_eq!(sequence + at as u64, want, "update {i}: {name}");
        }
    }
}

/// A clear on-demand MPD of `n` one-second segments whose template starts with `prefix`.
fn put_templated(o: &FileOrigin, name: &str, prefix: &str, n: u32) {
    o.put(
        &format!("{name}/manifest.mpd"),
        format!(
            "<?xml version=\"1.0\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" \
             type=\"static\" mediaPresentationDuration=\"PT{n}S\"><Period>\
             <AdaptationSet id=\"1\" mimeType=\"video/mp4\">\
             <SegmentTemplate timescale=\"1000\" duration=\"1000\" startNumber=\"1\" \
             media=\"{prefix}$Number$.m4s\" initialization=\"init.mp4\"/>\
             <Representation id=\"v\" bandwidth=\"1000\" codecs=\"avc1.4d400b\" width=\"160\" \
             height=\"90\"/></AdaptationSet></Period></MPD>"
        )
        .as_bytes(),
    );
}

/// A long SegmentTemplate@media times many segments (each URL under 8 KiB, 70 MB in all), and one
/// URL over 8 KiB: each a quick 502 booked to the origin, and a normal MPD served after.
#[tokio::test]
async fn long_templates_are_refused_as_the_origins_fault() {
    let o = FileOrigin::start().await;
    put_clear_series(&o, 8);
    put_templated(&o, "wide", &"w".repeat(7000), 10_000);
    put_templated(&o, "long", &"l".repeat(9000), 4);
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    let s = Sluice::start(config).await;
    let playlist = |name: &str| {
        s.url(&format!(
            "/proxy/mpd/playlist.m3u8?d={}&profile_id=1_v_1000&api_password=pw",
            enc(&o.url(&format!("{name}/manifest.mpd")))
        ))
    };
    let before = text(&playlist("series")).await;
    assert_eq!(uris(&before).len(), 9, "{before}");
    for (name, why) in [
        ("wide", "segment URLs over 33554432 bytes in all"),
        ("long", "a segment URL longer than 8192 bytes"),
    ] {
        let started = std::time::Instant::now();
        let r = get(&playlist(name)).await;
        let body = r.body.unwrap();
        let took = started.elapsed();
        assert_eq!(r.status, 502, "{name}: {} bytes in {took:?}", body.len());
        assert!(took < Duration::from_secs(5), "{took:?}");
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["kind"], "bad_mpd", "{json}");
        assert!(json["error"].as_str().unwrap().contains(why), "{json}");
    }
    let metrics = text(&s.url("/metrics?api_password=pw")).await;
    let series = "sluice_errors_total{side=\"upstream\",kind=\"bad_mpd\"} 2";
    assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    // Children are reused tokens: the same playlist, byte for byte.
    assert_eq!(text(&playlist("series")).await, before);
}

/// A live `$Time$` MPD of 100,000 distinct `S@d` (1.6 MB, each about 2 s): its media playlist is
/// the newest segments, numbered by the longest duration, and is built on the blocking pool: a
/// timer on this test's one runtime thread (which also runs sluice) keeps ticking meanwhile.
#[tokio::test]
async fn a_large_mpd_playlist_is_built_off_the_runtime() {
    const N: u64 = 100_000;
    let o = FileOrigin::start().await;
    let timeline: String = (0..N)
        .map(|i| format!("<S d=\"{}\"/>", 2_000_000 + i))
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let ast = sluice_media::dash::format_datetime((now - 3.0 * 86_400.0).floor());
    let mpd = format!(
        "<?xml version=\"1.0\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" type=\"dynamic\" \
         availabilityStartTime=\"{ast}\" minimumUpdatePeriod=\"PT60S\" \
         timeShiftBufferDepth=\"P10D\"><Period id=\"p\" start=\"PT0S\"><AdaptationSet id=\"1\" \
         mimeType=\"video/mp4\"><SegmentTemplate timescale=\"1000000\" media=\"$Time$.m4s\" \
         initialization=\"init.mp4\"><SegmentTimeline>{timeline}</SegmentTimeline>\
         </SegmentTemplate><Representation id=\"v\" bandwidth=\"1000\" codecs=\"avc1.4d400b\" \
         width=\"160\" height=\"90\"/></AdaptationSet></Period></MPD>"
    );
    assert!(mpd.len() > 1_500_000);
    o.put("many/manifest.mpd", mpd.as_bytes());
    let s = Sluice::start(test_config()).await;
    let playlist = s.url(&format!(
        "/proxy/mpd/playlist.m3u8?d={}&profile_id=1_v_1000",
        enc(&o.url("many/manifest.mpd"))
    ));
    let (m3u8, took, worst) = stall_while(text(&playlist)).await;
    // Segment i starts at 2,000,000 i + i (i - 1) / 2; the longest lasts 2,099,999.
    let time = |i: u64| 2_000_000 * i + i * (i - 1) / 2;
    let listed = m3u8.matches("#EXTINF").count() as u64;
    assert!((1..100).contains(&listed), "{m3u8}");
    let first = N - listed;
    let sequence = format!("#EXT-X-MEDIA-SEQUENCE:{}\n", time(first) / 2_099_999);
    assert!(m3u8.contains(&sequence), "{sequence}{m3u8}");
    let last = uris(&m3u8).pop().unwrap();
    assert!(
        last.contains(&enc(&format!("{}.m4s", time(N - 1)))),
        "{last}"
    );
    // Built inline, the runtime stalls for the build: about half the request in a debug build;
    // on the blocking pool, a few hundredths of it. A ratio, so a slower machine slows both.
    assert!(
        worst < took / 4,
        "the runtime stalled {worst:?} of {took:?}"
    );
    // Counting 100,000 distinct durations one by one against each other takes tens of seconds.
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// A static MPD of under 1 KB whose one `<S d="1" r="99999"/>` lists 100,000 segments: its
/// media playlist (100,000 proxy URLs) is built on the blocking pool though the MPD is tiny.
#[tokio::test]
async fn a_tiny_mpd_of_many_segments_is_built_off_the_runtime() {
    const N: usize = 100_000;
    let o = FileOrigin::start().await;
    let mpd = format!(
        "<?xml version=\"1.0\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" type=\"static\" \
         mediaPresentationDuration=\"PT{N}S\"><Period><AdaptationSet id=\"1\" \
         mimeType=\"video/mp4\"><SegmentTemplate timescale=\"1\" media=\"$Number$.m4s\" \
         initialization=\"init.mp4\"><SegmentTimeline><S t=\"0\" d=\"1\" r=\"{}\"/>\
         </SegmentTimeline></SegmentTemplate><Representation id=\"v\" bandwidth=\"1000\" \
         codecs=\"avc1.4d400b\" width=\"160\" height=\"90\"/></AdaptationSet></Period></MPD>",
        N - 1
    );
    assert!(mpd.len() < 1024, "{}", mpd.len());
    o.put("tiny/manifest.mpd", mpd.as_bytes());
    let s = Sluice::start(test_config()).await;
    let playlist = s.url(&format!(
        "/proxy/mpd/playlist.m3u8?d={}&profile_id=1_v_1000",
        enc(&o.url("tiny/manifest.mpd"))
    ));
    let (m3u8, took, worst) = stall_while(text(&playlist)).await;
    assert_eq!(m3u8.matches("#EXTINF:1.000,").count(), N);
    assert!(
        m3u8.ends_with("#EXT-X-ENDLIST\n"),
        "{}",
        &m3u8[m3u8.len() - 200..]
    );
    let listed = uris(&m3u8);
    // The map, then every segment in order.
    assert_eq!(listed.len(), N + 1);
    assert!(listed[0].contains(&enc("init.mp4")), "{}", listed[0]);
    assert!(listed[1].contains(&enc("/1.m4s")), "{}", listed[1]);
    assert!(
        listed[N].contains(&enc(&format!("/{N}.m4s"))),
        "{}",
        listed[N]
    );
    // Built inline, the runtime stalls for the whole build, most of the request; built on the
    // blocking pool, only for the answer's handling around it.
    assert!(
        worst < took / 4,
        "the runtime stalled {worst:?} of {took:?}"
    );
}

// === credentials ===

/// Every sluice URL in a rewritten MPD (`media`, `initialization`, `BaseURL`...), unescaped, with
/// the template's `$Number$` made segment 1.
fn mpd_links(s: &Sluice, mpd: &str) -> Vec<String> {
    let prefix = s.url("/");
    let mut out = Vec::new();
    let mut rest = mpd;
    while let Some(at) = rest.find(&prefix) {
        let tail = &rest[at..];
        let end = tail.find(['"', '<']).unwrap_or(tail.len());
        out.push(tail[..end].replace("&amp;", "&").replace("$Number$", "1"));
        rest = &tail[end..];
    }
    out
}

/// An MPD on origin A whose tracks are on origin B (a BaseURL, an absolute SegmentTemplate, a
/// SegmentBase file whose `sidx` sluice fetches itself): the viewer's `h_authorization` and
/// `h_cookie` reach A and never B, through HLS playlists, DASH out, inits, segments, the sidx
/// and fetches ahead; B still gets every other `h_*`.
#[tokio::test]
async fn a_viewers_credentials_never_reach_another_origin_the_mpd_names() {
    let (a, b) = (FileOrigin::start().await, FileOrigin::start().await);
    // SegmentBase: the video file (and its sidx) on B, the audio on A.
    put_segment_base(&a);
    put_segment_base(&b);
    let mpd = std::fs::read_to_string(a.root.path().join("base/manifest.mpd")).unwrap();
    let video_on_b = format!("<BaseURL>{}</BaseURL>", b.url("base/video.mp4"));
    let split = mpd.replace("<BaseURL>video.mp4</BaseURL>", &video_on_b);
    assert_ne!(split, mpd);
    a.put("base/split.mpd", split.as_bytes());
    // SegmentTemplate: every segment on B by a Period BaseURL, or by an absolute template under
    // a BaseURL on A.
    for o in [&a, &b] {
        put_clear_series(o, 3);
        o.put("series/init.mp4", b"init");
    }
    let series = std::fs::read_to_string(a.root.path().join("series/manifest.mpd")).unwrap();
    let far = series.replace(
        "<Period>",
        &format!("<Period><BaseURL>{}</BaseURL>", b.url("series/")),
    );
    let absolute = series
        .replace(
            "media=\"seg-$Number$.m4s\"",
            &format!("media=\"{}seg-$Number$.m4s\"", b.url("series/")),
        )
        .replace("initialization=\"init.mp4\"", "");
    assert!(far != series && absolute != series);
    a.put("series/far.mpd", far.as_bytes());
    a.put("series/absolute.mpd", absolute.as_bytes());

    let s = Sluice::start(test_config()).await;
    let creds = "h_authorization=Bearer%20X&h_Cookie=session%3D1&h_referer=r";
    let mut fetched = 0;
    for (mpd, keys) in [
        ("base/split.mpd", hex_keys()),
        ("series/far.mpd", String::new()),
        ("series/absolute.mpd", String::new()),
    ] {
        let query = format!("d={}&{keys}&{creds}", enc(&a.url(mpd)));
        // HLS: the master, its media playlists, their maps and segments.
        let master = s.url(&format!("/proxy/mpd/manifest.m3u8?{query}"));
        for playlist in media_playlists(&master).await {
            for uri in uris(&playlist) {
                bytes(&uri).await;
                fetched += 1;
            }
        }
        // DASH out: the rewritten MPD and every init and segment it links.
        let out = text(&s.url(&format!("/proxy/mpd/manifest.mpd?{query}"))).await;
        for link in mpd_links(&s, &out) {
            bytes(&link).await;
            fetched += 1;
        }
    }
    assert!(fetched >= 12, "{fetched} links");
    // Fetches ahead have had their turn.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for path in [
        "base/video.mp4",
        "series/init.mp4",
        "series/seg-1.m4s",
        "series/seg-2.m4s",
    ] {
        assert!(!b.hits(path).is_empty(), "B never served {path}");
    }
    let b_hits = b.log.lock().unwrap().clone();
    for hit in &b_hits {
        let (auth, cookie) = (hit.headers.get("authorization"), hit.headers.get("cookie"));
        assert!(
            auth.is_none() && cookie.is_none(),
            "B got the viewer's credentials for {} {:?}: {auth:?} {cookie:?}",
            hit.path,
            hit.range
        );
        assert_eq!(
            hit.headers.get("referer").map(|v| v.as_bytes()),
            Some(&b"r"[..]),
            "{}",
            hit.path
        );
    }
    // A's MPDs and audio track still get them.
    for path in [
        "base/split.mpd",
        "series/far.mpd",
        "series/absolute.mpd",
        "base/audio.mp4",
    ] {
        let hits = a.hits(path);
        assert!(!hits.is_empty(), "A never served {path}");
        for hit in hits {
            assert_eq!(
                hit.headers.get("authorization").map(|v| v.as_bytes()),
                Some(&b"Bearer X"[..]),
                "{path}"
            );
            assert_eq!(
                hit.headers.get("cookie").map(|v| v.as_bytes()),
                Some(&b"session=1"[..]),
                "{path}"
            );
        }
    }
}

/// A track whose segments are all on another origin than the MPD is registered for the headers
/// its links carry (without the viewer's credentials), so its segments still fetch ahead.
#[tokio::test]
async fn a_track_on_another_origin_still_fetches_ahead() {
    let (a, b) = (FileOrigin::start().await, FileOrigin::start().await);
    put_clear_series(&b, 4);
    let series = std::fs::read_to_string(b.root.path().join("series/manifest.mpd")).unwrap();
    let far = series.replace(
        "<Period>",
        &format!("<Period><BaseURL>{}</BaseURL>", b.url("series/")),
    );
    a.put("far.mpd", far.as_bytes());
    let s = Sluice::start(test_config()).await;
    let playlist = text(&s.url(&format!(
        "/proxy/mpd/playlist.m3u8?d={}&profile_id=1_v_1000&h_authorization=Bearer%20X",
        enc(&a.url("far.mpd"))
    )))
    .await;
    let segments: Vec<String> = uris(&playlist)
        .into_iter()
        .filter(|u| u.contains("segment.mp4"))
        .collect();
    assert_eq!(segments.len(), 4);
    assert_eq!(bytes(&segments[0]).await, "segment 1");
    for _ in 0..100 {
        if !b.hits("series/seg-2.m4s").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let hits = b.hits("series/seg-2.m4s");
    assert_eq!(hits.len(), 1, "segment 2 fetched ahead once");
    assert!(hits[0].headers.get("authorization").is_none());
}

/// An MPD and its init segments on A, which wants the viewer's cookie, and the media segments on
/// B (a CDN): each fetch carries the credentials decided for its own URL. The init a segment
/// request fetches to decrypt (fMP4, MPEG-TS, DASH out) goes to A with the cookie; the segment
/// goes to B without it.
#[tokio::test]
async fn an_init_on_the_viewers_origin_keeps_its_credentials_beside_segments_elsewhere() {
    let (a, b) = (FileOrigin::start().await, FileOrigin::start().await);
    a.put_package("cenc");
    b.put_package("cenc");
    let mpd = std::fs::read_to_string(a.root.path().join("cenc/manifest.mpd")).unwrap();
    let split = mpd
        .replace(
            "media=\"video/",
            &format!("media=\"{}", b.url("cenc/video/")),
        )
        .replace(
            "media=\"audio/",
            &format!("media=\"{}", b.url("cenc/audio/")),
        );
    assert_ne!(split, mpd);
    a.put("cenc/split.mpd", split.as_bytes());
    let s = Sluice::start(test_config()).await;
    let creds = "h_authorization=Bearer%20X&h_Cookie=session%3D1&h_referer=r";
    let query = format!("d={}&{}&{creds}", enc(&a.url("cenc/split.mpd")), hex_keys());
    let mut segments = 0;
    for remux in ["0", "1"] {
        let master = s.url(&format!(
            "/proxy/mpd/manifest.m3u8?{query}&remux_to_ts={remux}"
        ));
        for playlist in media_playlists(&master).await {
            for uri in uris(&playlist) {
                segments += uri.contains("/segment.") as usize;
                bytes(&uri).await;
            }
        }
    }
    let out = text(&s.url(&format!("/proxy/mpd/manifest.mpd?{query}"))).await;
    for link in mpd_links(&s, &out) {
        segments += link.contains("/out/") as usize;
        bytes(&link).await;
    }
    assert!(segments >= 8, "{segments} segment links");
    for path in ["cenc/video/1.m4s", "cenc/audio/2.m4s"] {
        assert!(!b.hits(path).is_empty(), "B never served {path}");
    }
    for hit in b.log.lock().unwrap().iter() {
        let (auth, cookie) = (hit.headers.get("authorization"), hit.headers.get("cookie"));
        assert!(
            auth.is_none() && cookie.is_none(),
            "B got the viewer's credentials for {}: {auth:?} {cookie:?}",
            hit.path
        );
    }
    for path in [
        "cenc/split.mpd",
        "cenc/video/init.mp4",
        "cenc/audio/init.mp4",
    ] {
        let hits = a.hits(path);
        assert!(!hits.is_empty(), "A never served {path}");
        for hit in hits {
            assert_eq!(
                hit.headers.get("cookie").map(|v| v.as_bytes()),
                Some(&b"session=1"[..]),
                "{path} fetched without the viewer's cookie"
            );
        }
    }
}
