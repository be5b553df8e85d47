//! MediaFlow's smaller `/proxy/*` features against real local origins: `transformer=ts_stream`
//! (ffmpeg-made TS behind a real PNG), `ratelimit` pacing, and `/proxy/ip` with local echo services.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::net::TcpListener;

const SEGMENT: &[u8] = include_bytes!("fixtures/ts_stream/segment.ts");
const PNG: &[u8] = include_bytes!("fixtures/ts_stream/wrapper.png");

type Handler = Arc<dyn Fn(&Request<Incoming>) -> Response<BoxBody> + Send + Sync>;

/// A local origin answering every request with `handler`, recording when each one arrived.
struct Local {
    addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<(String, Instant)>>>,
}

impl Local {
    async fn start(handler: Handler) -> Local {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let seen = arrivals.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (handler, seen) = (handler.clone(), seen.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        seen.lock()
                            .unwrap()
                            .push((req.uri().path().to_string(), Instant::now()));
                        let resp = handler(&req);
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Local { addr, arrivals }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn arrivals(&self, path: &str) -> Vec<Instant> {
        let mut at: Vec<Instant> = self
            .arrivals
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, t)| *t)
            .collect();
        at.sort();
        at
    }
}

fn full(b: impl Into<Bytes>) -> BoxBody {
    Full::new(b.into()).map_err(|n| match n {}).boxed()
}

/// `bytes` sent in `chunk`-byte frames a little apart, so the proxy sees many small reads.
fn chunked(bytes: Bytes, chunk: usize) -> BoxBody {
    let frames = futures_util::stream::unfold(0usize, move |at| {
        let bytes = bytes.clone();
        async move {
            if at >= bytes.len() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            let end = (at + chunk).min(bytes.len());
            Some((
                Ok::<_, std::io::Error>(Frame::data(bytes.slice(at..end))),
                end,
            ))
        }
    });
    StreamBody::new(frames).boxed()
}

fn wrapped() -> Bytes {
    // A real PNG, then 0xFF padding as some hosters add, then the TS made by ffmpeg.
    Bytes::from([PNG, &[0xff; 61], SEGMENT].concat())
}

fn disguise_origin() -> Handler {
    Arc::new(|req| {
        let builder = Response::builder()
            .header("content-type", "image/png")
            .header("accept-ranges", "bytes");
        match req.uri().path() {
            "/seg.png" => builder
                .header("content-length", wrapped().len().to_string())
                .body(chunked(wrapped(), 100))
                .unwrap(),
            "/plain.png" => builder.body(full(Bytes::from_static(PNG))).unwrap(),
            _ => Response::builder().status(404).body(full("")).unwrap(),
        }
    })
}

fn stream_url(s: &Sluice, d: &str, extra: &str) -> String {
    s.url(&format!("/proxy/stream?d={}{extra}", enc(d)))
}

#[tokio::test]
async fn ts_stream_strips_a_png_wrapper_from_a_streamed_segment() {
    let origin = Local::start(disguise_origin()).await;
    let s = Sluice::start(test_config()).await;
    let url = stream_url(&s, &origin.url("/seg.png"), "&transformer=ts_stream");
    // The client's Range would name bytes of the output: it is not forwarded, the whole is sent.
    let r = request("GET", &url, &[("range", "bytes=0-99")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "video/mp2t");
    assert_eq!(r.headers["accept-ranges"], "none");
    assert!(r.headers.get("content-length").is_none());
    assert!(r.headers.get("content-range").is_none());
    assert_eq!(sha256(&r.body.unwrap()), sha256(SEGMENT));

    // Without the transformer the bytes pass as they are.
    let r = get(&stream_url(&s, &origin.url("/seg.png"), "")).await;
    assert_eq!(r.headers["content-type"], "image/png");
    assert_eq!(sha256(&r.body.unwrap()), sha256(&wrapped()));
}

#[tokio::test]
async fn ts_stream_leaves_a_body_without_ts_alone_and_refuses_unknown_names() {
    let origin = Local::start(disguise_origin()).await;
    let s = Sluice::start(test_config()).await;
    let r = get(&stream_url(
        &s,
        &origin.url("/plain.png"),
        "&transformer=ts_stream",
    ))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from_static(PNG));

    let r = get(&stream_url(
        &s,
        &origin.url("/seg.png"),
        "&transformer=mp4_fix",
    ))
    .await;
    assert_eq!(r.status, 400);
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(body.contains("unknown transformer `mp4_fix`"), "{body}");
    // Refused before anything was fetched.
    assert!(origin.arrivals("/seg.png").is_empty());
}

#[tokio::test]
async fn ts_stream_on_hls_segments_and_it_reaches_children() {
    let origin = Local::start(Arc::new(|req| match req.uri().path() {
        "/live.m3u8" => Response::builder()
            .header("content-type", "application/vnd.apple.mpegurl")
            .body(full(
                "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nseg.png\n#EXT-X-ENDLIST\n",
            ))
            .unwrap(),
        "/seg.png" => Response::builder()
            .header("content-type", "image/png")
            .body(chunked(wrapped(), 1000))
            .unwrap(),
        _ => Response::builder().status(404).body(full("")).unwrap(),
    }))
    .await;
    let s = Sluice::start(test_config()).await;
    let r = get(&s.url(&format!(
        "/proxy/hls/manifest.m3u8?d={}&transformer=ts_stream",
        enc(&origin.url("/live.m3u8"))
    )))
    .await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    let child = text
        .lines()
        .find(|l| l.contains("/proxy/hls/segment"))
        .expect("a rewritten segment line")
        .to_string();
    assert!(child.contains("transformer=ts_stream"), "{child}");
    // Twice: the first fetch goes through the pipe, the second may come from the prefetcher.
    for _ in 0..2 {
        let r = get(&child).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["content-type"], "video/mp2t");
        assert_eq!(sha256(&r.body.unwrap()), sha256(SEGMENT));
    }
}

fn counting_origin() -> (Handler, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let handler: Handler = Arc::new(move |_req| {
        c.fetch_add(1, Ordering::SeqCst);
        Response::builder()
            .header("content-type", "video/mp2t")
            .body(full(Bytes::from_static(SEGMENT)))
            .unwrap()
    });
    (handler, count)
}

#[tokio::test]
async fn ratelimit_parameter_spaces_requests_to_one_host() {
    let (handler, _) = counting_origin();
    let origin = Local::start(handler).await;
    let s = Sluice::start(test_config()).await;
    let interval = Duration::from_millis(300);
    let n = 4;
    let url = stream_url(&s, &origin.url("/a.ts"), "&ratelimit=300");
    let started = Instant::now();
    let replies = futures_util::future::join_all((0..n).map(|_| get(&url))).await;
    for r in replies {
        assert_eq!(r.status, 200);
        assert_eq!(sha256(&r.body.unwrap()), sha256(SEGMENT));
    }
    // Lower bounds only: under load requests can be later, never earlier. The last request's
    // slot is (n - 1) intervals after the first, so the whole batch cannot finish sooner.
    let at = origin.arrivals("/a.ts");
    assert_eq!(at.len(), n);
    // At the origin, unpaced requests would land within milliseconds of each other; paced ones
    // span (n - 1) intervals, give or take how long each took to get there (half of it as slack
    // for a loaded machine).
    let span = at[n - 1] - at[0];
    assert!(span >= interval * (n as u32 - 1) / 2, "{span:?}");
    assert!(started.elapsed() >= interval * (n as u32 - 1));
}

#[tokio::test]
async fn configured_hosts_are_paced_and_an_overlong_wait_is_a_503_with_retry_after() {
    let (handler, count) = counting_origin();
    let origin = Local::start(handler).await;
    let mut config = test_config();
    config.media.ratelimit.hosts = [("127.0.0.1".to_string(), 10_000)].into();
    config.media.ratelimit.max_wait_secs = 1;
    let s = Sluice::start(config).await;
    // `none` cannot lift the operator's pacing.
    let url = stream_url(&s, &origin.url("/c.ts"), "&ratelimit=none");
    let r = get(&url).await;
    assert_eq!(r.status, 200);
    let r = get(&url).await;
    assert_eq!(r.status, 503);
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((9..=10).contains(&retry), "{retry}");
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(body.contains("rate_limited"), "{body}");
    // The refused request never reached the origin.
    assert_eq!(count.load(Ordering::SeqCst), 1);
    // A bad value is a 400 naming the parameter.
    let r = get(&stream_url(&s, &origin.url("/c.ts"), "&ratelimit=fast")).await;
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body.unwrap()).contains("`ratelimit`"));
}

/// `ratelimit` as an attack: before, one client's `ratelimit=60000` moved the host's one shared
/// slot a minute out (every other viewer of the host got a 503), and its requests for made-up
/// hosts filled the table (every other paced request got a 503). A client's own interval now
/// paces that client alone, and one client network creates at most its share of entries.
#[tokio::test]
async fn one_client_s_ratelimit_holds_up_no_other_client() {
    let (handler, count) = counting_origin();
    let origin = Local::start(handler).await;
    let mut config = test_config();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    config.auth.api_password = "pw".into();
    config.media.ratelimit.max_hosts = 8;
    let s = Sluice::start(config).await;
    let from = |client: &'static str, url: String| async move {
        let url = format!("{url}&api_password=pw");
        request("GET", &url, &[("x-forwarded-for", client)]).await
    };
    let (a, b) = ("198.51.100.1", "203.0.113.2");
    let slow = stream_url(&s, &origin.url("/a.ts"), "&ratelimit=60000");
    assert_eq!(from(a, slow.clone()).await.status, 200);
    // A's own next turn is a minute out: refused (past max_wait_secs), not queued.
    assert_eq!(from(a, slow).await.status, 503);
    // B, pacing itself at 100 ms on the same host, is not held up by A's minute.
    let paced = stream_url(&s, &origin.url("/a.ts"), "&ratelimit=100");
    let r = from(b, paced).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(count.load(Ordering::SeqCst), 2);

    // A floods made-up hosts (loopback addresses nothing listens on) at a minute each.
    let port = origin.addr.port();
    for n in 2..22 {
        let d = format!("http://127.0.0.{n}:{port}/x.ts");
        let r = from(a, stream_url(&s, &d, "&ratelimit=60000")).await;
        assert!(matches!(r.status.as_u16(), 502 | 503), "{}", r.status);
    }
    // B's next paced host still has room in the table.
    let d = format!("http://localhost:{port}/b.ts");
    let r = from(b, stream_url(&s, &d, "&ratelimit=100")).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

/// The same flood from one IPv6 /48 (65,536 /64s, free from a tunnel broker), each /64 within its
/// own share: before, the /48 took every entry of the table and another client's next paced host
/// got a 503. A /48 now creates at most its own share of entries over all its /64s.
#[tokio::test]
async fn one_48_s_made_up_hosts_fill_its_share_not_the_pacing_table() {
    let (handler, count) = counting_origin();
    let origin = Local::start(handler).await;
    let mut config = test_config();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    config.auth.api_password = "pw".into();
    config.media.ratelimit.max_hosts = 8;
    let s = Sluice::start(config).await;
    let from = |client: String, url: String| async move {
        let url = format!("{url}&api_password=pw");
        request("GET", &url, &[("x-forwarded-for", client.as_str())]).await
    };
    // Ten /64s of 2001:db8:1::/48, two made-up hosts each (loopback addresses nothing listens
    // on), at a minute each: a /64's share of a table of 8 is 2.
    let port = origin.addr.port();
    for net in 0..10 {
        for n in 0..2 {
            let d = format!("http://127.0.0.{}:{port}/x.ts", 2 + n);
            let client = format!("2001:db8:1:{net:x}::1");
            let r = from(client, stream_url(&s, &d, "&ratelimit=60000")).await;
            assert!(matches!(r.status.as_u16(), 502 | 503), "{}", r.status);
        }
    }
    // Another client's paced host still has room in the table.
    let d = format!("http://localhost:{port}/b.ts");
    let r = from(
        "203.0.113.2".to_string(),
        stream_url(&s, &d, "&ratelimit=100"),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

fn echo_origin() -> (Handler, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let handler: Handler = Arc::new(move |req| {
        let resp = |ct: &str, body: &'static str| {
            Response::builder()
                .header("content-type", ct)
                .body(full(body))
                .unwrap()
        };
        match req.uri().path() {
            "/text" => {
                c.fetch_add(1, Ordering::SeqCst);
                resp("text/plain", "198.51.100.23\n")
            }
            "/json" => {
                c.fetch_add(1, Ordering::SeqCst);
                resp("application/json", r#"{"origin": "203.0.113.9, 10.0.0.1"}"#)
            }
            "/html" => resp("text/html", "<html>rate limited</html>"),
            _ => Response::builder().status(500).body(full("down")).unwrap(),
        }
    });
    (handler, count)
}

fn service(url: String, field: &str) -> sluice::config::public_ip::EchoService {
    sluice::config::public_ip::EchoService {
        url,
        field: field.into(),
    }
}

#[tokio::test]
async fn proxy_ip_asks_the_services_in_order_and_caches_the_answer() {
    let (handler, count) = echo_origin();
    let echo = Local::start(handler).await;
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    config.media.public_ip.services = vec![
        service(echo.url("/down"), ""),
        service(echo.url("/html"), ""),
        service(echo.url("/json"), "origin"),
        service(echo.url("/text"), ""),
    ];
    let s = Sluice::start(config).await;

    // Auth like every other /proxy endpoint, and nothing is asked for a refused caller.
    let r = get(&s.url("/proxy/ip")).await;
    assert_eq!(r.status, 403);
    assert!(echo.arrivals("/down").is_empty());

    let r = get(&s.url("/proxy/ip?api_password=pw")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.body.unwrap(), Bytes::from(r#"{"ip":"203.0.113.9"}"#));
    // Broken services were skipped, the one after the answering one was not asked.
    assert_eq!(echo.arrivals("/down").len(), 1);
    assert_eq!(echo.arrivals("/html").len(), 1);
    assert_eq!(count.load(Ordering::SeqCst), 1);

    // Cached: a burst of calls asks nobody.
    let url = s.url("/proxy/ip?api_password=pw");
    let burst = (0..5).map(|_| get(&url));
    for r in futures_util::future::join_all(burst).await {
        assert_eq!(r.body.unwrap(), Bytes::from(r#"{"ip":"203.0.113.9"}"#));
    }
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn proxy_ip_with_no_working_service_is_a_502_naming_them() {
    let (handler, _) = echo_origin();
    let echo = Local::start(handler).await;
    let mut config = test_config();
    // An HTML page where text was expected, and text where JSON was.
    config.media.public_ip.services = vec![
        service(echo.url("/html"), ""),
        service(echo.url("/text"), "ip"),
    ];
    config.media.public_ip.cache_secs = 0;
    let s = Sluice::start(config).await;
    let r = get(&s.url("/proxy/ip")).await;
    assert_eq!(r.status, 502);
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(body.contains("is not an IP address"), "{body}");
    assert!(body.contains("is not a JSON object"), "{body}");
    // Failures are not cached: the services are asked again.
    let _ = get(&s.url("/proxy/ip")).await;
    assert_eq!(echo.arrivals("/html").len(), 2);
}

/// A service that accepts connections and never answers, counting them.
async fn silent_service() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    (addr, count)
}

/// `/proxy/ip` during an outage of its services: before, each caller waited for the lock and
/// then ran a lookup of its own (every service's timeout again, failures not cached), so callers
/// queued for minutes and each asked the services. Now concurrent callers share the running
/// lookup's failure and later ones get it from memory.
#[tokio::test]
async fn proxy_ip_callers_share_a_failed_lookup() {
    let (silent, asked) = silent_service().await;
    let (handler, _) = echo_origin();
    let echo = Local::start(handler).await;
    let mut config = test_config();
    config.media.public_ip.services = vec![
        service(format!("http://{silent}/ip"), ""),
        service(echo.url("/down"), ""),
    ];
    config.media.public_ip.timeout_secs = 1;
    let s = Sluice::start(config).await;
    let url = s.url("/proxy/ip");
    let burst = (0..8).map(|_| get(&url));
    for r in futures_util::future::join_all(burst).await {
        assert_eq!(r.status, 502);
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(body.contains("no answer within 1 s"), "{body}");
        assert!(body.contains("500"), "{body}");
    }
    // One lookup for the burst, and the failure is kept: the next caller asks nobody.
    let r = get(&url).await;
    assert_eq!(r.status, 502);
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(echo.arrivals("/down").len(), 1);
}
