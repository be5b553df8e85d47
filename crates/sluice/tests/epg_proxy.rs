//! `/proxy/epg` against a local guide source: the guide's bytes, `X-EPG-Cache` MISS then HIT,
//! `cache_ttl`, one cache entry per set of `h_*` headers, gzip sources and gzip answers,
//! conditional GETs, concurrent misses sharing one fetch, slow readers of a large guide, the
//! memory fetches in flight share and each client's share of it, and the errors.

mod counting_alloc;
mod guide_readers;
mod support;

use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use counting_alloc::LIVE;
use futures_util::StreamExt;
use guide_readers::{big_xmltv, rest_of_body};
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const XMLTV: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE tv SYSTEM \"xmltv.dtd\">\n<tv generator-info-name=\"test\"><channel id=\"one\"><display-name>One</display-name></channel><programme start=\"20261127150000 +0000\" stop=\"20261127160000 +0000\" channel=\"one\"><title>News</title></programme></tv>\n";

/// The large guide's size at least.
const BIG: usize = 8 << 20;

/// The large guide gzip-compressed, its XML's SHA-256 and length.
fn big_guide() -> &'static (Vec<u8>, [u8; 32], usize) {
    static GUIDE: OnceLock<(Vec<u8>, [u8; 32], usize)> = OnceLock::new();
    GUIDE.get_or_init(|| {
        let xml = big_xmltv(BIG);
        let gz = sluice_media::gzip::compress(&xml, 6);
        (gz, Sha256::digest(&xml).into(), xml.len())
    })
}

/// A guide source counting its fetches: `/guide.xml`, `/guide.xml.gz` (gzip), `/big.xml.gz`
/// (an 8 MB guide, gzip), `/slow.xml` (answers after 200 ms), `/hold.xml` (a guide of
/// [`HOLD`] bytes whose last 5 wait for `release`), `/page.html` (an HTML page), anything else 404.
struct Source {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    release: tokio::sync::watch::Sender<bool>,
}

/// The `/hold.xml` guide's size.
const HOLD: usize = 64 * 1024;

async fn source() -> Source {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let (release, released) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = counter.clone();
            let released = released.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let counter = counter.clone();
                    let mut released = released.clone();
                    async move {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let full =
                            |b: Bytes| -> BoxBody { Full::new(b).map_err(|n| match n {}).boxed() };
                        let resp = match req.uri().path() {
                            "/guide.xml" => Response::builder()
                                .header("content-type", "text/xml")
                                .body(full(Bytes::from(XMLTV))),
                            "/guide.xml.gz" => {
                                let gz = sluice_media::gzip::compress(XMLTV.as_bytes(), 6);
                                Response::builder()
                                    .header("content-type", "application/gzip")
                                    .body(full(Bytes::from(gz)))
                            }
                            "/big.xml.gz" => Response::builder()
                                .header("content-type", "application/gzip")
                                .body(full(Bytes::from_static(&big_guide().0))),
                            "/slow.xml" => {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                                Response::builder().body(full(Bytes::from(XMLTV)))
                            }
                            "/hold.xml" => {
                                let head = format!("<tv>{}", " ".repeat(HOLD - 9));
                                let tail = async move {
                                    let _ = released.wait_for(|r| *r).await;
                                    Ok(Frame::data(Bytes::from_static(b"</tv>")))
                                };
                                let frames = futures_util::stream::once(async move {
                                    Ok::<_, std::io::Error>(Frame::data(Bytes::from(head)))
                                })
                                .chain(futures_util::stream::once(tail));
                                Response::builder().body(BodyExt::boxed(StreamBody::new(frames)))
                            }
                            "/page.html" => Response::builder()
                                .header("content-type", "text/html")
                                .body(full(Bytes::from("<html><body>login</body></html>"))),
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
    Source {
        addr,
        hits,
        release,
    }
}

fn epg(s: &Sluice, src: &Source, path: &str, extra: &str) -> String {
    let d = enc(&format!("http://{}{path}", src.addr));
    s.url(&format!("/proxy/epg?api_password=pw&d={d}{extra}"))
}

async fn sluice() -> Sluice {
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    Sluice::start(config).await
}

#[tokio::test]
async fn guide_is_fetched_once_then_served_from_memory() {
    let src = source().await;
    let s = sluice().await;
    let url = epg(&s, &src, "/guide.xml", "");
    let r = get(&url).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-epg-cache"], "MISS");
    assert_eq!(r.headers["content-type"], "application/xml; charset=utf-8");
    assert_eq!(r.headers["cache-control"], "public, max-age=3600");
    assert_eq!(r.body.unwrap(), Bytes::from(XMLTV));
    let etag = r.headers["etag"].to_str().unwrap().to_string();

    let r = get(&url).await;
    assert_eq!(r.headers["x-epg-cache"], "HIT");
    assert_eq!(r.body.unwrap(), Bytes::from(XMLTV));
    assert_eq!(src.hits.load(Ordering::SeqCst), 1);

    // Revalidation by ETag; HEAD keeps the length; gzip for a client that takes it.
    let r = request("GET", &url, &[("if-none-match", etag.as_str())]).await;
    assert_eq!(r.status, 304);
    let r = request("HEAD", &url, &[]).await;
    assert_eq!(
        r.headers["content-length"],
        XMLTV.len().to_string().as_str()
    );
    assert!(r.body.unwrap().is_empty());
    let r = request("GET", &url, &[("accept-encoding", "gzip")]).await;
    assert_eq!(r.headers["content-encoding"], "gzip");
    let mut xml = String::new();
    flate2::read::GzDecoder::new(&r.body.unwrap()[..])
        .read_to_string(&mut xml)
        .unwrap();
    assert_eq!(xml, XMLTV);
    assert_eq!(src.hits.load(Ordering::SeqCst), 1);

    // Other credentials are another entry; cache_ttl=0 fetches every time.
    let r = get(&epg(&s, &src, "/guide.xml", "&h_authorization=Bearer%20x")).await;
    assert_eq!(r.headers["x-epg-cache"], "MISS");
    assert_eq!(src.hits.load(Ordering::SeqCst), 2);
    for _ in 0..2 {
        let r = get(&epg(&s, &src, "/guide.xml", "&cache_ttl=0")).await;
        assert_eq!(r.headers["x-epg-cache"], "MISS");
    }
    assert_eq!(src.hits.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn gzip_sources_and_concurrent_misses() {
    let src = source().await;
    let s = sluice().await;
    let r = get(&epg(&s, &src, "/guide.xml.gz", "")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from(XMLTV));
    // Ten viewers of a guide nobody has fetched yet cost the source one fetch.
    let url = epg(&s, &src, "/slow.xml", "");
    let all = futures_util::future::join_all((0..10).map(|_| get(&url))).await;
    for r in all {
        assert_eq!(r.status, 200);
        assert_eq!(r.body.unwrap(), Bytes::from(XMLTV));
    }
    assert_eq!(src.hits.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn errors_are_clear_and_not_cached() {
    let src = source().await;
    let s = sluice().await;
    // No password: the source hears nothing.
    let d = enc(&format!("http://{}/guide.xml", src.addr));
    let r = get(&s.url(&format!("/proxy/epg?d={d}"))).await;
    assert_eq!(r.status, 403);
    assert_eq!(src.hits.load(Ordering::SeqCst), 0);
    // The source's status, as MediaFlow answers it.
    let r = get(&epg(&s, &src, "/gone.xml", "")).await;
    assert_eq!(r.status, 404);
    // An HTML page is not a guide.
    for _ in 0..2 {
        let r = get(&epg(&s, &src, "/page.html", "")).await;
        assert_eq!(r.status, 502);
        let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
        assert!(body.contains("not XMLTV"), "{body}");
    }
    assert_eq!(src.hits.load(Ordering::SeqCst), 3);
    let r = get(&epg(&s, &src, "/guide.xml", "&cache_ttl=soon")).await;
    assert_eq!(r.status, 400);
    let r = request("POST", &epg(&s, &src, "/guide.xml", ""), &[]).await;
    assert_eq!(r.status, 405);
}

/// Fetches of different guides share 4 × `max_bytes` for their bodies (`FETCH_GUIDES`): before,
/// each miss with its own URL held up to `max_bytes` (256 MiB) with no bound on how many (64
/// requests, 16 GiB). Past the budget a fetch is a 503 with Retry-After; the budget is given back
/// once the guides are checked.
#[tokio::test]
async fn guide_fetches_in_flight_share_a_memory_budget() {
    let src = source().await;
    let s = sluice_behind_a_proxy(HOLD).await;
    // Four clients' bodies of `max_bytes` (each its client's whole share) arrive all but their
    // last bytes, and wait there.
    let held: Vec<_> = (0..4)
        .map(|i| {
            let url = epg(&s, &src, &format!("/hold.xml?n={i}"), "");
            tokio::spawn(get_as(url, format!("10.0.0.{}", i + 1)))
        })
        .collect();
    for _ in 0..100 {
        if src.hits.load(Ordering::SeqCst) == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(src.hits.load(Ordering::SeqCst), 4);
    // Another guide (fetched every time, never kept) finds no room for even its first KiB once
    // their bodies have arrived.
    let small = epg(&s, &src, "/guide.xml", "&cache_ttl=0");
    let mut r = get(&small).await;
    for _ in 0..50 {
        if r.status == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        r = get(&small).await;
    }
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "1");
    let body = String::from_utf8(r.body.unwrap().to_vec()).unwrap();
    assert!(body.contains("media.epg.max_bytes"), "{body}");
    // Once the held guides end and are checked, their memory is given back.
    src.release.send(true).unwrap();
    for h in held {
        let r = h.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body.unwrap().len(), HOLD);
    }
    let r = get(&small).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from(XMLTV));
}

async fn get_as(url: String, client: String) -> Reply {
    request("GET", &url, &[("x-forwarded-for", client.as_str())]).await
}

/// A sluice whose guides are at most `max_bytes`, behind a front proxy on this host that says
/// who each client is (`X-Forwarded-For`).
async fn sluice_behind_a_proxy(max_bytes: usize) -> Sluice {
    let mut config = test_config();
    config.auth.api_password = "pw".into();
    config.auth.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    config.media.epg.max_bytes = max_bytes;
    Sluice::start(config).await
}

/// Opens a `/proxy/epg` request for `/hold.xml` as `client` and leaves it waiting for the
/// guide's last bytes; the connection is returned, to be dropped.
async fn hold_as(s: &Sluice, src: &Source, n: usize, client: &str) -> TcpStream {
    let url = epg(s, src, &format!("/hold.xml?n={n}"), "");
    let target = url.strip_prefix(&format!("http://{}", s.addr)).unwrap();
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(
        format!("GET {target} HTTP/1.1\r\nHost: sluice.test\r\nX-Forwarded-For: {client}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    tcp
}

/// Waits (by polls, at most 5 s) until the source has been asked `n` times in all.
async fn wait_for_hits(src: &Source, n: usize) {
    for _ in 0..250 {
        if src.hits.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(src.hits.load(Ordering::SeqCst), n);
}

/// Asks `url` as `client` until the answer has `status` (at most 50 times, 100 ms apart): a held
/// body is charged once its bytes arrive, and given back once its request is gone.
async fn until_status(url: &str, client: &str, status: u16) -> Reply {
    let mut r = request("GET", url, &[("x-forwarded-for", client)]).await;
    for _ in 0..50 {
        if r.status == status {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        r = request("GET", url, &[("x-forwarded-for", client)]).await;
    }
    r
}

/// One client (an IPv6 one by its /64) holds at most a quarter of what guide fetches share, one
/// guide of `max_bytes`: before, one client's four slow fetches of large guides (each its own URL,
/// each answered all but its last bytes) held the whole budget and every other user's guide was
/// refused until they ended. Past its share the client gets the budget's own 503 (booked to it,
/// `side: downstream`), another client is served, and once the client's held request is gone
/// (it disconnected mid-body) its share is back.
#[tokio::test]
async fn a_client_holds_at_most_its_share_of_the_guide_fetches() {
    let src = source().await;
    let s = sluice_behind_a_proxy(HOLD).await;
    let a = "2001:db8::1";
    // `a` holds a body of `max_bytes`: its whole share, a quarter of the budget.
    let holding = hold_as(&s, &src, 0, a).await;
    wait_for_hits(&src, 1).await;
    // Past its share, from any address of its /64: refused as when the budget is full, with no
    // fetch past its first KiB (the small guide fetches every time, never kept).
    let small = epg(&s, &src, "/guide.xml", "&cache_ttl=0");
    let r = until_status(&small, "2001:db8::2", 503).await;
    assert_eq!(r.status, 503, "a client past its share was served");
    assert_eq!(r.headers["retry-after"], "1");
    let v: serde_json::Value = serde_json::from_slice(&r.body.unwrap()).unwrap();
    assert_eq!(v["kind"], "epg_busy", "{v}");
    assert_eq!(
        v["error"],
        "the guides being fetched now hold all the memory set aside for them \
         (4 × media.epg.max_bytes); try again shortly"
    );
    assert_eq!(v["side"], "downstream", "{v}");
    // Another client (another /64, an IPv4 address) is served.
    let r = request("GET", &small, &[("x-forwarded-for", "2001:db8:0:1::1")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from(XMLTV));
    let r = request("GET", &small, &[("x-forwarded-for", "192.0.2.7")]).await;
    assert_eq!(r.status, 200);
    // `a` leaves mid-body: its fetch ends with it and its share is back (the source still holds
    // the guide's last bytes: nothing else gives it back).
    drop(holding);
    let r = until_status(&small, a, 200).await;
    assert_eq!(
        r.status, 200,
        "the share of a client that left was not given back"
    );
    assert_eq!(r.body.unwrap(), Bytes::from(XMLTV));
    // It may hold a whole guide again.
    let _again = hold_as(&s, &src, 1, a).await;
    let r = until_status(&small, "2001:db8::3", 503).await;
    assert_eq!(r.status, 503);
}

/// Clients that take no gzip and read slowly hold no copy of the guide each. Before, every such
/// `/proxy/epg` request inflated the whole guide into a buffer of its own on a runtime thread
/// and held it until the client had read it all (up to 64 per client address, of a guide up to
/// `media.epg.max_bytes`, 256 MiB). The bytes are still the guide's, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_plain_guide_readers_hold_no_copy_each() {
    const READERS: usize = 16;
    let &(_, want, xml_len) = big_guide();
    let src = source().await;
    let s = sluice().await;
    let url = epg(&s, &src, "/big.xml.gz", "");
    // Fetched and kept first: the fetch is not what is measured.
    let r = request("GET", &url, &[("accept-encoding", "gzip")]).await;
    assert_eq!(r.status, 200);
    drop(r);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let target = url.strip_prefix(&format!("http://{}", s.addr)).unwrap();
    let before = LIVE.load(Ordering::Relaxed);
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let mut tcp = TcpStream::connect(s.addr).await.unwrap();
        tcp.write_all(format!("GET {target} HTTP/1.1\r\nHost: sluice.test\r\n\r\n").as_bytes())
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
        held < (2 * BIG) as isize,
        "{READERS} slow readers of a {BIG}-byte guide held {held} bytes"
    );
    for (tcp, first) in readers {
        let body = rest_of_body(tcp, first).await;
        assert_eq!(
            <[u8; 32]>::from(Sha256::digest(&body)),
            want,
            "the guide, byte for byte"
        );
    }
    // A HEAD says the XML's length, with no body.
    let r = request("HEAD", &url, &[]).await;
    assert_eq!(r.headers["content-length"], xml_len.to_string().as_str());
    assert!(r.body.unwrap().is_empty());
}
