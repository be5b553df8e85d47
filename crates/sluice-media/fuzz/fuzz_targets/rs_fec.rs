//! Fuzzes Reed-Solomon FEC: hostile FEC datagrams and media must never panic the parser or the
//! recovery, and a valid block built from the input with up to m packets dropped must come
//! back byte-identical.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_media::{rs_fec, rtp};

fn media(seq: u16, body: &[u8]) -> Vec<u8> {
    let mut d = vec![0x80, 33];
    d.extend_from_slice(&seq.to_be_bytes());
    d.extend_from_slice(&[0; 8]);
    d.extend_from_slice(body);
    d
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    // Hostile: the input is a stream of datagrams, 2-byte length each, fed as media or FEC.
    let mut recovery = rs_fec::Recovery::new(usize::from(control) * 16);
    let mut input = rest;
    while input.len() >= 3 {
        let len = usize::from(u16::from_be_bytes([input[0], input[1]]) % 1600);
        let kind = input[2];
        input = &input[3..];
        let (d, tail) = input.split_at(len.min(input.len()));
        input = tail;
        if kind & 1 == 0 {
            if let Ok(p) = rtp::parse_rtp(d) {
                recovery.media(p.header.sequence, d);
            }
        } else if let Ok((h, parity)) = rs_fec::parse_datagram(d) {
            assert!(h.index < h.m);
            assert_eq!(parity.len(), usize::from(h.rtp_len));
            recovery.fec(&h, parity);
        }
        if kind & 2 != 0 {
            let _ = recovery.repair();
        }
    }

    // Valid: a block shaped by the control byte, bodies cut from the input, some dropped.
    let k = usize::from(control % 30) + 1;
    let m = usize::from(control / 30 % 6) + 1;
    let first = u16::from_be_bytes([rest.first().copied().unwrap_or(0), 0xf0]);
    let packets: Vec<Vec<u8>> = (0..k)
        .map(|i| {
            let body: Vec<u8> = rest.iter().cycle().skip(i * 7).take(1 + i % 40).copied().collect();
            media(first.wrapping_add(i as u16), &body)
        })
        .collect();
    let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    let Ok(fec) = rs_fec::encode_block(&refs, m, 0, 127) else {
        return;
    };
    let lost: Vec<usize> = (0..k).filter(|i| rest.get(*i).is_some_and(|b| b & 0x80 != 0)).take(m).collect();
    let mut r = rs_fec::Recovery::new(64);
    for (i, p) in packets.iter().enumerate() {
        if !lost.contains(&i) {
            r.media(first.wrapping_add(i as u16), p);
        }
    }
    for f in &fec {
        let (h, parity) = rs_fec::parse_datagram(f).expect("own FEC parses");
        r.fec(&h, parity);
    }
    let round = r.repair();
    assert_eq!(round.rebuilt.len(), lost.len());
    for rebuilt in round.rebuilt {
        let i = usize::from(rebuilt.sequence.wrapping_sub(first));
        let original = &packets[i];
        let body = &original[rtp::parse_rtp(original).unwrap().payload];
        // Bodies shorter than the block come back zero-padded unless they are TS.
        assert!(rebuilt.payload.starts_with(body));
        assert!(rebuilt.payload[body.len()..].iter().all(|&b| b == 0));
    }
});
