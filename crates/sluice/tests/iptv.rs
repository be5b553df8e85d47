//! IPTV gateway end to end: real multicast on the loopback interface, a tiny hyper server
//! calling `Iptv::handle`, and hyper clients.
//!
//! Every join and every sender names `lo` explicitly, so no datagram leaves this machine. No
//! `ip link set lo multicast on` is needed: joins by interface index and a sender pinned with
//! `IP_MULTICAST_IF` work on loopback without the flag or a multicast route. Each test uses its
//! own group and port so tests can run in parallel. Timers are real but short (hundreds of
//! milliseconds): the gateway reads real sockets, and paused tokio time would jump past every
//! timeout whenever the runtime waits on the kernel.

#[path = "iptv_support/mod.rs"]
mod support;

use std::time::Duration;

use sha2::{Digest, Sha256};
use support::*;

// Multi-threaded, like the server: hub and readers run in parallel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_and_eight_subscribers_get_every_payload_byte_in_order() {
    for (n, group) in [(1usize, "239.71.0.1"), (8, "239.71.0.2")] {
        let gw = Gateway::start(config()).await;
        let stream = ts_datagrams(600, 0x100, None);
        let want = Sha256::digest(stream.concat());
        let path = format!("/rtp/{group}:46001?iface=lo");
        let sender = Sender::new(group, 46001);
        let first = gw.spawn_get(&path);
        wait_joined(group, true).await;
        sender.send_rtp(&stream[..1], 0);
        let mut clients = vec![first.await.unwrap()];
        for _ in 1..n {
            clients.push(gw.get(&path).await);
        }
        sender.send_rtp(&stream[1..], 1);
        let total = stream.iter().map(Vec::len).sum::<usize>();
        for resp in clients {
            assert_eq!(resp.status(), 200);
            let got = read_bytes(resp, total).await;
            assert_eq!(got.len(), total, "{n} subscribers");
            assert_eq!(Sha256::digest(&got), want, "{n} subscribers");
        }
    }
}

#[tokio::test]
async fn reordered_and_duplicated_input_is_restored() {
    let group = "239.71.0.3";
    let gw = Gateway::start(config()).await;
    let stream = ts_datagrams(300, 0x101, None);
    let path = format!("/rtp/{group}:46002?iface=lo");
    let sender = Sender::new(group, 46002);
    let resp = gw.spawn_get(&path);
    wait_joined(group, true).await;
    // Sequence 0 first (it fixes the base), then pairs swapped and every 10th sent twice.
    let mut order: Vec<usize> = vec![0];
    for pair in (1..300).collect::<Vec<_>>().chunks(2) {
        order.extend(pair.iter().rev());
        if pair[0] % 10 == 1 {
            order.push(pair[0]);
        }
    }
    for i in order {
        sender.send_one(&rtp(i as u16, &stream[i]));
    }
    let total = stream.iter().map(Vec::len).sum::<usize>();
    let got = read_bytes(resp.await.unwrap(), total).await;
    assert_eq!(got, stream.concat());
    let status = gw.status().await;
    let hub = &status["hubs"][0];
    assert!(hub["rtp_reordered"].as_u64().unwrap() >= 100, "{hub}");
    assert!(hub["rtp_duplicates"].as_u64().unwrap() >= 20, "{hub}");
    assert_eq!(hub["rtp_lost"], 0);
}

/// Attack: 1-byte RTP payloads in swapped pairs, so no payload follows the one before it in
/// memory (each was one ring chunk). They are joined into few chunks, and the viewer still
/// gets every byte, in order.
#[tokio::test]
async fn tiny_payloads_out_of_order_arrive_in_order() {
    let group = "239.71.0.77";
    let gw = Gateway::start(config()).await;
    let path = format!("/rtp/{group}:46077?iface=lo");
    let sender = Sender::new(group, 46077);
    let resp = gw.spawn_get(&path);
    wait_joined(group, true).await;
    let n = 6001usize;
    let payload = |i: usize| [(i * 7 % 251) as u8];
    // Sequence 0 first (it fixes the base), then 2, 1, 4, 3, ...
    sender.send_one(&rtp(0, &payload(0)));
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    for (k, pair) in (1..n).collect::<Vec<_>>().chunks(2).enumerate() {
        for &i in pair.iter().rev() {
            sender.send_one(&rtp(i as u16, &payload(i)));
        }
        if k % 32 == 31 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let want: Vec<u8> = (0..n).flat_map(payload).collect();
    let got = read_bytes(resp, n).await;
    assert_eq!(got, want);
    let status = gw.status().await;
    let hub = &status["hubs"][0];
    assert_eq!(hub["rtp_lost"], 0, "{hub}");
    assert!(hub["rtp_reordered"].as_u64().unwrap() >= 2000, "{hub}");
}

#[tokio::test]
async fn two_subscribers_share_one_membership() {
    let group = "239.71.0.4";
    let gw = Gateway::start(config()).await;
    let path = format!("/udp/{group}:46003?iface=lo");
    let sender = Sender::new(group, 46003);
    let first = gw.spawn_get(&path);
    wait_joined(group, true).await;
    sender.send_raw(&ts_datagrams(5, 0x102, None));
    let a = first.await.unwrap();
    let b = gw.get(&path).await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    assert_eq!(
        igmp_memberships(group),
        vec![1],
        "one entry, one socket, on lo"
    );
    let status = gw.status().await;
    assert_eq!(status["hubs"].as_array().unwrap().len(), 1);
    assert_eq!(status["hubs"][0]["subscribers"], 2);
}

// Multi-threaded, like the server: hub and readers run in parallel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_subscriber_does_not_slow_a_fast_one() {
    let group = "239.71.0.5";
    let mut cfg = config();
    // Far smaller than the stream and the stalled client's TCP buffers, but roomy enough that
    // the fast reader, sharing this test's single thread with the hub, is never lapped.
    cfg.buffer_bytes = 2 * 1024 * 1024;
    cfg.burst_bytes = 0;
    let gw = Gateway::start(cfg).await;
    let path = format!("/rtp/{group}:46004?iface=lo");
    let sender = Sender::new(group, 46004);
    let fast = gw.spawn_get(&path);
    wait_joined(group, true).await;
    let stream = ts_datagrams(16_000, 0x103, None); // ~21 MB, more than loopback TCP buffers
    sender.send_rtp(&stream[..1], 0);
    let fast = fast.await.unwrap();
    let stalled = gw.stalled_get(&path).await;
    let started = std::time::Instant::now();
    let send = sender.spawn_rtp(stream[1..].to_vec(), 1);
    // Live only (no burst): the fast subscriber starts after datagram 0.
    let want = stream[1..].concat();
    let got = read_bytes(fast, want.len()).await;
    send.join().unwrap();
    let status = gw.status().await;
    assert_eq!(got.len(), want.len(), "{status}");
    assert_eq!(Sha256::digest(&got), Sha256::digest(&want));
    assert!(started.elapsed() < Duration::from_secs(20));
    drop(stalled);
}

#[tokio::test]
async fn lapped_subscriber_is_disconnected_when_configured() {
    let group = "239.71.0.6";
    let mut cfg = config();
    cfg.buffer_bytes = 256 * 1024;
    cfg.burst_bytes = 0;
    cfg.slow_subscriber = sluice::iptv::SlowPolicy::Disconnect;
    cfg.no_data_timeout_ms = 10_000;
    cfg.linger_ms = 10_000; // keep the hub (and its counters) for the status check
    let gw = Gateway::start(cfg).await;
    let path = format!("/rtp/{group}:46005?iface=lo");
    let sender = Sender::new(group, 46005);
    let slow = gw.spawn_get(&path);
    wait_joined(group, true).await;
    // ~26 MB: more than the ring and both loopback TCP buffers together.
    let stream = ts_datagrams(20_000, 0x104, None);
    sender.send_rtp(&stream[..1], 0);
    let slow = slow.await.unwrap();
    sender.spawn_rtp(stream[1..].to_vec(), 1).join().unwrap();
    // Only now does the client read: its position was evicted long ago.
    let got = read_bytes(slow, usize::MAX).await;
    assert!(got.len() < stream.concat().len());
    let status = gw.status().await;
    assert_eq!(status["hubs"][0]["slow_disconnects"], 1, "{status}");
}

#[tokio::test]
async fn hub_lingers_then_leaves() {
    let group = "239.71.0.7";
    let mut cfg = config();
    cfg.linger_ms = 1500;
    let gw = Gateway::start(cfg).await;
    let path = format!("/rtp/{group}:46006?iface=lo");
    let sender = Sender::new(group, 46006);
    let resp = gw.spawn_get(&path);
    wait_joined(group, true).await;
    // About 1.5 s of data, so the server sees the client go while the hub still has input.
    let keep_sending = sender.spawn_rtp_paced(ts_datagrams(1500, 0x105, None), 0, 1);
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gw.status().await["hubs"][0]["subscribers"], 0);
    assert_eq!(
        igmp_memberships(group),
        vec![1],
        "still joined while lingering"
    );
    wait_joined(group, false).await;
    keep_sending.join().unwrap();
}

#[tokio::test]
async fn no_data_gives_504_and_leaves() {
    let group = "239.71.0.8";
    let mut cfg = config();
    cfg.no_data_timeout_ms = 300;
    cfg.linger_ms = 0;
    let gw = Gateway::start(cfg).await;
    let started = std::time::Instant::now();
    let resp = gw.get(&format!("/rtp/{group}:46007?iface=lo")).await;
    assert_eq!(resp.status(), 504);
    assert!(started.elapsed() < Duration::from_secs(5));
    let body = read_text(resp).await;
    assert_eq!(body, "no data from the channel within 300 ms\n");
    // The interface the gateway joined on is configuration: the client is not told it.
    assert!(!body.contains("lo"), "{body}");
    wait_joined(group, false).await;
}

#[tokio::test]
async fn stream_ends_when_data_stops() {
    let group = "239.71.0.9";
    let mut cfg = config();
    cfg.no_data_timeout_ms = 1000;
    let gw = Gateway::start(cfg).await;
    let path = format!("/rtp/{group}:46008?iface=lo");
    let sender = Sender::new(group, 46008);
    let resp = gw.spawn_get(&path);
    wait_joined(group, true).await;
    let stream = ts_datagrams(50, 0x106, None);
    sender.send_rtp(&stream, 0);
    // read_bytes stops at end of body; the body must end on its own.
    let got = read_bytes(resp.await.unwrap(), usize::MAX).await;
    assert_eq!(got, stream.concat());
}

#[tokio::test]
async fn source_specific_join_filters_other_sources() {
    let group = "232.71.0.10";
    let gw = Gateway::start(config()).await;
    let path = format!("/rtp/127.0.0.1@{group}:46009?iface=lo");
    // Bound explicitly: an unbound sender on lo may get another local address as its source.
    let wanted = Sender::from_source(group, 46009, "127.0.0.1");
    let other = Sender::from_source(group, 46009, "127.0.0.2");
    let resp = gw.spawn_get(&path);
    wait_joined(group, true).await;
    let stream = ts_datagrams(100, 0x107, None);
    let noise = ts_datagrams(100, 0x1ff, None);
    for i in 0..100 {
        other.send_one(&rtp(i as u16 + 5000, &noise[i]));
        wanted.send_one(&rtp(i as u16, &stream[i]));
    }
    let total = stream.iter().map(Vec::len).sum::<usize>();
    let got = read_bytes(resp.await.unwrap(), total).await;
    assert_eq!(got, stream.concat());
}

#[tokio::test]
async fn udp_mode_passes_non_rtp_payloads() {
    let group = "239.71.0.11";
    let gw = Gateway::start(config()).await;
    let path = format!("/udp/{group}%3A46010/?iface=lo");
    let sender = Sender::new(group, 46010);
    let resp = gw.spawn_get(&path);
    wait_joined(group, true).await;
    let mut datagrams = ts_datagrams(20, 0x108, None);
    datagrams.push(b"plain text is not RTP".to_vec());
    sender.send_raw(&datagrams);
    let total = datagrams.iter().map(Vec::len).sum::<usize>();
    let got = read_bytes(resp.await.unwrap(), total).await;
    assert_eq!(got, datagrams.concat());
}

#[tokio::test]
async fn bad_urls_get_400_with_reasons() {
    let gw = Gateway::start(config()).await;
    let cases = [
        ("/rtp/10.1.2.3:5000?iface=lo", "not a multicast group"),
        ("/rtp/239.1.1.1:0?iface=lo", "not a port number"),
        ("/rtp/239.1.1:5000?iface=lo", "not an IP address"),
        ("/rtp/239.1.1.1:5000", "no interface"),
        (
            "/rtp/239.1.1.1:5000?iface=nosuch0",
            "interface \"nosuch0\" is not one this gateway serves",
        ),
        // Control groups: mDNS, SSDP, all-hosts, IPv6 link-local.
        ("/udp/224.0.0.251:5353?iface=lo", "control traffic"),
        ("/udp/239.255.255.250:1900?iface=lo", "control traffic"),
        ("/rtp/224.0.0.1:5000?iface=lo", "control traffic"),
        ("/udp/[ff02::fb]:5353?iface=lo", "control traffic"),
        (
            "/udp/224.0.0.1@239.1.1.1:5000?iface=lo",
            "must be a unicast address",
        ),
    ];
    for (path, reason) in cases {
        let resp = gw.get(path).await;
        assert_eq!(resp.status(), 400, "{path}");
        let body = read_text(resp).await;
        assert!(body.contains(reason), "{path}: {body}");
    }
}

/// A configured interface that is not there now (a PPPoE link redialling, a VLAN being
/// recreated) is the server's fault: 503, counted apart from bad requests, and the answer names
/// nothing of the configuration. Before, every channel request was a 400 `bad_request` saying
/// `no network interface named "ppp-gone7"`.
#[tokio::test]
async fn a_missing_configured_interface_is_a_503_that_names_nothing() {
    let mut cfg = config();
    cfg.interface = Some("ppp-gone7".into());
    cfg.fcc.interface = Some("vlan-gone8".into());
    let gw = Gateway::start(cfg).await;
    let paths = [
        "/rtp/239.71.0.60:46060",
        "/rtp/239.71.0.60:46060?iface=ppp-gone7",
        // The multicast interface is there; the FCC one is not.
        "/rtp/239.71.0.60:46060?iface=lo&fcc=127.0.0.1:8027",
        "/hls/rtp/239.71.0.60:46060/index.m3u8",
    ];
    for path in paths {
        let resp = gw.get(path).await;
        assert_eq!(resp.status(), 503, "{path}");
        let body = read_text(resp).await;
        assert_eq!(
            body, "the channel's network interface is unavailable\n",
            "{path}"
        );
        assert!(!body.contains("gone"), "{path}: {body}");
    }
    let metrics = gw.metrics();
    assert!(
        metrics.contains("reason=\"interface_unavailable\"} 4"),
        "{metrics}"
    );
    assert!(!metrics.contains("reason=\"bad_request\""), "{metrics}");
}

#[tokio::test]
async fn subscriber_limits_answer_429_and_503() {
    let mut cfg = config();
    cfg.max_subscribers = 2;
    cfg.max_subscribers_per_channel = 1;
    let gw = Gateway::start(cfg).await;
    let mut held = Vec::new();
    for (group, port) in [("239.71.0.12", 46011), ("239.71.0.13", 46012)] {
        let path = format!("/udp/{group}:{port}?iface=lo");
        let resp = gw.spawn_get(&path);
        wait_joined(group, true).await;
        Sender::new(group, port).send_raw(&ts_datagrams(3, 0x109, None));
        held.push(resp.await.unwrap());
        assert_eq!(held.last().unwrap().status(), 200);
        if port == 46011 {
            assert_eq!(gw.get(&path).await.status(), 429);
        }
    }
    let resp = gw.get("/udp/239.71.0.14:46013?iface=lo").await;
    assert_eq!(resp.status(), 503);
    assert!(read_text(resp).await.contains("limit of 2 subscribers"));
}

#[tokio::test]
async fn instant_start_is_ts_aligned_on_a_keyframe() {
    let group = "239.71.0.15";
    let mut cfg = config();
    cfg.burst_bytes = 64 * 1024;
    let gw = Gateway::start(cfg).await;
    let path = format!("/rtp/{group}:46014?iface=lo");
    let sender = Sender::new(group, 46014);
    let first = gw.spawn_get(&path);
    wait_joined(group, true).await;
    // A keyframe in datagram 170, packet 3: inside the last 64 KiB (49 datagrams) of 200.
    let stream = ts_datagrams(200, 0x10a, Some((170, 3)));
    sender.send_rtp(&stream, 0);
    let _first = first.await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = gw.get(&path).await;
    let all = stream.concat();
    let from = 170 * 1316 + 3 * 188;
    let got = read_bytes(late, all.len() - from).await;
    assert_eq!(got[0], 0x47);
    assert_eq!(got.len() % 188, 0);
    assert_eq!(got, all[from..]);
}

#[tokio::test]
async fn status_pages_and_playlist() {
    let dir = tempfile::tempdir().unwrap();
    let m3u = dir.path().join("list.m3u");
    std::fs::write(
        &m3u,
        "#EXTM3U\n#EXTINF:-1 group-title=\"News\",One\nrtp://239.1.1.1:5000\n",
    )
    .unwrap();
    let mut cfg = config();
    cfg.playlist = Some(m3u.display().to_string());
    let gw = Gateway::start(cfg).await;
    let list = read_text(gw.get("/playlist.m3u").await).await;
    assert_eq!(
        list,
        "#EXTM3U\n#EXTINF:-1 group-title=\"News\",One\nhttp://gw.test/rtp/239.1.1.1:5000\n"
    );
    let page = gw.get("/status").await;
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    // Its script is a file beside it (the page's policy allows no inline code).
    assert!(read_text(page).await.contains("src=\"status/status.js\""));
    let script = gw.get("/status/status.js").await;
    assert_eq!(script.status(), 200);
    assert!(read_text(script).await.contains("new EventSource("));
    let events = gw.get("/status/events").await;
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let first = read_bytes(events, 6).await;
    assert_eq!(&first[..6], b"data: ");
    assert_eq!(gw.status().await["subscribers"], 0);
    let text = gw.metrics();
    assert!(text.contains("iptv_subscribers"), "{text}");
}

/// The default 5 s no-data timeout, in paused time: nothing is sent, so the only events are
/// timers, and tokio's clock jumps straight to each of them.
#[tokio::test(start_paused = true)]
async fn default_no_data_timeout_is_five_seconds() {
    let group = "239.71.0.16";
    let cfg = sluice::iptv::IptvConfig {
        linger_ms: 0,
        interfaces: vec!["lo".into()],
        ..Default::default()
    };
    let gw = Gateway::start(cfg).await;
    let started = tokio::time::Instant::now();
    let resp = gw.get(&format!("/rtp/{group}:46015?iface=lo")).await;
    assert_eq!(resp.status(), 504);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(6),
        "{waited:?}"
    );
    wait_joined(group, false).await;
}

#[tokio::test]
async fn membership_is_refreshed_and_the_stream_goes_on() {
    let group = "239.71.0.17";
    let mut cfg = config();
    cfg.membership_refresh_secs = 1;
    let gw = Gateway::start(cfg).await;
    let path = format!("/rtp/{group}:46016?iface=lo");
    let sender = Sender::new(group, 46016);
    let resp = gw.spawn_get(&path);
    wait_joined(group, true).await;
    // About 1.6 s of data at one datagram per millisecond, spanning one refresh.
    let stream = ts_datagrams(1500, 0x10b, None);
    let send = sender.spawn_rtp_paced(stream.clone(), 0, 1);
    let resp = resp.await.unwrap();
    // A leave+join gap may cost a datagram or two on a busy machine, never the stream.
    let want = stream.concat().len() * 9 / 10;
    let got = read_bytes(resp, want).await;
    assert!(got.len() >= want, "{}", got.len());
    let status = gw.status().await;
    send.join().unwrap();
    assert!(
        status["hubs"][0]["membership_refreshes"].as_u64() >= Some(1),
        "{status}"
    );
    assert_eq!(status["hubs"][0]["membership_refresh_failures"], 0);
    // The last rejoin is shown, as a Unix time within the test's lifetime.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let at = status["hubs"][0]["last_rejoin_unix"].as_u64().unwrap();
    assert!(at <= now && at + 10 > now, "{at} vs {now}");
    assert!(
        status["hubs"][0]["last_rejoin_seconds_ago"]
            .as_u64()
            .unwrap()
            < 10
    );
    assert_eq!(igmp_memberships(group), vec![1]);
}

#[tokio::test]
async fn head_checks_the_url_without_joining() {
    let gw = Gateway::start(config()).await;
    let resp = head(gw.addr, "/rtp/239.71.0.18:46017?iface=lo").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "video/mp2t");
    assert!(igmp_memberships("239.71.0.18").is_empty());
}

#[tokio::test]
async fn playlist_from_http_url_is_rewritten() {
    let m3u = "#EXTM3U\n#EXTINF:-1 tvg-id=\"x\" catchup=\"append\",X\nudp://@239.5.5.5:1234\n";
    let origin = serve_text(m3u).await;
    let mut cfg = config();
    cfg.playlist = Some(format!("http://{origin}/list.m3u"));
    cfg.playlist_base_url = Some("https://tv.example/".into());
    let gw = Gateway::start(cfg).await;
    let resp = gw.get("/playlist.m3u").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        read_text(resp).await,
        "#EXTM3U\n#EXTINF:-1 tvg-id=\"x\" catchup=\"append\",X\nhttps://tv.example/udp/239.5.5.5:1234\n"
    );
}

/// IPv6 joins by interface index (`IPV6_JOIN_GROUP`, bound to the group with its scope).
/// Loopback cannot carry IPv6 multicast back to a receiver, so this checks the membership and
/// the clean 504, not payload.
#[tokio::test]
async fn ipv6_group_is_joined_on_the_named_interface() {
    let mut cfg = config();
    cfg.no_data_timeout_ms = 1500;
    cfg.linger_ms = 0;
    let gw = Gateway::start(cfg).await;
    let resp = gw.spawn_get("/rtp/[ff3e::71:19]:46018?iface=lo");
    let hex = "ff3e0000000000000000000000710019";
    let mut joined = false;
    for _ in 0..100 {
        joined = igmp6_on_lo().iter().any(|g| g == hex);
        if joined {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(joined, "ff3e::71:19 not in /proc/net/igmp6 for lo");
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 504);
    // The join is checked above; the answer names neither the group nor the interface.
    assert_eq!(
        read_text(resp).await,
        "no data from the channel within 1500 ms\n"
    );
}

/// A flowing channel is read by slots and a quiet one on readiness: a stream that is paced,
/// pauses long enough for the hub to go back to waiting, comes back as one burst larger than
/// a wakeup's read budget, then trickles with empty slots between datagrams, arrives whole
/// and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_byte_arrives_across_pauses_bursts_and_trickles() {
    let group = "239.71.0.40";
    let gw = Gateway::start(config()).await;
    let stream = ts_datagrams(900, 0x140, None);
    let want = Sha256::digest(stream.concat());
    let total = stream.iter().map(Vec::len).sum::<usize>();
    let path = format!("/rtp/{group}:46040?iface=lo");
    let sender = Sender::new(group, 46040);
    let resp = gw.spawn_get(&path);
    wait_joined(group, true).await;
    sender.send_rtp(&stream[..1], 0);
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    let send = std::thread::spawn(move || {
        // Paced, two datagrams a millisecond: read by slots.
        sender.send_rtp(&stream[1..200], 1);
        // Quiet for many slots: back to waiting for readiness.
        std::thread::sleep(Duration::from_millis(80));
        // 640 at once: more than one wakeup's 8 × 32.
        for (i, d) in stream[200..840].iter().enumerate() {
            sender.send_one(&rtp(200 + i as u16, d));
        }
        // A trickle, with empty slots between datagrams.
        for (i, d) in stream[840..].iter().enumerate() {
            std::thread::sleep(Duration::from_millis(5));
            sender.send_one(&rtp(840 + i as u16, d));
        }
    });
    let got = read_bytes(resp, total).await;
    send.join().unwrap();
    assert_eq!(got.len(), total);
    assert_eq!(Sha256::digest(&got), want);
}

/// `GET path` as the client at `peer`, straight to the gateway's handler (several clients
/// share one loopback).
async fn ask_as(gw: &Gateway, peer: &str, path: &str) -> hyper::Response<sluice::body::Body> {
    let (mut parts, ()) = hyper::Request::get(path)
        .header("host", "gw.test")
        .body(())
        .unwrap()
        .into_parts();
    parts
        .extensions
        .insert(peer.parse::<std::net::SocketAddr>().unwrap());
    tokio::time::timeout(Duration::from_secs(10), gw.iptv.handle(parts))
        .await
        .expect("answer within 10 s")
}

/// [`ask_as`] for a group that sends once joined.
async fn watch_as(
    gw: &Gateway,
    peer: &str,
    group: &str,
    port: u16,
) -> hyper::Response<sluice::body::Body> {
    let path = format!("/udp/{group}:{port}?iface=lo");
    let (resp, ()) = tokio::join!(ask_as(gw, peer, &path), async {
        wait_joined(group, true).await;
        Sender::new(group, port).send_raw(&ts_datagrams(3, 0x141, None));
    });
    resp
}

async fn text_of(resp: hyper::Response<sluice::body::Body>) -> String {
    use http_body_util::BodyExt;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

/// Attack: one client asks for a new group after another and hangs up on each (the groups
/// send nothing, so each answer is a 504 after `no_data_timeout_ms`, the group left
/// lingering). At its share each such request released its oldest lingering group at once:
/// one IGMP join and one leave per request, as fast as it could ask, each group left still
/// flowing for the routers' leave latency. Past its burst it is refused (429) until its rate
/// (its share per `START_WINDOW`) allows a start again; another client still starts one.
#[tokio::test]
async fn a_client_starting_group_after_group_is_refused_past_its_start_rate() {
    use sluice::iptv::registry::START_BURST;
    let mut cfg = config();
    cfg.linger_ms = 10_000;
    cfg.no_data_timeout_ms = 50;
    let share = cfg.max_subscribers_per_client;
    let gw = Gateway::start(cfg).await;
    let attempts = 40;
    let (mut started, mut refused) = (0, Vec::new());
    for i in 0..attempts {
        let path = format!("/udp/239.71.40.{}:46400?iface=lo", i + 1);
        let resp = ask_as(&gw, "192.0.2.7:40000", &path).await;
        match resp.status().as_u16() {
            504 => started += 1,
            429 => {
                let wait: u64 = resp.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!((1..=2).contains(&wait), "Retry-After: {wait}");
                refused.push(text_of(resp).await)
            }
            other => panic!("request {i}: {other} {}", text_of(resp).await),
        }
    }
    assert!(
        !refused.is_empty(),
        "{started} groups started, none refused"
    );
    assert!(started >= START_BURST.max(share), "{started} started");
    for body in &refused {
        assert!(
            body.starts_with(&format!(
                "this client is starting new channels too fast (at most {share} every 2s)"
            )),
            "{body}"
        );
    }
    // Another client starts a channel meanwhile (no data: a 504, not a refusal).
    let resp = ask_as(&gw, "192.0.2.8:40000", "/udp/239.71.40.100:46400?iface=lo").await;
    assert_eq!(resp.status(), 504, "{}", text_of(resp).await);
}

/// A starts a channel, B watches it too (A no longer answers for it), both hang up: the
/// channel lingered on nobody's share, neither released by their next channels nor counted.
/// The client that left last answers for it: at its share (1) its next channel releases it.
#[tokio::test]
async fn a_channel_two_clients_left_lingers_on_the_last_ones_share() {
    let mut cfg = config();
    cfg.linger_ms = 10_000;
    cfg.max_subscribers_per_client = 1;
    let gw = Gateway::start(cfg).await;
    let shared = "239.71.40.201";
    let a = watch_as(&gw, "192.0.2.10:40000", shared, 46401).await;
    assert_eq!(a.status(), 200);
    let b = ask_as(
        &gw,
        "192.0.2.11:40000",
        &format!("/udp/{shared}:46401?iface=lo"),
    )
    .await;
    assert_eq!(b.status(), 200);
    drop(a);
    drop(b);
    let next = watch_as(&gw, "192.0.2.11:40000", "239.71.40.202", 46402).await;
    assert_eq!(next.status(), 200);
    // Released for B's next channel, long before its linger would have ended.
    wait_joined(shared, false).await;
}

/// Attack: a client asks, past its start burst, for a group whose join fails (here the group's
/// port is held by a socket that does not share it, so the gateway's bind fails: a 502). Each
/// failed join took a start from the client's bucket, so a client whose joins kept failing was
/// refused its next good channel with 429. A failed join gives its start back.
#[tokio::test]
async fn failed_joins_past_the_burst_do_not_refuse_the_next_good_start() {
    use sluice::iptv::registry::START_BURST;
    let mut cfg = config();
    cfg.no_data_timeout_ms = 50;
    let share = cfg.max_subscribers_per_client;
    let gw = Gateway::start(cfg).await;
    // Bound without SO_REUSEADDR: the gateway's socket for this group and port cannot bind.
    let blocker = std::net::UdpSocket::bind("239.71.41.1:46410").unwrap();
    let peer = "192.0.2.20:40000";
    for i in 0..3 * START_BURST.max(share) {
        let resp = ask_as(&gw, peer, "/udp/239.71.41.1:46410?iface=lo").await;
        assert_eq!(resp.status(), 502, "attempt {i}: {}", text_of(resp).await);
    }
    drop(blocker);
    // The next good start is not refused (no data: a 504, the group joined and left).
    let resp = ask_as(&gw, peer, "/udp/239.71.41.2:46410?iface=lo").await;
    assert_eq!(resp.status(), 504, "{}", text_of(resp).await);
}

/// Attack: a start that fails only after it joined the group (or sent an FCC request): here
/// `?fec=` names a port held by a socket that does not share it, so the FEC socket, opened after
/// the media join, cannot bind (a 502). Each such failure joined and left the group; it spends a
/// start as a good one does, so past the burst the client gets 429. (A failure before any join
/// gives its start back: the test above.)
#[tokio::test]
async fn starts_that_fail_after_joining_still_spend_a_start() {
    use sluice::iptv::registry::START_BURST;
    let mut cfg = config();
    cfg.no_data_timeout_ms = 50;
    let share = cfg.max_subscribers_per_client;
    let gw = Gateway::start(cfg).await;
    let blocker = std::net::UdpSocket::bind("239.71.41.3:46412").unwrap();
    let peer = "192.0.2.21:40000";
    let mut refused = None;
    for i in 0..3 * START_BURST.max(share) {
        let resp = ask_as(&gw, peer, "/rtp/239.71.41.3:46410?iface=lo&fec=46412").await;
        match resp.status().as_u16() {
            502 => {}
            429 => {
                refused = Some(i);
                break;
            }
            other => panic!("attempt {i}: {other} {}", text_of(resp).await),
        }
    }
    drop(blocker);
    assert!(
        refused.is_some(),
        "{} failed starts after a join, none refused",
        3 * START_BURST.max(share)
    );
}

/// The other side of the test above: a start that fails before it joined anything gives its
/// start back even when the URL names an FEC port (or an FCC server): the media port is held
/// here, so the media bind fails first. Deciding by the URL alone spent these starts and made
/// a viewer whose playlist names `fec=` on every channel (rtp2httpd style) a 429 for failures
/// that sent nothing.
#[tokio::test]
async fn starts_that_fail_before_joining_give_back_their_start_whatever_they_name() {
    use sluice::iptv::registry::START_BURST;
    let mut cfg = config();
    cfg.no_data_timeout_ms = 50;
    let share = cfg.max_subscribers_per_client;
    let gw = Gateway::start(cfg).await;
    let blocker = std::net::UdpSocket::bind("239.71.41.4:46414").unwrap();
    let peer = "192.0.2.22:40000";
    for i in 0..3 * START_BURST.max(share) {
        let resp = ask_as(&gw, peer, "/rtp/239.71.41.4:46414?iface=lo&fec=46416").await;
        assert_eq!(resp.status(), 502, "attempt {i}: {}", text_of(resp).await);
    }
    drop(blocker);
}
