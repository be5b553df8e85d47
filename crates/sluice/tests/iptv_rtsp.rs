//! `/rtsp/` against GStreamer's RTSP server (`tests/rtsp_server/serve.py`, started per test on
//! 127.0.0.1) serving an ffmpeg-made MPEG-TS file as RTP/MP2T: TCP-interleaved and UDP
//! transports, one shared session per URL, Digest and Basic auth, a redirecting front server,
//! a server that drops the session mid-stream, keep-alives against a short session timeout,
//! catch-up (`playseek`/`tvdr` → `Range: clock=`) and start offsets, the address guard, and
//! limits. The relayed bytes are checked against the source file byte for byte and decoded
//! by ffprobe. Seeks are checked twice: the exact `Range` each request sends, and, against the
//! server's seekable mounts (an H.264 MP4 whose frames carry their second as their brightness),
//! the second of the recording the first relayed frame comes from.

/// The whole server (auth and tokens in front of the gateway), for playlist entry tokens.
#[path = "support/mod.rs"]
mod app_support;
mod iptv_support;
#[path = "iptv_rtsp/shares.rs"]
mod shares;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use iptv_support::{config, read_bytes, Gateway};
use serde_json::Value;
use sluice::iptv::IptvConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TS_PACKET: usize = 188;

/// The source file, made once: 20 s of MPEG-2 video and MP2 audio, 25 fps, a GOP per second.
fn source_ts() -> &'static (PathBuf, Vec<u8>) {
    static TS: OnceLock<(PathBuf, Vec<u8>)> = OnceLock::new();
    TS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let path = dir.join("source.ts");
        let status = Command::new("ffmpeg")
            .args(["-loglevel", "error", "-y"])
            .args(["-f", "lavfi", "-i", "testsrc=size=160x120:rate=25"])
            .args(["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=48000"])
            .args(["-t", "20", "-c:v", "mpeg2video", "-g", "25", "-b:v", "300k"])
            .args(["-c:a", "mp2", "-b:a", "64k", "-f", "mpegts"])
            .arg(&path)
            .status()
            .expect("ffmpeg must be installed (scripts/test.sh installs it)");
        assert!(status.success(), "ffmpeg failed");
        let bytes = std::fs::read(&path).unwrap();
        (path, bytes)
    })
}

/// Frame size of [`source_mp4`].
const MP4_WIDTH: usize = 160;
const MP4_HEIGHT: usize = 120;

/// The seekable source, made once: 25 s of H.264 at 25 fps, a keyframe on every whole
/// second, every frame flat grey at luma `16 + 8 × second` (with temporal noise so the stream
/// has a realistic bitrate). A decoded frame tells which second of the recording it is.
fn source_mp4() -> &'static PathBuf {
    static MP4: OnceLock<PathBuf> = OnceLock::new();
    MP4.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let path = dir.join("seekable.mp4");
        let video = format!(
            "nullsrc=size={MP4_WIDTH}x{MP4_HEIGHT}:rate=25,\
             geq=lum='16+8*floor(T)':cb=128:cr=128,noise=alls=12:allf=t"
        );
        let status = Command::new("ffmpeg")
            .args(["-loglevel", "error", "-y", "-f", "lavfi", "-i", &video])
            .args(["-t", "25", "-c:v", "libx264", "-preset", "veryfast"])
            .args(["-g", "25", "-keyint_min", "25", "-sc_threshold", "0"])
            .args(["-pix_fmt", "yuv420p", "-b:v", "300k"])
            .arg(&path)
            .status()
            .expect("ffmpeg must be installed (scripts/test.sh installs it)");
        assert!(status.success(), "ffmpeg failed");
        path
    })
}

/// The second of [`source_mp4`] that the first video frame of the relayed `out` was taken
/// from, read from the frame's mean luma after ffmpeg decodes it.
fn first_frame_second(out: &[u8]) -> u32 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ts");
    std::fs::write(&path, out).unwrap();
    let decoded = Command::new("ffmpeg")
        .args(["-loglevel", "error", "-i"])
        .arg(&path)
        .args([
            "-frames:v",
            "1",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "yuv420p",
            "-",
        ])
        .output()
        .unwrap();
    let luma = MP4_WIDTH * MP4_HEIGHT;
    assert!(
        decoded.stdout.len() >= luma,
        "no frame decoded from {} relayed bytes: {}",
        out.len(),
        String::from_utf8_lossy(&decoded.stderr)
    );
    let mean = decoded.stdout[..luma]
        .iter()
        .map(|&y| f64::from(y))
        .sum::<f64>()
        / luma as f64;
    let second = (mean - 16.0) / 8.0;
    assert!(
        (second - second.round()).abs() < 0.25,
        "mean luma {mean} is not one of the source's seconds"
    );
    second.round() as u32
}

/// The second of [`source_mp4`] shown `offset` seconds into the HLS playlist at `url`, as
/// ffmpeg's HLS client seeks there (`-ss` before `-i`) and decodes.
fn second_of_hls(url: &str, offset: f64) -> u32 {
    let decoded = Command::new("ffmpeg")
        .args([
            "-loglevel",
            "error",
            "-ss",
            &format!("{offset:.3}"),
            "-i",
            url,
        ])
        .args([
            "-frames:v",
            "1",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "yuv420p",
            "-",
        ])
        .output()
        .unwrap();
    let luma = MP4_WIDTH * MP4_HEIGHT;
    assert!(
        decoded.stdout.len() >= luma,
        "no frame decoded at {offset} s: {}",
        String::from_utf8_lossy(&decoded.stderr)
    );
    let mean = decoded.stdout[..luma]
        .iter()
        .map(|&y| f64::from(y))
        .sum::<f64>()
        / luma as f64;
    ((mean - 16.0) / 8.0).round() as u32
}

/// GStreamer's RTSP server in a child process, with the requests it logged.
struct RtspServer {
    port: u16,
    child: Child,
    log: Arc<Mutex<Vec<Value>>>,
}

impl RtspServer {
    fn start(extra: &[&str]) -> RtspServer {
        Self::start_with(extra, false)
    }

    /// With the seekable mounts too (`/vod`, `/timeshift` recorded from
    /// 2024-01-01T12:00:00Z), serving [`source_mp4`].
    fn start_seekable(extra: &[&str]) -> RtspServer {
        Self::start_with(extra, true)
    }

    fn start_with(extra: &[&str], seekable: bool) -> RtspServer {
        let mut args: Vec<std::ffi::OsString> = extra.iter().map(Into::into).collect();
        if seekable {
            args.push("--mp4".into());
            args.push(source_mp4().into());
            args.push("--recorded-at".into());
            args.push("20240101T120000Z".into());
        }
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/rtsp_server/serve.py");
        // The distribution's Python: python3-gi and the GStreamer bindings live there.
        let mut child = Command::new("/usr/bin/python3")
            .arg(script)
            .arg("--ts")
            .arg(&source_ts().0)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("/usr/bin/python3 with python3-gi (scripts/test.sh installs it)");
        let stdout = child.stdout.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(port) = line.strip_prefix("PORT ") {
                    let _ = tx.send(port.parse::<u16>().unwrap());
                } else if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        let port = rx.recv_timeout(Duration::from_secs(20)).expect(
            "the RTSP server did not start (GStreamer RTSP server and python3-gi installed?)",
        );
        RtspServer { port, child, log }
    }

    /// Logged requests of one method.
    fn requests(&self, method: &str) -> Vec<Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v["method"] == method)
            .cloned()
            .collect()
    }

    /// The `Range` of every PLAY received, sorted (concurrent sessions arrive in any order).
    fn play_ranges_sorted(&self) -> Vec<String> {
        let mut ranges: Vec<String> = self
            .requests("PLAY")
            .iter()
            .map(|p| p["range"].as_str().unwrap().to_string())
            .collect();
        ranges.sort();
        ranges
    }

    async fn wait_for(&self, method: &str, count: usize, within: Duration) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let seen = self.requests(method);
            if seen.len() >= count || tokio::time::Instant::now() >= deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for RtspServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rtsp_config() -> IptvConfig {
    let mut c = config();
    c.rtsp.timeout_ms = 3000;
    c
}

async fn get_with(gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> Response<Incoming> {
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::get(path).header("host", "gw.test");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Empty::<Bytes>::new()).unwrap();
    tokio::time::timeout(Duration::from_secs(20), send.send_request(req))
        .await
        .expect("response head within 20 s")
        .unwrap()
}

async fn body_text(resp: Response<Incoming>) -> String {
    String::from_utf8_lossy(&read_bytes(resp, 64 * 1024).await).into_owned()
}

/// The relayed bytes must be a run of whole TS packets of the source file, byte for byte.
fn assert_slice_of_source(out: &[u8]) -> usize {
    let src = &source_ts().1;
    assert!(
        out.len() >= 10 * TS_PACKET,
        "only {} bytes relayed",
        out.len()
    );
    let whole = out.len() / TS_PACKET * TS_PACKET;
    let out = &out[..whole];
    let probe = &out[..4 * TS_PACKET];
    let at = (0..src.len().saturating_sub(probe.len()))
        .step_by(TS_PACKET)
        .find(|&i| &src[i..i + probe.len()] == probe)
        .expect("the output's first packets are not packets of the source");
    assert!(
        at + whole <= src.len(),
        "more output than source after offset {at}"
    );
    assert!(
        &src[at..at + whole] == out,
        "output differs from the source (offset {at}, {whole} bytes)"
    );
    at
}

/// ffprobe reads the relayed bytes as MPEG-2 video plus MP2 audio and decodes frames.
fn assert_decodes(out: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.ts");
    std::fs::write(&path, out).unwrap();
    let probe = Command::new("ffprobe")
        .args(["-v", "error", "-count_frames", "-select_streams", "v:0"])
        .args([
            "-show_entries",
            "stream=codec_name,nb_read_frames",
            "-of",
            "csv=p=0",
        ])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&probe.stdout);
    let mut fields = text.trim().split(',');
    assert_eq!(fields.next(), Some("mpeg2video"), "ffprobe: {text}");
    let frames: u32 = fields.next().unwrap_or("0").parse().unwrap_or(0);
    assert!(frames >= 10, "only {frames} frames decoded: {text}");
}

async fn stream(gw: &Gateway, path: &str, bytes: usize) -> Vec<u8> {
    let resp = get_with(gw, path, &[]).await;
    assert_eq!(resp.status(), 200, "{path}");
    assert_eq!(resp.headers()["content-type"], "video/mp2t");
    read_bytes(resp, bytes).await
}

#[tokio::test]
async fn tcp_interleaved_relays_the_source_bytes() {
    let server = RtspServer::start(&[]);
    let gw = Gateway::start(rtsp_config()).await;
    let path = format!(
        "/rtsp/127.0.0.1:{}/live?r2h-rtsp-transport=tcp",
        server.port
    );
    let out = stream(&gw, &path, 150 * 1024).await;
    assert_slice_of_source(&out);
    assert_decodes(&out);
    let setup = server.requests("SETUP");
    assert_eq!(setup.len(), 1);
    assert_eq!(setup[0]["transport"], "RTP/AVP/TCP;unicast;interleaved=0-1");
    assert_eq!(
        setup[0]["uri"],
        format!("rtsp://127.0.0.1:{}/live/stream=0", server.port)
    );
    let describe = &server.requests("DESCRIBE")[0];
    assert_eq!(
        describe["uri"],
        format!("rtsp://127.0.0.1:{}/live", server.port)
    );
    assert!(describe["user_agent"]
        .as_str()
        .unwrap()
        .starts_with("sluice/"));
    assert_eq!(server.requests("PLAY")[0]["range"], "npt=0.000-");
    // The viewer left: after the linger the session is torn down.
    let teardown = server.wait_for("TEARDOWN", 1, Duration::from_secs(5)).await;
    assert_eq!(teardown.len(), 1, "no TEARDOWN after the last viewer left");
}

#[tokio::test]
async fn udp_transport_relays_the_source_bytes() {
    let server = RtspServer::start(&[]);
    let gw = Gateway::start(rtsp_config()).await;
    let path = format!(
        "/rtsp/127.0.0.1:{}/live?r2h-rtsp-transport=udp",
        server.port
    );
    let out = stream(&gw, &path, 150 * 1024).await;
    assert_slice_of_source(&out);
    assert_decodes(&out);
    let setup = server.requests("SETUP");
    let transport = setup[0]["transport"].as_str().unwrap();
    let ports = transport
        .strip_prefix("RTP/AVP;unicast;client_port=")
        .unwrap_or_else(|| panic!("{transport}"));
    let (rtp, rtcp) = ports.split_once('-').unwrap();
    let (rtp, rtcp): (u16, u16) = (rtp.parse().unwrap(), rtcp.parse().unwrap());
    assert_eq!((rtp % 2, rtcp), (0, rtp + 1));
}

/// The value of the `name` series of the channel whose label ends with `channel`.
fn channel_counter(metrics: &str, name: &str, channel: &str) -> u64 {
    let line = metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(channel))
        .unwrap_or_else(|| panic!("no {name} series for {channel}:\n{metrics}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// RTP over UDP of 3,020 bytes (16 TS packets) with `max_datagram_bytes = 4096`: every
/// datagram was received into 2,048 bytes, cut there, and relayed as if whole (a packet and a
/// half of each lost, the rest broken). Datagrams up to the bound come whole (the relayed
/// bytes are the source's, byte for byte); one over it is dropped and counted as malformed,
/// never cut to the bound and relayed.
#[tokio::test]
async fn udp_datagrams_up_to_max_datagram_bytes_come_whole() {
    let server = RtspServer::start(&["--mtu", "3020"]);
    let path = format!(
        "/rtsp/127.0.0.1:{}/live?r2h-rtsp-transport=udp",
        server.port
    );
    let channel = format!("{}/live", server.port);
    let mut cfg = rtsp_config();
    cfg.max_datagram_bytes = 4096;
    // The hub (and its series) outlives the response.
    cfg.linger_ms = 10_000;
    let gw = Gateway::start(cfg).await;
    let out = stream(&gw, &path, 150 * 1024).await;
    let whole = out.len() / TS_PACKET * TS_PACKET;
    let at = assert_slice_of_source(&out);
    use sha2::Digest;
    assert_eq!(
        sha2::Sha256::digest(&out[..whole]),
        sha2::Sha256::digest(&source_ts().1[at..at + whole]),
    );
    let metrics = gw.metrics();
    let bytes = channel_counter(&metrics, "iptv_received_bytes_total", &channel);
    let datagrams = channel_counter(&metrics, "iptv_received_datagrams_total", &channel);
    // Mostly full packets of 16 TS packets: far beyond 2,048 bytes on average.
    assert!(
        datagrams > 0 && bytes / datagrams > 2048,
        "{bytes} bytes in {datagrams} datagrams"
    );
    assert_eq!(
        channel_counter(&metrics, "iptv_malformed_total", &channel),
        0
    );
    drop(gw);

    // The same stream over a bound of 2,048 bytes: its full datagrams are dropped as
    // malformed, none relayed cut to the bound (the few short ones, a flush's, still pass).
    let mut cfg = rtsp_config();
    cfg.max_datagram_bytes = 2048;
    cfg.linger_ms = 10_000;
    let gw = Gateway::start(cfg).await;
    let request = gw.spawn_get(&path);
    // The series go with the hub, which ends when nothing has come for `no_data_timeout_ms`:
    // read while the session plays.
    let series = |name: &str| {
        let metrics = gw.metrics();
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&channel))?
            .to_string();
        line.rsplit(' ').next()?.parse::<u64>().ok()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let (malformed, received) = loop {
        let malformed = series("iptv_malformed_total").unwrap_or(0);
        let received = series("iptv_received_datagrams_total").unwrap_or(0);
        if malformed >= 20 || tokio::time::Instant::now() >= deadline {
            break (malformed, received);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        malformed >= 20 && received < malformed,
        "{malformed} malformed, {received} relayed"
    );
    request.abort();
}

#[tokio::test]
async fn viewers_of_one_url_share_one_session() {
    let server = RtspServer::start(&[]);
    let gw = Gateway::start(rtsp_config()).await;
    let path = format!("/rtsp/127.0.0.1:{}/live", server.port);
    let (a, b) = tokio::join!(stream(&gw, &path, 100 * 1024), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let resp = get_with(&gw, &path, &[]).await;
        assert_eq!(resp.status(), 200);
        let status = gw.status().await;
        let hubs = status["hubs"].as_array().unwrap();
        assert_eq!(hubs.len(), 1, "{status}");
        assert_eq!(hubs[0]["subscribers"], 2);
        assert_eq!(
            hubs[0]["channel"],
            format!("rtsp://127.0.0.1:{}/live", server.port)
        );
        read_bytes(resp, 100 * 1024).await
    });
    assert_slice_of_source(&a);
    assert_slice_of_source(&b);
    assert_eq!(
        server.requests("SETUP").len(),
        1,
        "one upstream session for both"
    );
}

#[tokio::test]
async fn digest_auth_from_the_url() {
    let server = RtspServer::start(&[
        "--user",
        "viewer",
        "--password",
        "s3cr:t",
        "--auth",
        "digest",
    ]);
    let gw = Gateway::start(rtsp_config()).await;
    let path = format!("/rtsp/viewer:s3cr%3At@127.0.0.1:{}/live", server.port);
    let out = stream(&gw, &path, 60 * 1024).await;
    assert_slice_of_source(&out);
    let describes = server.requests("DESCRIBE");
    assert_eq!(describes.len(), 2, "one challenge, one answer");
    assert!(describes[0].get("authorization").is_none());
    let answer = describes[1]["authorization"].as_str().unwrap();
    assert!(
        answer.starts_with("Digest username=\"viewer\", realm=\"GStreamer RTSP Server\""),
        "{answer}"
    );
    assert!(
        !answer.contains("s3cr"),
        "the password itself is never sent with Digest"
    );
    // Later requests carry the answer too, with their own URI.
    let setup = &server.requests("SETUP")[0];
    assert!(setup["authorization"].as_str().unwrap().contains(&format!(
        "uri=\"rtsp://127.0.0.1:{}/live/stream=0\"",
        server.port
    )));

    let wrong = format!("/rtsp/viewer:nope@127.0.0.1:{}/live", server.port);
    let resp = get_with(&gw, &wrong, &[]).await;
    assert_eq!(resp.status(), 502);
    // The reason ("the server refused the credentials") is the log's, not the viewer's.
    assert_eq!(body_text(resp).await, "the RTSP server failed\n");
    let none = format!("/rtsp/127.0.0.1:{}/live", server.port);
    let resp = get_with(&gw, &none, &[]).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(body_text(resp).await, "the RTSP server failed\n");
}

#[tokio::test]
async fn basic_auth_from_the_url() {
    let server = RtspServer::start(&["--user", "viewer", "--password", "pw", "--auth", "basic"]);
    let gw = Gateway::start(rtsp_config()).await;
    let path = format!("/rtsp/viewer:pw@127.0.0.1:{}/live", server.port);
    let out = stream(&gw, &path, 60 * 1024).await;
    assert_slice_of_source(&out);
    let describes = server.requests("DESCRIBE");
    assert_eq!(describes[1]["authorization"], "Basic dmlld2VyOnB3");
}

/// A front server that answers OPTIONS and redirects DESCRIBE elsewhere (as IPTV load
/// balancers do).
async fn redirector(location: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let location = location.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 2048];
                loop {
                    let Ok(n) = tcp.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        let cseq = head
                            .lines()
                            .find_map(|l| l.strip_prefix("CSeq: "))
                            .unwrap_or("0")
                            .to_string();
                        let reply = if head.starts_with("DESCRIBE") {
                            format!("RTSP/1.0 302 Moved\r\nCSeq: {cseq}\r\nLocation: {location}\r\n\r\n")
                        } else {
                            format!("RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nPublic: OPTIONS, DESCRIBE\r\n\r\n")
                        };
                        if tcp.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn redirects_are_followed() {
    let server = RtspServer::start(&[]);
    let target = format!("rtsp://127.0.0.1:{}/live", server.port);
    let front = redirector(target.clone()).await;
    let gw = Gateway::start(rtsp_config()).await;
    let out = stream(&gw, &format!("/rtsp/127.0.0.1:{front}/moved"), 60 * 1024).await;
    assert_slice_of_source(&out);
    assert_eq!(server.requests("DESCRIBE")[0]["uri"], target);

    // A redirect to nowhere ends with a 502 (the log says "not an rtsp:// URL").
    let looping = redirector(String::new()).await;
    let resp = get_with(&gw, &format!("/rtsp/127.0.0.1:{looping}/x"), &[]).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(body_text(resp).await, "the RTSP server failed\n");
}

#[tokio::test]
async fn a_dropped_session_ends_the_response() {
    let server = RtspServer::start(&["--drop-after", "2"]);
    let gw = Gateway::start(rtsp_config()).await;
    let path = format!("/rtsp/127.0.0.1:{}/live", server.port);
    let started = tokio::time::Instant::now();
    let resp = get_with(&gw, &path, &[]).await;
    assert_eq!(resp.status(), 200);
    let out = read_bytes(resp, usize::MAX).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "response ended after {took:?}"
    );
    assert!(
        took >= Duration::from_secs(2),
        "response ended after {took:?}"
    );
    assert_slice_of_source(&out);
    assert_eq!(
        server
            .log
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v["event"] == "drop")
            .count(),
        1
    );
    // The hub is gone; the next viewer gets a new session.
    assert_eq!(gw.status().await["hubs"].as_array().unwrap().len(), 0);
    let again = stream(&gw, &path, 30 * 1024).await;
    assert_slice_of_source(&again);
    assert_eq!(server.requests("SETUP").len(), 2);
}

#[tokio::test]
async fn keep_alives_hold_a_short_session() {
    let server = RtspServer::start(&["--session-timeout", "2"]);
    let gw = Gateway::start(rtsp_config()).await;
    let path = format!("/rtsp/127.0.0.1:{}/live", server.port);
    let resp = get_with(&gw, &path, &[]).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut out = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < until {
        match tokio::time::timeout_at(until, body.frame()).await {
            Ok(Some(Ok(f))) => out.extend_from_slice(&f.into_data().unwrap_or_default()),
            Ok(_) => panic!("stream ended after {} bytes", out.len()),
            Err(_) => break,
        }
    }
    assert_slice_of_source(&out);
    // The server announced timeout=2: keep-alives every second, by GET_PARAMETER (listed in
    // its Public header).
    let keepalives = server.requests("GET_PARAMETER");
    assert!(
        keepalives.len() >= 4,
        "{} keep-alives in 6 s",
        keepalives.len()
    );
    assert!(keepalives.iter().all(|k| k["session"].is_string()));
}

#[tokio::test]
async fn catch_up_becomes_a_clock_range_on_its_own_session() {
    let server = RtspServer::start(&[]);
    let gw = Gateway::start(rtsp_config()).await;
    let path = format!(
        "/rtsp/127.0.0.1:{}/archive?playseek=20240101200000-20240101210000&r2h-seek-offset=-30&channel=7",
        server.port
    );
    let ua = [("user-agent", "Player/1.0 TZ/UTC+8")];
    let (first, second) = tokio::join!(
        async {
            let resp = get_with(&gw, &path, &ua).await;
            assert_eq!(resp.status(), 200);
            read_bytes(resp, 40 * 1024).await
        },
        async {
            let resp = get_with(&gw, &path, &ua).await;
            assert_eq!(resp.status(), 200);
            read_bytes(resp, 40 * 1024).await
        }
    );
    // Each catch-up viewer gets the recording from its start: the first packets of the file.
    assert_eq!(assert_slice_of_source(&first), 0);
    assert_eq!(assert_slice_of_source(&second), 0);
    let plays = server.requests("PLAY");
    assert_eq!(plays.len(), 2, "a session per catch-up viewer");
    for p in &plays {
        assert_eq!(p["range"], "clock=20240101T115930Z-20240101T125930Z");
    }
    let describe = &server.requests("DESCRIBE")[0];
    assert_eq!(
        describe["uri"],
        format!("rtsp://127.0.0.1:{}/archive?channel=7", server.port)
    );

    // tvdr, no client zone, passthrough: the value stays in the URL, in its own format.
    let path = format!(
        "/rtsp/127.0.0.1:{}/archive?tvdr=20240101120000GMT-20240101130000GMT&r2h-seek-mode=passthrough&r2h-seek-offset=60",
        server.port
    );
    let out = stream(&gw, &path, 20 * 1024).await;
    assert_slice_of_source(&out);
    let describes = server.requests("DESCRIBE");
    assert_eq!(
        describes.last().unwrap()["uri"],
        format!(
            "rtsp://127.0.0.1:{}/archive?tvdr=20240101120100GMT-20240101130100GMT",
            server.port
        )
    );
    assert_eq!(
        server.requests("PLAY").last().unwrap()["range"],
        "npt=0.000-"
    );
}

/// `r2h-start` asks for `Range: npt=S-` (resume a VOD): the exact request, and that a
/// catch-up range wins over it. (The `/archive` mount plays a TS file that GStreamer cannot
/// seek, so the bytes are the file's from its start; the seeks themselves are checked below.)
#[tokio::test]
async fn start_offset_is_an_npt_range() {
    let server = RtspServer::start(&[]);
    let gw = Gateway::start(rtsp_config()).await;
    let path = format!("/rtsp/127.0.0.1:{}/archive?r2h-start=8.25", server.port);
    let out = stream(&gw, &path, 40 * 1024).await;
    assert_eq!(
        assert_slice_of_source(&out),
        0,
        "its own session, from its first byte"
    );
    assert_eq!(server.requests("PLAY")[0]["range"], "npt=8.250-");
    // A catch-up clock range wins over a start offset.
    let path = format!(
        "/rtsp/127.0.0.1:{}/archive?r2h-start=8&playseek=1704110400",
        server.port
    );
    let out = stream(&gw, &path, 20 * 1024).await;
    assert_slice_of_source(&out);
    assert_eq!(
        server.requests("PLAY")[1]["range"],
        "clock=20240101T120000Z-"
    );
}

/// A real server seeks on our `Range: npt=`: GStreamer's server demuxes the MP4 by time, so
/// the first frame relayed after `r2h-start=12` is one of the recording's 12th second, where
/// the same URL without it starts at second 0.
#[tokio::test]
async fn start_offset_makes_a_real_server_seek() {
    let server = RtspServer::start_seekable(&[]);
    let gw = Gateway::start(rtsp_config()).await;
    let base = format!("/rtsp/127.0.0.1:{}/vod", server.port);
    let seek_12 = format!("{base}?r2h-start=12");
    let seek_17_udp = format!("{base}?r2h-start=17&r2h-rtsp-transport=udp");
    let (from_start, seeked, udp) = tokio::join!(
        stream(&gw, &base, 64 * 1024),
        stream(&gw, &seek_12, 64 * 1024),
        stream(&gw, &seek_17_udp, 64 * 1024),
    );
    assert_eq!(first_frame_second(&from_start), 0);
    assert_eq!(first_frame_second(&seeked), 12);
    assert_eq!(first_frame_second(&udp), 17);
    let ranges = server.play_ranges_sorted();
    assert_eq!(ranges, ["npt=0.000-", "npt=12.000-", "npt=17.000-"]);
}

/// Catch-up against an operator-style time-shift server (GStreamer's server with a recording
/// that began at 2024-01-01T12:00:00Z, reading `Range: clock=` as an instant of it): the
/// viewer's local `playseek` time, its zone from the `User-Agent`, and `r2h-seek-offset` all
/// land on the right second of the recording.
#[tokio::test]
async fn catch_up_makes_a_time_shift_server_seek() {
    let server = RtspServer::start_seekable(&[]);
    let gw = Gateway::start(rtsp_config()).await;
    let base = format!("/rtsp/127.0.0.1:{}/timeshift", server.port);
    const BEIJING: &[(&str, &str)] = &[("user-agent", "Player/1.0 TZ/UTC+8")];
    let read = |path: String, headers: &'static [(&'static str, &'static str)]| {
        let gw = &gw;
        async move {
            let resp = get_with(gw, &path, headers).await;
            assert_eq!(resp.status(), 200, "{path}");
            read_bytes(resp, 64 * 1024).await
        }
    };
    let (local, unix, tvdr) = tokio::join!(
        // 20:00:07 in UTC+8 is 12:00:07Z: second 7.
        read(
            format!("{base}?playseek=20240101200007-20240101201000"),
            BEIJING
        ),
        // 12:00:15Z as a Unix time, 6 s earlier by the offset: second 9.
        read(
            format!("{base}?playseek=1704110415&r2h-seek-offset=-6"),
            &[]
        ),
        // tvdr in GMT, a zone-less client: second 21.
        read(
            format!("{base}?tvdr=20240101120021GMT-20240101120100GMT"),
            &[]
        ),
    );
    assert_eq!(first_frame_second(&local), 7);
    assert_eq!(first_frame_second(&unix), 9);
    assert_eq!(first_frame_second(&tvdr), 21);
    let ranges = server.play_ranges_sorted();
    assert_eq!(
        ranges,
        [
            "clock=20240101T120007Z-20240101T121000Z",
            "clock=20240101T120009Z-",
            "clock=20240101T120021Z-20240101T120100Z",
        ]
    );
    // Before the recording began: the server's 457 comes back as a 502 (the log names it).
    let resp = get_with(&gw, &format!("{base}?playseek=20240101115900"), &[]).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(body_text(resp).await, "the RTSP server failed\n");
}

#[tokio::test]
async fn refusals() {
    let server = RtspServer::start(&[]);
    let mut cfg = rtsp_config();
    cfg.rtsp.max_sessions = 1;
    let gw = Gateway::start(cfg).await;
    let bad = [
        ("/rtsp/", "path must be /rtsp/host[:port]/path\n"),
        ("/rtsp/h:0/x", "\"0\" is not a port number (1-65535)\n"),
        // A CR LF in the user name would be a header line of its own in the Digest answer.
        (
            "/rtsp/a%0D%0AX-Evil:%201:pw@h/x",
            "the user name or password in the path holds a control character\n",
        ),
        (
            "/rtsp/h/x?playseek=tomorrow",
            "playseek: \"tomorrow\" is not a time range (begin[-end]) in a known format\n",
        ),
        // A four-byte character where a zone offset goes (it was split inside the character).
        (
            "/rtsp/h/x?playseek=20240101T200000%2B%F0%90%96%BB",
            "playseek: \"20240101T200000+\u{105bb}\" is not a time range (begin[-end]) in a known format\n",
        ),
    ];
    for (path, want) in bad {
        let resp = get_with(&gw, path, &[]).await;
        assert_eq!(resp.status(), 400, "{path}");
        assert_eq!(body_text(resp).await, want);
    }
    // Nothing listens there.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let resp = get_with(&gw, &format!("/rtsp/127.0.0.1:{port}/x"), &[]).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(body_text(resp).await, "the RTSP server failed\n");
    // An unknown mount.
    let resp = get_with(
        &gw,
        &format!("/rtsp/127.0.0.1:{}/nothing", server.port),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 502);
    assert_eq!(body_text(resp).await, "the RTSP server failed\n");
    // One session at a time: a second URL waits for the first to end.
    let live = get_with(&gw, &format!("/rtsp/127.0.0.1:{}/live", server.port), &[]).await;
    assert_eq!(live.status(), 200);
    let resp = get_with(
        &gw,
        &format!("/rtsp/127.0.0.1:{}/archive", server.port),
        &[],
    )
    .await;
    assert_eq!(resp.status(), 503);
    assert_eq!(
        body_text(resp).await,
        "gateway is at its limit of 1 RTSP sessions\n"
    );
    drop(live);
}

/// Checks every line of a text exposition: comments, or `name{label="value",...} number`
/// where a value holds no raw `"` and only the `\\`, `\"` and `\n` escapes.
fn assert_valid_exposition(text: &str) {
    fn fail(why: &str, line: &str) -> ! {
        panic!("{why} in metrics line {line:?}")
    }
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| fail("no value", line));
        let name = &line[..name_end];
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            fail("bad metric name", line);
        }
        let mut rest = &line[name_end..];
        if let Some(labels) = rest.strip_prefix('{') {
            let mut chars = labels.char_indices();
            loop {
                // A label name, `=`, then a quoted value.
                let mut seen_name = false;
                let next = loop {
                    match chars.next() {
                        Some((_, c)) if c.is_ascii_alphanumeric() || c == '_' => seen_name = true,
                        Some((_, '=')) if seen_name => break '=',
                        Some((_, '}')) if !seen_name => break '}',
                        _ => fail("bad label name", line),
                    }
                };
                if next == '}' {
                    break;
                }
                if !matches!(chars.next(), Some((_, '"'))) {
                    fail("unquoted label value", line);
                }
                loop {
                    match chars.next() {
                        Some((_, '\\')) => {
                            if !matches!(chars.next(), Some((_, '\\' | '"' | 'n'))) {
                                fail("bad escape", line);
                            }
                        }
                        Some((_, '"')) => break,
                        Some((_, '\n' | '\r')) | None => fail("unterminated label value", line),
                        Some(_) => {}
                    }
                }
                match chars.next() {
                    Some((_, ',')) => {}
                    Some((i, '}')) => {
                        rest = &labels[i + 1..];
                        break;
                    }
                    _ => fail("no `,` or `}` after a label value", line),
                }
            }
        }
        let value = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| fail("no space before the value", line));
        if value.parse::<f64>().is_err() {
            fail("bad value", line);
        }
    }
}

/// A hub whose start is refused (here: `max_sessions` reached) leaves none of its series,
/// and a hub's label from the client's path is escaped. Before, each 503 left 16 series named
/// by a path of the client's choosing, for good, and a `"` or `\` in the path broke the scrape.
#[tokio::test]
async fn refused_sessions_leave_no_series_and_labels_are_escaped() {
    // Accepts and never answers: the one session stays in its setup.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = silent.accept().await {
            held.push(tcp);
        }
    });
    let mut cfg = rtsp_config();
    cfg.rtsp.max_sessions = 1;
    cfg.rtsp.timeout_ms = 30_000;
    cfg.rtsp.setup_timeout_ms = 30_000;
    let gw = Gateway::start(cfg).await;
    let _viewer = gw
        .stalled_get(&format!("/rtsp/127.0.0.1:{port}/held\"q\\b\u{e9}"))
        .await;
    let escaped = format!("channel=\"rtsp://127.0.0.1:{port}/held%22q%5Cb%C3%A9\"");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !gw.metrics().contains(&escaped) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no series {escaped}:\n{}",
            gw.metrics()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..8 {
        let path = format!("/rtsp/127.0.0.1:{port}/refused-{i}");
        let resp = get_with(&gw, &path, &[]).await;
        assert_eq!(resp.status(), 503, "{path}");
    }
    let text = gw.metrics();
    assert!(
        !text.contains("refused-"),
        "refused hubs left series:\n{text}"
    );
    // The held hub's 17 series are still there, escaped.
    assert_eq!(text.matches(&escaped).count(), 17, "{text}");
    assert_valid_exposition(&text);
}

/// A client's long path names its hub by a label of bounded length (the path's first 96
/// characters and a hash of the whole), one per path: before, a 20 KiB path was copied into
/// each of the hub's 17 series and rendered at every scrape.
#[tokio::test]
async fn a_long_rtsp_path_gives_a_short_label() {
    // Accepts and never answers: the sessions stay in their setup.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = silent.accept().await {
            held.push(tcp);
        }
    });
    let mut cfg = rtsp_config();
    cfg.rtsp.timeout_ms = 30_000;
    cfg.rtsp.setup_timeout_ms = 30_000;
    let gw = Gateway::start(cfg).await;
    let long: String = (0..20 * 1024)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    // Two channels alike for 20 KiB, apart only in their last character.
    let paths = [format!("/{long}A"), format!("/{long}B")];
    let mut viewers = Vec::new();
    for path in &paths {
        viewers.push(
            gw.stalled_get(&format!("/rtsp/127.0.0.1:{port}{path}"))
                .await,
        );
    }
    let server = format!("channel=\"rtsp://127.0.0.1:{port}/");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while gw.metrics().matches(&server).count() < 2 * 17 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no series {server}:\n{}",
            gw.metrics()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = gw.metrics();
    assert!(
        !text.contains(&long[..200]),
        "the path is in the scrape ({} bytes)",
        text.len()
    );
    // The first 96 characters of the path, then the hash.
    let prefix = format!("channel=\"rtsp://127.0.0.1:{port}{}...#", &paths[0][..96]);
    assert_eq!(text.matches(&prefix).count(), 2 * 17, "{text}");
    let mut labels: Vec<&str> = text
        .match_indices(&prefix)
        .map(|(at, _)| {
            let value = &text[at + "channel=\"".len()..];
            &value[..value.find('"').unwrap()]
        })
        .collect();
    labels.sort_unstable();
    labels.dedup();
    assert_eq!(labels.len(), 2, "{labels:?}");
    for label in &labels {
        assert!(label.len() <= 160, "{label}");
    }
    assert!(
        text.lines().all(|l| l.len() < 512),
        "a long line in:\n{text}"
    );
    assert_valid_exposition(&text);
    drop(viewers);
}

/// Every failure to reach an RTSP server answers the same 502 and body: a name that does not
/// resolve, a port nothing listens on, a server that closes at once, one that speaks another
/// protocol, a DESCRIBE refused. Before, the body told them apart ("cannot resolve", "connection
/// refused", the first bytes of a non-RTSP answer): a port scanner and a map of internal DNS.
#[tokio::test]
async fn rtsp_failures_all_look_the_same() {
    let server = RtspServer::start(&[]);
    let gw = Gateway::start(rtsp_config()).await;
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    // Accepts, then closes without a word.
    let closing = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closing_port = closing.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = closing.accept().await {
            drop(tcp);
        }
    });
    // Answers in another protocol, naming itself.
    let other = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other_port = other.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = other.accept().await {
            let mut buf = [0u8; 1024];
            let _ = tcp.read(&mut buf).await;
            let _ = tcp
                .write_all(b"SSH-2.0-OpenSSH_9.6 build-7.corp.internal\r\n")
                .await;
        }
    });
    let paths = [
        // `.invalid` names fail in the resolver itself (RFC 6761): no query leaves the machine.
        "/rtsp/camera.invalid/x".to_string(),
        format!("/rtsp/127.0.0.1:{refused}/x"),
        format!("/rtsp/127.0.0.1:{closing_port}/x"),
        format!("/rtsp/127.0.0.1:{other_port}/x"),
        format!("/rtsp/127.0.0.1:{}/nothing", server.port),
    ];
    for path in &paths {
        let resp = get_with(&gw, path, &[]).await;
        assert_eq!(resp.status(), 502, "{path}");
        assert_eq!(body_text(resp).await, "the RTSP server failed\n", "{path}");
    }
}

#[tokio::test]
async fn the_address_guard_applies() {
    let server = RtspServer::start(&[]);
    let mut registry = prometheus_client::registry::Registry::default();
    let upstream =
        sluice::upstream::Upstream::new(&sluice::config::UpstreamConfig::default(), &mut registry)
            .unwrap();
    let iptv = sluice::iptv::Iptv::new(rtsp_config(), upstream, &mut registry).unwrap();
    let gw = Gateway::serve(iptv).await;
    // Refused as the media front end refuses a fetch (its `upstream_not_allowed`): 403, the
    // class of the address and never the address; the same for a name and a literal.
    let cases = [
        (
            format!("127.0.0.1:{}", server.port),
            "127.0.0.1",
            "loopback",
        ),
        (
            format!("localhost:{}", server.port),
            "localhost",
            "loopback",
        ),
        ("10.71.0.1:554".to_string(), "10.71.0.1", "private"),
    ];
    for (authority, host, class) in cases {
        let resp = get_with(&gw, &format!("/rtsp/{authority}/live"), &[]).await;
        assert_eq!(resp.status(), 403, "{authority}");
        assert_eq!(
            body_text(resp).await,
            format!(
                "{host} resolves to a {class} address; set upstream.allow_private \
                 (--allow-private-upstreams) to allow it\n"
            )
        );
    }
    assert!(
        server.requests("OPTIONS").is_empty(),
        "nothing may reach a refused host"
    );
}

#[tokio::test]
async fn playlist_entries_offer_catch_up() {
    let playlist = "#EXTM3U\n#EXTINF:-1 tvg-id=\"one\",One\nrtsp://10.1.1.1:554/live/one\n";
    let origin = iptv_support::serve_text(playlist).await;
    let mut cfg = rtsp_config();
    cfg.playlist = Some(format!("http://{origin}/list.m3u"));
    let gw = Gateway::start(cfg).await;
    let text = iptv_support::read_text(gw.get("/playlist.m3u").await).await;
    assert_eq!(
        text,
        "#EXTM3U\n#EXTINF:-1 tvg-id=\"one\" catchup=\"default\" catchup-source=\"http://gw.test/rtsp/10.1.1.1:554/live/one?playseek=${(b)yyyyMMddHHmmss}-${(e)yyyyMMddHHmmss}\",One\nhttp://gw.test/rtsp/10.1.1.1:554/live/one\n"
    );
}

/// The first segment of an `/hls/rtsp/…` playlist, once the playlist lists one.
async fn first_hls_segment(gw: &Gateway, channel: &str, query: &str) -> Vec<u8> {
    let q = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    let resp = get_with(gw, &format!("/hls{channel}/index.m3u8{q}"), &[]).await;
    assert_eq!(resp.status(), 200, "{channel}");
    let text = body_text(resp).await;
    let first = text
        .lines()
        .find(|l| !l.starts_with('#'))
        .unwrap_or_else(|| panic!("no segment listed: {text}"));
    assert_eq!(first, format!("0.ts{q}"), "{text}");
    let resp = get_with(gw, &format!("/hls{channel}/{first}"), &[]).await;
    assert_eq!(resp.status(), 200);
    read_bytes(resp, usize::MAX).await
}

/// An RTSP channel as HLS: one session, segments that are the source's packets after their
/// repeated PAT and PMT; a catch-up URL as HLS starts at the second asked for.
#[tokio::test]
async fn rtsp_channels_and_catch_up_as_hls() {
    let server = RtspServer::start_seekable(&[]);
    let mut cfg = rtsp_config();
    cfg.hls.target_duration_secs = 1;
    let gw = Gateway::start(cfg).await;
    let live = format!("/rtsp/127.0.0.1:{}/live", server.port);
    let seg = first_hls_segment(&gw, &live, "").await;
    let pid = |i: usize| u16::from_be_bytes([seg[i * 188 + 1] & 0x1f, seg[i * 188 + 2]]);
    assert_eq!((pid(0), pid(1)), (0, 0x1000), "PAT and PMT first");
    assert_slice_of_source(&seg[2 * TS_PACKET..]);
    assert_decodes(&seg);
    // Asked again (another viewer): the same session.
    let again = first_hls_segment(&gw, &live, "").await;
    assert_eq!(again, seg);
    assert_eq!(server.requests("PLAY").len(), 1);
    let shift = format!("/rtsp/127.0.0.1:{}/timeshift", server.port);
    let seg = first_hls_segment(&gw, &shift, "playseek=20240101120007-20240101120100").await;
    assert_eq!(first_frame_second(&seg), 7);
}

/// An RTSP catch-up session as HLS keeps the whole programme: an EVENT playlist on the
/// programme's clock while it arrives, VOD with its end once it has, and a seek into it lands
/// on the second asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_session_is_a_seekable_event_then_vod_playlist() {
    let server = RtspServer::start_seekable(&[]);
    let mut cfg = rtsp_config();
    cfg.hls.target_duration_secs = 1;
    cfg.hls.window = 2;
    let gw = Gateway::start(cfg).await;
    let path = format!(
        "/hls/rtsp/127.0.0.1:{}/timeshift/index.m3u8?playseek=20240101120018-20240101120025",
        server.port
    );
    let resp = get_with(&gw, &path, &[]).await;
    assert_eq!(resp.status(), 200);
    let text = body_text(resp).await;
    assert!(
        text.contains("#EXT-X-PLAYLIST-TYPE:EVENT\n")
            && text.contains("#EXT-X-PROGRAM-DATE-TIME:2024-01-01T12:00:18.000Z\n#EXTINF:"),
        "{text}"
    );
    // The programme ends (the recording's end, then no data): the playlist is complete.
    let mut text = text;
    for _ in 0..300 {
        if text.contains("#EXT-X-ENDLIST") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        text = body_text(get_with(&gw, &path, &[]).await).await;
    }
    assert!(text.contains("#EXT-X-ENDLIST\n"), "never complete: {text}");
    assert!(text.contains("#EXT-X-PLAYLIST-TYPE:VOD\n"), "{text}");
    assert!(text.contains("#EXT-X-MEDIA-SEQUENCE:0\n"), "{text}");
    // Every segment from the first, more than the live window of 2.
    let uris: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(uris.len() >= 5, "{text}");
    let query = "?playseek=20240101120018-20240101120025";
    for (i, uri) in uris.iter().enumerate() {
        assert_eq!(*uri, format!("{i}.ts{query}"));
    }
    let total: f64 = text
        .lines()
        .filter_map(|l| l.strip_prefix("#EXTINF:"))
        .map(|d| d.trim_end_matches(',').parse::<f64>().unwrap())
        .sum();
    assert!(
        (6.0..=8.0).contains(&total),
        "7 s of programme, listed {total} s"
    );
    // The programme starts at its first second, and a seek into it lands where asked: 4 s in
    // is its 22nd second.
    let url = format!("http://{}{path}", gw.addr);
    let first = read_bytes(
        get_with(&gw, &path.replace("index.m3u8", "0.ts"), &[]).await,
        usize::MAX,
    )
    .await;
    let seconds = tokio::task::spawn_blocking(move || {
        [
            first_frame_second(&first),
            second_of_hls(&url, 4.0),
            second_of_hls(&url, 5.5),
        ]
    })
    .await
    .unwrap();
    assert_eq!(seconds, [18, 22, 23]);
    // One session for all of it.
    let plays = server.requests("PLAY");
    assert_eq!(plays.len(), 1, "{plays:?}");
}

/// A scripted RTSP server that plays `frames` (interleaved on channel 0) after PLAY, then
/// keeps the connection open.
async fn interleaving_server(frames: Vec<Vec<u8>>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let Ok((mut tcp, _)) = listener.accept().await else {
            return;
        };
        let mut buf = Vec::new();
        let mut chunk = [0u8; 2048];
        loop {
            let Ok(n) = tcp.read(&mut chunk).await else {
                return;
            };
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                buf.drain(..end + 4);
                let cseq = head
                    .lines()
                    .find_map(|l| l.strip_prefix("CSeq: "))
                    .unwrap_or("0")
                    .to_string();
                let sdp = "v=0\r\ns=x\r\nt=0 0\r\nm=video 0 RTP/AVP 33\r\na=control:track1\r\n";
                let reply = match head.split(' ').next() {
                    Some("DESCRIBE") => format!(
                        "RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nContent-Type: application/sdp\r\n\
                         Content-Length: {}\r\n\r\n{sdp}",
                        sdp.len()
                    ),
                    Some("SETUP") => format!(
                        "RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nSession: 42;timeout=60\r\n\
                         Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n\r\n"
                    ),
                    _ => format!("RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nSession: 42\r\n\r\n"),
                };
                if tcp.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                if head.starts_with("PLAY") {
                    for f in &frames {
                        let mut out = vec![b'$', 0];
                        out.extend_from_slice(&(f.len() as u16).to_be_bytes());
                        out.extend_from_slice(f);
                        if tcp.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    port
}

/// Attack: a server sends interleaved frames of up to 64 KiB, which the reorder window would
/// hold in a block each. Frames larger than `max_datagram_bytes` are dropped as malformed; the
/// ordinary ones around them are relayed.
#[tokio::test]
async fn interleaved_frames_beyond_max_datagram_bytes_are_dropped() {
    let small = iptv_support::ts_datagrams(40, 0x100, None);
    let big = iptv_support::ts_datagrams(20, 0x1ee, None);
    let mut frames = Vec::new();
    for i in 0..40 {
        frames.push(iptv_support::rtp(2 * i as u16, &small[i]));
        if i < 20 {
            // 40 TS packets: 7.5 KiB, beyond the default 1536 bytes.
            let payload = big[i].repeat(40 / 7 + 1)[..40 * 188].to_vec();
            frames.push(iptv_support::rtp(2 * i as u16 + 1, &payload));
        }
    }
    let port = interleaving_server(frames).await;
    let gw = Gateway::start(rtsp_config()).await;
    let out = stream(&gw, &format!("/rtsp/127.0.0.1:{port}/live"), 40 * 7 * 188).await;
    assert_eq!(out.len(), 40 * 7 * 188, "every ordinary frame relayed");
    let pids: std::collections::HashSet<u16> = out
        .chunks_exact(188)
        .map(|p| u16::from_be_bytes([p[1], p[2]]) & 0x1fff)
        .collect();
    assert_eq!(pids, [0x100].into(), "no byte of an oversized frame");
    let metrics = gw.metrics();
    let malformed = metrics
        .lines()
        .find(|l| l.starts_with("iptv_malformed_total{") && l.contains(&format!("{port}/live")))
        .unwrap_or_else(|| panic!("no malformed series:\n{metrics}"));
    assert!(malformed.ends_with(" 20"), "{malformed}");
}

/// A scripted RTSP server for the session-place tests: answers each request `delay` after it
/// arrives (PLAY and TEARDOWN as its `Script` says) and, once playing, sends a TS datagram
/// every 20 ms. It logs each request line as it arrives, the session each SETUP was given
/// and each TEARDOWN named, and counts the connections open now and the most open at once.
struct PacedServer {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    /// `(URL, Session header)` of each SETUP answered and each TEARDOWN received.
    sessions: Arc<Mutex<Sessions>>,
    open: Arc<std::sync::atomic::AtomicUsize>,
    peak: Arc<std::sync::atomic::AtomicUsize>,
}

#[derive(Default)]
struct Sessions {
    set_up: Vec<(String, String)>,
    torn_down: Vec<(String, String)>,
}

/// How a `PacedServer` answers.
#[derive(Clone, Copy)]
struct Script {
    delay: Duration,
    /// PLAY's status; `None`: never answered.
    play: Option<u16>,
    /// Whether TEARDOWN is answered.
    teardown: bool,
}

impl PacedServer {
    async fn start(delay: Duration) -> PacedServer {
        Self::scripted(Script {
            delay,
            play: Some(200),
            teardown: false,
        })
        .await
    }

    async fn scripted(script: Script) -> PacedServer {
        Self::scripted_at("127.0.0.1", script).await
    }

    /// On another loopback address (another server host to the gateway).
    async fn scripted_at(ip: &str, script: Script) -> PacedServer {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let sessions = Arc::new(Mutex::new(Sessions::default()));
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (log, seen, count, most) = (
            requests.clone(),
            sessions.clone(),
            open.clone(),
            peak.clone(),
        );
        tokio::spawn(async move {
            let mut id = 0;
            while let Ok((tcp, _)) = listener.accept().await {
                let (log, seen, count) = (log.clone(), seen.clone(), count.clone());
                let now = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                // A session id of its own per connection.
                id += 1;
                let session = format!("{}{id}", 4200 + port);
                tokio::spawn(async move {
                    paced_session(tcp, script, session, log, seen).await;
                    count.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
        });
        PacedServer {
            port,
            requests,
            sessions,
            open,
            peak,
        }
    }

    fn saw(&self, line: &str) -> bool {
        self.requests.lock().unwrap().iter().any(|l| l == line)
    }

    fn count(&self, method: &str) -> usize {
        let requests = self.requests.lock().unwrap();
        requests.iter().filter(|l| l.starts_with(method)).count()
    }

    fn open(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn peak(&self) -> usize {
        self.peak.load(std::sync::atomic::Ordering::SeqCst)
    }
}

async fn paced_session(
    tcp: TcpStream,
    script: Script,
    session: String,
    log: Arc<Mutex<Vec<String>>>,
    seen: Arc<Mutex<Sessions>>,
) {
    let (mut rd, mut wr) = tcp.into_split();
    let payload = iptv_support::ts_datagrams(1, 0x100, None).remove(0);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 2048]);
    let (mut playing, mut seq) = (false, 0u16);
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            let line = head.lines().next().unwrap_or("");
            let line = line.trim_end_matches(" RTSP/1.0").to_string();
            log.lock().unwrap().push(line.clone());
            let field = |name: &str| {
                head.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or_default()
                    .to_string()
            };
            let url = line.split(' ').nth(1).unwrap_or_default().to_string();
            if head.starts_with("TEARDOWN") {
                seen.lock()
                    .unwrap()
                    .torn_down
                    .push((url.clone(), field("Session: ")));
                if !script.teardown {
                    continue;
                }
            }
            if head.starts_with("PLAY") && script.play.is_none() {
                continue;
            }
            tokio::time::sleep(script.delay).await;
            let cseq = field("CSeq: ");
            let sdp = "v=0\r\ns=x\r\nt=0 0\r\nm=video 0 RTP/AVP 33\r\na=control:track1\r\n";
            let reply = match head.split(' ').next() {
                Some("DESCRIBE") => format!(
                    "RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nContent-Type: application/sdp\r\n\
                     Content-Length: {}\r\n\r\n{sdp}",
                    sdp.len()
                ),
                Some("SETUP") => {
                    seen.lock().unwrap().set_up.push((url, session.clone()));
                    format!(
                        "RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nSession: {session};timeout=60\r\n\
                         Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n\r\n"
                    )
                }
                Some("PLAY") => {
                    let status = script.play.unwrap_or(200);
                    format!(
                        "RTSP/1.0 {status} Scripted\r\nCSeq: {cseq}\r\nSession: {session}\r\n\r\n"
                    )
                }
                _ => format!("RTSP/1.0 200 OK\r\nCSeq: {cseq}\r\nSession: {session}\r\n\r\n"),
            };
            if wr.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
            playing |= head.starts_with("PLAY") && script.play == Some(200);
        }
        tokio::select! {
            n = rd.read(&mut chunk) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            },
            _ = tick.tick(), if playing => {
                let packet = iptv_support::rtp(seq, &payload);
                seq = seq.wrapping_add(1);
                let mut out = vec![b'$', 0];
                out.extend_from_slice(&(packet.len() as u16).to_be_bytes());
                out.extend_from_slice(&packet);
                if wr.write_all(&out).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// `GET path` straight to the gateway's handler as the client at `peer`; `None` when no
/// answer came within `wait` (the request is dropped then: the client hung up).
async fn rtsp_as(
    gw: &Gateway,
    peer: &str,
    path: &str,
    wait: Duration,
) -> Option<http::Response<sluice::body::Body>> {
    let (mut parts, ()) = http::Request::get(path)
        .header("host", "gw.test")
        .body(())
        .unwrap()
        .into_parts();
    parts
        .extensions
        .insert(peer.parse::<std::net::SocketAddr>().unwrap());
    tokio::time::timeout(wait, gw.iptv.handle(parts)).await.ok()
}

/// The first data frame of `resp` within 5 s.
async fn first_frame(resp: http::Response<sluice::body::Body>) -> Bytes {
    let mut body = resp.into_body();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("data within 5 s")
            .expect("a frame")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            return data;
        }
    }
}

/// The session places and the shares of a zapping test: 4 places, 2 per client.
fn zapping_config() -> IptvConfig {
    let mut cfg = rtsp_config();
    cfg.rtsp.max_sessions = 4;
    cfg.max_subscribers_per_client = 2;
    cfg
}

/// Attack: one client asks for channel after channel of a server that answers each RTSP step
/// just inside `timeout_ms`, hanging up on each. At its share (2) each request releases its
/// oldest setup; that setup kept its session place until it had run its course (four slow
/// steps, then a TEARDOWN), off the client's share, so four requests filled `max_sessions` and
/// every other client got 503. A released setup is dropped and its place given back at once.
#[tokio::test]
async fn zapping_through_slow_setups_leaves_session_places_to_others() {
    let server = PacedServer::start(Duration::from_millis(1500)).await;
    let port = server.port;
    let gw = Gateway::start(zapping_config()).await;
    let mut answered = Vec::new();
    for i in 0..6 {
        let path = format!("/rtsp/127.0.0.1:{port}/zap{i}");
        // Still setting up: the request is dropped unanswered.
        let resp = rtsp_as(&gw, "127.0.0.1:40000", &path, Duration::from_millis(200)).await;
        if let Some(resp) = resp {
            answered.push((i, resp.status().as_u16()));
        }
    }
    let path = format!("/rtsp/127.0.0.1:{port}/other");
    // Another client: its setup starts (the server sees its request), and nothing refuses it
    // while the server takes its time.
    let resp = rtsp_as(&gw, "127.0.0.2:40000", &path, Duration::from_secs(2)).await;
    if let Some(resp) = resp {
        let status = resp.status();
        let body = BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
        panic!("another client refused: {status} {body:?}");
    }
    assert!(
        server.saw(&format!("OPTIONS rtsp://127.0.0.1:{port}/other")),
        "the other client's session never reached the server: {:?}",
        server.requests.lock().unwrap()
    );
    // The released setups' connections are closed, not left to run their course: the last
    // two of the zapping client (its share) and the other client's are all still open.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    while server.open() > 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let open = server.open();
    assert!(open <= 3, "{open} connections still open at the server");
    // Nor was the zapping client itself refused: its setups were all still going.
    assert_eq!(answered, [], "answers to the zapping client");
}

/// Attack: one client zaps through playing channels of a server that never answers TEARDOWN.
/// Each release tore its session down holding its session place for up to `timeout_ms`, off
/// the client's share, so a few quick zaps filled `max_sessions` for everyone. The place goes
/// back before the TEARDOWN, which is still sent.
#[tokio::test]
async fn zapping_past_slow_teardowns_leaves_session_places_to_others() {
    let server = PacedServer::start(Duration::ZERO).await;
    let port = server.port;
    let mut cfg = zapping_config();
    // Left channels stay on the client's share until released by its next ones.
    cfg.linger_ms = 10_000;
    let gw = Gateway::start(cfg).await;
    let mut statuses = Vec::new();
    for i in 0..5 {
        let path = format!("/rtsp/127.0.0.1:{port}/play{i}");
        let resp = rtsp_as(&gw, "127.0.0.1:40000", &path, Duration::from_secs(5))
            .await
            .expect("an answer within 5 s");
        statuses.push(resp.status().as_u16());
        if resp.status() == 200 {
            first_frame(resp).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let path = format!("/rtsp/127.0.0.1:{port}/other");
    let resp = rtsp_as(&gw, "127.0.0.2:40000", &path, Duration::from_secs(5))
        .await
        .expect("an answer within 5 s");
    assert_eq!(resp.status(), 200, "another client's channel");
    let data = first_frame(resp).await;
    assert!(
        !data.is_empty() && data.len() % 188 == 0 && data[0] == 0x47,
        "{} bytes of TS",
        data.len()
    );
    assert_eq!(statuses, [200; 5], "the zapping client's own channels");
    // The released sessions were still torn down.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while server.count("TEARDOWN") < 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        server.count("TEARDOWN"),
        3,
        "{:?}",
        server.requests.lock().unwrap()
    );
}

/// Attack: a client zaps through playing channels of a server that takes each TEARDOWN and
/// never answers it. Each TEARDOWN held its connection for `timeout_ms`, with no limit on how
/// many at once: one open connection per zap, as many as the client could zap. At most
/// `MAX_TEARDOWNS` are in flight, `MAX_TEARDOWNS_PER_SERVER` of them to one server (one silent
/// server held all sixteen, and the sessions other clients left on servers that answer were
/// never torn down); past them the connection is only closed, and zapping goes on playing.
#[tokio::test]
async fn teardowns_a_server_never_answers_are_bounded() {
    use sluice::iptv::rtsp::{MAX_TEARDOWNS, MAX_TEARDOWNS_PER_SERVER};
    let server = PacedServer::start(Duration::ZERO).await;
    let port = server.port;
    // Another host: the per-server places count a server by its IP address.
    let polite = PacedServer::scripted_at(
        "127.0.0.2",
        Script {
            delay: Duration::ZERO,
            play: Some(200),
            teardown: true,
        },
    )
    .await;
    let mut cfg = rtsp_config();
    // No share, so no start rate: the client zaps as fast as it can (many clients could).
    cfg.max_subscribers_per_client = 0;
    // Every unanswered TEARDOWN outlives the test.
    cfg.rtsp.timeout_ms = 30_000;
    cfg.rtsp.setup_timeout_ms = 30_000;
    // A channel left is released at once.
    cfg.linger_ms = 0;
    let gw = Gateway::start(cfg).await;
    let zaps = MAX_TEARDOWNS + 8;
    let play = |path: String, client: &'static str| {
        let gw = &gw;
        async move {
            let resp = rtsp_as(gw, client, &path, Duration::from_secs(5))
                .await
                .expect("an answer within 5 s");
            assert_eq!(resp.status(), 200, "{path}");
            let data = first_frame(resp).await;
            assert!(
                !data.is_empty() && data.len() % 188 == 0 && data[0] == 0x47,
                "{path}: {} bytes of TS",
                data.len()
            );
        }
    };
    for i in 0..zaps {
        play(format!("/rtsp/127.0.0.1:{port}/zap{i}"), "127.0.0.1:40000").await;
    }
    // Every TEARDOWN that got a place has reached the server; the rest were never sent.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while server.count("TEARDOWN") < MAX_TEARDOWNS_PER_SERVER
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The TEARDOWNs waiting, the channel playing and the next one's setup, at most.
    let peak = server.peak();
    assert!(
        peak <= MAX_TEARDOWNS_PER_SERVER + 2,
        "{peak} connections open at once for {zaps} zaps"
    );
    assert!(
        server.open() <= MAX_TEARDOWNS_PER_SERVER + 1,
        "{} open",
        server.open()
    );
    assert_eq!(
        server.count("TEARDOWN"),
        MAX_TEARDOWNS_PER_SERVER,
        "TEARDOWNs sent"
    );
    // Another client's channels on a server that answers are still torn down when left.
    let polite_port = polite.port;
    for i in 0..2 {
        play(
            format!("/rtsp/127.0.0.2:{polite_port}/left{i}"),
            "127.0.0.2:40000",
        )
        .await;
    }
    for i in 0..2 {
        assert!(
            torn_down(&polite, &format!("left{i}"), Duration::from_secs(3)).await,
            "left{i} not torn down: {:?}",
            polite.requests.lock().unwrap()
        );
    }
}

/// `GET path` over a connection of its own from the source address `ip` (any of 127/8).
async fn get_from_ip(gw: &Gateway, ip: &str, path: &str) -> Response<Incoming> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    let tcp = socket.connect(gw.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "gw.test")
        .body(Empty::<Bytes>::new())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("response head within 10 s")
        .unwrap()
}

/// Attack: a client asks for RTSP channel after channel and hangs up on each. Multicast starts
/// were bounded per client in rate, RTSP ones not: at its share each request released its
/// oldest channel at once, so the client made the gateway open (and tear down) one session
/// per request, as fast as it could ask. RTSP starts now take from the same bucket: after a
/// burst of 8 (the share is 2), the next is a 429 with `Retry-After`, and the server never
/// hears of it; another client still plays.
#[tokio::test]
async fn rtsp_starts_are_bounded_per_client_in_rate() {
    let server = PacedServer::start(Duration::ZERO).await;
    let port = server.port;
    let mut cfg = rtsp_config();
    cfg.max_subscribers_per_client = 2;
    let gw = Gateway::start(cfg).await;
    let (mut statuses, mut refused) = (Vec::new(), None);
    // Eight starts, then one every second: 16 requests would take 8 s to pass.
    for i in 0..16 {
        let resp = get_from_ip(&gw, "127.0.0.1", &format!("/rtsp/127.0.0.1:{port}/zap{i}")).await;
        statuses.push(resp.status().as_u16());
        if resp.status() != 200 {
            refused = Some((i, resp));
            break;
        }
        // Hung up on once answered.
    }
    let (i, resp) = refused.unwrap_or_else(|| panic!("never refused: {statuses:?}"));
    assert!(i >= 8, "refused within the burst: {statuses:?}");
    assert_eq!(resp.status(), 429, "{statuses:?}");
    let retry_after: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After: {retry_after}");
    let body = body_text(resp).await;
    assert!(
        body.contains("this client is starting new channels too fast"),
        "{body}"
    );
    assert!(
        !server.saw(&format!("OPTIONS rtsp://127.0.0.1:{port}/zap{i}")),
        "the refused start reached the server"
    );
    // Another client (another address) is not held back by the first one's starts.
    let resp = get_from_ip(&gw, "127.0.0.2", &format!("/rtsp/127.0.0.1:{port}/other")).await;
    assert_eq!(resp.status(), 200, "another client's channel");
    let data = read_bytes(resp, TS_PACKET).await;
    assert!(
        data.len() >= TS_PACKET && data[0] == 0x47,
        "{} bytes",
        data.len()
    );
    let refused = gw
        .metrics()
        .lines()
        .find(|l| l.starts_with("iptv_refused_total{") && l.contains("max_per_client"))
        .map(str::to_string);
    assert!(
        refused.as_deref().is_some_and(|l| l.ends_with(" 1")),
        "{refused:?}"
    );
}

/// A player retrying a dead `/rtsp/` channel: a port that refuses, a name that does not
/// resolve. Each request took a start from its client's bucket when its hub was made, though
/// its session never reached a server (a multicast join that fails before sending anything
/// takes none), so past the burst (8) the household's retries, and its next real channel,
/// were 429. A setup that never connected gives its start back: 12 such failures (past the
/// burst, within what the refund bucket and the start bucket cover together) are each the
/// same 502. A setup that connected (a server that closes at once) still spends its start:
/// past the burst it is refused.
#[tokio::test]
async fn setups_that_reach_no_server_spend_no_start() {
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    let closing = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closing_port = closing.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = closing.accept().await {
            drop(tcp);
        }
    });
    let mut cfg = rtsp_config();
    cfg.max_subscribers_per_client = 2;
    let gw = Gateway::start(cfg).await;
    let mut statuses = Vec::new();
    for i in 0..12 {
        // `.invalid` names fail in the resolver itself (RFC 6761): no query leaves the machine.
        let path = match i % 2 {
            0 => format!("/rtsp/127.0.0.1:{refused}/dead{i}"),
            _ => format!("/rtsp/camera.invalid/dead{i}"),
        };
        let resp = get_from_ip(&gw, "127.0.0.1", &path).await;
        statuses.push(resp.status().as_u16());
        let status = resp.status();
        let body = body_text(resp).await;
        assert_eq!(
            (status.as_u16(), body.as_str()),
            (502, "the RTSP server failed\n"),
            "request {i}: {statuses:?}"
        );
    }
    // Connected, then failed: spent, so refused past the burst.
    let mut statuses = Vec::new();
    for i in 0..16 {
        let path = format!("/rtsp/127.0.0.1:{closing_port}/closed{i}");
        let resp = get_from_ip(&gw, "127.0.0.2", &path).await;
        statuses.push(resp.status().as_u16());
        if resp.status() == 429 {
            break;
        }
        assert_eq!(resp.status(), 502, "{statuses:?}");
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    assert!(statuses.len() > 8, "refused within the burst: {statuses:?}");
}

/// Attack: setups that reach no server gave their start back at any rate, so a client asking
/// for `/rtsp/` paths on a port that refuses (a reset in one round trip) was never refused:
/// each request a connection attempt to an address and port of its choosing (a free port
/// scanner), each a failure kept a minute. Starts are given back from a second bucket of the
/// start bucket's size and rate: 8 given back, then the start bucket's 8 spent, then 429
/// (Retry-After) before the 40th quick request, and the server's port saw no more attempts.
#[tokio::test]
async fn setups_that_reach_no_server_are_given_back_only_at_the_start_rate() {
    let refused = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    let mut cfg = rtsp_config();
    cfg.max_subscribers_per_client = 2;
    let gw = Gateway::start(cfg).await;
    let mut statuses = Vec::new();
    let mut refused_at = None;
    for i in 0..40 {
        let path = format!("/rtsp/127.0.0.1:{refused}/scan{i}");
        let resp = get_from_ip(&gw, "127.0.0.3", &path).await;
        statuses.push(resp.status().as_u16());
        if resp.status() == 429 {
            refused_at = Some((i, resp));
            break;
        }
        assert_eq!(resp.status(), 502, "request {i}: {statuses:?}");
    }
    let (i, resp) = refused_at.unwrap_or_else(|| panic!("never refused: {} x 502", statuses.len()));
    // The refund bucket's 8, then the start bucket's 8: refills only add to them.
    assert!(
        i >= 16,
        "refused before both buckets were spent: {statuses:?}"
    );
    assert!(resp.headers().contains_key("retry-after"));
    let body = body_text(resp).await;
    assert!(
        body.contains("this client is starting new channels too fast"),
        "{body}"
    );
}

/// Attack: an `/rtsp/` name that resolves to an address the address guard refuses is a 403
/// after the guard's lookup of it, and the refusal spent nothing: a client had the gateway
/// resolve names of its choosing (random names under someone's domain: a DNS flood through
/// the operator's resolver) at any rate. A guard refusal now spends a start (taken before the
/// lookup, so requests at once cannot all pass on one start left): past the burst (8), the
/// 429 of the start rate, with no lookup. `localhost` is a name the resolver answers with
/// loopback, which the guard as deployed refuses.
#[tokio::test]
async fn guard_refusals_spend_a_start() {
    let mut cfg = rtsp_config();
    cfg.max_subscribers_per_client = 2;
    let mut registry = prometheus_client::registry::Registry::default();
    // The guard as deployed: private addresses refused.
    let upstream =
        sluice::upstream::Upstream::new(&sluice::config::UpstreamConfig::default(), &mut registry)
            .unwrap();
    let iptv = sluice::iptv::Iptv::new(cfg, upstream, &mut registry).unwrap();
    let gw = Gateway::serve(iptv).await;
    let peer = "192.0.2.9:40000";
    let wait = Duration::from_secs(10);
    let mut statuses = Vec::new();
    let mut refused = None;
    for i in 0..40 {
        let path = format!("/rtsp/localhost:554/probe{i}");
        let resp = rtsp_as(&gw, peer, &path, wait).await.expect("an answer");
        statuses.push(resp.status().as_u16());
        match resp.status().as_u16() {
            403 => continue,
            429 => {
                refused = Some((i, resp));
                break;
            }
            other => panic!("request {i}: {other}: {statuses:?}"),
        }
    }
    let (i, resp) = refused.unwrap_or_else(|| panic!("never refused: {} x 403", statuses.len()));
    assert!(i >= 8, "refused within the burst: {statuses:?}");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("this client is starting new channels too fast"),
        "{body}"
    );
    // Another client is still told by the guard.
    let resp = rtsp_as(&gw, "192.0.2.10:40000", "/rtsp/localhost:554/probe", wait)
        .await
        .expect("an answer");
    assert_eq!(resp.status(), 403);
}

/// The address guard's check of an `/rtsp/` server resolves the name the client chose, and it
/// ran before the client's bounds were looked at: a client past its start rate still made the
/// gateway resolve a name (of its choosing) per request, only to be refused afterwards. Its
/// bounds now come first, spending nothing: past its rate (spent here on multicast joins, with
/// the guard refusing loopback), an RTSP request for an address the guard refuses is the 429
/// of the rate, not the guard's 403 (the check before which the lookup ran).
#[tokio::test]
async fn a_start_the_rate_refuses_is_refused_before_the_guard_looks_up_its_server() {
    let mut cfg = rtsp_config();
    cfg.max_subscribers_per_client = 1;
    // Each join without data answers 504 at once.
    cfg.no_data_timeout_ms = 50;
    let mut registry = prometheus_client::registry::Registry::default();
    // The guard as deployed: private addresses refused.
    let upstream =
        sluice::upstream::Upstream::new(&sluice::config::UpstreamConfig::default(), &mut registry)
            .unwrap();
    let iptv = sluice::iptv::Iptv::new(cfg, upstream, &mut registry).unwrap();
    let gw = Gateway::serve(iptv).await;
    let peer = "192.0.2.7:40000";
    let wait = Duration::from_secs(10);
    let mut statuses = Vec::new();
    for i in 1..=40 {
        let path = format!("/udp/239.71.77.{i}:46477?iface=lo");
        let resp = rtsp_as(&gw, peer, &path, wait).await.expect("an answer");
        statuses.push(resp.status().as_u16());
        match resp.status().as_u16() {
            504 => continue,
            429 => break,
            other => panic!("join {i}: {other}: {statuses:?}"),
        }
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    // At 1 start every 2 s, the bucket is a start away for over a second now.
    let resp = rtsp_as(&gw, peer, "/rtsp/10.71.0.1:554/live", wait)
        .await
        .expect("an answer");
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, 429, "{body}");
    assert!(
        body.contains("this client is starting new channels too fast"),
        "{body}"
    );
    // Another client is still told by the guard.
    let resp = rtsp_as(&gw, "192.0.2.8:40000", "/rtsp/10.71.0.1:554/live", wait)
        .await
        .expect("an answer");
    assert_eq!(resp.status(), 403);
}

/// The session the server gave the SETUP of `path`, and the sessions TEARDOWN named so far.
fn sessions_of(server: &PacedServer, path: &str) -> (Option<String>, Vec<String>) {
    let sessions = server.sessions.lock().unwrap();
    let given = sessions
        .set_up
        .iter()
        .find(|(url, _)| url.contains(path))
        .map(|(_, id)| id.clone());
    let torn = sessions
        .torn_down
        .iter()
        .map(|(_, id)| id.clone())
        .collect();
    (given, torn)
}

/// Waits up to `wait` for a TEARDOWN naming the session the SETUP of `path` was given.
async fn torn_down(server: &PacedServer, path: &str, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let (Some(id), torn) = sessions_of(server, path) {
            if torn.contains(&id) {
                return true;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client asks for a channel and leaves after the server answered SETUP, before PLAY is
/// answered (this server never answers it), then zaps on: its next channels release the
/// abandoned setup. The server had set up a session for it, and servers that count sessions
/// per subscriber refuse the next SETUP while it stays: it is torn down, by its id, well
/// before the PLAY step would time out (3 s). Its place is not held for the TEARDOWN.
#[tokio::test]
async fn a_setup_left_after_setup_is_torn_down() {
    let server = PacedServer::scripted(Script {
        delay: Duration::ZERO,
        play: None,
        teardown: true,
    })
    .await;
    let port = server.port;
    let mut cfg = zapping_config();
    cfg.rtsp.max_sessions = 3;
    let gw = Gateway::start(cfg).await;
    let path = format!("/rtsp/127.0.0.1:{port}/left");
    let resp = rtsp_as(&gw, "127.0.0.1:40000", &path, Duration::from_millis(300)).await;
    assert!(resp.is_none(), "no answer before PLAY is");
    let (given, torn) = sessions_of(&server, "/left");
    assert!(
        given.is_some(),
        "SETUP answered: {:?}",
        server.requests.lock().unwrap()
    );
    assert_eq!(torn, Vec::<String>::new());
    // Two more channels: the second releases the abandoned setup (the client's share is 2).
    for next in ["next1", "next2"] {
        let path = format!("/rtsp/127.0.0.1:{port}/{next}");
        let _ = rtsp_as(&gw, "127.0.0.1:40000", &path, Duration::from_millis(100)).await;
    }
    assert!(
        torn_down(&server, "/left", Duration::from_millis(1500)).await,
        "no TEARDOWN of the left session: {:?}",
        server.requests.lock().unwrap()
    );
    // And its place was given back: another client's setup starts (3 places: `next1`'s,
    // `next2`'s and this one).
    let path = format!("/rtsp/127.0.0.1:{port}/other");
    let resp = rtsp_as(&gw, "127.0.0.2:40000", &path, Duration::from_millis(300)).await;
    assert!(
        resp.is_none(),
        "another client refused: {:?}",
        resp.map(|r| r.status())
    );
    assert!(server.saw(&format!("OPTIONS rtsp://127.0.0.1:{port}/other")));
}

/// A setup that fails after SETUP (the server refuses PLAY) tears its session down too.
#[tokio::test]
async fn a_setup_failing_after_setup_is_torn_down() {
    let server = PacedServer::scripted(Script {
        delay: Duration::ZERO,
        play: Some(453),
        teardown: true,
    })
    .await;
    let port = server.port;
    let gw = Gateway::start(rtsp_config()).await;
    let path = format!("/rtsp/127.0.0.1:{port}/refused");
    let resp = rtsp_as(&gw, "127.0.0.1:40000", &path, Duration::from_secs(5))
        .await
        .expect("an answer within 5 s");
    assert_eq!(resp.status(), 502);
    assert!(
        torn_down(&server, "/refused", Duration::from_secs(2)).await,
        "no TEARDOWN of the refused session: {:?}",
        server.requests.lock().unwrap()
    );
}

/// The password reaches the RTSP server in no spelling: auth reads `api%5Fpassword` as
/// `api_password` (names are percent-decoded), and so does the gateway when it leaves its own
/// params out of the server's URL. Before, the encoded name was passed on, password and all,
/// in every request line.
#[tokio::test]
async fn an_encoded_password_name_never_reaches_the_server() {
    let server = PacedServer::start(Duration::ZERO).await;
    let port = server.port;
    let gw = Gateway::start(rtsp_config()).await;
    for query in [
        "api%5Fpassword=SECRET-PW&a=1",
        "api%5fpassword=SECRET-PW&a=1",
        "%61pi_password=SECRET-PW&a=1",
    ] {
        let path = format!("/rtsp/127.0.0.1:{port}/ch?{query}");
        let resp = rtsp_as(&gw, "127.0.0.1:40000", &path, Duration::from_secs(5))
            .await
            .expect("an answer within 5 s");
        assert_eq!(resp.status(), 200, "{query}");
        first_frame(resp).await;
    }
    let requests = server.requests.lock().unwrap().clone();
    assert!(
        server.saw(&format!("DESCRIBE rtsp://127.0.0.1:{port}/ch?a=1")),
        "{requests:?}"
    );
    assert!(
        requests.iter().all(|line| !line.contains("SECRET-PW")),
        "the password reached the server: {requests:?}"
    );
}

/// A redirect's `Location` goes into the next server's request line: one holding a bare CR
/// (which ends no header line) or a space would end that line early and add a header or a
/// request of the redirecting server's choosing. It is refused, and the server it names
/// hears nothing.
#[tokio::test]
async fn a_redirect_with_controls_or_spaces_is_refused() {
    let second = PacedServer::start(Duration::ZERO).await;
    let to = format!("rtsp://127.0.0.1:{}", second.port);
    let gw = Gateway::start(rtsp_config()).await;
    for location in [
        format!("{to}/x\rX-Evil: 1"),
        format!("{to}/x X-Evil: 1"),
        format!("{to}/x\tX"),
    ] {
        let front = redirector(location.clone()).await;
        let path = format!("/rtsp/127.0.0.1:{front}/moved");
        let resp = rtsp_as(&gw, "127.0.0.1:40000", &path, Duration::from_secs(5))
            .await
            .expect("an answer within 5 s");
        assert_eq!(resp.status(), 502, "{location:?}");
    }
    assert_eq!(
        *second.requests.lock().unwrap(),
        Vec::<String>::new(),
        "a refused redirect reached its server"
    );
    // A plain one to the same server is followed.
    let front = redirector(format!("{to}/x")).await;
    let path = format!("/rtsp/127.0.0.1:{front}/moved");
    let resp = rtsp_as(&gw, "127.0.0.1:40000", &path, Duration::from_secs(5))
        .await
        .expect("an answer within 5 s");
    assert_eq!(resp.status(), 200);
    assert!(second.saw(&format!("DESCRIBE {to}/x")));
}

/// The head of `GET url` (the body, a live stream, is left unread), or the whole of a short
/// answer's body.
async fn status_of(url: &str) -> (u16, Bytes) {
    let uri: http::Uri = url.parse().unwrap();
    let tcp = TcpStream::connect(uri.authority().unwrap().as_str())
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(uri.path_and_query().unwrap().as_str())
        .header("host", "gw.test")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let status = resp.status().as_u16();
    if status == 200 {
        return (status, Bytes::new());
    }
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// A sealed playlist entry fixes its query; its holder may add catch-up params, but
/// `r2h-seek-name` may not name one the entry fixes: the gateway would read that param as a
/// time and shift it (`ChannelID=1234` + 77 s asked the server for channel 1311) or, in range
/// mode, drop it. Refused as any other override, while naming a param of its own still works.
#[tokio::test]
async fn a_token_holder_cannot_seek_on_a_param_the_token_fixes() {
    const PW: &str = "seek-name-test-password";
    let server = PacedServer::start(Duration::ZERO).await;
    let port = server.port;
    let mut m3u = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(
        &mut m3u,
        format!("#EXTM3U\n#EXTINF:-1,One\nrtsp://127.0.0.1:{port}/iptv?ChannelID=1234\n")
            .as_bytes(),
    )
    .unwrap();
    let mut config = app_support::test_config();
    config.auth.api_password = PW.into();
    config.iptv.playlist = Some(m3u.path().to_str().unwrap().to_string());
    let s = app_support::Sluice::start(config).await;
    let list = app_support::get(&s.url(&format!("/playlist.m3u?api_password={PW}"))).await;
    let text = String::from_utf8(list.body.unwrap().to_vec()).unwrap();
    let entry = text
        .lines()
        .find(|l| l.starts_with("http://"))
        .unwrap()
        .to_string();
    assert!(entry.contains("/_token_"), "{entry}");
    assert!(
        !entry.contains("ChannelID"),
        "the query is inside the token: {entry}"
    );
    let refusal = (401, Bytes::from_static(br#"{"detail":"invalid token"}"#));
    for mode in ["passthrough", "range"] {
        let attack =
            format!("{entry}?r2h-seek-name=ChannelID&r2h-seek-mode={mode}&r2h-seek-offset=77");
        assert_eq!(status_of(&attack).await, refusal, "{attack}");
        // Encoded, the name is the same param.
        let attack = format!("{entry}?r2h-seek-name=Channel%49D&r2h-seek-mode={mode}");
        assert_eq!(status_of(&attack).await, refusal, "{attack}");
    }
    assert_eq!(
        *server.requests.lock().unwrap(),
        Vec::<String>::new(),
        "a refused request reached the server"
    );
    // Naming a catch-up param of the holder's own: served, the entry's channel unchanged.
    let own = format!(
        "{entry}?r2h-seek-name=tvdr&tvdr=1704110400&r2h-seek-mode=passthrough&r2h-seek-offset=77"
    );
    assert_eq!(status_of(&own).await.0, 200, "{own}");
    let requests = server.requests.lock().unwrap().clone();
    assert!(
        server.saw(&format!(
            "DESCRIBE rtsp://127.0.0.1:{port}/iptv?ChannelID=1234&tvdr=1704110477"
        )),
        "{requests:?}"
    );
}

/// `POST /generate_url` with `password`: the sealed URL for `endpoint` with `query_params`.
/// (`/generate_url` is the media proxy's: not in the gateway-only build.)
#[cfg(feature = "media")]
async fn generated_url(
    s: &app_support::Sluice,
    password: &str,
    endpoint: &str,
    query: Value,
) -> String {
    let body = serde_json::json!({
        "mediaflow_proxy_url": s.url(""),
        "endpoint": endpoint,
        "query_params": query,
        "api_password": password,
    });
    let tcp = TcpStream::connect(s.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post("/generate_url")
        .header("host", s.addr.to_string())
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let json: Value = serde_json::from_slice(&bytes).unwrap();
    json["url"].as_str().unwrap().to_string()
}

/// A sealed URL for a programme (`/generate_url` fixing `playseek`) plays that programme only:
/// its holder may not add `r2h-seek-offset` (which shifted the fixed time a day on), nor
/// `r2h-seek-mode` (which moved it out of the URL into a `Range`), nor another seek param by
/// `r2h-seek-name`. Each is the one token refusal and the RTSP server hears nothing; the URL
/// as sealed still plays, its time as fixed.
#[cfg(feature = "media")]
#[tokio::test]
async fn a_token_holder_cannot_shift_a_catch_up_time_the_token_fixes() {
    const PW: &str = "seek-fixed-test-password";
    const TIME: &str = "20240101120000-20240101130000";
    let server = PacedServer::start(Duration::ZERO).await;
    let port = server.port;
    let mut config = app_support::test_config();
    config.auth.api_password = PW.into();
    config.iptv.rtsp.seek_mode = sluice::iptv::rtsp::SeekMode::Passthrough;
    let s = app_support::Sluice::start(config).await;
    let entry = generated_url(
        &s,
        PW,
        &format!("/rtsp/127.0.0.1:{port}/rec"),
        serde_json::json!({ "playseek": TIME }),
    )
    .await;
    assert!(entry.contains("/_token_"), "{entry}");
    assert!(
        !entry.contains("playseek"),
        "the time is inside the token: {entry}"
    );
    let refusal = (401, Bytes::from_static(br#"{"detail":"invalid token"}"#));
    for added in [
        "r2h-seek-offset=86400",
        "r2h-seek-mode=range",
        "r2h-seek-mode=passthrough&r2h-seek-offset=-3600",
        "r2h-seek-name=tvdr&tvdr=20240102120000-20240102130000",
        "tvdr=20240102120000-20240102130000",
    ] {
        let attack = format!("{entry}?{added}");
        assert_eq!(status_of(&attack).await, refusal, "{attack}");
    }
    assert_eq!(
        *server.requests.lock().unwrap(),
        Vec::<String>::new(),
        "a refused request reached the server"
    );
    // As sealed: served, the programme's time in the URL unchanged.
    assert_eq!(status_of(&entry).await.0, 200, "{entry}");
    let requests = server.requests.lock().unwrap().clone();
    assert!(
        server.saw(&format!(
            "DESCRIBE rtsp://127.0.0.1:{port}/rec?playseek={TIME}"
        )),
        "{requests:?}"
    );
}

/// The same with the operator's own catch-up name (`iptv.rtsp.seek_params = ["starttime"]`):
/// a token fixing `starttime` cannot have it shifted by `r2h-seek-offset` (the check knew only
/// `playseek` and `tvdr`), and a channel's token may add `starttime` as it may add `playseek`
/// (a player filling the configured `catchup-source` got the token refusal).
#[cfg(feature = "media")]
#[tokio::test]
async fn a_configured_seek_param_is_a_catch_up_time_for_tokens() {
    const PW: &str = "seek-configured-test-password";
    const TIME: &str = "20240101120000-20240101130000";
    let server = PacedServer::start(Duration::ZERO).await;
    let port = server.port;
    let mut config = app_support::test_config();
    config.auth.api_password = PW.into();
    config.iptv.rtsp.seek_mode = sluice::iptv::rtsp::SeekMode::Passthrough;
    config.iptv.rtsp.seek_params = vec!["starttime".into()];
    let s = app_support::Sluice::start(config).await;
    let programme = generated_url(
        &s,
        PW,
        &format!("/rtsp/127.0.0.1:{port}/rec"),
        serde_json::json!({ "starttime": TIME }),
    )
    .await;
    assert!(!programme.contains("starttime"), "{programme}");
    let refusal = (401, Bytes::from_static(br#"{"detail":"invalid token"}"#));
    for added in ["r2h-seek-offset=86400", "r2h-seek-mode=range"] {
        let attack = format!("{programme}?{added}");
        assert_eq!(status_of(&attack).await, refusal, "{attack}");
    }
    assert_eq!(
        *server.requests.lock().unwrap(),
        Vec::<String>::new(),
        "a refused request reached the server"
    );
    let channel = generated_url(
        &s,
        PW,
        &format!("/rtsp/127.0.0.1:{port}/live"),
        serde_json::json!({}),
    )
    .await;
    let catchup = format!("{channel}?starttime={TIME}");
    assert_eq!(status_of(&catchup).await.0, 200, "{catchup}");
    let requests = server.requests.lock().unwrap().clone();
    assert!(
        server.saw(&format!(
            "DESCRIBE rtsp://127.0.0.1:{port}/live?starttime={TIME}"
        )),
        "{requests:?}"
    );
}

/// A sealed playlist leaves the operator's own catch-up name (`iptv.rtsp.seek_params =
/// ["starttime"]`) outside the token, as it does `playseek`: sealed, the `catchup-source`
/// placeholder reached the gateway as literal text (a 400) and the token fixed the time, so a
/// player could not fill it in either. Filled in, the catch-up plays with the player's time.
#[tokio::test]
async fn a_sealed_catchup_source_keeps_a_configured_seek_param_fillable() {
    const PW: &str = "seek-playlist-test-password";
    const PLACEHOLDER: &str = "${(b)yyyyMMddHHmmss}-${(e)yyyyMMddHHmmss}";
    const TIME: &str = "20240101120000-20240101130000";
    let server = PacedServer::start(Duration::ZERO).await;
    let port = server.port;
    let mut m3u = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(
        &mut m3u,
        format!(
            "#EXTM3U\n#EXTINF:-1 catchup=\"default\" catchup-source=\"rtsp://127.0.0.1:{port}/iptv?ChannelID=7&starttime={PLACEHOLDER}\",One\nrtsp://127.0.0.1:{port}/iptv?ChannelID=7\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut config = app_support::test_config();
    config.auth.api_password = PW.into();
    config.iptv.playlist = Some(m3u.path().to_str().unwrap().to_string());
    config.iptv.rtsp.seek_mode = sluice::iptv::rtsp::SeekMode::Passthrough;
    config.iptv.rtsp.seek_params = vec!["starttime".into()];
    let s = app_support::Sluice::start(config).await;
    let list = app_support::get(&s.url(&format!("/playlist.m3u?api_password={PW}"))).await;
    let text = String::from_utf8(list.body.unwrap().to_vec()).unwrap();
    let extinf = text.lines().find(|l| l.starts_with("#EXTINF")).unwrap();
    let source = extinf
        .split("catchup-source=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no catchup-source: {extinf}"));
    assert!(source.contains("/_token_"), "{source}");
    assert!(
        source.ends_with(&format!("/iptv?starttime={PLACEHOLDER}")),
        "the placeholder stays for the player to fill: {source}"
    );
    assert!(
        !source.contains("ChannelID"),
        "the channel is sealed: {source}"
    );
    let filled = source.replace(PLACEHOLDER, TIME);
    assert_eq!(status_of(&filled).await.0, 200, "{filled}");
    let requests = server.requests.lock().unwrap().clone();
    assert!(
        server.saw(&format!(
            "DESCRIBE rtsp://127.0.0.1:{port}/iptv?ChannelID=7&starttime={TIME}"
        )),
        "{requests:?}"
    );
}
