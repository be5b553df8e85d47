//! `/proxy/acestream/*` against a scripted Acestream engine on 127.0.0.1:0: two viewers share one
//! engine session, neither stalls the other, the session stops after the last viewer plus the
//! linger; HLS, status, HEAD and bad input; a viewer leaving while the engine starts; unknown
//! ids; a slow or hanging engine behind status.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use support::{get, pattern, request, test_config, BoxBody, Sluice};
use tokio::net::TcpListener;

const PW: &str = "ace-api-password-5521";
const ID: &str = "0123456789abcdef0123456789abcdef01234567";
/// Another channel the engine knows.
const OTHER: &str = "fedcba9876543210fedcba9876543210fedcba98";
/// A channel whose `getstream` the engine answers only once the test lets it
/// ([`Counts::slow_answers`], one permit per answer).
const SLOW: &str = "5555555555555555555555555555555555555555";
/// Well-formed, but the engine does not know it: `{"error": "missing content"}`.
const UNKNOWN: &str = "dddddddddddddddddddddddddddddddddddddddd";
/// The engine fails on its own side: `{"error": ...}` that is not "not found".
const FAILING: &str = "ffffffffffffffffffffffffffffffffffffffff";
/// The engine answers it with something that is not its JSON.
const GARBLED: &str = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
/// Channels whose `stat` the engine answers only once all three are asked at the same time.
const TOGETHER: [&str; 3] = [
    "a000000000000000000000000000000000000000",
    "a111111111111111111111111111111111111111",
    "a222222222222222222222222222222222222222",
];
/// A channel whose `stat` the engine never answers.
const HANGING: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const CHUNK: usize = 188 * 40;
const CHUNKS: usize = 600;

struct Counts {
    getstream: AtomicUsize,
    manifest: AtomicUsize,
    playback: AtomicUsize,
    stop: AtomicUsize,
    /// The most engine sessions open at once: `getstream` requests less `stop` commands, at
    /// each `getstream`.
    most_open: AtomicUsize,
    /// Permits for answering [`SLOW`]'s `getstream`.
    slow_answers: tokio::sync::Semaphore,
    /// `stat` requests for the [`TOGETHER`] channels so far, and their wake-up.
    together: AtomicUsize,
    all_together: tokio::sync::Notify,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            getstream: AtomicUsize::new(0),
            manifest: AtomicUsize::new(0),
            playback: AtomicUsize::new(0),
            stop: AtomicUsize::new(0),
            most_open: AtomicUsize::new(0),
            slow_answers: tokio::sync::Semaphore::new(0),
            together: AtomicUsize::new(0),
            all_together: tokio::sync::Notify::new(),
        }
    }
}

fn stream_bytes() -> Bytes {
    pattern(CHUNK * CHUNKS)
}

async fn engine() -> (SocketAddr, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let c = c.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let c = c.clone();
                    async move { Ok::<_, Infallible>(engine_answer(req, &c).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, counts)
}

fn full(body: impl Into<Bytes>) -> BoxBody {
    Full::new(body.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The engine's answer to opening a session for the channel `id` asks for.
async fn engine_session(query: &str, kind: &str, c: &Counts) -> Response<BoxBody> {
    // The engine names itself by an address the proxy must not trust.
    let me = "http://engine.internal:6878";
    let id = url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "id")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let playback = match kind {
        "s1" => format!("/ace/r/{id}/s1"),
        _ => format!("/ace/m/{id}/h1.m3u8"),
    };
    let body = match id.as_str() {
        UNKNOWN => r#"{"response":null,"error":"missing content"}"#.to_string(),
        FAILING => {
            r#"{"response":null,"error":"Internal error: no space left on device"}"#.to_string()
        }
        GARBLED => "<html>engine busy</html>".to_string(),
        _ => {
            if id == SLOW && kind == "s1" {
                c.slow_answers.acquire().await.unwrap().forget();
            }
            format!(
                r#"{{"response":{{"playback_url":"{me}{playback}","stat_url":"{me}/ace/stat/{id}/{kind}","command_url":"{me}/ace/cmd/{id}/{kind}","infohash":"{id}","playback_session_id":"{kind}","is_live":1,"is_encrypted":0}},"error":null}}"#
            )
        }
    };
    Response::new(full(body))
}

async fn engine_answer(req: Request<Incoming>, c: &Counts) -> Response<BoxBody> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    match path.as_str() {
        "/ace/getstream" if query.contains("format=json") => {
            let started = c.getstream.fetch_add(1, Ordering::SeqCst) + 1;
            let open = started - c.stop.load(Ordering::SeqCst);
            c.most_open.fetch_max(open, Ordering::SeqCst);
            engine_session(&query, "s1", c).await
        }
        "/ace/manifest.m3u8" => {
            c.manifest.fetch_add(1, Ordering::SeqCst);
            engine_session(&query, "h1", c).await
        }
        p if p.starts_with("/ace/r/") && p.ends_with("/s1") => {
            c.playback.fetch_add(1, Ordering::SeqCst);
            // A live stream: chunks paced, bounded in count.
            let data = stream_bytes();
            let body = futures_util::stream::unfold(0usize, move |i| {
                let data = data.clone();
                async move {
                    if i == CHUNKS {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let chunk = data.slice(i * CHUNK..(i + 1) * CHUNK);
                    Some((Ok::<_, std::io::Error>(Frame::data(chunk)), i + 1))
                }
            });
            Response::builder()
                .header("content-type", "video/mp2t")
                .body(BodyExt::boxed(StreamBody::new(body)))
                .unwrap()
        }
        p if p.starts_with("/ace/m/") && p.ends_with("/h1.m3u8") => Response::new(full(
            // As a real engine names them: segments under `/ace/c/<playback session>/`.
            "#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:5\n#EXTINF:2.0,\n/ace/c/h1/5.ts\n",
        )),
        "/ace/c/h1/5.ts" => Response::builder()
            .header("content-type", "video/mp2t")
            .body(full(pattern(188 * 4)))
            .unwrap(),
        p if p.starts_with(&format!("/ace/stat/{HANGING}/")) => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        p if TOGETHER
            .iter()
            .any(|id| p.starts_with(&format!("/ace/stat/{id}/"))) =>
        {
            c.together.fetch_add(1, Ordering::SeqCst);
            loop {
                let all = c.all_together.notified();
                let mut all = std::pin::pin!(all);
                all.as_mut().enable();
                if c.together.load(Ordering::SeqCst) >= TOGETHER.len() {
                    c.all_together.notify_waiters();
                    break;
                }
                all.await;
            }
            Response::new(full(
                r#"{"response":{"status":"dl","peers":7,"speed_down":1200,"speed_up":40,"downloaded":123456},"error":null}"#,
            ))
        }
        p if p.starts_with("/ace/stat/") => Response::new(full(
            r#"{"response":{"status":"dl","peers":7,"speed_down":1200,"speed_up":40,"downloaded":123456},"error":null}"#,
        )),
        p if p.starts_with("/ace/cmd/") && query == "method=stop" => {
            c.stop.fetch_add(1, Ordering::SeqCst);
            Response::new(full(r#"{"response":"ok","error":null}"#))
        }
        _ => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(full(""))
            .unwrap(),
    }
}

async fn setup(linger: u64) -> (SocketAddr, Arc<Counts>, Sluice) {
    setup_guarded(linger, true).await
}

/// `allow_private: false` is the default: the engine on 127.0.0.1 must still be reachable.
async fn setup_guarded(linger: u64, allow_private: bool) -> (SocketAddr, Arc<Counts>, Sluice) {
    setup_with(linger, |c| c.upstream.allow_private = allow_private).await
}

async fn setup_with(
    linger: u64,
    change: impl FnOnce(&mut sluice::config::Config),
) -> (SocketAddr, Arc<Counts>, Sluice) {
    let (addr, counts) = engine().await;
    let mut c = test_config();
    change(&mut c);
    c.auth.api_password = PW.into();
    c.media.acestream.engine_url = format!("http://{addr}");
    c.media.acestream.linger_secs = linger;
    c.media.acestream.buffer_bytes = 1024 * 1024;
    let s = Sluice::start(c).await;
    (addr, counts, s)
}

/// Opens a streaming GET and returns its body to read at the test's pace.
async fn open(url: &str) -> Incoming {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let resp = client
        .request(Request::get(url).body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "video/mp2t");
    resp.into_body()
}

async fn read_at_least(body: &mut Incoming, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < n {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("viewer stalled")
            .expect("stream ended early")
            .unwrap();
        if let Ok(d) = frame.into_data() {
            out.extend_from_slice(&d);
        }
    }
    out
}

/// `part` is a contiguous, packet-aligned piece of the engine's stream.
fn is_aligned_piece(part: &[u8]) -> bool {
    let all = stream_bytes();
    (0..all.len() / 188).any(|p| {
        let at = p * 188;
        all.len() >= at + part.len() && all[at..at + part.len()] == *part
    })
}

#[tokio::test]
async fn two_viewers_share_one_engine_session() {
    let (_engine, counts, s) = setup(1).await;
    let url = s.url(&format!(
        "/proxy/acestream/stream?id={ID}&api_password={PW}"
    ));
    let mut a = open(&url).await;
    let first = read_at_least(&mut a, CHUNK * 5).await;
    // The first viewer starts at the beginning of the engine's stream.
    assert_eq!(first[..], stream_bytes()[..first.len()]);

    let mut b = open(&url).await;
    let got_b = read_at_least(&mut b, CHUNK * 5).await;
    assert!(is_aligned_piece(&got_b[..CHUNK * 5]));
    assert_eq!(counts.getstream.load(Ordering::SeqCst), 1);
    assert_eq!(counts.playback.load(Ordering::SeqCst), 1);

    let status = get(&s.url(&format!("/proxy/acestream/status?api_password={PW}"))).await;
    let v: Value = serde_json::from_slice(status.body.as_ref().unwrap()).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["content"], format!("id:{ID}"));
    assert_eq!(v[0]["viewers"], 2);
    assert_eq!(v[0]["engine"]["peers"], 7);

    // The second viewer leaving does not disturb the first, which keeps reading in order.
    drop(b);
    let more = read_at_least(&mut a, CHUNK * 10).await;
    let so_far = [first, more].concat();
    assert_eq!(so_far[..], stream_bytes()[..so_far.len()]);
    assert_eq!(counts.stop.load(Ordering::SeqCst), 0);

    // The last viewer leaves: after the linger, the engine is told to stop, once.
    drop(a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        counts.stop.load(Ordering::SeqCst),
        0,
        "stopped before the linger"
    );
    let mut stopped = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if counts.stop.load(Ordering::SeqCst) == 1 {
            stopped = true;
            break;
        }
    }
    assert!(stopped, "engine session not stopped after the linger");
    let status = get(&s.url(&format!("/proxy/acestream/status?api_password={PW}"))).await;
    assert_eq!(status.body.unwrap(), Bytes::from_static(b"[]"));

    // A new viewer after the close opens a fresh engine session.
    let mut c = open(&url).await;
    read_at_least(&mut c, CHUNK).await;
    assert_eq!(counts.getstream.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn slow_viewer_skips_ahead_instead_of_stalling_the_fast_one() {
    let (_engine, counts, s) = setup(1).await;
    let url = s.url(&format!(
        "/proxy/acestream/stream?id={ID}&api_password={PW}"
    ));
    let mut fast = open(&url).await;
    let mut slow = open(&url).await;
    read_at_least(&mut slow, CHUNK).await;
    // The slow viewer stops reading; the fast one gets the whole stream in order regardless.
    let all = read_at_least(&mut fast, CHUNK * 300).await;
    assert_eq!(all[..], stream_bytes()[..all.len()]);
    assert_eq!(counts.playback.load(Ordering::SeqCst), 1);
    drop(slow);
}

#[tokio::test]
async fn hls_manifest_head_and_bad_input() {
    // With the address guard on, as by default: the engine on 127.0.0.1 is still reached, for
    // the playlist and for the segments the rewrite points at it.
    let (engine, counts, s) = setup_guarded(30, false).await;
    let mut segment = String::new();
    for _ in 0..2 {
        let r = get(&s.url(&format!(
            "/proxy/acestream/manifest.m3u8?id={ID}&api_password={PW}"
        )))
        .await;
        assert_eq!(r.status, StatusCode::OK);
        let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(text.starts_with("#EXTM3U"));
        assert!(text.contains("/proxy/hls/segment.ts"), "{text}");
        assert!(!text.contains(PW));
        segment = text
            .lines()
            .find(|l| l.contains("/proxy/hls/segment.ts"))
            .unwrap()
            .to_string();
    }
    // Both playlist requests share one engine session.
    assert_eq!(counts.manifest.load(Ordering::SeqCst), 1);
    let r = get(&segment).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body.unwrap(), pattern(188 * 4));
    // Any other private address keeps the guard, through /proxy/hls as anywhere: another port
    // on the engine's host, the engine's port by another name, and the engine itself outside
    // the open session's playlist directory (its API, which any playlist could name: a new
    // session, statistics, a command).
    let other = TcpListener::bind("127.0.0.1:0").await.unwrap();
    for d in [
        format!("http://{}/ace/m/{ID}/h1.m3u8", other.local_addr().unwrap()),
        format!("http://localhost:{}/ace/m/{ID}/h1.m3u8", engine.port()),
        format!("http://{engine}/ace/manifest.m3u8?id={ID}"),
        format!("http://{engine}/ace/stat/{ID}/h1"),
        format!("http://{engine}/ace/cmd/{ID}/h1?method=stop"),
        format!("http://{engine}/ace/m/{ID}/../../ace/stat/{ID}/h1"),
    ] {
        for endpoint in ["manifest.m3u8", "segment.ts"] {
            let r = get(&s.url(&format!(
                "/proxy/hls/{endpoint}?d={}&api_password={PW}",
                support::enc(&d)
            )))
            .await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{endpoint} {d}");
        }
    }
    // No engine session was started through them.
    assert_eq!(counts.manifest.load(Ordering::SeqCst), 1);

    let r = request(
        "HEAD",
        &s.url(&format!(
            "/proxy/acestream/stream?id={ID}&api_password={PW}"
        )),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "video/mp2t");
    assert_eq!(counts.getstream.load(Ordering::SeqCst), 0);
    // Nor on the playlist, for a channel with no session open yet.
    let r = request(
        "HEAD",
        &s.url(&format!(
            "/proxy/acestream/manifest.m3u8?id={OTHER}&api_password={PW}"
        )),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "application/vnd.apple.mpegurl");
    assert_eq!(
        counts.manifest.load(Ordering::SeqCst),
        1,
        "a HEAD started an engine session"
    );

    for q in ["id=xyz", "", &format!("id={ID}&infohash={ID}")] {
        let r = get(&s.url(&format!("/proxy/acestream/stream?{q}&api_password={PW}"))).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{q}");
    }
    let r = get(&s.url(&format!("/proxy/acestream/stream?id={ID}"))).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(counts.getstream.load(Ordering::SeqCst), 0);
}

/// A viewer that hangs up while the engine is still answering `getstream` (a slow P2P start),
/// again and again: every engine session opened is told to stop. Cancelling the start with the
/// viewer's request left the engine's session running, known to nobody, one more per try. A
/// session closed while starting still counts toward `max_sessions` and its client's share until
/// the engine has answered and been told `stop`: closing it at once let a client open engine
/// sessions past the pool at the rate of its requests.
#[tokio::test]
async fn a_viewer_leaving_while_the_engine_starts_leaves_no_engine_session() {
    // No linger: the session closes as soon as its viewer leaves, before the engine answers. A
    // pool of 2: a share of 1 for the one client.
    let (_engine, counts, s) = setup_with(0, |c| {
        c.upstream.allow_private = true;
        c.media.acestream.max_sessions = 2;
    })
    .await;
    const TRIES: usize = 6;
    let mut refused = 0;
    // Asks for SLOW and hangs up once the engine has the request; true if sluice refused it.
    let try_once = || async {
        let before = counts.getstream.load(Ordering::SeqCst);
        let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let req = format!(
            "GET /proxy/acestream/stream?id={SLOW}&api_password={PW} HTTP/1.1\r\nhost: x\r\n\r\n"
        );
        tokio::io::AsyncWriteExt::write_all(&mut conn, req.as_bytes())
            .await
            .unwrap();
        let mut head = [0u8; 12];
        let refused = tokio::select! {
            r = tokio::io::AsyncReadExt::read_exact(&mut conn, &mut head) => {
                r.unwrap();
                assert_eq!(&head, b"HTTP/1.1 503", "{}", String::from_utf8_lossy(&head));
                true
            }
            // The engine has the request: hang up while it starts.
            _ = wait_for("getstream", || counts.getstream.load(Ordering::SeqCst) > before) => false,
        };
        drop(conn);
        // The session is gone before the next try (so each try is a fresh start).
        let status = s.url(&format!("/proxy/acestream/status?api_password={PW}"));
        let mut gone = false;
        for _ in 0..100 {
            if get(&status).await.body.unwrap() == Bytes::from_static(b"[]") {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "the session outlived its only viewer");
        refused
    };
    // The engine answers none of them meanwhile.
    for _ in 0..TRIES {
        refused += usize::from(try_once().await);
    }
    let most = counts.most_open.load(Ordering::SeqCst);
    assert!(
        most <= 1,
        "{most} engine sessions open at once for a share of 1 (max_sessions 2)"
    );
    assert_eq!(refused, TRIES - 1);
    // The engine answers: the session is told to stop, and its place is free again.
    counts.slow_answers.add_permits(1);
    wait_for("stop", || counts.stop.load(Ordering::SeqCst) == 1).await;
    let mut again = false;
    for _ in 0..100 {
        if !try_once().await {
            again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again, "the place stayed taken after the engine answered");
    counts.slow_answers.add_permits(1);
    // Each engine session, once the engine answered, was told to stop.
    let stopped = wait_until(|| counts.stop.load(Ordering::SeqCst) >= 2).await;
    let (starts, stops) = (
        counts.getstream.load(Ordering::SeqCst),
        counts.stop.load(Ordering::SeqCst),
    );
    assert!(
        stopped && starts == stops,
        "{starts} engine sessions started, {stops} stopped"
    );
    assert_eq!(starts, 2);
    assert_eq!(counts.most_open.load(Ordering::SeqCst), 1);
    assert_eq!(
        counts.playback.load(Ordering::SeqCst),
        0,
        "read a closed session"
    );
}

/// Polls `done` for up to 10 s.
async fn wait_until(done: impl Fn() -> bool) -> bool {
    for _ in 0..200 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
}

async fn wait_for(what: &str, done: impl Fn() -> bool) {
    assert!(wait_until(done).await, "no {what}");
}

/// An id the engine does not know is the client's mistake (404); an answer that is not the
/// engine's JSON, or an error of the engine's own, is the engine's (502).
#[tokio::test]
async fn an_unknown_id_is_not_found_and_a_garbled_or_failed_answer_a_bad_gateway() {
    let (_engine, counts, s) = setup(30).await;
    for endpoint in ["stream", "manifest.m3u8"] {
        let r = get(&s.url(&format!(
            "/proxy/acestream/{endpoint}?id={UNKNOWN}&api_password={PW}"
        )))
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{endpoint}: {:?}", r.body);
        let v: Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
        assert!(v.to_string().contains("missing content"), "{v}");
        // Garbled, or an error of the engine's own (not "not found"): the engine's fault.
        for id in [GARBLED, FAILING] {
            let r = get(&s.url(&format!(
                "/proxy/acestream/{endpoint}?id={id}&api_password={PW}"
            )))
            .await;
            assert_eq!(
                r.status,
                StatusCode::BAD_GATEWAY,
                "{endpoint} {id}: {:?}",
                r.body
            );
        }
    }
    assert_eq!(counts.getstream.load(Ordering::SeqCst), 3);
    assert_eq!(counts.manifest.load(Ordering::SeqCst), 3);
    // Nothing is left open by them.
    let r = get(&s.url(&format!("/proxy/acestream/status?api_password={PW}"))).await;
    assert_eq!(r.body.unwrap(), Bytes::from_static(b"[]"));
}

/// `status` asks the engine about every session at once and waits a short while for each: an
/// engine that answers one `stat` only while the others are asked too answers them all, one
/// that never answers is left out (`engine: null`) instead of holding the call for the upstream
/// header timeout per session. A bad `id` is refused, not read as "every session".
#[tokio::test]
async fn status_asks_the_engine_about_all_sessions_at_once() {
    let (_engine, counts, s) = setup_with(30, |c| {
        c.upstream.allow_private = true;
        c.upstream.header_timeout_secs = 120;
    })
    .await;
    for id in TOGETHER.iter().chain([&HANGING]) {
        let r = get(&s.url(&format!(
            "/proxy/acestream/manifest.m3u8?id={id}&api_password={PW}"
        )))
        .await;
        assert_eq!(r.status, StatusCode::OK, "{id}");
    }
    let status = tokio::time::timeout(
        Duration::from_secs(60),
        get(&s.url(&format!("/proxy/acestream/status?api_password={PW}"))),
    )
    .await
    .expect("status held by the engine's stat answers");
    let v: Value = serde_json::from_slice(status.body.as_ref().unwrap()).unwrap();
    let sessions = v.as_array().unwrap();
    assert_eq!(sessions.len(), 4);
    for session in sessions {
        let content = session["content"].as_str().unwrap();
        if content == format!("id:{HANGING}") {
            assert!(session["engine"].is_null(), "{session}");
        } else {
            assert_eq!(session["engine"]["peers"], 7, "{session}");
        }
    }
    assert_eq!(counts.together.load(Ordering::SeqCst), 3);

    // One session by its id; a bad id is refused.
    let one = get(&s.url(&format!(
        "/proxy/acestream/status?id={}&api_password={PW}",
        TOGETHER[1]
    )))
    .await;
    let v: Value = serde_json::from_slice(one.body.as_ref().unwrap()).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);
    for q in ["id=xyz", "infohash=", &format!("id={ID}&infohash={ID}")] {
        let r = get(&s.url(&format!("/proxy/acestream/status?{q}&api_password={PW}"))).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{q}");
    }
}
