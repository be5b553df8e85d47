//! The chunked transfer coding (RFC 9112 §7.1) of a response body, decoded incrementally: coded
//! bytes in as they arrive, body bytes out, the end found exactly. No I/O.
//!
//! Strict where a lenient reading could disagree with another parser about where the body ends:
//! a chunk size is 1–16 hex digits, every line ends with CRLF, chunk data is followed by CRLF.
//! Extensions are skipped (bounded); trailer fields are bounded and either dropped or, with
//! [`Decoder::decode_with_trailer`], kept as raw lines for [`parse_trailer`].

/// Longest chunk-size line tail (extensions) and longest trailer section accepted.
pub const MAX_LINE: usize = 4096;

/// Why a chunked body is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChunkedError {
    #[error("chunk size is not 1-16 hex digits")]
    BadSize,
    #[error("chunk line does not end with CRLF")]
    BadLineEnd,
    #[error("chunk data is not followed by CRLF")]
    BadDataEnd,
    #[error("chunk extensions or trailer longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("trailer field is malformed")]
    BadTrailer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In a chunk-size line: the size so far, its digit count, and how many bytes followed the
    /// digits (whitespace and extensions); `ext`: a `;` was among them; `cr`: the CR was seen.
    Size {
        size: u64,
        digits: u8,
        tail: usize,
        ext: bool,
        cr: bool,
    },
    /// Chunk data still to come.
    Data(u64),
    /// The CRLF after chunk data; `cr`: the CR was seen.
    DataEnd {
        cr: bool,
    },
    /// The trailer section after the last chunk: bytes of it so far, bytes of the current
    /// line, and whether its CR was seen.
    Trailer {
        total: usize,
        line: usize,
        cr: bool,
    },
    Done,
}

/// An incremental decoder for one chunked body.
#[derive(Debug, Clone)]
pub struct Decoder {
    state: State,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder {
            state: State::Size {
                size: 0,
                digits: 0,
                tail: 0,
                ext: false,
                cr: false,
            },
        }
    }

    /// Whether the body's last chunk and trailer have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes the coded bytes `input`, appending body bytes to `out`, and returns how many
    /// bytes of `input` belong to the body; it stops at the body's end (what follows is the
    /// next message). An error is final.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, ChunkedError> {
        self.run(input, Some(out), None)
    }

    /// Like [`Decoder::decode`], also appending the trailer section's bytes (its field lines and
    /// the empty line that ends it) to `trailer`, in the same pass: for a relay that passes the
    /// trailer fields on ([`parse_trailer`] reads them once the body [`is_done`](Self::is_done)).
    pub fn decode_with_trailer(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        trailer: &mut Vec<u8>,
    ) -> Result<usize, ChunkedError> {
        self.run(input, Some(out), Some(trailer))
    }

    /// Like [`Decoder::decode`] without keeping the body bytes: for a relay that passes the coded
    /// bytes on as they are and only needs to know where the body ends.
    pub fn skip(&mut self, input: &[u8]) -> Result<usize, ChunkedError> {
        self.run(input, None, None)
    }

    fn run(
        &mut self,
        input: &[u8],
        mut out: Option<&mut Vec<u8>>,
        mut trailer: Option<&mut Vec<u8>>,
    ) -> Result<usize, ChunkedError> {
        let mut at = 0;
        while at < input.len() {
            match self.state {
                State::Done => break,
                State::Data(left) => {
                    let n = (input.len() - at).min(usize::try_from(left).unwrap_or(usize::MAX));
                    if let Some(out) = out.as_deref_mut() {
                        out.extend_from_slice(&input[at..at + n]);
                    }
                    at += n;
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        State::DataEnd { cr: false }
                    } else {
                        State::Data(left)
                    };
                }
                state => {
                    self.state = step(state, input[at])?;
                    if let (State::Trailer { .. }, Some(t)) = (state, trailer.as_deref_mut()) {
                        // Bounded: `step` refuses a trailer longer than `MAX_LINE`.
                        t.push(input[at]);
                    }
                    at += 1;
                }
            }
        }
        Ok(at)
    }
}

/// The trailer fields of a chunked body as [`Decoder::decode_with_trailer`] kept them (empty
/// when the body had none). More than 64 fields, or a field that is no valid name and value,
/// is [`ChunkedError::BadTrailer`].
pub fn parse_trailer(raw: &[u8]) -> Result<http::HeaderMap, ChunkedError> {
    let mut fields = http::HeaderMap::new();
    if raw.is_empty() || raw == b"\r\n" {
        return Ok(fields);
    }
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let parsed = match httparse::parse_headers(raw, &mut slots) {
        Ok(httparse::Status::Complete((_, parsed))) => parsed,
        _ => return Err(ChunkedError::BadTrailer),
    };
    for f in parsed {
        let name = http::HeaderName::from_bytes(f.name.as_bytes())
            .map_err(|_| ChunkedError::BadTrailer)?;
        let value = http::HeaderValue::from_bytes(f.value).map_err(|_| ChunkedError::BadTrailer)?;
        fields.append(name, value);
    }
    Ok(fields)
}

fn hex(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

/// One byte of framing (anything but chunk data).
fn step(state: State, b: u8) -> Result<State, ChunkedError> {
    Ok(match state {
        State::Size {
            size,
            digits,
            tail,
            ext,
            cr,
        } => {
            if cr {
                if b != b'\n' {
                    return Err(ChunkedError::BadLineEnd);
                }
                if digits == 0 {
                    return Err(ChunkedError::BadSize);
                }
                return Ok(if size == 0 {
                    State::Trailer {
                        total: 0,
                        line: 0,
                        cr: false,
                    }
                } else {
                    State::Data(size)
                });
            }
            match (hex(b), tail) {
                (Some(d), 0) => {
                    if digits == 16 {
                        return Err(ChunkedError::BadSize);
                    }
                    State::Size {
                        size: (size << 4) | d,
                        digits: digits + 1,
                        tail,
                        ext,
                        cr,
                    }
                }
                _ if b == b'\r' => State::Size {
                    size,
                    digits,
                    tail,
                    ext,
                    cr: true,
                },
                _ if b == b'\n' => return Err(ChunkedError::BadLineEnd),
                // Digits come first; after them only whitespace and `;` extensions.
                _ if digits == 0 => return Err(ChunkedError::BadSize),
                _ if !ext && !matches!(b, b' ' | b'\t' | b';') => {
                    return Err(ChunkedError::BadSize)
                }
                _ if b < 0x20 && b != b'\t' || b == 0x7f => return Err(ChunkedError::BadSize),
                _ if tail >= MAX_LINE => return Err(ChunkedError::TooLong),
                _ => State::Size {
                    size,
                    digits,
                    tail: tail + 1,
                    ext: ext || b == b';',
                    cr,
                },
            }
        }
        State::DataEnd { cr: false } if b == b'\r' => State::DataEnd { cr: true },
        State::DataEnd { cr: true } if b == b'\n' => State::Size {
            size: 0,
            digits: 0,
            tail: 0,
            ext: false,
            cr: false,
        },
        State::DataEnd { .. } => return Err(ChunkedError::BadDataEnd),
        State::Trailer { total, line, cr } => {
            if total >= MAX_LINE {
                return Err(ChunkedError::TooLong);
            }
            match (cr, b) {
                (true, b'\n') if line == 0 => State::Done,
                (true, b'\n') => State::Trailer {
                    total: total + 1,
                    line: 0,
                    cr: false,
                },
                (true, _) | (false, b'\n') => return Err(ChunkedError::BadLineEnd),
                (false, b'\r') => State::Trailer {
                    total: total + 1,
                    line,
                    cr: true,
                },
                (false, _) => State::Trailer {
                    total: total + 1,
                    line: line + 1,
                    cr: false,
                },
            }
        }
        State::Data(_) | State::Done => state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(coded: &[u8]) -> Result<(Vec<u8>, usize, bool), ChunkedError> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        let used = d.decode(coded, &mut out)?;
        Ok((out, used, d.is_done()))
    }

    #[test]
    fn decodes_chunks_extensions_and_trailers() {
        let coded = b"5\r\nhello\r\n6;name=\"v\"\r\n world\r\nA \r\n0123456789\r\n0\r\nExpires: x\r\n\r\nNEXT";
        let (out, used, done) = decode_all(coded).unwrap();
        assert_eq!(out, b"hello world0123456789");
        assert!(done);
        assert_eq!(&coded[used..], b"NEXT");
    }

    #[test]
    fn skip_finds_the_same_end_as_decode_however_split() {
        let coded = b"5\r\nhello\r\n6;x=1\r\n world\r\n0\r\nT: 1\r\n\r\nNEXT";
        let end = coded.len() - 4;
        for split in 0..coded.len() {
            let mut d = Decoder::new();
            let first = d.skip(&coded[..split]).unwrap();
            assert_eq!(first, split.min(end));
            let second = d.skip(&coded[first..]).unwrap();
            assert!(d.is_done(), "split at {split}");
            assert_eq!(first + second, end);
        }
    }

    #[test]
    fn trailer_fields_are_kept_in_the_same_pass_however_split() {
        let coded = b"3\r\nabc\r\n0\r\nGrpc-Status: 0\r\nx-sum: a b\r\n\r\nNEXT";
        let end = coded.len() - 4;
        for split in 0..coded.len() {
            let mut d = Decoder::new();
            let (mut out, mut trailer) = (Vec::new(), Vec::new());
            let first = d
                .decode_with_trailer(&coded[..split], &mut out, &mut trailer)
                .unwrap();
            let second = d
                .decode_with_trailer(&coded[first..], &mut out, &mut trailer)
                .unwrap();
            assert!(d.is_done(), "split at {split}");
            assert_eq!(first + second, end);
            assert_eq!(out, b"abc");
            let fields = parse_trailer(&trailer).unwrap();
            assert_eq!(fields.len(), 2);
            assert_eq!(fields["grpc-status"], "0");
            assert_eq!(fields["x-sum"], "a b");
        }
        let mut d = Decoder::new();
        let (mut out, mut trailer) = (Vec::new(), Vec::new());
        d.decode_with_trailer(b"0\r\n\r\n", &mut out, &mut trailer)
            .unwrap();
        assert!(d.is_done());
        assert!(parse_trailer(&trailer).unwrap().is_empty());
        assert_eq!(
            parse_trailer(b"bad name: 1\r\n\r\n"),
            Err(ChunkedError::BadTrailer)
        );
    }

    #[test]
    fn empty_body_and_partial_input() {
        assert_eq!(decode_all(b"0\r\n\r\n").unwrap(), (vec![], 5, true));
        let (out, used, done) = decode_all(b"4\r\nab").unwrap();
        assert_eq!((out.as_slice(), used, done), (&b"ab"[..], 5, false));
    }

    #[test]
    fn refuses_what_parsers_could_disagree_on() {
        for (coded, want) in [
            (&b"\r\n"[..], ChunkedError::BadSize),
            (b"x\r\n", ChunkedError::BadSize),
            (b"-1\r\n", ChunkedError::BadSize),
            (b"0x5\r\n", ChunkedError::BadSize),
            (b"11111111111111111\r\n", ChunkedError::BadSize),
            (b"5\n", ChunkedError::BadLineEnd),
            (b"5\rx", ChunkedError::BadLineEnd),
            (b"5 5\r\n", ChunkedError::BadSize),
            (b"2\r\nabc\r\n", ChunkedError::BadDataEnd),
            (b"2\r\nab\n", ChunkedError::BadDataEnd),
            (b"0\r\nX: y\n", ChunkedError::BadLineEnd),
            (b"1;a\x00\r\n", ChunkedError::BadSize),
        ] {
            assert_eq!(
                decode_all(coded),
                Err(want),
                "{}",
                String::from_utf8_lossy(coded)
            );
        }
        let long = [b"1;".as_slice(), &[b'a'; MAX_LINE], b"\r\n"].concat();
        assert_eq!(decode_all(&long), Err(ChunkedError::TooLong));
        let trailer = [b"0\r\nX: ".as_slice(), &[b'a'; MAX_LINE], b"\r\n\r\n"].concat();
        assert_eq!(decode_all(&trailer), Err(ChunkedError::TooLong));
    }

    proptest! {
        /// Any body, cut into any chunks, coded and then fed in any pieces, decodes to itself
        /// and ends exactly at the end of its coding.
        #[test]
        fn round_trips_in_any_pieces(
            body in proptest::collection::vec(any::<u8>(), 0..2000),
            cuts in proptest::collection::vec(1usize..300, 1..20),
            feed in proptest::collection::vec(1usize..64, 1..50),
            upper in any::<bool>(),
        ) {
            let mut coded = Vec::new();
            let (mut at, mut i) = (0, 0);
            while at < body.len() {
                let n = cuts[i % cuts.len()].min(body.len() - at);
                let size = if upper { format!("{n:X}") } else { format!("{n:x}") };
                coded.extend_from_slice(size.as_bytes());
                if i % 3 == 1 {
                    coded.extend_from_slice(b" ;ext=1");
                }
                coded.extend_from_slice(b"\r\n");
                coded.extend_from_slice(&body[at..at + n]);
                coded.extend_from_slice(b"\r\n");
                at += n;
                i += 1;
            }
            coded.extend_from_slice(b"0\r\nT: v\r\n\r\n");
            let end = coded.len();
            coded.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
            let mut d = Decoder::new();
            let mut out = Vec::new();
            let (mut pos, mut j) = (0, 0);
            while pos < coded.len() && !d.is_done() {
                let n = feed[j % feed.len()].min(coded.len() - pos);
                let used = d.decode(&coded[pos..pos + n], &mut out).unwrap();
                prop_assert!(used <= n);
                pos += used;
                j += 1;
                if used < n {
                    break;
                }
            }
            prop_assert!(d.is_done());
            prop_assert_eq!(pos, end);
            prop_assert_eq!(out, body);
        }
    }
}
