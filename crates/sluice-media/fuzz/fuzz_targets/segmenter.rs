//! Fuzzes the IPTV HLS segmenter on raw MPEG-TS from a source: never a panic, and every segment
//! and part it gives out is whole TS packets, within the byte bound and a bounded duration, with
//! a segment's parts adding up to the segment. Aligned input cut into any chunks gives the same
//! segments as when pushed at once.
//!
//! Framing: a settings byte (bits 0-2 target duration 1-8 s, bits 3-4 part target none / 200 /
//! 500 / 1000 ms, bit 5 put a real PAT and PMT in front, bits 6-7 the PMT's timing stream:
//! H.264, H.265, MPEG-2 video or AAC), a chunk byte (0 pushes each piece at once, else chunks of
//! 3 x n bytes), a byte whose bits 0-6 set `max_bytes` (8 KiB steps) and whose bit 7 overwrites
//! every 188th byte with 0x47 (aligned input), then the stream. `ff 00 ff 00` in the stream marks
//! a gap (`Segmenter::gap`) between the pieces around it (at most 16).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use sluice_media::segmenter::{Part, Segment, Segmenter, Settings, CLOCK};

const PACKET: usize = 188;
/// PAT plus PMT as a segment repeats them: each table is kept to 16 packets (`psi::MAX_PACKETS`).
const TABLES: usize = 2 * 16 * PACKET;
/// A larger timestamp step is a break, not time passing (`segmenter::MAX_STEP`).
const MAX_STEP: u64 = 10 * CLOCK;

/// PAT (program 1 → PMT PID 0x1000) and a PMT with the timing stream on PID 0x100 and AAC on
/// 0x101. The segmenter does not check the CRC, so any stream type can be put in.
fn tables(stream_type: u8) -> Vec<u8> {
    let mut pat = vec![0x47, 0x40, 0x00, 0x10, 0x00];
    pat.extend_from_slice(&[
        0x00, 0xb0, 0x0d, 0x00, 0x01, 0xc1, 0x00, 0x00, 0x00, 0x01, 0xf0, 0x00, 0x2a, 0xb1, 0x04,
        0xb2,
    ]);
    pat.resize(PACKET, 0xff);
    let mut pmt = vec![0x47, 0x50, 0x00, 0x10, 0x00];
    pmt.extend_from_slice(&[
        0x02,
        0xb0,
        0x17,
        0x00,
        0x01,
        0xc1,
        0x00,
        0x00,
        0xe1,
        0x00,
        0xf0,
        0x00,
        stream_type,
        0xe1,
        0x00,
        0xf0,
        0x00,
        0x0f,
        0xe1,
        0x01,
        0xf0,
        0x00,
        0x2f,
        0x44,
        0xb9,
        0x9b,
    ]);
    pmt.resize(PACKET, 0xff);
    pat.extend_from_slice(&pmt);
    pat
}

/// Segments and parts handed out, in order.
#[derive(Default)]
struct Out {
    segments: Vec<Segment>,
    parts: Vec<Part>,
}

impl Out {
    fn drain(&mut self, s: &mut Segmenter) {
        // Parts first: a segment's last part comes with the segment.
        self.parts.extend(s.take_parts());
        self.segments.extend(s.take());
    }
}

fn run(settings: Settings, pieces: &[Vec<u8>], chunk: usize) -> Out {
    let mut s = Segmenter::new(settings);
    let mut out = Out::default();
    for (i, piece) in pieces.iter().enumerate() {
        if i > 0 {
            s.gap();
        }
        for c in piece.chunks(chunk.max(1)) {
            s.push(c);
            out.drain(&mut s);
        }
    }
    s.finish();
    out.drain(&mut s);
    out
}

fn check(settings: Settings, out: &Out) {
    let whole = |b: &[u8]| b.len().is_multiple_of(PACKET) && b.chunks(PACKET).all(|p| p[0] == 0x47);
    let mut parts: BTreeMap<u64, Vec<&Part>> = BTreeMap::new();
    for p in &out.parts {
        assert!(
            !p.data.is_empty() && whole(&p.data),
            "part of whole packets"
        );
        parts.entry(p.number).or_default().push(p);
    }
    let mut last = None;
    for seg in &out.segments {
        assert!(whole(&seg.data), "segment of whole packets");
        assert!(seg.data.len() <= settings.max_bytes + PACKET + TABLES);
        assert!(seg.duration > 0);
        assert!(seg.duration <= settings.target + CLOCK / 2 + MAX_STEP);
        assert!(last.is_none_or(|n| seg.number > n), "numbers increase");
        last = Some(seg.number);
        if settings.part > 0 {
            let mine = parts.remove(&seg.number).unwrap_or_default();
            assert!(mine.iter().enumerate().all(|(i, p)| p.index as usize == i));
            assert_eq!(mine.first().map(|p| p.independent), Some(seg.keyframe));
            let joined: Vec<u8> = mine.iter().flat_map(|p| p.data.iter().copied()).collect();
            assert!(joined == seg.data[..], "a segment's parts are the segment");
        }
    }
    // Parts only ever belong to a segment that was given out.
    assert!(parts.is_empty(), "parts of no segment: {:?}", parts.keys());
}

fuzz_target!(|data: &[u8]| {
    let [flags, chunk, size, stream @ ..] = data else {
        return;
    };
    let part = [0, 200, 500, 1000][usize::from(flags >> 3 & 3)] * CLOCK / 1000;
    let settings = Settings {
        target: u64::from(1 + (flags & 7)) * CLOCK,
        max_bytes: (1 + usize::from(size & 0x7f)) * 8192,
        part,
    };
    let aligned = size & 0x80 != 0;
    let head = tables([0x1b, 0x24, 0x02, 0x0f][usize::from(flags >> 6)]);
    let mut pieces: Vec<Vec<u8>> = split(stream)
        .into_iter()
        .take(16)
        .map(<[u8]>::to_vec)
        .collect();
    if flags & 0x20 != 0 {
        pieces[0].splice(0..0, head);
    }
    if aligned {
        for piece in &mut pieces {
            piece.iter_mut().step_by(PACKET).for_each(|b| *b = 0x47);
        }
    }
    let chunk = if *chunk == 0 {
        usize::MAX
    } else {
        3 * usize::from(*chunk)
    };
    let out = run(settings, &pieces, chunk);
    check(settings, &out);
    if aligned && chunk != usize::MAX {
        // Whole packets line up however they are cut: the same segments as in one push.
        let once = run(settings, &pieces, usize::MAX);
        let key = |o: &Out| {
            o.segments
                .iter()
                .map(|s| {
                    (
                        s.data.clone(),
                        s.duration,
                        s.keyframe,
                        s.discontinuity,
                        s.number,
                    )
                })
                .collect::<Vec<_>>()
        };
        assert!(key(&out) == key(&once), "chunking changed the segments");
    }
});

/// The input cut at every `ff 00 ff 00`.
fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(at) = rest.windows(4).position(|w| w == [0xff, 0, 0xff, 0]) {
        out.push(&rest[..at]);
        rest = &rest[at + 4..];
    }
    out.push(rest);
    out
}
