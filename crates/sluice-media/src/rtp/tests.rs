//! Unit and property tests for RTP parsing and reordering.

use super::*;
use proptest::prelude::*;

thread_local! {
    /// Slots `Reorder` stepped through on this thread.
    pub(super) static STEPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn header(seq: u16) -> Vec<u8> {
    let mut h = vec![0x80, 33];
    h.extend_from_slice(&seq.to_be_bytes());
    h.extend_from_slice(&90_000u32.to_be_bytes());
    h.extend_from_slice(&0xdead_beefu32.to_be_bytes());
    h
}

#[test]
fn parses_plain_header() {
    let mut pkt = header(7);
    pkt.extend_from_slice(&[0x47; 188]);
    let p = parse_rtp(&pkt).unwrap();
    assert_eq!(p.header.sequence, 7);
    assert_eq!(p.header.payload_type, 33);
    assert_eq!(p.header.ssrc, 0xdead_beef);
    assert_eq!(p.payload, 12..200);
}

#[test]
fn skips_csrc_extension_and_padding() {
    let mut pkt = header(1);
    pkt[0] = 0x80 | 0x20 | 0x10 | 2; // padding, extension, 2 CSRCs
    pkt.extend_from_slice(&[0; 8]); // CSRCs
    pkt.extend_from_slice(&[0xbe, 0xde, 0, 1, 1, 2, 3, 4]); // one-word extension
    pkt.extend_from_slice(b"payload");
    pkt.extend_from_slice(&[0, 0, 3]); // 3 bytes of padding
    let p = parse_rtp(&pkt).unwrap();
    assert_eq!(&pkt[p.payload.clone()], b"payload");
    assert_eq!(p.header.padding, 3);
    assert_eq!(p.header.csrc_count, 2);
    assert!(p.header.has_extension);
}

#[test]
fn rejects_malformed() {
    assert_eq!(parse_rtp(&[0x80; 11]), Err(RtpError::TooShort));
    let mut v1 = header(0);
    v1[0] = 0x40;
    assert_eq!(parse_rtp(&v1), Err(RtpError::BadVersion(1)));
    let mut csrc = header(0);
    csrc[0] = 0x8f;
    assert_eq!(parse_rtp(&csrc), Err(RtpError::TruncatedCsrc));
    let mut ext = header(0);
    ext[0] = 0x90;
    ext.extend_from_slice(&[0, 0, 0, 9]);
    assert_eq!(parse_rtp(&ext), Err(RtpError::TruncatedExtension));
    let mut pad = header(0);
    pad[0] = 0xa0;
    pad.push(0);
    assert_eq!(parse_rtp(&pad), Err(RtpError::BadPadding));
}

#[test]
fn classifies_payloads() {
    assert_eq!(classify(&[0x47; 188]), PayloadKind::Ts);
    assert_eq!(classify(&header(3)), PayloadKind::Rtp);
    assert_eq!(classify(b"hello world, not rtp"), PayloadKind::Other);
}

fn run(window: usize, seqs: &[u16]) -> (Vec<u16>, ReorderStats) {
    let mut r = Reorder::new(window);
    let mut out = Vec::new();
    for &s in seqs {
        r.push(s, s, &mut out);
    }
    r.flush(&mut out);
    (out, r.stats())
}

#[test]
fn restores_order_and_drops_duplicates() {
    let (out, st) = run(8, &[0, 2, 1, 1, 3, 5, 4, 4, 6]);
    assert_eq!(out, vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(st.duplicates, 2);
    assert_eq!(st.reordered, 2);
    assert_eq!(st.lost, 0);
}

#[test]
fn wraps_around() {
    let (out, st) = run(8, &[65534, 0, 65535, 1, 2]);
    assert_eq!(out, vec![65534, 65535, 0, 1, 2]);
    assert_eq!(st.lost, 0);
}

#[test]
fn counts_loss_when_window_overflows() {
    let (out, st) = run(4, &[10, 12, 13, 14, 15, 16]);
    assert_eq!(out, vec![10, 12, 13, 14, 15, 16]);
    assert_eq!(st.lost, 1);
    // A straggler after the window moved on is dropped, not emitted out of order.
    let (out, st) = run(2, &[1, 3, 4, 2, 5]);
    assert_eq!(out, vec![1, 3, 4, 5]);
    assert_eq!((st.lost, st.duplicates), (1, 1));
}

#[test]
fn resyncs_on_sender_restart() {
    let (out, st) = run(8, &[100, 101, 30000, 30001]);
    assert_eq!(out, vec![100, 101, 30000, 30001]);
    assert_eq!((st.resyncs, st.lost), (1, 0));
}

#[test]
fn follows_a_sender_that_restarts_slightly_behind() {
    let mut seqs: Vec<u16> = (500..520).collect();
    seqs.extend(100..140);
    let (out, st) = run(8, &seqs);
    // The first 16 of the restarted run are taken as late; then the window follows it.
    let mut want: Vec<u16> = (500..520).collect();
    want.extend(116..140);
    assert_eq!(out, want);
    assert_eq!((st.resyncs, st.duplicates), (1, 16));
}

#[test]
fn window_that_does_not_divide_65536_survives_the_wrap() {
    // The case found by reading: window 100, one packet lost just before the wrap.
    let seqs: Vec<u16> = (65400..=65535u16)
        .chain(0..200)
        .filter(|&s| s != 65499)
        .collect();
    let (out, st) = run(100, &seqs);
    assert_eq!(out, seqs);
    assert_eq!((st.lost, st.duplicates, st.resyncs), (1, 0, 0));
    // Packet 0 arriving early waits for 65500..65535 instead of jumping the queue.
    let mut early: Vec<u16> = (65490..65500).collect();
    early.push(0);
    early.extend(65500..=65535);
    early.extend(1..10);
    let (out, st) = run(100, &early);
    let want: Vec<u16> = (65490..=65535).chain(0..10).collect();
    assert_eq!(out, want);
    // 65500..=65535 all arrived after the later 0.
    assert_eq!((st.lost, st.reordered), (0, 36));
}

/// Attack: a sender whose packets each land a window plus 1,024 places past the last (tiny
/// frames, seq n, n+1056, n+2112, ...). Every other packet is a resync, the ones between skip
/// 1,024 empty places: that skip is one move, not 1,024 steps, and the counts are those of
/// stepping through every place.
#[test]
fn skipping_an_empty_window_does_not_step_through_it() {
    let seqs: Vec<u16> = (0..1000u16).map(|k| k.wrapping_mul(1056)).collect();
    STEPS.with(|s| s.set(0));
    let (out, st) = run(32, &seqs);
    let steps = STEPS.with(|s| s.get());
    assert_eq!(out, seqs);
    // Each odd packet gives up 1,024 places and then the 31 before it (on the next resync or
    // the final flush).
    assert_eq!(
        st,
        ReorderStats {
            delivered: 1000,
            lost: 500 * 1055,
            reordered: 0,
            duplicates: 0,
            resyncs: 499,
        }
    );
    assert!(steps <= 1000 * 33, "{steps} steps");
}

proptest! {
    /// Packets in order with gaps up to 1,024 (never a resync): every one comes out, each gap
    /// is counted lost, and the window is stepped through at most once per packet, however
    /// far past it the gaps reach.
    #[test]
    fn long_gaps_cost_at_most_a_window_per_packet(
        window in 1usize..=64,
        start: u16,
        gaps in proptest::collection::vec(1u16..=1024, 1..300),
    ) {
        let mut seqs = vec![start];
        for g in &gaps {
            seqs.push(seqs[seqs.len() - 1].wrapping_add(*g));
        }
        STEPS.with(|s| s.set(0));
        let (out, st) = run(window, &seqs);
        let steps = STEPS.with(|s| s.get());
        prop_assert_eq!(&out, &seqs);
        let lost: u64 = gaps.iter().map(|g| u64::from(*g) - 1).sum();
        prop_assert_eq!((st.lost, st.resyncs, st.duplicates), (lost, 0, 0));
        prop_assert!(steps <= (seqs.len() + 1) * (window + 1), "{} steps", steps);
    }

    /// For any window size, a run that crosses the 16-bit wrap with packets lost and moved by
    /// less than the window comes out in sequence order, every surviving packet exactly once,
    /// and every interior gap counted as lost.
    #[test]
    fn any_window_is_correct_across_the_wrap(
        window in 1usize..=4096,
        before_wrap in 0u16..600,
        len in 1usize..1500,
        jitter_seed in proptest::collection::vec(any::<u16>(), 1500),
        drop_every in 0usize..40,
        drop_phase in 0usize..40,
    ) {
        let start = 0u16.wrapping_sub(before_wrap);
        let reach = window.min(64);
        // Sort by index plus a jitter below the window, so no packet moves a window or more.
        let mut keyed: Vec<(usize, usize)> = (0..len)
            .filter(|i| drop_every < 2 || (i + drop_phase) % drop_every != 0)
            .map(|i| (i + usize::from(jitter_seed[i]) % reach, i))
            .collect();
        keyed.sort();
        let arrivals: Vec<usize> = keyed.iter().map(|k| k.1).collect();
        prop_assume!(!arrivals.is_empty());
        let seqs: Vec<u16> = arrivals.iter().map(|&i| start.wrapping_add(i as u16)).collect();
        let (out, st) = run(window, &seqs);

        // The first arrival fixes the base; anything older is late by definition.
        let first = arrivals[0];
        let mut kept: Vec<usize> = arrivals.iter().copied().filter(|&i| i >= first).collect();
        kept.sort_unstable();
        let want: Vec<u16> = kept.iter().map(|&i| start.wrapping_add(i as u16)).collect();
        prop_assert_eq!(&out, &want);
        let last = *kept.last().unwrap();
        prop_assert_eq!(st.lost as usize, last + 1 - first - kept.len());
        prop_assert_eq!(st.resyncs, 0);
    }

    /// Any local shuffle within the window, with duplicates, comes out as the original run.
    #[test]
    fn shuffled_runs_come_back(start: u16, jitter in proptest::collection::vec(0usize..8, 200), dups in proptest::collection::vec(0usize..200, 0..20)) {
        // Each packet moves at most 8 places, well inside the 16-slot window.
        let mut keyed: Vec<(usize, u16)> = (0..200u16).map(|i| (usize::from(i) + jitter[usize::from(i)], start.wrapping_add(i))).collect();
        keyed.sort_by_key(|k| k.0);
        let mut seqs: Vec<u16> = keyed.into_iter().map(|k| k.1).collect();
        for d in dups {
            let s = seqs[d];
            seqs.insert(d, s);
        }
        let (out, st) = run(16, &seqs);
        let want: Vec<u16> = (0..200u16).map(|i| start.wrapping_add(i)).collect();
        // The first packet fixes the base, so anything before it is late by definition.
        let first = seqs[0].wrapping_sub(start) as usize;
        prop_assert_eq!(&out[..], &want[first..]);
        prop_assert_eq!(st.lost, 0);
    }

    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(p) = parse_rtp(&bytes) {
            prop_assert!(p.payload.start <= p.payload.end && p.payload.end <= bytes.len());
        }
    }
}
