//! Ring eviction, reads, laps and start positions.

use super::*;

fn ts(n: usize, keyframe_at: Option<usize>) -> Bytes {
    let mut v = vec![0u8; n * 188];
    for (i, p) in v.chunks_exact_mut(188).enumerate() {
        p[0] = 0x47;
        p[3] = 0x10;
        if Some(i) == keyframe_at {
            p[1] = 0x40;
            p[3] = 0x30;
            p[4] = 7;
            p[5] = 0x40;
        }
    }
    Bytes::from(v)
}

/// What a chunk of one 1,316-byte RTP payload is charged.
const C: usize = 1316 + CHUNK_OVERHEAD;

#[test]
fn evicts_by_bytes_and_reports_laps() {
    let mut r = Ring::new(3 * C, 0);
    for _ in 0..5 {
        r.push(ts(7, None));
    }
    assert_eq!((r.end(), r.bytes()), (5, 3 * 1316));
    let mut out = VecDeque::new();
    let mut pos = Position {
        index: 0,
        offset: 0,
    };
    assert_eq!(r.read(&mut pos, 5, 1 << 20, &mut out), Read::Lapped);
    pos.index = 3;
    assert_eq!(r.read(&mut pos, 4, 1 << 20, &mut out), Read::Chunks(1));
    assert_eq!(r.read(&mut pos, 5, 1, &mut out), Read::Chunks(1));
    assert_eq!(pos.index, 5);
    assert_eq!(r.lag(3), Some(2 * 1316));
    assert_eq!(r.lag(4), Some(1316));
    assert_eq!(r.lag(5), Some(0));
    assert_eq!(r.lag(u64::MAX), Some(0), "not placed yet");
    assert_eq!(r.lag(1), None);
}

#[test]
fn starts_on_keyframe_then_packet_boundary() {
    let mut r = Ring::new(1 << 20, 0);
    r.push(ts(7, None));
    r.push(ts(7, Some(3)));
    r.push(ts(7, None));
    let p = r.start(3, 10_000);
    assert_eq!(
        p,
        Position {
            index: 1,
            offset: 3 * 188
        }
    );
    // Burst too small to reach the keyframe: newest whole chunks only.
    assert_eq!(
        r.start(3, 1316),
        Position {
            index: 2,
            offset: 0
        }
    );
    assert_eq!(
        r.start(3, 0),
        Position {
            index: 3,
            offset: 0
        }
    );
    let mut junk = vec![1u8, 2, 3];
    junk.extend_from_slice(&ts(3, None));
    let mut r = Ring::new(1 << 20, 0);
    r.push(Bytes::from(junk));
    assert_eq!(
        r.start(1, 10_000),
        Position {
            index: 0,
            offset: 3
        }
    );
}

#[test]
fn release_keeps_history_and_unread_chunks() {
    // The history is payload (what a burst looks back over), the capacity charged per chunk.
    let mut r = Ring::new(10 * C, 2 * 1316);
    for _ in 0..6 {
        r.push(ts(7, None));
    }
    assert_eq!(r.bytes(), 6 * 1316);
    // The slowest reader is at index 3: chunks 0..3 may go.
    r.release(3);
    assert_eq!((r.base(), r.bytes()), (3, 3 * 1316));
    // Nobody reading: down to the history, never below it.
    r.release(u64::MAX);
    assert_eq!((r.base(), r.bytes()), (4, 2 * 1316));
    // A reader far behind holds chunks only up to the capacity.
    r.release(0);
    for _ in 0..20 {
        r.push(ts(7, None));
    }
    assert_eq!(r.bytes(), 10 * 1316);
}

/// Attack: a sender whose every payload is a chunk of its own (1-byte RTP payloads in
/// swapped pairs). The ring's bounds count each chunk's overhead, so they bound how many
/// chunks (and handles per read) a channel holds, not only their bytes.
#[test]
fn tiny_chunks_are_bounded_by_count_too() {
    let capacity = 1 << 20;
    let history = 1 << 18;
    let mut r = Ring::new(capacity, history);
    for i in 0..200_000u32 {
        r.push(Bytes::from(vec![i as u8]));
    }
    let most = capacity / (1 + CHUNK_OVERHEAD);
    assert!(r.chunks.len() <= most, "{} chunks held", r.chunks.len());
    assert_eq!(r.bytes(), r.chunks.len());
    assert_eq!(r.end(), 200_000);
    // Nobody reading: down to the history of payload, the chunks still within the capacity's
    // count.
    r.release(u64::MAX);
    assert!(r.chunks.len() <= most, "{} chunks held", r.chunks.len());
    assert!(r.bytes() >= history.min(most));
    assert_eq!(r.lag(r.base()), Some(r.bytes()));
    // A reader's fill clones at most `max_bytes / CHUNK_OVERHEAD` handles.
    let mut out = VecDeque::new();
    let mut pos = Position {
        index: r.base(),
        offset: 0,
    };
    let max = 256 * 1024;
    let Read::Chunks(n) = r.read(&mut pos, r.end(), max, &mut out) else {
        panic!("lapped")
    };
    assert!(n > 0 && n <= max / CHUNK_OVERHEAD + 1, "{n} handles cloned");
    // What it got is the oldest bytes held, in order.
    let first = r.base() as u32;
    let want: Vec<u8> = (first..first + out.len() as u32).map(|i| i as u8).collect();
    assert_eq!(
        out.iter()
            .flat_map(|b| b.iter().copied())
            .collect::<Vec<_>>(),
        want
    );
}

#[test]
fn start_inside_a_large_chunk_is_packet_aligned() {
    let mut r = Ring::new(1 << 20, 0);
    r.push(ts(40, None));
    r.push(ts(40, Some(35)));
    // A burst reaching 10 packets and a bit into the second chunk: the keyframe is at 35.
    let p = r.start(2, 10 * 188 + 50);
    assert_eq!(
        p,
        Position {
            index: 1,
            offset: 35 * 188
        }
    );
    // Into the first chunk with no keyframe after it: the next packet boundary.
    let mut r = Ring::new(1 << 20, 0);
    r.push(ts(40, None));
    r.push(ts(40, None));
    assert_eq!(
        r.start(2, 40 * 188 + 300),
        Position {
            index: 0,
            offset: 39 * 188
        }
    );
    // Less than a packet into the first chunk: the second chunk's first packet.
    assert_eq!(
        r.start(2, 40 * 188 + 100),
        Position {
            index: 1,
            offset: 0
        }
    );
    // Non-TS payload: whole chunks only, never more than the burst.
    let mut r = Ring::new(1 << 20, 0);
    r.push(Bytes::from(vec![1u8; 1000]));
    r.push(Bytes::from(vec![2u8; 1000]));
    assert_eq!(
        r.start(2, 1500),
        Position {
            index: 1,
            offset: 0
        }
    );
}

/// The history a new viewer's burst looks back over is payload: chunks' per-chunk charge does
/// not eat into it (charged, a 1 MiB burst kept about 5 % less, and a keyframe in that slice
/// was lost to the viewer's start).
#[test]
fn the_history_keeps_its_payload() {
    let history = 10 * 1316 + 1;
    let mut r = Ring::new(100 * C, history);
    for _ in 0..50 {
        r.push(ts(7, None));
    }
    r.release(u64::MAX);
    assert!(r.bytes() >= history, "{} bytes kept", r.bytes());
    assert_eq!(r.bytes(), 11 * 1316);
}
