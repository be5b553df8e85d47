//! LL-HLS through `/proxy/hls/manifest.m3u8` against an LL-HLS origin of our own that blocks
//! playlist reloads until the asked-for part is published: the playlist is rewritten exactly
//! (parts, preload hints, rendition reports through sluice; server control, part info and skip
//! tags kept), delivery directives go upstream, a hundred viewers blocked on the same part cost
//! the origin one request, and a hinted part is fetched once through the cache for all of them.
//! Reloads whose client hung up are cancelled upstream.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::{enc, get, sha256, test_config, Sluice};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Parts per segment; the origin's playlist advertises 0.25 s parts and 1 s segments.
const PARTS: u64 = 4;
const VIEWERS: usize = 100;

// === the LL-HLS origin ===

/// A live origin whose clock is the count of published parts, moved by the test.
struct LlOrigin {
    addr: SocketAddr,
    published: watch::Sender<u64>,
    /// Requests by path and query.
    seen: Arc<Mutex<HashMap<String, usize>>>,
}

impl LlOrigin {
    async fn start(published: u64) -> LlOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = watch::channel(published);
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (rx, log) = (rx.clone(), log.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (rx, log) = (rx.clone(), log.clone());
                        async move { Ok::<_, Infallible>(ll_serve(req, rx, &log).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        LlOrigin {
            addr,
            published: tx,
            seen,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    fn publish(&self, parts: u64) {
        self.published.send_replace(parts);
    }

    fn count(&self, path_and_query: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .get(path_and_query)
            .copied()
            .unwrap_or(0)
    }
}

async fn ll_serve(
    req: Request<Incoming>,
    mut published: watch::Receiver<u64>,
    log: &Mutex<HashMap<String, usize>>,
) -> Response<Full<Bytes>> {
    let uri = req.uri().clone();
    *log.lock()
        .unwrap()
        .entry(uri.path_and_query().unwrap().to_string())
        .or_default() += 1;
    let query: HashMap<String, String> =
        url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let number = |k: &str| query.get(k).and_then(|v| v.parse::<u64>().ok());
    // The part a request needs published before it is answered (a part index counts from 0).
    let needed = match (uri.path(), number("_HLS_msn")) {
        ("/live.m3u8" | "/alt.m3u8", Some(msn)) => {
            Some(msn * PARTS + number("_HLS_part").unwrap_or(PARTS - 1) + 1)
        }
        (p, _) => part_of(p).map(|(msn, part)| msn * PARTS + part + 1),
    };
    if let Some(needed) = needed {
        let wait = published.wait_for(|n| *n >= needed);
        if tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .is_err()
        {
            return status(StatusCode::SERVICE_UNAVAILABLE);
        }
    }
    let now = *published.borrow();
    match uri.path() {
        "/live.m3u8" | "/alt.m3u8" => {
            let skip = query.get("_HLS_skip").is_some_and(|v| v == "YES");
            Response::new(Full::new(Bytes::from(playlist(now, skip))))
        }
        p => match part_of(p) {
            Some((msn, part)) => Response::new(Full::new(part_bytes(msn, part))),
            None => status(StatusCode::NOT_FOUND),
        },
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = code;
    r
}

/// `/p{msn}.{part}.m4s` → (msn, part).
fn part_of(path: &str) -> Option<(u64, u64)> {
    let (msn, part) = path
        .strip_prefix("/p")?
        .strip_suffix(".m4s")?
        .split_once('.')?;
    Some((msn.parse().ok()?, part.parse().ok()?))
}

fn part_bytes(msn: u64, part: u64) -> Bytes {
    Bytes::from(format!("part {msn}.{part};").repeat(2000))
}

/// The media playlist once `published` parts exist: every complete segment with its parts (the
/// first ones skipped on request), the parts of the segment in progress, a preload hint for the
/// next part and a rendition report.
fn playlist(published: u64, skip: bool) -> String {
    let complete = published / PARTS;
    let mut out = String::from(
        "#EXTM3U\n#EXT-X-VERSION:9\n#EXT-X-TARGETDURATION:1\n\
         #EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK=0.75,CAN-SKIP-UNTIL=6.0\n\
         #EXT-X-PART-INF:PART-TARGET=0.25\n#EXT-X-MEDIA-SEQUENCE:0\n#EXT-X-MAP:URI=\"init.mp4\"\n",
    );
    let skipped = if skip { complete.saturating_sub(2) } else { 0 };
    if skipped > 0 {
        out.push_str(&format!("#EXT-X-SKIP:SKIPPED-SEGMENTS={skipped}\n"));
    }
    for msn in skipped..complete {
        for part in 0..PARTS {
            out.push_str(&format!(
                "#EXT-X-PART:DURATION=0.25,URI=\"p{msn}.{part}.m4s\"{}\n",
                if part == 0 { ",INDEPENDENT=YES" } else { "" }
            ));
        }
        out.push_str(&format!("#EXTINF:1.0,\ns{msn}.m4s\n"));
    }
    for part in 0..published % PARTS {
        out.push_str(&format!(
            "#EXT-X-PART:DURATION=0.25,URI=\"p{complete}.{part}.m4s\"\n"
        ));
    }
    let (msn, part) = (published / PARTS, published % PARTS);
    out.push_str(&format!(
        "#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"p{msn}.{part}.m4s\"\n\
         #EXT-X-RENDITION-REPORT:URI=\"alt.m3u8\",LAST-MSN={},LAST-PART={}\n",
        msn,
        part.saturating_sub(1)
    ));
    out
}

// === an origin that never answers ===

/// Reads each request head and never answers: counts the requests seen and the connections still
/// open, so a test sees when the proxy gives an upstream request up.
struct Holding {
    addr: SocketAddr,
    seen: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

impl Holding {
    async fn start() -> Holding {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (seen, open) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (s, o) = (seen.clone(), open.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (seen, open) = (s.clone(), o.clone());
                open.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    // Whatever happens, the connection is given up after 30 s.
                    let _ = tokio::time::timeout(Duration::from_secs(30), async {
                        let mut head = Vec::new();
                        let mut buf = [0u8; 4096];
                        let mut counted = false;
                        loop {
                            match stream.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                            if !counted && head.windows(4).any(|w| w == b"\r\n\r\n") {
                                counted = true;
                                seen.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    })
                    .await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Holding { addr, seen, open }
    }

    /// Waits (at most `secs`) until `done(seen, open)` holds.
    async fn wait(&self, secs: u64, done: impl Fn(usize, usize) -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if done(
                self.seen.load(Ordering::SeqCst),
                self.open.load(Ordering::SeqCst),
            ) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }
}

// === helpers ===

fn config() -> sluice::config::Config {
    let mut c = test_config();
    // Every viewer here is one loopback client.
    c.media.max_requests_per_client = 4 * VIEWERS;
    c.media.max_requests_per_token = 4 * VIEWERS;
    c
}

fn manifest(s: &Sluice, o: &LlOrigin, directives: &str) -> String {
    s.url(&format!(
        "/proxy/hls/manifest.m3u8?d={}{directives}",
        enc(&o.url("live.m3u8"))
    ))
}

async fn text(url: &str) -> String {
    let r = get(url).await;
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert_eq!(r.status, 200, "{url}: {body}");
    body
}

/// The origin's playlist with every URI replaced by what sluice must write for it.
fn expected(s: &Sluice, o: &LlOrigin, origin_text: &str) -> String {
    let seg = |name: &str| {
        let ext = if name.ends_with(".mp4") { "mp4" } else { "m4s" };
        s.url(&format!("/proxy/hls/segment.{ext}?d={}", enc(&o.url(name))))
    };
    let mut out = String::new();
    for line in origin_text.lines() {
        let line = match line.find("URI=\"") {
            Some(at) => {
                let rest = &line[at + 5..];
                let uri = &rest[..rest.find('"').unwrap()];
                let to = if uri.ends_with(".m3u8") {
                    s.url(&format!("/proxy/hls/manifest.m3u8?d={}", enc(&o.url(uri))))
                } else {
                    seg(uri)
                };
                line.replacen(uri, &to, 1)
            }
            None if !line.starts_with('#') => seg(line),
            None => line.to_owned(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

// === tests ===

#[tokio::test]
async fn ll_playlist_is_rewritten_exactly() {
    let o = LlOrigin::start(2 * PARTS + 2).await;
    let s = Sluice::start(config()).await;
    let got = text(&manifest(&s, &o, "")).await;
    assert_eq!(got, expected(&s, &o, &playlist(2 * PARTS + 2, false)));
    assert!(got.contains("#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES"));
    assert!(got.contains("#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"http://"));
    // A delta update is asked of the origin and its skip tag kept.
    let o = LlOrigin::start(5 * PARTS).await;
    let delta = text(&manifest(&s, &o, "&_HLS_skip=YES")).await;
    assert_eq!(o.count("/live.m3u8?_HLS_skip=YES"), 1);
    assert_eq!(delta, expected(&s, &o, &playlist(5 * PARTS, true)));
    assert!(delta.contains("#EXT-X-SKIP:SKIPPED-SEGMENTS=3\n"));
}

#[tokio::test]
async fn a_hundred_viewers_blocked_on_one_part_cost_the_origin_one_request() {
    let o = Arc::new(LlOrigin::start(3 * PARTS + 2).await);
    let s = Arc::new(Sluice::start(config()).await);
    // Every viewer blocks on the next part, 3.2, which is not published yet.
    let url = manifest(&s, &o, "&_HLS_msn=3&_HLS_part=2");
    let viewers: Vec<_> = (0..VIEWERS)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { text(&url).await })
        })
        .collect();
    let asked = "/live.m3u8?_HLS_msn=3&_HLS_part=2";
    for _ in 0..200 {
        if o.count(asked) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Give every viewer time to arrive and join while the origin holds the reload.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        viewers.iter().all(|v| !v.is_finished()),
        "nobody is answered before the part exists"
    );
    o.publish(3 * PARTS + 3);
    let mut bodies = Vec::new();
    for v in viewers {
        bodies.push(v.await.unwrap());
    }
    assert_eq!(
        o.count(asked),
        1,
        "one upstream request for {VIEWERS} viewers"
    );
    assert!(bodies.iter().all(|b| *b == bodies[0]));
    assert_eq!(bodies[0], expected(&s, &o, &playlist(3 * PARTS + 3, false)));
    assert!(bodies[0].contains(&enc(&o.url("p3.2.m4s"))));
    // Children never carry the directives: a player adds its own to each.
    assert!(!bodies[0].contains("_HLS_"));

    // The hinted part, 3.3, asked by every viewer before it exists: one origin fetch through the
    // cache, the same bytes for all.
    let hint = bodies[0]
        .lines()
        .find(|l| l.starts_with("#EXT-X-PRELOAD-HINT"))
        .map(|l| l.split('"').nth(1).unwrap().to_owned())
        .unwrap();
    let fetches: Vec<_> = (0..VIEWERS)
        .map(|_| {
            let hint = hint.clone();
            tokio::spawn(async move { get(&hint).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    o.publish(3 * PARTS + 4);
    let want = sha256(&part_bytes(3, 3));
    for f in fetches {
        let r = f.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(sha256(&r.body.unwrap()), want);
    }
    assert_eq!(
        o.count("/p3.3.m4s"),
        1,
        "one upstream fetch of the hinted part"
    );
}

#[tokio::test]
async fn directives_work_on_token_children_and_bad_ones_are_refused() {
    let o = LlOrigin::start(2 * PARTS).await;
    let mut c = config();
    c.auth.api_password = "ll-hls-test-password".into();
    let s = Sluice::start(c).await;
    let top = text(&manifest(&s, &o, "&api_password=ll-hls-test-password")).await;
    assert!(!top.contains("ll-hls-test-password"));
    // A reload names every segment and part by the same URL (players compare them).
    assert_eq!(
        text(&manifest(&s, &o, "&api_password=ll-hls-test-password")).await,
        top
    );
    // The rendition report's URI is a sealed token; a player appends its directives to it.
    let report = top
        .lines()
        .find(|l| l.starts_with("#EXT-X-RENDITION-REPORT"))
        .map(|l| l.split('"').nth(1).unwrap().to_owned())
        .unwrap();
    assert!(report.contains("/_token_"), "{report}");
    o.publish(2 * PARTS + 1);
    let alt = text(&format!("{report}?_HLS_msn=2&_HLS_part=0")).await;
    assert_eq!(o.count("/alt.m3u8?_HLS_msn=2&_HLS_part=0"), 1);
    assert!(alt.contains("p2.0.m4s") || alt.contains("/_token_"));
    assert!(!alt.contains("_HLS_"));
    for bad in ["_HLS_msn=x", "_HLS_part=1", "_HLS_msn=1&_HLS_skip=no"] {
        let r = get(&format!("{report}?{bad}")).await;
        assert_eq!(r.status, 400, "{bad}");
    }
    // A token's own parameters still cannot be overridden next to a directive.
    let r = get(&format!(
        "{report}?_HLS_msn=2&d={}",
        enc("http://127.0.0.1:1/x")
    ))
    .await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn blocking_reloads_left_by_their_client_are_cancelled_upstream() {
    const LEFT: usize = 32;
    let o = Holding::start().await;
    let mut c = config();
    // Only the client leaving may end the upstream requests here, not a timeout.
    c.upstream.header_timeout_secs = 60;
    c.upstream.idle_read_timeout_secs = 60;
    let s = Sluice::start(c).await;
    let d = enc(&format!("http://{}/live.m3u8", o.addr));
    // One client, a distinct `_HLS_msn` on each reload: each is a flight of its own.
    let mut clients = Vec::new();
    for msn in 0..LEFT {
        let mut conn = TcpStream::connect(s.addr).await.unwrap();
        let path = format!("/proxy/hls/manifest.m3u8?d={d}&_HLS_msn={msn}");
        conn.write_all(format!("GET {path} HTTP/1.1\r\nhost: {}\r\n\r\n", s.addr).as_bytes())
            .await
            .unwrap();
        clients.push(conn);
    }
    assert!(
        o.wait(5, |seen, open| seen == LEFT && open == LEFT).await,
        "the origin holds every reload: seen {}, open {}",
        o.seen.load(Ordering::SeqCst),
        o.open.load(Ordering::SeqCst)
    );
    // The client hangs up on all of them: nobody waits, so sluice gives every fetch up.
    drop(clients);
    assert!(
        o.wait(5, |_, open| open == 0).await,
        "{} upstream reloads still open after their client left",
        o.open.load(Ordering::SeqCst)
    );
    assert_eq!(o.seen.load(Ordering::SeqCst), LEFT);
}
