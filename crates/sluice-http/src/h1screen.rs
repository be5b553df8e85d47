//! The HTTP/1.1 request screen: follows a downstream connection's bytes from request head to body
//! end to the next head, and refuses a head whose framing two parsers could read differently
//! (RFC 9112 §6.3: `Content-Length` with `Transfer-Encoding`, and the shapes `framing` refuses).
//! No I/O: the server's socket wrapper feeds it bytes.
//!
//! Why it exists: hyper resolves a `Content-Length` + `Transfer-Encoding` conflict itself (it drops
//! the length, reads the chunked body and closes after the response), so the service never sees
//! both headers and cannot answer 400. The screen reads each head with the same parser hyper uses
//! (`httparse`) before hyper does; a head it refuses is altered in place (the `:` of the offending
//! field becomes a space), which makes hyper's own parser reject it with 400 and close the
//! connection, so nothing of that request reaches any front end.

use std::mem::MaybeUninit;

use crate::framing::{check_fields, Framing, FramingError};

/// Field slots kept on the stack when parsing a head (the limit is `server.max_headers`).
const STACK_FIELDS: usize = 128;

/// What [`Screen::head`] made of the bytes at the start of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    /// The head is not complete yet: hold the bytes and read more.
    Partial,
    /// A complete head of this many bytes, passed unchanged.
    Passed(usize),
    /// A complete head of this many bytes, refused: it was altered so the HTTP parser rejects it.
    Refused(usize, FramingError),
    /// Not an HTTP/1 request the screen can follow (HTTP/2 preface, a parse error hyper will answer
    /// itself): the screen is now off for this connection.
    Off,
    /// A head longer than the limit, whole or not: the connection is to be answered 431 and closed
    /// (hyper's own limit cannot be set below 8 KiB, so it is not left to hyper). The screen is
    /// now off for this connection.
    TooLarge,
}

/// Where the screen is in the byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start of a request head.
    Head,
    /// Inside a body of known length: bytes left.
    Length(u64),
    /// Inside a chunked body.
    Chunked(Chunk),
    /// A request that asked to switch protocols has been read, body and all: what follows is
    /// not screened until [`Screen::decided`] says whether the server switched.
    Decide,
    /// Following no more: after a switch of protocols, or anything hyper refuses itself.
    Off,
}

/// Position inside a chunked body (RFC 9112 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading a chunk-size line: the size so far, whether a digit was seen, inside an extension.
    Size { size: u64, digit: bool, ext: bool },
    /// Chunk data: bytes left.
    Data(u64),
    /// The CRLF after chunk data; `cr`: the CR was seen.
    DataEnd { cr: bool },
    /// The trailer section after the last chunk.
    Trailers(Trailer),
}

/// Where the trailer section is, read as hyper reads it: every line ends in CRLF (a bare LF is
/// part of a line), and the section ends at an empty line (CRLF at a line's start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trailer {
    /// At the start of a line.
    LineStart,
    /// A CR at the start of a line: the LF that ends the body must follow.
    EndLf,
    /// Inside a trailer line.
    InLine,
    /// A CR inside a line: its LF must follow.
    LineLf,
}

/// Follows one connection's request stream. See the module docs.
#[derive(Debug)]
pub struct Screen {
    state: State,
    max_head_bytes: usize,
    max_headers: usize,
    /// The request just read asked to switch protocols: wait for the server's answer once its
    /// body ends.
    upgrading: bool,
}

impl Screen {
    /// A screen for a new connection; heads longer than `max_head_bytes` are [`Head::TooLarge`],
    /// heads with more than `max_headers` fields are left to hyper (which refuses them).
    pub fn new(max_head_bytes: usize, max_headers: usize) -> Screen {
        Screen {
            state: State::Head,
            max_head_bytes,
            max_headers: max_headers.max(1),
            upgrading: false,
        }
    }

    /// The next bytes start (or continue) a request head.
    pub fn at_head(&self) -> bool {
        self.state == State::Head
    }

    /// The screen follows nothing more on this connection.
    pub fn is_off(&self) -> bool {
        self.state == State::Off
    }

    /// Turns the screen off (for example: the connection negotiated HTTP/2).
    pub fn turn_off(&mut self) {
        self.state = State::Off;
    }

    /// A request that asked to switch protocols (an `Upgrade` field, or `CONNECT`) has been read
    /// whole: the bytes after it are to be held, unscreened and not passed on, until
    /// [`Screen::decided`].
    pub fn deciding(&self) -> bool {
        self.state == State::Decide
    }

    /// The server answered the request [`Screen::deciding`] waits on: it `switched` protocols
    /// (what follows is not HTTP/1.1: the screen is off), or it did not (the next bytes are a
    /// request head again, screened like any other). Does nothing in any other state.
    pub fn decided(&mut self, switched: bool) {
        if self.state == State::Decide {
            self.state = if switched { State::Off } else { State::Head };
            self.upgrading = false;
        }
    }

    /// Reads the head at the start of `data`, refusing (and altering) it when its framing is
    /// ambiguous. Call only [`Screen::at_head`].
    pub fn head(&mut self, data: &mut [u8]) -> Head {
        debug_assert!(self.at_head());
        // Field slots on the stack for the usual limits: no allocation or fill per request head.
        let mut stack = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; STACK_FIELDS];
        let mut heap = Vec::new();
        let slots = if self.max_headers <= STACK_FIELDS {
            &mut stack[..self.max_headers]
        } else {
            heap.resize_with(self.max_headers, MaybeUninit::uninit);
            &mut heap[..]
        };
        let mut req = httparse::Request::new(&mut []);
        let len = match req.parse_with_uninit_headers(data, slots) {
            Ok(httparse::Status::Complete(n)) if n > self.max_head_bytes => {
                self.state = State::Off;
                return Head::TooLarge;
            }
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if data.len() <= self.max_head_bytes => {
                return Head::Partial
            }
            Ok(httparse::Status::Partial) => {
                self.state = State::Off;
                return Head::TooLarge;
            }
            _ => {
                self.state = State::Off;
                return Head::Off;
            }
        };
        let http11 = req.version == Some(1);
        let base = data.as_ptr() as usize;
        let mut te: Vec<&[u8]> = Vec::new();
        let mut cl: Vec<&[u8]> = Vec::new();
        // Offset of the `:` ending the first framing field of each kind (the byte to alter).
        let (mut te_colon, mut cl_colon) = (None, None);
        let mut upgrade = req.method == Some("CONNECT");
        for f in req.headers.iter() {
            let colon = f.name.as_ptr() as usize - base + f.name.len();
            if f.name.eq_ignore_ascii_case("transfer-encoding") {
                te.push(f.value);
                te_colon.get_or_insert(colon);
            } else if f.name.eq_ignore_ascii_case("content-length") {
                cl.push(f.value);
                cl_colon.get_or_insert(colon);
            } else if f.name.eq_ignore_ascii_case("upgrade") {
                upgrade = true;
            }
        }
        let verdict = check_fields(&te, &cl, http11);
        match verdict {
            Err(e) => {
                // httparse never allows space before the colon, so hyper's parser refuses this
                // head (400) and closes the connection.
                if let Some(at) = te_colon.or(cl_colon) {
                    data[at] = b' ';
                }
                self.state = State::Off;
                Head::Refused(len, e)
            }
            Ok(framing) => {
                self.upgrading = upgrade;
                self.state = match framing {
                    Framing::None => self.after_body(),
                    Framing::Length(n) => State::Length(n),
                    Framing::Chunked => State::Chunked(Chunk::Size {
                        size: 0,
                        digit: false,
                        ext: false,
                    }),
                };
                Head::Passed(len)
            }
        }
    }

    /// Body bytes at the start of `data`: how many belong to the current body (or to a stream the
    /// screen no longer follows). When fewer than `data.len()`, the body ended and the rest starts
    /// the next head.
    pub fn body(&mut self, data: &[u8]) -> usize {
        let mut used = 0;
        while used < data.len() {
            match self.state {
                State::Head | State::Decide => return used,
                State::Off => return data.len(),
                State::Length(left) => {
                    let take = (data.len() - used).min(usize::try_from(left).unwrap_or(usize::MAX));
                    used += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        self.after_body()
                    } else {
                        State::Length(left)
                    };
                }
                State::Chunked(Chunk::Data(left)) => {
                    let take = (data.len() - used).min(usize::try_from(left).unwrap_or(usize::MAX));
                    used += take;
                    let left = left - take as u64;
                    self.state = State::Chunked(if left == 0 {
                        Chunk::DataEnd { cr: false }
                    } else {
                        Chunk::Data(left)
                    });
                }
                State::Chunked(chunk) => {
                    self.state = self.chunk_byte(chunk, data[used]);
                    used += 1;
                }
            }
        }
        used
    }

    /// Where a finished body leads: the next head, or the server's answer after an upgrade
    /// request.
    fn after_body(&self) -> State {
        if self.upgrading {
            State::Decide
        } else {
            State::Head
        }
    }

    /// One byte of chunked framing (not chunk data). A byte hyper's decoder would refuse turns the
    /// screen off: hyper ends the connection itself.
    fn chunk_byte(&self, chunk: Chunk, b: u8) -> State {
        let next = match chunk {
            Chunk::Size { size, digit, ext } => match b {
                b'\n' if digit && size == 0 => Chunk::Trailers(Trailer::LineStart),
                b'\n' if digit => Chunk::Data(size),
                b'\r' | b' ' | b'\t' => Chunk::Size {
                    size,
                    digit,
                    ext: ext || digit,
                },
                b';' => Chunk::Size {
                    size,
                    digit,
                    ext: true,
                },
                _ if ext => chunk,
                _ => match (b as char).to_digit(16) {
                    Some(d) => match size.checked_mul(16) {
                        Some(s) => Chunk::Size {
                            size: s + u64::from(d),
                            digit: true,
                            ext: false,
                        },
                        None => return State::Off,
                    },
                    None => return State::Off,
                },
            },
            Chunk::DataEnd { cr: false } if b == b'\r' => Chunk::DataEnd { cr: true },
            Chunk::DataEnd { .. } if b == b'\n' => Chunk::Size {
                size: 0,
                digit: false,
                ext: false,
            },
            Chunk::DataEnd { .. } => return State::Off,
            Chunk::Trailers(at) => Chunk::Trailers(match (at, b) {
                (Trailer::LineStart, b'\r') => Trailer::EndLf,
                (Trailer::EndLf, b'\n') => return self.after_body(),
                (Trailer::InLine, b'\r') => Trailer::LineLf,
                (Trailer::InLine | Trailer::LineStart, _) => Trailer::InLine,
                (Trailer::LineLf, b'\n') => Trailer::LineStart,
                // hyper refuses a CR without its LF, and ends the connection itself.
                (Trailer::EndLf | Trailer::LineLf, _) => return State::Off,
            }),
            Chunk::Data(_) => unreachable!("chunk data is consumed in bulk"),
        };
        State::Chunked(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn screen() -> Screen {
        Screen::new(8192, 100)
    }

    /// Runs a whole byte stream through the screen the way the socket wrapper does (in one piece)
    /// and returns the verdict of every head plus the bytes as altered.
    fn run(s: &mut Screen, input: &[u8]) -> (Vec<Head>, Vec<u8>) {
        let mut data = input.to_vec();
        let mut at = 0;
        let mut heads = Vec::new();
        while at < data.len() {
            if s.at_head() {
                let h = s.head(&mut data[at..]);
                heads.push(h.clone());
                match h {
                    Head::Passed(n) => at += n,
                    Head::Refused(n, _) => at += n,
                    Head::Partial | Head::Off | Head::TooLarge => break,
                }
            } else {
                at += s.body(&data[at..]);
                if s.is_off() || s.deciding() {
                    break;
                }
            }
        }
        (heads, data)
    }

    #[test]
    fn follows_keep_alive_requests_with_every_body_framing() {
        let mut s = screen();
        let input = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n\
            POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
            POST /y HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
            5;ext=1\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n\
            GET /z HTTP/1.1\r\nHost: a\r\n\r\n";
        let (heads, data) = run(&mut s, input);
        assert_eq!(heads.len(), 4, "{heads:?}");
        assert!(heads.iter().all(|h| matches!(h, Head::Passed(_))));
        assert_eq!(data, input.to_vec());
        assert!(s.at_head());
    }

    #[test]
    fn length_and_chunked_is_refused_in_either_order() {
        for head in [
            &b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            &b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"[..],
        ] {
            let mut s = screen();
            let mut data = head.to_vec();
            let h = s.head(&mut data);
            assert_eq!(h, Head::Refused(head.len(), FramingError::LengthAndChunked));
            let text = String::from_utf8(data).unwrap();
            assert!(text.contains("Transfer-Encoding  chunked\r\n"), "{text}");
            // The altered head no longer parses: hyper answers 400.
            let mut f = [httparse::EMPTY_HEADER; 16];
            assert!(httparse::Request::new(&mut f).parse(text.as_bytes()).is_err());
            assert!(s.is_off());
        }
    }

    #[test]
    fn other_smuggling_shapes_are_refused() {
        let cases: &[&[u8]] = &[
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        ];
        for case in cases {
            let mut data = case.to_vec();
            let h = screen().head(&mut data);
            assert!(matches!(h, Head::Refused(..)), "{h:?}");
            let mut f = [httparse::EMPTY_HEADER; 16];
            assert!(httparse::Request::new(&mut f).parse(&data).is_err());
        }
    }

    #[test]
    fn a_smuggled_request_inside_a_body_is_not_read_as_a_head() {
        // The body of a correct request may look like a request: it is body, not a head.
        let inner =
            b"GET /admin HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let mut input =
            format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", inner.len()).into_bytes();
        input.extend_from_slice(inner);
        let (heads, data) = run(&mut screen(), &input);
        assert_eq!(heads.len(), 1);
        assert_eq!(data, input);
    }

    #[test]
    fn partial_heads_wait_and_oversize_heads_are_too_large() {
        let mut s = screen();
        assert_eq!(s.head(&mut b"GET / HTTP/1.1\r\nHo".to_vec()), Head::Partial);
        // Past the limit before its end...
        let mut s = Screen::new(32, 100);
        let mut long = b"GET / HTTP/1.1\r\nX-Long: ".to_vec();
        long.extend(std::iter::repeat_n(b'a', 64));
        assert_eq!(s.head(&mut long), Head::TooLarge);
        assert!(s.is_off());
        // ...or whole in one piece, one byte over; at the limit it passes.
        let head = |len: usize| {
            let mut h = b"GET / HTTP/1.1\r\nX: ".to_vec();
            h.resize(len - 4, b'a');
            h.extend_from_slice(b"\r\n\r\n");
            h
        };
        let mut s = Screen::new(64, 100);
        assert_eq!(s.head(&mut head(65)), Head::TooLarge);
        assert!(s.is_off());
        let mut s = Screen::new(64, 100);
        assert_eq!(s.head(&mut head(64)), Head::Passed(64));
    }

    #[test]
    fn http2_preface_and_upgrades_turn_it_off() {
        let mut s = screen();
        let (heads, _) = run(&mut s, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        assert_eq!(heads, vec![Head::Off]);
        // An upgrade request (with a body, or a CONNECT) waits for the server's answer; a switch
        // turns the screen off.
        for upgrade in [
            &b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"[..],
            b"POST /ws HTTP/1.1\r\nUpgrade: x\r\nContent-Length: 2\r\n\r\nhi",
            b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
        ] {
            let mut s = screen();
            let mut input = upgrade.to_vec();
            input.extend_from_slice(b"\x81\x05hello");
            let (heads, _) = run(&mut s, &input);
            assert!(matches!(heads[..], [Head::Passed(_)]));
            assert!(s.deciding() && !s.at_head() && !s.is_off());
            // Nothing after it is taken as its body.
            assert_eq!(s.body(b"\x81\x05hello"), 0);
            s.decided(true);
            assert!(s.is_off());
        }
    }

    /// An upgrade the server does not take leaves an HTTP/1.1 connection: the screen goes on
    /// with the next head (a client cannot turn it off by asking for an upgrade).
    #[test]
    fn an_upgrade_not_taken_screens_the_next_head() {
        let mut s = screen();
        let (heads, _) = run(
            &mut s,
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n",
        );
        assert!(matches!(heads[..], [Head::Passed(_)]) && s.deciding());
        s.decided(false);
        assert!(s.at_head());
        let (heads, _) = run(
            &mut s,
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        assert!(matches!(heads[..], [Head::Refused(..)]), "{heads:?}");
        // Told again, or told in another state, it changes nothing.
        s.decided(true);
        assert!(s.is_off());
        let mut s = screen();
        s.decided(true);
        assert!(s.at_head());
    }

    #[test]
    fn bad_chunk_framing_turns_it_off() {
        let mut s = screen();
        let (_, _) = run(
            &mut s,
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        );
        assert!(s.is_off());
    }

    /// The trailer section ends where hyper's decoder ends it, at an empty CRLF line: a bare LF
    /// is part of a trailer line, so a head hidden behind one is trailer bytes to both, and the
    /// head after the real end is screened (it was read as the end, and the head hidden there
    /// took the next request as its body, unscreened).
    #[test]
    fn trailers_end_where_hyper_ends_them() {
        let mut s = screen();
        let input = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\n\
            GET /x HTTP/1.1\r\nContent-Length: 80\r\n\r\n\
            POST /s HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n";
        let (heads, _) = run(&mut s, input);
        assert_eq!(heads.len(), 2, "{heads:?}");
        assert!(matches!(heads[0], Head::Passed(_)));
        assert!(matches!(heads[1], Head::Refused(..)), "{heads:?}");
        // Trailer fields, and a CR without its LF (hyper refuses it and closes: screen off).
        let mut s = screen();
        let (heads, _) = run(
            &mut s,
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: 1\r\nY: 2\r\n\r\n\
              GET / HTTP/1.1\r\n\r\n",
        );
        assert_eq!(heads.len(), 2, "{heads:?}");
        assert!(s.at_head());
        for bad in [&b"0\r\n\rX"[..], b"0\r\nX-T: 1\rX"] {
            let mut s = screen();
            let mut input = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            input.extend_from_slice(bad);
            run(&mut s, &input);
            assert!(s.is_off(), "{bad:?}");
        }
    }

    #[test]
    fn bytes_split_anywhere_give_the_same_verdicts() {
        let input = b"POST /y HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
            5\r\nhello\r\n0\r\n\r\n\
            POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n";
        for split in 1..input.len() {
            // Feed the first `split` bytes, then the rest, holding an incomplete head like the
            // socket wrapper does.
            let mut s = screen();
            let mut held: Vec<u8> = Vec::new();
            let mut verdicts = Vec::new();
            for piece in [&input[..split], &input[split..]] {
                held.extend_from_slice(piece);
                loop {
                    if held.is_empty() || s.is_off() {
                        break;
                    }
                    if s.at_head() {
                        match s.head(&mut held) {
                            Head::Partial => break,
                            Head::Passed(n) | Head::Refused(n, _) => {
                                verdicts.push(s.is_off());
                                held.drain(..n);
                            }
                            Head::Off | Head::TooLarge => break,
                        }
                    } else {
                        let n = s.body(&held);
                        held.drain(..n);
                    }
                }
            }
            assert_eq!(verdicts, vec![false, true], "split at {split}");
        }
    }
}
