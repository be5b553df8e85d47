//! PES headers (timestamps, where the elementary stream starts) and keyframe detection in
//! H.264, H.265 and MPEG-2 video. No I/O.

use super::psi::Codec;

/// Most elementary-stream bytes looked at to decide whether a picture is a keyframe (parameter
/// sets and SEI come first, and are usually far smaller).
pub(crate) const MAX_PROBE: usize = 64 * 1024;

/// A PES packet's header: decoding timestamp (the presentation one when there is no other) and
/// the offset of its elementary-stream bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PesHeader {
    pub dts: Option<u64>,
    pub es_offset: usize,
}

/// Parses the start of a PES packet; `None` if it is not one.
pub(crate) fn parse(pes: &[u8]) -> Option<PesHeader> {
    if pes.len() < 9 || pes[..3] != [0, 0, 1] {
        return None;
    }
    let stream_id = pes[3];
    // Streams without the optional header (padding, private 2, ECM/EMM, directory...).
    if matches!(
        stream_id,
        0xbc | 0xbe | 0xbf | 0xf0 | 0xf1 | 0xf2 | 0xf8 | 0xff
    ) {
        return Some(PesHeader {
            dts: None,
            es_offset: 6,
        });
    }
    let flags = pes[7] >> 6;
    let es_offset = 9 + usize::from(pes[8]);
    let stamp = |at: usize| pes.get(at..at + 5).map(timestamp);
    let dts = match flags {
        0b11 => stamp(14).or_else(|| stamp(9)),
        0b10 => stamp(9),
        _ => None,
    };
    Some(PesHeader { dts, es_offset })
}

fn timestamp(b: &[u8]) -> u64 {
    (u64::from(b[0] >> 1) & 0x07) << 30
        | u64::from(b[1]) << 22
        | u64::from(b[2] >> 1) << 15
        | u64::from(b[3]) << 7
        | u64::from(b[4] >> 1)
}

/// Whether the picture whose elementary-stream bytes begin `es` is a random-access point:
/// `Some` once a slice (or MPEG-2 picture or sequence header) says so, `None` while only
/// parameter sets, delimiters and SEI have been seen.
pub(crate) fn keyframe(codec: Codec, es: &[u8], from: usize) -> Option<bool> {
    let mut at = from;
    while let Some(found) = memchr::memmem::find(&es[at..], &[0, 0, 1]) {
        let unit = at + found + 3;
        let &head = es.get(unit)?;
        let verdict = match codec {
            Codec::H264 => match head & 0x1f {
                5 => Some(true),
                1..=4 => Some(false),
                _ => None,
            },
            Codec::Hevc => match (head >> 1) & 0x3f {
                16..=21 => Some(true),
                0..=9 => Some(false),
                _ => None,
            },
            Codec::Mpeg2 => match head {
                0xb3 => Some(true),
                0x00 => {
                    let coding = es.get(unit + 2)?;
                    Some((coding >> 3) & 0x07 == 1)
                }
                _ => None,
            },
            _ => return None,
        };
        if verdict.is_some() {
            return verdict;
        }
        at = unit;
    }
    None
}
