//! PAT and PMT sections reassembled from TS packets, with the raw packets kept so a segment can
//! repeat them at its head. No I/O.

use crate::mpegts::{TsHeader, PACKET_LEN};

/// Largest PSI section (ISO/IEC 13818-1 caps `section_length` at 1021 for PAT and PMT).
const MAX_SECTION: usize = 1024;

/// One table's section as it arrives: the packets that carry it and its bytes so far.
#[derive(Debug, Default, Clone)]
pub(crate) struct Collector {
    packets: Vec<u8>,
    data: Vec<u8>,
    /// Set once a section start has been seen (packets before that carry nothing usable).
    started: bool,
}

impl Collector {
    /// Takes one packet of the table's PID; returns the whole section (and its packets) once
    /// the last byte of it has arrived.
    pub(crate) fn push(&mut self, pkt: &[u8], h: &TsHeader) -> Option<(Vec<u8>, Vec<u8>)> {
        let payload = super::payload(pkt, h)?;
        if h.payload_unit_start {
            let pointer = usize::from(*payload.first()?);
            let rest = payload.get(1 + pointer..)?;
            self.packets.clear();
            self.data.clear();
            self.data.extend_from_slice(rest);
            self.started = true;
        } else if self.started {
            self.data.extend_from_slice(payload);
        } else {
            return None;
        }
        self.packets.extend_from_slice(&pkt[..PACKET_LEN]);
        if self.data.len() < 3 {
            return None;
        }
        let len = 3 + usize::from(u16::from_be_bytes([self.data[1], self.data[2]]) & 0x0fff);
        if len > MAX_SECTION + 3 {
            self.started = false;
            return None;
        }
        if self.data.len() < len {
            return None;
        }
        self.started = false;
        let section = self.data[..len].to_vec();
        Some((section, std::mem::take(&mut self.packets)))
    }
}

/// The PMT PID of the first program a PAT section lists (program 0 is the network PID).
pub(crate) fn pat_program(section: &[u8]) -> Option<u16> {
    if section.first() != Some(&0x00) || section.len() < 12 {
        return None;
    }
    let entries = &section[8..section.len() - 4];
    entries.chunks_exact(4).find_map(|e| {
        let program = u16::from_be_bytes([e[0], e[1]]);
        (program != 0).then(|| u16::from_be_bytes([e[2], e[3]]) & 0x1fff)
    })
}

/// What a segmenter needs of a stream's coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    H264,
    Hevc,
    /// MPEG-1 or MPEG-2 video.
    Mpeg2,
    /// Other video: keyframes only from the random-access flag.
    OtherVideo,
    /// Audio: every frame starts a decodable point.
    Audio,
    /// Subtitles, teletext, data: never times a segment.
    Other,
}

impl Codec {
    fn from_stream_type(t: u8) -> Codec {
        match t {
            0x1b => Codec::H264,
            0x24 => Codec::Hevc,
            0x01 | 0x02 => Codec::Mpeg2,
            0x10 | 0x42 | 0xd1 | 0xea => Codec::OtherVideo,
            0x03 | 0x04 | 0x0f | 0x11 | 0x81 | 0x87 => Codec::Audio,
            _ => Codec::Other,
        }
    }

    fn is_video(self) -> bool {
        matches!(
            self,
            Codec::H264 | Codec::Hevc | Codec::Mpeg2 | Codec::OtherVideo
        )
    }
}

/// A program's elementary streams, as its PMT lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Program {
    /// `(pid, stream_type)` in PMT order: two PMTs with the same list describe the same layout.
    pub streams: Vec<(u16, u8)>,
}

impl Program {
    /// Parses a PMT section; `None` if it is not one.
    pub(crate) fn parse(section: &[u8]) -> Option<Program> {
        if section.first() != Some(&0x02) || section.len() < 16 {
            return None;
        }
        let info_len = usize::from(u16::from_be_bytes([section[10], section[11]]) & 0x0fff);
        let end = section.len() - 4;
        let mut at = 12 + info_len;
        let mut streams = Vec::new();
        while at + 5 <= end {
            let stream_type = section[at];
            let pid = u16::from_be_bytes([section[at + 1], section[at + 2]]) & 0x1fff;
            let es_len =
                usize::from(u16::from_be_bytes([section[at + 3], section[at + 4]]) & 0x0fff);
            streams.push((pid, stream_type));
            at += 5 + es_len;
        }
        Some(Program { streams })
    }

    /// The stream whose timestamps time the segments and whose keyframes cut them: the first
    /// video stream, else the first audio stream.
    pub(crate) fn timing(&self) -> Option<(u16, Codec)> {
        let coded = || {
            self.streams
                .iter()
                .map(|&(pid, t)| (pid, Codec::from_stream_type(t)))
        };
        coded()
            .find(|(_, c)| c.is_video())
            .or_else(|| coded().find(|(_, c)| *c == Codec::Audio))
    }
}
