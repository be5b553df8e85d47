//! Reed-Solomon FEC end to end (rtp2httpd's `?fec=PORT`): real multicast on `lo`, packets
//! dropped by the sender, parity blocks sent on the FEC port (or on the media port itself);
//! the viewer gets the original stream byte for byte.

#[path = "iptv_support/mod.rs"]
mod support;

use sha2::{Digest, Sha256};
use sluice_media::rs_fec::encode_block;
use support::*;

/// Sends `blocks` blocks of `k` media packets, each followed by its `m` parity packets (to
/// `fec`, or to the media port when `None`), dropping the media packets `drop(i)` picks.
/// Returns the payloads and how many were dropped.
async fn run(
    group: &str,
    port: u16,
    fec_port: Option<u16>,
    (k, m, blocks): (usize, usize, usize),
    drop: fn(usize) -> bool,
) {
    let mut cfg = config();
    cfg.flush_interval_ms = 50;
    cfg.linger_ms = 5000;
    let gw = Gateway::start(cfg).await;
    let stream = ts_datagrams(k * blocks, 0x130, None);
    let want = Sha256::digest(stream.concat());
    let total: usize = stream.iter().map(Vec::len).sum();
    // Across the sequence wrap.
    let first_seq = 65_300u16;
    let seq = move |i: usize| first_seq.wrapping_add(i as u16);
    let datagrams: Vec<Vec<u8>> = (0..stream.len()).map(|i| rtp(seq(i), &stream[i])).collect();

    let sender = Sender::new(group, port);
    let fec_sender = Sender::new(group, fec_port.unwrap_or(port));
    let query = match fec_port {
        Some(f) => format!("?iface=lo&fec={f}"),
        // Parity on the media port: `fec=` names a port nothing is sent to.
        None => format!("?iface=lo&fec={}", port + 1),
    };
    let resp = gw.spawn_get(&format!("/rtp/{group}:{port}{query}"));
    wait_joined(group, true).await;
    sender.send_one(&datagrams[0]);
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);

    let send = std::thread::spawn(move || {
        let mut fec_seq = 100u16;
        for b in 0..blocks {
            let block: Vec<&[u8]> = (0..k).map(|j| datagrams[b * k + j].as_slice()).collect();
            for j in 0..k {
                let i = b * k + j;
                if i > 0 && !drop(i) {
                    sender.send_one(&datagrams[i]);
                }
                if j % 16 == 15 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            for parity in encode_block(&block, m, fec_seq, 127).unwrap() {
                fec_sender.send_one(&parity);
            }
            fec_seq = fec_seq.wrapping_add(m as u16);
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
    assert_eq!(Sha256::digest(&got), want, "{status}");
    let hub = &status["hubs"][0];
    let dropped = (1..k * blocks).filter(|&i| drop(i)).count() as u64;
    assert_eq!(hub["fec_recovered"], dropped, "{hub}");
    assert_eq!(hub["fec_unrecoverable"], 0, "{hub}");
    assert_eq!(hub["rtp_lost"], 0, "{hub}");
    assert_eq!(hub["ts_cc_errors"], 0, "{hub}");
}

/// A large block shape, 50 media and 5 parity packets, with 4 losses a block. (The operators'
/// 100 + 5 shape uses a fixed matrix sluice does not implement; see `rs_fec`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_blocks_rebuild_every_25th_packet() {
    run("239.71.9.30", 46110, Some(46112), (50, 5, 4), |i| {
        i % 25 == 24
    })
    .await;
}

/// Another shape (the Vandermonde code), parity on the media port itself, bursts of loss:
/// three consecutive packets out of every 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_on_the_media_port_rebuilds_loss_bursts() {
    run("239.71.9.31", 46114, None, (20, 4, 15), |i| {
        (7..10).contains(&(i % 20))
    })
    .await;
}
