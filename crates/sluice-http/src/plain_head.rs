//! HTTP/1.1 response heads a proxy may pass on almost as they came: parsed once and written out
//! field by field (names in lower case, this hop's `Connection: keep-alive` left out), for an
//! HTTP/1.1 client as text or for an HTTP/2 one as HPACK field lines, instead of being built into
//! a field map, edited and encoded again. A head this cannot vouch for gives `None`, and the
//! caller takes the general path ([`crate::response_head`]). No I/O.

use http::StatusCode;

use crate::response_head::{decimal, BodyLength, MAX_FIELDS};

/// A head [`write_plain`] passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainHead {
    pub status: StatusCode,
    /// Bytes the head took, blank line included; what follows is body.
    pub len: usize,
    /// `Exact` from its one `Content-Length`, or `Empty` for the answer to HEAD.
    pub length: BodyLength,
    /// Its `Connection` field names `close`: the server closes after this response.
    pub close: bool,
    /// It has a `Date` field.
    pub has_date: bool,
    /// It has an `Alt-Svc` field.
    pub has_alt_svc: bool,
}

/// Parses the complete response head at the start of `buf` and, when it is plain, appends its
/// status line and fields to `out` (no blank line: the caller adds its own fields first).
///
/// Plain: HTTP/1.1, a final status other than 101, 204 and 304, exactly one `Content-Length` of
/// plain digits, no `Transfer-Encoding`, no hop-by-hop field but `Connection` (listing only
/// `keep-alive` or `close`) and `Keep-Alive` (both left out), no `Via` when `via` is set (the
/// caller's own is then appended, not merged), at most one `Date` and one `Alt-Svc` (the HPACK form
/// hands the latter to the caller as one value), a length without leading zeros, and field values
/// without control characters.
/// Anything else (including an incomplete or malformed head) is `None`, with `out` as it was.
/// The fields keep their order; a field map would group the values of a repeated name.
pub fn write_plain(
    buf: &[u8],
    head_request: bool,
    via: bool,
    out: &mut Vec<u8>,
) -> Option<PlainHead> {
    plain(buf, head_request, via, Form::H1, out).map(|(p, _)| p.head)
}

/// A head [`write_plain_hpack`] passed on, with the one field it left to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainHpack<'b> {
    pub head: PlainHead,
    /// Its `Alt-Svc` value, when it has one.
    pub alt_svc: Option<&'b [u8]>,
}

/// [`write_plain`] for an HTTP/2 response: the same test of plainness, but each field passed on is
/// appended to `out` as an HPACK field line (RFC 7541: a literal without indexing, with the static
/// table's name index where the name has one, names in lower case, nothing Huffman-coded), ready
/// to follow the status in a header block, and no status line.
///
/// `Alt-Svc` is not written but returned, for the response's field map, where the listener looks
/// for it before adding its own. A head without `Date` (`head.has_date` false) needs one appended
/// by the caller, as an HTTP/2 server adds one. A value that begins or ends
/// with a space or tab, which HTTP/2 forbids (RFC 9113 section 8.2.1), makes the head not plain
/// (httparse trims them; this holds whatever the parser does).
pub fn write_plain_hpack<'b>(
    buf: &'b [u8],
    head_request: bool,
    via: bool,
    out: &mut Vec<u8>,
) -> Option<PlainHpack<'b>> {
    plain(buf, head_request, via, Form::Hpack, out).map(|(p, _)| p)
}

/// How [`plain`] writes what it passes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// An HTTP/1.1 status line and `name: value` lines.
    H1,
    /// HPACK field lines, without the `Alt-Svc` [`PlainHpack`] returns.
    Hpack,
}

/// Where a passed-on head's one `Date` value lies: `len` bytes at `input` in the head as it came
/// and at `output` in what was written for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DateAt {
    input: usize,
    output: usize,
    len: usize,
}

/// Both writers: parses the head at the start of `buf`, decides whether it is plain and writes
/// what is passed on in `form` (and says where its `Date` value went, for [`Memo`]).
fn plain<'b>(
    buf: &'b [u8],
    head_request: bool,
    via: bool,
    form: Form,
    out: &mut Vec<u8>,
) -> Option<(PlainHpack<'b>, Option<DateAt>)> {
    let mut fields =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut resp = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return None,
    };
    if resp.version != Some(1) {
        return None;
    }
    let status = StatusCode::from_u16(resp.code?).ok()?;
    let code = status.as_u16();
    if status.is_informational() || code == 204 || code == 304 {
        return None;
    }
    let start = out.len();
    // Room for the head and the few fields the caller appends: no allocation before the head is
    // known complete and final, and none again while it is written.
    out.reserve(len + 128);
    if form == Form::H1 {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let mut length = None;
    let mut close = false;
    let (mut has_date, mut alt_svc, mut date_at) = (false, None, None);
    let mut plain = true;
    // httparse has refused any control character in a value but the tab (and any name that is
    // not a token), so a value needs no scan of its own here.
    for f in resp.headers.iter() {
        let name = f.name.as_bytes();
        let value = f.value;
        // Lowered once, for the look-ups and the writing both.
        let lower = Lower::of(name);
        let kind = lower
            .as_ref()
            .map_or(Name::Other, |l| Name::of(l.as_bytes()));
        match kind {
            Name::Other => {}
            Name::ContentLength => {
                if length.is_some() {
                    plain = false;
                    break;
                }
                match decimal(value) {
                    // Leading zeros are left to the map path, which writes the number anew.
                    Some(n) if value.len() == 1 || value[0] != b'0' => length = Some(n),
                    _ => {
                        plain = false;
                        break;
                    }
                }
            }
            Name::Connection => {
                match connection_tokens(value) {
                    Some(closes) => close |= closes,
                    None => {
                        plain = false;
                        break;
                    }
                }
                continue;
            }
            Name::KeepAlive => continue,
            Name::OtherHop => {
                plain = false;
                break;
            }
            Name::Via if via => {
                plain = false;
                break;
            }
            Name::Via => {}
            // A second `Date` is left to the map path, as it always was; a second `Alt-Svc` (a
            // list field) too, since the HPACK form hands that one to the caller as one value.
            Name::Date => {
                if std::mem::replace(&mut has_date, true) {
                    plain = false;
                    break;
                }
            }
            Name::AltSvc => {
                if alt_svc.replace(value).is_some() {
                    plain = false;
                    break;
                }
            }
        }
        match form {
            Form::H1 => {
                match &lower {
                    Some(l) => out.extend_from_slice(l.as_bytes()),
                    None => push_lower(out, name),
                }
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
            }
            Form::Hpack => {
                if matches!(value.first().zip(value.last()), Some((a, z)) if is_blank(*a) || is_blank(*z))
                {
                    plain = false;
                    break;
                }
                if !matches!(kind, Name::AltSvc) {
                    hpack_field_lowered(out, name, lower.as_ref(), value);
                }
            }
        }
        // Either form wrote the value last (httparse's value is a slice of `buf`).
        if matches!(kind, Name::Date) {
            date_at = Some(DateAt {
                input: value.as_ptr() as usize - buf.as_ptr() as usize,
                output: out.len() - start - value.len(),
                len: value.len(),
            });
        }
        if form == Form::H1 {
            out.extend_from_slice(b"\r\n");
        }
    }
    let length = match length {
        Some(n) if plain => n,
        _ => {
            out.truncate(start);
            return None;
        }
    };
    let head = PlainHead {
        status,
        len,
        length: if head_request {
            BodyLength::Empty
        } else {
            BodyLength::Exact(length)
        },
        close,
        has_date,
        has_alt_svc: alt_svc.is_some(),
    };
    Some((PlainHpack { head, alt_svc }, date_at))
}

/// The last plain head passed on over one upstream connection, kept so that the next one with the
/// same bytes but for its `Date` value (an origin answering the same resource again) is passed on
/// by a comparison and a copy instead of a parse: what it writes and returns is exactly what
/// [`write_plain`] or [`write_plain_hpack`] would for that head. Heads over [`Memo::MAX`] bytes
/// are not kept.
#[derive(Debug, Default)]
pub struct Memo {
    kept: Option<Kept>,
    /// The head as it came.
    input: Vec<u8>,
    /// What was written for it.
    output: Vec<u8>,
    /// Heads answered from the memo.
    #[cfg(test)]
    hits: usize,
}

/// What a [`Memo`] holds besides the bytes: the call it answered and what that returned.
#[derive(Debug, Clone, Copy)]
struct Kept {
    form: Form,
    head_request: bool,
    via: bool,
    head: PlainHead,
    date: Option<DateAt>,
    /// Where its `Alt-Svc` value lies in the head (the HPACK form returns it).
    alt_svc: Option<(usize, usize)>,
}

impl Memo {
    /// The longest head kept, in bytes (a memo holds about twice this: the head and what was
    /// written for it).
    pub const MAX: usize = 2048;

    /// [`write_plain`], answered from the memo when it can be.
    pub fn write_plain(
        &mut self,
        buf: &[u8],
        head_request: bool,
        via: bool,
        out: &mut Vec<u8>,
    ) -> Option<PlainHead> {
        self.pass(buf, head_request, via, Form::H1, out)
            .map(|p| p.head)
    }

    /// [`write_plain_hpack`], answered from the memo when it can be.
    pub fn write_plain_hpack<'b>(
        &mut self,
        buf: &'b [u8],
        head_request: bool,
        via: bool,
        out: &mut Vec<u8>,
    ) -> Option<PlainHpack<'b>> {
        self.pass(buf, head_request, via, Form::Hpack, out)
    }

    /// Both writers: the kept answer when there is one for `buf`, else the parsing writer's,
    /// kept for the next head when it is plain and not over [`Memo::MAX`].
    fn pass<'b>(
        &mut self,
        buf: &'b [u8],
        head_request: bool,
        via: bool,
        form: Form,
        out: &mut Vec<u8>,
    ) -> Option<PlainHpack<'b>> {
        if let Some(p) = self.recall(buf, head_request, via, form, out) {
            return Some(p);
        }
        let start = out.len();
        let (p, date) = plain(buf, head_request, via, form, out)?;
        self.input.clear();
        self.output.clear();
        self.kept = None;
        if p.head.len <= Memo::MAX {
            self.input.extend_from_slice(&buf[..p.head.len]);
            self.output.extend_from_slice(&out[start..]);
            let base = buf.as_ptr() as usize;
            self.kept = Some(Kept {
                form,
                head_request,
                via,
                head: p.head,
                date,
                alt_svc: p.alt_svc.map(|v| (v.as_ptr() as usize - base, v.len())),
            });
        }
        Some(p)
    }

    /// The kept answer when `buf` starts with the kept head, byte for byte but for a `Date` value
    /// of the same length that the parser would take as it is (visible characters and spaces,
    /// none at either end).
    fn recall<'b>(
        &mut self,
        buf: &'b [u8],
        head_request: bool,
        via: bool,
        form: Form,
        out: &mut Vec<u8>,
    ) -> Option<PlainHpack<'b>> {
        let kept = self.kept.as_ref()?;
        if (kept.form, kept.head_request, kept.via) != (form, head_request, via) {
            return None;
        }
        let head = buf.get(..self.input.len())?;
        let date = match kept.date {
            None => {
                if head != self.input.as_slice() {
                    return None;
                }
                None
            }
            Some(d) => {
                let end = d.input + d.len;
                if head[..d.input] != self.input[..d.input] || head[end..] != self.input[end..] {
                    return None;
                }
                let value = &head[d.input..end];
                if value == &self.input[d.input..end] {
                    None
                } else if plain_value(value) {
                    Some((d.output, value))
                } else {
                    return None;
                }
            }
        };
        // As the parsing writers do: room for the head and the few fields the caller appends.
        out.reserve(self.output.len() + 128);
        let at = out.len();
        out.extend_from_slice(&self.output);
        if let Some((output, value)) = date {
            out[at + output..at + output + value.len()].copy_from_slice(value);
        }
        #[cfg(test)]
        {
            self.hits += 1;
        }
        Some(PlainHpack {
            head: kept.head,
            alt_svc: kept.alt_svc.map(|(a, n)| &buf[a..a + n]),
        })
    }
}

/// A field value the parser takes as it is and both forms pass on: visible ASCII and spaces, with
/// neither end a space.
fn plain_value(v: &[u8]) -> bool {
    matches!(v.first().zip(v.last()), Some((a, z)) if *a != b' ' && *z != b' ')
        && v.iter().all(|&c| c == b' ' || c.is_ascii_graphic())
}

/// Appends `name` in lower case (copied whole, then lowered in place: not byte by byte).
fn push_lower(out: &mut Vec<u8>, name: &[u8]) {
    let at = out.len();
    out.extend_from_slice(name);
    out[at..].make_ascii_lowercase();
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Appends one HPACK field line for `name` (any case; written in lower case) and `value`: a
/// literal without indexing (RFC 7541 section 6.2.2), with the static table's index for the name
/// when it has one, else the name as a literal; neither string Huffman-coded.
pub fn hpack_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    hpack_field_lowered(out, name, Lower::of(name).as_ref(), value);
}

/// [`hpack_field`] with `name` already lowered (`lower`: `None` for a name too long to have been).
fn hpack_field_lowered(out: &mut Vec<u8>, name: &[u8], lower: Option<&Lower>, value: &[u8]) {
    match lower.and_then(|l| static_index(l.as_bytes())) {
        Some(index) => hpack_int(out, 4, index),
        None => {
            out.push(0x00);
            hpack_int(out, 7, name.len());
            match lower {
                Some(l) => out.extend_from_slice(l.as_bytes()),
                None => push_lower(out, name),
            }
        }
    }
    hpack_int(out, 7, value.len());
    out.extend_from_slice(value);
}

/// A field name in lower case, for a name of up to [`Lower::MAX`] bytes: every name this module
/// looks up is shorter (a longer one is lowered where it is written).
struct Lower {
    buf: [u8; Lower::MAX],
    len: usize,
}

impl Lower {
    const MAX: usize = 32;

    fn of(name: &[u8]) -> Option<Lower> {
        let mut buf = [0u8; Lower::MAX];
        buf.get_mut(..name.len())?.copy_from_slice(name);
        // A word at a time: the byte-by-byte loop was most of the cost of writing a field.
        for word in buf.chunks_exact_mut(8) {
            let w = u64::from_ne_bytes(word.try_into().expect("eight bytes"));
            word.copy_from_slice(&lower8(w).to_ne_bytes());
        }
        Some(Lower {
            buf,
            len: name.len(),
        })
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Eight bytes in ASCII lower case at once: each byte `A`-`Z` gains its 0x20 bit, every other
/// byte (0x80 and above included) stays as it is.
fn lower8(x: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Each byte's low seven bits plus at most 0x3f stays below 0x100: no carry between bytes.
    let b = x & LOW7;
    let from_a = b + 0x3f3f_3f3f_3f3f_3f3f; // high bit set where the byte is 0x41 (`A`) or more
    let past_z = b + 0x2525_2525_2525_2525; // high bit set where it is 0x5b (past `Z`) or more
    let upper = from_a & !past_z & !x & HIGH;
    x | (upper >> 2)
}

/// An HPACK integer (RFC 7541 section 5.1) in a `prefix`-bit prefix, the byte's other bits zero
/// (every form written here: a literal without indexing, a string without Huffman coding).
#[inline]
fn hpack_int(out: &mut Vec<u8>, prefix: u32, mut n: usize) {
    let max = (1usize << prefix) - 1;
    if n < max {
        out.push(n as u8);
        return;
    }
    out.push(max as u8);
    n -= max;
    while n >= 0x80 {
        out.push(0x80 | (n & 0x7f) as u8);
        n >>= 7;
    }
    out.push(n as u8);
}

/// The first index of `name` (any case) in HPACK's static table (RFC 7541 Appendix A), for the
/// regular field names it has.
#[cfg(test)]
fn static_name_index(name: &[u8]) -> Option<usize> {
    static_index(Lower::of(name)?.as_bytes())
}

/// [`static_name_index`] of a name in lower case.
fn static_index(lower: &[u8]) -> Option<usize> {
    // By length first: a few comparisons at most.
    let index = match lower.len() {
        3 => match lower {
            b"age" => 21,
            b"via" => 60,
            _ => return None,
        },
        4 => match lower {
            b"date" => 33,
            b"etag" => 34,
            b"from" => 37,
            b"host" => 38,
            b"link" => 45,
            b"vary" => 59,
            _ => return None,
        },
        5 => match lower {
            b"allow" => 22,
            b"range" => 50,
            _ => return None,
        },
        6 => match lower {
            b"accept" => 19,
            b"cookie" => 32,
            b"expect" => 35,
            b"server" => 54,
            _ => return None,
        },
        7 => match lower {
            b"expires" => 36,
            b"referer" => 51,
            b"refresh" => 52,
            _ => return None,
        },
        8 => match lower {
            b"if-match" => 39,
            b"if-range" => 42,
            b"location" => 46,
            _ => return None,
        },
        10 => match lower {
            b"set-cookie" => 55,
            b"user-agent" => 58,
            _ => return None,
        },
        11 => match lower {
            b"retry-after" => 53,
            _ => return None,
        },
        12 => match lower {
            b"content-type" => 31,
            b"max-forwards" => 47,
            _ => return None,
        },
        13 => match lower {
            b"accept-ranges" => 18,
            b"authorization" => 23,
            b"cache-control" => 24,
            b"content-range" => 30,
            b"if-none-match" => 41,
            b"last-modified" => 44,
            _ => return None,
        },
        14 => match lower {
            b"accept-charset" => 15,
            b"content-length" => 28,
            _ => return None,
        },
        15 => match lower {
            b"accept-encoding" => 16,
            b"accept-language" => 17,
            _ => return None,
        },
        16 => match lower {
            b"content-encoding" => 26,
            b"content-language" => 27,
            b"content-location" => 29,
            b"www-authenticate" => 61,
            _ => return None,
        },
        17 => match lower {
            b"if-modified-since" => 40,
            b"transfer-encoding" => 57,
            _ => return None,
        },
        18 => match lower {
            b"proxy-authenticate" => 48,
            _ => return None,
        },
        19 => match lower {
            b"content-disposition" => 25,
            b"if-unmodified-since" => 43,
            b"proxy-authorization" => 49,
            _ => return None,
        },
        25 => match lower {
            b"strict-transport-security" => 56,
            _ => return None,
        },
        27 => match lower {
            b"access-control-allow-origin" => 20,
            _ => return None,
        },
        _ => return None,
    };
    Some(index)
}

/// The field names this path treats apart from the rest.
enum Name {
    ContentLength,
    Connection,
    KeepAlive,
    /// Hop-by-hop names other than `Connection` and `Keep-Alive`, and `Transfer-Encoding`.
    OtherHop,
    Via,
    Date,
    AltSvc,
    Other,
}

impl Name {
    /// Of a name in lower case.
    fn of(lower: &[u8]) -> Name {
        match lower {
            b"te" | b"upgrade" | b"trailer" => Name::OtherHop,
            b"via" => Name::Via,
            b"date" => Name::Date,
            b"alt-svc" => Name::AltSvc,
            b"connection" => Name::Connection,
            b"keep-alive" => Name::KeepAlive,
            b"content-length" => Name::ContentLength,
            b"proxy-connection" | b"transfer-encoding" => Name::OtherHop,
            b"proxy-authenticate" | b"proxy-authorization" => Name::OtherHop,
            _ => Name::Other,
        }
    }
}

/// A `Connection` value that lists only `keep-alive` and `close` (empty elements allowed):
/// whether it lists `close`. `None` when it names any other field, which would have to go too.
fn connection_tokens(value: &[u8]) -> Option<bool> {
    let mut close = false;
    for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
        if token.eq_ignore_ascii_case(b"close") {
            close = true;
        } else if !(token.is_empty() || token.eq_ignore_ascii_case(b"keep-alive")) {
            return None;
        }
    }
    Some(close)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response_head;

    fn plain(text: &str, via: bool) -> Option<(PlainHead, String)> {
        let mut out = b"x".to_vec();
        let r = write_plain(text.as_bytes(), false, via, &mut out);
        if r.is_none() {
            assert_eq!(out, b"x", "a head that is not plain leaves `out` alone");
        }
        r.map(|h| (h, String::from_utf8(out[1..].to_vec()).unwrap()))
    }

    #[test]
    fn an_origins_usual_head_is_passed_on_without_this_hops_fields() {
        let raw = "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Thu, 03 Dec 2026 06:00:00 GMT\r\n\
                   Content-Type: application/octet-stream\r\nContent-Length: 1024\r\n\
                   Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nETag: \"a-1\"\r\n\r\nBODY";
        let (h, out) = plain(raw, true).unwrap();
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nserver: nginx\r\ndate: Thu, 03 Dec 2026 06:00:00 GMT\r\n\
             content-type: application/octet-stream\r\ncontent-length: 1024\r\netag: \"a-1\"\r\n"
        );
        assert_eq!(h.len, raw.len() - 4);
        assert_eq!(h.length, BodyLength::Exact(1024));
        assert!(h.has_date && !h.has_alt_svc && !h.close);
        // The same head through the general parser: the same status, length and framing.
        let g = response_head::parse(raw.as_bytes()).unwrap().unwrap();
        assert_eq!((g.status, g.len), (h.status, h.len));
        assert_eq!(g.body_length(false), Ok(h.length));
        let mut out = Vec::new();
        let head = write_plain(raw.as_bytes(), true, false, &mut out).unwrap();
        assert_eq!(
            head.length,
            BodyLength::Empty,
            "the answer to HEAD has no body"
        );
    }

    #[test]
    fn close_is_noted_and_the_reason_is_the_canonical_one() {
        let (h, out) = plain(
            "HTTP/1.1 404 Nope\r\nconnection: Keep-Alive, close\r\ncontent-length: 0\r\n\r\n",
            true,
        )
        .unwrap();
        assert!(h.close);
        assert_eq!(out, "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n");
    }

    #[test]
    fn anything_else_takes_the_general_path() {
        for raw in [
            // Incomplete, malformed, another version, no or unusual framing.
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n",
            "HTTP/1.1 200 OK\r\nContent Length: 1\r\n\r\n",
            "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n",
            "HTTP/1.1 200 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            // Interim and bodiless statuses.
            "HTTP/1.1 100 Continue\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
            // Hop-by-hop fields to strip, and a Connection naming another field.
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: x-secret\r\nX-Secret: 1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nUpgrade: h2c\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTrailer: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTE: trailers\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nProxy-Connection: close\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nProxy-Authenticate: Basic\r\n\r\n",
            // A Via to merge with this hop's.
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nVia: 1.1 cdn\r\n\r\n",
            // A control character in a value.
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX-A: a\x7fb\r\n\r\n",
        ] {
            assert!(plain(raw, true).is_none(), "{raw:?}");
        }
        // Without this hop's Via, an upstream's is passed on as it is.
        let (_, out) = plain(
            "HTTP/1.1 200 OK\r\nVia: 1.1 cdn\r\nContent-Length: 1\r\nAlt-Svc: clear\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nvia: 1.1 cdn\r\ncontent-length: 1\r\nalt-svc: clear\r\n"
        );
    }

    /// The fields the property below draws from: the names this path treats apart, in any
    /// case, with good and bad values, and ordinary ones.
    const FIELDS: &[(&str, &[&str])] = &[
        (
            "Content-Length",
            &[
                "5",
                "0",
                " 5",
                "5, 5",
                "+5",
                "05",
                "x",
                "99999999999999999999",
            ],
        ),
        ("Transfer-Encoding", &["chunked", "gzip"]),
        (
            "Connection",
            &[
                "keep-alive",
                "close",
                "Keep-Alive, close",
                "x-a",
                ",",
                "upgrade",
            ],
        ),
        ("Keep-Alive", &["timeout=5"]),
        ("TE", &["trailers"]),
        ("Trailer", &["x-t"]),
        ("Upgrade", &["h2c"]),
        ("Proxy-Connection", &["close"]),
        ("Via", &["1.1 cdn"]),
        ("Date", &["Thu, 03 Dec 2026 06:00:00 GMT"]),
        ("Alt-Svc", &["clear"]),
        ("X-A", &["a", "", "a\tb", "caf\u{e9}", "a\x01b", "a\x7fb"]),
        ("Set-Cookie", &["k=v"]),
    ];

    proptest::proptest! {
        /// Whatever head it passes on, the general parser reads the same status, head length and
        /// body length from it, and what it wrote parses again to the fields the general path
        /// keeps: every field but this hop's, values as they were.
        #[test]
        fn agrees_with_the_general_parser(
            code in proptest::sample::select(vec![100u16, 101, 200, 200, 204, 206, 304, 404, 503]),
            minor in proptest::sample::select(vec![0u8, 1, 1, 1]),
            // Ordinary fields (and Connection, Keep-Alive) drawn more often than the rest.
            picks in proptest::collection::vec(
                (
                    proptest::sample::select(vec![0usize, 1, 2, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9, 9, 10, 11, 11, 11, 12, 12]),
                    0usize..8,
                    proptest::bool::ANY,
                ),
                0..8,
            ),
            head_request in proptest::bool::ANY,
            via in proptest::bool::ANY,
            length_at in proptest::option::of(0usize..10),
            plainish in proptest::bool::ANY,
        ) {
            // Half the heads are near-plain: a final status, one length, and only fields this
            // path may pass on or leave out (some values still bad).
            let (code, minor) = if plainish { (200 + code % 7, 1) } else { (code, minor) };
            let length_at = if plainish { Some(length_at.unwrap_or(0) % (picks.len() + 1)) } else { length_at };
            let mut raw = format!("HTTP/1.{minor} {code} Whatever\r\n");
            for (i, (f, v, upper)) in picks.iter().enumerate() {
                // Most plain heads have their one length among other fields.
                if length_at == Some(i) {
                    raw.push_str("Content-Length: 7\r\n");
                }
                let (f, v) = if plainish {
                    ([2, 3, 9, 10, 11, 12][f % 6], if *f % 6 == 0 { v % 2 } else { *v })
                } else {
                    (*f, *v)
                };
                let (name, values) = FIELDS[f];
                let name = if *upper { name.to_ascii_uppercase() } else { name.to_ascii_lowercase() };
                raw.push_str(&format!("{name}: {}\r\n", values[v % values.len()]));
            }
            if length_at == Some(picks.len()) {
                raw.push_str("Content-Length: 7\r\n");
            }
            raw.push_str("\r\n");
            let mut out = Vec::new();
            let mut hpack = Vec::new();
            let h2 = write_plain_hpack(raw.as_bytes(), head_request, via, &mut hpack);
            let Some(plain) = write_plain(raw.as_bytes(), head_request, via, &mut out) else {
                proptest::prop_assert!(out.is_empty());
                proptest::prop_assert!(h2.is_none() && hpack.is_empty());
                return Ok(());
            };
            // The HPACK form passes on the same heads, and the same fields but the `Alt-Svc` it
            // leaves to the caller's map.
            proptest::prop_assert!(h2.is_some());
            if let Some(h2) = h2 {
                proptest::prop_assert_eq!(h2.head, plain);
                let g = response_head::parse(raw.as_bytes()).unwrap().unwrap();
                let want: Vec<(String, Vec<u8>)> = g.headers.iter()
                    .filter(|(n, _)| !matches!(n.as_str(), "alt-svc" | "connection" | "keep-alive"))
                    .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
                    .collect();
                let got = decode(&hpack);
                // The length goes out as the number the map path would write.
                if let BodyLength::Exact(n) = plain.length {
                    let lengths: Vec<_> = got.iter().filter(|(k, _)| k == "content-length")
                        .map(|(_, v)| v.clone()).collect();
                    proptest::prop_assert_eq!(lengths, vec![n.to_string().into_bytes()]);
                }
                // Every name's values in the origin's order (the map groups names, the lines
                // keep the origin's order across names).
                let by_name = |v: &[(String, Vec<u8>)], n: &str| -> Vec<Vec<u8>> {
                    v.iter().filter(|(k, _)| k == n).map(|(_, x)| x.clone()).collect()
                };
                proptest::prop_assert_eq!(got.len(), want.len());
                for (n, _) in &want {
                    proptest::prop_assert_eq!(by_name(&got, n), by_name(&want, n));
                }
                // The one left to the map is the general parser's only value.
                let only = |n: &str| -> Option<Vec<u8>> {
                    let mut all = g.headers.get_all(n).iter();
                    let first = all.next().map(|v| v.as_bytes().to_vec());
                    assert!(all.next().is_none(), "{n} repeated in a plain head");
                    first
                };
                proptest::prop_assert_eq!(h2.alt_svc.map(<[u8]>::to_vec), only("alt-svc"));
                proptest::prop_assert_eq!(h2.head.has_date, g.headers.contains_key("date"));
            }
            let general = response_head::parse(raw.as_bytes()).unwrap().unwrap();
            proptest::prop_assert_eq!((general.status, general.len), (plain.status, plain.len));
            proptest::prop_assert_eq!(general.body_length(head_request), Ok(plain.length));
            proptest::prop_assert_eq!(general.minor_version, 1);
            proptest::prop_assert_eq!(general.close, plain.close);
            out.extend_from_slice(b"\r\n");
            let again = response_head::parse(&out).unwrap().unwrap();
            let mut kept = general.headers.clone();
            crate::hop::strip_hop_by_hop(&mut kept, false);
            proptest::prop_assert_eq!(again.headers, kept);
        }
    }

    /// RFC 7541 Appendix A's names, written out apart from the encoder's table.
    const STATIC_NAMES: [&str; 62] = [
        "",
        ":authority",
        ":method",
        ":method",
        ":path",
        ":path",
        ":scheme",
        ":scheme",
        ":status",
        ":status",
        ":status",
        ":status",
        ":status",
        ":status",
        ":status",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "accept",
        "access-control-allow-origin",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "content-disposition",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-range",
        "content-type",
        "cookie",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "link",
        "location",
        "max-forwards",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "refresh",
        "retry-after",
        "server",
        "set-cookie",
        "strict-transport-security",
        "transfer-encoding",
        "user-agent",
        "vary",
        "via",
        "www-authenticate",
    ];

    /// Decodes field lines of the forms `hpack_field` writes (and refuses any other byte).
    fn decode(mut b: &[u8]) -> Vec<(String, Vec<u8>)> {
        fn int(b: &mut &[u8], prefix: u32) -> usize {
            let max = (1usize << prefix) - 1;
            let mut n = usize::from(b[0]) & max;
            *b = &b[1..];
            if n == max {
                let mut shift = 0;
                loop {
                    let x = b[0];
                    *b = &b[1..];
                    n += usize::from(x & 0x7f) << shift;
                    shift += 7;
                    if x & 0x80 == 0 {
                        break;
                    }
                }
            }
            n
        }
        fn string(b: &mut &[u8]) -> Vec<u8> {
            assert_eq!(b[0] & 0x80, 0, "not Huffman-coded");
            let n = int(b, 7);
            let s = b[..n].to_vec();
            *b = &b[n..];
            s
        }
        let mut fields = Vec::new();
        while !b.is_empty() {
            assert_eq!(b[0] & 0xf0, 0, "a literal without indexing");
            let index = int(&mut b, 4);
            let name = if index == 0 {
                String::from_utf8(string(&mut b)).unwrap()
            } else {
                STATIC_NAMES[index].to_string()
            };
            fields.push((name, string(&mut b)));
        }
        fields
    }

    proptest::proptest! {
        /// The word-at-a-time lowering is `make_ascii_lowercase`, whatever the bytes (any value,
        /// any length up to the limit; a longer name is not lowered here).
        #[test]
        fn names_are_lowered_as_byte_by_byte(
            name in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)
        ) {
            let mut want = name.clone();
            want.make_ascii_lowercase();
            match Lower::of(&name) {
                Some(l) => proptest::prop_assert_eq!(l.as_bytes(), &want[..]),
                None => proptest::prop_assert!(name.len() > Lower::MAX),
            }
        }
    }

    #[test]
    fn every_byte_value_is_lowered_as_byte_by_byte() {
        for b in 0..=255u8 {
            let word = u64::from_ne_bytes([b, b'Z', b, b'@', b'[', b, 0xc1, b'a']);
            let mut want = word.to_ne_bytes();
            want.make_ascii_lowercase();
            assert_eq!(lower8(word).to_ne_bytes(), want, "{b:#x}");
        }
    }

    #[test]
    fn hpack_integers_and_lines_are_rfc_7541s() {
        // C.1.1 and C.1.2: 10 and 1337 in a 5-bit prefix.
        let mut out = Vec::new();
        hpack_int(&mut out, 5, 10);
        hpack_int(&mut out, 5, 1337);
        assert_eq!(out, [0x0a, 0x1f, 0x9a, 0x0a]);
        // A static name (etag = 34 = 15 + 19 past the 4-bit prefix), then a literal one.
        let mut out = Vec::new();
        hpack_field(&mut out, b"ETag", b"\"a-1\"");
        hpack_field(&mut out, b"X-A", b"1");
        assert_eq!(out, b"\x0f\x13\x05\"a-1\"\x00\x03x-a\x011");
        // A value of 127 bytes or more takes a second length byte.
        let mut out = Vec::new();
        hpack_field(&mut out, b"server", &[b'a'; 200]);
        assert_eq!(out[..4], [0x0f, 54 - 15, 0x7f, 200 - 127]);
        assert_eq!(decode(&out), vec![("server".to_string(), vec![b'a'; 200])]);
        for (i, name) in STATIC_NAMES.iter().enumerate().skip(15) {
            if STATIC_NAMES[..i].contains(name) {
                continue;
            }
            assert_eq!(
                static_name_index(name.to_uppercase().as_bytes()),
                Some(i),
                "{name}"
            );
        }
        assert_eq!(static_name_index(b"x-not-in-the-table"), None);
        assert_eq!(
            static_name_index(b"a-name-longer-than-any-in-the-table"),
            None
        );
    }

    #[test]
    fn the_hpack_form_leaves_alt_svc_to_the_map() {
        let raw = "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Thu, 03 Dec 2026 06:00:00 GMT\r\n\
                   Content-Type: application/octet-stream\r\nContent-Length: 1024\r\n\
                   Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nETag: \"a-1\"\r\n\
                   Alt-Svc: clear\r\nX-Long: caf\u{e9}\r\n\r\nBODY";
        let mut out = b"x".to_vec();
        let p = write_plain_hpack(raw.as_bytes(), false, true, &mut out).unwrap();
        assert_eq!(p.head.len, raw.len() - 4);
        assert_eq!(p.head.length, BodyLength::Exact(1024));
        assert!(p.head.has_date);
        assert_eq!(p.alt_svc, Some(&b"clear"[..]));
        assert_eq!(
            decode(&out[1..]),
            [
                ("server", "nginx".as_bytes()),
                ("date", b"Thu, 03 Dec 2026 06:00:00 GMT"),
                ("content-type", b"application/octet-stream"),
                ("content-length", b"1024"),
                ("etag", b"\"a-1\""),
                ("x-long", "caf\u{e9}".as_bytes()),
            ]
            .map(|(n, v)| (n.to_string(), v.to_vec()))
        );
        let mut out = Vec::new();
        let p = write_plain_hpack(raw.as_bytes(), true, true, &mut out).unwrap();
        // The answer to HEAD keeps the length of what a GET would have had.
        assert_eq!(p.head.length, BodyLength::Empty);
        assert!(decode(&out).contains(&("content-length".to_string(), b"1024".to_vec())));
        // A `Date` passes in its place; none at all is the caller's to add.
        let mut out = Vec::new();
        let bare = "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n";
        assert!(
            !write_plain_hpack(bare.as_bytes(), false, true, &mut out)
                .unwrap()
                .head
                .has_date
        );
        // The parser trims a value's blank edges, which HTTP/2 forbids.
        let mut out = Vec::new();
        let trimmed = "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX-A: \t a \t\r\n\r\n";
        write_plain_hpack(trimmed.as_bytes(), false, true, &mut out).unwrap();
        assert_eq!(
            decode(&out),
            [("content-length", b"1"), ("x-a", b"a")].map(|(n, v)| (n.to_string(), v.to_vec()))
        );
        // Anything `write_plain` refuses is not plain here either.
        for raw in [
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nVia: 1.1 cdn\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            // A repeated field the map would hold: every value must survive.
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nAlt-Svc: clear\r\nAlt-Svc: h3=\":1\"\r\n\r\n",
            "HTTP/1.1 200 OK\r\nDate: a\r\nContent-Length: 1\r\nDate: b\r\n\r\n",
            // Not plain: a plain head's length goes out as it came, and the map path writes `7`.
            "HTTP/1.1 200 OK\r\nContent-Length: 007\r\n\r\n",
        ] {
            let mut out = b"x".to_vec();
            assert!(
                write_plain_hpack(raw.as_bytes(), false, true, &mut out).is_none(),
                "{raw:?}"
            );
            assert_eq!(out, b"x");
        }
    }

    #[test]
    fn what_it_writes_parses_to_the_general_parsers_fields_in_order() {
        let raw = "HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-B: 2\r\nSet-Cookie: b=2\r\n\
                   X-Obs: café\tok\r\nContent-Length: 3\r\n\r\n";
        let (_, mut out) = plain(raw, true).unwrap();
        out.push_str("\r\n");
        let again = response_head::parse(out.as_bytes()).unwrap().unwrap();
        let first = response_head::parse(raw.as_bytes()).unwrap().unwrap();
        assert_eq!(again.headers, first.headers);
        // The order is the upstream's, not a map's grouping.
        assert!(out.contains("set-cookie: a=1\r\nx-b: 2\r\nset-cookie: b=2\r\n"));
    }

    /// What a writer returned (the head, and the `Alt-Svc` value of the HPACK form) and wrote.
    type Written = (Option<(PlainHead, Option<Vec<u8>>)>, Vec<u8>);

    /// What each writer returns and writes (after `prefix`) for `buf`, fresh and from `memo`.
    fn both_ways(
        memo: &mut Memo,
        buf: &[u8],
        head_request: bool,
        via: bool,
        hpack: bool,
    ) -> [Written; 2] {
        let prefix = b"ab".to_vec();
        let (mut fresh, mut kept) = (prefix.clone(), prefix);
        let (a, b) = if hpack {
            let a = write_plain_hpack(buf, head_request, via, &mut fresh)
                .map(|p| (p.head, p.alt_svc.map(<[u8]>::to_vec)));
            let b = memo
                .write_plain_hpack(buf, head_request, via, &mut kept)
                .map(|p| (p.head, p.alt_svc.map(<[u8]>::to_vec)));
            (a, b)
        } else {
            let a = write_plain(buf, head_request, via, &mut fresh).map(|h| (h, None));
            let b = memo
                .write_plain(buf, head_request, via, &mut kept)
                .map(|h| (h, None));
            (a, b)
        };
        [(a, fresh), (b, kept)]
    }

    #[test]
    fn a_memo_answers_a_repeated_head_with_a_new_date() {
        let first = b"HTTP/1.1 200 OK\r\nServer: o\r\nDate: Thu, 03 Dec 2026 06:00:00 GMT\r\n\
                      Content-Length: 5\r\nAlt-Svc: clear\r\n\r\nhello";
        let next = b"HTTP/1.1 200 OK\r\nServer: o\r\nDate: Thu, 03 Dec 2026 06:00:01 GMT\r\n\
                     Content-Length: 5\r\nAlt-Svc: clear\r\n\r\nhello";
        for hpack in [false, true] {
            let mut memo = Memo::default();
            let [fresh, kept] = both_ways(&mut memo, first, false, true, hpack);
            assert_eq!(fresh, kept);
            assert!(memo.kept.is_some());
            // The next head is answered from the memo (poisoned here to tell), its date its own.
            memo.kept.as_mut().unwrap().head.close = true;
            let [fresh, kept] = both_ways(&mut memo, next, false, true, hpack);
            assert!(kept.0.unwrap().0.close);
            let date = b"06:00:01 GMT";
            assert!(kept.1.windows(date.len()).any(|w| w == date));
            assert_eq!(fresh.1, kept.1);
            memo.kept.as_mut().unwrap().head.close = false;
            // Another call (a HEAD request, or this hop's Via or not) is not.
            let hits = memo.hits;
            let [fresh, kept] = both_ways(&mut memo, next, true, true, hpack);
            assert_eq!(fresh, kept);
            let [fresh, kept] = both_ways(&mut memo, next, true, false, hpack);
            assert_eq!(fresh, kept);
            assert_eq!(memo.hits, hits);
            // A head with an upstream's Via is plain only without this hop's.
            let via = b"HTTP/1.1 200 OK\r\nVia: 1.1 cdn\r\nDate: Thu, 03 Dec 2026 06:00:00 GMT\r\n\
                        Content-Length: 5\r\n\r\nhello";
            let [fresh, kept] = both_ways(&mut memo, via, false, false, hpack);
            assert!(fresh.0.is_some() && fresh == kept);
            let [fresh, kept] = both_ways(&mut memo, via, false, true, hpack);
            assert!(fresh.0.is_none() && fresh == kept);
            // Nor is a date of another length, or one the parser would read otherwise.
            for date in [
                &b"Thu, 03 Dec 2026 06:00:1 GMT"[..],
                b"Thu, 03 Dec 2026 06:00:0\r\nGMT",
                b"Thu, 03 Dec 2026 06:00:\t1 GMT",
                b"Thu, 03 Dec 2026 06:00:01 GM ",
            ] {
                let mut raw = first.to_vec();
                let at = raw.windows(4).position(|w| w == b"Thu,").unwrap();
                raw.splice(at..at + 29, date.iter().copied());
                let [fresh, kept] = both_ways(&mut memo, &raw, true, false, hpack);
                assert_eq!(fresh, kept, "{date:?}");
            }
        }
    }

    proptest::proptest! {
        /// Over any run of heads that differ from one another here and there, a memo writes and
        /// returns exactly what the writers do, head by head.
        #[test]
        fn a_memo_answers_as_the_writers_do(
            picks in proptest::collection::vec((0usize..13, 0usize..8, proptest::bool::ANY), 0..6),
            date_at in 0usize..7,
            runs in proptest::collection::vec(
                (
                    0usize..5,
                    proptest::collection::vec(proptest::sample::select(
                        vec![b'0', b'9', b' ', b'\t', b'\r', b'\n', b'x', 0x80u8, 0x01, b':']), 0..3),
                    0usize..400,
                ),
                1..8,
            ),
            head_request in proptest::bool::ANY,
            via in proptest::bool::ANY,
            hpack in proptest::bool::ANY,
        ) {
            let mut base = String::from("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n");
            for (i, (f, v, upper)) in picks.iter().enumerate() {
                if i == date_at {
                    base.push_str("Date: Thu, 03 Dec 2026 06:00:00 GMT\r\n");
                }
                let (name, values) = FIELDS[*f];
                let name = if *upper { name.to_ascii_uppercase() } else { name.to_string() };
                base.push_str(&format!("{name}: {}\r\n", values[v % values.len()]));
            }
            if date_at >= picks.len() {
                base.push_str("Date: Thu, 03 Dec 2026 06:00:00 GMT\r\n");
            }
            base.push_str("\r\nbody...");
            let date = base.find("Thu,").unwrap();
            let mut memo = Memo::default();
            let mut hpack = hpack;
            // The last head passed on, and in which form: the same bytes again must be a hit.
            let mut kept: Option<(Vec<u8>, bool)> = None;
            for (how, bytes, at) in runs {
                let mut raw = base.clone().into_bytes();
                match how {
                    // The same head again.
                    0 => {}
                    // Its date's last bytes changed (to bytes the parser may or may not take).
                    1 => {
                        for (i, b) in bytes.iter().enumerate() {
                            raw[date + 28 - i] = *b;
                        }
                    }
                    // A byte changed anywhere.
                    2 => {
                        let i = at % raw.len();
                        raw[i] = bytes.first().copied().unwrap_or(b'Z');
                    }
                    // The other form.
                    3 => hpack = !hpack,
                    // A date of another length.
                    _ => {
                        raw.splice(date + 20..date + 20, bytes.iter().copied());
                    }
                }
                let hits = memo.hits;
                let [fresh, answered] = both_ways(&mut memo, &raw, head_request, via, hpack);
                let plain = fresh.0.is_some();
                proptest::prop_assert_eq!(fresh, answered);
                if kept.as_ref().is_some_and(|(k, form)| *k == raw && *form == hpack) {
                    proptest::prop_assert_eq!(memo.hits, hits + 1);
                }
                if plain {
                    kept = Some((raw, hpack));
                }
            }
        }
    }
}
