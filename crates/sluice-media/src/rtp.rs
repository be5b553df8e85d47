//! RTP (RFC 3550) header parsing, payload detection, and sequence-number reordering. No I/O.
//!
//! The parser returns the payload as a range into the datagram so the caller can slice its
//! reference-counted buffer without copying. The reorder window is generic over the item it
//! holds, so the gateway stores `Bytes` and the tests store plain numbers.

use std::ops::Range;

/// The only RTP version in use; anything else is not RTP.
pub const RTP_VERSION: u8 = 2;
/// Fixed part of an RTP header.
pub const FIXED_HEADER_LEN: usize = 12;

/// Why a datagram is not a usable RTP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RtpError {
    #[error("datagram shorter than the fixed RTP header")]
    TooShort,
    #[error("RTP version {0}, expected 2")]
    BadVersion(u8),
    #[error("CSRC list runs past the end of the datagram")]
    TruncatedCsrc,
    #[error("header extension runs past the end of the datagram")]
    TruncatedExtension,
    #[error("padding length is zero or larger than the payload")]
    BadPadding,
}

/// The fields of an RTP header the gateway uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtpHeader {
    pub marker: bool,
    pub payload_type: u8,
    pub sequence: u16,
    pub timestamp: u32,
    pub ssrc: u32,
    pub csrc_count: u8,
    pub has_extension: bool,
    /// Padding bytes removed from the end (0 when the P bit is clear).
    pub padding: u8,
}

/// A parsed packet: its header and where its payload sits in the datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtpPacket {
    pub header: RtpHeader,
    pub payload: Range<usize>,
}

/// Parses an RTP datagram: fixed header, CSRC list, extension, padding.
pub fn parse_rtp(buf: &[u8]) -> Result<RtpPacket, RtpError> {
    if buf.len() < FIXED_HEADER_LEN {
        return Err(RtpError::TooShort);
    }
    let version = buf[0] >> 6;
    if version != RTP_VERSION {
        return Err(RtpError::BadVersion(version));
    }
    let has_padding = buf[0] & 0x20 != 0;
    let has_extension = buf[0] & 0x10 != 0;
    let csrc_count = buf[0] & 0x0f;
    let mut start = FIXED_HEADER_LEN + 4 * usize::from(csrc_count);
    if start > buf.len() {
        return Err(RtpError::TruncatedCsrc);
    }
    if has_extension {
        start = skip_extension(buf, start)?;
    }
    let mut end = buf.len();
    let mut padding = 0;
    if has_padding {
        // The last byte counts itself, so zero is malformed.
        padding = buf[end - 1];
        if padding == 0 || usize::from(padding) > end - start {
            return Err(RtpError::BadPadding);
        }
        end -= usize::from(padding);
    }
    let header = RtpHeader {
        marker: buf[1] & 0x80 != 0,
        payload_type: buf[1] & 0x7f,
        sequence: u16::from_be_bytes([buf[2], buf[3]]),
        timestamp: u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]),
        ssrc: u32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]),
        csrc_count,
        has_extension,
        padding,
    };
    Ok(RtpPacket {
        header,
        payload: start..end,
    })
}

/// Returns the offset just past a header extension starting at `at`.
fn skip_extension(buf: &[u8], at: usize) -> Result<usize, RtpError> {
    let Some(ext) = buf.get(at..at + 4) else {
        return Err(RtpError::TruncatedExtension);
    };
    let words = usize::from(u16::from_be_bytes([ext[2], ext[3]]));
    let end = at + 4 + 4 * words;
    if end > buf.len() {
        return Err(RtpError::TruncatedExtension);
    }
    Ok(end)
}

/// What a multicast datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// Bare MPEG-TS packets (first byte is the 0x47 sync byte; RTP v2 can never start so).
    Ts,
    /// RTP v2 with a well-formed header.
    Rtp,
    /// Neither: passed through untouched in UDP mode, dropped in RTP mode.
    Other,
}

/// Classifies a datagram so `/udp/` can carry RTP or bare TS, as udpxy and msd_lite allow.
pub fn classify(buf: &[u8]) -> PayloadKind {
    if buf.first() == Some(&crate::mpegts::SYNC_BYTE) {
        PayloadKind::Ts
    } else if parse_rtp(buf).is_ok() {
        PayloadKind::Rtp
    } else {
        PayloadKind::Other
    }
}

/// Counters kept by [`Reorder`]; all monotonic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReorderStats {
    /// Packets released in sequence order.
    pub delivered: u64,
    /// Sequence numbers given up on (never arrived before the window moved past them).
    pub lost: u64,
    /// Packets that arrived after a later sequence number had already arrived.
    pub reordered: u64,
    /// Packets dropped because that sequence number was already buffered or released.
    pub duplicates: u64,
    /// Large sequence jumps treated as a sender restart rather than loss.
    pub resyncs: u64,
}

/// A jump further than this beyond the window (either way) is a new sender, not loss or
/// lateness. Measured from the window's edge so a large window never mistakes its own
/// reordering for a restart.
const RESYNC_DISTANCE: i32 = 1024;
/// Fewest consecutive late packets taken as a restarted sender (the window, if larger).
const MIN_LATE_RUN: usize = 16;

/// Where [`Reorder::push`] puts a packet.
enum Place {
    /// A sender restart: what is held is flushed and the packet starts the window afresh.
    Resync,
    /// Already released or given up on: dropped.
    Late,
    /// This many places after the next sequence number to release.
    Ahead(usize),
}

/// A sequence-indexed window that releases packets in order, drops duplicates, and counts loss.
///
/// A packet ahead of the expected sequence waits in its slot; a gap is given up on only when a
/// packet arrives that no longer fits in the window (or on [`Reorder::flush`]), so a healthy
/// stream costs no latency and a reordered one costs at most `window` packets.
///
/// Slots are addressed by distance from `next` through a moving `head`, never by `seq % window`:
/// the latter is only consistent across the 16-bit wrap when the window divides 65536, and the
/// window is user config of any size.
#[derive(Debug)]
pub struct Reorder<T> {
    slots: Vec<Option<T>>,
    /// Slot holding sequence `next`.
    head: usize,
    /// Next sequence number to release; `None` until the first packet.
    next: Option<u16>,
    /// Packets currently held in `slots`.
    held: usize,
    /// Distance past `next` of the furthest packet held, to spot late arrivals.
    ahead: u16,
    /// Consecutive packets dropped as late or duplicate.
    late_run: usize,
    stats: ReorderStats,
}

impl<T> Reorder<T> {
    /// A window of `window` packets (at least 1). rtp2httpd uses 32; at 4K bitrates that is ~10 ms.
    pub fn new(window: usize) -> Self {
        let window = window.clamp(1, 4096);
        Self {
            slots: (0..window).map(|_| None).collect(),
            head: 0,
            next: None,
            held: 0,
            ahead: 0,
            late_run: 0,
            stats: ReorderStats::default(),
        }
    }

    pub fn stats(&self) -> ReorderStats {
        self.stats
    }

    /// Packets currently waiting for a gap to fill.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Whether [`Reorder::push`] would keep a packet with this sequence number now, rather
    /// than drop it as a duplicate or too late. Lets a caller skip copying the payload of a
    /// packet about to be dropped (it still pushes something, so the drop is counted).
    pub fn accepts(&self, seq: u16) -> bool {
        match self.place(seq) {
            Place::Resync => true,
            Place::Late => false,
            // Past the window: the slot it lands in is freed by moving the window on.
            Place::Ahead(dist) if dist >= self.slots.len() => true,
            Place::Ahead(dist) => self.slots[self.slot(dist as u16)].is_none(),
        }
    }

    /// Where a packet with this sequence number goes; the one decision `push` and `accepts`
    /// share, so they cannot disagree.
    fn place(&self, seq: u16) -> Place {
        let Some(next) = self.next else {
            return Place::Ahead(0);
        };
        let diff = i32::from(seq.wrapping_sub(next) as i16);
        // A run of "late" packets longer than any reordering is a sender that restarted a
        // little behind its old sequence, not duplicates: follow it instead of dropping it.
        let restarted = diff < 0 && self.late_run >= self.slots.len().max(MIN_LATE_RUN);
        // At most 4096 + 1024, far below the 32768 where the signed distance turns around.
        let reach = self.slots.len() as i32 + RESYNC_DISTANCE;
        if restarted || !(-reach..=reach).contains(&diff) {
            Place::Resync
        } else if diff < 0 {
            Place::Late
        } else {
            Place::Ahead(diff as usize)
        }
    }

    /// Offers one packet; every packet that is now in order is pushed onto `out`.
    pub fn push(&mut self, seq: u16, item: T, out: &mut Vec<T>) {
        match self.place(seq) {
            Place::Resync => {
                self.stats.resyncs += 1;
                self.late_run = 0;
                self.flush(out);
                self.next = Some(seq);
                self.ahead = 0;
                self.store(0, item);
            }
            Place::Late => {
                // Already released or given up on: a duplicate or a packet too late to use.
                self.stats.duplicates += 1;
                self.late_run += 1;
            }
            Place::Ahead(mut dist) => {
                self.next.get_or_insert(seq);
                self.late_run = 0;
                if dist >= self.slots.len() {
                    self.advance(dist + 1 - self.slots.len(), out);
                    dist = self.slots.len() - 1;
                }
                self.store(dist as u16, item);
            }
        }
        self.release(out);
    }

    /// Releases everything held, in order, counting the gaps as lost (call on idle or shutdown).
    pub fn flush(&mut self, out: &mut Vec<T>) {
        while self.held > 0 {
            self.advance(1, out);
            self.release(out);
        }
    }

    /// Slot for the packet `dist` places after `next`; `dist` is always below the window.
    fn slot(&self, dist: u16) -> usize {
        (self.head + usize::from(dist)) % self.slots.len()
    }

    fn store(&mut self, dist: u16, item: T) {
        let at = self.slot(dist);
        if self.slots[at].is_some() {
            self.stats.duplicates += 1;
            return;
        }
        if dist < self.ahead {
            self.stats.reordered += 1;
        }
        self.ahead = self.ahead.max(dist);
        self.slots[at] = Some(item);
        self.held += 1;
    }

    /// Moves `next` forward by `n`, releasing what is held and counting empty slots as lost.
    /// Slots are stepped through only while something is held; once nothing is, the rest are
    /// all empty and skipped in one move. Stepping through them all let a sender whose every
    /// packet jumps a window plus 1,024 ahead cost ~1,000 steps per tiny packet.
    fn advance(&mut self, n: usize, out: &mut Vec<T>) {
        let mut left = n;
        while left > 0 && self.held > 0 {
            let at = self.slot(0);
            match self.slots[at].take() {
                Some(item) => self.emit(item, out),
                None => self.stats.lost += 1,
            }
            self.step();
            left -= 1;
        }
        if left > 0 {
            // What `left` steps over empty slots would do.
            self.stats.lost += left as u64;
            self.head = (self.head + left) % self.slots.len();
            self.next = self.next.map(|s| s.wrapping_add((left % 65536) as u16));
            self.ahead = self
                .ahead
                .saturating_sub(u16::try_from(left).unwrap_or(u16::MAX));
        }
    }

    /// Releases the run of consecutive packets starting at `next`.
    fn release(&mut self, out: &mut Vec<T>) {
        loop {
            let at = self.slot(0);
            let Some(item) = self.slots[at].take() else {
                break;
            };
            self.emit(item, out);
            self.step();
        }
    }

    fn emit(&mut self, item: T, out: &mut Vec<T>) {
        self.held -= 1;
        self.stats.delivered += 1;
        out.push(item);
    }

    fn step(&mut self) {
        #[cfg(test)]
        tests::STEPS.with(|s| s.set(s.get() + 1));
        self.head = (self.head + 1) % self.slots.len();
        self.next = self.next.map(|n| n.wrapping_add(1));
        self.ahead = self.ahead.saturating_sub(1);
    }
}

#[cfg(test)]
#[path = "rtp/tests.rs"]
mod tests;
