//! Attack catalogue, upstream side: what a client can make sluice send to an origin, what it can make
//! the media cache hand to other users, and what an origin can make a browser run. Every attack runs
//! against a sluice started in-process and real origins on 127.0.0.1:0.

mod self_signed;
mod support;
#[path = "hostile_upstream/whole_body.rs"]
mod whole_body;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use self_signed::SelfSigned;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What one request to [`Echo`] looked like.
#[derive(Debug, Clone)]
struct Hit {
    path: String,
    headers: http::HeaderMap,
}

/// An origin whose every answer depends on who asked: the body names the path and the cookie,
/// authorization and host it was asked with, so a body served to the wrong user is visible.
/// `/live.m3u8` is a media playlist of `seg1.ts`..`seg4.ts` and `private.ts`, which is marked private;
/// `Range` is honoured with a 206.
struct Echo {
    addr: std::net::SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Echo {
    async fn start() -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let h = hits.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let h = h.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let h = h.clone();
                        async move { Ok::<_, Infallible>(echo(req, h)) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Echo { addr, hits }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn count(&self, path: &str) -> usize {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.path == path)
            .count()
    }

    fn hits(&self, path: &str) -> Vec<Hit> {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.path == path)
            .cloned()
            .collect()
    }
}

fn echo(req: Request<Incoming>, hits: Arc<Mutex<Vec<Hit>>>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    hits.lock().unwrap().push(Hit {
        path: path.clone(),
        headers: req.headers().clone(),
    });
    let get = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default()
    };
    if path == "/live.m3u8" {
        let text = "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:4\n#EXT-X-MEDIA-SEQUENCE:1\n\
                    #EXTINF:4,\nseg1.ts\n#EXTINF:4,\nseg2.ts\n#EXTINF:4,\nseg3.ts\n#EXTINF:4,\nseg4.ts\n\
                    #EXTINF:4,\nprivate.ts\n";
        return Response::builder()
            .header("content-type", "application/vnd.apple.mpegurl")
            .body(Full::new(Bytes::from(text)))
            .unwrap();
    }
    if let Some(n) = path
        .strip_prefix("/many-")
        .and_then(|p| p.strip_suffix(".m3u8"))
        .and_then(|n| n.parse::<usize>().ok())
    {
        // A VOD playlist of n segments with long names (5000 of them are ~450 KiB).
        let mut text = String::from("#EXTM3U\n#EXT-X-TARGETDURATION:4\n#EXT-X-PLAYLIST-TYPE:VOD\n");
        for i in 0..n {
            text.push_str(&format!(
                "#EXTINF:4,\nvery/long/path/to/a/segment/of/a/long/movie/part{i:06}.ts\n"
            ));
        }
        text.push_str("#EXT-X-ENDLIST\n");
        return Response::builder()
            .header("content-type", "application/vnd.apple.mpegurl")
            .body(Full::new(Bytes::from(text)))
            .unwrap();
    }
    if path == "/page.html" {
        return Response::builder()
            .header("content-type", "text/html")
            .body(Full::new(Bytes::from_static(
                b"<script>steal(document.cookie)</script>",
            )))
            .unwrap();
    }
    let body = format!(
        "{path}|cookie={}|authorization={}|host={}",
        get("cookie"),
        get("authorization"),
        get("host")
    );
    let mut resp = Response::builder().header("content-type", "video/mp2t");
    if path == "/private.ts" {
        resp = resp.header("cache-control", "private, max-age=60");
    }
    let range = get("range");
    if let Some((a, b)) = range
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
    {
        let end = (b + 1).min(body.len());
        let slice = body.as_bytes()[a.min(end)..end].to_vec();
        return resp
            .status(206)
            .header(
                "content-range",
                format!("bytes {a}-{}/{}", end - 1, body.len()),
            )
            .body(Full::new(Bytes::from(slice)))
            .unwrap();
    }
    resp.body(Full::new(Bytes::from(body))).unwrap()
}

fn text(r: &Reply) -> String {
    String::from_utf8_lossy(r.body.as_ref().unwrap()).into_owned()
}

fn seg_url(s: &Sluice, o: &Echo, seg: &str, extra: &str) -> String {
    s.url(&format!(
        "/proxy/hls/segment.ts?d={}{extra}",
        enc(&o.url(&format!("/{seg}")))
    ))
}

/// Serves the playlist once, so its segments go through the cache (and prefetch) from then on.
async fn load_playlist(s: &Sluice, o: &Echo, extra: &str) {
    let r = get(&s.url(&format!(
        "/proxy/hls/manifest.m3u8?d={}{extra}",
        enc(&o.url("/live.m3u8"))
    )))
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
}

/// Waits until the origin has seen `n` requests for `path` (prefetches run in the background).
async fn wait_hits(o: &Echo, path: &str, n: usize) {
    for _ in 0..200 {
        if o.count(path) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "origin saw {} requests for {path}, wanted {n}",
        o.count(path)
    );
}

// ---------------------------------------------------------------------------------------------
// §2: the media cache never hands one user's bytes to another.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn cache_isolates_users_by_cookie_and_authorization() {
    let o = Echo::start().await;
    let s = Sluice::start(test_config()).await;
    load_playlist(&s, &o, "").await;
    for (param, header) in [("h_cookie", "cookie"), ("h_authorization", "authorization")] {
        let seg = if param == "h_cookie" {
            "seg1.ts"
        } else {
            "seg3.ts"
        };
        let as_a = format!("&{param}={}", enc("user=A"));
        let as_b = format!("&{param}={}", enc("user=B"));
        // A's player loads the playlist through links carrying A's credentials, as its
        // segments do (the prefetcher fetches ahead in A's own registration only).
        load_playlist(&s, &o, &as_a).await;
        let a = get(&seg_url(&s, &o, seg, &as_a)).await;
        assert_eq!(a.status, 200);
        assert!(
            text(&a).contains(&format!("{header}=user=A")),
            "{}",
            text(&a)
        );
        // User B asks for the same segment with their own credentials: the origin is asked again
        // and B gets B's bytes, never A's.
        let b = get(&seg_url(&s, &o, seg, &as_b)).await;
        assert_eq!(b.status, 200);
        assert!(
            text(&b).contains(&format!("{header}=user=B")),
            "{}",
            text(&b)
        );
        assert!(!text(&b).contains("user=A"));
        // The segment A's request prefetched (with A's credentials) is not B's either.
        let next = if seg == "seg1.ts" {
            "seg2.ts"
        } else {
            "seg4.ts"
        };
        wait_hits(&o, &format!("/{next}"), 1).await;
        let b2 = get(&seg_url(&s, &o, next, &as_b)).await;
        assert!(
            text(&b2).contains(&format!("{header}=user=B")),
            "{}",
            text(&b2)
        );
        // A asking again is still a cache hit: isolation did not turn the cache off.
        let before = o.count(&format!("/{seg}"));
        let a2 = get(&seg_url(&s, &o, seg, &as_a)).await;
        assert_eq!(a2.body.unwrap(), a.body.unwrap());
        assert_eq!(o.count(&format!("/{seg}")), before);
    }
}

#[tokio::test]
async fn cache_cannot_be_poisoned_with_range_or_host() {
    let o = Echo::start().await;
    let s = Sluice::start(test_config()).await;
    load_playlist(&s, &o, "").await;
    let honest = format!("/seg1.ts|cookie=|authorization=|host={}", o.addr);
    // The attacker fetches the segment first, with a range and with a forged Host.
    let r = get(&seg_url(
        &s,
        &o,
        "seg1.ts",
        &format!("&h_range={}", enc("bytes=0-3")),
    ))
    .await;
    assert_eq!(r.body.unwrap(), "/seg");
    let r = get(&seg_url(&s, &o, "seg1.ts", "&h_host=evil.example")).await;
    assert!(text(&r).ends_with("host=evil.example"), "{}", text(&r));
    // The victim gets the whole, honest object.
    let r = get(&seg_url(&s, &o, "seg1.ts", "")).await;
    assert_eq!(r.status, 200);
    assert_eq!(text(&r), honest);
    // A partial answer was never stored: a second ranged request reaches the origin again.
    let before = o.count("/seg1.ts");
    let r = get(&seg_url(
        &s,
        &o,
        "seg1.ts",
        &format!("&h_range={}", enc("bytes=0-3")),
    ))
    .await;
    assert_eq!(r.body.unwrap(), "/seg");
    assert_eq!(o.count("/seg1.ts"), before + 1);
}

#[tokio::test]
async fn cache_stores_only_shareable_complete_answers() {
    let o = Echo::start().await;
    // Counted at the origin: the playlist's prebuffer would add a fetch of each segment.
    let mut config = test_config();
    config.media.prebuffer_segments = 0;
    let s = Sluice::start(config).await;
    // The playlist lists both, so both segments go through the cache.
    load_playlist(&s, &o, "").await;
    let url = seg_url(&s, &o, "seg1.ts", "");
    let first = get(&url).await;
    assert_eq!(o.count("/seg1.ts"), 1);
    let again = get(&url).await;
    assert_eq!(again.body.unwrap(), first.body.unwrap());
    assert_eq!(
        o.count("/seg1.ts"),
        1,
        "a complete 200 is served from the cache"
    );
    // `Cache-Control: private` answers are passed on but never stored.
    let private = seg_url(&s, &o, "private.ts", "");
    let a = get(&private).await;
    let b = get(&private).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body.unwrap(), b.body.unwrap());
    assert_eq!(o.count("/private.ts"), 2);
}

// ---------------------------------------------------------------------------------------------
// §3: request hygiene.
// ---------------------------------------------------------------------------------------------

/// A keep-alive HTTP/1.1 origin parsed by hand, as a plain server would: a request's
/// `Content-Length` bytes are read as its body. Records the raw bytes of every request.
async fn raw_origin() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let l = l.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(end) = find(&buf, b"\r\n\r\n") else {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    let body_len = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    while buf.len() < end + 4 + body_len {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    l.lock().unwrap().push(head.clone());
                    buf.drain(..end + 4 + body_len);
                    let path = head.split(' ').nth(1).unwrap_or("").to_string();
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{path}",
                        path.len()
                    );
                    if s.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, log)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[tokio::test]
async fn framing_headers_cannot_desync_the_pooled_connection() {
    let (addr, log) = raw_origin().await;
    let mut config = test_config();
    config.upstream.pool_max_idle_per_host = 1;
    let s = Sluice::start(config).await;
    let stream = |path: &str, extra: &str| {
        s.url(&format!(
            "/proxy/stream?d={}{extra}",
            enc(&format!("http://{addr}{path}"))
        ))
    };
    // Warm the pool: one idle keep-alive connection to the origin.
    let r = get(&stream("/warm", "")).await;
    assert_eq!(r.body.unwrap(), "/warm");
    // The attack: a GET that claims a body. Sent as is, the origin would swallow the next user's
    // request on the pooled connection as this one's body.
    let r = get(&stream("/attack", "&h_content-length=40")).await;
    assert_eq!(r.status, 400);
    assert!(text(&r).contains("h_content-length"), "{}", text(&r));
    // The next user's request on the pooled connection is answered with its own bytes.
    let r = get(&stream("/victim", "")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), "/victim");
    // Every other framing or hop-by-hop header is refused the same way, naming the parameter.
    for key in [
        "h_transfer-encoding",
        "h_connection",
        "h_keep-alive",
        "h_te",
        "h_trailer",
        "h_upgrade",
        "h_expect",
        "h_proxy-authorization",
        "h_proxy-connection",
        "h_Content-Length",
        "r_content-length",
        "rp_transfer-encoding",
    ] {
        let r = get(&stream("/attack", &format!("&{key}=chunked"))).await;
        assert_eq!(r.status, 400, "{key}");
        assert!(text(&r).contains(key), "{key}: {}", text(&r));
    }
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].starts_with("GET /warm ") && seen[1].starts_with("GET /victim "));
    for head in &seen {
        let lower = head.to_ascii_lowercase();
        assert!(!lower.contains("content-length") && !lower.contains("transfer-encoding"));
    }
}

#[tokio::test]
async fn cross_origin_redirect_drops_credentials() {
    let landing = Echo::start().await;
    // The first origin redirects /away to the other origin, and /here to itself.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let first = listener.local_addr().unwrap();
    let target = landing.url("/landed.ts");
    let same = format!("http://{first}/landed.ts");
    let first_hits = Arc::new(Mutex::new(Vec::<Hit>::new()));
    let fh = first_hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (target, same, fh) = (target.clone(), same.clone(), fh.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (target, same, fh) = (target.clone(), same.clone(), fh.clone());
                    async move {
                        let path = req.uri().path().to_string();
                        let resp = match path.as_str() {
                            "/away" => Response::builder()
                                .status(302)
                                .header("location", target)
                                .body(Full::new(Bytes::new())),
                            "/here" => Response::builder()
                                .status(307)
                                .header("location", same)
                                .body(Full::new(Bytes::new())),
                            _ => {
                                fh.lock().unwrap().push(Hit {
                                    path,
                                    headers: req.headers().clone(),
                                });
                                Response::builder().body(Full::new(Bytes::from_static(b"same")))
                            }
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
    let s = Sluice::start(test_config()).await;
    let creds = format!(
        "&h_authorization={}&h_cookie={}&h_x-custom=kept",
        enc("Bearer secret"),
        enc("session=s3cret")
    );
    let r = get(&s.url(&format!(
        "/proxy/stream?d={}{creds}",
        enc(&format!("http://{first}/away"))
    )))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        text(&r),
        format!("/landed.ts|cookie=|authorization=|host={}", landing.addr)
    );
    let hit = &landing.hits("/landed.ts")[0];
    assert!(hit.headers.get("authorization").is_none());
    assert!(hit.headers.get("cookie").is_none());
    assert_eq!(hit.headers["x-custom"], "kept");
    // A same-origin redirect keeps them.
    let r = get(&s.url(&format!(
        "/proxy/stream?d={}{creds}",
        enc(&format!("http://{first}/here"))
    )))
    .await;
    assert_eq!(r.body.unwrap(), "same");
    let hit = first_hits.lock().unwrap()[0].clone();
    assert_eq!(hit.headers["authorization"], "Bearer secret");
    assert_eq!(hit.headers["cookie"], "session=s3cret");
}

#[tokio::test]
async fn piped_html_cannot_run_on_the_proxy_origin() {
    let o = Echo::start().await;
    let s = Sluice::start(test_config()).await;
    // r_* may not touch the sandbox or nosniff: such a link is refused outright.
    let r = get(&s.url(&format!(
        "/proxy/stream?d={}&r_content-security-policy=default-src%20*&r_x-content-type-options=x",
        enc(&o.url("/page.html"))
    )))
    .await;
    assert_eq!(r.status, 400);
    // An attacker's page through /proxy/stream: sandboxed, no sniffing.
    let r = get(&s.url(&format!(
        "/proxy/stream?d={}&r_content-type=text%2Fhtml",
        enc(&o.url("/page.html"))
    )))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-security-policy"], "sandbox");
    assert_eq!(r.headers["x-content-type-options"], "nosniff");
    assert_eq!(
        r.headers.get_all("content-security-policy").iter().count(),
        1
    );
    // Every piped answer carries nosniff: HLS segments too.
    let r = get(&seg_url(&s, &o, "seg1.ts", "")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-content-type-options"], "nosniff");
}

#[tokio::test]
async fn ssrf_refusals_name_the_class_never_the_address() {
    let mut config = test_config();
    config.upstream.allow_private = false;
    let s = Sluice::start(config).await;
    for (host, class) in [
        ("localhost", "loopback"),
        ("[64:ff9b::7f00:1]", "NAT64"),
        ("[64:ff9b:1::a00:1]", "NAT64"),
        ("[2002:7f00:1::1]", "6to4"),
        ("[::7f00:1]", "IPv4-compatible"),
        ("198.18.0.1", "benchmarking"),
        ("240.0.0.1", "reserved"),
        ("224.0.0.1", "multicast"),
        ("[ff02::1]", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("169.254.169.254", "link-local"),
    ] {
        let r = get(&s.url(&format!(
            "/proxy/stream?d={}",
            enc(&format!("http://{host}:9/x"))
        )))
        .await;
        assert_eq!(r.status, 403, "{host}");
        let body = text(&r);
        assert!(body.contains(&format!("{class} address")), "{host}: {body}");
        if host == "localhost" {
            assert!(
                !body.contains("127.0.0.1") && !body.contains("::1"),
                "{body}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// §4: an origin's HTTP/2 stream limit does not cap viewers.
// ---------------------------------------------------------------------------------------------

/// A TLS origin offering h2 with at most 2 concurrent streams per connection. `/stall` sends
/// its head and one chunk, then nothing (a viewer that never gets more). Counts connections and
/// records the HTTP version of every request.
async fn h2_origin_two_streams(
    c: &SelfSigned,
) -> (u16, Arc<AtomicUsize>, Arc<Mutex<Vec<http::Version>>>) {
    let config = sluice::server::tls::server_config(c.cert.path(), c.key.path()).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let conns = Arc::new(AtomicUsize::new(0));
    let versions = Arc::new(Mutex::new(Vec::new()));
    let (cn, vs) = (conns.clone(), versions.clone());
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            cn.fetch_add(1, Ordering::SeqCst);
            let (acceptor, vs) = (acceptor.clone(), vs.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let vs = vs.clone();
                    async move {
                        vs.lock().unwrap().push(req.version());
                        let first = futures_util::stream::iter([Ok::<_, Infallible>(Frame::data(
                            Bytes::from_static(b"first-chunk"),
                        ))]);
                        let body = StreamBody::new(futures_util::StreamExt::chain(
                            first,
                            futures_util::stream::pending(),
                        ));
                        Ok::<_, Infallible>(Response::new(body))
                    }
                });
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder.http2().max_concurrent_streams(2);
                let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
            });
        }
    });
    (port, conns, versions)
}

/// Opens a viewer: sends the request and reads until the head and `want` body bytes arrived.
/// The socket is returned unread from then on: a stalled viewer.
async fn open_viewer(addr: std::net::SocketAddr, path: &str, want: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = async {
        while !String::from_utf8_lossy(&got).contains(want) {
            let mut chunk = [0u8; 1024];
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "viewer cut: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("viewer got no answer within 5 s");
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    s
}

#[tokio::test]
async fn third_viewer_is_not_capped_by_origin_h2_stream_limit() {
    let pair = SelfSigned::new(&["localhost", "127.0.0.1"]);
    let (port, conns, versions) = h2_origin_two_streams(&pair).await;
    let mut config = test_config();
    config.upstream.insecure_hosts = vec!["127.0.0.1".into()];
    config.upstream.header_timeout_secs = 10;
    config.upstream.idle_read_timeout_secs = 30;
    let s = Sluice::start(config).await;
    let path = format!(
        "/proxy/stream?d={}",
        enc(&format!("https://127.0.0.1:{port}/stall"))
    );
    let mut viewers = Vec::new();
    for _ in 0..3 {
        viewers.push(open_viewer(s.addr, &path, "first-chunk").await);
    }
    // Each viewer has its own HTTP/1.1 connection to the origin.
    assert_eq!(*versions.lock().unwrap(), vec![http::Version::HTTP_11; 3]);
    assert_eq!(conns.load(Ordering::SeqCst), 3);
    drop(viewers);
}

/// Waiting behind other viewers' connection setups does not count against one's own connect
/// deadline: with one setup slot per host and a slow TLS handshake, three viewers that arrive
/// together all connect although together they take longer than the deadline.
#[tokio::test]
async fn queueing_for_a_setup_slot_is_not_a_connect_timeout() {
    let pair = SelfSigned::new(&["localhost", "127.0.0.1"]);
    let config = sluice::server::tls::server_config(pair.cert.path(), pair.key.path()).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A slow handshake: 700 ms before the server answers the ClientHello.
                tokio::time::sleep(Duration::from_millis(700)).await;
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                // The body stays open for 2.5 s, so no connection goes idle for another viewer
                // to reuse: each viewer needs its own setup.
                let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                    let body = futures_util::stream::unfold(0u8, |i| async move {
                        match i {
                            0 => Some((
                                Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"ok"))),
                                1,
                            )),
                            1 => {
                                tokio::time::sleep(Duration::from_millis(2500)).await;
                                None
                            }
                            _ => None,
                        }
                    });
                    Ok::<_, Infallible>(Response::new(StreamBody::new(body)))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    let mut config = test_config();
    config.upstream.insecure_hosts = vec!["127.0.0.1".into()];
    config.upstream.max_setups_per_host = 1;
    config.upstream.connect_timeout_secs = 1;
    config.upstream.header_timeout_secs = 10;
    config.upstream.idle_read_timeout_secs = 10;
    let s = Sluice::start(config).await;
    let url = s.url(&format!(
        "/proxy/stream?d={}",
        enc(&format!("https://127.0.0.1:{port}/x"))
    ));
    let viewers: Vec<_> = (0..3)
        .map(|_| {
            let u = url.clone();
            tokio::spawn(async move { get(&u).await })
        })
        .collect();
    for v in viewers {
        let r = v.await.unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body.unwrap(), "ok");
    }
}

/// A playlist over `media.max_playlist_segments` is refused with a 502 (the origin's fault) that
/// names the limit; a big one under it is rewritten whole (off the async workers, above 256 KiB).
#[tokio::test]
async fn playlist_segment_cap_and_big_rewrites() {
    let o = Echo::start().await;
    let mut config = test_config();
    config.media.max_playlist_segments = 5000;
    let s = Sluice::start(config).await;
    let manifest = |n: usize| {
        s.url(&format!(
            "/proxy/hls/manifest.m3u8?d={}",
            enc(&o.url(&format!("/many-{n}.m3u8")))
        ))
    };
    let r = get(&manifest(5001)).await;
    assert_eq!(r.status, 502);
    assert!(text(&r).contains("max_playlist_segments"), "{}", text(&r));
    let r = get(&manifest(5000)).await;
    assert_eq!(r.status, 200);
    let body = text(&r);
    let uris: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(uris.len(), 5000);
    assert!(uris.iter().all(|u| u.contains("/proxy/hls/segment.ts?d=")));
    assert!(uris[4999].contains("part004999.ts"), "{}", uris[4999]);
    assert!(body.trim_end().ends_with("#EXT-X-ENDLIST"));
}
