//! Reed-Solomon FEC tests: blocks with up to m losses come back byte-identical, across the
//! sequence wrap, for the Vandermonde codes; the fixed-matrix k = 100, m = 5 shape is refused.

use super::*;
use proptest::prelude::*;

/// An RTP packet (PT 33) carrying 7 TS packets, or fewer when `short`.
fn media(seq: u16, short: bool) -> Vec<u8> {
    let mut d = vec![0x80, 33];
    d.extend_from_slice(&seq.to_be_bytes());
    d.extend_from_slice(&(u32::from(seq) * 3000).to_be_bytes());
    d.extend_from_slice(&0x1234_5678u32.to_be_bytes());
    let packets = if short { 3 } else { 7 };
    for p in 0..packets {
        d.push(0x47);
        d.extend((1..188).map(|i| (i as u16 ^ seq.wrapping_mul(7) ^ p) as u8));
    }
    d
}

fn block(first: u16, k: usize) -> Vec<Vec<u8>> {
    (0..k)
        .map(|i| media(first.wrapping_add(i as u16), i % 9 == 4))
        .collect()
}

fn payload(datagram: &[u8]) -> Vec<u8> {
    datagram[rtp::parse_rtp(datagram).unwrap().payload].to_vec()
}

/// Feeds a block minus `lost` and its parity minus `parity_lost`; returns what came back.
fn run(first: u16, k: usize, m: usize, lost: &[usize], parity_lost: &[usize]) -> Round {
    let packets = block(first, k);
    let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    let fec = encode_block(&refs, m, 7, 127).unwrap();
    let mut r = Recovery::new(512);
    for (i, p) in packets.iter().enumerate() {
        if !lost.contains(&i) {
            r.media(first.wrapping_add(i as u16), p);
        }
    }
    for (i, f) in fec.iter().enumerate() {
        if !parity_lost.contains(&i) {
            let (h, parity) = parse_datagram(f).unwrap();
            assert!(r.fec(&h, parity));
        }
    }
    r.repair()
}

#[test]
fn header_round_trips_and_rejects_nonsense() {
    let packets = block(65_530, 10);
    let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    let fec = encode_block(&refs, 3, 0, 97).unwrap();
    let (h, parity) = parse_datagram(&fec[2]).unwrap();
    assert_eq!((h.begin, h.end, h.m, h.index), (65_530, 3, 3, 2));
    assert_eq!(h.k(), 10);
    assert!(h.covers(65_535) && h.covers(0) && h.covers(3) && !h.covers(4));
    assert_eq!(usize::from(h.rtp_len), 12 + 7 * 188);
    assert_eq!(parity.len(), usize::from(h.rtp_len));

    let mut media_pt = fec[0].clone();
    media_pt[1] = 33;
    assert_eq!(parse_datagram(&media_pt), Err(RsFecError::PayloadType(33)));
    assert_eq!(parse_payload(&[0; 11]), Err(RsFecError::TooShort));
    let mut bad = fec[0][12..].to_vec();
    bad[5] = 3; // index = m
    assert_eq!(
        parse_payload(&bad),
        Err(RsFecError::Index { index: 3, m: 3 })
    );
    let mut bad = fec[0][12..].to_vec();
    bad[4] = 0;
    assert_eq!(parse_payload(&bad), Err(RsFecError::Block { k: 10, m: 0 }));
    let mut bad = fec[0][12..].to_vec();
    bad[8..10].copy_from_slice(&4000u16.to_be_bytes());
    assert_eq!(parse_payload(&bad), Err(RsFecError::RtpLen(4000)));
    let truncated = &fec[0][12..fec[0].len() - 1];
    assert!(matches!(
        parse_payload(truncated),
        Err(RsFecError::Length { .. })
    ));
    // begin..end spanning 300 packets with m = 3 is more than GF(256) can code.
    let mut bad = fec[0][12..].to_vec();
    bad[2..4].copy_from_slice(&(65_530u16.wrapping_add(299)).to_be_bytes());
    assert_eq!(parse_payload(&bad), Err(RsFecError::Block { k: 300, m: 3 }));
}

#[test]
fn gf_tables_are_a_field() {
    for a in 1..=255u8 {
        assert_eq!(gf::mul(a, gf::inv(a)), 1, "{a}");
        assert_eq!(gf::mul(a, 1), a);
    }
    // α^8 = α^4 + α^3 + α^2 + 1 for the polynomial 0x11d.
    assert_eq!(gf::pow_alpha(8), 0x1d);
}

#[test]
fn up_to_m_losses_anywhere_are_rebuilt() {
    let round = run(100, 20, 4, &[0, 7, 13, 19], &[]);
    let got: Vec<u16> = round.rebuilt.iter().map(|r| r.sequence).collect();
    assert_eq!(got, vec![100, 107, 113, 119]);
    for r in &round.rebuilt {
        let i = usize::from(r.sequence - 100);
        assert_eq!(r.payload, payload(&block(100, 20)[i]), "seq {}", r.sequence);
    }
    assert_eq!(round.unrecoverable, 0);
}

#[test]
fn short_packets_lose_their_zero_padding() {
    // Index 4 is the short (3 TS packets) one; the block is padded to 7.
    let round = run(1, 10, 2, &[4], &[0]);
    assert_eq!(round.rebuilt.len(), 1);
    assert_eq!(round.rebuilt[0].payload.len(), 3 * 188);
    assert_eq!(round.rebuilt[0].payload, payload(&block(1, 10)[4]));
}

#[test]
fn more_losses_than_parity_stay_open_then_count_as_unrecoverable() {
    let packets = block(0, 10);
    let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    let fec = encode_block(&refs, 2, 0, 127).unwrap();
    let mut r = Recovery::new(64);
    for (i, p) in packets.iter().enumerate() {
        if i > 2 {
            r.media(i as u16, p);
        }
    }
    for f in &fec {
        let (h, parity) = parse_datagram(f).unwrap();
        r.fec(&h, parity);
    }
    assert_eq!(r.repair(), Round::default());
    assert!(r.pending());
    // The stream moves on far enough that the block cannot be decoded any more.
    for s in 10..60u16 {
        r.media(s, &media(s, false));
    }
    let round = r.repair();
    assert!(round.rebuilt.is_empty());
    assert_eq!(round.unrecoverable, 3);
    assert!(!r.pending());
}

/// `repair_within` offers each decode with its cost: a refused block is closed unrepaired
/// and counted as over budget, not as unrecoverable; whole blocks cost nothing.
#[test]
fn a_refused_decode_closes_its_block_unrepaired() {
    let mut r = Recovery::new(256);
    let mut headers = Vec::new();
    for b in 0..3u16 {
        let first = b * 10;
        let packets = block(first, 10);
        let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
        for (i, p) in packets.iter().enumerate() {
            // The middle block is whole; the others lose packets 1 and 2.
            if b == 1 || !(1..3).contains(&i) {
                r.media(first + i as u16, p);
            }
        }
        for f in encode_block(&refs, 2, first, 127).unwrap() {
            let (h, parity) = parse_datagram(&f).unwrap();
            assert!(r.fec(&h, parity));
            headers.push(h);
        }
    }
    let mut offered = Vec::new();
    let round = r.repair_within(|cost| {
        offered.push(cost);
        offered.len() > 1
    });
    let cost = decode_cost(&headers[0], 2);
    assert_eq!(offered, [cost, cost]);
    assert_eq!(cost, 2 * 1000 + 3 * 10 * u64::from(headers[0].rtp_len));
    let seqs: Vec<u16> = round.rebuilt.iter().map(|p| p.sequence).collect();
    assert_eq!(seqs, [21, 22]);
    assert_eq!((round.over_budget, round.unrecoverable), (1, 0));
    assert!(!r.pending());
    assert_eq!(r.repair(), Round::default());
}

#[test]
fn the_fixed_matrix_shape_is_refused_not_guessed() {
    assert!(matches!(
        Code::new(100, 5),
        Err(RsFecError::FixedMatrix { k: 100, m: 5 })
    ));
    // Its neighbours are ordinary Vandermonde shapes.
    assert!(Code::new(100, 4).is_ok());
    assert!(Code::new(99, 5).is_ok());
}

#[test]
fn a_large_block_rebuilds_four_losses_across_the_wrap() {
    let round = run(65_500, 100, 4, &[3, 40, 41, 99], &[]);
    assert_eq!(round.rebuilt.len(), 4, "{round:?}");
    let packets = block(65_500, 100);
    for r in &round.rebuilt {
        let i = usize::from(r.sequence.wrapping_sub(65_500));
        assert_eq!(r.payload, payload(&packets[i]));
    }
}

#[test]
fn a_late_block_is_refused() {
    let mut r = Recovery::new(64);
    for s in 1000..1100u16 {
        r.media(s, &media(s, false));
    }
    let packets = block(900, 10);
    let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    let fec = encode_block(&refs, 2, 0, 127).unwrap();
    let (h, parity) = parse_datagram(&fec[0]).unwrap();
    assert!(!r.fec(&h, parity));
    assert!(!r.pending());
}

/// Parity bytes the open blocks hold, counted from the blocks themselves.
fn held(r: &Recovery) -> usize {
    r.blocks
        .iter()
        .map(|b| b.parity.iter().flatten().map(Vec::len).sum::<usize>())
        .sum()
}

/// Attack: `MAX_BLOCKS` blocks of k = 128 numbered ahead of the media (never too old), each
/// with 127 parity packets of 2,048 bytes and no media to decode them with. They held 8 MiB
/// per channel outside `buffer_bytes`; at most `MAX_PARITY_BYTES` stay, the newest blocks, and
/// a real block sent after them is still repaired.
#[test]
fn open_blocks_hold_at_most_max_parity_bytes() {
    let mut r = Recovery::new(1024);
    r.media(0, &media(0, false));
    for b in 0..MAX_BLOCKS as u16 {
        let begin = 2000 + b * 128;
        for index in 0..127u8 {
            let h = RsHeader {
                begin,
                end: begin + 127,
                m: 127,
                index,
                fec_len: 2048,
                rtp_len: 2048,
            };
            assert!(r.fec(&h, &[0xa5; 2048]));
        }
        assert!(held(&r) <= MAX_PARITY_BYTES, "{} bytes held", held(&r));
    }
    assert_eq!(held(&r), r.parity_bytes());
    // The newest block is whole; the oldest went first.
    let last = r.blocks.last().unwrap();
    assert_eq!(last.header.begin, 2000 + (MAX_BLOCKS as u16 - 1) * 128);
    assert_eq!(last.parity.iter().flatten().count(), 127);
    // A real block still decodes, and what it held goes with it.
    let packets = block(100, 10);
    for (i, p) in packets.iter().enumerate() {
        if i != 3 {
            r.media(100 + i as u16, p);
        }
    }
    let refs: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    for f in encode_block(&refs, 2, 0, 127).unwrap() {
        let (h, parity) = parse_datagram(&f).unwrap();
        assert!(r.fec(&h, parity));
    }
    assert!(held(&r) <= MAX_PARITY_BYTES);
    let round = r.repair();
    assert_eq!(round.rebuilt.len(), 1);
    assert_eq!(round.rebuilt[0].payload, payload(&packets[3]));
    assert_eq!(held(&r), r.parity_bytes());
}

/// Parity arriving for the oldest open block, with the others holding the rest of the bound,
/// makes room by dropping the oldest other block: the bound holds whichever block it is for.
#[test]
fn parity_for_the_oldest_block_stays_within_the_bound() {
    let mut r = Recovery::new(1024);
    r.media(0, &media(0, false));
    let header = |b: u16, index: u8| RsHeader {
        begin: 2000 + b * 128,
        end: 2000 + b * 128 + 127,
        m: 127,
        index,
        fec_len: 2048,
        rtp_len: 2048,
    };
    // Half of each block's parity, until the open blocks hold nearly the bound.
    let mut b = 0;
    while r.parity_bytes() + 64 * 2048 <= MAX_PARITY_BYTES && (b as usize) < MAX_BLOCKS {
        for index in 0..64u8 {
            assert!(r.fec(&header(b, index), &[0xa5; 2048]));
        }
        b += 1;
    }
    let oldest = r.blocks[0].header.begin;
    for index in 64..127u8 {
        assert!(r.fec(&header(0, index), &[0xa5; 2048]));
        assert!(held(&r) <= MAX_PARITY_BYTES, "{} bytes held", held(&r));
    }
    assert_eq!(held(&r), r.parity_bytes());
    assert_eq!(r.blocks[0].header.begin, oldest);
    assert_eq!(r.blocks[0].parity.iter().flatten().count(), 127);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any pattern of at most m lost media packets, with enough parity left, is rebuilt
    /// byte-identical, wherever the block sits in the sequence space.
    #[test]
    fn vandermonde_codes_rebuild_any_m_losses(
        first in any::<u16>(),
        k in 1usize..40,
        m in 1usize..8,
        seed in any::<u64>(),
    ) {
        let mut rng = seed;
        let mut next = move || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (rng >> 33) as usize };
        let losses = next() % (m + 1);
        let mut lost: Vec<usize> = Vec::new();
        while lost.len() < losses.min(k) {
            let i = next() % k;
            if !lost.contains(&i) { lost.push(i); }
        }
        // Lose parity too, as long as enough is left.
        let spare = m - lost.len();
        let parity_lost: Vec<usize> = (0..m).filter(|_| next() % 3 == 0).take(spare).collect();
        let round = run(first, k, m, &lost, &parity_lost);
        let packets = block(first, k);
        prop_assert_eq!(round.rebuilt.len(), lost.len());
        prop_assert_eq!(round.unrecoverable, 0);
        for r in &round.rebuilt {
            let i = usize::from(r.sequence.wrapping_sub(first));
            prop_assert!(lost.contains(&i));
            prop_assert_eq!(&r.payload, &payload(&packets[i]));
        }
    }

    /// A large block (k = 100, m = 4), any up to four lost packets.
    #[test]
    fn large_blocks_rebuild_any_four(first in any::<u16>(), picks in proptest::collection::btree_set(0usize..100, 0..=4)) {
        let lost: Vec<usize> = picks.into_iter().collect();
        let round = run(first, 100, 4, &lost, &[]);
        prop_assert_eq!(round.rebuilt.len(), lost.len());
        let packets = block(first, 100);
        for r in &round.rebuilt {
            let i = usize::from(r.sequence.wrapping_sub(first));
            prop_assert_eq!(&r.payload, &payload(&packets[i]));
        }
    }

    /// Hostile FEC payloads never panic and never yield a header the recovery cannot hold.
    #[test]
    fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok((h, parity)) = parse_payload(&bytes) {
            prop_assert!(h.index < h.m);
            prop_assert_eq!(parity.len(), usize::from(h.rtp_len));
            let mut r = Recovery::new(64);
            r.fec(&h, parity);
            let _ = r.repair();
        }
    }
}
