//! The IPTV front end behind the real server: auth on every path, playlist entries carrying a token
//! instead of the password.

mod support;

use std::io::Write;

use support::*;

#[tokio::test]
async fn iptv_paths_need_auth_and_playlist_entries_carry_tokens() {
    let mut m3u = tempfile::NamedTempFile::new().unwrap();
    m3u.write_all(b"#EXTM3U\n#EXTINF:-1 group-title=\"News\",One\nrtp://239.1.2.3:5000\n")
        .unwrap();
    let mut config = test_config();
    config.auth.api_password = "tv-pw".into();
    config.iptv.playlist = Some(m3u.path().to_str().unwrap().to_string());
    config.iptv.interface = Some("lo".into());
    config.iptv.no_data_timeout_ms = 300;
    let s = Sluice::start(config).await;
    // The pages ask a browser for the password (401, HTTP Basic); the rest refuse (403).
    for (path, status) in [
        ("/status", 401),
        ("/status.json", 401),
        ("/playlist.m3u", 403),
        ("/rtp/239.1.2.3:5000", 403),
    ] {
        assert_eq!(get(&s.url(path)).await.status, status, "{path}");
    }
    let r = get(&s.url("/playlist.m3u?api_password=tv-pw")).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(!text.contains("tv-pw"), "{text}");
    assert!(text.contains("group-title=\"News\",One"), "{text}");
    let entry = text
        .lines()
        .find(|l| l.starts_with("http://"))
        .unwrap()
        .to_string();
    assert!(
        entry.contains("/_token_") && entry.ends_with("/rtp/239.1.2.3:5000"),
        "{entry}"
    );
    // The entry is authorized by its token: the request reaches the gateway, which waits for data
    // and answers 504 after the no-data timeout (nothing is sent to that group).
    let r = get(&entry).await;
    assert_eq!(r.status, 504, "{:?}", r.body);
    // Bad addresses are refused with a reason.
    let r = get(&s.url("/rtp/10.0.0.1:5000?api_password=tv-pw")).await;
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body.unwrap()).contains("multicast"));
}

#[tokio::test]
async fn rtsp_needs_auth_and_its_entries_and_catch_up_carry_tokens() {
    let mut m3u = tempfile::NamedTempFile::new().unwrap();
    m3u.write_all(b"#EXTM3U\n#EXTINF:-1,Two\nrtsp://127.0.0.1:9/live\n")
        .unwrap();
    let mut config = test_config();
    config.auth.api_password = "tv-pw".into();
    config.iptv.playlist = Some(m3u.path().to_str().unwrap().to_string());
    let s = Sluice::start(config).await;
    assert_eq!(get(&s.url("/rtsp/127.0.0.1:9/live")).await.status, 403);
    let r = get(&s.url("/playlist.m3u?api_password=tv-pw")).await;
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let entry = text
        .lines()
        .find(|l| l.starts_with("http://"))
        .unwrap()
        .to_string();
    assert!(
        entry.contains("/_token_") && entry.ends_with("/rtsp/127.0.0.1:9/live"),
        "{entry}"
    );
    let extinf = text.lines().find(|l| l.starts_with("#EXTINF")).unwrap();
    let want = format!(
        "#EXTINF:-1 catchup=\"default\" catchup-source=\"{entry}?playseek=${{(b)yyyyMMddHHmmss}}-${{(e)yyyyMMddHHmmss}}\",Two"
    );
    assert_eq!(extinf, want);
    // The token opens the entry and its catch-up form (as a player fills it in): the request
    // reaches the RTSP client, whose server is not there.
    for url in [
        entry.clone(),
        format!("{entry}?playseek=20240101120000-20240101130000"),
    ] {
        let r = get(&url).await;
        assert_eq!(r.status, 502, "{url}: {:?}", r.body);
    }
    // Nothing else may be added to what the token fixes.
    assert_eq!(get(&format!("{entry}?user=admin")).await.status, 401);
}

/// A password-free sluice behind a front proxy on the same machine (a trusted proxy): the proxy
/// connects from loopback and, as nginx does by default, names the upstream `127.0.0.1:port` in
/// `Host`, so only `X-Forwarded-For` says the client is elsewhere. The operator's pages and the
/// admin endpoint must not open to that client; this machine's own clients keep them.
#[tokio::test]
async fn a_password_free_server_keeps_its_pages_from_clients_behind_a_front_proxy() {
    let mut config = test_config();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    let s = Sluice::start(config).await;
    let remote = [("x-forwarded-for", "203.0.113.7")];
    let mut pages = vec![
        ("GET", "/status"),
        ("GET", "/status.json"),
        ("GET", "/player"),
        ("POST", "/admin/reload"),
        ("GET", "/metrics"),
    ];
    // The home page and the playlist builder belong to the media front end (a 404 in the
    // gateway-only build).
    if cfg!(feature = "media") {
        pages.extend([("GET", "/"), ("GET", "/playlist/builder")]);
    }
    for (method, path) in pages {
        let r = request(method, &s.url(path), &remote).await;
        assert_eq!(r.status, 403, "{method} {path} from 203.0.113.7");
        let body = String::from_utf8_lossy(&r.body.clone().unwrap_or_default()).into_owned();
        assert!(body.contains("no password"), "{path}: {body}");
    }
    // The same pages for a client on this machine, forwarded or not.
    for via in [&[][..], &[("x-forwarded-for", "127.0.0.1")][..]] {
        for path in ["/status.json", "/player"] {
            let r = request("GET", &s.url(path), via).await;
            assert_eq!(r.status, 200, "{path} via {via:?}");
        }
    }
    // Channels and health stay open to the forwarded client (no password, by the operator's
    // choice): only the operator's pages are this machine's.
    let r = request("GET", &s.url("/health"), &remote).await;
    assert_eq!(r.status, 200);
}

/// `/metrics` names upstreams, routes and channels. Behind a password it opens without one only
/// to a client on this machine asking by a loopback name: not to a client a front proxy on this
/// host forwards (which connects from loopback), nor to a page on a DNS name rebound to
/// 127.0.0.1. Those get the refusal every unauthenticated operator request gets.
#[tokio::test]
async fn metrics_open_without_the_password_only_to_this_machine() {
    let mut config = test_config();
    config.auth.api_password = "tv-pw".into();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    let s = Sluice::start(config).await;
    let refused = request("GET", &s.url("/playlist.m3u"), &[]).await;
    assert_eq!(refused.status, 403);
    let port = s.addr.port();
    let evil = format!("evil.example:{port}");
    for via in [
        vec![("x-forwarded-for", "203.0.113.7")],
        vec![("x-forwarded-for", "127.0.0.1, 203.0.113.7")],
        vec![("host", "evil.example")],
        vec![("host", evil.as_str())],
        vec![("host", evil.as_str()), ("x-forwarded-for", "127.0.0.1")],
    ] {
        let r = request("GET", &s.url("/metrics"), &via).await;
        assert_eq!(r.status, 403, "/metrics via {via:?}");
        assert_eq!(r.body, refused.body, "/metrics via {via:?}");
    }
    // The password opens it to anyone.
    let r = request(
        "GET",
        &s.url("/metrics"),
        &[
            ("x-forwarded-for", "203.0.113.7"),
            ("api_password", "tv-pw"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    // This machine's own scraper needs none, forwarded or not.
    let localhost = format!("localhost:{port}");
    for via in [
        vec![],
        vec![("x-forwarded-for", "127.0.0.1")],
        vec![("host", localhost.as_str())],
    ] {
        let r = request("GET", &s.url("/metrics"), &via).await;
        assert_eq!(r.status, 200, "/metrics via {via:?}");
        let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(text.contains("sluice_"), "{text}");
    }
}

/// Finding: the answers behind the password carried no `Cache-Control` (the guide a `public`
/// one), so a front cache keyed on the URL alone (the password in a cookie or header) would hand
/// one viewer's playlist of tokens, the status and the metrics to the next client. Each is now
/// `private`: `no-store` where the handler set nothing, the guide keeping its `max-age`.
#[tokio::test]
async fn answers_behind_the_password_are_private() {
    // A guide origin: one small XMLTV document to any request.
    let guide = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let guide_addr = guide.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut tcp, _)) = guide.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                let xml = "<?xml version=\"1.0\"?>\n<tv><channel id=\"a\"></channel></tv>\n";
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n",
                    xml.len()
                );
                let _ = tcp.write_all(format!("{head}{xml}").as_bytes()).await;
            });
        }
    });
    let mut m3u = tempfile::NamedTempFile::new().unwrap();
    m3u.write_all(b"#EXTM3U\n#EXTINF:-1,One\nrtp://239.1.2.3:5000\n")
        .unwrap();
    let mut config = test_config();
    config.auth.api_password = "tv-pw".into();
    config.iptv.playlist = Some(m3u.path().to_str().unwrap().to_string());
    config.iptv.epg_url = Some(format!("http://{guide_addr}/guide.xml"));
    let s = Sluice::start(config).await;
    let pw = [("api_password", "tv-pw")];
    for path in ["/playlist.m3u", "/status", "/status.json", "/metrics"] {
        let r = request("GET", &s.url(path), &pw).await;
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
        assert_eq!(r.headers["cache-control"], "private, no-store", "{path}");
    }
    let r = request("GET", &s.url("/epg.xml"), &pw).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.headers["cache-control"], "private, max-age=300");
    // The open health check is left as it was.
    let r = get(&s.url("/health")).await;
    assert_eq!(r.status, 200);
    assert!(r.headers.get("cache-control").is_none());
}

/// Finding: the status page had no Content-Security-Policy, `X-Frame-Options` or
/// `X-Content-Type-Options` while the other pages have all three (it ran an inline script), and
/// `/status.json` and `/metrics` no `nosniff`. The page now has the player's headers, its script
/// and style in files beside it that the real server routes and serves behind the same password.
#[tokio::test]
async fn the_status_page_has_the_headers_the_other_pages_have() {
    let mut config = test_config();
    config.auth.api_password = "tv-pw".into();
    let s = Sluice::start(config).await;
    let pw = [("api_password", "tv-pw")];
    for (page, dir) in [("/status", "status/"), ("/status/", "")] {
        let r = request("GET", &s.url(page), &pw).await;
        assert_eq!(r.status, 200, "{page}: {:?}", r.body);
        let csp = r.headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self';"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(r.headers["x-frame-options"], "DENY", "{page}");
        assert_eq!(r.headers["x-content-type-options"], "nosniff", "{page}");
        assert_eq!(r.headers["referrer-policy"], "no-referrer", "{page}");
        let html = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        // No inline code: the one script names a file, and has no body.
        assert!(!html.contains("<style"), "{html}");
        assert!(html.contains(&format!("<script src=\"{dir}status.js\" defer></script>")));
        assert!(
            html.contains(&format!("href=\"{dir}status.css\"")),
            "{html}"
        );
    }
    // The files the page names, relative to `/status` (so `/status/…`), served behind the same
    // password with the same headers.
    for (file, content_type, holds) in [
        (
            "/status/status.js",
            "text/javascript; charset=utf-8",
            "new EventSource(",
        ),
        ("/status/status.css", "text/css; charset=utf-8", ".bad{"),
    ] {
        assert_eq!(get(&s.url(file)).await.status, 401, "{file}");
        let r = request("GET", &s.url(file), &pw).await;
        assert_eq!(r.status, 200, "{file}: {:?}", r.body);
        assert_eq!(r.headers["content-type"], content_type);
        assert_eq!(r.headers["x-content-type-options"], "nosniff", "{file}");
        assert!(r.headers.contains_key("content-security-policy"), "{file}");
        let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(text.contains(holds), "{file}: {text}");
    }
    for path in ["/status.json", "/metrics"] {
        let r = request("GET", &s.url(path), &pw).await;
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
        assert_eq!(r.headers["x-content-type-options"], "nosniff", "{path}");
    }
}
