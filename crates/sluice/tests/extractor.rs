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
    setup_with(|_| {}).await
}

/// As [`setup`], with `tweak` applied to the configuration last.
async fn setup_with(tweak: impl FnOnce(&mut sluice::config::Config)) -> Setup {
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
    // Fails after as many seconds as the page's last path segment says.
    let nap = script(&dir, "nap.sh", "sleep \"${1##*/}\"\nexit 3");
    // Prints the given JSON answer.
    let prints =
        |name: &str, answer: String| script(&dir, name, &format!("cat <<'EOF'\n{answer}\nEOF"));
    let long_url = prints(
        "long_url.sh",
        format!(
            r#"{{"destination_url":"{small}?{}"}}"#,
            "a".repeat(17 * 1024)
        ),
    );
    let many: Vec<String> = (0..65).map(|i| format!(r#""X-H{i}":"v""#)).collect();
    let many_headers = prints(
        "many_headers.sh",
        format!(
            r#"{{"destination_url":"{small}","request_headers":{{{}}}}}"#,
            many.join(",")
        ),
    );
    let big_headers = prints(
        "big_headers.sh",
        format!(
            r#"{{"destination_url":"{small}","request_headers":{{"Cookie":"{}"}}}}"#,
            "c".repeat(17 * 1024)
        ),
    );
    let echo_host = script(
        &dir,
        "echo_host.sh",
        &format!("echo \"{{\\\"destination_url\\\":\\\"{small}?h=$SLUICE_EXTRACTOR_HOST\\\"}}\""),
    );
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
        entry("Nap", &[], nap),
        entry("LongUrl", &[], long_url),
        entry("ManyHeaders", &[], many_headers),
        entry("BigHeaders", &[], big_headers),
        entry("Echo", &["*.echo.example"], echo_host),
        entry("Missing", &[], "/nonexistent/sluice-extractor".to_string()),
    ];
    x.timeout_secs = 1;
    x.max_output_bytes = 1 << 20;
    tweak(&mut config);
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

fn kind_and_side(r: &Reply) -> (String, String) {
    let v = json(r);
    (
        v["kind"].as_str().unwrap_or("").to_string(),
        v["side"].as_str().unwrap_or("").to_string(),
    )
}

fn runs_of(s: &Setup, script: &str) -> usize {
    runs(&s.dir)
        .iter()
        .filter(|l| l.starts_with(&format!("{script} ")))
        .count()
}

/// Waits until `script` has been started `n` times (a run is under way).
async fn started(s: &Setup, script: &str, n: usize) {
    for _ in 0..500 {
        if runs_of(s, script) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{script} never ran {n} times: {:?}", runs(&s.dir));
}

/// A client elsewhere, as a front proxy on this host (`auth.trusted_proxies`) reports it.
async fn get_from(client: &str, url: &str) -> Reply {
    request("GET", url, &[("x-forwarded-for", client)]).await
}

/// Requests for one failing page that were waiting for its run take that run's error: the
/// command runs once, not once per request one after another. A request that comes after the
/// failure runs it again (failures are not kept).
#[tokio::test]
async fn a_failed_run_is_shared_with_the_requests_waiting_for_it() {
    let s = setup().await;
    let url = extract(&s, "/extractor/video", "Nap", "https://a.example/0.5", "");
    let all = futures_util::future::join_all((0..5).map(|_| get(&url))).await;
    for r in &all {
        assert_eq!(r.status, 502, "{:?}", r.body);
        assert_eq!(
            kind_and_side(r),
            ("extractor_failed".into(), "upstream".into())
        );
    }
    assert_eq!(runs_of(&s, "nap.sh"), 1, "{:?}", runs(&s.dir));
    let r = get(&url).await;
    assert_eq!(r.status, 502);
    assert_eq!(runs_of(&s, "nap.sh"), 2);
}

/// Waiting for a page's turn is bounded by the timeout, together with the wait for a slot: a
/// request behind a slow run of its page is refused as busy (503) within one timeout, rather
/// than waiting for that run, then for a slot and a run of its own.
#[tokio::test]
async fn waiting_for_a_page_s_turn_is_bounded_by_the_timeout() {
    let s = setup_with(|c| {
        c.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        c.media.extractors.max_running = 1;
        c.media.extractors.timeout_secs = 3;
    })
    .await;
    // A holds the only slot for 1.5 s; B takes the slow page's turn and waits for the slot,
    // then runs until the 3 s timeout kills it (at about 4.5 s).
    let a = extract(&s, "/extractor/video", "Nap", "https://a.example/1.5", "");
    let a = tokio::spawn(async move { get_from("203.0.113.1", &a).await });
    started(&s, "nap.sh", 1).await;
    let slow = extract(&s, "/extractor/video", "Slow", "https://a.example/slow", "");
    let b = {
        let slow = slow.clone();
        tokio::spawn(async move { get_from("203.0.113.2", &slow).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    // C waits for the slow page's turn, which B holds past C's 3 s.
    let c = get_from("203.0.113.3", &slow).await;
    assert_eq!(c.status, 503, "{:?}", c.body);
    assert_eq!(kind_and_side(&c).0, "extractor_busy");
    assert_eq!(c.headers["retry-after"], "3");
    assert_eq!(a.await.unwrap().status, 502);
    assert_eq!(b.await.unwrap().status, 504);
    assert_eq!(runs_of(&s, "slow.sh"), 1, "{:?}", runs(&s.dir));
}

/// One client cannot take every slot: its runs (waiting for a slot or running) are at most half
/// of `max_running`; past it 429, booked to the client, and another client still gets a slot.
#[tokio::test]
async fn one_client_cannot_take_every_extractor_slot() {
    let s = setup_with(|c| {
        c.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        c.media.extractors.max_running = 2;
        c.media.extractors.timeout_secs = 2;
    })
    .await;
    let first = extract(&s, "/extractor/video", "Slow", "https://a.example/s1", "");
    let first = tokio::spawn(async move { get_from("203.0.113.1", &first).await });
    started(&s, "slow.sh", 1).await;
    // The same client's network (an IPv6 client's /64 likewise), another page: refused.
    let second = extract(&s, "/extractor/video", "Slow", "https://a.example/s2", "");
    let r = get_from("203.0.113.1", &second).await;
    assert_eq!(r.status, 429, "{:?}", r.body);
    assert_eq!(
        kind_and_side(&r),
        ("too_many_requests".into(), "downstream".into())
    );
    assert_eq!(runs_of(&s, "slow.sh"), 1);
    // Another client runs at once.
    let ok = extract(&s, "/extractor/video", "Ok", "https://host.example/v/9", "");
    let r = get_from("203.0.113.2", &ok).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(first.await.unwrap().status, 504);
    // Its run over, the first client runs again.
    let r = get_from("203.0.113.1", &second).await;
    assert_eq!(r.status, 504);
}

/// A command's answer is bounded before it is kept and sealed into every answer: a destination
/// URL over 16 KiB, more than 64 headers or over 16 KiB of them is refused as unusable (502).
#[tokio::test]
async fn oversized_answers_are_refused() {
    let s = setup().await;
    for host in ["LongUrl", "ManyHeaders", "BigHeaders"] {
        let r = get(&extract(
            &s,
            "/extractor/video",
            host,
            "https://a.example/big",
            "",
        ))
        .await;
        assert_eq!(r.status, 502, "{host}: {:?}", r.body.map(|b| b.len()));
        assert_eq!(
            kind_and_side(&r),
            ("extractor_output".into(), "upstream".into()),
            "{host}"
        );
    }
}

/// The command is given the configured entry's `host`, not the client's spelling: the answer is
/// kept per command and page, so two spellings cannot get each other's answers.
#[tokio::test]
async fn the_command_gets_the_configured_host() {
    let s = setup().await;
    let page = "https://www.echo.example/1";
    for host in ["Other", "Third"] {
        let r = get(&extract(&s, "/extractor/video", host, page, "")).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let url = json(&r)["destination_url"].as_str().unwrap().to_string();
        assert!(url.ends_with("?h=Echo"), "{host}: {url}");
    }
    assert_eq!(runs_of(&s, "echo_host.sh"), 1);
}

/// A control character in `host` is the client's fault (400) and nothing runs (a page its
/// patterns cover picks the command whatever `host` says); a command that cannot be started is
/// sluice's (500, side internal), not the page's.
#[tokio::test]
async fn control_characters_in_host_and_a_command_that_cannot_start() {
    let s = setup().await;
    for host in ["Ok%00", "%07Ok", "O%0Ak"] {
        let url = s.sluice.url(&format!(
            "/extractor/video?host={host}&d={}&api_password=pw",
            enc("https://www.pattern.example/ctl")
        ));
        let r = get(&url).await;
        assert_eq!(r.status, 400, "{host}: {:?}", r.body);
        assert_eq!(kind_and_side(&r).1, "downstream");
    }
    assert!(runs(&s.dir).is_empty(), "{:?}", runs(&s.dir));
    let r = get(&extract(
        &s,
        "/extractor/video",
        "Missing",
        "https://a.example/m",
        "",
    ))
    .await;
    assert_eq!(r.status, 500, "{:?}", r.body);
    assert_eq!(
        kind_and_side(&r),
        ("extractor_failed".into(), "internal".into())
    );
}
