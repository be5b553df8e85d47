//! FEC tests: a row/column matrix with packets dropped comes back byte-identical.

use super::*;
use proptest::prelude::*;

fn packet(seq: u16) -> MediaPacket {
    // Varying lengths and contents so the length and payload recovery are both exercised.
    let len = 1316 - usize::from(seq % 5) * 188;
    MediaPacket {
        sequence: seq,
        payload_type: 33,
        timestamp: 90_000u32.wrapping_mul(u32::from(seq)),
        payload: (0..len)
            .map(|i| (i as u16 ^ seq.wrapping_mul(31)) as u8)
            .collect(),
    }
}

#[test]
fn parses_what_it_encodes() {
    let row: Vec<MediaPacket> = (100..104).map(packet).collect();
    let refs: Vec<&MediaPacket> = row.iter().collect();
    let fec = encode_fec(&refs, true, 1);
    let (h, xor) = parse_fec(&fec).unwrap();
    assert_eq!(h.sn_base, 100);
    assert!(h.row);
    assert_eq!((h.offset, h.na), (1, 4));
    assert_eq!(h.protected().collect::<Vec<_>>(), vec![100, 101, 102, 103]);
    let longest = row.iter().map(|p| p.payload.len()).max().unwrap();
    assert_eq!(xor.len(), longest);
    assert_eq!(parse_fec(&fec[..15]), Err(FecError::TooShort));
    let mut other = fec.clone();
    other[12] |= 0x08; // type 1
    assert_eq!(parse_fec(&other), Err(FecError::NotXor(1)));
    let mut empty = fec;
    empty[14] = 0;
    assert_eq!(parse_fec(&empty), Err(FecError::Empty));
}

/// A FEC payload (header and 4 bytes of XOR) with these header fields.
fn header_only(row: bool, offset: u8, na: u8) -> Vec<u8> {
    let mut fec = vec![0u8; FEC_HEADER_LEN + 4];
    fec[12] = if row { 0x40 } else { 0 };
    fec[13] = offset;
    fec[14] = na;
    fec
}

/// Attack: a FEC header claiming 255 packets, each XOR a pass over 255 payloads. SMPTE
/// 2022-1 matrices are at most 20 columns, 20 rows and 100 packets, with at least 4 rows (and
/// 4 columns when rows are sent); anything else is refused before any work.
#[test]
fn matrices_outside_the_standard_are_refused() {
    let refused = |row, offset, na| {
        assert_eq!(
            parse_fec(&header_only(row, offset, na)).map(|(h, _)| h),
            Err(FecError::Matrix { offset, na }),
            "row {row}, offset {offset}, NA {na}"
        );
    };
    // Columns: L = offset, D = NA.
    refused(false, 255, 255);
    refused(false, 21, 4);
    refused(false, 5, 21);
    refused(false, 20, 6); // 120 packets
    refused(false, 6, 20);
    refused(false, 11, 10);
    refused(false, 10, 3); // fewer than 4 rows
                           // Rows: offset 1, NA = L, 4 to 20.
    refused(true, 1, 255);
    refused(true, 1, 21);
    refused(true, 1, 3);
    refused(true, 2, 10);
    refused(true, 20, 5);
    let accepted = |row, offset, na| {
        let fec = header_only(row, offset, na);
        let (h, xor) =
            parse_fec(&fec).unwrap_or_else(|e| panic!("row {row}, offset {offset}, NA {na}: {e}"));
        assert_eq!((h.row, h.offset, h.na, xor.len()), (row, offset, na, 4));
    };
    for (l, d) in [(1, 4), (1, 20), (20, 5), (5, 20), (10, 10), (4, 4), (3, 20)] {
        accepted(false, l, d);
    }
    for l in [4, 10, 20] {
        accepted(true, 1, l);
    }
}

/// `cost` counts what `fec` XORs: the FEC payload and each remembered protected packet.
#[test]
fn cost_is_the_bytes_xored() {
    let col: Vec<MediaPacket> = (0..5).map(|r| packet(r * 20)).collect();
    let refs: Vec<&MediaPacket> = col.iter().collect();
    let fec = encode_fec(&refs, false, 20);
    let (h, xor) = parse_fec(&fec).unwrap();
    let mut rec = Recovery::new(256);
    // Five missing: nothing to XOR, a look-up per protected packet.
    assert_eq!(rec.cost(&h, xor), 5, "nothing remembered");
    for p in &col[1..] {
        rec.media(p.clone());
    }
    let held: usize = col[1..].iter().map(|p| p.payload.len()).sum();
    assert_eq!(rec.cost(&h, xor), (xor.len() + held) as u64);
    assert_eq!(rec.fec(&h, xor), FecOutcome::Repaired(col[0].clone()));
    // Nothing missing now: an intact stream's FEC costs look-ups, not bytes.
    assert_eq!(rec.cost(&h, xor), 5);
    assert_eq!(rec.fec(&h, xor), FecOutcome::Intact);
}

#[test]
fn one_loss_per_row_is_repaired_byte_identical() {
    let row: Vec<MediaPacket> = (65533..=65535).chain(0..=2).map(packet).collect();
    let refs: Vec<&MediaPacket> = row.iter().collect();
    let fec = encode_fec(&refs, true, 1);
    let (h, xor) = parse_fec(&fec).unwrap();
    let mut rec = Recovery::new(64);
    for p in row.iter().filter(|p| p.sequence != 65535) {
        rec.media(p.clone());
    }
    assert_eq!(
        rec.fec(&h, xor),
        FecOutcome::Repaired(row[2].clone()),
        "the wrap does not matter"
    );
    // Nothing missing now: the same FEC packet repairs nothing.
    assert_eq!(rec.fec(&h, xor), FecOutcome::Intact);
}

#[test]
fn two_losses_in_a_row_are_left_to_the_columns() {
    let row: Vec<MediaPacket> = (0..4).map(packet).collect();
    let refs: Vec<&MediaPacket> = row.iter().collect();
    let fec = encode_fec(&refs, true, 1);
    let (h, xor) = parse_fec(&fec).unwrap();
    let mut rec = Recovery::new(64);
    rec.media(row[0].clone());
    rec.media(row[3].clone());
    assert_eq!(rec.fec(&h, xor), FecOutcome::Unrecoverable);
}

/// Sends an L × D matrix with row and column FEC, drops every `n`th media packet, and runs
/// recovery the way the gateway does: rows as they come, columns after the matrix.
fn matrix_run(l: u16, d: u16, start: u16, n: usize) -> (Vec<MediaPacket>, Vec<MediaPacket>, usize) {
    let sent: Vec<MediaPacket> = (0..l * d).map(|i| packet(start.wrapping_add(i))).collect();
    let mut rec = Recovery::new(2 * usize::from(l * d));
    let mut got: Vec<MediaPacket> = Vec::new();
    for r in 0..d {
        let row: Vec<&MediaPacket> = (0..l).map(|c| &sent[usize::from(r * l + c)]).collect();
        for p in &row {
            let index = usize::from(p.sequence.wrapping_sub(start));
            if n == 0 || index % n != n - 1 {
                rec.media((*p).clone());
                got.push((*p).clone());
            }
        }
        let fec = encode_fec(&row, true, 1);
        let (h, xor) = parse_fec(&fec).unwrap();
        got.extend(repaired(rec.fec(&h, xor)));
    }
    for c in 0..l {
        let col: Vec<&MediaPacket> = (0..d).map(|r| &sent[usize::from(r * l + c)]).collect();
        let fec = encode_fec(&col, false, l as u8);
        let (h, xor) = parse_fec(&fec).unwrap();
        got.extend(repaired(rec.fec(&h, xor)));
    }
    got.sort_by_key(|p| p.sequence.wrapping_sub(start));
    let lost = sent.len().checked_div(n).unwrap_or(0);
    (sent, got, lost)
}

fn repaired(outcome: FecOutcome) -> Option<MediaPacket> {
    match outcome {
        FecOutcome::Repaired(p) => Some(p),
        _ => None,
    }
}

#[test]
fn dropping_every_seventh_packet_of_a_matrix_is_fully_repaired() {
    // 10 × 5 across the wrap: rows 2 and 4 lose two packets each (20 and 27, 41 and 48),
    // which only their columns can repair.
    let (sent, got, lost) = matrix_run(10, 5, 65530, 7);
    assert_eq!(lost, 7);
    assert_eq!(got, sent);
}

proptest! {
    /// Any matrix size and start (the wrap included): with at most one loss per row, or per
    /// column, everything comes back byte-identical.
    #[test]
    fn any_matrix_with_sparse_loss_comes_back(l in 4u16..=20, d in 4u16..=20, start: u16, n in 0usize..30) {
        // Any matrix SMPTE 2022-1 allows with rows and columns.
        prop_assume!(l * d <= MAX_MATRIX);
        prop_assume!(n == 0 || n > usize::from(l));
        let (sent, got, _) = matrix_run(l, d, start, n);
        prop_assert_eq!(got, sent);
    }

    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok((h, xor)) = parse_fec(&bytes) {
            prop_assert!((MIN_ROWS..=MAX_DIMENSION).contains(&h.na));
            prop_assert!(u16::from(h.offset) * u16::from(h.na) <= MAX_MATRIX);
            prop_assert_eq!(xor.len(), bytes.len() - FEC_HEADER_LEN);
        }
    }
}
