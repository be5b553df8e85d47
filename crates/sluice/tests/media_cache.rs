//! The media front end on the slice cache service, end to end: a sluice started in-process in
//! front of an origin on 127.0.0.1 whose segments name the cookie they were fetched with and span
//! two 1 MiB slices. Users never share bytes, concurrent requests make one origin request per
//! slice, and a restart with a disk tier serves segments without the origin.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::{enc, get, pattern, sha256, test_config, Sluice};
use tokio::net::TcpListener;

/// Segment size: one full slice and a part of the next.
const SEGMENT_LEN: usize = (1 << 20) + 300_000;

/// One request the origin answered: path, `Cookie`, `Range`.
type Hit = (String, String, Option<String>);

/// `/live.m3u8` lists `seg1.ts`..`seg4.ts`; a segment's body is `<path>|cookie=<cookie>|` and a
/// fixed pattern up to [`SEGMENT_LEN`]. `Range` is honoured with a 206. Every answer waits
/// `delay_ms` first.
struct SegmentOrigin {
    addr: std::net::SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
    delay_ms: Arc<AtomicU64>,
    /// Paths answered with a 404 (not published yet).
    missing: Arc<Mutex<Vec<String>>>,
}

impl SegmentOrigin {
    async fn start() -> SegmentOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let missing = Arc::new(Mutex::new(Vec::new()));
        let (h, d, m) = (hits.clone(), delay_ms.clone(), missing.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (h, d, m) = (h.clone(), d.clone(), m.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (h, d, m) = (h.clone(), d.clone(), m.clone());
                        async move {
                            let ms = d.load(Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            Ok::<_, Infallible>(answer(req, &h, &m))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        SegmentOrigin {
            addr,
            hits,
            delay_ms,
            missing,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests for `path` with `cookie`, their `Range`s in order.
    fn ranges(&self, path: &str, cookie: &str) -> Vec<Option<String>> {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, c, _)| p == path && c == cookie)
            .map(|(_, _, r)| r.clone())
            .collect()
    }

    fn count(&self, path: &str) -> usize {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _, _)| p == path)
            .count()
    }
}

fn segment_body(path: &str, cookie: &str) -> Bytes {
    let mut body = format!("{path}|cookie={cookie}|").into_bytes();
    body.extend_from_slice(&pattern(SEGMENT_LEN - body.len()));
    Bytes::from(body)
}

fn answer(
    req: Request<Incoming>,
    hits: &Mutex<Vec<Hit>>,
    missing: &Mutex<Vec<String>>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let cookie = header("cookie").unwrap_or_default();
    let range = header("range");
    hits.lock()
        .unwrap()
        .push((path.clone(), cookie.clone(), range.clone()));
    if path == "/live.m3u8" {
        let text = "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:4\n#EXT-X-MEDIA-SEQUENCE:1\n\
                    #EXTINF:4,\nseg1.ts\n#EXTINF:4,\nseg2.ts\n#EXTINF:4,\nseg3.ts\n#EXTINF:4,\nseg4.ts\n";
        return Response::builder()
            .header("content-type", "application/vnd.apple.mpegurl")
            .body(Full::new(Bytes::from(text)))
            .unwrap();
    }
    if missing.lock().unwrap().contains(&path) {
        return Response::builder()
            .status(404)
            .body(Full::new(Bytes::from_static(b"not yet")))
            .unwrap();
    }
    let body = segment_body(&path, &cookie);
    let resp = Response::builder().header("content-type", "video/mp2t");
    let parsed = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
    match parsed {
        Some((a, b)) if a < body.len() => {
            let end = (b + 1).min(body.len());
            resp.status(206)
                .header(
                    "content-range",
                    format!("bytes {a}-{}/{}", end - 1, body.len()),
                )
                .body(Full::new(body.slice(a..end)))
                .unwrap()
        }
        _ => resp.body(Full::new(body)).unwrap(),
    }
}

const SLICE_0: &str = "bytes=0-1048575";
const SLICE_1: &str = "bytes=1048576-2097151";

fn seg_url(s: &Sluice, o: &SegmentOrigin, seg: &str, cookie: Option<&str>) -> String {
    let mut url = s.url(&format!(
        "/proxy/hls/segment.ts?d={}",
        enc(&o.url(&format!("/{seg}")))
    ));
    if let Some(c) = cookie {
        url.push_str(&format!("&h_cookie={}", enc(c)));
    }
    url
}

/// Serves the playlist, so its segments go through the cache from then on.
async fn load_playlist(s: &Sluice, o: &SegmentOrigin) {
    load_playlist_as(s, o, None).await
}

/// The same for a viewer whose links carry `cookie`: its segment requests fetch ahead in this
/// registration (the prefetcher keys playlists by the headers their links carry).
async fn load_playlist_as(s: &Sluice, o: &SegmentOrigin, cookie: Option<&str>) {
    let mut url = s.url(&format!(
        "/proxy/hls/manifest.m3u8?d={}",
        enc(&o.url("/live.m3u8"))
    ));
    if let Some(c) = cookie {
        url.push_str(&format!("&h_cookie={}", enc(c)));
    }
    let r = get(&url).await;
    assert_eq!(r.status, 200);
}

async fn body_of(url: &str) -> Bytes {
    let r = get(url).await;
    assert_eq!(r.status, 200, "{url}");
    r.body.unwrap()
}

async fn metrics(s: &Sluice) -> String {
    String::from_utf8(get(&s.url("/metrics")).await.body.unwrap().to_vec()).unwrap()
}

/// The value of one metric series line (`name{labels} value`), 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn users_with_different_cookies_never_share_bytes() {
    let o = SegmentOrigin::start().await;
    let s = Sluice::start(test_config()).await;
    load_playlist(&s, &o).await;
    // A's player loaded the playlist through links carrying A's cookie, as its segments do.
    load_playlist_as(&s, &o, Some("user=A")).await;
    // A and B ask for the same segment at the same time: neither joins the other's fetch.
    o.delay_ms.store(200, Ordering::SeqCst);
    let (url_a, url_b) = (
        seg_url(&s, &o, "seg1.ts", Some("user=A")),
        seg_url(&s, &o, "seg1.ts", Some("user=B")),
    );
    let (a, b) = tokio::join!(body_of(&url_a), body_of(&url_b));
    o.delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(
        sha256(&a),
        sha256(&segment_body("/seg1.ts", "user=A")),
        "A got A's bytes"
    );
    assert_eq!(
        sha256(&b),
        sha256(&segment_body("/seg1.ts", "user=B")),
        "B got B's bytes"
    );
    // Each user's object was fetched once, slice by slice, with that user's cookie.
    let slices = vec![Some(SLICE_0.to_string()), Some(SLICE_1.to_string())];
    assert_eq!(o.ranges("/seg1.ts", "user=A"), slices);
    assert_eq!(o.ranges("/seg1.ts", "user=B"), slices);
    // Asking again is a hit for each: isolation did not turn the cache off.
    assert_eq!(
        body_of(&seg_url(&s, &o, "seg1.ts", Some("user=A"))).await,
        a
    );
    assert_eq!(
        body_of(&seg_url(&s, &o, "seg1.ts", Some("user=B"))).await,
        b
    );
    assert_eq!(o.count("/seg1.ts"), 4);
    // No cookie at all is a third user, not a match for either.
    let anonymous = body_of(&seg_url(&s, &o, "seg1.ts", None)).await;
    assert_eq!(sha256(&anonymous), sha256(&segment_body("/seg1.ts", "")));
    // The segments A's request prefetched (with A's cookie) are not B's either.
    for _ in 0..200 {
        if o.ranges("/seg2.ts", "user=A").len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(o.ranges("/seg2.ts", "user=A").len(), 2, "prefetched for A");
    let b2 = body_of(&seg_url(&s, &o, "seg2.ts", Some("user=B"))).await;
    assert_eq!(sha256(&b2), sha256(&segment_body("/seg2.ts", "user=B")));
    let m = metrics(&s).await;
    assert!(metric(&m, "sluice_media_cache_hits_total{kind=\"segment\"}") >= 2.0);
}

#[tokio::test]
async fn concurrent_requests_for_one_segment_make_one_origin_request_per_slice() {
    let o = SegmentOrigin::start().await;
    // No prebuffer: serving the playlist would warm this segment, and the counts are the 20
    // clients' (tests/hls_prebuffer.rs counts the warm-up's).
    let mut config = test_config();
    config.media.prebuffer_segments = 0;
    let s = Sluice::start(config).await;
    load_playlist(&s, &o).await;
    o.delay_ms.store(300, Ordering::SeqCst);
    // The playlist's last segment: nothing follows it, so prefetch fetches nothing, and every
    // count below is this segment's alone (prefetched segments count as misses too).
    let url = seg_url(&s, &o, "seg4.ts", None);
    let clients: Vec<_> = (0..20)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { body_of(&url).await })
        })
        .collect();
    let expected = sha256(&segment_body("/seg4.ts", ""));
    for c in clients {
        assert_eq!(sha256(&c.await.unwrap()), expected);
    }
    assert_eq!(
        o.ranges("/seg4.ts", ""),
        vec![Some(SLICE_0.to_string()), Some(SLICE_1.to_string())],
        "one origin request per slice for 20 clients"
    );
    let m = metrics(&s).await;
    assert_eq!(
        metric(&m, "sluice_media_cache_misses_total{kind=\"segment\"}"),
        1.0
    );
    let joined = metric(&m, "sluice_media_cache_coalesced_total{kind=\"segment\"}")
        + metric(&m, "sluice_media_cache_hits_total{kind=\"segment\"}");
    assert_eq!(joined, 19.0);
    assert!(metric(&m, "sluice_cache_coalesced_waiters_total") >= 1.0);
}

#[tokio::test]
async fn segments_survive_a_restart_with_the_disk_tier() {
    let o = SegmentOrigin::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config();
    config.cache.disk_path = Some(dir.path().to_path_buf());
    config.cache.disk_bytes = sluice::cache::ByteSize(64 << 20);
    config.media.prefetch_segments = 1;
    let mut s = Sluice::start(config.clone()).await;
    load_playlist(&s, &o).await;
    let first = body_of(&seg_url(&s, &o, "seg1.ts", None)).await;
    assert_eq!(sha256(&first), sha256(&segment_body("/seg1.ts", "")));
    // The disk writer works off the request path, and serving the playlist warmed more segments
    // than seg1: wait until every slice the origin was asked for (one ranged request each) and
    // every segment's record is on disk. Files still being written end in `.tmp` and are renamed
    // when complete: count only those.
    let count = |sub: &str| {
        std::fs::read_dir(dir.path().join(sub)).map_or(0, |d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_none_or(|x| x != "tmp"))
                .count()
        })
    };
    let fetched = || {
        let hits = o.hits.lock().unwrap();
        let slices = hits.iter().filter(|(_, _, r)| r.is_some()).count();
        let mut segments: Vec<&str> = hits
            .iter()
            .filter(|(_, _, r)| r.is_some())
            .map(|(p, _, _)| p.as_str())
            .collect();
        segments.sort_unstable();
        segments.dedup();
        (segments.len(), slices)
    };
    let on_disk = || {
        let (segments, slices) = fetched();
        count("objects") >= segments.max(2) && count("slices") >= slices.max(4)
    };
    for _ in 0..500 {
        if on_disk() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(on_disk(), "fetched {:?}", fetched());
    s.shutdown();
    let _ = (&mut s.done).await;
    let before = o.count("/seg1.ts");

    // A new process over the same directory: the memory tier is empty, the disk tier is not.
    let s = Sluice::start(config).await;
    load_playlist(&s, &o).await;
    let again = body_of(&seg_url(&s, &o, "seg1.ts", None)).await;
    assert_eq!(again, first);
    assert_eq!(
        o.count("/seg1.ts"),
        before,
        "served from disk, not the origin"
    );
    let m = metrics(&s).await;
    assert!(metric(&m, "sluice_cache_disk_sent_bytes_total") >= SEGMENT_LEN as f64);
    assert_eq!(metric(&m, "sluice_cache_origin_received_bytes_total"), 0.0);
}

#[tokio::test]
async fn a_segment_asked_for_early_is_cached_once_it_exists() {
    let o = SegmentOrigin::start().await;
    let mut config = test_config();
    config.media.prefetch_segments = 1;
    let s = Sluice::start(config).await;
    load_playlist(&s, &o).await;
    // The player is a moment early: the origin's 404 reaches it, and is not kept.
    o.missing.lock().unwrap().push("/seg3.ts".into());
    let url = seg_url(&s, &o, "seg3.ts", None);
    let r = get(&url).await;
    assert_eq!(r.status, 404);
    // Published: the next request gets it, and the one after that is a hit.
    o.missing.lock().unwrap().clear();
    let first = body_of(&url).await;
    assert_eq!(sha256(&first), sha256(&segment_body("/seg3.ts", "")));
    let before = o.count("/seg3.ts");
    assert_eq!(body_of(&url).await, first);
    assert_eq!(o.count("/seg3.ts"), before, "the second request is a hit");
}
