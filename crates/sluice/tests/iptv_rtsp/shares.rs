//! What one client may hold of the IPTV gateway beyond its live requests: channels it asked for
//! and hung up on (a lingering group still counts against its `max_subscribers_per_client`,
//! an IPv6 client is its /64), and HLS catch-up programmes kept in memory after they ended
//! (all of them together within `catchup_total_bytes`). Requests go straight to the gateway's
//! handler with the client address a test names, so several clients share one loopback.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::iptv_support::{config, rtp, ts_datagrams, wait_joined, Gateway, Sender};
use http::{Request, Response};
use sluice::body::Body;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// `GET path` as the client at `peer`.
async fn get_from(gw: &Gateway, peer: &str, path: &str) -> Response<Body> {
    let (mut parts, ()) = Request::get(path)
        .header("host", "gw.test")
        .body(())
        .unwrap()
        .into_parts();
    parts.extensions.insert(peer.parse::<SocketAddr>().unwrap());
    let iptv = gw.iptv.clone();
    tokio::time::timeout(Duration::from_secs(10), iptv.handle(parts))
        .await
        .expect("answer within 10 s")
}

/// Asks for a multicast channel as `peer`, with the group sending once joined.
async fn watch(gw: &Gateway, peer: &str, group: &str, port: u16) -> Response<Body> {
    let path = format!("/udp/{group}:{port}?iface=lo");
    let (resp, ()) = tokio::join!(get_from(gw, peer, &path), async {
        wait_joined(group, true).await;
        Sender::new(group, port).send_raw(&ts_datagrams(3, 0x109, None));
    });
    resp
}

/// Hubs the gateway holds now, and their subscribers.
async fn hubs(gw: &Gateway) -> Vec<u64> {
    let status = gw.status().await;
    status["hubs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["subscribers"].as_u64().unwrap())
        .collect()
}

/// One client asks for four channels and hangs up on each: the groups linger (10 s), but only
/// its share (2) of them on its account, so another client still gets a new channel instead
/// of a 503 `max_channels` for the linger time.
#[tokio::test]
async fn channels_left_at_once_do_not_fill_max_channels() {
    let mut cfg = config();
    cfg.linger_ms = 10_000;
    cfg.max_subscribers_per_client = 2;
    cfg.max_channels = 4;
    let gw = Gateway::start(cfg).await;
    for i in 0..4u16 {
        let group = format!("239.71.9.{}", i + 1);
        let resp = watch(&gw, "192.0.2.1:40000", &group, 46300 + i).await;
        assert_eq!(resp.status(), 200, "channel {i}");
        drop(resp);
        // Hung up: the group lingers with nobody watching.
        assert!(hubs(&gw).await.iter().all(|&n| n == 0));
    }
    let resp = watch(&gw, "192.0.2.2:40000", "239.71.9.9", 46309).await;
    assert_eq!(resp.status(), 200, "another client's new channel");
    let lingering = hubs(&gw).await.len() - 1;
    assert!(
        lingering <= 2,
        "the client's share of lingering groups: {lingering}"
    );
    // Its own channels still play: zapping back and on is never refused.
    let resp = watch(&gw, "192.0.2.1:40001", "239.71.9.10", 46310).await;
    assert_eq!(resp.status(), 200);
}

/// Each address is a client, IPv6 ones too: the devices of one home network all take addresses
/// from one /64, and counted by it they shared one client's share (the house's third channel
/// refused at a share of 2).
#[tokio::test]
async fn each_ipv6_address_is_a_client_of_its_own() {
    let mut cfg = config();
    cfg.max_subscribers_per_client = 2;
    let gw = Gateway::start(cfg).await;
    let a = watch(&gw, "[2001:db8:0:1::a]:40000", "239.71.9.21", 46321).await;
    let b = watch(&gw, "[2001:db8:0:1::a]:40001", "239.71.9.22", 46322).await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    let path = "/udp/239.71.9.23:46323?iface=lo";
    let resp = get_from(&gw, "[2001:db8:0:1::a]:40002", path).await;
    assert_eq!(resp.status(), 429, "a third channel for one address");
    let c = watch(&gw, "[2001:db8:0:1::b]:40000", "239.71.9.23", 46323).await;
    assert_eq!(c.status(), 200, "another device of the same /64");
}

/// 4 s of MPEG-2 video with a keyframe a second, made once.
fn programme() -> &'static Vec<u8> {
    static TS: OnceLock<Vec<u8>> = OnceLock::new();
    TS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("programme.ts");
        let status = Command::new("ffmpeg")
            .args(["-loglevel", "error", "-y"])
            .args(["-f", "lavfi", "-i", "testsrc=size=160x120:rate=25"])
            .args(["-t", "4", "-c:v", "mpeg2video", "-g", "25", "-b:v", "300k"])
            .args(["-f", "mpegts"])
            .arg(&path)
            .status()
            .expect("ffmpeg must be installed (scripts/test.sh installs it)");
        assert!(status.success(), "ffmpeg failed");
        std::fs::read(&path).unwrap()
    })
}

/// A scripted RTSP server: every session plays [`programme`] at once, interleaved on the
/// control connection, and then hangs up (the recording has ended).
async fn rtsp_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let data = Arc::new(programme().clone());
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(session(conn, data.clone()));
        }
    });
    port
}

async fn session(mut conn: TcpStream, data: Arc<Vec<u8>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            let mut chunk = [0; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        buf.drain(..end + 4);
        let method = head.split(' ').next().unwrap_or("");
        let url = head.split(' ').nth(1).unwrap_or("").to_string();
        let cseq = head
            .lines()
            .find_map(|l| l.strip_prefix("CSeq: "))
            .unwrap_or("0")
            .to_string();
        let answer = match method {
            "DESCRIBE" => {
                let sdp = "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=t\r\nt=0 0\r\nm=video 0 RTP/AVP 33\r\na=control:track1\r\n";
                format!(
                    "RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nContent-Base: {url}/\r\nContent-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{sdp}",
                    sdp.len()
                )
            }
            "SETUP" => format!(
                "RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nTransport: RTP/AVP/TCP;unicast;interleaved=0-1\r\nSession: 4242;timeout=60\r\n\r\n"
            ),
            _ => format!("RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nPublic: OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN\r\n\r\n"),
        };
        if conn.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        if method == "PLAY" {
            let mut out = Vec::new();
            for (seq, chunk) in data.chunks(7 * 188).enumerate() {
                let packet = rtp(seq as u16, chunk);
                out.push(b'$');
                out.push(0);
                out.extend_from_slice(&(packet.len() as u16).to_be_bytes());
                out.extend_from_slice(&packet);
            }
            let _ = conn.write_all(&out).await;
            return;
        }
    }
}

/// `sluice_iptv_hls_catchup_bytes` now.
fn catchup_bytes(gw: &Gateway) -> u64 {
    let metrics = gw.metrics();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("iptv_hls_catchup_bytes "))
        .map_or(0, |v| v.parse().unwrap())
}

/// One client watches catch-up programme after programme, each ended at once and kept for
/// seeking: all of them together stay within `catchup_total_bytes`, the ended ones idle
/// longest dropped first.
#[tokio::test]
async fn ended_catch_up_programmes_stay_within_the_total() {
    const TOTAL: u64 = 150_000;
    let size = programme().len() as u64;
    assert!(
        (TOTAL / 2..TOTAL).contains(&size),
        "programme of {size} bytes"
    );
    let port = rtsp_server().await;
    let mut cfg = config();
    cfg.rtsp.timeout_ms = 3000;
    cfg.hls.target_duration_secs = 1;
    cfg.hls.catchup_total_bytes = TOTAL;
    let gw = Gateway::start(cfg).await;
    for i in 0..4 {
        let path = format!(
            "/hls/rtsp/127.0.0.1:{port}/archive/index.m3u8?playseek=2024010112000{i}-20240101130000"
        );
        let mut ended = false;
        for _ in 0..100 {
            let resp = get_from(&gw, "192.0.2.1:40000", &path).await;
            assert_eq!(resp.status(), 200, "programme {i}");
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            if String::from_utf8_lossy(&body).contains("#EXT-X-ENDLIST") {
                ended = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ended, "programme {i} never complete");
        let held = catchup_bytes(&gw);
        assert!(held <= TOTAL, "{held} bytes held after programme {i}");
    }
    let channels = gw.iptv.hls_channels();
    assert!(channels <= 2, "{channels} catch-up programmes held");
    assert!(catchup_bytes(&gw) > 0);
}
