//! Gzip framing: known CRCs, a member written by the `gzip` tool, headers with every optional
//! field, multi-member input, the output bound, and damaged input at every cut.

use super::*;
use proptest::prelude::*;

/// `printf 'hello gzip\n' > h.txt; gzip -9 -c h.txt`: FNAME "h.txt", a modification time, XFL 2.
const FROM_GZIP: [u8; 37] = [
    0x1f, 0x8b, 0x08, 0x08, 0x6d, 0x1b, 0x04, 0x6b, 0x02, 0x03, 0x68, 0x2e, 0x74, 0x78, 0x74, 0x00,
    0xcb, 0x48, 0xcd, 0xc9, 0xc9, 0x57, 0x48, 0xaf, 0xca, 0x2c, 0xe0, 0x02, 0x00, 0x39, 0x7c, 0x63,
    0x56, 0x0b, 0x00, 0x00, 0x00,
];

#[test]
fn crc32_matches_the_standard_check_values() {
    assert_eq!(crc32(0, b""), 0);
    assert_eq!(crc32(0, b"123456789"), 0xcbf4_3926);
    assert_eq!(
        crc32(0, b"The quick brown fox jumps over the lazy dog"),
        0x414f_a339
    );
    // Continuing a CRC equals computing it at once.
    assert_eq!(crc32(crc32(0, b"12345"), b"6789"), 0xcbf4_3926);
}

#[test]
fn reads_what_the_gzip_tool_wrote() {
    assert_eq!(decompress(&FROM_GZIP, 1024).unwrap(), b"hello gzip\n");
}

#[test]
fn round_trips_and_writes_a_fixed_header() {
    let text = b"<tv><programme/></tv>".repeat(500);
    let gz = compress(&text, 6);
    assert_eq!(gz[..10], [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
    assert!(gz.len() < text.len() / 10, "{} bytes", gz.len());
    assert_eq!(
        gz[gz.len() - 8..gz.len() - 4],
        crc32(0, &text).to_le_bytes()
    );
    assert_eq!(decompress(&gz, text.len()).unwrap(), text);
    assert_eq!(decompress(&compress(b"", 6), 0).unwrap(), b"");
}

#[test]
fn members_are_concatenated() {
    let mut two = compress(b"first,", 1);
    two.extend_from_slice(&FROM_GZIP);
    assert_eq!(decompress(&two, 100).unwrap(), b"first,hello gzip\n");
}

#[test]
fn every_optional_header_field_is_skipped_and_the_header_crc_checked() {
    let plain = compress(b"payload", 6);
    let mut header = vec![
        0x1f,
        0x8b,
        8,
        FEXTRA | FNAME | FCOMMENT | FHCRC,
        1,
        2,
        3,
        4,
        0,
        3,
    ];
    header.extend_from_slice(&[4, 0, b'a', b'b', b'c', b'd']);
    header.extend_from_slice(b"name.xml\0a comment\0");
    let sum = crc32(0, &header) as u16;
    let mut gz = header.clone();
    gz.extend_from_slice(&sum.to_le_bytes());
    gz.extend_from_slice(&plain[10..]);
    assert_eq!(decompress(&gz, 100).unwrap(), b"payload");

    let mut bad = header;
    bad.extend_from_slice(&(sum ^ 1).to_le_bytes());
    bad.extend_from_slice(&plain[10..]);
    assert_eq!(decompress(&bad, 100), Err(GzipError::HeaderChecksum));
}

#[test]
fn refuses_output_beyond_the_bound() {
    let text = vec![b'x'; 200_000];
    let gz = compress(&text, 6);
    assert_eq!(decompress(&gz, 200_000).unwrap().len(), 200_000);
    assert_eq!(decompress(&gz, 199_999), Err(GzipError::TooLarge(199_999)));
    assert_eq!(decompress(&gz, 0), Err(GzipError::TooLarge(0)));
}

#[test]
fn damaged_input_is_refused_with_its_reason() {
    assert_eq!(decompress(b"<tv/>", 100), Err(GzipError::NotGzip));
    assert_eq!(decompress(b"", 100), Err(GzipError::Truncated));
    let mut reserved = FROM_GZIP;
    reserved[3] |= 0x20;
    assert_eq!(decompress(&reserved, 100), Err(GzipError::ReservedFlags));
    let mut crc = FROM_GZIP;
    crc[29] ^= 1;
    assert_eq!(decompress(&crc, 100), Err(GzipError::Trailer));
    let mut len = FROM_GZIP;
    len[33] += 1;
    assert_eq!(decompress(&len, 100), Err(GzipError::Trailer));
    let mut corrupt = FROM_GZIP;
    corrupt[16] = 0xff; // block type 3 does not exist
    assert_eq!(decompress(&corrupt, 100), Err(GzipError::Corrupt));
    let mut garbage = FROM_GZIP.to_vec();
    garbage.extend_from_slice(b"junk after the member");
    assert_eq!(decompress(&garbage, 100), Err(GzipError::NotGzip));
    for cut in 0..FROM_GZIP.len() {
        assert!(
            decompress(&FROM_GZIP[..cut], 100).is_err(),
            "a cut at {cut} was accepted"
        );
    }
}

/// [`Inflater`]'s output, joined, or its first error.
fn inflate_in_chunks(data: &[u8], max: usize, chunk: usize) -> Result<Vec<u8>, GzipError> {
    let mut inflater = Inflater::new(data, max);
    let mut out = Vec::new();
    while let Some(piece) = inflater.next_chunk(chunk) {
        let piece = piece?;
        // Empty only when a call worked through its share of input without output.
        assert!(piece.len() <= chunk);
        out.extend_from_slice(&piece);
    }
    assert!(
        inflater.next_chunk(chunk).is_none(),
        "nothing after the end"
    );
    Ok(out)
}

#[test]
fn the_inflater_agrees_with_decompress() {
    let mut two = compress(b"first member, ", 6);
    two.extend_from_slice(&compress(&[], 6));
    two.extend_from_slice(&compress(b"second", 1));
    let mut garbage = FROM_GZIP.to_vec();
    garbage.extend_from_slice(b"junk after the member");
    let mut crc = FROM_GZIP;
    crc[29] ^= 1;
    let mut inputs = vec![FROM_GZIP.to_vec(), two, garbage, crc.to_vec(), Vec::new()];
    inputs.extend((0..FROM_GZIP.len()).map(|cut| FROM_GZIP[..cut].to_vec()));
    for data in &inputs {
        for (max, chunk) in [(100, 1), (100, 3), (100, 64 * 1024), (5, 2), (14, 7)] {
            assert_eq!(
                inflate_in_chunks(data, max, chunk),
                decompress(data, max),
                "{data:?} max {max} chunk {chunk}"
            );
        }
    }
}

/// `members` gzip members, each the text from `text(i)`, one after another.
fn members(count: usize, text: impl Fn(usize) -> Vec<u8>) -> Vec<u8> {
    (0..count).flat_map(|i| compress(&text(i), 1)).collect()
}

#[test]
fn many_members_are_refused_and_as_many_as_allowed_inflate_exactly() {
    // One real member and then empty ones (20 bytes each): every member costs a reset and an
    // output buffer, so millions of them would stall the reader for tens of seconds.
    let mut hostile = compress(b"<tv></tv>", 6);
    hostile.extend(members(MAX_MEMBERS, |_| Vec::new()));
    assert_eq!(compress(&[], 1).len(), 20);
    let refused = Err(GzipError::TooManyMembers(MAX_MEMBERS));
    assert_eq!(decompress(&hostile, 1 << 20), refused);
    assert_eq!(inflate_in_chunks(&hostile, 1 << 20, 64 * 1024), refused);

    // Exactly the allowed number, each with its own text, comes out byte for byte.
    let text = |i: usize| format!("<m{i}/>").into_bytes();
    let allowed = members(MAX_MEMBERS, text);
    let want: Vec<u8> = (0..MAX_MEMBERS).flat_map(text).collect();
    assert_eq!(decompress(&allowed, want.len()).unwrap(), want);
    for chunk in [1, 7, 64 * 1024] {
        assert_eq!(
            inflate_in_chunks(&allowed, want.len(), chunk).unwrap(),
            want
        );
    }
}

/// `bgzip` writes one member per 64 KiB of output: a guide over 64 MiB has more than
/// [`MAX_MEMBERS`] members, and must inflate all the same. The cap grows with the output, so
/// empty members after real output are still refused once past it.
#[test]
fn a_bgzf_stream_of_many_64_kib_members_inflates_exactly() {
    const BLOCK: usize = 64 * 1024;
    const COUNT: usize = 2000;
    let text = |i: usize| {
        let mut t = format!("<programme n=\"{i}\"/>\n").repeat(BLOCK / 16);
        t.truncate(BLOCK);
        t.into_bytes()
    };
    let bgzf = members(COUNT, text);
    let want: Vec<u8> = (0..COUNT).flat_map(text).collect();
    assert_eq!(want.len(), COUNT * BLOCK);
    assert_eq!(decompress(&bgzf, 256 << 20).unwrap(), want);
    assert_eq!(
        inflate_in_chunks(&bgzf, 256 << 20, 64 * 1024).unwrap(),
        want
    );

    // After 32 MiB of real output, 2,048 members are allowed in all; the 2,049th is refused.
    let big = compress(&vec![b'x'; 32 << 20], 1);
    let allowed = (32 << 20) / OUTPUT_PER_MEMBER;
    assert_eq!(allowed, 2048);
    let mut fits = big.clone();
    fits.extend(members(allowed - 1, |_| Vec::new()));
    assert_eq!(decompress(&fits, 64 << 20).unwrap().len(), 32 << 20);
    assert_eq!(
        inflate_in_chunks(&fits, 64 << 20, 64 * 1024).unwrap().len(),
        32 << 20
    );
    let mut flood = fits;
    flood.extend(compress(&[], 1));
    let refused = Err(GzipError::TooManyMembers(allowed));
    assert_eq!(decompress(&flood, 64 << 20).map(|v| v.len()), refused);
    assert_eq!(
        inflate_in_chunks(&flood, 64 << 20, 64 * 1024).map(|v| v.len()),
        refused
    );
}

#[test]
fn one_call_works_through_a_bounded_share_of_empty_members() {
    let empty = members(MAX_MEMBERS, |_| Vec::new());
    let mut inflater = Inflater::new(&empty[..], 0);
    let mut calls = 0;
    let mut pos = 0;
    while let Some(piece) = inflater.next_chunk(64 * 1024) {
        assert_eq!(piece.unwrap(), b"");
        let members = (inflater.pos - pos) / 20;
        assert!(
            members <= 1 + WORK_PER_CHUNK / MEMBER_WORK,
            "{members} members in one call"
        );
        pos = inflater.pos;
        calls += 1;
    }
    assert_eq!(inflater.pos, empty.len());
    assert_eq!(calls, MAX_MEMBERS.div_ceil(WORK_PER_CHUNK / MEMBER_WORK));
}

proptest! {
    #[test]
    fn the_inflater_round_trips(
        data in proptest::collection::vec(any::<u8>(), 0..8192),
        level in 0u8..=10,
        chunk in 1usize..3000,
    ) {
        let gz = compress(&data, level);
        prop_assert_eq!(inflate_in_chunks(&gz, data.len(), chunk).unwrap(), data);
    }

    #[test]
    fn round_trip(data in proptest::collection::vec(any::<u8>(), 0..4096), level in 0u8..=10) {
        let gz = compress(&data, level);
        prop_assert_eq!(decompress(&gz, data.len()).unwrap(), data);
    }

    #[test]
    fn any_bytes_are_refused_or_bounded(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(out) = decompress(&data, 1000) {
            prop_assert!(out.len() <= 1000);
        }
    }

    #[test]
    fn a_flipped_byte_never_panics(pos in 0usize..37, bit in 0u8..8) {
        let mut gz = FROM_GZIP;
        gz[pos] ^= 1 << bit;
        let _ = decompress(&gz, 1000);
    }
}
