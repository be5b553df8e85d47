//! Fuzzes the IPTV parsers with hostile and with near-valid full-size datagrams: RTP parsing and
//! reordering (any window size), SMPTE 2022-1 FEC parsing and recovery, TS sync search,
//! continuity checking across packets and datagrams, and random-access search must never panic,
//! and every range returned must lie inside the datagram.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::{fec, mpegts, rtp};

/// Largest datagram built; a little above an Ethernet MTU, as `max_datagram_bytes` allows.
const MAX_DATAGRAM: usize = 1536;

/// Reads the input as a stream of small instructions that each produce one datagram.
struct Input<'a> {
    rest: &'a [u8],
}

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, tail) = self.rest.split_first()?;
        self.rest = tail;
        Some(b)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes([self.byte()?, self.byte()?]))
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let (head, tail) = self.rest.split_at(n.min(self.rest.len()));
        self.rest = tail;
        head
    }
}

/// One datagram from one instruction. The control byte picks raw bytes (a two-byte length, so
/// full-size datagrams are reachable) or a synthesized RTP packet of 1 to 8 TS packets with
/// correct sync bytes, fuzzed headers and adaptation fields, and optional junk in front.
fn next_datagram(input: &mut Input<'_>, seq: &mut u16, out: &mut Vec<u8>) -> Option<bool> {
    let control = input.byte()?;
    out.clear();
    if control & 0x80 == 0 {
        let len = usize::from(input.u16()?) % (MAX_DATAGRAM + 1);
        out.extend_from_slice(input.take(len));
        return Some(false);
    }
    // RTP header: a sequence that mostly steps by one, sometimes jumps or goes back.
    let step = input.byte()?;
    *seq = match step {
        0..=199 => seq.wrapping_add(1),
        200..=239 => seq.wrapping_add(u16::from(step - 198)),
        240..=249 => seq.wrapping_sub(u16::from(step - 239)),
        _ => input.u16()?,
    };
    let flags = input.byte()?;
    let with_rtp = flags & 0x01 == 0;
    if with_rtp {
        // Version 2 always; CSRC count, extension and padding from the fuzzer.
        let padded = if flags & 0x40 != 0 { 0x20 } else { 0 };
        out.push(0x80 | padded | ((flags & 0x3e) >> 1));
        out.push(33);
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]);
        // CSRCs from the input (zero-filled when it runs out) and an empty extension, so the
        // header is well formed and the payload starts on the first TS packet.
        let csrc = usize::from(out[0] & 0x0f) * 4;
        let at = out.len();
        out.extend_from_slice(input.take(csrc));
        out.resize(at + csrc, 0);
        if out[0] & 0x10 != 0 {
            out.extend_from_slice(&[0xbe, 0xde, 0, 0]);
        }
    }
    if control & 0x40 != 0 {
        let junk = usize::from(input.byte()?) % 200;
        out.extend_from_slice(input.take(junk));
    }
    let packets = 1 + usize::from(control & 0x07);
    for _ in 0..packets {
        let pid_hi = input.byte()?;
        let pid_lo = input.byte()?;
        let afc_cc = input.byte()?;
        let af_len = input.byte()?;
        let af_flags = input.byte()?;
        let start = out.len();
        out.extend_from_slice(&[mpegts::SYNC_BYTE, pid_hi, pid_lo, afc_cc, af_len, af_flags]);
        let body = input.take(usize::from(control & 0x38));
        out.extend_from_slice(body);
        out.resize(start + mpegts::PACKET_LEN, 0xff);
    }
    if with_rtp && flags & 0x40 != 0 {
        let pad = input.byte()?;
        out.extend(std::iter::repeat_n(0, usize::from(pad.saturating_sub(1))));
        out.push(pad);
    }
    out.truncate(MAX_DATAGRAM);
    Some(control & 0x40 == 0)
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input { rest: data };
    let window = input.u16().map_or(32, |w| usize::from(w % 4096) + 1);
    let mut reorder = rtp::Reorder::new(window);
    let mut recovery = fec::Recovery::new(64);
    let mut out = Vec::new();
    let mut continuity = mpegts::Continuity::default();
    let mut datagram = Vec::with_capacity(MAX_DATAGRAM);
    let mut seq = 0u16;
    let mut pushed = 0u64;
    while let Some(clean) = next_datagram(&mut input, &mut seq, &mut datagram) {
        let datagram = &datagram[..];
        let kind = rtp::classify(datagram);
        let payload = match rtp::parse_rtp(datagram) {
            Ok(p) => {
                assert!(p.payload.start <= p.payload.end && p.payload.end <= datagram.len());
                reorder.push(p.header.sequence, p.payload.len(), &mut out);
                pushed += 1;
                // The same datagram read as FEC, then as a media packet FEC may protect.
                let body = &datagram[p.payload.clone()];
                if let Ok((h, xor)) = fec::parse_fec(body) {
                    if let fec::FecOutcome::Repaired(m) = recovery.fec(&h, xor) {
                        assert!(h.protected().any(|s| s == m.sequence));
                        assert!(m.payload.len() <= xor.len().max(MAX_DATAGRAM));
                    }
                }
                recovery.media(fec::MediaPacket {
                    sequence: p.header.sequence,
                    payload_type: p.header.payload_type,
                    timestamp: p.header.timestamp,
                    payload: body.to_vec(),
                });
                &datagram[p.payload]
            }
            Err(_) => datagram,
        };
        if kind == rtp::PayloadKind::Ts {
            assert_eq!(payload, datagram);
        }
        let before = continuity.packets();
        continuity.check(payload);
        assert!(continuity.packets() - before <= (payload.len() / mpegts::PACKET_LEN) as u64);
        if let Some(at) = mpegts::find_sync(payload) {
            assert_eq!(payload[at], mpegts::SYNC_BYTE);
            let tail = &payload[at..];
            if let Some(ra) = mpegts::find_random_access(tail) {
                assert_eq!(ra % mpegts::PACKET_LEN, 0);
                assert!(mpegts::parse_header(&tail[ra..]).is_some_and(|h| h.random_access));
            }
        } else if clean && payload.len() >= mpegts::PACKET_LEN && payload[0] == mpegts::SYNC_BYTE {
            // Packets built with sync bytes at every 188 bytes must be found.
            panic!("sync not found in a clean run of packets");
        }
    }
    reorder.flush(&mut out);
    assert_eq!(reorder.held(), 0);
    let stats = reorder.stats();
    assert_eq!(stats.delivered, out.len() as u64);
    assert!(stats.delivered + stats.duplicates <= pushed);
});
