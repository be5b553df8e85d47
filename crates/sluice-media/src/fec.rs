//! SMPTE 2022-1 row/column XOR forward error correction: the FEC header parser and the
//! recovery of one lost media packet per row or column. No I/O.
//!
//! A FEC packet is an RTP packet whose payload starts with a 16-byte header:
//!
//! ```text
//!  0               1               2               3
//! |        SNBase low bits        |        Length recovery        |
//! |E| PT recovery |                 Mask (0)                      |
//! |                          TS recovery                          |
//! |N|D|type |index|    Offset     |      NA       | SNBase ext (0)|
//! ```
//!
//! followed by the XOR of the protected packets' payloads (each zero-padded to the longest).
//! It protects the `NA` media packets `SNBase + j × Offset` (j = 0..NA): a column packet
//! (`D = 0`) has `Offset = L` and `NA = D`, a row packet (`D = 1`) has `Offset = 1`, `NA = L`.
//! When exactly one of them is missing, XOR-ing everything else with the FEC packet gives back
//! its payload, its payload length, its payload type and its timestamp.
//!
//! SMPTE 2022-1 bounds the matrix (`1 ≤ L ≤ 20`, `4 ≤ D ≤ 20`, `L × D ≤ 100`, and `L ≥ 4` when
//! rows are sent); a header outside it is refused, so one FEC packet XORs at most 20 payloads
//! (the fields allow 255, which a hostile sender would use to multiply the work).

/// Length of the FEC header that follows the FEC packet's own RTP header.
pub const FEC_HEADER_LEN: usize = 16;
/// Most columns (L) or rows (D) a 2022-1 matrix has.
pub const MAX_DIMENSION: u8 = 20;
/// Fewest rows (D) a matrix has, and fewest columns (L) when row FEC is sent.
pub const MIN_ROWS: u8 = 4;
/// Most packets (L × D) a matrix has.
pub const MAX_MATRIX: u16 = 100;

/// Why a FEC payload is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FecError {
    #[error("FEC payload shorter than its 16-byte header")]
    TooShort,
    #[error("FEC protects no packets (offset or NA is zero)")]
    Empty,
    #[error("FEC type {0} is not XOR (SMPTE 2022-1 type 0)")]
    NotXor(u8),
    #[error("FEC matrix (offset {offset}, NA {na}) is outside SMPTE 2022-1's limits")]
    Matrix { offset: u8, na: u8 },
}

/// The fields of a SMPTE 2022-1 FEC header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FecHeader {
    pub sn_base: u16,
    pub length_recovery: u16,
    pub pt_recovery: u8,
    pub ts_recovery: u32,
    /// `D = 1`: a row packet; `D = 0`: a column packet.
    pub row: bool,
    pub offset: u8,
    pub na: u8,
}

impl FecHeader {
    /// Whether the matrix this packet implies is one SMPTE 2022-1 allows. A row packet
    /// (`Offset = 1`, `NA = L`) says nothing of D, so only L is checked; a column packet
    /// (`Offset = L`, `NA = D`) is checked whole.
    fn within_limits(&self) -> bool {
        let (offset, na) = (self.offset, self.na);
        if self.row {
            offset == 1 && (MIN_ROWS..=MAX_DIMENSION).contains(&na)
        } else {
            (1..=MAX_DIMENSION).contains(&offset)
                && (MIN_ROWS..=MAX_DIMENSION).contains(&na)
                && u16::from(offset) * u16::from(na) <= MAX_MATRIX
        }
    }

    /// Sequence numbers this packet protects.
    pub fn protected(&self) -> impl Iterator<Item = u16> + '_ {
        (0..u16::from(self.na)).map(|j| {
            self.sn_base
                .wrapping_add(j.wrapping_mul(u16::from(self.offset)))
        })
    }
}

/// Parses the FEC header from a FEC packet's RTP payload; returns it and the XOR payload.
pub fn parse_fec(payload: &[u8]) -> Result<(FecHeader, &[u8]), FecError> {
    let Some(h) = payload.get(..FEC_HEADER_LEN) else {
        return Err(FecError::TooShort);
    };
    let kind = (h[12] >> 3) & 0x07;
    if kind != 0 {
        return Err(FecError::NotXor(kind));
    }
    let header = FecHeader {
        sn_base: u16::from_be_bytes([h[0], h[1]]),
        length_recovery: u16::from_be_bytes([h[2], h[3]]),
        pt_recovery: h[4] & 0x7f,
        ts_recovery: u32::from_be_bytes([h[8], h[9], h[10], h[11]]),
        row: h[12] & 0x40 != 0,
        offset: h[13],
        na: h[14],
    };
    if header.offset == 0 || header.na == 0 {
        return Err(FecError::Empty);
    }
    if !header.within_limits() {
        return Err(FecError::Matrix {
            offset: header.offset,
            na: header.na,
        });
    }
    Ok((header, &payload[FEC_HEADER_LEN..]))
}

/// A media packet as FEC sees it: what the XOR covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaPacket {
    pub sequence: u16,
    pub payload_type: u8,
    pub timestamp: u32,
    pub payload: Vec<u8>,
}

/// Recent media packets, kept so a FEC packet arriving after them can repair a gap.
///
/// Held in `capacity` slots indexed by sequence number (a power of two, so the index stays
/// consistent across the 16-bit wrap): a 2022-1 matrix is at most L × D packets and column FEC
/// arrives a whole matrix late, so keep about twice the matrix.
#[derive(Debug)]
pub struct Recovery {
    slots: Vec<Option<MediaPacket>>,
}

/// How many protected packets a FEC packet finds missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    None,
    One,
    Many,
}

/// What one FEC packet did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FecOutcome {
    /// Exactly one protected packet was missing; here it is (and it is now remembered).
    Repaired(MediaPacket),
    /// Nothing it protects is missing.
    Intact,
    /// Two or more are missing (another row or column may repair them first), or the FEC
    /// packet contradicts the packets it protects.
    Unrecoverable,
}

impl Recovery {
    /// `capacity` is rounded up to a power of two between 16 and 4096.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(16, 4096).next_power_of_two();
        Self {
            slots: (0..capacity).map(|_| None).collect(),
        }
    }

    /// Remembers a media packet (received or recovered), replacing the one a capacity ago.
    pub fn media(&mut self, packet: MediaPacket) {
        let at = usize::from(packet.sequence) % self.slots.len();
        self.slots[at] = Some(packet);
    }

    fn find(&self, seq: u16) -> Option<&MediaPacket> {
        let at = usize::from(seq) % self.slots.len();
        self.slots[at].as_ref().filter(|p| p.sequence == seq)
    }

    /// The bytes `fec` would XOR for this packet: its own payload and each remembered packet
    /// it protects. A few lookups, so a caller can bound the work before doing it.
    pub fn cost(&self, header: &FecHeader, xor: &[u8]) -> u64 {
        // With no packet or two missing nothing is XORed ([`Recovery::fec`] looks first): a
        // stream that loses nothing spends a look-up per protected packet, not its bytes.
        let lookups = header.protected().count() as u64;
        if self.missing(header) != Missing::One {
            return lookups;
        }
        header
            .protected()
            .filter_map(|seq| self.find(seq))
            .map(|p| p.payload.len() as u64)
            .sum::<u64>()
            + xor.len() as u64
    }

    /// How many of the packets `header` protects are not remembered: none, one, or more.
    fn missing(&self, header: &FecHeader) -> Missing {
        let mut missing = Missing::None;
        for seq in header.protected() {
            if self.find(seq).is_none() {
                if missing == Missing::One {
                    return Missing::Many;
                }
                missing = Missing::One;
            }
        }
        missing
    }

    /// Offers a FEC packet: rebuilds the one missing packet it protects, if exactly one is.
    pub fn fec(&mut self, header: &FecHeader, xor: &[u8]) -> FecOutcome {
        // Looked at before any XOR: only one missing packet is worth the bytes.
        match self.missing(header) {
            Missing::None => return FecOutcome::Intact,
            Missing::Many => return FecOutcome::Unrecoverable,
            Missing::One => {}
        }
        let mut missing = None;
        let mut payload = xor.to_vec();
        let mut length = header.length_recovery;
        let mut pt = header.pt_recovery;
        let mut ts = header.ts_recovery;
        for seq in header.protected() {
            match self.find(seq) {
                Some(p) => {
                    if p.payload.len() > payload.len() {
                        payload.resize(p.payload.len(), 0);
                    }
                    payload
                        .iter_mut()
                        .zip(&p.payload)
                        .for_each(|(a, b)| *a ^= b);
                    length ^= p.payload.len() as u16;
                    pt ^= p.payload_type;
                    ts ^= p.timestamp;
                }
                None if missing.is_none() => missing = Some(seq),
                None => return FecOutcome::Unrecoverable,
            }
        }
        let Some(sequence) = missing else {
            return FecOutcome::Intact;
        };
        if usize::from(length) > payload.len() {
            // The length does not fit what the XOR can give: corrupt FEC, not a repair.
            return FecOutcome::Unrecoverable;
        }
        payload.truncate(usize::from(length));
        let packet = MediaPacket {
            sequence,
            payload_type: pt & 0x7f,
            timestamp: ts,
            payload,
        };
        self.media(packet.clone());
        FecOutcome::Repaired(packet)
    }
}

/// Builds the FEC payload (header and XOR) for `packets`, as a sender does. Used by tests and
/// the fuzz target; the gateway only receives FEC.
pub fn encode_fec(packets: &[&MediaPacket], row: bool, offset: u8) -> Vec<u8> {
    let longest = packets.iter().map(|p| p.payload.len()).max().unwrap_or(0);
    let mut xor = vec![0u8; longest];
    let (mut length, mut pt, mut ts) = (0u16, 0u8, 0u32);
    for p in packets {
        xor.iter_mut().zip(&p.payload).for_each(|(a, b)| *a ^= b);
        length ^= p.payload.len() as u16;
        pt ^= p.payload_type;
        ts ^= p.timestamp;
    }
    let sn_base = packets.first().map_or(0, |p| p.sequence);
    let mut out = Vec::with_capacity(FEC_HEADER_LEN + longest);
    out.extend_from_slice(&sn_base.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out.push(0x80 | (pt & 0x7f));
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&ts.to_be_bytes());
    out.push(if row { 0x40 } else { 0 });
    out.push(offset);
    out.push(packets.len() as u8);
    out.push(0);
    out.extend_from_slice(&xor);
    out
}

#[cfg(test)]
#[path = "fec/tests.rs"]
mod tests;
