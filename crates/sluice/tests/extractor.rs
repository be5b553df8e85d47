//! `/extractor/video` with scripted extractors: the answer as JSON and as a redirect to a sealed
//! proxy URL that plays from a local origin, HLS answers (yt-dlp's shape), the per-page cache and
//! shared runs, choice by `host` and by page pattern, and the bounds (timeout, output cap, a
//! failing command, no password, no extractor).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice::media::extractor::ExtractorEntry;
use support::*;

/// Writes an executable script; it appends its arguments to `runs.log` beside it.
fn script(dir: &Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    let log = dir.join("runs.log");
    let text = format!(
        "#!/bin/sh\necho \"{name} $*\" >> '{}'\n{body}\n",
        log.display()
    );
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

fn runs(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("runs.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn entry(host: &str, patterns: &[&str], cmd: String) -> ExtractorEntry {
    ExtractorEntry {
        host: host.into(),
        patterns: patterns.iter().map(|p| p.to_string()).collect(),
        command: vec![cmd],
    }
}

struct Setup {
    sluice: Sluice,
    origin: Origin,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

async fn setup() -> Setup {
    let origin = Origin::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let small = format!("http://{}/small", origin.addr);
    let playlist = format!("http://{}/live/index.m3u8", origin.addr);
    let ok = script(
        &dir,
        "ok.sh",
        &format!(
            "sleep 0.2\necho '{{\"destination_url\":\"{small}\",\"request_headers\":{{\"Referer\":\"https://page.example/\"}}}}'"
        ),
    );
    let hls = script(
        &dir,
        "hls.sh",
        &format!("echo '{{\"url\":\"{playlist}\",\"protocol\":\"m3u8_native\",\"http_headers\":{{\"User-Agent\":\"UA/1\"}}}}'"),
    );
    let slow = script(&dir, "slow.sh", "sleep 20");
    let chatty = script(&dir, "chatty.sh", "head -c 3000000 /dev/zero");
    let fail = script(&dir, "fail.sh", "echo 'page gone' >&2\nexit 3");
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    let x = &mut config.media.extractors;
    x.commands = vec![
        entry("Ok", &[], ok.clone()),
        entry("", &["*.pattern.example"], ok.clone()),
        entry(
            "Streamtape",
            &["streamtape.example", "*.streamtape.example"],
            ok,
        ),
        entry("Hls", &[], hls),
        entry("Slow", &[], slow),
        entry("Chatty", &[], chatty),
        entry("Fail", &[], fail),
    ];
    x.timeout_secs = 1;
    x.max_output_bytes = 1 << 20;
    let sluice = Sluice::start(config).await;
    Setup {
        sluice,
        origin,
        dir,
        _tmp: tmp,
    }
}

fn extract(s: &Setup, path: &str, host: &str, page: &str, extra: &str) -> String {
    s.sluice.url(&format!(
        "{path}?host={host}&d={}&api_password=pw{extra}",
        enc(page)
    ))
}

fn json(r: &Reply) -> serde_json::Value {
    serde_json::from_slice(r.body.as_ref().unwrap()).unwrap()
}

#[tokio::test]
async fn answers_json_and_redirects_to_a_sealed_stream() {
    let s = setup().await;
    let page = "https://host.example/v/1";
    let r = get(&extract(&s, "/extractor/video", "ok", page, "")).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v = json(&r);
    assert_eq!(
        v["destination_url"],
        format!("http://{}/small", s.origin.addr)
    );
    assert_eq!(v["request_headers"]["referer"], "https://page.example/");
    assert_eq!(v["mediaflow_endpoint"], "proxy_stream_endpoint");
    let proxied = v["mediaflow_proxy_url"].as_str().unwrap().to_string();
    assert!(proxied.contains("/_token_"), "{proxied}");
    assert!(!proxied.contains("api_password"), "{proxied}");
    // The sealed URL plays, with the extractor's headers, and needs no password.
    let r = get(&proxied).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from("hello"));
    assert_eq!(
        s.origin.seen_path("/small")[0].headers["referer"],
        "https://page.example/"
    );
    // A redirect for players; the answer was kept, so the command ran once.
    let r = get(&extract(
        &s,
        "/extractor/video.mp4",
        "Ok",
        page,
        "&redirect_stream=true",
    ))
    .await;
    assert_eq!(r.status, 302);
    let location = r.headers["location"].to_str().unwrap().to_string();
    let r = get(&location).await;
    assert_eq!(r.body.unwrap(), Bytes::from("hello"));
    assert_eq!(runs(&s.dir), vec![format!("ok.sh {page}")]);
}

#[tokio::test]
async fn hls_answers_point_at_the_playlist_endpoint_and_patterns_choose() {
    let s = setup().await;
    let r = get(&extract(
        &s,
        "/extractor/video.m3u8",
        "HLS",
        "https://a.example/x",
        "",
    ))
    .await;
    let v = json(&r);
    assert_eq!(v["mediaflow_endpoint"], "hls_manifest_proxy");
    assert!(v["mediaflow_proxy_url"]
        .as_str()
        .unwrap()
        .ends_with("/proxy/hls/manifest.m3u8"));
    assert_eq!(v["request_headers"]["user-agent"], "UA/1");
    // No `host`: the page's host picks the command.
    let r = get(&extract(
        &s,
        "/extractor/video",
        "",
        "https://www.pattern.example/p",
        "",
    ))
    .await;
    assert_eq!(r.status, 200);
    // Neither: 404 naming what is missing, and nothing runs.
    let r = get(&extract(
        &s,
        "/extractor/video",
        "Vidoza",
        "https://v.example/1",
        "",
    ))
    .await;
    assert_eq!(r.status, 404);
    assert!(String::from_utf8_lossy(r.body.as_ref().unwrap()).contains("Vidoza"));
}

#[tokio::test]
async fn concurrent_requests_share_one_run() {
    let s = setup().await;
    let url = extract(&s, "/extractor/video", "Ok", "https://host.example/v/2", "");
    let all = futures_util::future::join_all((0..6).map(|_| get(&url))).await;
    for r in all {
        assert_eq!(r.status, 200);
    }
    assert_eq!(runs(&s.dir).len(), 1);
}

#[tokio::test]
async fn bounds_and_refusals() {
    let s = setup().await;
    let started = Instant::now();
    let r = get(&extract(
        &s,
        "/extractor/video",
        "Slow",
        "https://a.example/1",
        "",
    ))
    .await;
    assert_eq!(r.status, 504);
    assert!(started.elapsed() < Duration::from_secs(15));
    let r = get(&extract(
        &s,
        "/extractor/video",
        "Chatty",
        "https://a.example/1",
        "",
    ))
    .await;
    assert_eq!(r.status, 502);
    let r = get(&extract(
        &s,
        "/extractor/video",
        "Fail",
        "https://a.example/1",
        "",
    ))
    .await;
    assert_eq!(r.status, 502);
    // What the command printed on standard error stays in the log: through a command that
    // fetches the page it would tell a port scan what it met.
    let text = String::from_utf8_lossy(r.body.as_ref().unwrap()).to_string();
    assert!(!text.contains("page gone"), "{text}");
    assert!(text.contains("found no stream"), "{text}");
    // Errors are not kept: the failing command runs again.
    let _ = get(&extract(
        &s,
        "/extractor/video",
        "Fail",
        "https://a.example/1",
        "",
    ))
    .await;
    assert_eq!(
        runs(&s.dir)
            .iter()
            .filter(|l| l.starts_with("fail.sh"))
            .count(),
        2
    );
    // No password: nothing runs.
    let d = enc("https://host.example/v/3");
    let r = get(&s.sluice.url(&format!("/extractor/video?host=Ok&d={d}"))).await;
    assert_eq!(r.status, 403);
    let r = get(&extract(
        &s,
        "/extractor/video",
        "Ok",
        "https://host.example/v/3",
        "&extra_params=[1]",
    ))
    .await;
    assert_eq!(r.status, 400);
    let r = get(&extract(
        &s,
        "/extractor/other",
        "Ok",
        "https://host.example/v/3",
        "",
    ))
    .await;
    assert_eq!(r.status, 404);
    assert!(!runs(&s.dir).iter().any(|l| l.contains("/v/3")));
}

#[tokio::test]
async fn a_command_with_patterns_answers_only_pages_they_cover() {
    let s = setup().await;
    // Named by `host`, but the page is on another host: refused like an unknown host.
    let r = get(&extract(
        &s,
        "/extractor/video",
        "Streamtape",
        "http://127.0.0.1:9/secret",
        "",
    ))
    .await;
    assert_eq!(r.status, 404);
    let text = String::from_utf8_lossy(r.body.as_ref().unwrap()).to_string();
    assert!(text.contains("patterns"), "{text}");
    // A covered page runs.
    let r = get(&extract(
        &s,
        "/extractor/video",
        "streamtape",
        "https://www.streamtape.example/e/1",
        "",
    ))
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        runs(&s.dir),
        vec!["ok.sh https://www.streamtape.example/e/1".to_string()]
    );
}

#[tokio::test]
async fn the_address_guard_applies_to_the_page_before_any_command_runs() {
    let origin = Origin::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    // Would fetch the page (as yt-dlp's generic extractor does); it records that it ran.
    let fetch = script(&dir, "fetch.sh", "curl -s \"$1\" >/dev/null 2>&1\nexit 1");
    let mut config = test_config();
    config.upstream.allow_private = false;
    config.auth.api_password = "pw".into();
    config.media.extractors.commands = vec![entry("Generic", &[], fetch)];
    let sluice = Sluice::start(config).await;
    let s = Setup {
        sluice,
        origin,
        dir,
        _tmp: tmp,
    };
    for page in [
        format!("http://{}/secret", s.origin.addr),
        "http://localhost:6878/secret".to_string(),
        "http://[::1]/x".to_string(),
        "http://169.254.169.254/latest/meta-data/".to_string(),
    ] {
        let r = get(&extract(&s, "/extractor/video", "Generic", &page, "")).await;
        let text = String::from_utf8_lossy(r.body.as_ref().unwrap()).to_string();
        assert_eq!(r.status, 403, "{page}: {text}");
        assert!(text.contains("upstream.allow_private"), "{text}");
    }
    assert!(runs(&s.dir).is_empty(), "{:?}", runs(&s.dir));
    assert!(s.origin.seen_path("/secret").is_empty());
}
