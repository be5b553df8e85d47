//! The Xtream Codes proxy against a scripted XC server on 127.0.0.1:0: login, categories,
//! live/VOD/series lists, live stream, VOD with Range, catch-up, M3U, wrong API password.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use support::{get, pattern, request, sha256, test_config, Sluice};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const API_PW: &str = "server-api-password-7431";
const XC_USER: &str = "alice";
const XC_PASS: &str = "xcsecret";
const MOVIE_LEN: usize = 1_000_003;
/// The password the scripted panel answers 403 to.
const BANNED_PASS: &str = "banned-line";
/// The password the scripted panel answers a 2 MiB login to (`[0,0,0,...]`).
const HUGE_LOGIN_PASS: &str = "huge-login";
/// The password the scripted panel answers an M3U of 50,000 short stream URLs to.
const SHORT_URLS_PASS: &str = "short-urls";
/// The action the scripted panel answers a 6.9 MB stream list to that names no stream URL, so it
/// is sent as it came. Over 6.4 MiB, a fifth of four 8 MiB answers' budget: with answers up to
/// 8 MiB, four of them held leave too little for a fifth, and three a share (24 MiB) too little
/// for a fourth, whatever room a buffer being read grew into.
const BIG_ACTION: &str = "get_big_list";
const BIG_LEN: usize = 6_900_000;
/// An action the scripted panel does not know, so answers the login object to (as a real one does).
const LOGIN_ACTION: &str = "bogus";
/// The host name the scripted panel gives for itself in `server_info`.
const PANEL_HOST: &str = "xc-panel.test";
/// The password the scripted panel answers `panel_api.php` to with [`BIG_PANEL_CHANNELS`] channels
/// beside the login object (a few MB, as a large provider's is).
const BIG_PANEL_PASS: &str = "big-panel";
const BIG_PANEL_CHANNELS: usize = 6_000;
/// The password the scripted panel answers `panel_api.php` to with a `user_info` over 1 MiB.
const HUGE_USER_INFO_PASS: &str = "huge-user-info";
/// The password the scripted panel answers an M3U to of `n` entries, each a channel name of `pad`
/// bytes and a short stream URL (both from the query).
const GROWING_PASS: &str = "growing";
/// The password the scripted panel answers stream lists and an M3U to whose stream URLs (for
/// `alice`/`xcsecret`, so they play) name the panel in other spellings and other hosts.
const SPELLINGS_PASS: &str = "spellings";
/// The hosts those URLs name besides the panel's own address.
const CDN_HOST: &str = "Cdn7.XC-Stream.test";
/// A live stream the scripted panel never answers (it holds the request 5 s).
const HELD_STREAM: &str = "/live/alice/xcsecret/999.ts";

/// A scripted XC panel: answers as a real one does for `alice`/`xcsecret`, records each request.
struct Panel {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

fn live_bytes() -> Bytes {
    pattern(188 * 500)
}

async fn panel() -> Panel {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let s = s.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let s = s.clone();
                    async move {
                        if req.uri().path() == HELD_STREAM {
                            s.lock().unwrap().push(HELD_STREAM.to_string());
                            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                        }
                        Ok::<_, Infallible>(panel_answer(req, addr, &s))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Panel { addr, seen }
}

fn panel_answer(
    req: Request<Incoming>,
    addr: SocketAddr,
    seen: &Mutex<Vec<String>>,
) -> Response<Full<Bytes>> {
    let pq = req.uri().path_and_query().unwrap().to_string();
    seen.lock().unwrap().push(pq.clone());
    let query: Vec<(String, String)> =
        url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let q = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let creds_ok = q("username") == Some(XC_USER) && q("password") == Some(XC_PASS);
    let json = |body: String| {
        Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    let origin = format!("http://{addr}");
    let escaped = origin.replace('/', "\\/");
    let path = req.uri().path();
    match path {
        // A provider that refuses the account outright (a banned or expired line).
        "/player_api.php" if q("password") == Some(BANNED_PASS) => Response::builder()
            .status(StatusCode::FORBIDDEN)
            .body(Full::new(Bytes::new()))
            .unwrap(),
        "/player_api.php" if q("password") == Some(HUGE_LOGIN_PASS) => {
            let mut zeros = "[0".to_string();
            while zeros.len() < 2 * 1024 * 1024 {
                zeros.push_str(",0");
            }
            zeros.push(']');
            json(zeros)
        }
        "/get.php" if q("password") == Some(SHORT_URLS_PASS) => Response::new(Full::new(
            Bytes::from(format!("{origin}/{XC_USER}/p/1\n").repeat(50_000)),
        )),
        "/get.php" if q("password") == Some(GROWING_PASS) => {
            let n = |k| q(k).unwrap().parse::<usize>().unwrap();
            Response::new(Full::new(Bytes::from(
                growing_entry(&origin, XC_USER, n("pad")).repeat(n("n")),
            )))
        }
        "/player_api.php" if q("password") == Some(SPELLINGS_PASS) => json(format!(
            "[{}]",
            spelled_urls(addr)
                .iter()
                .map(|u| format!(r#"{{"name":"x","direct_source":"{}"}}"#, u.replace('/', "\\/")))
                .collect::<Vec<_>>()
                .join(",")
        )),
        "/get.php" if q("password") == Some(SPELLINGS_PASS) => Response::new(Full::new(
            Bytes::from(format!("#EXTM3U\n{}\n", spelled_urls(addr).join("\n#EXTINF:-1,x\n"))),
        )),
        "/player_api.php" if !creds_ok => json(r#"{"user_info":{"auth":0}}"#.into()),
        "/panel_api.php" if q("password") == Some(BIG_PANEL_PASS) => json(format!(
            r#"{{"user_info":{},"server_info":{},"available_channels":{}}}"#,
            user_info(),
            server_info(addr),
            big_panel_channels(&escaped)
        )),
        "/panel_api.php" if q("password") == Some(HUGE_USER_INFO_PASS) => json(format!(
            r#"{{"user_info":{{"username":"{XC_USER}","notes":"{}"}},"server_info":{}}}"#,
            "x".repeat(1024 * 1024),
            server_info(addr)
        )),
        // The older combined API: the login object with every channel beside it.
        "/panel_api.php" if creds_ok => json(format!(
            r#"{{"user_info":{},"server_info":{},"available_channels":{{"101":{{"name":"News One","direct_source":"{escaped}\/live\/{XC_USER}\/{XC_PASS}\/101.ts"}}}}}}"#,
            user_info(),
            server_info(addr)
        )),
        "/player_api.php" => match q("action") {
            // A real panel answers the login object to an empty or unknown action too.
            None | Some("" | LOGIN_ACTION) => json(format!(
                r#"{{"user_info":{},"server_info":{}}}"#,
                user_info(),
                server_info(addr)
            )),
            Some("get_live_categories") => {
                json(r#"[{"category_id":"1","category_name":"News","parent_id":0}]"#.into())
            }
            Some("get_live_streams") => json(format!(
                r#"[{{"num":1,"name":"News One","stream_id":101,"stream_icon":"{escaped}\/logos\/101.png","direct_source":"{escaped}\/live\/{XC_USER}\/{XC_PASS}\/101.ts","category_id":"1"}}]"#
            )),
            Some("get_vod_streams") => json(format!(
                r#"[{{"num":1,"name":"A Movie","stream_id":202,"container_extension":"mp4","direct_source":"{escaped}\/movie\/{XC_USER}\/{XC_PASS}\/202.mp4"}}]"#
            )),
            Some(BIG_ACTION) => {
                let item = r#"{"num":1,"name":"A Channel","stream_id":1},"#;
                let mut list = format!("[{}", item.repeat(BIG_LEN / item.len() + 1));
                list.truncate(BIG_LEN - 1);
                list.push(']');
                json(list)
            }
            Some("get_series") => json(
                r#"[{"num":1,"name":"A Series","series_id":303,"cover":"http:\/\/img.example\/c.jpg"}]"#.into(),
            ),
            Some(_) => json("[]".into()),
        },
        "/get.php" if creds_ok => Response::builder()
            .header("content-type", "audio/x-mpegurl")
            .body(Full::new(Bytes::from(format!(
                "#EXTM3U\n#EXTINF:-1 tvg-logo=\"{origin}/logos/101.png\",News One\n{origin}/live/{XC_USER}/{XC_PASS}/101.ts\n#EXTINF:-1,A Movie\n{origin}/movie/{XC_USER}/{XC_PASS}/202.mp4\n"
            ))))
            .unwrap(),
        "/streaming/timeshift.php" if creds_ok && q("stream") == Some("101") => {
            Response::new(Full::new(live_bytes()))
        }
        p if p == format!("/live/{XC_USER}/{XC_PASS}/101.ts")
            || p == format!("/timeshift/{XC_USER}/{XC_PASS}/60/2026-01-01:10-00/101.ts") =>
        {
            Response::builder()
                .header("content-type", "video/mp2t")
                .body(Full::new(live_bytes()))
                .unwrap()
        }
        p if p == format!("/movie/{XC_USER}/{XC_PASS}/202.mp4") => {
            let movie = pattern(MOVIE_LEN);
            match req.headers().get("range").and_then(|r| r.to_str().ok()) {
                Some(r) => {
                    let (a, b) = r.trim_start_matches("bytes=").split_once('-').unwrap();
                    let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
                    Response::builder()
                        .status(StatusCode::PARTIAL_CONTENT)
                        .header("content-type", "video/mp4")
                        .header("accept-ranges", "bytes")
                        .header("content-range", format!("bytes {a}-{b}/{MOVIE_LEN}"))
                        .body(Full::new(movie.slice(a..=b)))
                        .unwrap()
                }
                None => Response::builder()
                    .header("content-type", "video/mp4")
                    .header("accept-ranges", "bytes")
                    .body(Full::new(movie))
                    .unwrap(),
            }
        }
        _ => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    }
}

/// Stream URLs for `alice` as panels write them besides `http://{addr}`: the scheme and host in
/// another case, the default port written out, `https` on 443, a CDN host, the panel's own name,
/// the short form and a script's `username=` elsewhere. Every `.ts` and `.mp4` is one the panel
/// serves.
fn spelled_urls(addr: SocketAddr) -> Vec<String> {
    let port = addr.port();
    let creds = format!("{XC_USER}/{XC_PASS}");
    vec![
        format!("HTTP://127.0.0.1:{port}/live/{creds}/101.ts"),
        format!("hTTp://LOCALHOST:{port}/movie/{creds}/202.mp4"),
        format!("http://{CDN_HOST}:80/live/{creds}/101.ts"),
        format!("https://{PANEL_HOST}:443/live/{creds}/101.ts"),
        format!(
            "HTTPS://{}/timeshift/{creds}/60/2026-01-01:10-00/101.ts",
            PANEL_HOST.to_uppercase()
        ),
        format!("http://{CDN_HOST}/{creds}/101"),
        format!(
            "http://{PANEL_HOST}:{port}/get.php?username={XC_USER}&password={XC_PASS}&type=m3u"
        ),
    ]
}

/// The login object's `user_info` for `alice`.
fn user_info() -> String {
    format!(r#"{{"username":"{XC_USER}","password":"{XC_PASS}","auth":1,"status":"Active"}}"#)
}

/// The login object's `server_info`: the panel's own port, and a host name of its own (the
/// panel listens on loopback, as sluice does, so its address would not tell them apart).
fn server_info(addr: SocketAddr) -> String {
    format!(
        r#"{{"url":"{PANEL_HOST}","port":"{}","https_port":"443","server_protocol":"http","timezone":"UTC"}}"#,
        addr.port()
    )
}

/// `available_channels` of [`BIG_PANEL_CHANNELS`] channels as a real panel writes it, each with its
/// stream URL at `origin` (JSON-escaped, as the panel sends it) and its logo elsewhere.
fn big_panel_channels(origin: &str) -> String {
    let mut out = "{".to_string();
    for id in 1..=BIG_PANEL_CHANNELS {
        if id > 1 {
            out.push(',');
        }
        out.push_str(&format!(
            r#""{id}":{{"num":{id},"name":"Channel {id} HD","stream_type":"live","stream_id":{id},"stream_icon":"http:\/\/img.example\/logos\/{id}.png","epg_channel_id":"channel-{id}.example","added":"1700000000","category_name":"General Entertainment","category_id":"1","series_no":null,"live":"1","container_extension":"ts","custom_sid":"","tv_archive":1,"direct_source":"{origin}\/live\/{XC_USER}\/{BIG_PANEL_PASS}\/{id}.ts","tv_archive_duration":"7","type_name":"Live Streams","category_ids":[1]}}"#
        ));
    }
    out.push('}');
    out
}

/// One entry of the [`GROWING_PASS`] M3U: a channel name of `pad` bytes, then the short stream
/// URL for `user` at `origin`.
fn growing_entry(origin: &str, user: &str, pad: usize) -> String {
    format!("#EXTINF:-1,{}\n{origin}/{user}/p/1\n", "x".repeat(pad))
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

async fn setup() -> (Panel, Sluice) {
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    let s = Sluice::start(c).await;
    (p, s)
}

fn text(r: &support::Reply) -> String {
    String::from_utf8(r.body.as_ref().unwrap().to_vec()).unwrap()
}

/// Logs in with MediaFlow's base64 username and returns the username sluice hands back.
async fn login(p: &Panel, s: &Sluice) -> String {
    let user = b64(&format!("http://{}:{XC_USER}:{API_PW}", p.addr));
    let r = get(&s.url(&format!(
        "/player_api.php?username={user}&password={XC_PASS}"
    )))
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let body = text(&r);
    assert!(!body.contains(API_PW));
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["user_info"]["auth"], 1);
    assert_eq!(v["user_info"]["password"], XC_PASS);
    assert_eq!(v["server_info"]["url"], "127.0.0.1");
    assert_eq!(v["server_info"]["port"], s.addr.port().to_string());
    assert_eq!(v["server_info"]["server_protocol"], "http");
    let token = v["user_info"]["username"].as_str().unwrap().to_string();
    assert_ne!(token, user);
    assert_ne!(token, XC_USER);
    assert!(token
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b)));
    token
}

#[tokio::test]
async fn login_lists_and_streams_through_the_token_username() {
    let (p, s) = setup().await;
    let token = login(&p, &s).await;
    // The upstream saw the provider's own credentials only.
    assert!(p
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|q| q == &format!("/player_api.php?username={XC_USER}&password={XC_PASS}")));

    let cats = get(&s.url(&format!(
        "/player_api.php?username={token}&password={XC_PASS}&action=get_live_categories"
    )))
    .await;
    assert_eq!(
        text(&cats),
        r#"[{"category_id":"1","category_name":"News","parent_id":0}]"#
    );

    let live = get(&s.url(&format!(
        "/player_api.php?username={token}&password={XC_PASS}&action=get_live_streams"
    )))
    .await;
    let live_body = text(&live);
    let v: Value = serde_json::from_str(&live_body).unwrap();
    // Logos at the provider stay direct; the stream URL points at sluice with a token username.
    assert_eq!(
        v[0]["stream_icon"],
        format!("http://{}/logos/101.png", p.addr)
    );
    let direct = v[0]["direct_source"].as_str().unwrap();
    let prefix = format!("http://{}/live/", s.addr);
    let rest = direct.strip_prefix(&prefix).unwrap();
    let (list_user, tail) = rest.split_once('/').unwrap();
    assert_eq!(tail, format!("{XC_PASS}/101.ts"));
    assert!(!live_body.contains(API_PW));
    assert!(
        live_body.contains("\\/live\\/"),
        "escaping kept: {live_body}"
    );

    // The live stream through the URL the list gave.
    let r = get(direct).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "video/mp2t");
    assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&live_bytes()));
    assert!(p
        .seen
        .lock()
        .unwrap()
        .contains(&format!("/live/{XC_USER}/{XC_PASS}/101.ts")));

    let vod = get(&s.url(&format!(
        "/player_api.php?username={list_user}&password={XC_PASS}&action=get_vod_streams"
    )))
    .await;
    let v: Value = serde_json::from_str(&text(&vod)).unwrap();
    assert!(v[0]["direct_source"]
        .as_str()
        .unwrap()
        .starts_with(&format!("http://{}/movie/", s.addr)));

    let series = get(&s.url(&format!(
        "/player_api.php?username={token}&password={XC_PASS}&action=get_series"
    )))
    .await;
    assert_eq!(
        text(&series),
        r#"[{"num":1,"name":"A Series","series_id":303,"cover":"http:\/\/img.example\/c.jpg"}]"#
    );
}

/// A panel writes its stream URLs in more than one spelling of its own origin (another letter case,
/// the default port written out, `https` on 443) and at other hosts (a CDN, its own name). Every
/// one is rewritten: the client's answer names neither the real username nor any of those hosts,
/// and the rewritten URLs play.
#[tokio::test]
async fn stream_urls_in_any_spelling_do_not_name_the_provider() {
    let (p, s) = setup().await;
    let token = login(&p, &s).await;
    let lower = |r: &support::Reply| text(r).to_ascii_lowercase();
    let hidden = [
        format!("127.0.0.1:{}", p.addr.port()),
        format!("localhost:{}", p.addr.port()),
        CDN_HOST.to_ascii_lowercase(),
        PANEL_HOST.to_string(),
    ];
    let list = get(&s.url(&format!(
        "/player_api.php?username={token}&password={SPELLINGS_PASS}&action=get_live_streams"
    )))
    .await;
    assert_eq!(list.status, StatusCode::OK);
    let m3u = get(&s.url(&format!(
        "/get.php?username={token}&password={SPELLINGS_PASS}&type=m3u"
    )))
    .await;
    assert_eq!(m3u.status, StatusCode::OK);
    for r in [&list, &m3u] {
        let body = text(r);
        assert!(!body.contains(XC_USER), "{body}");
        for host in &hidden {
            assert!(!lower(r).contains(host.as_str()), "{host} in {body}");
        }
    }
    let v: Value = serde_json::from_str(&text(&list)).unwrap();
    let urls: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["direct_source"].as_str().unwrap().to_string())
        .collect();
    let m3u_urls: Vec<String> = text(&m3u)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    // Each call mints its own username token, so the two lists differ only there.
    assert_eq!(urls.len(), spelled_urls(p.addr).len());
    assert_eq!(m3u_urls.len(), urls.len());
    for url in urls.iter().chain(&m3u_urls) {
        assert!(url.starts_with(&s.url("/")), "{url}");
    }
    // Each live one plays the panel's stream, whichever host it named, and the movie the movie.
    let live = |u: &&String| u.ends_with("101.ts");
    for url in urls.iter().chain(&m3u_urls).filter(live) {
        let r = get(url).await;
        assert_eq!(r.status, StatusCode::OK, "{url}");
        assert_eq!(
            sha256(r.body.as_ref().unwrap()),
            sha256(&live_bytes()),
            "{url}"
        );
    }
    let r = get(&urls[1]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", urls[1]);
    assert_eq!(
        sha256(r.body.as_ref().unwrap()),
        sha256(&pattern(MOVIE_LEN))
    );
}

/// XC panels answer the login object to more than the login: to `panel_api.php`, and to
/// `player_api.php` with an empty or unknown `action`. Through a token each names sluice as the
/// server and the token as the username, as the login does; the panel's address, port and the
/// account's username appear nowhere in the bytes (the password is the one the player sent).
#[tokio::test]
async fn login_objects_on_other_paths_do_not_name_the_provider() {
    let (p, s) = setup().await;
    let token = login(&p, &s).await;
    let port = p.addr.port().to_string();
    for path in [
        "/panel_api.php?".to_string(),
        "/player_api.php?action=&".to_string(),
        format!("/player_api.php?action={LOGIN_ACTION}&"),
    ] {
        let r = get(&s.url(&format!("{path}username={token}&password={XC_PASS}"))).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        let body = r.body.unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        // A token sealed for this answer (each has its own nonce) that opens the same account.
        let user = v["user_info"]["username"].as_str().unwrap();
        assert!(user.starts_with("s1.") && user != token, "{path}: {user}");
        let cats = get(&s.url(&format!(
            "/player_api.php?username={user}&password={XC_PASS}&action=get_live_categories"
        )))
        .await;
        assert_eq!(
            text(&cats),
            r#"[{"category_id":"1","category_name":"News","parent_id":0}]"#
        );
        assert_eq!(v["user_info"]["password"], XC_PASS, "{path}");
        assert_eq!(v["server_info"]["url"], "127.0.0.1", "{path}");
        assert_eq!(
            v["server_info"]["port"],
            s.addr.port().to_string(),
            "{path}"
        );
        assert_eq!(
            v["server_info"]["https_port"],
            s.addr.port().to_string(),
            "{path}"
        );
        let holds = |needle: &str| body.windows(needle.len()).any(|w| w == needle.as_bytes());
        for hidden in [
            PANEL_HOST.to_string(),
            p.addr.to_string(),
            port.clone(),
            XC_USER.to_string(),
        ] {
            assert!(!holds(&hidden), "{path}: {hidden} in {body:?}");
        }
    }
    // The channels beside the login object point at sluice under the token.
    let r = get(&s.url(&format!(
        "/panel_api.php?username={token}&password={XC_PASS}"
    )))
    .await;
    let v: Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
    let direct = v["available_channels"]["101"]["direct_source"]
        .as_str()
        .unwrap();
    let rest = direct
        .strip_prefix(&format!("http://{}/live/s1.", s.addr))
        .unwrap();
    assert!(rest.ends_with(&format!("/{XC_PASS}/101.ts")), "{direct}");
    let r = get(direct).await;
    assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&live_bytes()));
    // Each reached the panel under the account's own username.
    let seen = p.seen.lock().unwrap();
    for want in [
        format!("/panel_api.php?username={XC_USER}&password={XC_PASS}"),
        format!("/player_api.php?username={XC_USER}&action=&password={XC_PASS}"),
        format!("/player_api.php?username={XC_USER}&action={LOGIN_ACTION}&password={XC_PASS}"),
    ] {
        assert!(seen.contains(&want), "{want} not in {seen:?}");
    }
}

/// A real `panel_api.php` answer carries every channel beside the login object: a few MB for a
/// provider with thousands. Through a token it is served (it was a 502: the whole answer went to
/// the 1 MiB login parse), its `user_info` and `server_info` name the token and sluice, the
/// panel's host, port and the account's username appear nowhere, and the channels are the
/// panel's bytes with each stream URL pointed at sluice under the token (escaping kept). A
/// `user_info` alone over 1 MiB is still the provider's 502.
#[tokio::test]
async fn a_panel_answer_with_thousands_of_channels_is_served() {
    let (p, s) = setup().await;
    let token = login(&p, &s).await;
    let r = get(&s.url(&format!(
        "/panel_api.php?username={token}&password={BIG_PANEL_PASS}"
    )))
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let body = r.body.unwrap();
    assert!(body.len() > 3_500_000, "{}", body.len());
    let v: Value = serde_json::from_slice(&body).unwrap();
    let user = v["user_info"]["username"].as_str().unwrap();
    assert!(user.starts_with("s1.") && user != token, "{user}");
    assert_eq!(v["user_info"]["password"], XC_PASS);
    assert_eq!(v["server_info"]["url"], "127.0.0.1");
    assert_eq!(v["server_info"]["port"], s.addr.port().to_string());
    assert_eq!(v["server_info"]["https_port"], s.addr.port().to_string());
    let holds = |needle: &str| body.windows(needle.len()).any(|w| w == needle.as_bytes());
    for hidden in [
        PANEL_HOST.to_string(),
        p.addr.to_string(),
        XC_USER.to_string(),
    ] {
        assert!(!holds(&hidden), "{hidden} in the answer");
    }
    // The panel's port as a number of its own (a channel id may hold its digits).
    let port = p.addr.port().to_string();
    let alone = body.windows(port.len() + 2).any(|w| {
        w[1..=port.len()] == *port.as_bytes()
            && !w[0].is_ascii_digit()
            && !w[port.len() + 1].is_ascii_digit()
    });
    assert!(!alone, "port {port} in the answer");
    // The channels are the panel's, byte for byte but for the stream URLs.
    let panel_origin = format!("http://{}", p.addr).replace('/', "\\/");
    let sluice_origin = format!("http://{}", s.addr).replace('/', "\\/");
    let want = big_panel_channels(&panel_origin).replace(
        &format!("{panel_origin}\\/live\\/{XC_USER}\\/"),
        &format!("{sluice_origin}\\/live\\/{user}\\/"),
    );
    let channels = r#","available_channels":"#;
    let at = body
        .windows(channels.len())
        .position(|w| w == channels.as_bytes())
        .unwrap();
    assert_eq!(
        std::str::from_utf8(&body[at + channels.len()..body.len() - 1]).unwrap(),
        want
    );
    let direct = v["available_channels"]["4321"]["direct_source"]
        .as_str()
        .unwrap();
    assert_eq!(
        direct,
        format!("http://{}/live/{user}/{BIG_PANEL_PASS}/4321.ts", s.addr)
    );
    // A `user_info` over 1 MiB is not parsed: the provider's 502, naming no host.
    let r = get(&s.url(&format!(
        "/panel_api.php?username={token}&password={HUGE_USER_INFO_PASS}"
    )))
    .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let body = text(&r);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["side"], "upstream", "{body}");
    assert!(
        !body.contains("127.0.0.1") && !body.contains(XC_USER),
        "{body}"
    );
    assert!(p.seen.lock().unwrap().contains(&format!(
        "/panel_api.php?username={XC_USER}&password={BIG_PANEL_PASS}"
    )));
}

#[tokio::test]
async fn vod_range_head_and_catchup() {
    let (p, s) = setup().await;
    let token = login(&p, &s).await;
    let movie = pattern(MOVIE_LEN);
    let url = s.url(&format!("/movie/{token}/{XC_PASS}/202.mp4"));
    let r = request("GET", &url, &[("range", "bytes=1000-99999")]).await;
    assert_eq!(r.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        r.headers["content-range"],
        format!("bytes 1000-99999/{MOVIE_LEN}")
    );
    assert_eq!(
        sha256(r.body.as_ref().unwrap()),
        sha256(&movie[1000..=99999])
    );
    let whole = get(&url).await;
    assert_eq!(sha256(whole.body.as_ref().unwrap()), sha256(&movie));
    let head = request("HEAD", &url, &[]).await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.headers["content-length"], MOVIE_LEN.to_string());
    assert!(head.body.unwrap().is_empty());

    // Catch-up, path form and query form.
    let r = get(&s.url(&format!(
        "/timeshift/{token}/{XC_PASS}/60/2026-01-01:10-00/101.ts"
    )))
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&live_bytes()));
    let r = get(&s.url(&format!(
        "/streaming/timeshift.php?username={token}&password={XC_PASS}&stream=101&start=2026-01-01:10-00&duration=60"
    )))
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&live_bytes()));
    assert!(p
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|q| q.starts_with(&format!(
            "/streaming/timeshift.php?username={XC_USER}&password={XC_PASS}&stream=101"
        ))));
}

#[tokio::test]
async fn m3u_legacy_username_and_hls_redirect() {
    let (p, s) = setup().await;
    // MediaFlow's legacy colon form.
    let legacy = format!("{}:{XC_USER}:{API_PW}", b64(&format!("http://{}/", p.addr)));
    let r = get(&s.url(&format!(
        "/get.php?username={}&password={XC_PASS}&type=m3u_plus",
        support::enc(&legacy)
    )))
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let m3u = text(&r);
    assert!(!m3u.contains(API_PW));
    let lines: Vec<&str> = m3u.lines().collect();
    assert_eq!(lines[0], "#EXTM3U");
    assert_eq!(
        lines[1],
        format!(
            "#EXTINF:-1 tvg-logo=\"http://{}/logos/101.png\",News One",
            p.addr
        )
    );
    let live = lines[2];
    assert!(
        live.starts_with(&format!("http://{}/live/", s.addr)),
        "{live}"
    );
    assert!(lines[4].starts_with(&format!("http://{}/movie/", s.addr)));
    let r = get(live).await;
    assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&live_bytes()));

    // A live HLS stream is handed to the HLS proxy under a scoped token, never the password.
    let token = live
        .strip_prefix(&format!("http://{}/live/", s.addr))
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let r = get(&s.url(&format!("/live/{token}/{XC_PASS}/101.m3u8"))).await;
    assert_eq!(r.status, StatusCode::FOUND);
    let location = r.headers["location"].to_str().unwrap();
    assert!(location.starts_with(&format!("http://{}/_token_", s.addr)));
    assert!(location.ends_with("/proxy/hls/manifest.m3u8"));
    assert!(!location.contains(API_PW) && !location.contains(XC_PASS));
}

#[tokio::test]
async fn wrong_api_password_is_refused_before_any_upstream_request() {
    let (p, s) = setup().await;
    let mut bodies = Vec::new();
    for user in [
        b64(&format!("http://{}:{XC_USER}:wrong", p.addr)),
        b64(&format!("http://{}:{XC_USER}", p.addr)),
        support::enc(&format!(
            "{}:{XC_USER}:wrong",
            b64(&format!("http://{}", p.addr))
        )),
    ] {
        let r = get(&s.url(&format!(
            "/player_api.php?username={user}&password={XC_PASS}"
        )))
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        bodies.push(r.body.unwrap());
        let r = get(&s.url(&format!("/movie/{user}/{XC_PASS}/202.mp4"))).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        bodies.push(r.body.unwrap());
    }
    // Every refusal looks the same.
    assert!(bodies.windows(2).all(|w| w[0] == w[1]));
    assert!(p.seen.lock().unwrap().is_empty());

    // A forged or foreign token username is refused the same way.
    let r = get(&s.url(&format!("/live/sealedXXXX/{XC_PASS}/101.ts"))).await;
    assert!(r.status.is_client_error());
    // The XC token opens no /proxy/ path.
    let token = login(&p, &s).await;
    let r = get(&s.url(&format!(
        "/_token_{token}/proxy/stream?d=http://{}/x",
        p.addr
    )))
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // Bad usernames are a 400, not a panic.
    let r = get(&s.url("/player_api.php?username=nonsense&password=x")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = get(&s.url("/player_api.php?password=x")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

/// The holder of an XC username token may not learn the provider's address (the token hides it):
/// when the provider refuses or cannot be reached, the error sluice answers names no host.
#[tokio::test]
async fn provider_errors_do_not_name_the_provider() {
    let (p, s) = setup().await;
    let token = login(&p, &s).await;
    let hidden = |body: &str| {
        !body.contains(&p.addr.to_string())
            && !body.contains("127.0.0.1")
            && !body.contains(&format!(":{}", p.addr.port()))
    };
    for action in ["", "&action=get_live_streams"] {
        let r = get(&s.url(&format!(
            "/player_api.php?username={token}&password={BANNED_PASS}{action}"
        )))
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        let body = text(&r);
        assert!(hidden(&body), "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v.get("upstream").is_none(), "{body}");
    }
    assert!(p
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|q| q.contains(BANNED_PASS)));
    // A provider that is not there: the connection error names no host either.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = closed.local_addr().unwrap();
    drop(closed);
    let user = b64(&format!("http://{gone}:{XC_USER}:{API_PW}"));
    let r = get(&s.url(&format!(
        "/player_api.php?username={user}&password={XC_PASS}&action=get_live_streams"
    )))
    .await;
    assert!(r.status.is_server_error(), "{}", r.status);
    let body = text(&r);
    assert!(
        !body.contains(&gone.to_string()) && !body.contains("127.0.0.1"),
        "{body}"
    );
}

/// A MediaFlow token (which carries the API password) in front of an XC path: the provider's
/// refusal is reworded once, by the XC proxy, and keeps its wording ("the XC provider"), not a
/// second, vaguer one from the token's own rewording.
#[tokio::test]
async fn provider_errors_under_a_path_token_keep_their_wording() {
    let (p, s) = setup().await;
    let token = login(&p, &s).await;
    let key = sluice_media::token::TokenKey::new(API_PW);
    let mf = key.encrypt(
        &[("api_password".to_string(), API_PW.to_string())],
        None,
        None,
        [7; 16],
    );
    for url in [
        format!("/_token_{mf}/player_api.php?username={token}&password={BANNED_PASS}"),
        format!("/player_api.php?username={token}&password={BANNED_PASS}&token={mf}"),
    ] {
        let r = get(&s.url(&url)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{url}");
        let body = text(&r);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"], "the XC provider answered 403", "{body}");
        assert_eq!(v["kind"], "upstream_status", "{body}");
        assert!(v.get("upstream").is_none(), "{body}");
        assert!(!body.contains("127.0.0.1"), "{body}");
    }
}

/// An XC `.m3u8` stream is redirected to the HLS proxy under a sealed token; the errors answered
/// on that path name no host either: an id the provider answers 404 to comes back a 404 with its
/// kind and side, not the provider's address.
#[tokio::test]
async fn hls_errors_under_the_redirect_token_do_not_name_the_provider() {
    let (p, s) = setup().await;
    let token = login(&p, &s).await;
    let r = get(&s.url(&format!("/live/{token}/{XC_PASS}/99999999.m3u8"))).await;
    assert_eq!(r.status, StatusCode::FOUND);
    let location = r.headers["location"].to_str().unwrap().to_string();
    assert!(location.contains("/_token_"), "{location}");
    let r = get(&location).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let body = text(&r);
    assert!(
        !body.contains("127.0.0.1") && !body.contains(&format!(":{}", p.addr.port())),
        "{body}"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "upstream_status", "{body}");
    assert_eq!(v["side"], "upstream", "{body}");
    assert!(v.get("upstream").is_none(), "{body}");
    assert!(p
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|q| q.contains("99999999.m3u8")));
}

/// The token an `.m3u8` stream is redirected under opens the HLS manifest endpoint alone: under
/// it `/proxy/hls/segment.ts` (which hands back its `d` as the provider wrote it: a playlist
/// naming the real account) is refused. Asked again from the same network it is the same token
/// (one spelling, one share of `max_requests_per_token`); from another network another.
#[tokio::test]
async fn the_hls_redirect_token_opens_the_manifest_alone_and_is_reused() {
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    let s = Sluice::start(c).await;
    let token = login(&p, &s).await;
    let path = format!("/live/{token}/{XC_PASS}/99999999.m3u8");
    let location = |r: &support::Reply| {
        assert_eq!(r.status, StatusCode::FOUND);
        r.headers["location"].to_str().unwrap().to_string()
    };
    let first = location(&get(&s.url(&path)).await);
    assert_eq!(location(&get(&s.url(&path)).await), first, "a new spelling");
    let elsewhere =
        location(&request("GET", &s.url(&path), &[("x-forwarded-for", "10.9.0.1")]).await);
    assert_ne!(elsewhere, first, "another network, another token");
    let (base, query) = first.split_once("/proxy/hls/manifest.m3u8").unwrap();
    let r = get(&format!("{base}/proxy/hls/segment.ts{query}")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", text(&r));
}

/// A login answer is parsed as JSON only up to 1 MiB (a real one is about 2 KB): a provider
/// answering 2 MiB of `[0,0,...]` gets a 502 that names no host, and the next login works.
#[tokio::test]
async fn an_oversized_login_answer_is_the_providers_fault() {
    let (p, s) = setup().await;
    let user = b64(&format!("http://{}:{XC_USER}:{API_PW}", p.addr));
    let r = get(&s.url(&format!(
        "/player_api.php?username={user}&password={HUGE_LOGIN_PASS}"
    )))
    .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let body = text(&r);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["side"], "upstream", "{body}");
    assert!(!body.contains("127.0.0.1"), "{body}");
    assert!(p
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|q| q.contains(HUGE_LOGIN_PASS)));
    // The next login is served.
    login(&p, &s).await;
}

/// Each rewritten URL gains the public origin and a ~200-byte sealed username, so 1.7 MB of
/// short `http://host/alice/p/1` lines would be rewritten into ~12 MB: past 4 × the answer plus
/// 1 MiB the rewrite is refused before it is built, a 502 booked to the provider that names no
/// host, and its budget share is given back.
#[tokio::test]
async fn an_answer_whose_rewrite_outgrows_it_is_the_providers_fault() {
    // Answers up to 2 MiB, so rewrites share 8 MiB: the 1.6 MB of short URLs below grow about
    // sevenfold, past the whole budget (within the per-answer growth bound, 8x).
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.media.xtream_max_response_bytes = 2 << 20;
    let s = Sluice::start(c).await;
    let token = login(&p, &s).await;
    assert!(token.len() > 150, "{}", token.len());
    let r = get(&s.url(&format!(
        "/get.php?username={token}&password={SHORT_URLS_PASS}&type=m3u"
    )))
    .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let body = text(&r);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["side"], "upstream", "{body}");
    assert!(!body.contains("127.0.0.1"), "{body}");
    assert!(p
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|q| q.contains(SHORT_URLS_PASS)));
    // A real playlist is still rewritten.
    let r = get(&s.url(&format!(
        "/get.php?username={token}&password={XC_PASS}&type=m3u"
    )))
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let m3u = text(&r);
    assert!(m3u.contains(&format!("http://{}/live/", s.addr)), "{m3u}");
    assert!(!m3u.contains(&format!("/live/{XC_USER}/")), "{m3u}");
}

/// An M3U whose collect buffer grew by doubling past what it carries (an answer of 0.72 MiB in a
/// buffer of up to 1 MiB, as a 46 MB list sits in 64 MiB) is served whole when it and its rewrite
/// fit the client's share of three answers: the buffer's spare room counted beside the rewrite
/// made such lists the provider's 502. One whose own bytes and rewrite do not fit is still
/// refused, and its share given back.
#[tokio::test]
async fn a_list_within_its_share_is_served_whatever_room_its_buffer_grew() {
    // Answers up to 1 MiB: a client's share is 3 MiB.
    let (limit, share) = (1usize << 20, 3usize << 20);
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.media.xtream_max_response_bytes = limit;
    let s = Sluice::start(c).await;
    let token = login(&p, &s).await;
    let (origin, public) = (format!("http://{}", p.addr), format!("http://{}", s.addr));
    // Entries sized so the answer is at most 0.72 MiB (as near as they come) and with its rewrite at least 8 KiB short
    // of the share, and the rewrite past the share beside any buffer of 0.75 MiB or more.
    let base = growing_entry(&origin, XC_USER, 0).len();
    let grows = growing_entry(&public, &token, 0).len() - base;
    let (n, pad) = (0..400)
        .rev()
        .map(|pad| ((share - 8 * 1024) / (2 * (base + pad) + grows), pad))
        .find(|&(n, pad)| {
            let len = n * (base + pad);
            len <= limit * 72 / 100 && limit * 75 / 100 + len + n * grows > share
        })
        .expect("entries of some size fit");
    let url = |n: usize| {
        s.url(&format!(
            "/get.php?username={token}&password={GROWING_PASS}&type=m3u&n={n}&pad={pad}"
        ))
    };
    let answer = |n: usize| growing_entry(&origin, XC_USER, pad).repeat(n).len();
    let rewrite = |n: usize| growing_entry(&public, &token, pad).len() * n;
    let (len, want) = (answer(n), rewrite(n));
    assert!(len > limit * 60 / 100 && len <= limit * 72 / 100, "{len}");
    assert!(len + want + 8 * 1024 <= share, "{want}");
    assert!(limit * 75 / 100 + want > share, "{want}");
    // Served whole: each entry's URL names sluice and the username sealed for this answer (one
    // of the login's length, sealed anew for each answer).
    let served_whole = |r: &support::Reply| {
        assert_eq!(r.status, StatusCode::OK, "{}", text(r));
        let body = r.body.as_ref().unwrap();
        let sealed = text(r).lines().nth(1).unwrap()[public.len() + 1..]
            .split('/')
            .next()
            .unwrap()
            .to_string();
        assert_eq!(sealed.len(), token.len());
        let want = growing_entry(&public, &sealed, pad).repeat(n);
        assert_eq!(body.len(), want.len());
        assert_eq!(sha256(body), sha256(want.as_bytes()));
    };
    served_whole(&get(&url(n)).await);
    // A tenth more entries: the answer and its rewrite alone are past the share.
    let more = n * 11 / 10;
    assert!(answer(more) <= limit && answer(more) + rewrite(more) > share);
    let r = get(&url(more)).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let v: Value = serde_json::from_str(&text(&r)).unwrap();
    assert_eq!(v["side"], "upstream");
    // Its share was given back: the first is served again.
    served_whole(&get(&url(n)).await);
}

/// Escaped dot segments and separators in an XC path never reach the provider: `%2e%2e` would
/// be resolved as `..` and walk the request to any path on its host.
#[tokio::test]
async fn escaped_dot_segments_never_reach_the_provider() {
    let (p, s) = setup().await;
    let token = login(&p, &s).await;
    let before = p.seen.lock().unwrap().len();
    for path in [
        format!("/timeshift/{token}/{XC_PASS}/%2e%2e/%2e%2e/admin%2Fx.php"),
        format!("/timeshift/{token}/{XC_PASS}/60/%2E%2E/101.ts"),
        format!("/live/{token}/%2e/101.ts"),
        format!("/movie/{token}/{XC_PASS}/%2e%2e"),
        format!("/hlsr/%2e%2e/{token}/{XC_PASS}/101/1/2/index.m3u8"),
        format!("/timeshift/{token}/{XC_PASS}/60/x%5C..%5C..%5Cadmin/101.ts"),
    ] {
        let r = get(&s.url(&path)).await;
        assert!(
            matches!(r.status, StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST),
            "{path}: {}",
            r.status
        );
    }
    let seen = p.seen.lock().unwrap();
    assert_eq!(seen.len(), before, "{:?}", &seen[before..]);
}

/// An XC username token counts against `media.max_requests_per_token` as a path token does:
/// a leaked XC login holds at most its share. All requests come from one loopback address, so
/// the per-client cap is set well above the per-token one: the 429 is the token's, and another
/// account from the same client is still served.
#[tokio::test]
async fn an_xc_username_token_holds_at_most_its_share() {
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.media.max_requests_per_token = 2;
    c.media.max_requests_per_client = 10;
    let s = Sluice::start(c).await;
    let token = login(&p, &s).await;
    let held_url = s.url(&format!("/live/{token}/{XC_PASS}/999.ts"));
    let held: Vec<_> = (0..2)
        .map(|_| {
            let url = held_url.clone();
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while p
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|q| *q == HELD_STREAM)
        .count()
        < 2
    {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let live = s.url(&format!("/live/{token}/{XC_PASS}/101.ts"));
    let r = get(&live).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(text(&r).contains("this token has too many"), "{}", text(&r));
    // The API through the same username token is refused the same way.
    let r = get(&s.url(&format!(
        "/player_api.php?username={token}&password={XC_PASS}&action=get_live_categories"
    )))
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // Another account (MediaFlow's username, no token) from the same client is served.
    let user = b64(&format!("http://{}:{XC_USER}:{API_PW}", p.addr));
    let r = get(&s.url(&format!("/live/{user}/{XC_PASS}/101.ts"))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&live_bytes()));
    // Once the held ones end (the header timeout cuts them), the token's share is free again.
    for h in held {
        assert_eq!(h.await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
    }
    let r = get(&live).await;
    assert_eq!(r.status, StatusCode::OK);
}

/// Each `player_api.php` login seals the account under a fresh nonce, so one account's username
/// token has a new spelling per login: the holder of a leaked one gets another by logging in with
/// it. Its in-flight share is counted by what it grants (the provider, the user there, the
/// expiry and address binding), so a holder at `media.max_requests_per_token` on one spelling
/// gets no fresh share from another; another user's token keeps its own.
#[tokio::test]
async fn an_xc_username_token_respelled_by_a_login_holds_the_same_share() {
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.media.max_requests_per_token = 2;
    c.media.max_requests_per_client = 10;
    let s = Sluice::start(c).await;
    let first = login(&p, &s).await;
    // The leaked token logs in again and is handed another spelling of the same grant.
    let r = get(&s.url(&format!(
        "/player_api.php?username={first}&password={XC_PASS}"
    )))
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let v: Value = serde_json::from_str(&text(&r)).unwrap();
    let second = v["user_info"]["username"].as_str().unwrap().to_string();
    assert_ne!(second, first);
    let key = sluice_media::token::sealed::SealedKey::derive(API_PW);
    let grant = key.open(&first).unwrap();
    assert_eq!(key.open(&second).unwrap(), grant);
    let held_url = s.url(&format!("/live/{first}/{XC_PASS}/999.ts"));
    let held: Vec<_> = (0..2)
        .map(|_| {
            let url = held_url.clone();
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while p
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|q| *q == HELD_STREAM)
        .count()
        < 2
    {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let live = |user: &str| s.url(&format!("/live/{user}/{XC_PASS}/101.ts"));
    let r = get(&live(&second)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(text(&r).contains("this token has too many"), "{}", text(&r));
    // Another user's token (the same grant but for `xc_user`) has its own share: it reaches the
    // panel, which does not know that user.
    let mut other = grant.clone();
    for (k, v) in other.params.iter_mut() {
        if k == "xc_user" {
            *v = "bob".into();
        }
    }
    assert_ne!(other, grant);
    let bob = key.seal(&other, [11; 24]);
    let r = get(&live(&bob)).await;
    assert_ne!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(p
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|q| q == &format!("/live/bob/{XC_PASS}/101.ts")));
    for h in held {
        assert_eq!(h.await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
    }
    // Once the held ones end, either spelling streams.
    for user in [&first, &second] {
        let r = get(&live(user)).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&live_bytes()));
    }
}

/// A login seals the provider's server as the URL standard spells it: `http://h:p`,
/// `HTTP://h:p/` (or `http://xc:80`) are one server, so logging in with another spelling of it
/// gives no new share of `media.max_requests_per_token` for the same account.
#[tokio::test]
async fn logins_with_other_spellings_of_the_server_hold_one_share() {
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.media.max_requests_per_token = 2;
    c.media.max_requests_per_client = 10;
    let s = Sluice::start(c).await;
    let sign_in = |user: String| {
        let url = s.url(&format!(
            "/player_api.php?username={user}&password={XC_PASS}"
        ));
        async move {
            let r = get(&url).await;
            assert_eq!(r.status, StatusCode::OK);
            let v: Value = serde_json::from_str(&text(&r)).unwrap();
            v["user_info"]["username"].as_str().unwrap().to_string()
        }
    };
    let first = login(&p, &s).await;
    let others = [
        sign_in(format!(
            "{}:{XC_USER}:{API_PW}",
            b64(&format!("HTTP://{}/", p.addr))
        ))
        .await,
        sign_in(b64(&format!("Http://{}:{XC_USER}:{API_PW}", p.addr))).await,
    ];
    let held_url = s.url(&format!("/live/{first}/{XC_PASS}/999.ts"));
    let held: Vec<_> = (0..2)
        .map(|_| {
            let url = held_url.clone();
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while p
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|q| *q == HELD_STREAM)
        .count()
        < 2
    {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let live = |user: &str| s.url(&format!("/live/{user}/{XC_PASS}/101.ts"));
    for other in &others {
        let r = get(&live(other)).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(text(&r).contains("this token has too many"), "{}", text(&r));
    }
    for h in held {
        assert_eq!(h.await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
    }
    for other in &others {
        let r = get(&live(other)).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&live_bytes()));
    }
}

/// Opens `path` as the client `10.0.0.N` behind sluice's trusted proxy and reads only the head of
/// the answer (and the whole body of one that is not a 200): the socket is left unread.
async fn unread(addr: SocketAddr, path: &str, client: u8) -> (StatusCode, String, TcpStream) {
    unread_as(addr, path, &format!("10.0.0.{client}")).await
}

/// [`unread`] as the client at address `client`.
async fn unread_as(addr: SocketAddr, path: &str, client: &str) -> (StatusCode, String, TcpStream) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nx-forwarded-for: {client}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let end = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the head ended");
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
    let status: u16 = head[9..12].parse().unwrap();
    let status = StatusCode::from_u16(status).unwrap();
    let mut body = got[end..].to_vec();
    if status != StatusCode::OK {
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        while body.len() < len {
            let mut buf = [0u8; 1024];
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0);
            body.extend_from_slice(&buf[..n]);
        }
        assert!(head.contains("retry-after: 1"), "{head}");
    }
    (status, String::from_utf8(body).unwrap(), stream)
}

/// A client that leaves its large answers unread holds their memory until they are sent: it may
/// hold at most three of the four largest answers' worth the rewrites share, so another client's
/// largest answer is still served, and the first client's request past its share gets the same
/// `503 xtream_busy` as when every client together fills the budget.
#[tokio::test]
async fn a_client_leaving_answers_unread_holds_at_most_its_share() {
    // Answers up to 8 MiB: the rewrites share 32 MiB, one client 24 MiB. Each 6.9 MB answer
    // holds its size (and its buffer, up to 8 MiB, while it is read): three fit in a share,
    // four do not.
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    c.media.xtream_max_response_bytes = 8 << 20;
    let s = Sluice::start(c).await;
    let user = b64(&format!("http://{}:{XC_USER}:{API_PW}", p.addr));
    let path = format!("/player_api.php?username={user}&password={XC_PASS}&action={BIG_ACTION}");
    let mut held = Vec::new();
    let refused = loop {
        let (status, body, stream) = unread(s.addr, &path, 1).await;
        if status != StatusCode::OK {
            break (status, body);
        }
        held.push(stream);
        assert!(held.len() <= 4, "the first client was never refused");
    };
    assert_eq!(held.len(), 3);
    let (status, body) = refused;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "xtream_busy", "{body}");
    assert_eq!(
        v["error"],
        "the XC answers being rewritten now hold all the memory set aside for them \
         (4 × media.xtream_max_response_bytes); try again shortly"
    );
    // Another client's largest answer is served whole, and its login.
    let r = request("GET", &s.url(&path), &[("x-forwarded-for", "10.0.0.2")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.as_ref().unwrap().len(), BIG_LEN);
    let r = request(
        "GET",
        &s.url(&format!(
            "/player_api.php?username={user}&password={XC_PASS}"
        )),
        &[("x-forwarded-for", "10.0.0.2")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(text(&r).contains("user_info"));
    // Once the first client's answers are gone, its share is free again.
    drop(held);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (status, _, _) = unread(s.addr, &path, 1).await;
        if status == StatusCode::OK {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{status}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Answers their clients do not take hold the budget only until their send deadline
/// (`upstream.whole_body_timeout_secs`): with every share of it held by answers left unread (the
/// connections still open, well within `server.send_timeout_secs`), a third client is refused at
/// first, then served once those answers are cut, the sockets that asked for them still open.
#[tokio::test]
async fn answers_left_unread_give_the_budget_back_at_their_deadline() {
    // As above: 8 MiB answers, a 32 MiB budget, a 24 MiB share; each answer holds 6.9 MB.
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    c.media.xtream_max_response_bytes = 8 << 20;
    c.upstream.whole_body_timeout_secs = 3;
    c.server.send_timeout_secs = 600;
    let s = Sluice::start(c).await;
    let user = b64(&format!("http://{}:{XC_USER}:{API_PW}", p.addr));
    let path = format!("/player_api.php?username={user}&password={XC_PASS}&action={BIG_ACTION}");
    let mut held = Vec::new();
    for client in [1, 1, 1, 2] {
        let (status, body, stream) = unread(s.addr, &path, client).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        held.push(stream);
    }
    let (status, _, _) = unread(s.addr, &path, 3).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    // Served once the unread answers are cut, their sockets still open and unread.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let r = request("GET", &s.url(&path), &[("x-forwarded-for", "10.0.0.3")]).await;
        if r.status == StatusCode::OK {
            assert_eq!(r.body.as_ref().unwrap().len(), BIG_LEN);
            break;
        }
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(std::time::Instant::now() < deadline, "never given back");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    drop(held);
}

/// A host with an IPv6 /64 is one client however many of its addresses it uses: answers it
/// leaves unread from two of them hold at most one share together, so another client's largest
/// answer is still served.
#[tokio::test]
async fn a_clients_addresses_in_one_64_hold_one_share() {
    // As above: 8 MiB answers, a 32 MiB budget, a 24 MiB share; each answer holds 6.9 MB.
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    c.media.xtream_max_response_bytes = 8 << 20;
    let s = Sluice::start(c).await;
    let user = b64(&format!("http://{}:{XC_USER}:{API_PW}", p.addr));
    let path = format!("/player_api.php?username={user}&password={XC_PASS}&action={BIG_ACTION}");
    let mut held = Vec::new();
    let refused = loop {
        let client = ["2001:db8::1", "2001:db8::2"][held.len() % 2];
        let (status, body, stream) = unread_as(s.addr, &path, client).await;
        if status != StatusCode::OK {
            break (status, body);
        }
        held.push(stream);
        assert!(held.len() <= 4, "the /64 was never refused");
    };
    assert_eq!(held.len(), 3);
    let (status, body) = refused;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "xtream_busy", "{body}");
    // A client in another /64 is served whole.
    let r = request(
        "GET",
        &s.url(&path),
        &[("x-forwarded-for", "2001:db8:0:1::1")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.as_ref().unwrap().len(), BIG_LEN);
}

/// A MediaFlow token stands for the API password on XC paths, yet what it is traded for there
/// keeps its limits: the username token in the login answer, in the stream lists and in the M3U,
/// and the HLS redirect's token, all open only from the MediaFlow token's address and stop at its
/// expiry. Unbounded, a token meant to last minutes bought a lasting credential for any host.
#[tokio::test]
async fn a_short_lived_mediaflow_token_cannot_be_traded_for_a_lasting_username() {
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    let s = Sluice::start(c).await;
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let exp = now() + 6;
    let mf = sluice_media::token::TokenKey::new(API_PW).encrypt(
        &[("api_password".to_string(), API_PW.to_string())],
        Some(exp),
        Some("127.0.0.1"),
        [7; 16],
    );
    // No password in the username: the MediaFlow token proves it.
    let user = b64(&format!("http://{}:{XC_USER}:", p.addr));
    let r = get(&s.url(&format!(
        "/_token_{mf}/player_api.php?username={user}&password={XC_PASS}"
    )))
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let v: Value = serde_json::from_str(&text(&r)).unwrap();
    let traded = v["user_info"]["username"].as_str().unwrap().to_string();
    let r = get(&s.url(&format!(
        "/_token_{mf}/get.php?username={user}&password={XC_PASS}&type=m3u_plus"
    )))
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let m3u = text(&r);
    let entry = m3u.lines().find(|l| l.contains("/live/")).unwrap();
    let entry = entry.strip_prefix(&s.url("")).unwrap().to_string();
    let r = get(&s.url(&format!("/_token_{mf}/live/{user}/{XC_PASS}/101.m3u8"))).await;
    assert_eq!(r.status, StatusCode::FOUND);
    let hls = r.headers["location"].to_str().unwrap().to_string();
    let hls = hls.strip_prefix(&s.url("")).unwrap().to_string();
    let categories = |user: &str| {
        format!("/player_api.php?username={user}&password={XC_PASS}&action=get_live_categories")
    };
    // A traded username traded again (the stream list's) stays inside the same limits.
    let r = get(&s.url(&format!(
        "/player_api.php?username={traded}&password={XC_PASS}&action=get_live_streams"
    )))
    .await;
    let v: Value = serde_json::from_str(&text(&r)).unwrap();
    let direct = v[0]["direct_source"].as_str().unwrap();
    let listed = direct.split('/').nth(4).unwrap().to_string();
    // While the MediaFlow token lasts, from its address, everything it was traded for works.
    let fetch = |path: String, from: Option<&'static str>| {
        let url = s.url(&path);
        async move {
            match from {
                Some(ip) => request("GET", &url, &[("x-forwarded-for", ip)]).await,
                None => get(&url).await,
            }
        }
    };
    let paths = [categories(&traded), categories(&listed), entry, hls];
    let ok = [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::OK,
        // The panel has no `101.m3u8`: its 404 comes back through the HLS proxy.
        StatusCode::NOT_FOUND,
    ];
    for (path, want) in paths.iter().zip(ok) {
        assert_eq!(fetch(path.clone(), None).await.status, want, "{path}");
    }
    // Refused as each refuses a token: the XC proxy's one 403, the token gate's one 401.
    let refused = [
        StatusCode::FORBIDDEN,
        StatusCode::FORBIDDEN,
        StatusCode::FORBIDDEN,
        StatusCode::UNAUTHORIZED,
    ];
    // From another address: refused.
    for (path, want) in paths.iter().zip(refused) {
        let r = fetch(path.clone(), Some("10.9.9.9")).await;
        assert_eq!(r.status, want, "{path}");
    }
    // Past the MediaFlow token's expiry: refused, from its own address too.
    assert!(now() <= exp, "the checks above outlasted the token");
    while now() <= exp {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for (path, want) in paths.iter().zip(refused) {
        let r = fetch(path.clone(), None).await;
        assert_eq!(r.status, want, "{path}");
    }
}

/// A MediaFlow token has many spellings: it decodes leniently (`=` padding or none, either base64
/// alphabet), and with no MAC flipping bits of its IV rewrites the first JSON block while it still
/// parses (the space in `": "` a tab, `http` as `Http`). Its in-flight share is counted by what it
/// grants, so a holder at `media.max_requests_per_token` gets no fresh share by respelling it.
#[tokio::test]
async fn a_mediaflow_token_respelled_holds_the_same_share() {
    let p = panel().await;
    let mut c = test_config();
    c.auth.api_password = API_PW.into();
    c.media.max_requests_per_token = 2;
    c.media.max_requests_per_client = 10;
    let s = Sluice::start(c).await;
    let key = sluice_media::token::TokenKey::new(API_PW);
    // A token whose text needs padding, so `=` respells it.
    let mf = (0..3)
        .map(|n| {
            // First, so that its `": "` and `http` lie in the block the IV flips.
            let params = [
                ("x".to_string(), "http://a.example/".to_string()),
                ("api_password".to_string(), API_PW.to_string()),
                ("pad".to_string(), "x".repeat(16 * n)),
            ];
            key.encrypt(&params, None, None, [7; 16])
        })
        .find(|t| t.len() % 4 != 0)
        .unwrap();
    let padded = format!("{mf}{}", "=".repeat(4 - mf.len() % 4));
    // The plaintext starts `{"x": "http://a.e`: byte 5 is the space, byte 7 the `h`.
    let flipped = |at: usize, from: u8, to: u8| {
        let mut bytes = sluice_media::token::token_bytes(&mf).unwrap();
        bytes[at] ^= from ^ to;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    };
    let tab = flipped(5, b' ', b'\t');
    let upper = flipped(7, b'h', b'H');
    let key_check = sluice_media::token::TokenKey::new(API_PW);
    assert_eq!(
        key_check.decrypt(&tab).unwrap().params,
        key_check.decrypt(&mf).unwrap().params
    );
    assert_eq!(
        key_check.decrypt(&upper).unwrap().param("x"),
        Some("Http://a.example/")
    );
    let user = b64(&format!("http://{}:{XC_USER}:", p.addr));
    let held_url = s.url(&format!("/_token_{mf}/live/{user}/{XC_PASS}/999.ts"));
    let held: Vec<_> = (0..2)
        .map(|_| {
            let url = held_url.clone();
            tokio::spawn(async move { get(&url).await })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while p
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|q| *q == HELD_STREAM)
        .count()
        < 2
    {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let live = |t: &str| s.url(&format!("/_token_{t}/live/{user}/{XC_PASS}/101.ts"));
    for t in [&mf, &padded, &tab, &upper] {
        let r = get(&live(t)).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{t}");
    }
    for h in held {
        assert_eq!(h.await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
    }
    // Once the held ones end, any spelling streams.
    for t in [&padded, &tab, &upper] {
        let r = get(&live(t)).await;
        assert_eq!(r.status, StatusCode::OK, "{t}");
        assert_eq!(sha256(r.body.as_ref().unwrap()), sha256(&live_bytes()));
    }
}
