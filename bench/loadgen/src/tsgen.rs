//! The synthetic MPEG-TS stream the multicast sender emits and the IPTV receiver verifies.
//!
//! Every 188-byte TS packet carries its own index in the group's stream, so a receiver that
//! joins at any point knows where it is, and every later packet's bytes are predictable from
//! (seed, group, index): a gap, a duplicate or a changed byte is detected exactly. No I/O.

/// TS packets per RTP datagram, as IPTV senders use (7 × 188 = 1316 bytes of payload).
pub const TS_PER_DATAGRAM: usize = 7;
pub const TS_LEN: usize = 188;
pub const RTP_HEADER_LEN: usize = 12;
pub const DATAGRAM_LEN: usize = RTP_HEADER_LEN + TS_PER_DATAGRAM * TS_LEN;
const PID: u16 = 0x100;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Writes TS packet number `index` of group `group` into `out` (exactly 188 bytes).
pub fn write_ts(seed: u64, group: u32, index: u64, out: &mut [u8]) {
    out[0] = 0x47;
    out[1] = (PID >> 8) as u8 & 0x1f;
    out[2] = PID as u8;
    // Payload only, continuity counter = index mod 16, so the stream is valid TS.
    out[3] = 0x10 | (index & 0x0f) as u8;
    out[4..12].copy_from_slice(&index.to_be_bytes());
    out[12..16].copy_from_slice(&group.to_be_bytes());
    let mut state = splitmix(seed ^ (u64::from(group) << 48) ^ index);
    for chunk in out[16..TS_LEN].chunks_mut(8) {
        state = splitmix(state);
        let bytes = state.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Writes RTP datagram number `seq_index` (RTP header, then 7 TS packets) into `out`.
pub fn write_datagram(seed: u64, group: u32, seq_index: u64, timestamp: u32, out: &mut [u8]) {
    out[0] = 0x80; // version 2, no padding, no extension, no CSRC
    out[1] = 33; // payload type MP2T
    out[2..4].copy_from_slice(&(seq_index as u16).to_be_bytes());
    out[4..8].copy_from_slice(&timestamp.to_be_bytes());
    out[8..12].copy_from_slice(&(0x51ce_0000 | group).to_be_bytes());
    for k in 0..TS_PER_DATAGRAM {
        let at = RTP_HEADER_LEN + k * TS_LEN;
        write_ts(
            seed,
            group,
            seq_index * TS_PER_DATAGRAM as u64 + k as u64,
            &mut out[at..at + TS_LEN],
        );
    }
}

/// What a received TS packet turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    /// The expected packet, byte for byte.
    Next,
    /// A later packet: this many were missing before it.
    Gap(u64),
    /// An earlier or repeated packet.
    Behind,
    /// Not a packet of this stream (wrong sync, group or bytes).
    Corrupt,
}

/// Follows one group's stream as delivered to one client and counts what went wrong.
#[derive(Debug, Default)]
pub struct Verifier {
    seed: u64,
    group: u32,
    /// Index of the next expected TS packet; `None` until the first one.
    pub next: Option<u64>,
    pub first: Option<u64>,
    pub lost: u64,
    pub behind: u64,
    pub corrupt: u64,
    carry: Vec<u8>,
    scratch: Vec<u8>,
}

impl Verifier {
    pub fn new(seed: u64, group: u32) -> Self {
        Verifier {
            seed,
            group,
            scratch: vec![0; TS_LEN],
            ..Default::default()
        }
    }

    /// Feeds delivered bytes in order; partial packets are kept until completed.
    pub fn feed(&mut self, mut data: &[u8]) {
        if !self.carry.is_empty() {
            let want = TS_LEN - self.carry.len();
            let take = want.min(data.len());
            self.carry.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.carry.len() < TS_LEN {
                return;
            }
            let pkt = std::mem::take(&mut self.carry);
            self.check(&pkt);
        }
        let mut chunks = data.chunks_exact(TS_LEN);
        for pkt in &mut chunks {
            self.check(pkt);
        }
        self.carry.extend_from_slice(chunks.remainder());
    }

    fn check(&mut self, pkt: &[u8]) -> Check {
        let verdict = self.classify(pkt);
        match verdict {
            Check::Gap(n) => self.lost += n,
            Check::Behind => self.behind += 1,
            Check::Corrupt => self.corrupt += 1,
            Check::Next => {}
        }
        verdict
    }

    fn classify(&mut self, pkt: &[u8]) -> Check {
        if pkt[0] != 0x47 {
            return Check::Corrupt;
        }
        let index = u64::from_be_bytes(pkt[4..12].try_into().unwrap_or_default());
        write_ts(self.seed, self.group, index, &mut self.scratch);
        if pkt != self.scratch.as_slice() {
            return Check::Corrupt;
        }
        let verdict = match self.next {
            None => {
                self.first = Some(index);
                Check::Next
            }
            Some(n) if index == n => Check::Next,
            Some(n) if index > n => Check::Gap(index - n),
            Some(_) => return Check::Behind,
        };
        self.next = Some(index + 1);
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(group: u32, from: u64, datagrams: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut d = vec![0; DATAGRAM_LEN];
        for i in from..from + datagrams {
            write_datagram(7, group, i, 0, &mut d);
            out.extend_from_slice(&d[RTP_HEADER_LEN..]);
        }
        out
    }

    #[test]
    fn clean_stream_in_odd_pieces() {
        let s = stream(3, 100, 20);
        let mut v = Verifier::new(7, 3);
        for piece in s.chunks(1000) {
            v.feed(piece);
        }
        assert_eq!((v.first, v.next), (Some(700), Some(840)));
        assert_eq!((v.lost, v.behind, v.corrupt), (0, 0, 0));
    }

    #[test]
    fn gap_duplicate_and_damage_are_counted() {
        let mut s = stream(1, 0, 4);
        s.drain(TS_LEN..3 * TS_LEN); // two packets lost
        let dup = s[..TS_LEN].to_vec();
        s.extend_from_slice(&dup);
        let last = s.len() - 1;
        s[last - TS_LEN] ^= 1; // damage the packet before the duplicate
        let mut v = Verifier::new(7, 1);
        v.feed(&s);
        assert_eq!((v.lost, v.behind, v.corrupt), (2, 1, 1));
        // A stream of another group is not accepted as this one.
        let mut w = Verifier::new(7, 2);
        w.feed(&stream(1, 0, 1));
        assert_eq!(w.corrupt, 7);
    }
}
