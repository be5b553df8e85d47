//! Bodies sluice reads whole (playlists, MPDs, the gateway's fetches) against an origin that
//! trickles them a byte at a time, never idle long enough for the idle deadline:
//! `upstream.whole_body_timeout_secs` ends them, booked to the upstream; a streamed body keeps
//! only the idle deadline.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use sluice::upstream::fetch::FetchError;
use sluice::upstream::{Upstream, UpstreamConfig};
use tokio::net::TcpListener;

const PLAYLIST: &str = "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:4\n\
#EXTINF:4.0,\nseg0.ts\n#EXTINF:4.0,\nseg1.ts\n#EXT-X-ENDLIST\n";

const MPD: &str = "<?xml version=\"1.0\"?><MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" \
type=\"static\" mediaPresentationDuration=\"PT8S\"><Period><AdaptationSet mimeType=\"video/mp4\">\
<Representation id=\"v\" bandwidth=\"100000\"><BaseURL>v.mp4</BaseURL></Representation>\
</AdaptationSet></Period></MPD>";

/// `text` one byte every `gap`.
fn trickle(text: &'static str, gap: Duration) -> BoxBody {
    let bytes = text.as_bytes();
    let s = futures_util::stream::unfold(0usize, move |i| async move {
        if i == bytes.len() {
            return None;
        }
        tokio::time::sleep(gap).await;
        let frame = Frame::data(Bytes::copy_from_slice(&bytes[i..i + 1]));
        Some((Ok::<_, std::io::Error>(frame), i + 1))
    });
    StreamBody::new(s).boxed()
}

/// An origin: `/trickle.m3u8`, `/trickle.mpd` and `/trickle.bin` a byte every 500 ms (a playlist
/// takes ~40 s, an MPD ~2 min, the stream 4 s), `/ok.m3u8` at once.
async fn origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let gap = Duration::from_millis(500);
                    let (kind, body) = match req.uri().path() {
                        "/trickle.m3u8" => {
                            ("application/vnd.apple.mpegurl", trickle(PLAYLIST, gap))
                        }
                        "/trickle.mpd" => ("application/dash+xml", trickle(MPD, gap)),
                        "/trickle.bin" => ("application/octet-stream", trickle("12345678", gap)),
                        _ => (
                            "application/vnd.apple.mpegurl",
                            trickle(PLAYLIST, Duration::ZERO),
                        ),
                    };
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", kind)
                            .body(body)
                            .unwrap(),
                    )
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn text(r: &Reply) -> String {
    String::from_utf8_lossy(r.body.as_ref().unwrap()).into_owned()
}

/// Before, a playlist or MPD trickled a byte every 500 ms (under the 2 s idle deadline) held the
/// request until the origin finished: ~40 s and ~2 min here, days for an 8 MB playlist.
#[tokio::test]
async fn trickled_playlists_meet_the_whole_body_deadline() {
    let o = origin().await;
    let mut config = test_config();
    config.upstream.whole_body_timeout_secs = 2;
    let s = Sluice::start(config).await;
    for path in [
        format!(
            "/proxy/hls/manifest.m3u8?d={}",
            enc(&format!("http://{o}/trickle.m3u8"))
        ),
        format!(
            "/proxy/mpd/manifest.m3u8?d={}",
            enc(&format!("http://{o}/trickle.mpd"))
        ),
    ] {
        let started = Instant::now();
        let r = get(&s.url(&path)).await;
        let took = started.elapsed();
        // The status a body the origin leaves unfinished gets (as after the idle deadline).
        assert_eq!(r.status, 502, "{path}: {}", text(&r));
        assert!(took < Duration::from_secs(5), "{path}: {took:?}");
        let json: serde_json::Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
        assert_eq!(json["side"], "upstream", "{json}");
        assert_eq!(json["kind"], "upstream_body", "{json}");
        assert!(
            json["error"]
                .as_str()
                .unwrap()
                .contains("did not finish the body within 2 s"),
            "{json}"
        );
    }
    let metrics = text(&get(&s.url("/metrics")).await);
    let series = "sluice_errors_total{side=\"upstream\",kind=\"upstream_body\"} 2";
    assert!(metrics.contains(series), "{series} missing:\n{metrics}");

    // A playlist that arrives at once is served as before.
    let r = get(&s.url(&format!(
        "/proxy/hls/manifest.m3u8?d={}",
        enc(&format!("http://{o}/ok.m3u8"))
    )))
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert!(text(&r).contains("#EXT-X-ENDLIST"));
    // A streamed body has no total deadline: 4 s of trickle, past the 2 s, arrives whole.
    let r = get(&s.url(&format!(
        "/proxy/stream?d={}",
        enc(&format!("http://{o}/trickle.bin"))
    )))
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.unwrap(), Bytes::from_static(b"12345678"));
}

/// The gateway's own fetches (its playlist and guide): the same deadline on the body.
#[tokio::test]
async fn trickled_gateway_fetches_meet_the_whole_body_deadline() {
    let o = origin().await;
    let config = UpstreamConfig {
        allow_private: true,
        whole_body_timeout_secs: 2,
        ..UpstreamConfig::default()
    };
    let up = Upstream::new(&config, &mut Registry::default()).unwrap();
    let started = Instant::now();
    let got = up
        .fetch(
            &format!("http://{o}/trickle.m3u8"),
            Default::default(),
            1 << 20,
        )
        .await;
    let took = started.elapsed();
    assert!(
        matches!(got, Err(FetchError::Deadline { secs: 2, .. })),
        "{got:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    let ok = up
        .fetch(&format!("http://{o}/ok.m3u8"), Default::default(), 1 << 20)
        .await
        .unwrap();
    assert_eq!(ok.body, Bytes::from_static(PLAYLIST.as_bytes()));
}
