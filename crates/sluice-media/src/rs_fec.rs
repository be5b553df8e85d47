//! Reed-Solomon FEC as IPTV operators send it on a FEC port (rtp2httpd's `?fec=`): the FEC
//! header, a GF(2^8) erasure code, and the recovery of up to `m` lost RTP packets per block of
//! `k`. No I/O.
//!
//! A FEC packet is an RTP packet with payload type 127 or 97 whose payload starts with this
//! 12-byte header (all fields big-endian), followed by `fec_len` bytes of parity:
//!
//! ```text
//!  0               1               2               3
//! |          begin seq            |           end seq             |
//! |       m       |     index     |           fec_len             |
//! |           rtp_len             |          reserved (0)         |
//! ```
//!
//! The block is the `k = end − begin + 1` media packets `begin..=end` (16-bit wrap), each taken
//! whole (RTP header and payload) and zero-padded to `rtp_len`; parity packet `index` (0..m) is
//! row `index` of the code's parity matrix applied to them, byte position by byte position,
//! over GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d). The parity matrix is
//! the systematic form of the Vandermonde matrix on the points α^0, α^1, … (α = 2): for a
//! block of k data and m parity packets, `P = V[k..k+m] × V[0..k]^-1` with `V[i][j] = α^(i·j)`.
//! Any k of the k + m packets of a block give back the rest. One shape seen in the field,
//! k = 100 and m = 5, is encoded with a fixed matrix that is not this construction; its
//! coefficients are known only from another project's reverse engineering, which sluice does not
//! copy, so such blocks are refused (`FixedMatrix`) and their losses stay unrepaired.

use crate::rtp;

/// Payload types that mark a Reed-Solomon FEC packet.
pub const FEC_PAYLOAD_TYPES: [u8; 2] = [127, 97];
/// Length of the FEC header after the FEC packet's RTP header.
pub const HEADER_LEN: usize = 12;
/// Largest media packet a block may describe (a jumbo-free Ethernet datagram and then some).
pub const MAX_RTP_LEN: usize = 2048;

/// Why a FEC packet or block is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RsFecError {
    #[error("not an RTP packet")]
    NotRtp,
    #[error("payload type {0} is not a Reed-Solomon FEC type (127 or 97)")]
    PayloadType(u8),
    #[error("FEC payload shorter than its 12-byte header")]
    TooShort,
    #[error(
        "FEC block of {k} data and {m} parity packets is not codable (k ≥ 1, m ≥ 1, k + m ≤ 255)"
    )]
    Block { k: usize, m: usize },
    #[error("FEC block of {k} data and {m} parity packets uses a fixed matrix sluice does not implement")]
    FixedMatrix { k: usize, m: usize },
    #[error("parity index {index} outside a block of {m} parity packets")]
    Index { index: u8, m: u8 },
    #[error("rtp_len {0} outside 12..=2048")]
    RtpLen(u16),
    #[error(
        "parity length {fec_len} does not match the {actual} bytes carried or rtp_len {rtp_len}"
    )]
    Length {
        fec_len: u16,
        rtp_len: u16,
        actual: usize,
    },
    #[error("more packets lost than the parity received can rebuild")]
    TooManyLost,
    #[error("the received packets do not determine the lost ones (singular system)")]
    Singular,
}

/// The fields of a Reed-Solomon FEC header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RsHeader {
    pub begin: u16,
    pub end: u16,
    /// Parity packets in the block.
    pub m: u8,
    /// This packet's parity row, 0..m.
    pub index: u8,
    pub fec_len: u16,
    /// Length every media packet of the block is padded to.
    pub rtp_len: u16,
}

impl RsHeader {
    /// Media packets in the block.
    pub fn k(&self) -> usize {
        usize::from(self.end.wrapping_sub(self.begin)) + 1
    }

    /// Whether `seq` is one of the block's media packets.
    pub fn covers(&self, seq: u16) -> bool {
        usize::from(seq.wrapping_sub(self.begin)) < self.k()
    }

    /// Writes the header (for senders and tests).
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..2].copy_from_slice(&self.begin.to_be_bytes());
        h[2..4].copy_from_slice(&self.end.to_be_bytes());
        h[4] = self.m;
        h[5] = self.index;
        h[6..8].copy_from_slice(&self.fec_len.to_be_bytes());
        h[8..10].copy_from_slice(&self.rtp_len.to_be_bytes());
        h
    }
}

/// Parses a whole FEC datagram (RTP header included); returns the header and the parity.
pub fn parse_datagram(datagram: &[u8]) -> Result<(RsHeader, &[u8]), RsFecError> {
    let packet = rtp::parse_rtp(datagram).map_err(|_| RsFecError::NotRtp)?;
    let pt = packet.header.payload_type;
    if !FEC_PAYLOAD_TYPES.contains(&pt) {
        return Err(RsFecError::PayloadType(pt));
    }
    parse_payload(&datagram[packet.payload])
}

/// Parses the FEC header from a FEC packet's RTP payload; returns it and the parity bytes.
pub fn parse_payload(payload: &[u8]) -> Result<(RsHeader, &[u8]), RsFecError> {
    let Some(h) = payload.get(..HEADER_LEN) else {
        return Err(RsFecError::TooShort);
    };
    let be = |at: usize| u16::from_be_bytes([h[at], h[at + 1]]);
    let header = RsHeader {
        begin: be(0),
        end: be(2),
        m: h[4],
        index: h[5],
        fec_len: be(6),
        rtp_len: be(8),
    };
    let (k, m) = (header.k(), usize::from(header.m));
    if m == 0 || k + m > 255 {
        return Err(RsFecError::Block { k, m });
    }
    if header.index >= header.m {
        return Err(RsFecError::Index {
            index: header.index,
            m: header.m,
        });
    }
    if !(12..=MAX_RTP_LEN).contains(&usize::from(header.rtp_len)) {
        return Err(RsFecError::RtpLen(header.rtp_len));
    }
    let parity = &payload[HEADER_LEN..];
    // The parity covers every padded media packet, so it is at least rtp_len long; bytes
    // past fec_len (an RTP padding the parser kept, say) are not parity.
    if usize::from(header.fec_len) > parity.len() || header.fec_len < header.rtp_len {
        return Err(RsFecError::Length {
            fec_len: header.fec_len,
            rtp_len: header.rtp_len,
            actual: parity.len(),
        });
    }
    Ok((header, &parity[..usize::from(header.rtp_len)]))
}

/// GF(2^8) arithmetic with the polynomial 0x11d, by log and antilog tables.
mod gf {
    /// `EXP[i] = α^i`, doubled so a sum of two logs needs no reduction.
    pub const EXP: [u8; 510] = exp_table();
    /// `LOG[α^i] = i`; `LOG[0]` is unused.
    pub const LOG: [u8; 256] = log_table();

    const fn exp_table() -> [u8; 510] {
        let mut t = [0u8; 510];
        let mut x: u16 = 1;
        let mut i = 0;
        while i < 510 {
            t[i] = x as u8;
            x <<= 1;
            if x & 0x100 != 0 {
                x ^= 0x11d;
            }
            i += 1;
        }
        t
    }

    const fn log_table() -> [u8; 256] {
        let exp = exp_table();
        let mut t = [0u8; 256];
        let mut i = 0;
        while i < 255 {
            t[exp[i] as usize] = i as u8;
            i += 1;
        }
        t
    }

    pub fn mul(a: u8, b: u8) -> u8 {
        if a == 0 || b == 0 {
            0
        } else {
            EXP[usize::from(LOG[usize::from(a)]) + usize::from(LOG[usize::from(b)])]
        }
    }

    pub fn inv(a: u8) -> u8 {
        debug_assert!(a != 0);
        EXP[255 - usize::from(LOG[usize::from(a)])]
    }

    /// α^e for any exponent.
    pub fn pow_alpha(e: usize) -> u8 {
        EXP[e % 255]
    }

    /// `dst ^= c × src`, byte by byte.
    pub fn mul_add(dst: &mut [u8], c: u8, src: &[u8]) {
        if c == 0 {
            return;
        }
        let lc = usize::from(LOG[usize::from(c)]);
        for (d, &s) in dst.iter_mut().zip(src) {
            if s != 0 {
                *d ^= EXP[lc + usize::from(LOG[usize::from(s)])];
            }
        }
    }
}

/// Inverts an n × n matrix (row-major) in place by Gauss-Jordan elimination.
fn invert(a: &mut [u8], n: usize) -> Result<(), RsFecError> {
    let mut inv = vec![0u8; n * n];
    for i in 0..n {
        inv[i * n + i] = 1;
    }
    for col in 0..n {
        let pivot = (col..n)
            .find(|&r| a[r * n + col] != 0)
            .ok_or(RsFecError::Singular)?;
        if pivot != col {
            for j in 0..n {
                a.swap(pivot * n + j, col * n + j);
                inv.swap(pivot * n + j, col * n + j);
            }
        }
        let scale = gf::inv(a[col * n + col]);
        for j in 0..n {
            a[col * n + j] = gf::mul(a[col * n + j], scale);
            inv[col * n + j] = gf::mul(inv[col * n + j], scale);
        }
        for r in 0..n {
            let f = a[r * n + col];
            if r == col || f == 0 {
                continue;
            }
            for j in 0..n {
                a[r * n + j] ^= gf::mul(f, a[col * n + j]);
                inv[r * n + j] ^= gf::mul(f, inv[col * n + j]);
            }
        }
    }
    a.copy_from_slice(&inv);
    Ok(())
}

/// The parity matrix of one (k, m) block shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Code {
    k: usize,
    m: usize,
    /// m rows of k coefficients.
    parity: Vec<u8>,
}

impl Code {
    pub fn new(k: usize, m: usize) -> Result<Self, RsFecError> {
        if k == 0 || m == 0 || k + m > 255 {
            return Err(RsFecError::Block { k, m });
        }
        if (k, m) == (100, 5) {
            return Err(RsFecError::FixedMatrix { k, m });
        }
        let parity = Self::vandermonde(k, m)?;
        Ok(Self { k, m, parity })
    }

    fn vandermonde(k: usize, m: usize) -> Result<Vec<u8>, RsFecError> {
        let mut top: Vec<u8> = (0..k * k)
            .map(|x| gf::pow_alpha((x / k) * (x % k)))
            .collect();
        invert(&mut top, k)?;
        let mut parity = vec![0u8; m * k];
        for i in 0..m {
            for j in 0..k {
                let mut acc = 0u8;
                for l in 0..k {
                    acc ^= gf::mul(gf::pow_alpha((k + i) * l), top[l * k + j]);
                }
                parity[i * k + j] = acc;
            }
        }
        Ok(parity)
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn m(&self) -> usize {
        self.m
    }

    /// Computes parity packet `index` over `data` (k packets, each zero-padded to `len`).
    pub fn encode(&self, index: usize, data: &[&[u8]], len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        let row = &self.parity[index * self.k..(index + 1) * self.k];
        for (&c, d) in row.iter().zip(data) {
            gf::mul_add(&mut out, c, &d[..d.len().min(len)]);
        }
        out
    }

    /// Rebuilds the missing data packets in place. `data` holds the k media packets (present
    /// ones padded or not, missing ones `None`), `parity` the m parity packets (`None` when
    /// not received), each `len` bytes. Returns the indexes rebuilt.
    pub fn reconstruct(
        &self,
        data: &mut [Option<Vec<u8>>],
        parity: &[Option<&[u8]>],
        len: usize,
    ) -> Result<Vec<usize>, RsFecError> {
        let (k, m) = (self.k, self.m);
        if data.len() != k || parity.len() != m {
            return Err(RsFecError::Block {
                k: data.len(),
                m: parity.len(),
            });
        }
        let lost: Vec<usize> = (0..k).filter(|&i| data[i].is_none()).collect();
        if lost.is_empty() {
            return Ok(lost);
        }
        let have: Vec<usize> = (0..m).filter(|&i| parity[i].is_some()).collect();
        if have.len() < lost.len() {
            return Err(RsFecError::TooManyLost);
        }
        // Rows of the system: the present data packets (unit rows) and as many parity rows as
        // there are lost packets; its inverse expresses every data packet in the received ones.
        let mut rows = Vec::with_capacity(k);
        let mut matrix = vec![0u8; k * k];
        for i in 0..k {
            if data[i].is_some() {
                matrix[rows.len() * k + i] = 1;
                rows.push(Received::Data(i));
            }
        }
        for &p in have.iter().take(lost.len()) {
            let at = rows.len();
            matrix[at * k..(at + 1) * k].copy_from_slice(&self.parity[p * k..(p + 1) * k]);
            rows.push(Received::Parity(p));
        }
        invert(&mut matrix, k)?;
        let mut rebuilt = Vec::with_capacity(lost.len());
        for &i in &lost {
            let mut out = vec![0u8; len];
            for (l, src) in rows.iter().enumerate() {
                let c = matrix[i * k + l];
                let bytes: &[u8] = match *src {
                    Received::Data(d) => data[d].as_deref().unwrap_or_default(),
                    Received::Parity(p) => parity[p].unwrap_or_default(),
                };
                gf::mul_add(&mut out, c, &bytes[..bytes.len().min(len)]);
            }
            rebuilt.push(out);
        }
        for (&i, packet) in lost.iter().zip(rebuilt) {
            data[i] = Some(packet);
        }
        Ok(lost)
    }
}

#[derive(Debug, Clone, Copy)]
enum Received {
    Data(usize),
    Parity(usize),
}

/// Builds the FEC datagrams (RTP header included) protecting `block`, whole RTP packets with
/// consecutive sequence numbers, as an operator's encoder does. For tests and the fuzz target.
pub fn encode_block(
    block: &[&[u8]],
    m: usize,
    first_fec_seq: u16,
    payload_type: u8,
) -> Result<Vec<Vec<u8>>, RsFecError> {
    let code = Code::new(block.len(), m)?;
    let rtp_len = block.iter().map(|p| p.len()).max().unwrap_or(0);
    if !(12..=MAX_RTP_LEN).contains(&rtp_len) {
        return Err(RsFecError::RtpLen(rtp_len as u16));
    }
    let begin = block
        .first()
        .and_then(|p| rtp::parse_rtp(p).ok())
        .map_or(0, |p| p.header.sequence);
    Ok((0..m)
        .map(|index| {
            let header = RsHeader {
                begin,
                end: begin.wrapping_add(block.len() as u16 - 1),
                m: m as u8,
                index: index as u8,
                fec_len: rtp_len as u16,
                rtp_len: rtp_len as u16,
            };
            let mut d = vec![0x80, payload_type & 0x7f];
            d.extend_from_slice(&first_fec_seq.wrapping_add(index as u16).to_be_bytes());
            d.extend_from_slice(&[0; 8]);
            d.extend_from_slice(&header.to_bytes());
            d.extend_from_slice(&code.encode(index, block, rtp_len));
            d
        })
        .collect())
}

/// A media packet rebuilt from a block: its sequence number and its RTP payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebuilt {
    pub sequence: u16,
    pub payload: Vec<u8>,
}

/// What a recovery round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    pub rebuilt: Vec<Rebuilt>,
    /// Lost packets given up on: their block was evicted or could not be decoded.
    pub unrecoverable: u64,
    /// Blocks closed without a decode because the caller's budget refused it
    /// (`Recovery::repair_within`); their losses are not in `unrecoverable`.
    pub over_budget: u64,
}

/// What decoding a block with `lost` losses costs, in units of about a nanosecond of one
/// core (measured in a release build on x86-64: a block of 250 packets with 5 losses took
/// 28 ms, one of 10 with 1 loss 21 µs). The k × k inversion (O(k³)) is charged twice, as a
/// block of a new shape also builds its code's matrix (as costly again): charged always, so a
/// sender alternating shapes gains nothing. Then one pass over the block per lost packet.
pub fn decode_cost(header: &RsHeader, lost: usize) -> u64 {
    let k = header.k() as u64;
    2 * k * k * k + (lost as u64 + 1) * k * u64::from(header.rtp_len)
}

/// One block's parity as received so far.
#[derive(Debug)]
struct Block {
    header: RsHeader,
    parity: Vec<Option<Vec<u8>>>,
}

impl Block {
    /// Parity bytes it holds.
    fn held(&self) -> usize {
        self.parity.iter().flatten().map(Vec::len).sum()
    }
}

/// Recent media packets (whole datagrams) and open FEC blocks; rebuilds lost packets.
///
/// Media is held in `capacity` slots indexed by sequence number (a power of two, so the
/// index stays consistent across the 16-bit wrap). A block is dropped once it is whole or
/// repaired, or when more than `capacity` packets separate it from the newest media packet.
/// At most `MAX_BLOCKS` blocks and `MAX_PARITY_BYTES` of parity are open at once, the oldest
/// block dropped first.
#[derive(Debug)]
pub struct Recovery {
    media: Vec<Option<(u16, Vec<u8>)>>,
    blocks: Vec<Block>,
    /// Parity bytes held by `blocks`.
    parity_bytes: usize,
    newest: Option<u16>,
    code: Option<Code>,
}

/// Open blocks kept at most (rtp2httpd keeps as many).
pub const MAX_BLOCKS: usize = 32;

/// Parity bytes kept at most across the open blocks. A block names its own `m` and `rtp_len`,
/// so a sender could otherwise make `MAX_BLOCKS` of them hold 127 parity packets of 2,048
/// bytes each (about 8 MiB per channel) by numbering them ahead of the media (never too old)
/// and never sending enough to decode. Real streams keep a few blocks of a few parity packets
/// open (k = 100, m = 5 at 1,328 bytes is 7 KiB a block); the largest block possible (254 ×
/// 2,048 bytes) still fits.
pub const MAX_PARITY_BYTES: usize = 1 << 20;

impl Recovery {
    /// `capacity` is rounded up to a power of two between 16 and 4096.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(16, 4096).next_power_of_two();
        Self {
            media: (0..capacity).map(|_| None).collect(),
            blocks: Vec::new(),
            parity_bytes: 0,
            newest: None,
            code: None,
        }
    }

    fn slot(&self, seq: u16) -> usize {
        usize::from(seq) & (self.media.len() - 1)
    }

    /// Remembers a media datagram (received or rebuilt), whole.
    pub fn media(&mut self, sequence: u16, datagram: &[u8]) {
        if self
            .newest
            .is_none_or(|n| (sequence.wrapping_sub(n) as i16) > 0)
        {
            self.newest = Some(sequence);
        }
        let at = self.slot(sequence);
        match &mut self.media[at] {
            Some((s, buf)) => {
                *s = sequence;
                buf.clear();
                buf.extend_from_slice(datagram);
            }
            empty => *empty = Some((sequence, datagram.to_vec())),
        }
    }

    fn has(&self, seq: u16) -> bool {
        matches!(&self.media[self.slot(seq)], Some((s, _)) if *s == seq)
    }

    /// Files one FEC packet's parity under its block. Returns false (and keeps nothing) when
    /// the block is already past or its shape contradicts an open block's.
    pub fn fec(&mut self, header: &RsHeader, parity: &[u8]) -> bool {
        if header.k() > self.media.len() {
            return false;
        }
        if let Some(newest) = self.newest {
            // A block wholly older than the media kept cannot be decoded any more.
            if (newest.wrapping_sub(header.end) as i16) >= self.media.len() as i16 {
                return false;
            }
        }
        let at = match self
            .blocks
            .iter()
            .position(|b| b.header.begin == header.begin && b.header.end == header.end)
        {
            Some(at) => at,
            None => {
                if self.blocks.len() >= MAX_BLOCKS {
                    // Evicting the oldest; counted when it is next examined, not here.
                    self.evict_oldest();
                }
                self.blocks.push(Block {
                    header: *header,
                    parity: vec![None; usize::from(header.m)],
                });
                self.blocks.len() - 1
            }
        };
        let block = &mut self.blocks[at];
        if block.header.m != header.m || block.header.rtp_len != header.rtp_len {
            return false;
        }
        if block.parity[usize::from(header.index)].is_some() {
            return true;
        }
        let len = usize::from(header.rtp_len);
        // Room for this parity within `MAX_PARITY_BYTES`, the oldest other blocks dropped for it
        // (this block alone never holds more: 254 × `MAX_RTP_LEN` is below it).
        let mut at = at;
        while self.parity_bytes + len > MAX_PARITY_BYTES && self.blocks.len() > 1 {
            // The oldest block other than this one (this one may be the oldest).
            let gone = self.blocks.remove(if at == 0 { 1 } else { 0 });
            self.parity_bytes -= gone.held();
            at = at.saturating_sub(1);
        }
        self.blocks[at].parity[usize::from(header.index)] = Some(parity[..len].to_vec());
        self.parity_bytes += len;
        true
    }

    /// Drops the oldest open block and its parity.
    fn evict_oldest(&mut self) {
        if !self.blocks.is_empty() {
            let gone = self.blocks.remove(0);
            self.parity_bytes -= gone.held();
        }
    }

    /// Parity bytes held by the open blocks (at most `MAX_PARITY_BYTES`).
    pub fn parity_bytes(&self) -> usize {
        self.parity_bytes
    }

    /// Whether some block still has parity waiting for a decision.
    pub fn pending(&self) -> bool {
        !self.blocks.is_empty()
    }

    /// Tries every open block: a whole one is closed, one with enough parity is decoded and
    /// closed, one too old is given up. Rebuilt packets are remembered as media.
    pub fn repair(&mut self) -> Round {
        self.repair_within(|_| true)
    }

    /// As `repair`, but each decode is first offered to `allow` with its cost
    /// (`decode_cost`); a block it refuses is closed unrepaired (`Round::over_budget`).
    pub fn repair_within(&mut self, mut allow: impl FnMut(u64) -> bool) -> Round {
        let mut round = Round::default();
        let mut keep = Vec::with_capacity(self.blocks.len());
        for block in std::mem::take(&mut self.blocks) {
            let h = block.header;
            let lost: Vec<u16> = (0..h.k())
                .map(|i| h.begin.wrapping_add(i as u16))
                .filter(|&s| !self.has(s))
                .collect();
            if lost.is_empty() {
                continue;
            }
            let received = block.parity.iter().flatten().count();
            let too_old = self
                .newest
                .is_some_and(|n| (n.wrapping_sub(h.end) as i16) >= (self.media.len() / 2) as i16);
            if received < lost.len() {
                if too_old {
                    round.unrecoverable += lost.len() as u64;
                } else {
                    keep.push(block);
                }
                continue;
            }
            if !allow(decode_cost(&h, lost.len())) {
                round.over_budget += 1;
                continue;
            }
            match self.decode(&block) {
                Ok(rebuilt) => {
                    for r in &rebuilt {
                        round.rebuilt.push(r.clone());
                    }
                    round.unrecoverable += (lost.len() - rebuilt.len()) as u64;
                }
                Err(_) => round.unrecoverable += lost.len() as u64,
            }
        }
        self.parity_bytes = keep.iter().map(Block::held).sum();
        self.blocks = keep;
        round
    }

    fn decode(&mut self, block: &Block) -> Result<Vec<Rebuilt>, RsFecError> {
        let h = block.header;
        let (k, m, len) = (h.k(), usize::from(h.m), usize::from(h.rtp_len));
        if self.code.as_ref().is_none_or(|c| c.k() != k || c.m() != m) {
            self.code = Some(Code::new(k, m)?);
        }
        let mut data: Vec<Option<Vec<u8>>> = (0..k)
            .map(|i| {
                let seq = h.begin.wrapping_add(i as u16);
                let (_, d) = self.media[self.slot(seq)]
                    .as_ref()
                    .filter(|(s, _)| *s == seq)?;
                let mut padded = d.clone();
                padded.resize(len.max(d.len()), 0);
                Some(padded)
            })
            .collect();
        let parity: Vec<Option<&[u8]>> = block.parity.iter().map(|p| p.as_deref()).collect();
        let code = self.code.as_ref().ok_or(RsFecError::Block { k, m })?;
        let lost = code.reconstruct(&mut data, &parity, len)?;
        let mut out = Vec::with_capacity(lost.len());
        for i in lost {
            let seq = h.begin.wrapping_add(i as u16);
            let Some(packet) = data[i].take() else {
                continue;
            };
            // A rebuilt packet must be the RTP packet it stands for: anything else means the
            // parity or the matrix does not match this stream.
            let Ok(p) = rtp::parse_rtp(&packet) else {
                continue;
            };
            if p.header.sequence != seq {
                continue;
            }
            let mut payload = packet[p.payload.clone()].to_vec();
            trim_ts_padding(&mut payload);
            self.media(seq, &packet);
            out.push(Rebuilt {
                sequence: seq,
                payload,
            });
        }
        Ok(out)
    }
}

/// A packet shorter than the block's longest comes back with zeros up to `rtp_len`. In a TS
/// payload every real packet starts with the sync byte, so trailing all-zero 188-byte packets
/// (and a zero tail that is not a whole packet) are that padding and are cut off.
fn trim_ts_padding(payload: &mut Vec<u8>) {
    use crate::mpegts::{PACKET_LEN, SYNC_BYTE};
    if payload.first() != Some(&SYNC_BYTE) {
        return;
    }
    let extra = payload.len() % PACKET_LEN;
    if extra != 0 && payload[payload.len() - extra..].iter().all(|&b| b == 0) {
        payload.truncate(payload.len() - extra);
    }
    while payload.len() >= 2 * PACKET_LEN
        && payload[payload.len() - PACKET_LEN..]
            .iter()
            .all(|&b| b == 0)
    {
        payload.truncate(payload.len() - PACKET_LEN);
    }
}

#[cfg(test)]
#[path = "rs_fec/tests.rs"]
mod tests;
