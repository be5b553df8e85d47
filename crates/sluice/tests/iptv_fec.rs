//! SMPTE 2022-1 FEC end to end: a channel with `?fec=PORT`, real multicast on `lo`, every 7th
//! media packet dropped by the sender, row and column FEC sent on the FEC port; the viewer
//! gets the original stream byte for byte.

#[path = "iptv_support/mod.rs"]
mod support;

use sha2::{Digest, Sha256};
use sluice_media::fec::{encode_fec, MediaPacket};
use support::*;

/// Matrix of L columns × D rows, as a 2022-1 sender configures it.
const L: usize = 10;
const D: usize = 5;

fn media(seq: u16, payload: &[u8]) -> MediaPacket {
    // The fields `rtp()` in the support module writes.
    MediaPacket {
        sequence: seq,
        payload_type: 33,
        timestamp: u32::from(seq) * 3000,
        payload: payload.to_vec(),
    }
}

fn fec_datagram(seq: u16, fec_payload: &[u8]) -> Vec<u8> {
    let mut d = rtp(seq, fec_payload);
    d[1] = 96; // a dynamic payload type, as FEC streams use
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_packets_are_rebuilt_from_row_and_column_fec() {
    let group = "239.71.9.20";
    let (port, fec_port) = (46100, 46102);
    // A gap is given up after a flush interval with nothing received; leave room for a
    // sender thread descheduled on a busy machine.
    let mut cfg = config();
    cfg.flush_interval_ms = 50;
    // Keep the channel (and its counters) after the viewer has read everything.
    cfg.linger_ms = 5000;
    let gw = Gateway::start(cfg).await;
    let matrices = 4;
    let stream = ts_datagrams(L * D * matrices, 0x120, None);
    let want = Sha256::digest(stream.concat());
    let total: usize = stream.iter().map(Vec::len).sum();
    // Across the sequence wrap.
    let first_seq = 65_480u16;
    let seq = move |i: usize| first_seq.wrapping_add(i as u16);
    let packets: Vec<MediaPacket> = (0..stream.len())
        .map(|i| media(seq(i), &stream[i]))
        .collect();

    let sender = Sender::new(group, port);
    let fec_sender = Sender::new(group, fec_port);
    let path = format!("/rtp/{group}:{port}?iface=lo&fec={fec_port}");
    let resp = gw.spawn_get(&path);
    wait_joined(group, true).await;
    sender.send_one(&rtp(seq(0), &stream[0]));
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);

    let count = stream.len();
    let to_send = stream.clone();
    let send = std::thread::spawn(move || {
        let stream = to_send;
        let mut fec_seq = 0u16;
        let mut send_fec = |payload: Vec<u8>| {
            fec_sender.send_one(&fec_datagram(fec_seq, &payload));
            fec_seq = fec_seq.wrapping_add(1);
        };
        for m in 0..matrices {
            let base = m * L * D;
            for r in 0..D {
                let row: Vec<&MediaPacket> = (0..L).map(|c| &packets[base + r * L + c]).collect();
                for c in 0..L {
                    let i = base + r * L + c;
                    // Every 7th packet never leaves the sender; the first already went.
                    if i > 0 && i % 7 != 6 {
                        sender.send_one(&rtp(seq(i), &stream[i]));
                    }
                }
                send_fec(encode_fec(&row, true, 1));
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            for c in 0..L {
                let col: Vec<&MediaPacket> = (0..D).map(|r| &packets[base + r * L + c]).collect();
                send_fec(encode_fec(&col, false, L as u8));
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    });
    let reader = tokio::spawn(read_bytes(resp, total));
    tokio::task::spawn_blocking(move || send.join().unwrap())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let status = gw.status().await;
    let got = reader.await.unwrap();
    assert_eq!(got.len(), total, "{status}");
    assert_eq!(Sha256::digest(&got), want);

    let hub = &status["hubs"][0];
    assert_eq!(
        hub["channel"],
        format!("rtp://{group}:{port}?fec={fec_port}")
    );
    let lost = (0..count).filter(|i| i % 7 == 6).count() as u64;
    assert_eq!(hub["fec_recovered"], lost, "{hub}");
    assert_eq!(hub["rtp_lost"], 0, "{hub}");
    assert_eq!(hub["ts_cc_errors"], 0, "{hub}");
}

#[tokio::test]
async fn a_bad_fec_port_is_a_clear_400() {
    let gw = Gateway::start(config()).await;
    let resp = gw.get("/rtp/239.71.9.21:46104?iface=lo&fec=46104").await;
    assert_eq!(resp.status(), 400);
    assert_eq!(
        read_text(resp).await,
        "fec=\"46104\" must be a port number (1-65535) other than the channel's\n"
    );
}
