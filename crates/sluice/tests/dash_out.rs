//! DASH out (`/proxy/mpd/manifest.mpd`) against a running sluice and a file origin holding the
//! Shaka Packager ClearKey fixtures: ffmpeg's own DASH demuxer reads the rewritten MPD from
//! sluice and decodes exactly the clear source's frames; nothing in the MPD points at the origin
//! or carries a key or the password; live MPDs are fetched again; bad paths are clear 400s.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::{enc, get, sha256, test_config, Sluice};
use tokio::net::TcpListener;

const VIDEO_KID: &str = "6d76f25cb17f5e16b8eaef6bbf582d8e";
const VIDEO_KEY: &str = "ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41";
const AUDIO_KID: &str = "1fba7ed02bb85aa8b8c0dbf0d1ac2e7a";
const AUDIO_KEY: &str = "4c2d8a6e3e5b9a7c1d0f2e4b6a8c9d1e";

// === a file origin that logs the paths it serves ===

struct FileOrigin {
    addr: SocketAddr,
    root: tempfile::TempDir,
    paths: Arc<Mutex<Vec<String>>>,
}

impl FileOrigin {
    async fn start() -> FileOrigin {
        let root = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let paths = Arc::new(Mutex::new(Vec::new()));
        let (dir, log) = (root.path().to_path_buf(), paths.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (dir, log) = (dir.clone(), log.clone());
                let svc = service_fn(move |req: Request<Incoming>| {
                    let path = req.uri().path().to_owned();
                    log.lock().unwrap().push(path.clone());
                    let range = req.headers().get("range").cloned();
                    let body = std::fs::read(dir.join(path.trim_start_matches('/')));
                    async move { Ok::<_, Infallible>(file_response(body, range)) }
                });
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FileOrigin { addr, root, paths }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    fn put(&self, path: &str, bytes: &[u8]) {
        let file = self.root.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, bytes).unwrap();
    }

    /// One fixture package (`cenc`, `cbcs`) under `variant/`, with `mpd` as its manifest.
    fn put_package(&self, variant: &str, mpd: &str) {
        for track in ["video", "audio"] {
            for entry in std::fs::read_dir(fixtures().join(variant).join(track)).unwrap() {
                let entry = entry.unwrap();
                let name = entry.file_name().into_string().unwrap();
                let bytes = std::fs::read(entry.path()).unwrap();
                self.put(&format!("{variant}/{track}/{name}"), &bytes);
            }
        }
        self.put(&format!("{variant}/manifest.mpd"), mpd.as_bytes());
    }

    fn count(&self, path: &str) -> usize {
        let want = format!("/{path}");
        self.paths
            .lock()
            .unwrap()
            .iter()
            .filter(|p| **p == want)
            .count()
    }
}

fn file_response(
    body: std::io::Result<Vec<u8>>,
    range: Option<http::HeaderValue>,
) -> Response<Full<Bytes>> {
    let Ok(body) = body else {
        let mut r = Response::new(Full::new(Bytes::from_static(b"no such file")));
        *r.status_mut() = StatusCode::NOT_FOUND;
        return r;
    };
    let len = body.len();
    let slice = range
        .as_ref()
        .and_then(|r| r.to_str().ok()?.strip_prefix("bytes=")?.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .filter(|&(a, b)| a <= b && a < len);
    match slice {
        Some((a, b)) => {
            let b = b.min(len - 1);
            Response::builder()
                .status(StatusCode::PARTIAL_CONTENT)
                .header("content-range", format!("bytes {a}-{b}/{len}"))
                .body(Full::new(Bytes::from(body[a..=b].to_vec())))
                .unwrap()
        }
        None => Response::new(Full::new(Bytes::from(body))),
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sluice-media/tests/fixtures/drm")
}

fn packaged_mpd(variant: &str) -> String {
    std::fs::read_to_string(fixtures().join(variant).join("manifest.mpd")).unwrap()
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
        out = set_attr(&out, attr, None);
    }
    out
}

/// `attr` set to `value`, or removed.
fn set_attr(xml: &str, attr: &str, value: Option<&str>) -> String {
    let needle = format!(" {attr}=\"");
    let Some(at) = xml.find(&needle) else {
        return xml.to_owned();
    };
    let end = xml[at + needle.len()..].find('"').unwrap() + at + needle.len() + 1;
    let mut out = xml.to_owned();
    out.replace_range(
        at..end,
        &value.map_or(String::new(), |v| format!(" {attr}=\"{v}\"")),
    );
    out
}

fn keys() -> String {
    format!("key_id={VIDEO_KID},{AUDIO_KID}&key={VIDEO_KEY},{AUDIO_KEY}")
}

fn mpd_url(s: &Sluice, o: &FileOrigin, variant: &str, extra: &str) -> String {
    let d = enc(&o.url(&format!("{variant}/manifest.mpd")));
    s.url(&format!("/proxy/mpd/manifest.mpd?d={d}{extra}"))
}

async fn fetch_mpd(url: &str) -> String {
    let r = get(url).await;
    let body = r.body.unwrap();
    assert_eq!(r.status, 200, "{url}: {}", String::from_utf8_lossy(&body));
    assert_eq!(r.headers["content-type"], "application/dash+xml");
    String::from_utf8(body.to_vec()).unwrap()
}

// === ffmpeg as the DASH player ===

fn require_ffmpeg() {
    assert!(
        Command::new("ffmpeg").arg("-version").output().is_ok(),
        "ffmpeg is required: apt-get update && apt-get install -y ffmpeg"
    );
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
        .map(|l| l.rsplit(',').next().unwrap().trim().to_owned())
        .collect()
}

/// ffmpeg reads the MPD at `url` (from sluice) and must decode the clear source's frames: video
/// exactly, audio after the AAC priming frame a DASH init without an edit list exposes.
async fn assert_plays_source(url: &str) {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        for (kind, want, extra) in [("v", "source-video.md5", 0), ("a", "source-audio.md5", 1)] {
            let want: Vec<String> = std::fs::read_to_string(fixtures().join(want))
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect();
            let got = frame_hashes(&url, kind);
            assert_eq!(got.len(), want.len() + extra, "{kind}: frame count");
            assert!(
                got[extra..] == want[..],
                "{kind}: frames differ from the source"
            );
        }
    })
    .await
    .unwrap();
}

// === tests ===

async fn plays_decrypted(variant: &str) {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    o.put_package(variant, &to_static(&packaged_mpd(variant)));
    let s = Sluice::start(test_config()).await;
    let url = mpd_url(&s, &o, variant, &format!("&{}", keys()));
    let mpd = fetch_mpd(&url).await;
    let origin = o.addr.to_string();
    for gone in ["ContentProtection", "pssh", "BaseURL", origin.as_str()] {
        assert!(!mpd.contains(gone), "{gone} in the rewritten MPD:\n{mpd}");
    }
    assert_eq!(mpd.matches("<SegmentTemplate ").count(), 2, "{mpd}");
    assert!(mpd.contains("/proxy/mpd/out/$Number$/-/segment.mp4?"));
    assert_plays_source(&url).await;
    // Every segment came through sluice's cache once, whatever ffmpeg asked twice.
    assert_eq!(o.count(&format!("{variant}/video/1.m4s")), 1);
}

#[tokio::test]
async fn cenc_dash_out_plays_decrypted_in_ffmpeg() {
    plays_decrypted("cenc").await;
}

#[tokio::test]
async fn cbcs_dash_out_plays_decrypted_in_ffmpeg() {
    plays_decrypted("cbcs").await;
}

#[tokio::test]
async fn without_keys_protection_and_bytes_pass_through() {
    let o = FileOrigin::start().await;
    o.put_package("cenc", &to_static(&packaged_mpd("cenc")));
    let s = Sluice::start(test_config()).await;
    let mpd = fetch_mpd(&mpd_url(&s, &o, "cenc", "")).await;
    assert_eq!(mpd.matches("<ContentProtection ").count(), 4, "{mpd}");
    // The first video segment through the rewritten template is the origin's file, unchanged.
    let at = mpd.find("/proxy/mpd/out/").unwrap();
    let start = mpd[..at].rfind('"').unwrap() + 1;
    let end = at + mpd[at..].find('"').unwrap();
    let template = mpd[start..end].replace("&amp;", "&");
    let first = template.replace("$Number$", "1");
    let r = get(&first).await;
    assert_eq!(r.status, 200);
    let raw = std::fs::read(fixtures().join("cenc/video/1.m4s")).unwrap();
    assert_eq!(sha256(&r.body.unwrap()), sha256(&raw));
    assert_eq!(r.headers["content-type"], "video/mp4");
}

#[tokio::test]
async fn token_mode_hides_origin_keys_and_password_and_still_plays() {
    require_ffmpeg();
    let o = FileOrigin::start().await;
    o.put_package("cenc", &to_static(&packaged_mpd("cenc")));
    let mut config = test_config();
    config.auth.api_password = "server-pw-for-dash-out".into();
    let s = Sluice::start(config).await;
    let url = mpd_url(
        &s,
        &o,
        "cenc",
        &format!("&{}&api_password=server-pw-for-dash-out", keys()),
    );
    let mpd = fetch_mpd(&url).await;
    let origin = o.addr.to_string();
    for secret in [
        VIDEO_KEY,
        AUDIO_KEY,
        VIDEO_KID,
        "server-pw-for-dash-out",
        origin.as_str(),
    ] {
        assert!(!mpd.contains(secret), "{secret} in the MPD:\n{mpd}");
    }
    assert!(mpd.contains("/_token_"));
    assert!(
        mpd.contains("/proxy/mpd/out/$Number$/-/segment.mp4\""),
        "{mpd}"
    );
    assert_plays_source(&url).await;

    // A template token fixes its segment URL: a holder cannot point it elsewhere.
    let at = mpd.find("/proxy/mpd/out/").unwrap();
    let start = mpd[..at].rfind('"').unwrap() + 1;
    let first = mpd[start..at + "/proxy/mpd/out/".len()].to_owned() + "1/-/segment.mp4";
    assert_eq!(get(&first).await.status, 200);
    let evil = format!("{first}?segment_url={}", enc("http://127.0.0.1:1/x"));
    assert_eq!(get(&evil).await.status, 401);
    let outside = first.replace("/proxy/mpd/out/1/-/segment.mp4", "/proxy/stream");
    assert_eq!(get(&outside).await.status, 401);
}

#[tokio::test]
async fn live_mpd_is_fetched_again_after_its_update_period() {
    let o = FileOrigin::start().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let ast = sluice_media::dash::format_datetime((now - 20.0).floor());
    let live = set_attr(&packaged_mpd("cenc"), "availabilityStartTime", Some(&ast));
    let live = set_attr(&live, "minimumUpdatePeriod", Some("PT1S"));
    o.put_package("cenc", &live);
    let s = Sluice::start(test_config()).await;
    let url = mpd_url(&s, &o, "cenc", &format!("&{}", keys()));
    let first = fetch_mpd(&url).await;
    assert!(first.contains("type=\"dynamic\"") && first.contains("minimumUpdatePeriod=\"PT1S\""));
    assert!(
        first.contains("<S t=\"0\" d=\"12800\" r=\"1\"/>"),
        "{first}"
    );
    // The packager adds a segment; a player refreshing after the update period sees it.
    o.put(
        "cenc/manifest.mpd",
        live.replace(
            "<S t=\"0\" d=\"12800\" r=\"1\"/>",
            "<S t=\"0\" d=\"12800\" r=\"2\"/>",
        )
        .as_bytes(),
    );
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let second = fetch_mpd(&url).await;
    assert!(
        second.contains("<S t=\"0\" d=\"12800\" r=\"2\"/>"),
        "{second}"
    );
}

#[tokio::test]
async fn bad_requests_are_clear() {
    let o = FileOrigin::start().await;
    o.put_package("cenc", &to_static(&packaged_mpd("cenc")));
    o.put("cenc/not.mpd", b"<html>not an mpd</html>");
    let s = Sluice::start(test_config()).await;
    let tpl = format!(
        "seg_base={}&seg_template=%24Number%24.m4s&rep_id=0&bandwidth=1",
        enc(&o.url("cenc/video/"))
    );
    for (path, status, says) in [
        ("/proxy/mpd/out/x/-/segment.mp4", 400, "decimal"),
        (
            "/proxy/mpd/out/-/-/segment.mp4",
            400,
            "needs a segment number",
        ),
        ("/proxy/mpd/out/1/-/other.mp4", 400, "segment.mp4"),
    ] {
        let r = get(&s.url(&format!("{path}?{tpl}"))).await;
        let body = String::from_utf8_lossy(&r.body.unwrap()).into_owned();
        assert_eq!(r.status, status, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }
    let r = get(&s.url("/proxy/mpd/out/1/-/segment.mp4?rep_id=0")).await;
    assert_eq!(r.status, 400);
    let r = get(&s.url(&format!(
        "/proxy/mpd/manifest.mpd?d={}",
        enc(&o.url("cenc/not.mpd"))
    )))
    .await;
    assert_eq!(r.status, 502);
    // A segment through the template path, clear and as the origin has it.
    let r = get(&s.url(&format!("/proxy/mpd/out/2/-/segment.mp4?{tpl}"))).await;
    let raw = std::fs::read(fixtures().join("cenc/video/2.m4s")).unwrap();
    assert_eq!(sha256(&r.body.unwrap()), sha256(&raw));
}

/// A static MPD of 50,000 SegmentList segments (about 1.8 MB): every one is rewritten to a proxy
/// URL, and on the blocking pool: a timer on this test's one runtime thread (which also runs
/// sluice) keeps ticking meanwhile.
#[tokio::test]
async fn a_large_mpd_is_rewritten_off_the_runtime() {
    const N: usize = 50_000;
    let o = FileOrigin::start().await;
    let list: String = (0..N)
        .map(|i| format!("<SegmentURL media=\"seg/{i}.m4s\"/>"))
        .collect();
    let mpd = format!(
        "<?xml version=\"1.0\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" type=\"static\" \
         mediaPresentationDuration=\"PT{N}S\"><Period id=\"p\" start=\"PT0S\"><AdaptationSet \
         id=\"1\" mimeType=\"video/mp4\"><Representation id=\"v\" bandwidth=\"1000\" \
         codecs=\"avc1.4d400b\" width=\"160\" height=\"90\"><SegmentList timescale=\"1\" \
         duration=\"1\"><Initialization sourceURL=\"init.mp4\"/>{list}</SegmentList>\
         </Representation></AdaptationSet></Period></MPD>"
    );
    assert!(mpd.len() > 1_000_000);
    o.put("many/manifest.mpd", mpd.as_bytes());
    let s = Sluice::start(test_config()).await;
    let url = mpd_url(&s, &o, "many", "");
    let (out, took, worst) = support::stall_while(fetch_mpd(&url)).await;
    // Every segment is listed, in order, through sluice.
    let media: Vec<&str> = out
        .split("<SegmentURL media=\"")
        .skip(1)
        .map(|rest| &rest[..rest.find('"').unwrap()])
        .collect();
    assert_eq!(media.len(), N);
    for (i, m) in [(0, media[0]), (N - 1, media[N - 1])] {
        assert!(m.starts_with(&s.url("/proxy/")), "{m}");
        assert!(m.contains(&enc(&format!("seg/{i}.m4s"))), "{i}: {m}");
    }
    // Rewritten inline, the runtime stalls for the rewrite: most of the request in a debug
    // build. The ratio allows for a scheduler hiccup on a busy machine.
    assert!(
        worst < Duration::from_millis(150) || worst < took / 4,
        "the runtime stalled {worst:?} of {took:?}"
    );
}
