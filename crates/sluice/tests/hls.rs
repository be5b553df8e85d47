//! `/proxy/hls/*` against a file origin serving ffmpeg-made HLS (clear and AES-128) and
//! hand-written playlists: exact rewritten manifests, tokens, frame-exact playback through the
//! proxy, errors, options and auth.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_media::token::TokenKey;
use support::*;
use tokio::net::TcpListener;

// === fixtures ===

const KEY: [u8; 16] = *b"0123456789abcdef";

const MASTER: &str = r#"#EXTM3U
#EXT-X-VERSION:4
#EXT-X-INDEPENDENT-SEGMENTS
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID="aud",NAME="English",LANGUAGE="en",DEFAULT=YES,URI="audio/en.m3u8"
#EXT-X-MEDIA:TYPE=CLOSED-CAPTIONS,GROUP-ID="cc",NAME="CC1",INSTREAM-ID="CC1"
#EXT-X-STREAM-INF:BANDWIDTH=800000,RESOLUTION=640x360,CODECS="avc1.4d401e,mp4a.40.2",AUDIO="aud"
low/index.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=2500000,RESOLUTION=1280x720,CODECS="avc1.4d401f,mp4a.40.2",AUDIO="aud"
/vod/mid/index.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=5000000,RESOLUTION=1920x1080,CODECS="avc1.640028,mp4a.40.2",AUDIO="aud"
https://cdn.example.net/hi/index.m3u8
#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=90000,RESOLUTION=640x360,URI="low/iframes.m3u8"
"#;

const LIVE: &str =
    "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:1234\n\
#EXTINF:2.0,\nseg1234.ts\n#EXTINF:2.0,\nseg1235.ts\n";

/// Files made once per test run: ffmpeg HLS (clear and AES-128) plus hand-written ones.
fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Under the target directory, remade on every run.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hls-fixtures");
        let _ = std::fs::remove_dir_all(&dir);
        let clear = dir.join("clear");
        let aes = dir.join("aes");
        std::fs::create_dir_all(&clear).unwrap();
        std::fs::create_dir_all(&aes).unwrap();
        std::fs::write(aes.join("enc.key"), KEY).unwrap();
        std::fs::write(
            aes.join("keyinfo"),
            format!(
                "enc.key\n{}\n0123456789abcdef0123456789abcdef\n",
                aes.join("enc.key").display()
            ),
        )
        .unwrap();
        ffmpeg_hls(&clear, &[]);
        let keyinfo = aes.join("keyinfo").display().to_string();
        ffmpeg_hls(&aes, &["-hls_key_info_file", &keyinfo]);
        let put = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        put("vod/hd/master.m3u8", MASTER);
        put("live/index.m3u8", LIVE);
        put(
            "blocked/index.m3u8",
            "<!DOCTYPE html><html><body>Access denied</body></html>",
        );
        put("garbage/index.m3u8", "{\"not\": \"a playlist\"}");
        let long = format!("#EXTM3U\n{}", "#EXTINF:2.0,\nseg.ts\n".repeat(200));
        put("long/index.m3u8", &long);
        let media = std::fs::read_to_string(clear.join("index.m3u8")).unwrap();
        put("api/clear/live.mpegurl", &media);
        dir
    })
}

fn ffmpeg_hls(out: &Path, extra: &[&str]) {
    let status = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-y"])
        .args(["-f", "lavfi", "-i", "testsrc=size=160x120:rate=25"])
        .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
        .args([
            "-t", "8", "-c:v", "libx264", "-g", "25", "-pix_fmt", "yuv420p",
        ])
        .args(["-c:a", "aac", "-f", "hls", "-hls_time", "2"])
        .args(["-hls_playlist_type", "vod"])
        .args(extra)
        .arg("-hls_segment_filename")
        .arg(out.join("seg%d.ts"))
        .arg(out.join("index.m3u8"))
        .status()
        .expect("ffmpeg must be installed (scripts/test.sh installs it)");
    assert!(status.success(), "ffmpeg failed for {}", out.display());
}

// === origin ===

/// Serves the fixture directory with Range support; `/go/<path>` redirects to `/<path>`,
/// `/status/<n>` answers `n`. Records every request path.
struct FileOrigin {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<(String, http::HeaderMap)>>>,
}

impl FileOrigin {
    async fn start() -> FileOrigin {
        let root = fixtures().to_path_buf();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (root, log) = (root.clone(), log.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (root, log) = (root.clone(), log.clone());
                        async move {
                            let path = req.uri().path().to_string();
                            log.lock().unwrap().push((path, req.headers().clone()));
                            Ok::<_, Infallible>(serve_file(&root, &req))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FileOrigin { addr, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn seen(&self, path: &str) -> Vec<http::HeaderMap> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(p, _)| p == path)
            .map(|(_, h)| h.clone())
            .collect()
    }
}

fn serve_file(root: &Path, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if let Some(rest) = path.strip_prefix("/go/") {
        return Response::builder()
            .status(302)
            .header("location", format!("/{rest}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
    }
    if let Some(code) = path.strip_prefix("/status/") {
        return Response::builder()
            .status(code.split('.').next().unwrap().parse::<u16>().unwrap())
            .body(Full::new(Bytes::from_static(b"no")))
            .unwrap();
    }
    let Ok(body) = std::fs::read(root.join(path.trim_start_matches('/'))) else {
        return Response::builder()
            .status(404)
            .body(Full::new(Bytes::new()))
            .unwrap();
    };
    let ext = path.rsplit('.').next().unwrap_or("");
    let content_type = match ext {
        "m3u8" => "application/vnd.apple.mpegurl",
        "mpegurl" => "application/x-mpegurl",
        "ts" => "video/mp2t",
        _ => "application/octet-stream",
    };
    let len = body.len();
    let range = req
        .headers()
        .get("range")
        .and_then(|v| v.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| {
            let a: usize = a.parse().ok()?;
            let b: usize = if b.is_empty() {
                len - 1
            } else {
                b.parse().ok()?
            };
            (a <= b && b < len).then_some((a, b))
        });
    let builder = Response::builder()
        .header("content-type", content_type)
        .header("accept-ranges", "bytes");
    let (builder, body) = match range {
        Some((a, b)) => (
            builder
                .status(206)
                .header("content-range", format!("bytes {a}-{b}/{len}")),
            body[a..=b].to_vec(),
        ),
        None => (builder.status(200), body),
    };
    let head = req.method() == http::Method::HEAD;
    builder
        .header("content-length", body.len())
        .body(Full::new(if head { Bytes::new() } else { body.into() }))
        .unwrap()
}

// === helpers ===

fn manifest_url(s: &Sluice, d: &str, extra: &str) -> String {
    s.url(&format!("/proxy/hls/manifest.m3u8?d={}{extra}", enc(d)))
}

/// The plain (no password) child URL sluice writes.
fn child(s: &Sluice, endpoint: &str, d: &str, extra: &str) -> String {
    s.url(&format!("{endpoint}?d={}{extra}", enc(d)))
}

fn fixture_text(path: &str) -> String {
    std::fs::read_to_string(fixtures().join(path)).unwrap()
}

/// `playlist` with every URI line replaced by `map(uri)`.
fn map_uris(playlist: &str, mut map: impl FnMut(&str) -> String) -> String {
    playlist
        .lines()
        .map(|l| {
            if l.is_empty() || l.starts_with('#') {
                l.to_string()
            } else {
                map(l)
            }
        })
        .map(|l| l + "\n")
        .collect()
}

fn uri_lines(playlist: &str) -> Vec<String> {
    playlist
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

async fn text(url: &str) -> String {
    let r = get(url).await;
    let body = r.body.unwrap();
    assert_eq!(r.status, 200, "{url}: {}", String::from_utf8_lossy(&body));
    String::from_utf8(body.to_vec()).unwrap()
}

async fn framemd5(url: &str) -> String {
    let out = tokio::process::Command::new("ffmpeg")
        .args(["-v", "error", "-i", url, "-map", "0", "-f", "framemd5", "-"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "ffmpeg on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn token_of(url: &str) -> &str {
    let rest = url.split_once("/_token_").unwrap().1;
    rest.split_once('/').unwrap().0
}

async fn with_config(edit: impl FnOnce(&mut sluice::config::Config)) -> Sluice {
    let mut config = test_config();
    edit(&mut config);
    Sluice::start(config).await
}

// === exact manifests ===

#[tokio::test]
async fn master_is_rewritten_exactly_against_the_redirected_url() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let extra = "&h_referer=https%3A%2F%2Fsite.example%2F&r_x-only-here=1&rp_x-prop=2";
    let r = get(&manifest_url(
        &s,
        &origin.url("/go/vod/hd/master.m3u8"),
        extra,
    ))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/vnd.apple.mpegurl");
    assert_eq!(r.headers["cache-control"], "no-cache");
    assert_eq!(r.headers["x-only-here"], "1");
    assert_eq!(r.headers["x-prop"], "2");
    let carried = "&h_referer=https%3A%2F%2Fsite.example%2F&rp_x-prop=2";
    let m = |p: &str| child(&s, "/proxy/hls/manifest.m3u8", &origin.url(p), carried);
    let want = format!(
        r#"#EXTM3U
#EXT-X-VERSION:4
#EXT-X-INDEPENDENT-SEGMENTS
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID="aud",NAME="English",LANGUAGE="en",DEFAULT=YES,URI="{}"
#EXT-X-MEDIA:TYPE=CLOSED-CAPTIONS,GROUP-ID="cc",NAME="CC1",INSTREAM-ID="CC1"
#EXT-X-STREAM-INF:BANDWIDTH=800000,RESOLUTION=640x360,CODECS="avc1.4d401e,mp4a.40.2",AUDIO="aud"
{}
#EXT-X-STREAM-INF:BANDWIDTH=2500000,RESOLUTION=1280x720,CODECS="avc1.4d401f,mp4a.40.2",AUDIO="aud"
{}
#EXT-X-STREAM-INF:BANDWIDTH=5000000,RESOLUTION=1920x1080,CODECS="avc1.640028,mp4a.40.2",AUDIO="aud"
{}
#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=90000,RESOLUTION=640x360,URI="{}"
"#,
        m("/vod/hd/audio/en.m3u8"),
        m("/vod/hd/low/index.m3u8"),
        m("/vod/mid/index.m3u8"),
        child(
            &s,
            "/proxy/hls/manifest.m3u8",
            "https://cdn.example.net/hi/index.m3u8",
            carried
        ),
        m("/vod/hd/low/iframes.m3u8"),
    );
    assert_eq!(String::from_utf8(r.body.unwrap().to_vec()).unwrap(), want);
    // h_* went upstream, through the redirect.
    assert_eq!(
        origin.seen("/vod/hd/master.m3u8")[0]["referer"],
        "https://site.example/"
    );
}

#[tokio::test]
async fn ffmpeg_media_playlists_are_rewritten_exactly() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    for dir in ["clear", "aes"] {
        let d = origin.url(&format!("/{dir}/index.m3u8"));
        let got = text(&manifest_url(&s, &d, "&start_offset=-6&h_range=bytes%3D0-")).await;
        let original = fixture_text(&format!("{dir}/index.m3u8"));
        let mut want = map_uris(&original, |uri| {
            let seg = origin.url(&format!("/{dir}/{uri}"));
            child(&s, "/proxy/hls/segment.ts", &seg, "")
        });
        // An explicit start_offset is written even into VOD; children don't carry it.
        want = want.replacen(
            "#EXTM3U\n",
            "#EXTM3U\n#EXT-X-START:TIME-OFFSET=-6.0,PRECISE=YES\n",
            1,
        );
        if dir == "aes" {
            let key = child(&s, "/proxy/hls/segment.ts", &origin.url("/aes/enc.key"), "");
            assert!(original.contains("URI=\"enc.key\""));
            want = want.replace("URI=\"enc.key\"", &format!("URI=\"{key}\""));
        }
        assert_eq!(got, want, "{dir}");
        assert_eq!(uri_lines(&got).len(), 4, "{dir}: four segments");
    }
}

#[tokio::test]
async fn live_playlists_get_the_default_start_offset() {
    let origin = FileOrigin::start().await;
    let d = origin.url("/live/index.m3u8");
    let seg = |s: &Sluice, n: u32| {
        child(
            s,
            "/proxy/hls/segment.ts",
            &origin.url(&format!("/live/seg{n}.ts")),
            "",
        )
    };
    let s = Sluice::start(test_config()).await;
    let want = |s: &Sluice, start: &str| {
        format!(
            "#EXTM3U\n{start}#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:1234\n\
             #EXTINF:2.0,\n{}\n#EXTINF:2.0,\n{}\n",
            seg(s, 1234),
            seg(s, 1235)
        )
    };
    let got = text(&manifest_url(&s, &d, "")).await;
    assert_eq!(
        got,
        want(&s, "#EXT-X-START:TIME-OFFSET=-18.0,PRECISE=YES\n")
    );
    let got = text(&manifest_url(&s, &d, "&start_offset=-4.5")).await;
    assert_eq!(got, want(&s, "#EXT-X-START:TIME-OFFSET=-4.5,PRECISE=YES\n"));
    let off = with_config(|c| c.media.live_start_offset = 0.0).await;
    assert_eq!(text(&manifest_url(&off, &d, "")).await, want(&off, ""));
}

#[tokio::test]
async fn token_children_decrypt_to_the_right_destination() {
    const PW: &str = "pw!secret";
    let origin = FileOrigin::start().await;
    let s = with_config(|c| c.auth.api_password = PW.into()).await;
    let key = TokenKey::new(PW);
    let sealed = sluice_media::token::sealed::SealedKey::derive(PW);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Every child is a sealed token URL for the right endpoint whose grant names the right
    // upstream URL, carries h_*, opens only /proxy/hls/, expires with the parent or after the
    // default child TTL (12 h), and keeps the parent's ip; everything else is byte-identical.
    let check = |dir: &str, body: &str, exp: Option<u64>, ip: Option<&str>| {
        assert!(!body.contains(PW) && !body.contains("pw%21secret"));
        assert!(!body.contains("api_password"));
        let original = fixture_text(&format!("{dir}/index.m3u8"));
        let mut children = Vec::new();
        let masked = map_uris(body, |uri| {
            children.push(uri.to_string());
            "URI".into()
        });
        let mut want = map_uris(&original, |_| "URI".into());
        if dir == "aes" {
            let line = body.lines().find(|l| l.starts_with("#EXT-X-KEY")).unwrap();
            let uri = line.split('"').nth(1).unwrap();
            children.push(uri.to_string());
            want = want.replace("URI=\"enc.key\"", &format!("URI=\"{uri}\""));
        }
        assert_eq!(masked, want, "{dir}");
        let mut upstream: Vec<String> = uri_lines(&original)
            .iter()
            .map(|seg| origin.url(&format!("/{dir}/{seg}")))
            .collect();
        if dir == "aes" {
            upstream.push(origin.url("/aes/enc.key"));
        }
        assert_eq!(children.len(), upstream.len());
        for (uri, d) in children.iter().zip(&upstream) {
            assert!(
                uri.starts_with(&s.url("/_token_")) && uri.ends_with("/proxy/hls/segment.ts"),
                "{uri}"
            );
            let grant = sealed.open(token_of(uri)).unwrap();
            let param = |name: &str| {
                grant
                    .params
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(param("d").as_deref(), Some(d.as_str()));
            assert_eq!(param("h_referer").as_deref(), Some("https://r.example/"));
            assert_eq!(grant.scope, vec!["=/proxy/hls/segment.ts".to_string()]);
            match exp {
                Some(exp) => assert_eq!(grant.exp, Some(exp)),
                None => {
                    let got = grant.exp.unwrap();
                    assert!((now + 43_200..now + 43_200 + 120).contains(&got), "{got}");
                }
            }
            assert_eq!(grant.ip.as_deref(), ip);
        }
    };
    let exp = now + 3600;
    for dir in ["clear", "aes"] {
        let d = origin.url(&format!("/{dir}/index.m3u8"));
        // Password in the query: children become tokens without claims.
        let url = manifest_url(
            &s,
            &d,
            "&api_password=pw%21secret&h_referer=https%3A%2F%2Fr.example%2F",
        );
        check(dir, &text(&url).await, None, None);
        // A MediaFlow token (with the password, as /generate_url makes it) with exp and ip:
        // children keep both.
        let params = vec![
            ("d".to_string(), d.clone()),
            ("h_referer".to_string(), "https://r.example/".to_string()),
            ("api_password".to_string(), PW.to_string()),
        ];
        let token = key.encrypt(&params, Some(exp), Some("127.0.0.1"), [7; 16]);
        let url = s.url(&format!("/_token_{token}/proxy/hls/manifest.m3u8"));
        let body = text(&url).await;
        check(dir, &body, Some(exp), Some("127.0.0.1"));
        // A child token plays: bytes identical to the origin's segment.
        let r = get(&uri_lines(&body)[0]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["content-type"], "video/mp2t");
        let seg = std::fs::read(fixtures().join(format!("{dir}/seg0.ts"))).unwrap();
        assert_eq!(sha256(&r.body.unwrap()), sha256(&seg));
        // And the whole stream decodes through tokens alone.
        assert_eq!(framemd5(&url).await, framemd5(&d).await, "{dir}");
    }
}

// === playback end to end ===

#[tokio::test]
async fn ffmpeg_decodes_the_same_frames_through_the_proxy() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    for dir in ["clear", "aes"] {
        let d = origin.url(&format!("/{dir}/index.m3u8"));
        let direct = framemd5(&d).await;
        assert!(direct.lines().filter(|l| !l.starts_with('#')).count() > 100);
        let proxied = framemd5(&manifest_url(&s, &d, "")).await;
        assert_eq!(proxied, direct, "{dir}");
    }
    // The AES key and the segments were fetched by sluice too (its own User-Agent, not ffmpeg's).
    for path in ["/aes/enc.key", "/aes/seg3.ts"] {
        let by_proxy = origin.seen(path).iter().any(|h| {
            h.get("user-agent")
                .is_some_and(|ua| !ua.to_str().unwrap().starts_with("Lavf"))
        });
        assert!(by_proxy, "{path}");
    }
}

#[tokio::test]
async fn key_only_proxy_sends_segments_direct_and_keys_through() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let d = origin.url("/aes/index.m3u8");
    let original = fixture_text("aes/index.m3u8");
    let key = child(&s, "/proxy/hls/segment.ts", &origin.url("/aes/enc.key"), "");
    let want = map_uris(&original, |uri| origin.url(&format!("/aes/{uri}")))
        .replace("URI=\"enc.key\"", &format!("URI=\"{key}\""));
    let forced = s.url(&format!("/proxy/hls/key_proxy/manifest.m3u8?d={}", enc(&d)));
    assert_eq!(text(&forced).await, want);
    assert_eq!(
        text(&manifest_url(&s, &d, "&key_only_proxy=true")).await,
        want.replace(&key, &format!("{key}&key_only_proxy=true"))
    );
    // And it still plays.
    assert_eq!(framemd5(&forced).await, framemd5(&d).await);
}

#[tokio::test]
async fn no_proxy_only_resolves_uris() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let d = origin.url("/aes/index.m3u8");
    let want = map_uris(&fixture_text("aes/index.m3u8"), |uri| {
        origin.url(&format!("/aes/{uri}"))
    })
    .replace(
        "URI=\"enc.key\"",
        &format!("URI=\"{}\"", origin.url("/aes/enc.key")),
    );
    assert_eq!(text(&manifest_url(&s, &d, "&no_proxy=1")).await, want);
}

#[tokio::test]
async fn key_url_swaps_the_key_host() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let d = origin.url("/aes/index.m3u8");
    let body = text(&manifest_url(
        &s,
        &d,
        "&key_url=https%3A%2F%2Fkeys.example.com",
    ))
    .await;
    let key = child(
        &s,
        "/proxy/hls/segment.ts",
        "https://keys.example.com/aes/enc.key",
        "&key_url=https%3A%2F%2Fkeys.example.com",
    );
    assert!(body.contains(&format!("URI=\"{key}\"")), "{body}");
}

// === options ===

#[tokio::test]
async fn skip_keeps_the_first_segment_outside_the_range() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let d = origin.url("/clear/index.m3u8");
    let body = text(&manifest_url(&s, &d, "&skip=2.5-3.5")).await;
    let seg = |n: u32| {
        child(
            &s,
            "/proxy/hls/segment.ts",
            &origin.url(&format!("/clear/seg{n}.ts")),
            "&skip=2.5-3.5",
        )
    };
    assert_eq!(uri_lines(&body), [seg(0), seg(2), seg(3)]);
    assert_eq!(body.matches("#EXTINF").count(), 3, "no orphan EXTINF");
    assert_eq!(body.matches("#EXT-X-DISCONTINUITY").count(), 1);
}

#[tokio::test]
async fn resolution_and_max_res_pick_variants() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let d = origin.url("/vod/hd/master.m3u8");
    for (extra, height) in [
        ("&max_res=true", "1920x1080"),
        ("&resolution=720p", "1280x720"),
        ("&resolution=1000", "1280x720"),
        ("&resolution=100", "640x360"),
    ] {
        let body = text(&manifest_url(&s, &d, extra)).await;
        let variants: Vec<&str> = body
            .lines()
            .filter(|l| l.starts_with("#EXT-X-STREAM-INF"))
            .collect();
        assert_eq!(variants.len(), 1, "{extra}: {body}");
        assert!(variants[0].contains(height), "{extra}");
        // Renditions and I-frame playlists stay.
        assert!(body.contains("#EXT-X-MEDIA:TYPE=AUDIO"));
        assert!(body.contains("#EXT-X-I-FRAME-STREAM-INF"));
    }
}

#[tokio::test]
async fn bad_parameters_are_400_naming_them() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let d = origin.url("/clear/index.m3u8");
    for (extra, name) in [
        ("&skip=9-3", "skip"),
        ("&resolution=huge", "resolution"),
        ("&start_offset=soon", "start_offset"),
        ("&key_url=keys", "key_url"),
        ("&max_res=maybe", "max_res"),
    ] {
        let r = get(&manifest_url(&s, &d, extra)).await;
        assert_eq!(r.status, 400, "{extra}");
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(body.contains(&format!("`{name}`")), "{body}");
    }
}

// === what is not a playlist ===

#[tokio::test]
async fn html_instead_of_a_playlist_is_a_clear_502_or_a_graceful_end() {
    let origin = FileOrigin::start().await;
    let d = origin.url("/blocked/index.m3u8");
    let s = Sluice::start(test_config()).await;
    let r = get(&manifest_url(&s, &d, "")).await;
    assert_eq!(r.status, 502);
    let json: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    assert_eq!(json["upstream"], "127.0.0.1");
    assert_eq!(
        json["error"],
        "upstream 127.0.0.1 sent HTML, not a playlist"
    );
    let graceful = with_config(|c| c.media.graceful_stream_end = true).await;
    let body = text(&manifest_url(&graceful, &d, "")).await;
    assert!(body.starts_with("#EXTM3U\n") && body.contains("#EXT-X-ENDLIST"));
}

#[tokio::test]
async fn non_playlists_and_upstream_errors() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let r = get(&manifest_url(&s, &origin.url("/garbage/index.m3u8"), "")).await;
    assert_eq!(r.status, 502);
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(body.contains("does not start with #EXTM3U"), "{body}");
    let r = get(&manifest_url(
        &s,
        &origin.url("/status/404"),
        "&force_playlist_proxy=1",
    ))
    .await;
    assert_eq!(r.status, 404);
    let r = get(&manifest_url(&s, &origin.url("/status/503.m3u8"), "")).await;
    assert_eq!(r.status, 503);
}

#[tokio::test]
async fn playlists_over_the_size_cap_are_refused() {
    let origin = FileOrigin::start().await;
    let s = with_config(|c| c.media.max_manifest_bytes = 2048).await;
    let r = get(&manifest_url(&s, &origin.url("/long/index.m3u8"), "")).await;
    assert_eq!(r.status, 502);
    let json: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    assert_eq!(json["kind"], "playlist_too_large");
    assert!(json["error"]
        .as_str()
        .unwrap()
        .contains("2048 bytes (media.max_manifest_bytes)"));
    let small = text(&manifest_url(&s, &origin.url("/clear/index.m3u8"), "")).await;
    assert_eq!(uri_lines(&small).len(), 4);
}

#[tokio::test]
async fn a_non_playlist_destination_streams_untouched() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let seg = std::fs::read(fixtures().join("clear/seg1.ts")).unwrap();
    let url = manifest_url(&s, &origin.url("/clear/seg1.ts"), "");
    let r = get(&url).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "video/mp2t");
    assert_eq!(sha256(&r.body.unwrap()), sha256(&seg));
    let r = request("GET", &url, &[("range", "bytes=10-19")]).await;
    assert_eq!(r.status, 206);
    assert_eq!(r.body.unwrap(), &seg[10..20]);
}

#[tokio::test]
async fn an_mpegurl_content_type_makes_a_playlist() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let d = origin.url("/api/clear/live.mpegurl");
    let body = text(&manifest_url(&s, &d, "")).await;
    let seg0 = child(
        &s,
        "/proxy/hls/segment.ts",
        &origin.url("/api/clear/seg0.ts"),
        "",
    );
    assert_eq!(uri_lines(&body)[0], seg0);
    // HEAD and a ranged GET still get the whole rewritten playlist's headers.
    let r = request("HEAD", &manifest_url(&s, &d, ""), &[]).await;
    assert_eq!(r.headers["content-length"], body.len().to_string());
    let r = request("GET", &manifest_url(&s, &d, ""), &[("range", "bytes=0-9")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), body.as_bytes());
}

// === playlists told by their first bytes ===

/// A media playlist whose segment URLs carry the origin's tokens.
const TOKENED: &str = "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n\
#EXT-X-MEDIA-SEQUENCE:7\n#EXTINF:2.0,\nseg7.ts?token=SECRET7\n#EXTINF:2.0,\n\
/abs/seg8.ts?token=SECRET8\n#EXT-X-ENDLIST\n";

/// What `chunked_origin` sends for a path: its Content-Type, its body in chunks (each written on
/// its own, a moment after the last, so each reaches sluice as its own read), and whether the body
/// then stays open without another byte.
struct Chunks {
    content_type: &'static str,
    chunks: Vec<Bytes>,
    hold: bool,
}

fn sniff_bodies(path: &str) -> Option<Chunks> {
    let binary = pattern(200_000);
    let split = |chunks: &[&[u8]]| {
        chunks
            .iter()
            .map(|c| Bytes::copy_from_slice(c))
            .collect::<Vec<_>>()
    };
    let (content_type, chunks, hold) = match path {
        // A playlist as text/plain, its magic split over two reads.
        "/text/live" => (
            "text/plain",
            split(&[b"#EX", &TOKENED.as_bytes()[3..]]),
            false,
        ),
        // ... behind a BOM (itself split) and whitespace.
        "/text/bom" => (
            "text/plain; charset=utf-8",
            split(&[b"\xEF\xBB", b"\xBF\r\n ", TOKENED.as_bytes()]),
            false,
        ),
        "/text/octets" => (
            "application/octet-stream",
            split(&[TOKENED.as_bytes()]),
            false,
        ),
        // Not playlists: a first read that is a prefix of the magic, then something else.
        "/bin/magic-prefix" => (
            "application/octet-stream",
            split(&[b"#EXTM", b"X", &binary[..100_000], &binary[100_000..]]),
            false,
        ),
        "/bin/ext" => (
            "application/octet-stream",
            split(&[b"#EXT", b"-X-NOT-A-PLAYLIST\n", &binary[..50_000]]),
            false,
        ),
        // The whole body is shorter than the magic.
        "/bin/short" => ("text/plain", split(&[b"#EXT"]), false),
        "/bin/empty" => ("text/plain", Vec::new(), false),
        "/bin/partial-bom" => (
            "application/octet-stream",
            split(&[b"\xEF", b"\xBB\xBF", b"\x47\x40", &binary[..20_000]]),
            false,
        ),
        // The magic only after the sniffed bytes: whitespace fills them.
        "/bin/late-magic" => {
            let mut body = vec![b' '; 1500];
            body.extend_from_slice(TOKENED.as_bytes());
            ("text/plain", split(&[&body[..700], &body[700..]]), false)
        }
        "/bin/plain" => (
            "video/mp2t",
            binary
                .chunks(16 * 1024)
                .map(Bytes::copy_from_slice)
                .collect(),
            false,
        ),
        // One read of a live stream, then nothing for as long as the client waits.
        "/bin/hold" => ("video/mp2t", split(&[&binary[..188]]), true),
        // A head and never a byte of body.
        "/stall" => ("text/plain", Vec::new(), true),
        _ => return None,
    };
    Some(Chunks {
        content_type,
        chunks,
        hold,
    })
}

/// Serves [`sniff_bodies`]; a `Range: bytes=a-b` gets those bytes of the body as a 206.
async fn chunked_origin() -> SocketAddr {
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| async move {
                    let Some(mut body) = sniff_bodies(req.uri().path()) else {
                        let empty = Full::new(Bytes::new()).map_err(|n| match n {}).boxed();
                        return Ok::<_, Infallible>(
                            Response::builder().status(404).body(empty).unwrap(),
                        );
                    };
                    let range = req
                        .headers()
                        .get("range")
                        .and_then(|v| v.to_str().ok()?.strip_prefix("bytes="))
                        .and_then(|r| r.split_once('-'))
                        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse().ok()?)));
                    let mut builder = Response::builder().header("content-type", body.content_type);
                    if let Some((a, b)) = range {
                        let whole = body.chunks.concat();
                        builder = builder
                            .status(206)
                            .header("content-range", format!("bytes {a}-{b}/{}", whole.len()));
                        body.chunks = vec![Bytes::copy_from_slice(&whole[a..=b])];
                    }
                    let frames = futures_util::stream::unfold(
                        (body.chunks.into_iter(), body.hold),
                        |(mut chunks, hold)| async move {
                            match chunks.next() {
                                Some(chunk) => {
                                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                                    Some((Ok::<_, Infallible>(Frame::data(chunk)), (chunks, hold)))
                                }
                                None if hold => futures_util::future::pending().await,
                                None => None,
                            }
                        },
                    );
                    Ok(builder.body(StreamBody::new(frames).boxed()).unwrap())
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// A playlist that neither its URL nor its Content-Type names is told by its first bytes and
/// rewritten: no segment URL (nor the origin's token in it) reaches the player raw.
#[tokio::test]
async fn a_playlist_served_as_text_is_sniffed_and_rewritten() {
    let origin = chunked_origin().await;
    let s = Sluice::start(test_config()).await;
    let at = |p: &str| format!("http://{origin}{p}");
    let want = |dir: &str| {
        map_uris(TOKENED, |uri| {
            let seg = match uri.starts_with('/') {
                true => at(uri),
                false => at(&format!("/{dir}/{uri}")),
            };
            child(&s, "/proxy/hls/segment.ts", &seg, "")
        })
    };
    for path in ["/text/live", "/text/octets"] {
        let r = get(&manifest_url(&s, &at(path), "")).await;
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert_eq!(r.status, 200, "{path}: {body}");
        assert_eq!(r.headers["content-type"], "application/vnd.apple.mpegurl");
        assert_eq!(body, want("text"), "{path}");
        assert!(!body.contains("?token=SECRET"), "{path}: {body}");
    }
    let bom = text(&manifest_url(&s, &at("/text/bom"), "")).await;
    assert_eq!(uri_lines(&bom), uri_lines(&want("text")), "{bom}");
    // A ranged GET: the whole playlist fetched and rewritten, as for `mpegurl`.
    let url = manifest_url(&s, &at("/text/live"), "");
    let r = request("GET", &url, &[("range", "bytes=0-9")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), want("text").as_bytes());
    // The size cap holds for the bytes read to tell too.
    let small = with_config(|c| c.media.max_manifest_bytes = 64).await;
    let r = get(&manifest_url(&small, &at("/text/live"), "")).await;
    assert_eq!(r.status, 502);
    let json: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    assert_eq!(json["kind"], "playlist_too_large", "{json}");
}

/// Bodies that are no playlist stream through byte for byte, whatever the first reads hold: a
/// prefix of `#EXTM3U`, `#EXT` and no more, a split BOM, the magic past the sniffed bytes.
#[tokio::test]
async fn non_playlists_stream_through_byte_exact_after_the_sniff() {
    let origin = chunked_origin().await;
    let s = Sluice::start(test_config()).await;
    for path in [
        "/bin/magic-prefix",
        "/bin/ext",
        "/bin/short",
        "/bin/empty",
        "/bin/partial-bom",
        "/bin/late-magic",
        "/bin/plain",
    ] {
        let want = sniff_bodies(path).unwrap();
        let whole = want.chunks.concat();
        let r = get(&manifest_url(&s, &format!("http://{origin}{path}"), "")).await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.headers["content-type"], want.content_type, "{path}");
        let body = r.body.unwrap();
        assert_eq!(body.len(), whole.len(), "{path}");
        assert_eq!(sha256(&body), sha256(&whole), "{path}");
    }
}

/// A live stream is passed on once its first read tells it is no playlist, not when it ends; an
/// origin that sends a head and no body is a 504 once the idle read timeout passes, not a hang.
#[tokio::test]
async fn the_sniff_neither_waits_for_the_end_nor_hangs() {
    use http_body_util::BodyExt;
    let origin = chunked_origin().await;
    let s = Sluice::start(test_config()).await;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let url = manifest_url(&s, &format!("http://{origin}/bin/hold"), "");
    // Bounded only so a regression fails instead of hanging the run.
    let bound = std::time::Duration::from_secs(60);
    let resp = tokio::time::timeout(bound, client.get(url.parse().unwrap()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(bound, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), pattern(200_000)[..188]);
    let url = manifest_url(&s, &format!("http://{origin}/stall"), "");
    let r = tokio::time::timeout(bound, get(&url)).await.unwrap();
    assert_eq!(r.status, 504);
    let json: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    assert_eq!(json["kind"], "upstream_body", "{json}");
}

// === HEAD, segments, auth ===

#[tokio::test]
async fn head_on_a_manifest_has_the_get_headers_and_no_body() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let url = manifest_url(&s, &origin.url("/clear/index.m3u8"), "");
    let body = text(&url).await;
    let r = request("HEAD", &url, &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/vnd.apple.mpegurl");
    assert_eq!(r.headers["content-length"], body.len().to_string());
    assert!(r.body.unwrap().is_empty());
}

#[tokio::test]
async fn segments_pipe_with_the_extension_type_and_ranges() {
    let origin = FileOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    let seg = std::fs::read(fixtures().join("clear/seg2.ts")).unwrap();
    let d = enc(&origin.url("/clear/seg2.ts"));
    for (endpoint, ty) in [
        ("segment.ts", "video/mp2t"),
        ("segment.m4s", "video/mp4"),
        ("segment.mp4", "video/mp4"),
        ("segment.m4v", "video/mp4"),
        ("segment.m4a", "audio/mp4"),
        ("segment.aac", "audio/aac"),
        ("segment", "video/mp2t"),
    ] {
        let r = get(&s.url(&format!("/proxy/hls/{endpoint}?d={d}"))).await;
        assert_eq!(r.status, 200, "{endpoint}");
        assert_eq!(r.headers["content-type"], ty, "{endpoint}");
        assert_eq!(sha256(&r.body.unwrap()), sha256(&seg), "{endpoint}");
    }
    let url = s.url(&format!(
        "/proxy/hls/segment.mp4?d={d}&r_content-type=video%2Fiso.segment"
    ));
    let r = request("GET", &url, &[("range", "bytes=100-")]).await;
    assert_eq!(r.status, 206);
    assert_eq!(r.headers["content-type"], "video/iso.segment");
    assert_eq!(
        r.headers["content-range"],
        format!("bytes 100-{}/{}", seg.len() - 1, seg.len())
    );
    assert_eq!(r.body.unwrap(), &seg[100..]);
    let r = request("HEAD", &url, &[]).await;
    assert_eq!(r.headers["content-length"], seg.len().to_string());
    assert!(r.body.unwrap().is_empty());
    let r = get(&s.url("/proxy/hls/segment.exe?d=x")).await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn a_password_is_required() {
    let origin = FileOrigin::start().await;
    let s = with_config(|c| c.auth.api_password = "pw".into()).await;
    let d = origin.url("/clear/index.m3u8");
    assert_eq!(get(&manifest_url(&s, &d, "")).await.status, 403);
    let seg = s.url(&format!(
        "/proxy/hls/segment.ts?d={}",
        enc(&origin.url("/clear/seg0.ts"))
    ));
    assert_eq!(get(&seg).await.status, 403);
    assert_eq!(
        get(&manifest_url(&s, &d, "&api_password=pw")).await.status,
        200
    );
}

#[tokio::test]
async fn segments_are_prefetched_and_served_once_from_the_cache() {
    let origin = FileOrigin::start().await;
    let s = with_config(|c| c.media.prefetch_segments = 2).await;
    let playlist = text(&manifest_url(&s, &origin.url("/clear/index.m3u8"), "")).await;
    let segments = uri_lines(&playlist);
    assert!(segments.len() >= 4, "{playlist}");
    let first = get(&segments[0]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.headers["content-type"], "video/mp2t");
    assert_eq!(
        sha256(&first.body.unwrap()),
        sha256(&std::fs::read(fixtures().join("clear/seg0.ts")).unwrap())
    );
    // The next two segments are fetched ahead, once each, and the third is not.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while origin.seen("/clear/seg2.ts").is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(origin.seen("/clear/seg1.ts").len(), 1);
    assert_eq!(origin.seen("/clear/seg2.ts").len(), 1);
    assert!(origin.seen("/clear/seg3.ts").is_empty());
    // The player's request for segment 1 is a cache hit: no second origin fetch.
    let second = get(&segments[1]).await;
    assert_eq!(
        sha256(&second.body.unwrap()),
        sha256(&std::fs::read(fixtures().join("clear/seg1.ts")).unwrap())
    );
    assert_eq!(origin.seen("/clear/seg1.ts").len(), 1);
    // A Range request still goes straight through.
    let r = request("GET", &segments[1], &[("range", "bytes=0-187")]).await;
    assert_eq!(r.status, 206);
    assert_eq!(origin.seen("/clear/seg1.ts").len(), 2);
}

// === hostile playlists ===

/// Answers every GET with the playlist `body(path)` names (404 when it names none).
async fn playlist_origin(body: fn(&str) -> Option<String>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| async move {
                    let resp = match body(req.uri().path()) {
                        Some(text) => Response::builder()
                            .header("content-type", "application/vnd.apple.mpegurl")
                            .body(Full::new(Bytes::from(text))),
                        None => Response::builder()
                            .status(404)
                            .body(Full::new(Bytes::new())),
                    };
                    Ok::<_, Infallible>(resp.unwrap())
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// A directory name this long, repeated into every child URL.
const WIDE_DIR: usize = 7000;

fn hostile_playlist(path: &str) -> Option<String> {
    let name = path.rsplit('/').next().unwrap_or("");
    let dir_len = path.len() - name.len();
    Some(match name {
        // Bare URI lines: no #EXTINF at all.
        "bare.m3u8" => format!("#EXTM3U\n{}", "a\n".repeat(300_000)),
        // LL-HLS parts only.
        "parts.m3u8" => format!(
            "#EXTM3U\n#EXT-X-TARGETDURATION:4\n#EXT-X-PART-INF:PART-TARGET=1\n{}",
            "#EXT-X-PART:DURATION=1,URI=\"p.m4s\"\n".repeat(100_000)
        ),
        // Few entries, but each child URL carries the long directory.
        "wide.m3u8" if dir_len > WIDE_DIR => format!(
            "#EXTM3U\n#EXT-X-TARGETDURATION:4\n{}#EXT-X-ENDLIST\n",
            "#EXTINF:4,\na.ts\n".repeat(10_000)
        ),
        "ok.m3u8" => "#EXTM3U\n#EXT-X-TARGETDURATION:4\n#EXT-X-PART-INF:PART-TARGET=1\n\
                      #EXT-X-MAP:URI=\"init.mp4\"\n#EXTINF:4,\ns1.m4s\n\
                      #EXT-X-PART:DURATION=1,URI=\"s2.p1.m4s\"\n\
                      #EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"s2.p2.m4s\"\n"
            .to_string(),
        _ => return None,
    })
}

/// Playlists whose URIs multiply into huge rewrites: bare URI lines and LL-HLS parts (which the
/// segment count did not see), and a long directory repeated into every child URL. Each is the
/// origin's fault: a quick 502 booked upstream, and a normal playlist is served the same after.
#[tokio::test]
async fn playlists_that_multiply_on_rewrite_are_refused_as_the_origins_fault() {
    let origin = playlist_origin(hostile_playlist).await;
    let s = with_config(|c| c.auth.api_password = "pw".into()).await;
    let manifest =
        |path: &str| manifest_url(&s, &format!("http://{origin}{path}"), "&api_password=pw");
    let normal = text(&manifest("/ok/ok.m3u8")).await;
    let uris: Vec<&str> = normal
        .lines()
        .filter_map(|l| {
            l.split_once("URI=\"")
                .map(|(_, u)| u.trim_end_matches('"'))
                .or((!l.starts_with('#')).then_some(l))
        })
        .collect();
    assert_eq!(uris.len(), 4, "{normal}");
    let prefix = format!("http://{}/_token_", s.addr);
    assert!(uris.iter().all(|u| u.starts_with(&prefix)), "{normal}");
    let wide = format!("/{}/wide.m3u8", "w".repeat(WIDE_DIR));
    let long = format!("/{}/wide.m3u8", "l".repeat(9000));
    for (path, kind) in [
        ("/x/bare.m3u8", "too_many_entries"),
        ("/x/parts.m3u8", "too_many_entries"),
        (wide.as_str(), "playlist_rewrite_too_large"),
        (long.as_str(), "playlist_url_too_long"),
    ] {
        let started = std::time::Instant::now();
        let r = get(&manifest(path)).await;
        let body = r.body.unwrap();
        let took = started.elapsed();
        assert_eq!(
            r.status,
            502,
            "{}: {} bytes in {took:?}",
            &path[..12],
            body.len()
        );
        assert!(took < std::time::Duration::from_secs(5), "{took:?}");
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["kind"], kind, "{json}");
    }
    let metrics = text(&s.url("/metrics?api_password=pw")).await;
    for (kind, n) in [
        ("too_many_entries", 2),
        ("playlist_rewrite_too_large", 1),
        ("playlist_url_too_long", 1),
    ] {
        let series = format!("sluice_errors_total{{side=\"upstream\",kind=\"{kind}\"}} {n}");
        assert!(metrics.contains(&series), "{series} missing:\n{metrics}");
    }
    assert!(
        !metrics.contains("side=\"downstream\",kind=\"too_many"),
        "{metrics}"
    );
    // The same children (tokens are reused), byte for byte.
    assert_eq!(text(&manifest("/ok/ok.m3u8")).await, normal);
}
