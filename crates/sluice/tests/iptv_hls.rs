//! HLS output of multicast channels end to end: a real H.264/AAC TS made by ffmpeg, sent as RTP
//! on loopback, read back as `/hls/…` playlists and segments, and decoded by ffmpeg frame by
//! frame against the source. Every join and sender names `lo`.

#[path = "iptv_support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sluice::iptv::IptvConfig;
use sluice_media::mpegts;
use support::*;

fn require_ffmpeg() {
    assert!(
        Command::new("ffmpeg").arg("-version").output().is_ok(),
        "ffmpeg is required: apt-get update && apt-get install -y ffmpeg"
    );
}

/// A temporary directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("sluice-hls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `secs` of 25 fps H.264 (B-frames, a keyframe every `gop` pictures) and AAC in MPEG-TS;
/// `pids` moves the PMT and elementary streams elsewhere (another sender's layout), with
/// timestamps `secs` later (carrying on where the first left off).
fn make_source(out: &Path, secs: u32, gop: u32, pids: Option<(u16, u16)>) -> Vec<u8> {
    let mut cmd = Command::new("ffmpeg");
    cmd.args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg(format!("testsrc2=size=320x240:rate=25:duration={secs}"))
        .args(["-f", "lavfi", "-i"])
        .arg(format!(
            "sine=frequency=440:sample_rate=48000:duration={secs}"
        ))
        .args([
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-pix_fmt",
            "yuv420p",
            "-bf",
            "2",
        ])
        .arg("-x264-params")
        .arg(format!("keyint={gop}:min-keyint={gop}:scenecut=0"))
        .args(["-c:a", "aac", "-b:a", "64k"]);
    if let Some((pmt, first)) = pids {
        // One picture later than the first source's last decoding timestamp.
        cmd.arg("-output_ts_offset")
            .arg(format!("{secs}.08"))
            .arg("-mpegts_pmt_start_pid")
            .arg(pmt.to_string())
            .arg("-mpegts_start_pid")
            .arg(first.to_string());
    }
    let status = cmd.args(["-f", "mpegts"]).arg(out).status().unwrap();
    assert!(status.success(), "ffmpeg made the source");
    std::fs::read(out).unwrap()
}

/// One md5 per decoded frame of the first `kind` stream (`v` or `a`) of `input`.
/// The frames' MD5s of `input` (a file or a URL ffmpeg reads, such as an HLS playlist).
fn frame_hashes(input: impl AsRef<std::ffi::OsStr>, kind: &str) -> Vec<String> {
    let input = input.as_ref();
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(input)
        .arg("-map")
        .arg(format!("0:{kind}:0"))
        .args(["-f", "framemd5", "-"])
        .output()
        .expect("ffmpeg runs");
    assert!(
        out.status.success(),
        "ffmpeg failed on {}: {}",
        input.to_string_lossy(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.rsplit(',').next().unwrap().trim().to_string())
        .collect()
}

fn hls_config(target: u64) -> IptvConfig {
    let mut cfg = config();
    cfg.hls.target_duration_secs = target;
    cfg.hls.window = 30;
    cfg
}

/// Sends `ts` as RTP (7 packets a datagram) from `seq`, off the runtime; returns the next seq.
async fn send(sender: &Sender, ts: &[u8], seq: u16) -> u16 {
    let payloads: Vec<Vec<u8>> = ts.chunks(7 * 188).map(<[u8]>::to_vec).collect();
    let n = payloads.len() as u16;
    let handle = sender.spawn_rtp_paced(payloads, seq, 8);
    tokio::task::spawn_blocking(move || handle.join().unwrap())
        .await
        .unwrap();
    seq.wrapping_add(n)
}

/// A parsed media playlist: header values and `(duration, discontinuity, uri)` per segment.
#[derive(Debug)]
struct Playlist {
    target: u64,
    sequence: u64,
    ended: bool,
    /// `#EXT-X-DISCONTINUITY-SEQUENCE` (0 when absent).
    discontinuity_sequence: u64,
    segments: Vec<(f64, bool, String)>,
}

fn parse_playlist(text: &str) -> Playlist {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("#EXTM3U"), "{text}");
    let mut p = Playlist {
        target: 0,
        sequence: u64::MAX,
        ended: false,
        discontinuity_sequence: 0,
        segments: Vec::new(),
    };
    let (mut duration, mut disc) = (None, false);
    for line in lines {
        if let Some(v) = line.strip_prefix("#EXT-X-TARGETDURATION:") {
            p.target = v.parse().unwrap();
        } else if let Some(v) = line.strip_prefix("#EXT-X-MEDIA-SEQUENCE:") {
            p.sequence = v.parse().unwrap();
        } else if let Some(v) = line.strip_prefix("#EXT-X-DISCONTINUITY-SEQUENCE:") {
            p.discontinuity_sequence = v.parse().unwrap();
        } else if let Some(v) = line.strip_prefix("#EXTINF:") {
            duration = Some(v.trim_end_matches(',').parse::<f64>().unwrap());
        } else if line == "#EXT-X-DISCONTINUITY" {
            disc = true;
        } else if line == "#EXT-X-ENDLIST" {
            p.ended = true;
        } else if !line.starts_with('#') {
            let d = duration.take().expect("EXTINF before every URI");
            p.segments
                .push((d, std::mem::take(&mut disc), line.to_string()));
        }
    }
    assert!(p.target > 0 && p.sequence != u64::MAX, "{text}");
    // Target duration respected (RFC 8216 §4.3.3.1: rounded EXTINF ≤ target).
    for (d, _, uri) in &p.segments {
        assert!(d.round() as u64 <= p.target, "{uri}: {d} s > {}", p.target);
    }
    p
}

/// The playlist once it ends (the sender stopped and the hub timed out), at most 30 s.
async fn ended_playlist(gw: &Gateway, url: &str) -> (Playlist, String) {
    for _ in 0..300 {
        let resp = gw.get(url).await;
        if resp.status() == 200 {
            let text = read_text(resp).await;
            let p = parse_playlist(&text);
            if p.ended {
                return (p, text);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} never ended");
}

/// The segment's head: PAT, PMT (PID `pmt`), then the first packet of a video PES.
fn assert_head(seg: &[u8], pmt: u16, video: u16, what: &str) {
    let pid = |i: usize| mpegts::parse_header(&seg[i * 188..]).unwrap();
    assert_eq!(pid(0).pid, 0, "{what}: PAT first");
    assert_eq!(pid(1).pid, pmt, "{what}: PMT second");
    let third = pid(2);
    assert!(
        third.pid == video && third.payload_unit_start,
        "{what}: then video"
    );
}

/// Whether the first video PES of a segment holds an IDR picture (NAL type 5) before any
/// other slice: the segment decodes on its own.
fn starts_on_idr(seg: &[u8], video: u16) -> bool {
    let mut es = Vec::new();
    for (i, pkt) in seg.chunks_exact(188).enumerate().skip(2) {
        let h = mpegts::parse_header(pkt).unwrap();
        if h.pid != video {
            continue;
        }
        if h.payload_unit_start && i > 2 {
            break;
        }
        let at = if pkt[3] & 0x20 != 0 {
            5 + pkt[4] as usize
        } else {
            4
        };
        es.extend_from_slice(&pkt[at.min(188)..]);
    }
    let mut i = 0;
    while i + 3 < es.len() {
        if es[i..i + 3] == [0, 0, 1] {
            match es[i + 3] & 0x1f {
                5 => return true,
                1 => return false,
                _ => {}
            }
        }
        i += 1;
    }
    false
}

async fn fetch(gw: &Gateway, base: &str, uri: &str) -> Vec<u8> {
    let resp = gw.get(&format!("{base}/{uri}")).await;
    assert_eq!(resp.status(), 200, "{uri}");
    assert_eq!(resp.headers()["content-type"], "video/mp2t");
    read_bytes(resp, usize::MAX).await
}

/// ffmpeg's default PIDs: PMT 0x1000, video 0x100.
const PMT: u16 = 0x1000;
const VIDEO: u16 = 0x100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hls_of_a_multicast_channel_decodes_frame_exactly() {
    require_ffmpeg();
    let dir = Scratch::new("exact");
    let source = make_source(&dir.path("source.ts"), 8, 25, None);
    let gw = Gateway::start(hls_config(2)).await;
    let base = "/hls/rtp/239.255.41.1:5601";
    let url = format!("{base}/index.m3u8?iface=lo");
    // The first request starts the channel and waits for its first segment.
    let first = gw.spawn_get(&url);
    wait_joined("239.255.41.1", true).await;
    let sender = Sender::new("239.255.41.1", 5601);
    send(&sender, &source, 1).await;
    let resp = first.await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "application/vnd.apple.mpegurl"
    );
    let (p, text) = ended_playlist(&gw, &url).await;
    assert_eq!(p.sequence, 0, "{text}");
    assert_eq!(p.target, 2);
    assert_eq!(p.segments.len(), 4, "8 s in 2 s segments: {text}");
    let mut joined = Vec::new();
    for (i, (d, disc, uri)) in p.segments.iter().enumerate() {
        assert_eq!(uri, &format!("{i}.ts?iface=lo"));
        assert!(!disc);
        assert!((d - 2.0).abs() < 0.001, "{text}");
        let seg = fetch(&gw, base, uri).await;
        assert_head(&seg, PMT, VIDEO, uri);
        assert!(starts_on_idr(&seg, VIDEO), "{uri} starts on an IDR picture");
        joined.extend_from_slice(&seg);
    }
    let out = dir.path("hls.ts");
    std::fs::write(&out, &joined).unwrap();
    let (src, got) = (dir.path("source.ts"), out.clone());
    let (want, got) =
        tokio::task::spawn_blocking(move || (frame_hashes(&src, "v"), frame_hashes(&got, "v")))
            .await
            .unwrap();
    assert_eq!(want.len(), 200);
    assert!(
        got == want,
        "decoded video differs from the source ({} frames vs {})",
        got.len(),
        want.len()
    );
    // ffmpeg's own HLS client, reading the gateway's playlist, decodes the same frames.
    let playlist_url = format!("http://{}{url}", gw.addr);
    let via_hls = tokio::task::spawn_blocking(move || frame_hashes(&playlist_url, "v"))
        .await
        .unwrap();
    assert!(
        via_hls == want,
        "ffmpeg via the playlist: {} frames",
        via_hls.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sender_and_new_pids_are_discontinuities() {
    require_ffmpeg();
    let dir = Scratch::new("restart");
    let a = make_source(&dir.path("a.ts"), 4, 25, None);
    let b = make_source(&dir.path("b.ts"), 4, 25, Some((0x1200, 0x300)));
    let gw = Gateway::start(hls_config(2)).await;
    let base = "/hls/udp/239.255.41.2:5602";
    let url = format!("{base}/index.m3u8?iface=lo");
    let first = gw.spawn_get(&url);
    wait_joined("239.255.41.2", true).await;
    let sender = Sender::new("239.255.41.2", 5602);
    let seq = send(&sender, &a, 100).await;
    // The sender restarts (timestamps from the start again) after a pause shorter than the
    // channel's no-data timeout, then another encoder with other PIDs takes over, its clock
    // carrying on (only the new PMT tells).
    tokio::time::sleep(Duration::from_millis(800)).await;
    let seq = send(&sender, &a, seq).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(&sender, &b, seq).await;
    assert_eq!(first.await.unwrap().status(), 200);
    let (p, text) = ended_playlist(&gw, &url).await;
    let discs: Vec<usize> = (0..p.segments.len()).filter(|&i| p.segments[i].1).collect();
    assert_eq!(discs, [2, 4], "{text}");
    assert_eq!(p.segments.len(), 6, "{text}");
    // Each run, its segments concatenated, decodes to its source's pictures exactly.
    let runs = [
        (0..2, "a.ts", PMT, VIDEO),
        (2..4, "a.ts", PMT, VIDEO),
        (4..6, "b.ts", 0x1200, 0x300),
    ];
    for (n, (range, src, pmt, video)) in runs.into_iter().enumerate() {
        let mut joined = Vec::new();
        for (d, _, uri) in &p.segments[range] {
            assert!(*d > 1.0, "{text}");
            let seg = fetch(&gw, base, uri).await;
            assert_head(&seg, pmt, video, uri);
            assert!(starts_on_idr(&seg, video), "{uri}");
            joined.extend_from_slice(&seg);
        }
        let out = dir.path(&format!("run{n}.ts"));
        std::fs::write(&out, &joined).unwrap();
        let src = dir.path(src);
        let (want, got) =
            tokio::task::spawn_blocking(move || (frame_hashes(&src, "v"), frame_hashes(&out, "v")))
                .await
                .unwrap();
        assert!(
            got == want,
            "run {n}: {} frames vs {}",
            got.len(),
            want.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_seconds_without_a_keyframe_still_respects_the_target() {
    require_ffmpeg();
    let dir = Scratch::new("nokey");
    // Keyframes at 0 s and 12 s only.
    let source = make_source(&dir.path("source.ts"), 14, 300, None);
    let gw = Gateway::start(hls_config(2)).await;
    let base = "/hls/rtp/239.255.41.3:5603";
    let url = format!("{base}/index.m3u8?iface=lo");
    let first = gw.spawn_get(&url);
    wait_joined("239.255.41.3", true).await;
    let sender = Sender::new("239.255.41.3", 5603);
    send(&sender, &source, 7).await;
    assert_eq!(first.await.unwrap().status(), 200);
    let (p, text) = ended_playlist(&gw, &url).await;
    // 12 s until the second keyframe, in segments that round to 2 s (parse_playlist checked).
    assert!(p.segments.len() >= 6, "{text}");
    let mut joined = Vec::new();
    let mut idr = Vec::new();
    for (_, disc, uri) in &p.segments {
        assert!(!disc, "{text}");
        let seg = fetch(&gw, base, uri).await;
        assert_head(&seg, PMT, VIDEO, uri);
        idr.push(starts_on_idr(&seg, VIDEO));
        joined.extend_from_slice(&seg);
    }
    assert!(idr[0], "the first segment starts on the first keyframe");
    assert_eq!(idr.iter().filter(|&&k| k).count(), 2, "{idr:?}");
    let out = dir.path("hls.ts");
    std::fs::write(&out, &joined).unwrap();
    let src = dir.path("source.ts");
    let (want, got) =
        tokio::task::spawn_blocking(move || (frame_hashes(&src, "v"), frame_hashes(&out, "v")))
            .await
            .unwrap();
    assert!(got == want, "{} frames vs {}", got.len(), want.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_hls_viewers_and_raw_viewers_share_one_join_and_one_segmenter() {
    require_ffmpeg();
    let dir = Scratch::new("many");
    let source = make_source(&dir.path("source.ts"), 6, 25, None);
    let gw = Gateway::start(hls_config(1)).await;
    let group = "239.255.41.4";
    let url = "/hls/rtp/239.255.41.4:5604/index.m3u8?iface=lo";
    let viewers: Vec<_> = (0..24).map(|_| gw.spawn_get(url)).collect();
    let raw: Vec<_> = (0..2)
        .map(|_| gw.spawn_get("/rtp/239.255.41.4:5604?iface=lo"))
        .collect();
    wait_joined(group, true).await;
    let sender = Sender::new(group, 5604);
    let sending = send(&sender, &source, 1);
    tokio::pin!(sending);
    let mut texts = Vec::new();
    tokio::select! {
        _ = &mut sending => panic!("playlists should be served while the channel plays"),
        _ = async {
            for v in viewers {
                let resp = v.await.unwrap();
                assert_eq!(resp.status(), 200);
                texts.push(read_text(resp).await);
            }
        } => {}
    }
    // One membership, one HLS channel, and three hub subscribers: the segmenter and the two
    // raw-TS viewers (HLS viewers are not subscribers).
    assert_eq!(igmp_memberships(group).len(), 1);
    assert_eq!(gw.iptv.hls_channels(), 1);
    let status = gw.status().await;
    let hubs = status["hubs"].as_array().unwrap();
    assert_eq!(hubs.len(), 1, "{status}");
    assert_eq!(hubs[0]["subscribers"], 3, "{status}");
    for t in &texts {
        let p = parse_playlist(t);
        assert_eq!(p.sequence, 0);
        assert!(!p.segments.is_empty());
    }
    sending.await;
    for r in raw {
        let resp = r.await.unwrap();
        assert_eq!(resp.status(), 200);
    }
}

#[tokio::test]
async fn playlist_entries_switch_to_hls() {
    let m3u = "#EXTM3U\n#EXTINF:-1,X\nrtp://239.5.5.6:1234\n";
    let origin = serve_text(m3u).await;
    let mut cfg = config();
    cfg.playlist = Some(format!("http://{origin}/list.m3u"));
    cfg.playlist_base_url = Some("https://tv.example/".into());
    cfg.hls.playlist = true;
    let gw = Gateway::start(cfg).await;
    let hls = read_text(gw.get("/playlist.m3u").await).await;
    assert_eq!(
        hls,
        "#EXTM3U\n#EXTINF:-1,X\nhttps://tv.example/hls/rtp/239.5.5.6:1234/index.m3u8\n"
    );
    let raw = read_text(gw.get("/playlist.m3u?hls=0").await).await;
    assert_eq!(
        raw,
        "#EXTM3U\n#EXTINF:-1,X\nhttps://tv.example/rtp/239.5.5.6:1234\n"
    );
}

#[tokio::test]
async fn bad_hls_paths_get_clear_answers() {
    let gw = Gateway::start(config()).await;
    for (path, status) in [
        ("/hls/rtp/239.255.41.9:5609/other.txt?iface=lo", 404),
        ("/hls/index.m3u8", 404),
        ("/hls/rtp/10.0.0.1:5609/index.m3u8?iface=lo", 400),
        ("/hls/rtp/239.255.41.9:5609/index.m3u8", 400),
        (
            "/hls/rtp/239.255.41.9:5609/index.m3u8?iface=lo&container=mkv",
            400,
        ),
        ("/hls/rtp/239.255.41.9:5609/init-x.mp4?iface=lo", 404),
    ] {
        let resp = gw.get(path).await;
        assert_eq!(resp.status(), status, "{path}");
    }
    // A query is written on every segment line: a long one is refused, not multiplied.
    let long = format!(
        "/hls/rtp/239.255.41.9:5609/index.m3u8?iface=lo&pad={}",
        "x".repeat(3000)
    );
    let resp = gw.get(&long).await;
    assert_eq!(resp.status(), 400);
    let text = read_text(resp).await;
    assert!(text.contains("longer than 2048 bytes"), "{text}");
    // A channel that sends nothing: 504 after the no-data timeout, with the reason.
    let resp = gw
        .get("/hls/rtp/239.255.41.9:5609/index.m3u8?iface=lo")
        .await;
    assert_eq!(resp.status(), 504);
    let text = read_text(resp).await;
    assert!(
        text.contains("no data from rtp://239.255.41.9:5609"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwatched_hls_channel_stops_and_its_hub_leaves() {
    require_ffmpeg();
    let dir = Scratch::new("linger");
    let source = make_source(&dir.path("source.ts"), 8, 25, None);
    let gw = Gateway::start(hls_config(1)).await;
    let group = "239.255.41.5";
    let url = "/hls/rtp/239.255.41.5:5605/index.m3u8?iface=lo";
    let first = gw.spawn_get(url);
    wait_joined(group, true).await;
    // Real time (8 s of stream over 8 s), so the channel keeps flowing meanwhile.
    let sending = std::thread::spawn(move || {
        let sender = Sender::new(group, 5605);
        let payloads: Vec<&[u8]> = source.chunks(7 * 188).collect();
        let gap = Duration::from_secs(8) / payloads.len() as u32;
        for (i, p) in payloads.iter().enumerate() {
            sender.send_one(&rtp(i as u16, p));
            std::thread::sleep(gap);
        }
    });
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(gw.iptv.hls_channels(), 1);
    // No more requests: after linger_ms (200) plus three target durations the segmenter
    // lets go, and the hub leaves after its own linger, while the sender still sends.
    let asked = std::time::Instant::now();
    wait_joined(group, false).await;
    assert!(asked.elapsed() >= Duration::from_secs(3), "left too early");
    assert!(
        !sending.is_finished(),
        "left because the sender stopped, not for want of viewers"
    );
    assert_eq!(gw.iptv.hls_channels(), 0);
    tokio::task::spawn_blocking(move || sending.join().unwrap())
        .await
        .unwrap();
}

/// `secs` of H.264 whose pictures are flat grey at luma `16 + 8 × second`, muxed at a constant
/// 400 kb/s with no mux delay, so a byte's place in the file is its time in the stream.
fn make_clock_source(out: &Path, secs: u32) -> Vec<u8> {
    let status = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg(format!(
            "nullsrc=size=160x120:rate=25:duration={secs},geq=lum='16+8*floor(T)':cb=128:cr=128"
        ))
        .args([
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-pix_fmt",
            "yuv420p",
        ])
        .args([
            "-x264-params",
            "keyint=25:min-keyint=25:scenecut=0",
            "-b:v",
            "150k",
        ])
        .args([
            "-muxrate",
            "400k",
            "-muxdelay",
            "0",
            "-muxpreload",
            "0",
            "-f",
            "mpegts",
        ])
        .arg(out)
        .status()
        .unwrap();
    assert!(status.success(), "ffmpeg made the clock source");
    std::fs::read(out).unwrap()
}

/// The second of the stream shown `offset` seconds into `segment` (from its luma plane, as
/// coded: no range conversion).
fn second_at(segment: &Path, offset: f64) -> u32 {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(segment)
        .args(["-ss", &format!("{offset:.3}"), "-frames:v", "1"])
        .args(["-f", "rawvideo", "-pix_fmt", "yuv420p", "-"])
        .output()
        .unwrap();
    assert!(
        out.stdout.len() >= 160 * 120,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mean = out.stdout[..160 * 120]
        .iter()
        .map(|&y| f64::from(y))
        .sum::<f64>()
        / (160.0 * 120.0);
    ((mean - 16.0) / 8.0).round() as u32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeshift_channel_is_recorded_and_a_seek_lands_where_asked() {
    require_ffmpeg();
    let dir = Scratch::new("timeshift");
    let source = make_clock_source(&dir.path("clock.ts"), 12);
    let mut cfg = hls_config(1);
    cfg.timeshift.dir = Some(dir.path("shift").to_string_lossy().into_owned());
    cfg.timeshift.minutes = 5;
    cfg.timeshift.channels = vec!["/rtp/239.255.41.6:5606?iface=lo".into()];
    let gw = Gateway::start(cfg).await;
    // Recorded from start-up, before anyone asks.
    wait_joined("239.255.41.6", true).await;
    // Sent in real time from a wall-clock half second, so second k of the stream is on air
    // from S + k + 0.5 to S + k + 1.5.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let s = now.as_secs() + 1;
    let t0 = std::time::UNIX_EPOCH + Duration::from_millis(s * 1000 + 500);
    let sending = std::thread::spawn(move || {
        let sender = Sender::new("239.255.41.6", 5606);
        for (i, p) in source.chunks(7 * 188).enumerate() {
            // 400 kb/s: each datagram's bytes take this long on the wire.
            let due = t0 + Duration::from_micros(i as u64 * 7 * 188 * 8 * 1_000_000 / 400_000);
            if let Ok(wait) = due.duration_since(std::time::SystemTime::now()) {
                std::thread::sleep(wait);
            }
            sender.send_one(&rtp(i as u16, p));
        }
    });
    tokio::task::spawn_blocking(move || sending.join().unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let base = "/hls/rtp/239.255.41.6:5606";
    // The whole window, with wall-clock times.
    let text = read_text(gw.get(&format!("{base}/index.m3u8?iface=lo")).await).await;
    let p = parse_playlist(&text);
    let total: f64 = p.segments.iter().map(|s| s.0).sum();
    assert!((total - 12.0).abs() < 1.1, "{total} s recorded: {text}");
    assert_eq!(
        text.matches("#EXT-X-PROGRAM-DATE-TIME:").count(),
        p.segments.len()
    );
    // Catch-up from S + 6 to S + 9: lands in second 5 of the stream, half a second in.
    let seek = format!("{base}/index.m3u8?iface=lo&playseek={}-{}", s + 6, s + 9);
    let resp = gw.get(&seek).await;
    assert_eq!(resp.status(), 200);
    let text = read_text(resp).await;
    let p = parse_playlist(&text);
    assert!(
        p.ended && text.contains("#EXT-X-PLAYLIST-TYPE:VOD"),
        "{text}"
    );
    let offset: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("#EXT-X-START:TIME-OFFSET="))
        .and_then(|v| v.split(',').next())
        .expect("a start offset")
        .parse()
        .unwrap();
    assert!((3..=5).contains(&p.segments.len()), "{text}");
    let first = fetch(&gw, base, &p.segments[0].2).await;
    assert_head(&first, PMT, VIDEO, "first catch-up segment");
    let path = dir.path("first.ts");
    std::fs::write(&path, &first).unwrap();
    let second = tokio::task::spawn_blocking(move || second_at(&path, offset))
        .await
        .unwrap();
    assert_eq!(second, 5, "{text}");
    // Before the window: refused with what the window holds.
    let resp = gw
        .get(&format!("{base}/index.m3u8?iface=lo&playseek={}", s - 600))
        .await;
    assert_eq!(resp.status(), 404);
    assert!(read_text(resp)
        .await
        .contains("outside the timeshift window"));
    // The window is kept as TS: no fMP4 form of it.
    let resp = gw
        .get(&format!("{base}/index.m3u8?iface=lo&container=fmp4"))
        .await;
    assert_eq!(resp.status(), 400);
    assert!(read_text(resp).await.contains("kept as TS"));
    // The segments are on disk.
    let files = std::fs::read_dir(dir.path("shift"))
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .count();
    assert!(files >= 11, "{files} files");
}

/// A timeshift segment that has left the memory window is served from its file on disk, read
/// as it is sent: byte for byte what was recorded, at the length announced, though it is
/// larger than one read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_timeshift_segment_is_served_from_disk_byte_exact() {
    use sha2::Digest;
    require_ffmpeg();
    let dir = Scratch::new("timeshift-disk");
    let source = make_source(&dir.path("source.ts"), 12, 25, None);
    let mut cfg = hls_config(2);
    // Three segments in memory: the older ones are on disk only.
    cfg.hls.window = 2;
    cfg.timeshift.dir = Some(dir.path("shift").to_string_lossy().into_owned());
    cfg.timeshift.channels = vec!["/rtp/239.255.41.20:5620?iface=lo".into()];
    let gw = Gateway::start(cfg).await;
    wait_joined("239.255.41.20", true).await;
    let sender = Sender::new("239.255.41.20", 5620);
    send(&sender, &source, 1).await;
    let base = "/hls/rtp/239.255.41.20:5620";
    let url = format!("{base}/index.m3u8?iface=lo");
    let mut listed = None;
    for _ in 0..300 {
        let resp = gw.get(&url).await;
        if resp.status() == 200 {
            let p = parse_playlist(&read_text(resp).await);
            if p.segments.len() >= 5 {
                listed = Some(p);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let p = listed.expect("five segments recorded");
    let channel_dir = std::fs::read_dir(dir.path("shift"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let sha = |b: &[u8]| format!("{:x}", sha2::Sha256::digest(b));
    for (_, _, uri) in &p.segments[..2] {
        let n = uri.split('.').next().unwrap();
        let on_disk = std::fs::read(channel_dir.join(format!("{n}.ts"))).unwrap();
        assert!(on_disk.len() > 64 << 10, "{uri}: {} bytes", on_disk.len());
        let resp = gw.get(&format!("{base}/{uri}")).await;
        assert_eq!(resp.status(), 200, "{uri}");
        assert_eq!(resp.headers()["content-type"], "video/mp2t");
        assert_eq!(
            resp.headers()["content-length"],
            on_disk.len().to_string().as_str()
        );
        let served = read_bytes(resp, usize::MAX).await;
        assert_eq!(sha(&served), sha(&on_disk), "{uri}");
        assert_head(&served, PMT, VIDEO, uri);
        // HEAD: the length, no body.
        let resp = head(gw.addr, &format!("{base}/{uri}")).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["content-length"],
            on_disk.len().to_string().as_str()
        );
    }
    // Past the window: 404 as before.
    let resp = gw.get(&format!("{base}/999999.ts?iface=lo")).await;
    assert_eq!(resp.status(), 404);
}

/// Unix milliseconds of the first `#EXT-X-PROGRAM-DATE-TIME` of a playlist
/// (`2024-01-01T12:00:03.123Z`).
fn first_date_time(text: &str) -> i64 {
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("#EXT-X-PROGRAM-DATE-TIME:"))
        .expect("a date-time");
    let n = |r: std::ops::Range<usize>| v[r].parse::<i64>().unwrap();
    let days = sluice_media::civil::days_from_civil(n(0..4), n(5..7), n(8..10));
    ((days * 24 + n(11..13)) * 60 + n(14..16)) * 60_000 + n(17..19) * 1000 + n(20..23)
}

/// The media sequence numbers of a playlist's segments (`<n>.ts?...`).
fn numbers(p: &Playlist) -> Vec<u64> {
    p.segments
        .iter()
        .map(|(_, _, uri)| uri.split('.').next().unwrap().parse().unwrap())
        .collect()
}

/// A catch-up range of a timeshift channel (`playseek=` from a time inside the window, no end)
/// is an EVENT playlist; once its first segment has left the window (`max_bytes`), a player's
/// reload of the same URL was answered 404 and playback stopped. Every reload is answered:
/// the rest of the range as a live playlist (no EVENT type: an EVENT playlist never loses a
/// segment), its media sequence moving on with the window, each reload going on from the one
/// before, and what it lists fetches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeshift_range_whose_start_left_the_window_still_reloads() {
    require_ffmpeg();
    let dir = Scratch::new("timeshift-slide");
    // About 100 KB a second: 1 MiB of window is about ten one-second segments.
    let source = make_source(&dir.path("source.ts"), 24, 25, None);
    let mut cfg = hls_config(1);
    cfg.timeshift.dir = Some(dir.path("shift").to_string_lossy().into_owned());
    cfg.timeshift.minutes = 5;
    cfg.timeshift.max_bytes = 1 << 20;
    cfg.timeshift.channels = vec!["/rtp/239.255.41.40:5640?iface=lo".into()];
    let gw = Gateway::start(cfg).await;
    wait_joined("239.255.41.40", true).await;
    let sender = Sender::new("239.255.41.40", 5640);
    let base = "/hls/rtp/239.255.41.40:5640";
    let window_url = format!("{base}/index.m3u8?iface=lo");
    // Sent a datagram-aligned chunk at a time; each is waited for until the window has a
    // segment more.
    let chunk = 7 * 188 * (source.len() / (7 * 188) / 12);
    let mut chunks = source.chunks(chunk);
    let mut seq = 1;
    let mut newest = None;
    let mut next_chunk = async |seq: &mut u16, newest: &mut Option<u64>| -> bool {
        let Some(c) = chunks.next() else {
            return false;
        };
        *seq = send(&sender, c, *seq).await;
        for _ in 0..300 {
            let resp = gw.get(&window_url).await;
            if resp.status() == 200 {
                let p = parse_playlist(&read_text(resp).await);
                let last = numbers(&p).last().copied();
                if last.is_some() && last > *newest {
                    *newest = last;
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("no segment recorded after a chunk");
    };
    for _ in 0..2 {
        assert!(next_chunk(&mut seq, &mut newest).await);
    }
    // A range from a second inside the first segment recorded or the next, no end: EVENT.
    let text = read_text(gw.get(&window_url).await).await;
    let begin = first_date_time(&text).div_euclid(1000) + 1;
    let range = format!("{base}/index.m3u8?iface=lo&playseek={begin}");
    let resp = gw.get(&range).await;
    assert_eq!(resp.status(), 200);
    let text = read_text(resp).await;
    assert!(text.contains("#EXT-X-PLAYLIST-TYPE:EVENT\n"), "{text}");
    let first = parse_playlist(&text);
    assert!(!first.ended, "{text}");
    let mut before = first;
    let mut slid = 0;
    while next_chunk(&mut seq, &mut newest).await {
        let resp = gw.get(&range).await;
        let status = resp.status();
        let text = read_text(resp).await;
        assert_eq!(status, 200, "a reload of the range: {text}");
        let p = parse_playlist(&text);
        let listed = numbers(&p);
        // The media sequence is the first segment's, the segments follow on from it.
        assert_eq!(listed[0], p.sequence, "{text}");
        assert!(
            listed.windows(2).all(|w| w[1] == w[0] + 1),
            "consecutive: {text}"
        );
        // It goes on from the reload before: never back, no segment skipped, more at the end.
        let had = numbers(&before);
        assert!(p.sequence >= before.sequence, "{text}");
        assert!(
            p.sequence <= *had.last().unwrap() + 1,
            "a gap after {had:?}: {text}"
        );
        assert!(listed.last() > had.last(), "{text}");
        assert!(p.discontinuity_sequence >= before.discontinuity_sequence);
        assert!(!p.ended, "{text}");
        if p.sequence > before.sequence || slid > 0 {
            // Its start has left: a live window, not an EVENT one that lost segments.
            assert!(!text.contains("#EXT-X-PLAYLIST-TYPE"), "{text}");
            assert!(!text.contains("#EXT-X-START"), "{text}");
            slid += 1;
            for n in [listed[0], *listed.last().unwrap()] {
                let seg = fetch(&gw, base, &format!("{n}.ts?iface=lo")).await;
                assert_head(&seg, PMT, VIDEO, &format!("segment {n}"));
            }
        } else {
            assert!(text.contains("#EXT-X-PLAYLIST-TYPE:EVENT\n"), "{text}");
        }
        before = p;
    }
    assert!(
        slid >= 3,
        "the range's start left the window {slid} reloads before the end"
    );
    // A range that began before anything this channel held is still refused.
    let resp = gw
        .get(&format!(
            "{base}/index.m3u8?iface=lo&playseek={}",
            begin - 600
        ))
        .await;
    assert_eq!(resp.status(), 404);
}

/// Sends `ts` as RTP over about `secs` seconds (a live sender), from a thread.
fn send_live(
    group: &'static str,
    port: u16,
    ts: Vec<u8>,
    secs: f64,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let sender = Sender::new(group, port);
        let payloads: Vec<Vec<u8>> = ts.chunks(7 * 188).map(<[u8]>::to_vec).collect();
        let tick = Duration::from_millis(20);
        let per_tick = (payloads.len() as f64 / (secs / tick.as_secs_f64())).ceil() as usize;
        let start = std::time::Instant::now();
        for (i, batch) in payloads.chunks(per_tick.max(1)).enumerate() {
            sender.send_rtp(batch, (i * per_tick) as u16);
            let due = start + tick * (i as u32 + 1);
            std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
        }
    })
}

/// One `#EXT-X-PART`: `(sequence, index, duration, independent)`.
type PartLine = (u64, u32, f64, bool);

/// Every `#EXT-X-PART` of a playlist, and the preload hint's `(sequence, index)`.
fn parse_parts(text: &str) -> (Vec<PartLine>, Option<(u64, u32)>) {
    let name = |uri: &str| -> (u64, u32) {
        let file = uri.split('?').next().unwrap().strip_suffix(".ts").unwrap();
        let (s, i) = file.split_once('.').unwrap();
        (s.parse().unwrap(), i.parse().unwrap())
    };
    let attr = |line: &str, key: &str| -> Option<String> {
        line.split(',').find_map(|kv| {
            kv.strip_prefix(key)
                .and_then(|v| v.strip_prefix('='))
                .map(|v| v.trim_matches('"').to_string())
        })
    };
    let mut parts = Vec::new();
    let mut hint = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("#EXT-X-PART:") {
            let (s, i) = name(&attr(rest, "URI").unwrap());
            let d: f64 = attr(rest, "DURATION").unwrap().parse().unwrap();
            parts.push((s, i, d, attr(rest, "INDEPENDENT").as_deref() == Some("YES")));
        } else if let Some(rest) = line.strip_prefix("#EXT-X-PRELOAD-HINT:") {
            assert_eq!(attr(rest, "TYPE").as_deref(), Some("PART"), "{line}");
            hint = Some(name(&attr(rest, "URI").unwrap()));
        }
    }
    (parts, hint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_latency_hls_lists_parts_and_holds_reloads_until_the_next_part() {
    require_ffmpeg();
    let dir = Scratch::new("llhls");
    let source = make_source(&dir.path("source.ts"), 8, 25, None);
    let mut cfg = hls_config(2);
    cfg.hls.part_target_ms = 500;
    let gw = Gateway::start(cfg).await;
    let base = "/hls/rtp/239.255.41.9:5609";
    let url = format!("{base}/index.m3u8?iface=lo");
    let first = gw.spawn_get(&url);
    wait_joined("239.255.41.9", true).await;
    let sending = send_live("239.255.41.9", 5609, source, 8.0);
    let resp = first.await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = read_text(resp).await;
    assert!(
        text.contains("#EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK=1.500\n")
            && text.contains("#EXT-X-PART-INF:PART-TARGET=0.500\n"),
        "{text}"
    );
    // Live segments carry their wall clock, a few seconds old at most.
    let pdt = text
        .lines()
        .find_map(|l| l.strip_prefix("#EXT-X-PROGRAM-DATE-TIME:"))
        .expect("wall clock");
    assert!(pdt.ends_with('Z') && pdt.len() == 24, "{pdt}");

    // Follow the live edge as a player does: a blocking reload for the hinted part, and the
    // hinted part itself, asked for before it exists.
    let (mut parts, mut hint) = parse_parts(&text);
    let mut bodies = std::collections::HashMap::new();
    let mut reloads = 0;
    while hint.is_some_and(|(s, _)| s < 3) {
        let (msn, part) = hint.unwrap();
        let early = gw.spawn_get(&format!("{base}/{msn}.{part}.ts?iface=lo"));
        let resp = gw
            .get(&format!("{url}&_HLS_msn={msn}&_HLS_part={part}"))
            .await;
        assert_eq!(resp.status(), 200);
        let text = read_text(resp).await;
        let (now, next) = parse_parts(&text);
        assert!(
            now.iter().any(|p| (p.0, p.1) == (msn, part))
                || parse_playlist(&text)
                    .segments
                    .iter()
                    .any(|s| s.2.starts_with(&format!("{msn}.ts"))),
            "the reload answered once {msn}.{part} was there:\n{text}"
        );
        let body = early.await.unwrap();
        assert_eq!(body.status(), 200, "{msn}.{part}");
        let bytes = read_bytes(body, usize::MAX).await;
        if !bytes.is_empty() {
            bodies.insert((msn, part), bytes);
        }
        parts.extend(now);
        hint = next;
        reloads += 1;
        assert!(reloads < 100, "the live edge kept moving");
    }
    parts.sort_by_key(|p| (p.0, p.1));
    parts.dedup_by_key(|p| (p.0, p.1));
    // Every part fits the part target; each segment's first part starts on a keyframe; the
    // parts of a segment, joined, are the segment byte for byte.
    for seq in 1..3u64 {
        let mine: Vec<_> = parts.iter().filter(|p| p.0 == seq).collect();
        assert!(!mine.is_empty(), "parts of segment {seq}: {parts:?}");
        assert!(mine[0].3, "segment {seq} begins with an independent part");
        let mut joined = Vec::new();
        for (i, p) in mine.iter().enumerate() {
            assert_eq!(p.1 as usize, i);
            assert!(p.2 <= 0.5, "part {seq}.{i} lasts {}", p.2);
            let bytes = match bodies.get(&(p.0, p.1)) {
                Some(b) => b.clone(),
                None => fetch(&gw, base, &format!("{seq}.{i}.ts?iface=lo")).await,
            };
            joined.extend_from_slice(&bytes);
        }
        let whole = fetch(&gw, base, &format!("{seq}.ts?iface=lo")).await;
        assert_head(&whole, PMT, VIDEO, "segment");
        assert!(joined == whole, "segment {seq}: parts join to the segment");
        let total: f64 = mine.iter().map(|p| p.2).sum();
        assert!(
            (total - 2.0).abs() < 0.01,
            "segment {seq}: parts last {total} s"
        );
    }
    // A reload too far ahead is refused at once; a malformed one too.
    let resp = gw.get(&format!("{url}&_HLS_msn=40")).await;
    assert_eq!(resp.status(), 400);
    assert!(read_text(resp)
        .await
        .contains("more than two segments past"));
    assert_eq!(gw.get(&format!("{url}&_HLS_msn=x")).await.status(), 400);
    tokio::task::spawn_blocking(move || sending.join().unwrap())
        .await
        .unwrap();
}

/// The status code of `GET path` sent from the loopback address `source`.
async fn status_from(source: &str, addr: std::net::SocketAddr, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut tcp = sock.connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut head))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hls_viewers_count_in_max_subscribers_per_channel() {
    require_ffmpeg();
    let dir = Scratch::new("limit");
    let source = make_source(&dir.path("source.ts"), 6, 25, None);
    let mut cfg = hls_config(1);
    cfg.max_subscribers_per_channel = 2;
    let gw = Gateway::start(cfg).await;
    let hls = "/hls/rtp/239.255.41.10:5610/index.m3u8?iface=lo";
    let raw = "/rtp/239.255.41.10:5610?iface=lo";
    let first = gw.spawn_get(hls);
    wait_joined("239.255.41.10", true).await;
    let sending = send_live("239.255.41.10", 5610, source, 6.0);
    // One HLS viewer (127.0.0.1) and one raw-TS viewer fill the channel.
    assert_eq!(first.await.unwrap().status(), 200);
    let watching = gw.get(raw).await;
    assert_eq!(watching.status(), 200);
    // A second HLS viewer, from another address, and a second raw viewer are refused.
    assert_eq!(status_from("127.0.0.2", gw.addr, hls).await, 429);
    assert_eq!(status_from("127.0.0.3", gw.addr, raw).await, 429);
    // The HLS viewer already counted keeps playing.
    assert_eq!(gw.get(hls).await.status(), 200);
    // The segmenter is no viewer: the hub holds it and the raw viewer.
    let status = gw.status().await;
    assert_eq!(status["hubs"][0]["subscribers"], 2, "{status}");
    // The raw viewer leaves: there is room for the second HLS viewer.
    drop(watching);
    let mut admitted = 0;
    for _ in 0..40 {
        admitted = status_from("127.0.0.2", gw.addr, hls).await;
        if admitted == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(admitted, 200);
    tokio::task::spawn_blocking(move || sending.join().unwrap())
        .await
        .unwrap();
}

/// The fMP4 form of a channel: the playlist's `(init, segment)` URIs, fetched and joined
/// (each init once, before the first segment that needs it) into one playable file per init.
async fn fetch_fmp4(gw: &Gateway, base: &str, text: &str) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for line in text.lines() {
        if let Some(uri) = line
            .strip_prefix("#EXT-X-MAP:URI=\"")
            .and_then(|l| l.strip_suffix('"'))
        {
            let resp = gw.get(&format!("{base}/{uri}")).await;
            assert_eq!(resp.status(), 200, "{uri}");
            assert_eq!(resp.headers()["content-type"], "video/mp4");
            files.push((uri.to_string(), read_bytes(resp, usize::MAX).await));
        } else if !line.starts_with('#') && !line.is_empty() {
            let resp = gw.get(&format!("{base}/{line}")).await;
            assert_eq!(resp.status(), 200, "{line}");
            assert_eq!(resp.headers()["content-type"], "video/mp4");
            let media = read_bytes(resp, usize::MAX).await;
            assert_eq!(&media[4..8], b"moof", "{line}");
            files.last_mut().expect("EXT-X-MAP first").1.extend(media);
        }
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fmp4_segments_decode_frame_exactly() {
    require_ffmpeg();
    let dir = Scratch::new("fmp4");
    let source = make_source(&dir.path("source.ts"), 8, 25, None);
    let gw = Gateway::start(hls_config(2)).await;
    let base = "/hls/rtp/239.255.41.12:5612";
    let url = format!("{base}/index.m3u8?iface=lo&container=fmp4");
    let first = gw.spawn_get(&url);
    wait_joined("239.255.41.12", true).await;
    let sender = Sender::new("239.255.41.12", 5612);
    send(&sender, &source, 1).await;
    assert_eq!(first.await.unwrap().status(), 200);
    let (p, text) = ended_playlist(&gw, &url).await;
    assert!(text.starts_with("#EXTM3U\n#EXT-X-VERSION:7\n"), "{text}");
    assert_eq!(p.segments.len(), 4, "{text}");
    for (i, (d, disc, uri)) in p.segments.iter().enumerate() {
        // The container is the viewer's choice, not part of the segment URIs.
        assert_eq!(uri, &format!("{i}.m4s?iface=lo"));
        assert!(!disc && (d - 2.0).abs() < 0.001, "{text}");
    }
    assert_eq!(
        text.matches("#EXT-X-MAP:").count(),
        1,
        "one init for one layout: {text}"
    );
    assert!(
        text.contains("#EXT-X-MAP:URI=\"init-1.mp4?iface=lo\"\n"),
        "{text}"
    );
    let files = fetch_fmp4(&gw, base, &text).await;
    let out = dir.path("hls.mp4");
    std::fs::write(&out, &files[0].1).unwrap();
    // The TS segments of the same window: the audio reference (the source from the first
    // keyframe on, as TS viewers get it).
    let mut ts = Vec::new();
    for i in 0..4 {
        ts.extend(fetch(&gw, base, &format!("{i}.ts?iface=lo")).await);
    }
    let ts_out = dir.path("hls.ts");
    std::fs::write(&ts_out, &ts).unwrap();
    let src = dir.path("source.ts");
    let (want, got, want_audio, got_audio) = tokio::task::spawn_blocking(move || {
        (
            frame_hashes(&src, "v"),
            frame_hashes(&out, "v"),
            frame_hashes(&ts_out, "a"),
            frame_hashes(&out, "a"),
        )
    })
    .await
    .unwrap();
    assert_eq!(want.len(), 200);
    assert!(got == want, "video: {} frames vs {}", got.len(), want.len());
    assert!(want_audio.len() > 300, "{} audio frames", want_audio.len());
    assert!(
        got_audio == want_audio,
        "audio: {} frames vs {}",
        got_audio.len(),
        want_audio.len()
    );
    // ffmpeg's own HLS client, through the playlist and its EXT-X-MAP, decodes the same frames.
    let playlist_url = format!("http://{}{url}", gw.addr);
    let via_hls = tokio::task::spawn_blocking(move || frame_hashes(&playlist_url, "v"))
        .await
        .unwrap();
    assert!(
        via_hls == want,
        "ffmpeg via the playlist: {} frames",
        via_hls.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_encoder_gets_a_new_fmp4_init_after_the_discontinuity() {
    require_ffmpeg();
    let dir = Scratch::new("fmp4-pids");
    let a = make_source(&dir.path("a.ts"), 4, 25, None);
    // Another encoder takes over: other PIDs, another picture size (so another SPS), its
    // clock carrying on.
    let status = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=320x180:rate=25:duration=4")
        .args([
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:sample_rate=48000:duration=4",
        ])
        .args([
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-pix_fmt",
            "yuv420p",
            "-bf",
            "2",
        ])
        .args(["-x264-params", "keyint=25:min-keyint=25:scenecut=0"])
        .args(["-c:a", "aac", "-b:a", "64k", "-output_ts_offset", "4.08"])
        .args([
            "-mpegts_pmt_start_pid",
            "4608",
            "-mpegts_start_pid",
            "768",
            "-f",
            "mpegts",
        ])
        .arg(dir.path("b.ts"))
        .status()
        .unwrap();
    assert!(status.success());
    let b = std::fs::read(dir.path("b.ts")).unwrap();
    let mut cfg = hls_config(2);
    // fMP4 by default: the plain playlist URL asks for it.
    cfg.hls.container = sluice::iptv::hls::Container::Fmp4;
    let gw = Gateway::start(cfg).await;
    let base = "/hls/udp/239.255.41.13:5613";
    let url = format!("{base}/index.m3u8?iface=lo");
    let first = gw.spawn_get(&url);
    wait_joined("239.255.41.13", true).await;
    let sender = Sender::new("239.255.41.13", 5613);
    let seq = send(&sender, &a, 100).await;
    send(&sender, &b, seq).await;
    assert_eq!(first.await.unwrap().status(), 200);
    let (p, text) = ended_playlist(&gw, &url).await;
    let discs: Vec<usize> = (0..p.segments.len()).filter(|&i| p.segments[i].1).collect();
    assert_eq!(discs, [2], "{text}");
    // The second encoder's init (a new SPS) comes right after its discontinuity.
    assert!(
        text.contains("#EXT-X-DISCONTINUITY\n#EXT-X-MAP:URI=\"init-2.mp4?iface=lo\"\n"),
        "{text}"
    );
    let files = fetch_fmp4(&gw, base, &text).await;
    assert_eq!(files.len(), 2, "{text}");
    // The TS form of the same channel is still there for other viewers.
    let resp = gw.get(&format!("{url}&container=ts")).await;
    assert_eq!(resp.status(), 200);
    assert!(read_text(resp).await.contains("0.ts?iface=lo\n"));
    for (n, ((_, mp4), src)) in files.into_iter().zip(["a.ts", "b.ts"]).enumerate() {
        let out = dir.path(&format!("run{n}.mp4"));
        std::fs::write(&out, &mp4).unwrap();
        let src = dir.path(src);
        let (want, got) =
            tokio::task::spawn_blocking(move || (frame_hashes(&src, "v"), frame_hashes(&out, "v")))
                .await
                .unwrap();
        assert!(
            got == want,
            "run {n}: {} frames vs {}",
            got.len(),
            want.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_without_h264_or_aac_has_no_fmp4_form() {
    require_ffmpeg();
    let dir = Scratch::new("fmp4-mpeg2");
    let status = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=320x240:rate=25:duration=3")
        .args([
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:sample_rate=48000:duration=3",
        ])
        .args([
            "-c:v",
            "mpeg2video",
            "-g",
            "25",
            "-c:a",
            "mp2",
            "-f",
            "mpegts",
        ])
        .arg(dir.path("mpeg2.ts"))
        .status()
        .unwrap();
    assert!(status.success());
    let source = std::fs::read(dir.path("mpeg2.ts")).unwrap();
    let gw = Gateway::start(hls_config(1)).await;
    let url = "/hls/rtp/239.255.41.14:5614/index.m3u8?iface=lo";
    let first = gw.spawn_get(url);
    wait_joined("239.255.41.14", true).await;
    let sender = Sender::new("239.255.41.14", 5614);
    send(&sender, &source, 1).await;
    assert_eq!(first.await.unwrap().status(), 200);
    let resp = gw.get(&format!("{url}&container=fmp4")).await;
    assert_eq!(resp.status(), 406);
    let text = read_text(resp).await;
    assert!(text.contains("no H.264 or AAC stream"), "{text}");
    // Its TS form is unaffected.
    let resp = gw.get(url).await;
    assert_eq!(resp.status(), 200);
    assert!(read_text(resp).await.contains("0.ts?iface=lo"));
}

/// `sluice_iptv_hls_catchup_bytes` now: what catch-up and ended channels hold.
fn pooled_bytes(gw: &Gateway) -> u64 {
    gw.metrics()
        .lines()
        .find_map(|l| l.strip_prefix("iptv_hls_catchup_bytes "))
        .map_or(0, |v| v.parse().unwrap())
}

/// Sources that end leave their HLS channels holding their last segments (up to 32 MiB each),
/// shown ended while anyone asks, outside every subscriber limit: all ended channels together
/// stay within `catchup_total_bytes`, the ones idle longest dropped first, with their fMP4
/// rewrites counted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_channels_stay_within_the_total() {
    require_ffmpeg();
    let dir = Scratch::new("ended-total");
    let source = make_source(&dir.path("source.ts"), 3, 25, None);
    let size = source.len() as u64;
    // Room for two ended channels' TS segments, not three, nor two with one's fMP4 as well.
    let total = size * 11 / 5;
    let mut cfg = config();
    cfg.hls.target_duration_secs = 1;
    cfg.hls.catchup_total_bytes = total;
    // An ended channel stays while anyone asks: here for a minute without a request.
    cfg.linger_ms = 60_000;
    let gw = Gateway::start(cfg).await;
    for i in 0..3u16 {
        let group = format!("239.255.41.{}", 30 + i);
        let port = 5630 + i;
        let url = format!("/hls/rtp/{group}:{port}/index.m3u8?iface=lo");
        let first = gw.spawn_get(&url);
        wait_joined(&group, true).await;
        send(&Sender::new(&group, port), &source, 1).await;
        assert_eq!(first.await.unwrap().status(), 200);
        let (p, _) = ended_playlist(&gw, &url).await;
        assert_eq!(p.segments.len(), 3, "channel {i}");
        let held = pooled_bytes(&gw);
        assert!(
            held <= total,
            "{held} bytes held after channel {i}, bound {total}"
        );
    }
    // The first ended channel went for the third.
    let channels = gw.iptv.hls_channels();
    assert_eq!(channels, 2, "ended channels held");
    let held = pooled_bytes(&gw);
    assert!(
        (size..=total).contains(&held),
        "{held} bytes held by two channels of {size}, bound {total}"
    );
    // The newest one's segments as fMP4: the rewrite counts as well, so the other one goes.
    let url = "/hls/rtp/239.255.41.32:5632/index.m3u8?iface=lo&container=fmp4";
    let resp = gw.get(url).await;
    assert_eq!(resp.status(), 200);
    assert!(read_text(resp).await.contains("#EXT-X-ENDLIST"));
    assert_eq!(gw.iptv.hls_channels(), 1, "ended channels held with fMP4");
    let held = pooled_bytes(&gw);
    assert!(
        (size * 3 / 2..=total).contains(&held),
        "{held} bytes held by one channel of {size} with its fMP4, bound {total}"
    );
}

/// A live channel whose source stopped is shown ended (`#EXT-X-ENDLIST`) to the viewers still
/// asking, but not for ever: a client polling more often than the channel's idle time
/// (`linger_ms` plus three target durations) kept the ended playlist as every viewer's answer
/// even once the group sent again. Ended for longer than that, the next playlist request
/// starts the channel again, and the playlist is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_live_channel_polled_all_along_plays_again_when_its_source_does() {
    require_ffmpeg();
    let dir = Scratch::new("ended-polled");
    let source = make_source(&dir.path("source.ts"), 3, 25, None);
    let mut cfg = hls_config(1);
    cfg.no_data_timeout_ms = 1500;
    let gw = Gateway::start(cfg).await;
    let group = "239.255.41.21";
    let url = "/hls/rtp/239.255.41.21:5621/index.m3u8?iface=lo";
    let first = gw.spawn_get(url);
    wait_joined(group, true).await;
    send(&Sender::new(group, 5621), &source, 1).await;
    assert_eq!(first.await.unwrap().status(), 200);
    // The sender stops: the channel ends.
    let (ended, text) = ended_playlist(&gw, url).await;
    assert!(!ended.segments.is_empty(), "{text}");
    let ended_at = std::time::Instant::now();
    // The group sends again (live, for 8 s), while a client keeps polling every 500 ms,
    // well inside the idle time (200 ms + 3 × 1 s).
    let sending = send_live(group, 5621, source.repeat(3), 8.0);
    let live = loop {
        let resp = gw.get(url).await;
        if resp.status() == 200 {
            let text = read_text(resp).await;
            let p = parse_playlist(&text);
            if !p.ended {
                break (p, text);
            }
        }
        assert!(
            ended_at.elapsed() < Duration::from_secs(12),
            "still ended {} s after the source came back",
            ended_at.elapsed().as_secs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let (p, text) = live;
    // Shown ended for the idle time first (seen ended up to 100 ms after it ended).
    assert!(
        ended_at.elapsed() >= Duration::from_millis(3100),
        "live again after {:?}",
        ended_at.elapsed()
    );
    // New segments, numbered after the ended channel's (its URIs do not name new segments),
    // after a discontinuity.
    let last_ended = ended.sequence + ended.segments.len() as u64 - 1;
    assert!(p.sequence > last_ended, "{text}");
    assert!(p.segments[0].1, "{text}");
    let seg = fetch(&gw, "/hls/rtp/239.255.41.21:5621", &p.segments[0].2).await;
    assert_head(&seg, PMT, VIDEO, &p.segments[0].2);
    tokio::task::spawn_blocking(move || sending.join().unwrap())
        .await
        .unwrap();
    // It ends and comes back once more: the discontinuity it was started again after has
    // left the window, and the discontinuity sequence goes on from it (RFC 8216 6.2.2: it
    // never goes back; it went back to 0).
    let (ended, text) = ended_playlist(&gw, url).await;
    let before =
        ended.discontinuity_sequence + ended.segments.iter().filter(|s| s.1).count() as u64;
    assert!(before >= 1, "{text}");
    let ended_at = std::time::Instant::now();
    let sending = send_live(group, 5621, source.repeat(4), 12.0);
    let (again, text) = loop {
        let resp = gw.get(url).await;
        if resp.status() == 200 {
            let text = read_text(resp).await;
            let p = parse_playlist(&text);
            if !p.ended {
                break (p, text);
            }
        }
        assert!(
            ended_at.elapsed() < Duration::from_secs(12),
            "still ended {:?} after the source came back",
            ended_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(again.segments[0].1, "{text}");
    assert_eq!(again.discontinuity_sequence, before, "{text}");
    tokio::task::spawn_blocking(move || sending.join().unwrap())
        .await
        .unwrap();
}
