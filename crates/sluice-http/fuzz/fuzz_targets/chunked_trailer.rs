//! A chunked body through `Decoder::decode_with_trailer`, fed whole and in pieces of a size the
//! input chooses: the two readings agree (body, trailer, bytes used, error), `decode` and `skip`
//! find the same end, the kept trailer is exactly the coded bytes of the trailer section, and a
//! body re-coded in other chunks with the same trailer decodes to the same body and trailer.
//! What `parse_trailer` accepts, written out again, parses to the same fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::chunked::{parse_trailer, ChunkedError, Decoder, MAX_LINE};

/// Body, trailer, bytes used, whether done; or the error.
type Reading = Result<(Vec<u8>, Vec<u8>, usize, bool), ChunkedError>;

fn read(coded: &[u8], step: usize) -> Reading {
    let mut d = Decoder::new();
    let (mut out, mut trailer) = (Vec::new(), Vec::new());
    let mut at = 0;
    while at < coded.len() && !d.is_done() {
        let end = (at + step).min(coded.len());
        let used = d.decode_with_trailer(&coded[at..end], &mut out, &mut trailer)?;
        assert!(used <= end - at);
        // Short of its input only at the body's end.
        assert!(used == end - at || d.is_done());
        at += used;
    }
    Ok((out, trailer, at, d.is_done()))
}

fn encode(body: &[u8], chunk: usize, trailer: &[u8]) -> Vec<u8> {
    let mut coded = Vec::new();
    for piece in body.chunks(chunk.max(1)) {
        coded.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        coded.extend_from_slice(piece);
        coded.extend_from_slice(b"\r\n");
    }
    coded.extend_from_slice(b"0\r\n");
    coded.extend_from_slice(trailer);
    coded
}

fuzz_target!(|data: &[u8]| {
    let Some((&step, coded)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let whole = read(coded, coded.len().max(1));
    let pieces = read(coded, step);
    // Deterministic, and the same however the bytes arrive.
    assert_eq!(whole, read(coded, coded.len().max(1)));
    assert_eq!(whole, pieces);
    // The plain decoder and the scanner find the same end (or the same error).
    let mut plain = Decoder::new();
    let mut plain_out = Vec::new();
    let plain_used = plain.decode(coded, &mut plain_out);
    let mut scan = Decoder::new();
    let scanned = scan.skip(coded);
    assert_eq!(plain_used, scanned);
    let Ok((body, trailer, used, done)) = whole else {
        assert!(plain_used.is_err());
        return;
    };
    assert_eq!(plain_used, Ok(used));
    assert_eq!(plain_out, body);
    assert_eq!(plain.is_done(), done);
    if !done {
        // Input ran out first: the trailer is a prefix of what the input held of it.
        assert!(trailer.len() <= MAX_LINE + 1);
        return;
    }
    // The trailer kept is exactly the coded trailer section: the bytes just before the end.
    assert!(trailer.len() <= MAX_LINE + 1);
    assert!(trailer.ends_with(b"\r\n"));
    assert_eq!(&coded[used - trailer.len()..used], trailer.as_slice());
    // Its lines end with CRLF and hold no other CR or LF; the last one is empty.
    let lines: Vec<&[u8]> = trailer[..trailer.len() - 2]
        .split(|&b| b == b'\n')
        .collect();
    for line in &lines[..lines.len() - 1] {
        let text = line
            .strip_suffix(b"\r")
            .expect("a trailer line ends with CRLF");
        assert!(!text.is_empty());
        assert!(!text.contains(&b'\r'));
    }
    assert!(lines.last().unwrap().is_empty());
    // Body bytes never outnumber coded bytes.
    assert!(body.len() <= used);
    // Re-coded in chunks of `step` bytes with the same trailer: the same body and trailer, and
    // the coding read to its last byte.
    let again = encode(&body, step, &trailer);
    let reread = read(&again, step.max(7));
    assert_eq!(reread, Ok((body, trailer.clone(), again.len(), true)));
    // What the trailer parser accepts, written out again, reads back to the same fields.
    let first = parse_trailer(&trailer);
    assert_eq!(first, parse_trailer(&trailer));
    if let Ok(fields) = first {
        let mut written = Vec::new();
        for (name, value) in &fields {
            written.extend_from_slice(name.as_str().as_bytes());
            written.extend_from_slice(b": ");
            written.extend_from_slice(value.as_bytes());
            written.extend_from_slice(b"\r\n");
        }
        written.extend_from_slice(b"\r\n");
        assert_eq!(parse_trailer(&written), Ok(fields));
    }
});
