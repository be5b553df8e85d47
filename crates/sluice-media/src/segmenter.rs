//! Live MPEG-TS cut into HLS media segments at random-access points. No I/O.
//!
//! The gateway feeds a channel's TS once (whatever number of viewers it has) through
//! [`Segmenter::push`], in chunks of any size. A segment ends where a keyframe of the timing
//! stream (the first video stream, else the first audio stream) begins, once it is long enough;
//! every segment starts with the latest PAT and PMT repeated, then that keyframe's first packet,
//! so each one decodes on its own. The stream is otherwise kept byte for byte: the segments,
//! concatenated without their repeated tables, are the input from the first keyframe on.
//!
//! Durations come from the timing stream's decoding timestamps (90 kHz, wrapping at 2^33). A
//! segment is cut at a keyframe when it has reached the target, or when waiting for the next
//! keyframe (one GOP more, as the last GOP was) would overshoot it; when no keyframe comes in
//! time, it is cut at the next picture anyway (the segment is marked not independent), so no
//! segment is ever longer than the target duration rounds to. A timestamp that jumps (a sender
//! restart), a PAT or PMT that describes another layout (new PIDs), or a gap in the input
//! ([`Segmenter::gap`]) ends the segment and marks the next one as a discontinuity; after it,
//! cutting waits for a keyframe again.
//!
//! For low-latency HLS ([`Settings::part`]), each segment is also cut into partial segments as
//! it grows, at picture starts: a part never lasts longer than the part target, a keyframe
//! begins a new (independent) part, and the parts of a GOP are of even length. A segment's
//! parts, concatenated, are the segment. Their number is bounded: past three times the part
//! targets that fit in a segment, keyframes no longer begin parts, and past [`MAX_PARTS`] nothing does.
//!
//! # Layout
//! - `psi`: PAT and PMT reassembly and parsing.
//! - `pes`: PES headers and keyframe detection (H.264, H.265, MPEG-2 video).
//! - `playlist`: the live media playlist for a window of segments.

mod pes;
pub mod playlist;
pub(crate) mod psi;

use bytes::Bytes;

pub use psi::Codec;

use crate::mpegts::{self, TsHeader, PACKET_LEN, SYNC_BYTE};

/// TS timestamps count at 90 kHz.
pub const CLOCK: u64 = 90_000;
/// Timestamps wrap at 2^33.
const WRAP: u64 = 1 << 33;
/// A timestamp step larger than this (or any step back) is a break in the stream, not time
/// passing: a sender that restarted, or a splice.
const MAX_STEP: u64 = 10 * CLOCK;

/// Most parts a segment is ever cut into, whatever its settings: past it the rest of the
/// segment is its last part. A source can make every picture a keyframe one tick after the
/// last (one packet each), which would otherwise make a part of each, ~178,000 to a 32 MiB
/// segment, every one of them listed in each playlist. 1,000 is above the crowding cap of the
/// busiest configuration the gateway accepts (30 s segments of 100 ms parts, three times over:
/// 900).
const MAX_PARTS: u32 = 1_000;

/// One finished media segment.
#[derive(Debug, Clone)]
pub struct Segment {
    /// PAT, PMT, then the stream from a picture start.
    pub data: Bytes,
    /// In 90 kHz ticks.
    pub duration: u64,
    /// Starts on a keyframe (false only when none came within the target duration).
    pub keyframe: bool,
    /// The stream before it was broken off (restart, new PIDs, lost input).
    pub discontinuity: bool,
    /// Decoding timestamp of its first picture (90 kHz, as the source stamped it).
    pub start: u64,
    /// The segmenter's count of segments begun before this one: its parts carry the same.
    pub number: u64,
}

/// One partial segment (low-latency HLS): part `index` of segment `number`.
#[derive(Debug, Clone)]
pub struct Part {
    /// [`Segment::number`] of the segment it belongs to.
    pub number: u64,
    /// Its place in that segment, from 0 (the first part holds the PAT and PMT).
    pub index: u32,
    pub data: Bytes,
    /// In 90 kHz ticks.
    pub duration: u64,
    /// Begins with a keyframe (decodes on its own).
    pub independent: bool,
}

/// Tunables of a [`Segmenter`].
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Target duration in 90 kHz ticks.
    pub target: u64,
    /// A segment that grows past this many bytes (a stream without usable timestamps) is
    /// ended as if the input had a gap.
    pub max_bytes: usize,
    /// Part target duration in 90 kHz ticks; 0 makes no parts.
    pub part: u64,
}

/// Where a picture of the timing stream begins, while its keyframe-ness is being decided.
#[derive(Debug)]
struct Probe {
    /// Offset of its first packet in `buf`.
    offset: usize,
    dts: u64,
    /// Elementary-stream bytes seen so far (for the NAL scan).
    es: Vec<u8>,
    scanned: usize,
}

/// The segment being built.
#[derive(Debug)]
struct Building {
    start: u64,
    last: u64,
    keyframe: bool,
    discontinuity: bool,
    number: u64,
    /// Bytes of PAT and PMT put in front of it at its start. A table that completes later
    /// replaces the latest ones, not these: judged by the new length, a short segment whose
    /// first parts were already handed out could be dropped.
    tables: usize,
    /// The part being built: its offset in `buf`, first timestamp, index and independence.
    part_from: usize,
    part_start: u64,
    part_index: u32,
    part_independent: bool,
}

/// The live cutter of one channel.
#[derive(Debug)]
pub struct Segmenter {
    settings: Settings,
    /// A partial packet left over from the last chunk.
    carry: Vec<u8>,
    pat: psi::Collector,
    pmt: psi::Collector,
    /// Latest PAT packets, and the PMT PID they name.
    pat_packets: Vec<u8>,
    pmt_pid: Option<u16>,
    /// Latest PMT packets, the layout they describe, and its timing stream.
    pmt_packets: Vec<u8>,
    program: Option<psi::Program>,
    timing: Option<(u16, Codec)>,
    /// Bytes of the segment being built (from its head), or, while waiting, from the probe.
    buf: Vec<u8>,
    building: Option<Building>,
    probe: Option<Probe>,
    /// First timestamp seen while waiting for a keyframe.
    waiting_since: Option<u64>,
    /// The next segment follows a break.
    pending_discontinuity: bool,
    /// Ticks between the last two pictures, and between the last two keyframes.
    frame: u64,
    gop: u64,
    last_keyframe: Option<u64>,
    /// Decoding timestamp of the newest picture seen.
    latest: Option<u64>,
    /// Segments begun so far.
    begun: u64,
    done: Vec<Segment>,
    parts: Vec<Part>,
}

impl Segmenter {
    pub fn new(settings: Settings) -> Segmenter {
        Segmenter {
            settings,
            carry: Vec::with_capacity(PACKET_LEN),
            pat: psi::Collector::default(),
            pmt: psi::Collector::default(),
            pat_packets: Vec::new(),
            pmt_pid: None,
            pmt_packets: Vec::new(),
            program: None,
            timing: None,
            buf: Vec::new(),
            building: None,
            probe: None,
            waiting_since: None,
            pending_discontinuity: false,
            frame: 0,
            gop: 0,
            last_keyframe: None,
            latest: None,
            begun: 0,
            done: Vec::new(),
            parts: Vec::new(),
        }
    }

    /// The timing stream's PID and coding, once a PMT has named one.
    pub fn timing(&self) -> Option<(u16, Codec)> {
        self.timing
    }

    /// Decoding timestamp of the newest picture (or audio frame) of the timing stream: with the
    /// time it arrived, the anchor that puts segments on the wall clock.
    pub fn latest(&self) -> Option<u64> {
        self.latest
    }

    /// Takes TS bytes in any chunking; bytes before a packet boundary are skipped until the
    /// stream lines up again.
    pub fn push(&mut self, mut chunk: &[u8]) {
        if !self.carry.is_empty() {
            let need = PACKET_LEN - self.carry.len();
            let take = need.min(chunk.len());
            self.carry.extend_from_slice(&chunk[..take]);
            if self.carry.len() < PACKET_LEN {
                return;
            }
            let pkt = std::mem::take(&mut self.carry);
            // The completed packet counts only if the next one lines up behind it; otherwise
            // the carried bytes were noise and the chunk is searched for sync afresh.
            if chunk.get(take).is_none_or(|&b| b == SYNC_BYTE) {
                self.packet(&pkt);
                chunk = &chunk[take..];
            }
            self.carry = pkt;
            self.carry.clear();
        }
        while !chunk.is_empty() {
            if chunk[0] != SYNC_BYTE {
                match mpegts::find_sync(chunk) {
                    Some(at) => chunk = &chunk[at..],
                    None => {
                        // No offset of the chunk starts a packet, and none of its tail would
                        // either (`find_sync` tried them all), so only a 0x47 in its last 187
                        // bytes may start one the next chunk completes: keep from there. Trying
                        // again after each stray 0x47 cost the chunk's length per 0x47.
                        let tail = chunk.len().saturating_sub(PACKET_LEN - 1);
                        let at = memchr::memchr(SYNC_BYTE, &chunk[tail..])
                            .map_or(chunk.len(), |i| tail + i);
                        chunk = &chunk[at..];
                    }
                }
            }
            if chunk.len() < PACKET_LEN {
                self.carry.extend_from_slice(chunk);
                return;
            }
            let (pkt, rest) = chunk.split_at(PACKET_LEN);
            self.packet(pkt);
            chunk = rest;
        }
    }

    /// Input was lost (the reader fell behind, the source broke): the segment so far is kept,
    /// and the next one is a discontinuity.
    pub fn gap(&mut self) {
        self.carry.clear();
        self.break_all();
    }

    /// The input ended: the segment being built is finished as it stands.
    pub fn finish(&mut self) {
        self.break_all();
    }

    /// Segments finished since the last call, oldest first.
    pub fn take(&mut self) -> Vec<Segment> {
        std::mem::take(&mut self.done)
    }

    /// Parts finished since the last call, oldest first (none unless [`Settings::part`] is set).
    /// Take them before [`Segmenter::take`]: a segment's last part comes with the segment.
    pub fn take_parts(&mut self) -> Vec<Part> {
        std::mem::take(&mut self.parts)
    }

    fn packet(&mut self, pkt: &[u8]) {
        let Some(h) = mpegts::parse_header(pkt) else {
            return;
        };
        if h.pid == 0 {
            if let Some((section, packets)) = self.pat.push(pkt, &h) {
                self.on_pat(&section, packets);
            }
        } else if Some(h.pid) == self.pmt_pid {
            if let Some((section, packets)) = self.pmt.push(pkt, &h) {
                self.on_pmt(&section, packets);
            }
        }
        let timing = self.timing;
        match timing {
            Some((pid, codec)) if pid == h.pid => self.timing_packet(pkt, &h, codec),
            _ => {
                if self.building.is_some() || self.probe.is_some() {
                    self.buf.extend_from_slice(pkt);
                }
            }
        }
        if self.buf.len() > self.settings.max_bytes {
            self.gap();
        }
    }

    fn on_pat(&mut self, section: &[u8], packets: Vec<u8>) {
        let Some(pmt_pid) = psi::pat_program(section) else {
            return;
        };
        if self.pmt_pid.is_some_and(|p| p != pmt_pid) {
            self.layout_changed();
            self.program = None;
            self.timing = None;
            self.pmt_packets.clear();
            self.pmt = psi::Collector::default();
        }
        self.pmt_pid = Some(pmt_pid);
        self.pat_packets = packets;
    }

    fn on_pmt(&mut self, section: &[u8], packets: Vec<u8>) {
        let Some(program) = psi::Program::parse(section) else {
            return;
        };
        if self.program.as_ref().is_some_and(|p| *p != program) {
            self.layout_changed();
        }
        self.timing = program.timing();
        self.program = Some(program);
        self.pmt_packets = packets;
    }

    /// New PIDs: what was built so far is a segment of the old layout.
    fn layout_changed(&mut self) {
        self.break_all();
    }

    /// Ends the segment being built with everything received, and forgets the picture being
    /// probed: the next segment waits for a keyframe.
    fn break_all(&mut self) {
        let end = self.buf.len();
        self.break_off(end);
        self.probe = None;
        self.buf.clear();
    }

    fn timing_packet(&mut self, pkt: &[u8], h: &TsHeader, codec: Codec) {
        let payload = payload(pkt, h).unwrap_or_default();
        if h.payload_unit_start {
            if let Some(header) = pes::parse(payload) {
                if let Some(dts) = header.dts {
                    self.latest = Some(dts);
                    // The picture before was never shown to be a keyframe.
                    if self.probe.is_some() {
                        self.decide(false);
                    }
                    let es = payload.get(header.es_offset..).unwrap_or_default();
                    self.probe = Some(Probe {
                        offset: self.buf.len(),
                        dts,
                        es: Vec::new(),
                        scanned: 0,
                    });
                    self.buf.extend_from_slice(pkt);
                    let verdict = match codec {
                        Codec::Audio => Some(true),
                        _ if h.random_access => Some(true),
                        _ => self.scan(codec, es),
                    };
                    if let Some(k) = verdict {
                        self.decide(k);
                    }
                    return;
                }
            }
        }
        if self.building.is_some() || self.probe.is_some() {
            self.buf.extend_from_slice(pkt);
        }
        if self.probe.is_some() && !h.payload_unit_start {
            if let Some(k) = self.scan(codec, payload) {
                self.decide(k);
            }
        }
    }

    /// Adds elementary-stream bytes to the probe and looks for the picture's first slice.
    fn scan(&mut self, codec: Codec, es: &[u8]) -> Option<bool> {
        let probe = self.probe.as_mut()?;
        probe.es.extend_from_slice(es);
        let verdict = pes::keyframe(codec, &probe.es, probe.scanned);
        if verdict.is_none() {
            probe.scanned = probe.es.len().saturating_sub(5);
            if probe.es.len() >= pes::MAX_PROBE {
                return Some(false);
            }
        }
        verdict
    }

    /// The probe's picture is (or is not) a keyframe: start, cut, or keep waiting.
    fn decide(&mut self, keyframe: bool) {
        // Decided: later packets of this picture are not scanned.
        let Some(Probe { offset, dts, .. }) = self.probe.take() else {
            return;
        };
        let frame = self.frame.max(1);
        let Some(seg) = self.building.as_ref() else {
            return self.decide_waiting(offset, dts, keyframe);
        };
        let step = dts.wrapping_sub(seg.last) & (WRAP - 1);
        if step > MAX_STEP {
            // Back in time or far ahead: a restart or a splice.
            self.break_off(offset);
            // The picture now starts `buf`.
            return self.decide_waiting(0, dts, keyframe);
        }
        let elapsed = dts.wrapping_sub(seg.start) & (WRAP - 1);
        let limit = self.settings.target + CLOCK / 2 - 1;
        if elapsed > limit {
            // A step forward (under `MAX_STEP`) that would carry the segment past the target:
            // the segment ends a picture after its last, within the target (a segment longer
            // than it would change the playlist's target duration, RFC 8216 6.2.1). A hole of
            // more than a second is a break: the picture waits to start the next segment, a
            // discontinuity. A step of a second or less (a dropped frame, jitter, a telecine
            // cadence, a stream of one picture a second) starts
            // the next segment at this picture, with no discontinuity and nothing lost (a short
            // gap in its timeline, as the pictures have).
            if step > CLOCK {
                self.break_off(offset);
                return self.decide_waiting(0, dts, keyframe);
            }
            if keyframe {
                self.last_keyframe = Some(dts);
            }
            self.close(offset, None);
            self.start(0, dts, keyframe);
            return;
        }
        if step > 0 && step <= CLOCK {
            self.frame = step;
        }
        let cut = if keyframe {
            elapsed >= self.settings.target || (elapsed > 0 && elapsed + self.gop > limit)
        } else {
            elapsed + frame > limit
        };
        if keyframe {
            if let Some(prev) = self.last_keyframe {
                let gop = dts.wrapping_sub(prev) & (WRAP - 1);
                if gop > 0 && gop <= MAX_STEP {
                    self.gop = gop;
                }
            }
            self.last_keyframe = Some(dts);
        }
        if cut {
            self.close(offset, Some(dts));
            self.start(0, dts, keyframe);
        } else if let Some(seg) = self.building.as_mut() {
            seg.last = dts;
            if self.settings.part > 0 {
                self.cut_part(offset, dts, keyframe);
            }
        }
    }

    /// Ends the part being built before the picture at `offset` when the picture is a video
    /// keyframe (it starts an independent part) or when the part has its length.
    ///
    /// A segment that already has [`Segmenter::part_cap`] parts (keyframes far more often than
    /// parts: a hostile source, or one of only keyframes) is crowded: from then on keyframes no
    /// longer begin parts and parts are cut on the part target alone, so each lasts more than
    /// half of it (a part lasts at least the step to the picture that ends it); and it is
    /// never cut into more than [`MAX_PARTS`].
    fn cut_part(&mut self, offset: usize, dts: u64, keyframe: bool) {
        let cap = self.part_cap();
        let frame = self.frame.max(1);
        let audio = matches!(self.timing, Some((_, Codec::Audio)));
        let Some(seg) = self.building.as_ref() else {
            return;
        };
        // `part_index` parts are out; the one being built is the segment's last so far.
        let crowded = seg.part_index + 1 >= cap;
        if seg.part_index + 1 >= MAX_PARTS {
            return;
        }
        let video_key = keyframe && !audio && !crowded;
        let span = if crowded {
            self.settings.part
        } else {
            self.part_span()
        };
        let Some(seg) = self.building.as_mut() else {
            return;
        };
        let elapsed = dts.wrapping_sub(seg.part_start) & (WRAP - 1);
        if elapsed == 0 || offset <= seg.part_from {
            return;
        }
        if !(video_key || elapsed + frame / 2 >= span || elapsed + frame > self.settings.part) {
            return;
        }
        self.parts.push(Part {
            number: seg.number,
            index: seg.part_index,
            data: Bytes::copy_from_slice(&self.buf[seg.part_from..offset]),
            duration: elapsed,
            independent: seg.part_independent,
        });
        seg.part_from = offset;
        seg.part_start = dts;
        seg.part_index += 1;
        seg.part_independent = keyframe;
    }

    /// Parts a segment has before it is crowded (see [`Segmenter::cut_part`]): three times as
    /// many as part targets fit in the target duration, and at most [`MAX_PARTS`]. Twice was
    /// exactly full for an ordinary stream: at 29.97 fps a 1 s part holds 29 pictures and a 1 s
    /// GOP has 30, so each GOP is two parts; three times leaves room for scene cuts beside that.
    fn part_cap(&self) -> u32 {
        let fit = self.settings.target.div_ceil(self.settings.part.max(1));
        u32::try_from(fit.saturating_mul(3))
            .unwrap_or(MAX_PARTS)
            .min(MAX_PARTS)
    }

    /// The length a part is cut at: as many pictures as fit in the part target, spread evenly
    /// over the GOP so that the part before a keyframe is not a sliver.
    fn part_span(&self) -> u64 {
        let frame = self.frame.max(1);
        let most = (self.settings.part / frame).max(1);
        if self.gop == 0 {
            return most * frame;
        }
        let pictures = ((self.gop + frame / 2) / frame).max(1);
        let parts = pictures.div_ceil(most);
        pictures.div_ceil(parts) * frame
    }

    fn decide_waiting(&mut self, offset: usize, dts: u64, keyframe: bool) {
        // What came before the picture cannot start a segment.
        self.buf.drain(..offset.min(self.buf.len()));
        let since = *self.waiting_since.get_or_insert(dts);
        let waited = dts.wrapping_sub(since) & (WRAP - 1);
        if waited > MAX_STEP {
            self.waiting_since = Some(dts);
        }
        if keyframe {
            self.last_keyframe = Some(dts);
        }
        if keyframe || (waited >= self.settings.target && waited <= MAX_STEP) {
            self.start(0, dts, keyframe);
        }
    }

    /// A segment begins at `offset` of `buf` (the tables are put in front of it).
    fn start(&mut self, offset: usize, dts: u64, keyframe: bool) {
        let tables = self.pat_packets.len() + self.pmt_packets.len();
        let mut head = Vec::with_capacity(tables + self.buf.len() - offset);
        head.extend_from_slice(&self.pat_packets);
        head.extend_from_slice(&self.pmt_packets);
        head.extend_from_slice(&self.buf[offset..]);
        self.buf = head;
        self.waiting_since = None;
        self.building = Some(Building {
            start: dts,
            last: dts,
            keyframe,
            discontinuity: std::mem::take(&mut self.pending_discontinuity),
            number: self.begun,
            tables,
            part_from: 0,
            part_start: dts,
            part_index: 0,
            part_independent: keyframe,
        });
        self.begun += 1;
    }

    /// A break at `end` of `buf`: the segment being built ends there, the next one is a
    /// discontinuity and starts on a keyframe.
    fn break_off(&mut self, end: usize) {
        if self.building.is_some() {
            self.close(end, None);
            self.pending_discontinuity = true;
        }
        self.waiting_since = None;
        self.last_keyframe = None;
        self.gop = 0;
    }

    /// Ends the segment being built at `end` of `buf`, lasting until `until` (a timestamp)
    /// or, without one, until one picture after its last. Bytes after `end` stay in `buf`.
    fn close(&mut self, end: usize, until: Option<u64>) {
        let Some(seg) = self.building.take() else {
            return;
        };
        let until = until.unwrap_or(seg.last + self.frame);
        let duration = until.wrapping_sub(seg.start) & (WRAP - 1);
        let rest = self.buf.split_off(end.min(self.buf.len()));
        let data = std::mem::replace(&mut self.buf, rest);
        // Only the tables put in front, or no time: nothing to play. No part has been handed
        // out then, as each one ends after a picture.
        if data.len() <= seg.tables || duration == 0 {
            return;
        }
        if self.settings.part > 0 && data.len() > seg.part_from {
            self.parts.push(Part {
                number: seg.number,
                index: seg.part_index,
                data: Bytes::copy_from_slice(&data[seg.part_from..]),
                duration: until.wrapping_sub(seg.part_start) & (WRAP - 1),
                independent: seg.part_independent,
            });
        }
        self.done.push(Segment {
            // Without the spare capacity `buf` grew with (up to as much again as the segment,
            // held as long as the segment and counted nowhere).
            data: Bytes::from(data.into_boxed_slice()),
            duration,
            keyframe: seg.keyframe,
            discontinuity: seg.discontinuity,
            start: seg.start,
            number: seg.number,
        });
    }
}

/// The payload of a packet (after its adaptation field); `None` when it has none.
pub(crate) fn payload<'p>(pkt: &'p [u8], h: &TsHeader) -> Option<&'p [u8]> {
    if !h.has_payload {
        return None;
    }
    let start = if pkt[3] & 0x20 != 0 {
        5 + usize::from(pkt[4])
    } else {
        4
    };
    pkt.get(start..PACKET_LEN)
}

#[cfg(test)]
#[path = "segmenter/tests.rs"]
mod tests;
