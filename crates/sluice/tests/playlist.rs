//! `/playlist/playlist` (MediaFlow's M3U merger), `POST /playlist/link` and the pages, against a
//! local origin serving real channel lists and an HLS stream.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice::auth::token::TokenGate;
use sluice::config::{AuthConfig, Config};
use support::{enc, get, request, test_config, Reply, Sluice};
use tokio::net::TcpListener;

const PW: &str = "playlist-test-password-5521";

const LIST_A: &str = "#EXTM3U url-tvg=\"http://epg.example/guide.xml\"\r\n\
#EXTINF:-1 tvg-id=\"news\" group-title=\"News, World\",News\r\n\
#EXTVLCOPT:http-user-agent=VLC-UA/3.0\r\n\
#EXTVLCOPT:http-referrer=https://site.example/\r\n\
{ORIGIN}/live/index.m3u8\r\n\
#EXTINF:-1,Movies\r\n\
#KODIPROP:inputstream=inputstream.adaptive\r\n\
#KODIPROP:inputstream.adaptive.license_type=clearkey\r\n\
#KODIPROP:inputstream.adaptive.license_key=00112233445566778899aabbccddeeff:ffeeddccbbaa99887766554433221100\r\n\
https://dash.example/movies/manifest.mpd\r\n";

const LIST_B: &str = "#EXTM3U\n#EXTINF:-1,zulu\nhttp://cdn.example/z.m3u8\n\
#EXTINF:-1,Alpha\n#EXTHTTP:{\"Origin\":\"https://o.example\"}\nhttp://cdn.example/a.m3u8\n";

const LIST_C: &str = "#EXTM3U\n#EXTINF:-1,mike\nhttp://direct.example/m.ts\n";

const MEDIA_PLAYLIST: &str = "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n\
#EXT-X-PLAYLIST-TYPE:VOD\n#EXTINF:2.0,\nseg0.ts\n#EXT-X-ENDLIST\n";

/// The origin: channel lists, one HLS playlist, an HTML page and a 404; records user agents.
struct Origin {
    addr: SocketAddr,
    agents: Arc<Mutex<Vec<(String, String)>>>,
}

impl Origin {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

async fn origin() -> Origin {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let agents = Arc::new(Mutex::new(Vec::new()));
    let seen = agents.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move { Ok::<_, Infallible>(answer(req, addr, &seen)) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Origin { addr, agents }
}

fn answer(
    req: Request<Incoming>,
    addr: SocketAddr,
    seen: &Mutex<Vec<(String, String)>>,
) -> Response<Full<Bytes>> {
    let ua = req
        .headers()
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    seen.lock()
        .unwrap()
        .push((req.uri().path().to_string(), ua));
    let (status, ctype, body) = match req.uri().path() {
        "/a.m3u" => (
            200,
            "audio/x-mpegurl",
            LIST_A.replace("{ORIGIN}", &format!("http://{addr}")),
        ),
        "/b.m3u" => (200, "audio/x-mpegurl", LIST_B.to_string()),
        "/c.m3u" => (200, "audio/x-mpegurl", LIST_C.to_string()),
        "/live/index.m3u8" => (
            200,
            "application/vnd.apple.mpegurl",
            MEDIA_PLAYLIST.to_string(),
        ),
        "/login.html" => (200, "text/html", "<!doctype html><p>log in</p>".to_string()),
        path => match many(path) {
            Some(list) => (200, "audio/x-mpegurl", list),
            None => (404, "text/plain", "not found".to_string()),
        },
    };
    Response::builder()
        .status(status)
        .header("content-type", ctype)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// `/many/<first>/<n>.m3u`: `n` channels numbered from `first`, one short URL each.
fn many(path: &str) -> Option<String> {
    let (first, n) = path
        .strip_prefix("/many/")?
        .strip_suffix(".m3u")?
        .split_once('/')?;
    let (first, n): (usize, usize) = (first.parse().ok()?, n.parse().ok()?);
    let mut list = String::from("#EXTM3U\n");
    for i in first..first + n {
        list.push_str(&format!("#EXTINF:-1,ch{i}\nhttp://cdn.example/{i}\n"));
    }
    Some(list)
}

fn config(password: &str, allow_private: bool) -> Config {
    let mut c = test_config();
    c.auth.api_password = password.to_string();
    c.upstream.allow_private = allow_private;
    c
}

fn gate() -> TokenGate {
    TokenGate::new(&AuthConfig {
        api_password: PW.into(),
        ..AuthConfig::default()
    })
    .unwrap()
}

fn text(r: &Reply) -> String {
    String::from_utf8(r.body.clone().unwrap().to_vec()).unwrap()
}

/// Replaces every sealed entry URL with what its token grants, so a whole list can be compared.
fn opened(list: &str, sluice: &Sluice) -> String {
    let prefix = format!("http://{}/_token_", sluice.addr);
    let gate = gate();
    list.lines()
        .map(|line| match line.strip_prefix(&prefix) {
            Some(rest) => {
                let (token, path) = rest.split_once('/').unwrap();
                let o = gate
                    .open(
                        token,
                        "127.0.0.1".parse().unwrap(),
                        sluice::auth::token::now(),
                    )
                    .unwrap();
                let params: Vec<String> =
                    o.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!(
                    "<token /{path} scope={:?} exp={:?} {}>",
                    o.scope.paths.unwrap(),
                    o.scope.exp,
                    params.join(" ")
                )
            }
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn post_json(url: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut b = Request::builder()
        .method("POST")
        .uri(url)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client
        .request(b.body(Full::new(Bytes::from(body.to_string()))).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| e.to_string()),
    }
}

fn sources(o: &Origin) -> String {
    format!(
        "{};sort:{};sort:no_proxy:{};{}",
        o.url("/a.m3u"),
        o.url("/b.m3u"),
        o.url("/c.m3u"),
        o.url("/gone.m3u")
    )
}

#[tokio::test]
async fn merges_sources_into_sealed_entries() {
    let o = origin().await;
    let s = Sluice::start(config(PW, true)).await;
    let r = get(&s.url(&format!(
        "/playlist/playlist?d={}&api_password={PW}",
        enc(&sources(&o))
    )))
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.headers["content-type"], "application/vnd.apple.mpegurl");
    assert_eq!(
        r.headers["content-disposition"],
        "attachment; filename=\"playlist.m3u\""
    );
    let list = text(&r);
    assert!(!list.contains(PW), "the password leaked into the list");
    let live = o.url("/live/index.m3u8");
    let want = format!(
        "#EXTM3U url-tvg=\"http://epg.example/guide.xml\"\n\
#EXTINF:-1,Alpha\n\
#EXTHTTP:{{\"Origin\":\"https://o.example\"}}\n\
<token /proxy/hls/manifest.m3u8 scope=[\"=/proxy/hls/manifest.m3u8\"] exp=None d=http://cdn.example/a.m3u8 h_origin=https://o.example>\n\
#EXTINF:-1,mike\n\
http://direct.example/m.ts\n\
#EXTINF:-1,zulu\n\
<token /proxy/hls/manifest.m3u8 scope=[\"=/proxy/hls/manifest.m3u8\"] exp=None d=http://cdn.example/z.m3u8>\n\
#EXTINF:-1 tvg-id=\"news\" group-title=\"News, World\",News\n\
#EXTVLCOPT:http-user-agent=VLC-UA/3.0\n\
#EXTVLCOPT:http-referrer=https://site.example/\n\
<token /proxy/hls/manifest.m3u8 scope=[\"=/proxy/hls/manifest.m3u8\"] exp=None d={live} h_user-agent=VLC-UA/3.0 h_referer=https://site.example/>\n\
#EXTINF:-1,Movies\n\
#KODIPROP:inputstream=inputstream.adaptive\n\
<token /proxy/mpd/manifest.m3u8 scope=[\"=/proxy/mpd/manifest.m3u8\"] exp=None d=https://dash.example/movies/manifest.mpd key_id=00112233445566778899aabbccddeeff key=ffeeddccbbaa99887766554433221100>\n\
# ERROR playlist 4: upstream answered 404 Not Found"
    );
    assert_eq!(opened(&list, &s), want);

    // The entry plays: its token opens the HLS endpoint, and the headers the list asked for reach
    // the origin.
    let entry = list
        .lines()
        .find(|l| l.contains("/_token_") && opened(l, &s).contains("h_user-agent"))
        .unwrap();
    let r = get(entry).await;
    assert_eq!(r.status, StatusCode::OK);
    let playlist = text(&r);
    assert!(playlist.starts_with("#EXTM3U\n"), "{playlist}");
    assert!(playlist.contains("/_token_"), "{playlist}");
    let agents = o.agents.lock().unwrap().clone();
    assert!(
        agents.contains(&("/live/index.m3u8".to_string(), "VLC-UA/3.0".to_string())),
        "{agents:?}"
    );
    // The sources themselves were fetched once each, with sluice's own user agent.
    for path in ["/a.m3u", "/b.m3u", "/c.m3u"] {
        assert_eq!(
            agents.iter().filter(|(p, _)| p == path).count(),
            1,
            "{path}"
        );
    }
}

#[tokio::test]
async fn without_a_password_entries_are_plain_urls() {
    let o = origin().await;
    let s = Sluice::start(config("", true)).await;
    let d = format!("{};no_proxy:{}", o.url("/b.m3u"), o.url("/c.m3u"));
    let r = get(&s.url(&format!("/playlist/playlist?d={}", enc(&d)))).await;
    assert_eq!(r.status, StatusCode::OK);
    let base = format!("http://{}", s.addr);
    assert_eq!(
        text(&r),
        format!(
            "#EXTM3U\n#EXTINF:-1,zulu\n\
{base}/proxy/hls/manifest.m3u8?d=http%3A%2F%2Fcdn.example%2Fz.m3u8\n\
#EXTINF:-1,Alpha\n#EXTHTTP:{{\"Origin\":\"https://o.example\"}}\n\
{base}/proxy/hls/manifest.m3u8?d=http%3A%2F%2Fcdn.example%2Fa.m3u8&h_origin=https%3A%2F%2Fo.example\n\
#EXTINF:-1,mike\nhttp://direct.example/m.ts\n"
        )
    );
    let head = request(
        "HEAD",
        &s.url(&format!("/playlist/playlist?d={}", enc(&d))),
        &[],
    )
    .await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.body.unwrap().len(), 0);
    assert_eq!(head.headers["content-length"], r.headers["content-length"]);
}

#[tokio::test]
async fn playlist_needs_the_password_or_its_own_token() {
    let o = origin().await;
    let s = Sluice::start(config(PW, true)).await;
    let d = enc(&o.url("/c.m3u"));
    let none = get(&s.url(&format!("/playlist/playlist?d={d}"))).await;
    assert_eq!(none.status, StatusCode::FORBIDDEN);
    let wrong = get(&s.url(&format!("/playlist/playlist?d={d}&api_password=nope"))).await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    // A media child token does not open the merger (it would fetch any list).
    let child = gate().mint(
        &[("d".to_string(), o.url("/c.m3u"))],
        &["/proxy/hls/"],
        None,
        true,
        sluice::auth::token::now(),
    );
    let r = get(&s.url(&format!("/_token_{child}/playlist/playlist"))).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(
        o.agents.lock().unwrap().is_empty(),
        "a refused request reached the origin"
    );
}

#[tokio::test]
async fn link_mints_a_sealed_playlist_url() {
    let o = origin().await;
    let s = Sluice::start(config(PW, true)).await;
    let d = format!("sort:{};{}", o.url("/b.m3u"), o.url("/c.m3u"));
    let body = serde_json::json!({ "d": d }).to_string();

    // The password only in the header: not in the query, not as a token.
    let r = post_json(&s.url("/playlist/link"), &[], &body).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = post_json(
        &s.url(&format!("/playlist/link?api_password={PW}")),
        &[],
        &body,
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = get(&s.url("/playlist/link")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = post_json(
        &s.url("/playlist/link"),
        &[("api_password", PW)],
        "{\"d\":\"ftp://x\"}",
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);

    let r = post_json(&s.url("/playlist/link"), &[("api_password", PW)], &body).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let v: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    let url = v["url"].as_str().unwrap().to_string();
    assert!(!url.contains(PW));
    let token = url
        .strip_prefix(&format!("http://{}/_token_", s.addr))
        .and_then(|rest| rest.strip_suffix("/playlist/playlist"))
        .unwrap();
    let grant = gate()
        .open(
            token,
            "127.0.0.1".parse().unwrap(),
            sluice::auth::token::now(),
        )
        .unwrap();
    assert_eq!(grant.params, vec![("d".to_string(), d.clone())]);
    assert_eq!(
        grant.scope.paths,
        Some(vec!["/playlist/playlist".to_string()])
    );
    assert_eq!(grant.scope.exp, None);

    let via_link = get(&url).await;
    assert_eq!(via_link.status, StatusCode::OK);
    let via_password = get(&s.url(&format!(
        "/playlist/playlist?d={}&api_password={PW}",
        enc(&d)
    )))
    .await;
    assert_eq!(
        opened(&text(&via_link), &s),
        opened(&text(&via_password), &s)
    );

    // The token fixes `d` and opens nothing else.
    let r = get(&format!("{url}?d={}", enc(&o.url("/a.m3u")))).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = get(&url.replace("/playlist/playlist", "/proxy/stream")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    // An expiring link carries its expiry.
    let r = post_json(
        &s.url("/playlist/link"),
        &[("api_password", PW)],
        &serde_json::json!({ "d": d, "expiration": 3600 }).to_string(),
    )
    .await;
    let v: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    let url = v["url"].as_str().unwrap();
    let token = url
        .split("/_token_")
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let exp = gate()
        .open(
            token,
            "127.0.0.1".parse().unwrap(),
            sluice::auth::token::now(),
        )
        .unwrap()
        .scope
        .exp
        .unwrap();
    let now = sluice::auth::token::now();
    assert!(exp > now + 3500 && exp <= now + 3600, "{exp} vs {now}");
}

/// A link is minted only for the password itself, never under a token: a MediaFlow token meant
/// to last a minute for one address (or a sealed one) must not buy a `/playlist/playlist` link
/// that never expires and opens from anywhere. Refused whatever `expiration` the body asks for.
#[tokio::test]
async fn a_token_cannot_be_traded_for_a_playlist_link() {
    let o = origin().await;
    let s = Sluice::start(config(PW, true)).await;
    let now = sluice::auth::token::now();
    let mf = sluice_media::token::TokenKey::new(PW).encrypt(
        &[("api_password".to_string(), PW.to_string())],
        Some(now + 60),
        Some("127.0.0.1"),
        [7; 16],
    );
    let sealed = gate().mint(&[], &["/playlist/"], None, false, now);
    let d = format!("sort:{};{}", o.url("/b.m3u"), o.url("/c.m3u"));
    for token in [&mf, &sealed] {
        for expiration in [0, 3600] {
            let body = serde_json::json!({ "d": d, "expiration": expiration }).to_string();
            for url in [
                s.url(&format!("/_token_{token}/playlist/link")),
                s.url(&format!("/playlist/link?token={token}")),
            ] {
                let r = post_json(&url, &[], &body).await;
                assert_eq!(r.status, StatusCode::FORBIDDEN, "{url}");
                assert!(!text(&r).contains("playlist/playlist"), "{}", text(&r));
            }
        }
    }
    assert!(
        o.agents.lock().unwrap().is_empty(),
        "a refused request reached the origin"
    );
}

#[tokio::test]
async fn bad_requests_and_dead_sources() {
    let o = origin().await;
    let s = Sluice::start(config(PW, true)).await;
    let ask = |d: String| {
        let url = s.url(&format!(
            "/playlist/playlist?d={}&api_password={PW}",
            enc(&d)
        ));
        async move { get(&url).await }
    };
    let r = get(&s.url(&format!("/playlist/playlist?api_password={PW}"))).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = ask(" ; ".into()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = ask(format!("{};file:///etc/passwd", o.url("/a.m3u"))).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        text(&r).contains("playlist 2 in `d` is not an http(s) URL"),
        "{}",
        text(&r)
    );
    let r = ask(vec![o.url("/a.m3u"); 17].join(";")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = request(
        "POST",
        &s.url(&format!("/playlist/playlist?d=x&api_password={PW}")),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);

    // Every source dead: a 502 that says why for each.
    let r = ask(format!("{};{}", o.url("/gone.m3u"), o.url("/login.html"))).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let body = text(&r);
    assert!(
        body.contains("playlist 1: upstream answered 404 Not Found"),
        "{body}"
    );
    assert!(
        body.contains("playlist 2: upstream sent an HTML page, not a playlist"),
        "{body}"
    );

    // The SSRF guard applies: a private origin is refused without allow_private.
    let guarded = Sluice::start(config(PW, false)).await;
    let r = get(&guarded.url(&format!(
        "/playlist/playlist?d={}&api_password={PW}",
        enc(&o.url("/a.m3u"))
    )))
    .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    // Nothing asked for `/a.m3u` got there: the bad `d`s were refused before any fetch, and the
    // guard refused the loopback origin.
    assert!(!o.agents.lock().unwrap().iter().any(|(p, _)| p == "/a.m3u"));
}

#[tokio::test]
async fn pages_are_embedded_and_locked_down() {
    let s = Sluice::start(config(PW, true)).await;
    let basic = {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("viewer:{PW}"))
        )
    };
    const CSP: &str =
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                       img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";
    for (path, ctype, marker) in [
        ("/", "text/html; charset=utf-8", "<title>sluice</title>"),
        (
            "/playlist/builder",
            "text/html; charset=utf-8",
            "<title>Playlist builder",
        ),
        (
            "/playlist_builder.html",
            "text/html; charset=utf-8",
            "<title>Playlist builder",
        ),
        (
            "/url-generator",
            "text/html; charset=utf-8",
            "<title>URL generator",
        ),
        (
            "/url_generator.html",
            "text/html; charset=utf-8",
            "<title>URL generator",
        ),
        ("/pages/pages.css", "text/css; charset=utf-8", ":root"),
        (
            "/pages/builder.js",
            "text/javascript; charset=utf-8",
            "/playlist/link",
        ),
        (
            "/pages/url-generator.js",
            "text/javascript; charset=utf-8",
            "/generate_url",
        ),
    ] {
        // With a password the pages ask for it: signed in (HTTP Basic, any user name) they load.
        let r = get(&s.url(path)).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}");
        let r = request("GET", &s.url(path), &[("authorization", basic.as_str())]).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.headers["content-type"], ctype, "{path}");
        assert_eq!(r.headers["content-security-policy"], CSP, "{path}");
        assert_eq!(r.headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(r.headers["referrer-policy"], "no-referrer", "{path}");
        assert!(text(&r).contains(marker), "{path}");
    }
    let home = text(&request("GET", &s.url("/"), &[("authorization", basic.as_str())]).await);
    assert!(home.contains(&format!("sluice {} is running", env!("CARGO_PKG_VERSION"))));
    // A form posted without its script (which would otherwise be a GET carrying the password).
    let r = request(
        "POST",
        &s.url("/url-generator"),
        &[("authorization", basic.as_str())],
    )
    .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    let r = request(
        "GET",
        &s.url("/pages/nothing.js"),
        &[("authorization", basic.as_str())],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_failed_source_is_named_by_its_position_not_its_host_or_password() {
    let o = origin().await;
    let s = Sluice::start(config(PW, true)).await;
    // A port nobody listens on, by a host name, with credentials in the URL.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = format!("http://merge-user:hunter2-secret@localhost:{closed}/get.php?type=m3u");
    let ask = |d: String| {
        let url = s.url(&format!(
            "/playlist/playlist?d={}&api_password={PW}",
            enc(&d)
        ));
        async move { get(&url).await }
    };
    let r = ask(format!("{};{dead}", o.url("/c.m3u"))).await;
    assert_eq!(r.status, StatusCode::OK);
    let list = text(&r);
    let named = |answer: &str| {
        ["localhost", "hunter2-secret", "merge-user", "get.php"]
            .into_iter()
            .find(|secret| answer.contains(secret))
    };
    assert_eq!(named(&list), None, "{list}");
    assert_eq!(
        list,
        "#EXTM3U\n#EXTINF:-1,mike\n\
         <sealed>\n\
         # ERROR playlist 2: the source refused or dropped the connection\n"
            .replace(
                "<sealed>",
                list.lines()
                    .nth(2)
                    .filter(|l| l.contains("/_token_"))
                    .unwrap()
            )
    );
    // Every source dead: the 502 names none either.
    let r = ask(dead.clone()).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let body = text(&r);
    assert_eq!(named(&body), None, "{body}");
    assert!(
        body.contains("playlist 1: the source refused or dropped the connection"),
        "{body}"
    );
}

#[tokio::test]
async fn merged_lists_over_the_entry_bound_are_refused_as_the_sources_fault() {
    let o = origin().await;
    let mut c = config(PW, true);
    c.media.max_merged_entries = 2000;
    let s = Sluice::start(c).await;
    let ask = |d: String| {
        let url = s.url(&format!(
            "/playlist/playlist?d={}&api_password={PW}",
            enc(&d)
        ));
        async move { get(&url).await }
    };
    let prefix = format!("http://{}/_token_", s.addr);

    // At the bound, over two sources: every entry there, every one sealed.
    let r = ask(format!(
        "{};sort:{}",
        o.url("/many/0/1200.m3u"),
        o.url("/many/1200/800.m3u")
    ))
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let list = text(&r);
    let sealed: Vec<&str> = list.lines().filter(|l| l.starts_with(&prefix)).collect();
    assert_eq!(sealed.len(), 2000);
    assert_eq!(
        list.lines().filter(|l| l.starts_with("#EXTINF")).count(),
        2000
    );
    assert!(!list.contains("cdn.example"), "an entry left unsealed");
    let opened = opened(sealed[1999], &s);
    assert!(opened.contains("d=http://cdn.example/1199>"), "{opened}");

    // One more, or one hostile source far over it alone: a 502 booked to the sources, whose
    // body names none of them.
    let started = std::time::Instant::now();
    for d in [
        format!(
            "{};{}",
            o.url("/many/0/1200.m3u"),
            o.url("/many/1200/801.m3u")
        ),
        format!("sort:{}", o.url("/many/0/100000.m3u")),
    ] {
        let r = ask(d).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY);
        let body = text(&r);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["kind"], "too_many_entries", "{json}");
        assert_eq!(json["side"], "upstream", "{json}");
        assert!(
            json["error"]
                .as_str()
                .unwrap()
                .contains("more than 2000 entries"),
            "{json}"
        );
        assert!(
            !body.contains("127.0.0.1") && !body.contains("/many/"),
            "{body}"
        );
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));

    // The server goes on answering, and counted both against the upstream side.
    let r = ask(sources(&o)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(text(&r).contains(&prefix));
    let metrics = text(&get(&s.url(&format!("/metrics?api_password={PW}"))).await);
    let series = "sluice_errors_total{side=\"upstream\",kind=\"too_many_entries\"} 2";
    assert!(metrics.contains(series), "{series} missing:\n{metrics}");
}
