//! AAC frames out of ADTS (headers removed), their times, and the AudioSpecificConfig the
//! `esds` carries. No I/O.

use super::demux::Pes;
use crate::segmenter::CLOCK;

/// Samples per AAC frame (per raw data block).
pub(crate) const FRAME_SAMPLES: u32 = 1024;

/// Sampling rates by ADTS `sampling_frequency_index`.
const RATES: [u32; 13] = [
    96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350,
];

/// Bytes of a partial frame carried to the next segment beyond which they are noise.
const MAX_REST: usize = 8 * 1024;

/// What the init segment says about an AAC track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AacConfig {
    /// MPEG-4 audio object type (ADTS profile + 1: 2 is AAC-LC).
    pub object_type: u8,
    pub frequency_index: u8,
    pub rate: u32,
    /// ADTS channel configuration (1 to 7).
    pub channel_config: u8,
}

impl AacConfig {
    /// The two-byte AudioSpecificConfig.
    pub(crate) fn audio_specific_config(&self) -> [u8; 2] {
        let v = (u16::from(self.object_type) << 11)
            | (u16::from(self.frequency_index) << 7)
            | (u16::from(self.channel_config) << 3);
        v.to_be_bytes()
    }

    /// Channels the configuration stands for.
    pub(crate) fn channels(&self) -> u16 {
        match self.channel_config {
            7 => 8,
            n => u16::from(n),
        }
    }
}

/// What a segment leaves for the next: a frame cut short, and when the next frame plays.
#[derive(Debug, Default)]
pub(super) struct Carry {
    bytes: Vec<u8>,
    /// PTS offsets into `bytes` (a PES began there).
    anchors: Vec<(usize, u64)>,
    /// 90 kHz time of the frame after the last one written.
    next: Option<u64>,
}

impl Carry {
    pub(super) fn clear(&mut self) {
        *self = Carry::default();
    }
}

/// One ADTS header.
#[derive(Debug, Clone, Copy)]
struct Adts {
    header: usize,
    len: usize,
    blocks: u8,
    config: AacConfig,
}

fn parse_adts(b: &[u8]) -> Option<Adts> {
    if b.len() < 7 || b[0] != 0xff || b[1] & 0xf6 != 0xf0 {
        return None;
    }
    let header = if b[1] & 1 == 1 { 7 } else { 9 };
    let frequency_index = (b[2] >> 2) & 0x0f;
    let channel_config = ((b[2] & 1) << 2) | (b[3] >> 6);
    let len = (usize::from(b[3] & 3) << 11) | (usize::from(b[4]) << 3) | usize::from(b[5] >> 5);
    let rate = *RATES.get(usize::from(frequency_index))?;
    if len <= header || channel_config == 0 {
        return None;
    }
    Some(Adts {
        header,
        len,
        blocks: b[6] & 3,
        config: AacConfig {
            object_type: (b[2] >> 6) + 1,
            frequency_index,
            rate,
            channel_config,
        },
    })
}

/// The frames of a segment's audio PES packets (after what the last segment left) as samples
/// back to back, their sizes, the configuration of the first, and the 90 kHz time of the first.
pub(super) fn samples(
    pes: &[Pes],
    carry: &mut Carry,
) -> (Vec<u8>, Vec<u32>, Option<AacConfig>, Option<u64>) {
    let mut buf = std::mem::take(&mut carry.bytes);
    let mut anchors = std::mem::take(&mut carry.anchors);
    for p in pes {
        if let Some(pts) = p.pts {
            anchors.push((buf.len(), pts));
        }
        buf.extend_from_slice(&p.es);
    }
    let mut data = Vec::with_capacity(buf.len());
    let mut sizes = Vec::new();
    let (mut config, mut first) = (None::<AacConfig>, None);
    let mut next = carry.next;
    let mut used = 0; // anchors consumed
    let mut pos = 0;
    while pos + 7 <= buf.len() {
        let Some(frame) = parse_adts(&buf[pos..]) else {
            pos += 1;
            continue;
        };
        if pos + frame.len > buf.len() {
            break;
        }
        // The PTS of a PES belongs to the first frame that begins in it.
        let mut stamp = None;
        while used < anchors.len() && anchors[used].0 <= pos {
            stamp = Some(anchors[used].1);
            used += 1;
        }
        let time = stamp.or(next);
        let count = u64::from(frame.blocks) + 1;
        let step = count * u64::from(FRAME_SAMPLES) * CLOCK / u64::from(frame.config.rate);
        next = time.map(|t| t + step);
        let fits = config.is_none_or(|c| c == frame.config);
        if let (Some(t), true, 0) = (time, fits, frame.blocks) {
            config.get_or_insert(frame.config);
            first.get_or_insert(t);
            data.extend_from_slice(&buf[pos + frame.header..pos + frame.len]);
            sizes.push((frame.len - frame.header) as u32);
        }
        pos += frame.len;
    }
    if buf.len() - pos <= MAX_REST {
        carry.bytes = buf.split_off(pos);
        carry.anchors = anchors[used..]
            .iter()
            .map(|&(at, pts)| (at.saturating_sub(pos), pts))
            .collect();
    }
    carry.next = next;
    (data, sizes, config, first)
}
