//! MPEG-TS packet alignment, sync search, per-PID continuity checking, and instant-start points;
//! `unwrap` strips fake wrappers in front of a segment's packets. No I/O.
//!
//! The gateway never rewrites TS; it only needs to know where packets start (so a new viewer
//! begins on a packet boundary, ideally on a random-access point) and whether the stream it
//! relays is intact (continuity-counter errors per PID, exported as a metric).

pub mod unwrap;

/// Every TS packet is this long.
pub const PACKET_LEN: usize = 188;
/// First byte of every TS packet.
pub const SYNC_BYTE: u8 = 0x47;
/// The null PID carries stuffing and has no meaningful continuity counter.
pub const NULL_PID: u16 = 0x1fff;

/// How many consecutive sync bytes [`find_sync`] wants before trusting an offset.
const SYNC_CONFIRM: usize = 3;

/// The header fields of one TS packet that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TsHeader {
    pub pid: u16,
    pub payload_unit_start: bool,
    pub has_payload: bool,
    pub continuity: u8,
    /// Adaptation field says the counter may jump (splice, source switch).
    pub discontinuity: bool,
    /// Adaptation field marks a random-access point (usually a keyframe).
    pub random_access: bool,
}

/// Parses the 4-byte header and adaptation flags of a packet; `None` if it is not a TS packet.
pub fn parse_header(pkt: &[u8]) -> Option<TsHeader> {
    if pkt.len() < PACKET_LEN || pkt[0] != SYNC_BYTE {
        return None;
    }
    let afc = (pkt[3] >> 4) & 0b11;
    let has_adaptation = afc & 0b10 != 0;
    // Flags live in the adaptation field's second byte, present only when its length is > 0.
    let flags = if has_adaptation && pkt[4] > 0 {
        pkt[5]
    } else {
        0
    };
    Some(TsHeader {
        pid: u16::from_be_bytes([pkt[1] & 0x1f, pkt[2]]),
        payload_unit_start: pkt[1] & 0x40 != 0,
        has_payload: afc & 0b01 != 0,
        continuity: pkt[3] & 0x0f,
        discontinuity: flags & 0x80 != 0,
        random_access: flags & 0x40 != 0,
    })
}

/// The first offset at which packets line up: a sync byte repeated every 188 bytes, checked
/// [`SYNC_CONFIRM`] times where the buffer is long enough (a lone 0x47 inside a payload is
/// common, three at the right spacing is not).
pub fn find_sync(buf: &[u8]) -> Option<usize> {
    let last = buf.len().checked_sub(PACKET_LEN)?;
    (0..=last).find(|&at| {
        (0..SYNC_CONFIRM)
            .map(|k| at + k * PACKET_LEN)
            .take_while(|&o| o + PACKET_LEN <= buf.len())
            .all(|o| buf[o] == SYNC_BYTE)
    })
}

/// True when `buf` is a whole number of packets that all start with a sync byte.
pub fn is_aligned(buf: &[u8]) -> bool {
    !buf.is_empty()
        && buf.len().is_multiple_of(PACKET_LEN)
        && buf.chunks_exact(PACKET_LEN).all(|p| p[0] == SYNC_BYTE)
}

/// Offset of the first packet in an aligned `buf` that is a random-access point, for starting a
/// new viewer on a keyframe rather than on a packet the decoder must throw away.
pub fn find_random_access(buf: &[u8]) -> Option<usize> {
    buf.chunks_exact(PACKET_LEN)
        .position(|p| parse_header(p).is_some_and(|h| h.random_access && h.payload_unit_start))
        .map(|i| i * PACKET_LEN)
}

/// Continuity-counter checker for every PID of one stream.
///
/// Rules (ISO/IEC 13818-1 §2.4.3.3): the counter steps by one per packet with payload; one
/// repeat of the same counter is a legal duplicate; packets without payload keep it; the null
/// PID is ignored; a discontinuity flag resets the expectation.
#[derive(Debug, Clone)]
pub struct Continuity {
    /// Last counter per PID, or `UNSEEN`.
    last: Box<[u8; 8192]>,
    errors: u64,
    packets: u64,
}

const UNSEEN: u8 = 0xff;

impl Default for Continuity {
    fn default() -> Self {
        Self {
            last: Box::new([UNSEEN; 8192]),
            errors: 0,
            packets: 0,
        }
    }
}

impl Continuity {
    /// Continuity errors seen so far.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// TS packets checked so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Checks every whole packet in `buf`; returns the errors found in it. Bytes before the first
    /// sync and a trailing partial packet are ignored.
    pub fn check(&mut self, buf: &[u8]) -> u64 {
        let Some(start) = find_sync(buf) else {
            return 0;
        };
        let before = self.errors;
        for pkt in buf[start..].chunks_exact(PACKET_LEN) {
            if let Some(h) = parse_header(pkt) {
                self.packets += 1;
                self.observe(h);
            }
        }
        self.errors - before
    }

    fn observe(&mut self, h: TsHeader) {
        if h.pid == NULL_PID {
            return;
        }
        let slot = &mut self.last[usize::from(h.pid)];
        let prev = *slot;
        *slot = h.continuity;
        if prev == UNSEEN || h.discontinuity {
            return;
        }
        let expected = if h.has_payload {
            (prev + 1) & 0x0f
        } else {
            prev
        };
        // The same counter again is the one permitted duplicate packet.
        if h.continuity != expected && h.continuity != prev {
            self.errors += 1;
        }
    }
}

#[cfg(test)]
#[path = "mpegts/tests.rs"]
mod tests;
