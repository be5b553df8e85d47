//! MPEG-TS output: PAT and PMT sections, PES headers, and packetisation into 188-byte packets
//! with adaptation-field stuffing, PCR and random-access flags. No I/O.

use super::{RemuxState, Remuxer, Track, PMT_PID};
use crate::mpegts::{PACKET_LEN, SYNC_BYTE};

/// How far the PCR runs ahead of the DTS it is stamped beside (decoder buffering), in 90 kHz
/// ticks: 0.1 s, well inside the 1 s [`super::TIMESTAMP_OFFSET`].
pub const PCR_LEAD: u64 = 9_000;
const PROGRAM_NUMBER: u16 = 1;
const TRANSPORT_STREAM_ID: u16 = 1;
const TIMESTAMP_MASK: u64 = 0x1_ffff_ffff;

/// One PES packet to write.
pub(crate) struct Pes {
    pub pid: u16,
    pub stream_id: u8,
    pub pts: u64,
    pub dts: u64,
    /// Stamp a PCR in the first packet (the program's PCR PID).
    pub pcr: bool,
    /// Mark the first packet as a random-access point (a video keyframe).
    pub random_access: bool,
    /// Write the PES length (audio); video PES may be unbounded (length 0).
    pub bounded: bool,
}

/// PAT then PMT, one packet each.
pub(crate) fn write_tables(remuxer: &Remuxer, state: &mut RemuxState, out: &mut Vec<u8>) {
    let mut pat = Vec::with_capacity(16);
    pat.extend_from_slice(&PROGRAM_NUMBER.to_be_bytes());
    pat.extend_from_slice(&(0xe000 | PMT_PID).to_be_bytes());
    write_section(0x0000, 0x00, TRANSPORT_STREAM_ID, &pat, state, out);

    let pmt = pmt_body(remuxer.pcr_pid(), remuxer.tracks());
    write_section(PMT_PID, 0x02, PROGRAM_NUMBER, &pmt, state, out);
}

/// Whether the PMT of `tracks` fits the one packet [`write_tables`] gives it: 16 tracks with
/// registration descriptors (H.265, AC-3, E-AC-3) take 11 bytes each and do not.
pub(crate) fn pmt_fits(tracks: &[Track]) -> bool {
    // Packet header and pointer field, then the section.
    5 + section_len(&pmt_body(0, tracks)) <= PACKET_LEN
}

/// Bytes of a section around `body`: table id and length (3), the long-form header (5), the CRC.
fn section_len(body: &[u8]) -> usize {
    3 + 5 + body.len() + 4
}

/// The PMT's program info and one entry per track.
fn pmt_body(pcr_pid: u16, tracks: &[Track]) -> Vec<u8> {
    let mut pmt = Vec::with_capacity(64);
    pmt.extend_from_slice(&(0xe000 | pcr_pid).to_be_bytes());
    pmt.extend_from_slice(&0xf000u16.to_be_bytes()); // no program descriptors
    for (i, track) in tracks.iter().enumerate() {
        pmt.push(track.codec.stream_type());
        pmt.extend_from_slice(&(0xe000 | Remuxer::pid(i)).to_be_bytes());
        match track.codec.registration() {
            Some(id) => {
                pmt.extend_from_slice(&(0xf000u16 | 6).to_be_bytes());
                pmt.extend_from_slice(&[0x05, 4]);
                pmt.extend_from_slice(id);
            }
            None => pmt.extend_from_slice(&0xf000u16.to_be_bytes()),
        }
    }
    pmt
}

/// A long-form PSI section (table id, id extension, version 0, current) in one packet; callers
/// keep it short enough (see [`pmt_fits`]).
fn write_section(
    pid: u16,
    table_id: u8,
    id_extension: u16,
    body: &[u8],
    state: &mut RemuxState,
    out: &mut Vec<u8>,
) {
    let mut section = Vec::with_capacity(section_len(body));
    section.push(table_id);
    // section_length counts from after itself: 5 header bytes, the body, the CRC.
    let len = (5 + body.len() + 4) as u16;
    section.extend_from_slice(&(0xb000 | len).to_be_bytes());
    section.extend_from_slice(&id_extension.to_be_bytes());
    section.extend_from_slice(&[0xc1, 0x00, 0x00]); // version 0, current; section 0 of 0
    section.extend_from_slice(body);
    section.extend_from_slice(&crc32_mpeg2(&section).to_be_bytes());

    let start = out.len();
    out.extend_from_slice(&[SYNC_BYTE, 0x40 | (pid >> 8) as u8, pid as u8]);
    out.push(0x10 | state.next(pid));
    out.push(0x00); // pointer field
    out.extend_from_slice(&section);
    debug_assert!(out.len() - start <= PACKET_LEN, "a section past its packet");
    out.resize(start + PACKET_LEN, 0xff);
}

/// Writes one PES carrying `payload` as TS packets on `pes.pid`.
pub(crate) fn write_pes(pes: &Pes, payload: &[u8], state: &mut RemuxState, out: &mut Vec<u8>) {
    // A composition offset that would put presentation before decode (possible with signed
    // offsets) is clamped: a TS decoder cannot present a frame it has not decoded.
    let dts = if pes.dts > pes.pts && pes.dts - pes.pts < TIMESTAMP_MASK / 2 {
        pes.pts
    } else {
        pes.dts
    };
    let with_dts = dts != pes.pts;
    // Header and adaptation fields are built on the stack: this runs for every TS packet.
    let mut head = [0u8; 19];
    head[..4].copy_from_slice(&[0, 0, 1, pes.stream_id]);
    let header_data = if with_dts { 10 } else { 5 };
    let pes_len = 3 + header_data + payload.len();
    let len_field = if pes.bounded && pes_len <= 0xffff {
        pes_len as u16
    } else {
        0
    };
    head[4..6].copy_from_slice(&len_field.to_be_bytes());
    head[6] = 0x80; // marker bits, not scrambled, no priority/alignment/copyright/original
    head[7] = if with_dts { 0xc0 } else { 0x80 };
    head[8] = header_data as u8;
    if with_dts {
        head[9..14].copy_from_slice(&timestamp(0x3, pes.pts));
        head[14..19].copy_from_slice(&timestamp(0x1, dts));
    } else {
        head[9..14].copy_from_slice(&timestamp(0x2, pes.pts));
    }
    let head = &head[..9 + header_data];
    let pcr = pes.pcr.then(|| dts.wrapping_sub(PCR_LEAD) & TIMESTAMP_MASK);

    let mut parts = [head, payload];
    let mut first = true;
    while !parts[0].is_empty() || !parts[1].is_empty() {
        let left = parts[0].len() + parts[1].len();
        let start = out.len();
        let pusi = if first { 0x40 } else { 0 };
        out.extend_from_slice(&[SYNC_BYTE, pusi | (pes.pid >> 8) as u8, pes.pid as u8, 0]);
        // Adaptation field: flags (PCR, random access) on the first packet, stuffing on the last.
        let mut adaptation = [0xffu8; PACKET_LEN];
        let mut flags_len = 0;
        if first && (pcr.is_some() || pes.random_access) {
            adaptation[0] = if pes.random_access { 0x40 } else { 0 };
            flags_len = 1;
            if let Some(pcr) = pcr {
                adaptation[0] |= 0x10;
                adaptation[1..7].copy_from_slice(&pcr_bytes(pcr));
                flags_len = 7;
            }
        }
        let room = PACKET_LEN - 4 - if flags_len == 0 { 0 } else { 1 + flags_len };
        let take = left.min(room);
        if take < room || flags_len > 0 {
            // The field's length byte plus its flags fill exactly what the payload leaves.
            let field_len = PACKET_LEN - 4 - take - 1;
            if flags_len == 0 && field_len > 0 {
                adaptation[0] = 0x00;
            }
            out[start + 3] = 0x30 | state.next(pes.pid);
            out.push(field_len as u8);
            out.extend_from_slice(&adaptation[..field_len]);
        } else {
            out[start + 3] = 0x10 | state.next(pes.pid);
        }
        let mut need = take;
        for part in parts.iter_mut() {
            let n = need.min(part.len());
            out.extend_from_slice(&part[..n]);
            *part = &part[n..];
            need -= n;
        }
        debug_assert_eq!(out.len() - start, PACKET_LEN);
        first = false;
    }
}

/// A 33-bit PES timestamp with its 4-bit prefix and marker bits.
fn timestamp(prefix: u8, t: u64) -> [u8; 5] {
    let t = t & TIMESTAMP_MASK;
    let mid = ((((t >> 15) & 0x7fff) << 1) | 1) as u16;
    let low = (((t & 0x7fff) << 1) | 1) as u16;
    let [m0, m1] = mid.to_be_bytes();
    let [l0, l1] = low.to_be_bytes();
    [
        (prefix << 4) | (((t >> 30) as u8 & 0x07) << 1) | 1,
        m0,
        m1,
        l0,
        l1,
    ]
}

/// A PCR: 33-bit base at 90 kHz, 6 reserved bits, 9-bit extension (0).
fn pcr_bytes(base: u64) -> [u8; 6] {
    let v = (base << 15) | (0x3f << 9);
    let b = v.to_be_bytes();
    [b[2], b[3], b[4], b[5], b[6], b[7]]
}

/// CRC-32/MPEG-2 (polynomial 0x04C11DB7, not reflected, initial all ones, no final xor).
pub(crate) fn crc32_mpeg2(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &byte in data {
        crc ^= u32::from(byte) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04c1_1db7
            } else {
                crc << 1
            };
        }
    }
    crc
}
