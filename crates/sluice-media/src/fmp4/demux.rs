//! TS packets of one segment to whole PES packets of the program's first H.264 and first AAC
//! stream, keeping an audio PES that the segment boundary cut for the next segment. No I/O.

use super::Fmp4Error;
use crate::mpegts::{self, PACKET_LEN};
use crate::segmenter::psi;

/// PMT `stream_type` of H.264 video and of AAC audio in ADTS.
const H264: u8 = 0x1b;
const ADTS: u8 = 0x0f;

/// A carried PES longer than this is noise, not a cut frame.
const MAX_CARRY: usize = 64 * 1024;

/// One PES packet: its timestamps (90 kHz, as stamped) and elementary-stream bytes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pes {
    pub pts: Option<u64>,
    pub dts: Option<u64>,
    pub es: Vec<u8>,
}

/// What one segment holds of the two streams.
#[derive(Debug, Default)]
pub(super) struct Streams {
    /// The PIDs are not those of the last segment.
    pub layout_changed: bool,
    /// `Some` when the program has an H.264 stream (its PES packets, perhaps none).
    pub video: Option<Vec<Pes>>,
    pub audio: Option<Vec<Pes>>,
}

/// The PIDs of the streams written: first H.264 and first AAC stream of the PMT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    video: Option<u16>,
    audio: Option<u16>,
}

#[derive(Debug, Default)]
pub(super) struct Demuxer {
    pat: psi::Collector,
    pmt: psi::Collector,
    pmt_pid: Option<u16>,
    layout: Option<Layout>,
    /// The audio PES being assembled (carried over a segment boundary).
    audio: Option<Vec<u8>>,
}

impl Demuxer {
    pub(super) fn reset(&mut self) {
        self.audio = None;
    }

    /// The PES packets of one segment: whole 188-byte packets; anything else is skipped.
    pub(super) fn segment(&mut self, ts: &[u8]) -> Result<Streams, Fmp4Error> {
        let before = self.layout;
        let mut video: Vec<Pes> = Vec::new();
        let mut audio: Vec<Pes> = Vec::new();
        let mut building: Option<Vec<u8>> = None;
        for pkt in ts.chunks_exact(PACKET_LEN) {
            let Some(h) = mpegts::parse_header(pkt) else {
                continue;
            };
            if h.pid == 0 {
                if let Some((section, _)) = self.pat.push(pkt, &h) {
                    self.pmt_pid = psi::pat_program(&section).or(self.pmt_pid);
                }
                continue;
            }
            if Some(h.pid) == self.pmt_pid {
                if let Some((section, _)) = self.pmt.push(pkt, &h) {
                    self.on_pmt(&section);
                }
                continue;
            }
            let Some(layout) = self.layout else {
                continue;
            };
            let Some(payload) = crate::segmenter::payload(pkt, &h) else {
                continue;
            };
            if Some(h.pid) == layout.video {
                if h.payload_unit_start {
                    if let Some(done) = building.take().and_then(|b| parse(&b)) {
                        video.push(done);
                    }
                    building = Some(payload.to_vec());
                } else if let Some(b) = building.as_mut() {
                    b.extend_from_slice(payload);
                }
            } else if Some(h.pid) == layout.audio {
                if h.payload_unit_start {
                    if let Some(done) = self.audio.take().and_then(|b| parse(&b)) {
                        audio.push(done);
                    }
                    self.audio = Some(payload.to_vec());
                } else if let Some(b) = self.audio.as_mut() {
                    b.extend_from_slice(payload);
                    if b.len() > MAX_CARRY {
                        self.audio = None;
                    }
                }
                // A PES that says how long it is and has all of it is done now.
                if self.audio.as_deref().is_some_and(complete) {
                    if let Some(done) = self.audio.take().and_then(|b| parse(&b)) {
                        audio.push(done);
                    }
                }
            }
        }
        // The segment ends before the next picture: its last one is whole. An audio PES
        // without a length (unbounded) cannot be told apart from a cut one: it ends here too.
        if let Some(done) = building.take().and_then(|b| parse(&b)) {
            video.push(done);
        }
        if self
            .audio
            .as_deref()
            .is_some_and(|b| declared_len(b) == Some(0))
        {
            if let Some(done) = self.audio.take().and_then(|b| parse(&b)) {
                audio.push(done);
            }
        }
        let Some(layout) = self.layout else {
            return Err(Fmp4Error::NoProgram);
        };
        Ok(Streams {
            layout_changed: before.is_some_and(|b| b != layout),
            video: layout.video.map(|_| video),
            audio: layout.audio.map(|_| audio),
        })
    }

    fn on_pmt(&mut self, section: &[u8]) {
        let Some(program) = psi::Program::parse(section) else {
            return;
        };
        let first = |t: u8| {
            program
                .streams
                .iter()
                .find(|(_, st)| *st == t)
                .map(|(pid, _)| *pid)
        };
        let layout = Layout {
            video: first(H264),
            audio: first(ADTS),
        };
        if self.layout.is_some_and(|l| l.audio != layout.audio) {
            self.audio = None;
        }
        self.layout = Some(layout);
    }
}

/// `PES_packet_length` of a PES start: 0 for unbounded, `None` if the start is too short.
fn declared_len(pes: &[u8]) -> Option<usize> {
    pes.get(4..6)
        .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
}

/// A PES whose length field is set and whose bytes have all arrived.
fn complete(pes: &[u8]) -> bool {
    declared_len(pes).is_some_and(|len| len > 0 && pes.len() >= 6 + len)
}

/// A PES packet's timestamps and elementary stream; `None` if it is not one.
fn parse(pes: &[u8]) -> Option<Pes> {
    if pes.len() < 9 || pes[..3] != [0, 0, 1] {
        return None;
    }
    let len = declared_len(pes)?;
    let end = if len == 0 {
        pes.len()
    } else {
        (6 + len).min(pes.len())
    };
    let es_start = 9 + usize::from(pes[8]);
    if es_start > end {
        return None;
    }
    let flags = pes[7] >> 6;
    let stamp = |at: usize| {
        (at + 5 <= es_start)
            .then(|| pes.get(at..at + 5))
            .flatten()
            .map(timestamp)
    };
    let pts = if flags & 0b10 != 0 { stamp(9) } else { None };
    let dts = if flags == 0b11 { stamp(14) } else { None };
    Some(Pes {
        pts,
        dts: dts.or(pts),
        es: pes[es_start..end].to_vec(),
    })
}

fn timestamp(b: &[u8]) -> u64 {
    (u64::from(b[0] >> 1) & 0x07) << 30
        | u64::from(b[1]) << 22
        | u64::from(b[2] >> 1) << 15
        | u64::from(b[3]) << 7
        | u64::from(b[4] >> 1)
}
