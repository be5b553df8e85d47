//! PAT and PMT sections reassembled from TS packets, with the raw packets kept so a segment can
//! repeat them at its head. No I/O.

use crate::mpegts::{TsHeader, PACKET_LEN};

/// Largest PSI section (ISO/IEC 13818-1 caps `section_length` at 1021 for PAT and PMT).
const MAX_SECTION: usize = 1024;
/// Most packets one section may take before it is given up. A [`MAX_SECTION`] section with its
/// pointer field fits 6 packets of full payload (7 if the pointer field skips the tail of the
/// previous section); 16 leaves room for adaptation fields (a PCR on the table's PID) and still
/// holds 3 KiB per table. Without it, packets whose payload adds nothing (an adaptation field
/// filling the packet) or a declared length that never arrives would be kept without end.
const MAX_PACKETS: usize = 16;

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
        if self.packets.len() >= MAX_PACKETS * PACKET_LEN {
            self.drop_section();
            return None;
        }
        self.packets.extend_from_slice(&pkt[..PACKET_LEN]);
        if self.data.len() < 3 {
            return None;
        }
        let len = 3 + usize::from(u16::from_be_bytes([self.data[1], self.data[2]]) & 0x0fff);
        if len > MAX_SECTION + 3 {
            self.drop_section();
            return None;
        }
        if self.data.len() < len {
            return None;
        }
        self.started = false;
        let section = self.data[..len].to_vec();
        Some((section, std::mem::take(&mut self.packets)))
    }

    /// Gives up the section in progress; packets up to the next section start are ignored.
    fn drop_section(&mut self) {
        self.started = false;
        self.packets.clear();
        self.data.clear();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mpegts::parse_header;

    /// A PID 0 packet carrying `payload` (padded with 0xff), after an adaptation field of
    /// `stuffing` bytes when that is not zero.
    fn packet(start: bool, stuffing: u8, payload: &[u8]) -> Vec<u8> {
        let afc = if stuffing > 0 { 0x30 } else { 0x10 };
        let mut pkt = vec![0x47, if start { 0x40 } else { 0x00 }, 0x00, afc];
        if stuffing > 0 {
            pkt.push(stuffing);
            pkt.resize(5 + usize::from(stuffing), 0xff);
        }
        pkt.extend_from_slice(payload);
        pkt.resize(PACKET_LEN, 0xff);
        pkt
    }

    fn push(c: &mut Collector, pkt: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        c.push(pkt, &parse_header(pkt).unwrap())
    }

    /// A section of `len` bytes (`section_length` = `len` - 3), split into packets after a
    /// pointer field of 0.
    fn section_packets(len: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut section = vec![0x00, 0xb0 | ((len - 3) >> 8) as u8, (len - 3) as u8];
        section.extend((3..len).map(|i| i as u8));
        let mut payload = vec![0u8];
        payload.extend_from_slice(&section);
        let packets = payload
            .chunks(PACKET_LEN - 4)
            .enumerate()
            .map(|(i, chunk)| packet(i == 0, 0, chunk))
            .collect();
        (section, packets)
    }

    #[test]
    fn payloadless_packets_after_a_section_start_are_not_kept() {
        let mut c = Collector::default();
        let (_, packets) = section_packets(MAX_SECTION);
        assert!(push(&mut c, &packets[0]).is_none());
        // An adaptation field of 183 bytes leaves the packet an empty payload.
        let empty = packet(false, 183, &[]);
        let mut most = 0;
        for _ in 0..100_000 {
            assert!(push(&mut c, &empty).is_none());
            most = most.max(c.packets.len());
        }
        assert_eq!(most, MAX_PACKETS * PACKET_LEN);
        assert!(c.packets.is_empty() && c.data.is_empty() && !c.started);
        // The next section start is read as usual.
        let (section, packets) = section_packets(16);
        assert_eq!(
            push(&mut c, &packets[0]),
            Some((section, packets[0].clone()))
        );
    }

    #[test]
    fn the_largest_section_still_completes_between_pcr_packets() {
        let mut c = Collector::default();
        let (section, packets) = section_packets(MAX_SECTION);
        assert_eq!(packets.len(), 6);
        let pcr = packet(false, 183, &[]);
        let mut got = None;
        let mut kept = Vec::new();
        for (i, pkt) in packets.iter().enumerate() {
            if i > 0 {
                for _ in 0..2 {
                    assert!(push(&mut c, &pcr).is_none());
                    kept.extend_from_slice(&pcr);
                }
            }
            kept.extend_from_slice(pkt);
            got = push(&mut c, pkt);
        }
        assert_eq!(got, Some((section, kept)));
    }
}
