//! The guide: `/epg.xml` and `/epg.xml.gz` from the playlist's `x-tvg-url`, fetched from a real
//! origin on loopback, with ETag, conditional GET, scheduled refresh and a size bound.

mod counting_alloc;
mod guide_readers;
#[path = "iptv_support/mod.rs"]
mod support;

use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use counting_alloc::LIVE;
use guide_readers::{big_xmltv, rest_of_body};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn xmltv(title: &str) -> Vec<u8> {
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<tv>\n<channel id=\"a\"><display-name>A</display-name></channel>\n");
    for i in 0..2000 {
        x.push_str(&format!("<programme channel=\"a\" start=\"20260101{:02}0000 +0000\"><title>{title} {i}</title></programme>\n", i % 24));
    }
    x.push_str("</tv>\n");
    x.into_bytes()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// What the guide origin serves and what it has seen.
#[derive(Default)]
struct Origin {
    body: Vec<u8>,
    etag: String,
    requests: usize,
    conditional: usize,
}

/// Serves the playlist at `/list.m3u` and the guide at `/guide.xml.gz`, honouring
/// `If-None-Match` like a real web server.
async fn origin(state: Arc<Mutex<Origin>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let state = state.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let state = state.clone();
                async move {
                    let mut resp = Response::new(Full::new(Bytes::new()));
                    if req.uri().path() == "/list.m3u" {
                        let text = format!("#EXTM3U x-tvg-url=\"http://{addr}/guide.xml.gz\"\n#EXTINF:-1,A\nrtp://239.71.9.1:5000\n");
                        *resp.body_mut() = Full::new(text.into());
                        return Ok::<_, Infallible>(resp);
                    }
                    let mut s = state.lock().unwrap();
                    s.requests += 1;
                    let inm = req
                        .headers()
                        .get("if-none-match")
                        .map(|v| v.to_str().unwrap().to_string());
                    if inm.is_some() {
                        s.conditional += 1;
                    }
                    resp.headers_mut().insert("etag", s.etag.parse().unwrap());
                    if inm.as_deref() == Some(s.etag.as_str()) {
                        *resp.status_mut() = hyper::StatusCode::NOT_MODIFIED;
                    } else {
                        *resp.body_mut() = Full::new(s.body.clone().into());
                    }
                    Ok(resp)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), svc),
            );
        }
    });
    addr
}

async fn get_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (Response<()>, Vec<u8>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::get(path).header("host", "gw.test");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        send.send_request(req.body(Empty::<Bytes>::new()).unwrap()),
    )
    .await
    .unwrap()
    .unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes().to_vec();
    (Response::from_parts(parts, ()), bytes)
}

#[tokio::test]
async fn guide_is_served_cached_with_validators_and_refreshed() {
    let first = xmltv("News");
    let first_gz = gzip(&first);
    let state = Arc::new(Mutex::new(Origin {
        body: first_gz.clone(),
        etag: "\"v1\"".into(),
        ..Origin::default()
    }));
    let up = origin(state.clone()).await;
    let mut cfg = config();
    cfg.playlist = Some(format!("http://{up}/list.m3u"));
    cfg.epg_refresh_secs = 1;
    let gw = Gateway::start(cfg).await;

    // The .gz file is the origin's bytes as sent.
    let (resp, body) = get_with(gw.addr, "/epg.xml.gz", &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/gzip");
    assert_eq!(Sha256::digest(&body), Sha256::digest(&first_gz));
    let etag_gz = resp.headers()["etag"].to_str().unwrap().to_string();
    let hex: String = Sha256::digest(&first)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let want_tag = format!("\"{hex}");
    assert_eq!(etag_gz, format!("{want_tag}-gz\""));
    assert!(resp.headers().contains_key("last-modified"));

    // Plain XML for a client without gzip; gzip-encoded for one that accepts it.
    let (resp, body) = get_with(gw.addr, "/epg.xml", &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "application/xml; charset=utf-8"
    );
    assert_eq!(
        resp.headers()["etag"].to_str().unwrap(),
        format!("{want_tag}\"")
    );
    assert!(resp.headers().get("content-encoding").is_none());
    assert_eq!(body, first);
    let (resp, body) = get_with(gw.addr, "/epg.xml", &[("accept-encoding", "gzip")]).await;
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    assert_eq!(resp.headers()["vary"], "Accept-Encoding");
    assert_eq!(gunzip(&body), first);

    // Conditional GET: same tag, and the date, both give an empty 304.
    let (resp, body) = get_with(gw.addr, "/epg.xml.gz", &[("if-none-match", &etag_gz)]).await;
    assert_eq!(resp.status(), 304);
    assert!(body.is_empty());
    assert_eq!(resp.headers()["etag"].to_str().unwrap(), etag_gz);
    let lm = resp.headers()["last-modified"]
        .to_str()
        .unwrap()
        .to_string();
    let (resp, _) = get_with(gw.addr, "/epg.xml", &[("if-modified-since", &lm)]).await;
    assert_eq!(resp.status(), 304);
    let (resp, _) = get_with(gw.addr, "/epg.xml", &[("if-none-match", "\"stale\"")]).await;
    assert_eq!(resp.status(), 200);

    // The playlist's guide URL now points here.
    let list = read_text(gw.get("/playlist.m3u").await).await;
    assert!(
        list.starts_with("#EXTM3U x-tvg-url=\"http://gw.test/epg.xml.gz\"\n"),
        "{list}"
    );

    // Served from cache: one origin fetch so far (the refresh loop and requests share it).
    let fetched = state.lock().unwrap().requests;
    assert_eq!(fetched, 1);

    // After the refresh interval, an unchanged guide is revalidated with the origin's ETag,
    // and a changed one replaces it.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let _ = get_with(gw.addr, "/epg.xml.gz", &[]).await;
    assert!(state.lock().unwrap().conditional >= 1);
    let second = xmltv("Sport");
    {
        let mut s = state.lock().unwrap();
        s.body = second.clone();
        s.etag = "\"v2\"".into();
    }
    let mut changed = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (resp, body) = get_with(
            gw.addr,
            "/epg.xml",
            &[("if-none-match", &format!("{want_tag}\""))],
        )
        .await;
        if resp.status() == 200 {
            assert_eq!(body, second, "a plain source is served as sent");
            changed = true;
            break;
        }
    }
    assert!(changed, "the changed guide was never picked up");
}

#[tokio::test]
async fn guide_errors_are_clear() {
    // No playlist and no epg_url: nothing to serve.
    let gw = Gateway::start(config()).await;
    let (resp, body) = get_with(gw.addr, "/epg.xml", &[]).await;
    assert_eq!(resp.status(), 404);
    assert_eq!(
        body,
        b"no EPG source: the playlist has no x-tvg-url and iptv.epg_url is unset\n"
    );

    // Larger than the bound: 502, nothing cached; the reason is the log's, and the answer
    // never names the source (its host, what it answered), as for the playlist.
    let state = Arc::new(Mutex::new(Origin {
        body: xmltv("Big"),
        etag: "\"b\"".into(),
        ..Origin::default()
    }));
    let up = origin(state.clone()).await;
    let mut cfg = config();
    cfg.epg_url = Some(format!("http://{up}/guide.xml"));
    cfg.epg_max_bytes = 4096;
    let gw = Gateway::start(cfg).await;
    let (resp, body) = get_with(gw.addr, "/epg.xml.gz", &[]).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(body, b"guide unavailable\n");

    // A source that trickles a byte every 200 ms (each read inside the idle deadline) is cut
    // by the whole-fetch bound: 504, in about that bound, and the next request
    // is not held behind it.
    let trickle = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let slow = trickle.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = trickle.accept().await {
            tokio::spawn(async move {
                let mut req = [0u8; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut tcp, &mut req).await;
                let head = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n<tv>";
                if tokio::io::AsyncWriteExt::write_all(&mut tcp, head)
                    .await
                    .is_err()
                {
                    return;
                }
                for _ in 0..200 {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if tokio::io::AsyncWriteExt::write_all(&mut tcp, b" ")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    let mut cfg = config();
    cfg.epg_url = Some(format!("http://{slow}/guide.xml"));
    cfg.epg_fetch_timeout_secs = 1;
    let gw = Gateway::start(cfg).await;
    for _ in 0..2 {
        let began = std::time::Instant::now();
        let (resp, body) = get_with(gw.addr, "/epg.xml", &[]).await;
        assert_eq!(resp.status(), 504);
        assert_eq!(body, b"guide unavailable: timed out\n");
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "cut after {:?}",
            began.elapsed()
        );
    }

    // An HTML error page is not a guide.
    state.lock().unwrap().body = b"<html><body>maintenance</body></html>".to_vec();
    state.lock().unwrap().etag = "\"h\"".into();
    let mut cfg = config();
    cfg.epg_url = Some(format!("http://{up}/guide.xml"));
    let gw = Gateway::start(cfg).await;
    let (resp, body) = get_with(gw.addr, "/epg.xml", &[]).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(body, b"guide unavailable\n");

    // A source that cannot be reached: the same answer, and no word of its host.
    let mut cfg = config();
    cfg.epg_url = Some("http://guide.corp.invalid/epg.xml".into());
    let gw = Gateway::start(cfg).await;
    let (resp, body) = get_with(gw.addr, "/epg.xml", &[]).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(body, b"guide unavailable\n");
}

/// A guide that never loaded is not fetched again by every request: while the source keeps
/// failing (here: larger than the bound), the failure is the answer for a back-off. Before,
/// each `/epg.xml` started its own fetch (in line behind the others, each up to the fetch
/// bound), so N requests made N fetches.
#[tokio::test]
async fn a_failing_guide_source_is_not_fetched_by_every_request() {
    let state = Arc::new(Mutex::new(Origin {
        body: xmltv("Big"),
        etag: "\"b\"".into(),
        ..Origin::default()
    }));
    let up = origin(state.clone()).await;
    let mut cfg = config();
    cfg.epg_url = Some(format!("http://{up}/guide.xml"));
    cfg.epg_max_bytes = 4096;
    let gw = Gateway::start(cfg).await;
    // One after another, then several at once: each gets the failure's status.
    for _ in 0..5 {
        let (resp, body) = get_with(gw.addr, "/epg.xml", &[]).await;
        assert_eq!(resp.status(), 502);
        assert_eq!(body, b"guide unavailable\n");
    }
    let together: Vec<_> = (0..5)
        .map(|_| tokio::spawn(get_with(gw.addr, "/epg.xml.gz", &[])))
        .collect();
    for request in together {
        let (resp, body) = request.await.unwrap();
        assert_eq!(resp.status(), 502);
        assert_eq!(body, b"guide unavailable\n");
    }
    // The refresh loop's first fetch and ten requests: one fetch in all.
    assert_eq!(state.lock().unwrap().requests, 1);
}

/// A guide of about `size` bytes: channels and programmes with titles and descriptions, which
/// compress about as much as a real one.
/// Readers of the plain guide that read slowly hold no copy of it each. Before, every
/// `/epg.xml` without gzip decompressed the whole guide into a buffer of its own and kept it
/// until the client had read it all: 16 stalled readers of an 8 MB guide held 130 MB or more,
/// and 50 of a 40 MB guide over 2 GB. The bytes are still the guide's, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_plain_guide_readers_hold_no_copy_each() {
    const READERS: usize = 16;
    const SIZE: usize = 8 << 20;
    let xml = big_xmltv(SIZE);
    let want = Sha256::digest(&xml);
    let state = Arc::new(Mutex::new(Origin {
        body: gzip(&xml),
        etag: "\"big\"".into(),
        ..Origin::default()
    }));
    drop(xml);
    let up = origin(state).await;
    let mut cfg = config();
    cfg.epg_url = Some(format!("http://{up}/guide.xml.gz"));
    let gw = Gateway::start(cfg).await;
    // Fetched and cached first: the fetch is not what is measured.
    let (resp, _) = get_with(gw.addr, "/epg.xml.gz", &[]).await;
    assert_eq!(resp.status(), 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = LIVE.load(Ordering::Relaxed);
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
        tcp.write_all(b"GET /epg.xml HTTP/1.1\r\nHost: gw.test\r\n\r\n")
            .await
            .unwrap();
        // The head and the first bytes, then nothing for a while: a slow reader.
        let mut first = vec![0u8; 16 * 1024];
        let n = tcp.read(&mut first).await.unwrap();
        first.truncate(n);
        readers.push((tcp, first));
    }
    let mut held = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        held = held.max(LIVE.load(Ordering::Relaxed) - before);
    }
    assert!(
        held < (2 * SIZE) as isize,
        "{READERS} slow readers of a {SIZE}-byte guide held {held} bytes"
    );
    for (tcp, first) in readers {
        let body = rest_of_body(tcp, first).await;
        assert_eq!(Sha256::digest(&body), want, "the guide, byte for byte");
    }
}

/// A playlist provider that can go down (answers 503) and counts the fetches it gets.
#[derive(Default)]
struct Provider {
    down: bool,
    fetches: usize,
}

async fn provider(state: Arc<Mutex<Provider>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let state = state.clone();
            let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                let state = state.clone();
                async move {
                    let mut s = state.lock().unwrap();
                    s.fetches += 1;
                    let mut resp = Response::new(Full::new(Bytes::from_static(
                        b"#EXTM3U\n#EXTINF:-1,A\nrtp://239.71.9.2:5000\n",
                    )));
                    if s.down {
                        *resp.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
                        *resp.body_mut() = Full::new(Bytes::from_static(b"down"));
                    }
                    Ok::<_, Infallible>(resp)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), svc),
            );
        }
    });
    addr
}

/// 20 requests for the playlist, 10 one after another and 10 at once: their statuses and bodies.
async fn twenty_playlists(gw: SocketAddr) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    for _ in 0..10 {
        let (resp, body) = get_with(gw, "/playlist.m3u", &[]).await;
        out.push((resp.status().as_u16(), body));
    }
    let together: Vec<_> = (0..10)
        .map(|_| tokio::spawn(get_with(gw, "/playlist.m3u", &[])))
        .collect();
    for request in together {
        let (resp, body) = request.await.unwrap();
        out.push((resp.status().as_u16(), body));
    }
    out
}

/// A playlist provider that is down from the start is not fetched by every request: the
/// failure stands for a back-off. Before, each `/playlist.m3u` fetched again (in line behind
/// the others, each up to the 15 s fetch bound) and logged a warning: 20 requests, 20 fetches.
#[tokio::test]
async fn a_failing_playlist_provider_is_not_fetched_by_every_request() {
    let state = Arc::new(Mutex::new(Provider {
        down: true,
        ..Provider::default()
    }));
    let up = provider(state.clone()).await;
    let mut cfg = config();
    cfg.playlist = Some(format!("http://{up}/list.m3u"));
    let gw = Gateway::start(cfg).await;
    for (status, body) in twenty_playlists(gw.addr).await {
        assert_eq!(status, 502);
        assert_eq!(body, b"playlist unavailable\n");
    }
    // The guide's refresh loop reads the playlist too: at most its fetch and one more.
    let fetches = state.lock().unwrap().fetches;
    assert!(fetches <= 2, "{fetches} provider fetches for 20 requests");
}

/// While the provider is down, the previous copy is served, and the provider is not fetched by
/// every request: the failure re-stamps the copy for a back-off, even with a refresh interval
/// of 0 (fetch for every request). Before, each request fetched again: 20 requests, 20 fetches.
#[tokio::test]
async fn a_failing_playlist_provider_leaves_the_previous_copy_served() {
    let state = Arc::new(Mutex::new(Provider::default()));
    let up = provider(state.clone()).await;
    let mut cfg = config();
    cfg.playlist = Some(format!("http://{up}/list.m3u"));
    cfg.playlist_refresh_secs = 0;
    let gw = Gateway::start(cfg).await;
    let (resp, first) = get_with(gw.addr, "/playlist.m3u", &[]).await;
    assert_eq!(resp.status(), 200);
    assert!(
        String::from_utf8_lossy(&first).contains("http://gw.test/rtp/239.71.9.2:5000"),
        "{}",
        String::from_utf8_lossy(&first)
    );
    {
        let mut s = state.lock().unwrap();
        s.down = true;
        s.fetches = 0;
    }
    for (status, body) in twenty_playlists(gw.addr).await {
        assert_eq!(status, 200);
        assert_eq!(body, first, "the previous copy");
    }
    // At most the guide's refresh loop's fetch and one more.
    let fetches = state.lock().unwrap().fetches;
    assert!(fetches <= 2, "{fetches} provider fetches for 20 requests");
}
