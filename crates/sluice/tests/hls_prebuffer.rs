//! HLS prebuffer: serving a media playlist warms its first segments (VOD) or its newest (live)
//! into the cache, with the segment requests' headers, and ten viewers arriving together cost the
//! origin one fetch per segment. Counted at a local origin; bodies checked by hash. Fetches ahead
//! are bounded for the whole process, and none start without the cache or for a HEAD.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::net::TcpListener;

const SEGMENTS: usize = 6;
/// Segments of `/big/index.m3u8`, more than fetches ahead may run at once.
const BIG: usize = 200;
/// `media::prefetch::MAX_BACKGROUND`.
const MAX_BACKGROUND: usize = 64;

fn segment_bytes(i: usize) -> Bytes {
    let mut b = pattern(200_000 + i * 1000).to_vec();
    b[0] = 0x47;
    Bytes::from(b)
}

/// Every request's path and `Authorization`, in order.
type AuthLog = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// Counts requests per path and the `Referer` each came with; segments answer after 50 ms.
struct HlsOrigin {
    addr: SocketAddr,
    hits: Arc<Mutex<HashMap<String, Vec<Option<String>>>>>,
    auths: AuthLog,
}

impl HlsOrigin {
    async fn start() -> HlsOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(HashMap::new()));
        let auths = Arc::new(Mutex::new(Vec::new()));
        let log = hits.clone();
        let auth_log = auths.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let log = log.clone();
                let auth_log = auth_log.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let log = log.clone();
                        let auth_log = auth_log.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let auth = req
                                .headers()
                                .get("authorization")
                                .map(|v| v.to_str().unwrap().to_string());
                            auth_log.lock().unwrap().push((path.clone(), auth));
                            let referer = req
                                .headers()
                                .get("referer")
                                .map(|v| v.to_str().unwrap().to_string());
                            log.lock()
                                .unwrap()
                                .entry(path.clone())
                                .or_insert_with(Vec::new)
                                .push(referer);
                            let full = |b: Bytes| -> BoxBody {
                                Full::new(b).map_err(|n| match n {}).boxed()
                            };
                            let playlist = |live: bool, n: usize| {
                                let mut p = String::from(
                                    "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:4\n#EXT-X-MEDIA-SEQUENCE:0\n",
                                );
                                for i in 0..n {
                                    p.push_str(&format!("#EXTINF:4.0,\nseg{i}.ts\n"));
                                }
                                if !live {
                                    p.push_str("#EXT-X-ENDLIST\n");
                                }
                                p
                            };
                            let resp = match path.as_str() {
                                "/vod/index.m3u8" => Response::builder()
                                    .header("content-type", "application/vnd.apple.mpegurl")
                                    .body(full(Bytes::from(playlist(false, SEGMENTS)))),
                                "/big/index.m3u8" => Response::builder()
                                    .header("content-type", "application/vnd.apple.mpegurl")
                                    .body(full(Bytes::from(playlist(false, BIG)))),
                                // Another user's playlist listing the victim's first segment, then
                                // segments of its own.
                                "/evil/index.m3u8" => Response::builder()
                                    .header("content-type", "application/vnd.apple.mpegurl")
                                    .body(full(Bytes::from(
                                        "#EXTM3U\n#EXT-X-TARGETDURATION:4\n#EXTINF:4.0,\n\
                                         ../vod/seg0.ts\n#EXTINF:4.0,\nseg1.ts\n#EXTINF:4.0,\n\
                                         seg2.ts\n#EXT-X-ENDLIST\n",
                                    ))),
                                "/live/index.m3u8" => Response::builder()
                                    .header("content-type", "application/vnd.apple.mpegurl")
                                    .body(full(Bytes::from(playlist(true, SEGMENTS)))),
                                p if p.contains("/seg") => {
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                    let i: usize = p
                                        .trim_end_matches(".ts")
                                        .rsplit("seg")
                                        .next()
                                        .unwrap()
                                        .parse()
                                        .unwrap();
                                    let bytes = segment_bytes(i);
                                    // `bytes=a-b` is answered as asked (a 206).
                                    let range = req
                                        .headers()
                                        .get("range")
                                        .and_then(|v| v.to_str().ok()?.strip_prefix("bytes="))
                                        .and_then(|r| r.split_once('-'))
                                        .and_then(|(a, b)| {
                                            Some((
                                                a.parse::<usize>().ok()?,
                                                b.parse::<usize>().ok()?,
                                            ))
                                        });
                                    match range.map(|(a, b)| (a, b.min(bytes.len() - 1))) {
                                        Some((a, b)) => Response::builder()
                                            .status(206)
                                            .header("content-type", "video/mp2t")
                                            .header(
                                                "content-range",
                                                format!("bytes {a}-{b}/{}", bytes.len()),
                                            )
                                            .body(full(bytes.slice(a..=b))),
                                        None => Response::builder()
                                            .header("content-type", "video/mp2t")
                                            .body(full(bytes)),
                                    }
                                }
                                _ => Response::builder().status(404).body(full(Bytes::new())),
                            };
                            Ok::<_, Infallible>(resp.unwrap())
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        HlsOrigin { addr, hits, auths }
    }

    fn count(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).map_or(0, Vec::len)
    }

    /// Segment requests seen, every segment together.
    fn segment_requests(&self) -> usize {
        let hits = self.hits.lock().unwrap();
        hits.iter()
            .filter(|(p, _)| p.contains("/seg"))
            .map(|(_, v)| v.len())
            .sum()
    }

    fn referers(&self, path: &str) -> Vec<Option<String>> {
        self.hits
            .lock()
            .unwrap()
            .get(path)
            .cloned()
            .unwrap_or_default()
    }

    /// The `Authorization` of every request for `path`.
    fn auths(&self, path: &str) -> Vec<Option<String>> {
        let auths = self.auths.lock().unwrap();
        auths
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// Waits (at most 5 s) until `path` has been fetched at least once.
    async fn wait_for(&self, path: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.count(path) > 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }
}

async fn start(prebuffer: usize) -> Sluice {
    let mut config = test_config();
    config.media.prebuffer_segments = prebuffer;
    // Fetching ahead after segment requests would blur what the playlist itself warmed.
    config.media.prefetch_segments = 1;
    Sluice::start(config).await
}

/// The playlist through sluice, and its segment URLs (on sluice) in order.
async fn playlist(s: &Sluice, origin: &HlsOrigin, path: &str) -> Vec<String> {
    let d = enc(&format!("http://{}{path}", origin.addr));
    let r = get(&s.url(&format!(
        "/proxy/hls/manifest.m3u8?d={d}&h_referer=https%3A%2F%2Fsite.example%2F"
    )))
    .await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| match l.starts_with('/') {
            true => s.url(l),
            false => l.to_string(),
        })
        .collect()
}

#[tokio::test]
async fn vod_playlist_warms_its_first_segments_and_viewers_share_them() {
    let origin = HlsOrigin::start().await;
    let s = start(3).await;
    let urls = playlist(&s, &origin, "/vod/index.m3u8").await;
    assert_eq!(urls.len(), SEGMENTS);
    for i in 0..3 {
        assert!(
            origin.wait_for(&format!("/vod/seg{i}.ts")).await,
            "seg{i} not warmed"
        );
    }
    // Ten viewers of the first three segments, all at once.
    let fetches = (0..10).flat_map(|_| urls[..3].iter().map(|u| get(u)));
    for (n, r) in futures_util::future::join_all(fetches)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(r.status, 200);
        assert_eq!(sha256(&r.body.unwrap()), sha256(&segment_bytes(n % 3)));
    }
    for i in 0..3 {
        let path = format!("/vod/seg{i}.ts");
        assert_eq!(origin.count(&path), 1, "{path}");
        // Warmed with the headers the segment requests carry.
        assert_eq!(
            origin.referers(&path),
            vec![Some("https://site.example/".to_string())]
        );
    }
    assert_eq!(origin.count("/vod/seg5.ts"), 0);
}

#[tokio::test]
async fn live_playlist_warms_its_newest_segments() {
    let origin = HlsOrigin::start().await;
    let s = start(2).await;
    let urls = playlist(&s, &origin, "/live/index.m3u8").await;
    assert!(origin.wait_for("/live/seg4.ts").await);
    assert!(origin.wait_for("/live/seg5.ts").await);
    // A refresh of the playlist does not fetch them again.
    let _ = playlist(&s, &origin, "/live/index.m3u8").await;
    let r = get(&urls[5]).await;
    assert_eq!(sha256(&r.body.unwrap()), sha256(&segment_bytes(5)));
    assert_eq!(origin.count("/live/seg5.ts"), 1);
    assert_eq!(origin.count("/live/seg4.ts"), 1);
    assert_eq!(origin.count("/live/seg0.ts"), 0);
}

#[tokio::test]
async fn off_means_nothing_is_fetched_before_a_viewer_asks() {
    let origin = HlsOrigin::start().await;
    let s = start(0).await;
    let _ = playlist(&s, &origin, "/vod/index.m3u8").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..SEGMENTS {
        assert_eq!(origin.count(&format!("/vod/seg{i}.ts")), 0);
    }
}

#[tokio::test]
async fn without_the_cache_nothing_is_fetched_ahead() {
    let origin = HlsOrigin::start().await;
    let mut config = test_config();
    config.media.cache = false;
    config.media.prebuffer_segments = 3;
    config.media.prefetch_segments = 3;
    let s = Sluice::start(config).await;
    let urls = playlist(&s, &origin, "/vod/index.m3u8").await;
    let r = get(&urls[0]).await;
    assert_eq!(r.status, 200);
    assert_eq!(sha256(&r.body.unwrap()), sha256(&segment_bytes(0)));
    // Fetches ahead would have nowhere to keep their bytes: the origin sees the one request.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.count("/vod/seg0.ts"), 1);
    assert_eq!(origin.segment_requests(), 1);
}

#[tokio::test]
async fn without_the_cache_a_segment_streams_past_the_segment_bound() {
    let origin = HlsOrigin::start().await;
    let mut config = test_config();
    config.media.cache = false;
    config.media.prefetch_segments = 3;
    // Below every segment's size: a bound for bytes held whole, which a pipe never does.
    config.media.max_segment_bytes = 100_000;
    let s = Sluice::start(config).await;
    let urls = playlist(&s, &origin, "/vod/index.m3u8").await;
    let r = get(&urls[2]).await;
    assert_eq!(r.status, 200);
    assert_eq!(sha256(&r.body.unwrap()), sha256(&segment_bytes(2)));
    assert_eq!(origin.segment_requests(), 1);
}

#[tokio::test]
async fn a_head_of_a_playlist_warms_nothing() {
    let origin = HlsOrigin::start().await;
    let s = start(3).await;
    let d = enc(&format!("http://{}/vod/index.m3u8", origin.addr));
    let r = request(
        "HEAD",
        &s.url(&format!("/proxy/hls/manifest.m3u8?d={d}")),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(origin.wait_for("/vod/index.m3u8").await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.segment_requests(), 0);
}

#[tokio::test]
async fn fetches_ahead_are_bounded_for_the_whole_process() {
    let origin = HlsOrigin::start().await;
    let s = start(BIG).await;
    let urls = playlist(&s, &origin, "/big/index.m3u8").await;
    assert_eq!(urls.len(), BIG);
    // The first MAX_BACKGROUND are warmed; the rest find no place and are skipped, not queued.
    let deadline = Instant::now() + Duration::from_secs(5);
    while origin.segment_requests() < MAX_BACKGROUND && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(origin.segment_requests(), MAX_BACKGROUND);
    assert_eq!(
        origin.count(&format!("/big/seg{}.ts", MAX_BACKGROUND - 1)),
        1
    );
    assert_eq!(origin.count(&format!("/big/seg{MAX_BACKGROUND}.ts")), 0);
}

#[tokio::test]
async fn a_segment_request_that_bypasses_the_cache_fetches_nothing_ahead() {
    let origin = HlsOrigin::start().await;
    let mut config = test_config();
    config.media.prebuffer_segments = 0;
    config.media.prefetch_segments = 2;
    let s = Sluice::start(config).await;
    let urls = playlist(&s, &origin, "/vod/index.m3u8").await;
    // The client's own Range goes upstream (`h_range`): the origin's 206 is relayed as it is
    // (it was read through the prefetcher and served as a 200 of 100 bytes), and nothing is
    // fetched ahead with its headers (those fetches would go around the cache).
    let r = get(&format!("{}&h_range=bytes%3D0-99", urls[0])).await;
    assert_eq!(r.status, 206);
    let whole = segment_bytes(0);
    assert_eq!(
        r.headers["content-range"],
        format!("bytes 0-99/{}", whole.len()).as_str()
    );
    assert_eq!(r.body.unwrap(), whole.slice(0..100));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(origin.count("/vod/seg0.ts"), 1);
    assert_eq!(origin.segment_requests(), 1);
    // A plain request of the next segment does fetch the two after it.
    let r = get(&urls[1]).await;
    assert_eq!(sha256(&r.body.unwrap()), sha256(&segment_bytes(1)));
    assert!(origin.wait_for("/vod/seg2.ts").await);
    assert!(origin.wait_for("/vod/seg3.ts").await);
    assert_eq!(origin.count("/vod/seg4.ts"), 0);
}

/// The playlist through sluice with `Authorization: auth` upstream, and its segment URLs.
async fn playlist_as(s: &Sluice, origin: &HlsOrigin, path: &str, auth: &str) -> Vec<String> {
    let d = enc(&format!("http://{}{path}", origin.addr));
    let r = get(&s.url(&format!(
        "/proxy/hls/manifest.m3u8?d={d}&h_authorization={}",
        enc(auth)
    )))
    .await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| match l.starts_with('/') {
            true => s.url(l),
            false => l.to_string(),
        })
        .collect()
}

#[tokio::test]
async fn a_segment_fetches_ahead_only_in_playlists_registered_with_its_own_headers() {
    let origin = HlsOrigin::start().await;
    let mut config = test_config();
    config.media.prebuffer_segments = 0;
    config.media.prefetch_segments = 2;
    let s = Sluice::start(config).await;
    let victim = playlist_as(&s, &origin, "/vod/index.m3u8", "Bearer victim").await;
    // Registered last, listing the victim's first segment then its own: keyed by URL alone, the
    // victim's request for seg0 fetched /evil/seg1.ts and /evil/seg2.ts with the victim's token.
    let evil = playlist_as(&s, &origin, "/evil/index.m3u8", "Bearer evil").await;
    assert_eq!(evil.len(), 3);
    let r = get(&victim[0]).await;
    assert_eq!(sha256(&r.body.unwrap()), sha256(&segment_bytes(0)));
    // The victim's own next segments are fetched ahead, with the victim's headers.
    assert!(origin.wait_for("/vod/seg1.ts").await);
    assert!(origin.wait_for("/vod/seg2.ts").await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mine = Some("Bearer victim".to_string());
    assert_eq!(origin.auths("/vod/seg1.ts"), vec![mine.clone()]);
    assert_eq!(origin.auths("/vod/seg2.ts"), vec![mine.clone()]);
    assert_eq!(origin.count("/vod/seg3.ts"), 0);
    // Nothing of the other playlist was fetched, and nothing anywhere else with the victim's token.
    assert_eq!(origin.count("/evil/seg1.ts"), 0);
    assert_eq!(origin.count("/evil/seg2.ts"), 0);
    let auths = origin.auths.lock().unwrap().clone();
    for (path, auth) in auths {
        assert!(
            path.starts_with("/vod/") || auth != mine,
            "{path} fetched with the victim's Authorization"
        );
    }
    // The other user's own fetch of that segment does fetch ahead in their own playlist.
    let r = get(&evil[0]).await;
    assert_eq!(sha256(&r.body.unwrap()), sha256(&segment_bytes(0)));
    assert!(origin.wait_for("/evil/seg1.ts").await);
    assert_eq!(
        origin.auths("/evil/seg1.ts"),
        vec![Some("Bearer evil".to_string())]
    );
}

/// One answer of a [`Recording`] origin.
#[derive(Clone)]
struct Route {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Bytes,
}

impl Route {
    fn ok(content_type: &'static str, body: impl Into<Bytes>) -> Route {
        Route {
            status: 200,
            headers: vec![("content-type", content_type.to_string())],
            body: body.into(),
        }
    }
}

/// A request as a [`Recording`] origin saw it: path, `Authorization`, `Cookie`.
/// Path, `Authorization`, `Cookie`, `Host`.
type Sighting = (String, Option<String>, Option<String>, Option<String>);

/// An origin answering set routes (404 otherwise), recording every request's credentials.
struct Recording {
    addr: SocketAddr,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    log: Arc<Mutex<Vec<Sighting>>>,
}

impl Recording {
    async fn start() -> Recording {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let routes: Arc<Mutex<HashMap<String, Route>>> = Arc::default();
        let log: Arc<Mutex<Vec<Sighting>>> = Arc::default();
        let (r, l) = (routes.clone(), log.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (r, l) = (r.clone(), l.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (r, l) = (r.clone(), l.clone());
                        async move {
                            let path = req.uri().path().to_string();
                            let header = |name: &str| {
                                req.headers()
                                    .get(name)
                                    .map(|v| v.to_str().unwrap().to_string())
                            };
                            l.lock().unwrap().push((
                                path.clone(),
                                header("authorization"),
                                header("cookie"),
                                header("host"),
                            ));
                            let route = r.lock().unwrap().get(&path).cloned();
                            let mut b = Response::builder();
                            let body = match route {
                                Some(route) => {
                                    b = b.status(route.status);
                                    for (k, v) in route.headers {
                                        b = b.header(k, v);
                                    }
                                    route.body
                                }
                                None => {
                                    b = b.status(404);
                                    Bytes::new()
                                }
                            };
                            let body: BoxBody = Full::new(body).map_err(|n| match n {}).boxed();
                            Ok::<_, Infallible>(b.body(body).unwrap())
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Recording { addr, routes, log }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn route(&self, path: &str, route: Route) {
        self.routes.lock().unwrap().insert(path.to_string(), route);
    }

    fn log(&self) -> Vec<Sighting> {
        self.log.lock().unwrap().clone()
    }

    /// Requests for paths starting with `prefix`.
    fn count(&self, prefix: &str) -> usize {
        self.log()
            .iter()
            .filter(|(p, ..)| p.starts_with(prefix))
            .count()
    }
}

/// Every URL a rewritten playlist names: URI lines and `URI="..."` attributes, on sluice.
fn named_urls(s: &Sluice, playlist: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in playlist.lines() {
        let found = match line.starts_with('#') {
            true => line
                .split_once("URI=\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(uri, _)| uri.to_string()),
            false => Some(line.to_string()).filter(|l| !l.is_empty()),
        };
        if let Some(u) = found {
            out.push(match u.starts_with('/') {
                true => s.url(&u),
                false => u,
            });
        }
    }
    out
}

#[tokio::test]
async fn a_viewers_credentials_never_reach_another_origin_the_playlist_names() {
    let (a, b) = (Recording::start().await, Recording::start().await);
    let ts = |i: usize| Route::ok("video/mp2t", segment_bytes(i));
    // A's playlist names its own segments, segments and a key on B, and a variant on B.
    let playlist = format!(
        "#EXTM3U\n#EXT-X-TARGETDURATION:4\n\
         #EXT-X-KEY:METHOD=AES-128,URI=\"{key}\"\n\
         #EXTINF:4.0,\na0.ts\n#EXTINF:4.0,\n{b0}\n#EXTINF:4.0,\na1.ts\n\
         #EXTINF:4.0,\n{b1}\n#EXTINF:4.0,\na2.ts\n#EXT-X-ENDLIST\n",
        key = b.url("/key.bin"),
        b0 = b.url("/b0.ts"),
        b1 = b.url("/b1.ts"),
    );
    let mpegurl = "application/vnd.apple.mpegurl";
    a.route("/live.m3u8", Route::ok(mpegurl, playlist));
    for (i, p) in ["/a0.ts", "/a1.ts", "/a2.ts"].into_iter().enumerate() {
        a.route(p, ts(i));
    }
    for (i, p) in ["/b0.ts", "/b1.ts", "/b2.ts", "/b3.ts"]
        .into_iter()
        .enumerate()
    {
        b.route(p, ts(i));
    }
    b.route(
        "/key.bin",
        Route::ok("application/octet-stream", "0123456789abcdef"),
    );
    // A redirects its other playlist to B, whose segments are relative (so on B).
    a.route(
        "/go.m3u8",
        Route {
            status: 302,
            headers: vec![("location", b.url("/live.m3u8"))],
            body: Bytes::new(),
        },
    );
    let on_b = "#EXTM3U\n#EXT-X-TARGETDURATION:4\n#EXTINF:4.0,\nb2.ts\n#EXTINF:4.0,\nb3.ts\n\
                #EXT-X-ENDLIST\n";
    b.route("/live.m3u8", Route::ok(mpegurl, on_b));

    let mut config = test_config();
    config.media.prebuffer_segments = 3;
    config.media.prefetch_segments = 3;
    let s = Sluice::start(config).await;
    // `h_host` names A's virtual host: B's children are asked for under B's own name.
    let creds = format!(
        "&h_authorization=Bearer%20X&h_Cookie=session%3D1&h_host={}",
        a.addr
    );
    for path in ["/live.m3u8", "/go.m3u8"] {
        let d = enc(&a.url(path));
        let r = get(&s.url(&format!("/proxy/hls/manifest.m3u8?d={d}{creds}"))).await;
        assert_eq!(r.status, 200, "{path}");
        let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        let urls = named_urls(&s, &text);
        assert!(urls.len() >= 2, "{text}");
        for url in urls {
            assert_eq!(get(&url).await.status, 200, "{url}");
        }
    }
    // Prebuffer and prefetch have had their turn.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen_b = b.log();
    for p in [
        "/key.bin",
        "/b0.ts",
        "/b1.ts",
        "/b2.ts",
        "/b3.ts",
        "/live.m3u8",
    ] {
        assert!(seen_b.iter().any(|(q, ..)| q == p), "{p} never fetched");
    }
    let b_host = Some(b.addr.to_string());
    for (path, auth, cookie, host) in &seen_b {
        assert_eq!(
            (auth, cookie, host),
            (&None, &None, &b_host),
            "B got the viewer's credentials or A's virtual host for {path}"
        );
    }
    // A's own playlist and segments still get them.
    let bearer = (Some("Bearer X".to_string()), Some("session=1".to_string()));
    let seen_a = a.log();
    for p in ["/live.m3u8", "/go.m3u8", "/a0.ts", "/a1.ts", "/a2.ts"] {
        let mine: Vec<_> = seen_a.iter().filter(|(q, ..)| q == p).collect();
        assert!(!mine.is_empty(), "{p} never fetched");
        for (_, auth, cookie, host) in mine {
            assert_eq!((auth.clone(), cookie.clone()), bearer, "{p}");
            assert_eq!(host.as_deref(), Some(a.addr.to_string().as_str()), "{p}");
        }
    }
}

#[tokio::test]
async fn segments_the_origin_will_not_let_us_store_are_not_fetched_ahead() {
    let origin = Recording::start().await;
    let mut playlist = String::from("#EXTM3U\n#EXT-X-TARGETDURATION:4\n");
    for i in 0..10 {
        playlist.push_str(&format!("#EXTINF:4.0,\nseg{i}.ts\n"));
        origin.route(
            &format!("/ns/seg{i}.ts"),
            Route {
                status: 200,
                headers: vec![
                    ("content-type", "video/mp2t".to_string()),
                    ("cache-control", "no-store".to_string()),
                ],
                body: segment_bytes(i),
            },
        );
    }
    playlist.push_str("#EXT-X-ENDLIST\n");
    origin.route(
        "/ns/index.m3u8",
        Route::ok("application/vnd.apple.mpegurl", playlist),
    );
    let mut config = test_config();
    config.media.prebuffer_segments = 0;
    config.media.prefetch_segments = 3;
    let s = Sluice::start(config).await;
    let d = enc(&origin.url("/ns/index.m3u8"));
    let r = get(&s.url(&format!("/proxy/hls/manifest.m3u8?d={d}"))).await;
    let urls = named_urls(&s, std::str::from_utf8(&r.body.unwrap()).unwrap());
    for (i, url) in urls.iter().enumerate().take(6).skip(1) {
        let r = get(url).await;
        assert_eq!(sha256(&r.body.unwrap()), sha256(&segment_bytes(i)));
        // Any fetch ahead it started has its turn before the next request.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One origin fetch per segment the viewer asked for: each fetched ahead was thrown away.
    assert_eq!(origin.count("/ns/seg"), 5, "{:?}", origin.log());
}

/// `media.credential_hosts`: a playlist on A (`127.0.0.1`) whose segments are on B under a listed
/// name (`localhost`) and on C (another origin, unlisted): B's children carry the viewer's cookie
/// and `Authorization` (linked, prebuffered and fetched ahead), never A's `h_host`; C gets none.
#[tokio::test]
async fn a_listed_host_gets_the_viewers_credentials_and_an_unlisted_one_does_not() {
    let (a, b, c) = (
        Recording::start().await,
        Recording::start().await,
        Recording::start().await,
    );
    let b_url = |p: &str| format!("http://localhost:{}{p}", b.addr.port());
    let playlist = format!(
        "#EXTM3U\n#EXT-X-TARGETDURATION:4\n\
         #EXTINF:4.0,\n{b0}\n#EXTINF:4.0,\n{b1}\n#EXTINF:4.0,\n{c0}\n\
         #EXTINF:4.0,\n{b2}\n#EXTINF:4.0,\n{b3}\n#EXT-X-ENDLIST\n",
        b0 = b_url("/b0.ts"),
        b1 = b_url("/b1.ts"),
        c0 = c.url("/c0.ts"),
        b2 = b_url("/b2.ts"),
        b3 = b_url("/b3.ts"),
    );
    a.route(
        "/live.m3u8",
        Route::ok("application/vnd.apple.mpegurl", playlist),
    );
    for (i, p) in ["/b0.ts", "/b1.ts", "/b2.ts", "/b3.ts"]
        .into_iter()
        .enumerate()
    {
        b.route(p, Route::ok("video/mp2t", segment_bytes(i)));
    }
    c.route("/c0.ts", Route::ok("video/mp2t", segment_bytes(9)));

    let mut config = test_config();
    config.media.prebuffer_segments = 2;
    config.media.prefetch_segments = 2;
    config.media.credential_hosts = vec!["localhost".into()];
    let s = Sluice::start(config).await;
    let creds = format!(
        "&h_authorization=Bearer%20X&h_Cookie=session%3D1&h_host={}",
        a.addr
    );
    let d = enc(&a.url("/live.m3u8"));
    let r = get(&s.url(&format!("/proxy/hls/manifest.m3u8?d={d}{creds}"))).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let urls = named_urls(&s, &text);
    assert_eq!(urls.len(), 5, "{text}");
    for url in &urls {
        assert_eq!(get(url).await.status, 200, "{url}");
    }
    // Prebuffer and prefetch have had their turn.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen_b = b.log();
    for p in ["/b0.ts", "/b1.ts", "/b2.ts", "/b3.ts"] {
        assert!(seen_b.iter().any(|(q, ..)| q == p), "{p} never fetched");
    }
    let b_host = format!("localhost:{}", b.addr.port());
    for (path, auth, cookie, host) in &seen_b {
        assert_eq!(auth.as_deref(), Some("Bearer X"), "B's {path}");
        assert_eq!(cookie.as_deref(), Some("session=1"), "B's {path}");
        assert_eq!(host.as_deref(), Some(b_host.as_str()), "B's {path}");
    }
    let seen_c = c.log();
    assert!(!seen_c.is_empty(), "C never fetched");
    for (path, auth, cookie, host) in &seen_c {
        assert_eq!((auth, cookie), (&None, &None), "C's {path}");
        assert_eq!(
            host.as_deref(),
            Some(c.addr.to_string().as_str()),
            "C's {path}"
        );
    }
}
