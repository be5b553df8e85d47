//! The server name (SNI) and ALPN list of a TLS ClientHello, read from the first bytes of a
//! connection without terminating TLS. No I/O: the caller peeks, asks [`parse`], and reads more
//! while the answer is [`Parsed::Incomplete`]. The ClientHello may span several TLS records and
//! arrive in any number of TCP segments.
//!
//! Reference: RFC 8446 §4.1.2 (ClientHello), §5.1 (records); RFC 6066 §3 (server_name); RFC 7301 (ALPN).

/// Largest ClientHello accepted (handshake body); real ones are well under 4 KiB, post-quantum key
/// shares included, so anything bigger is refused rather than buffered.
pub const MAX_HELLO_LEN: usize = 16 * 1024;

/// Most TLS records a ClientHello may be spread over. Real clients send it in one record, or two
/// when it outgrows one; a caller that parses again after each read re-reads every record each
/// time, so a hello cut into thousands of tiny records would cost CPU quadratic in their number.
pub const MAX_RECORDS: usize = 32;

const RECORD_HEADER: usize = 5;
const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;

/// What routing needs from a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientHello {
    /// The `host_name` from server_name, lowercased; `None` when the client sent none, or an
    /// IPv6 literal: such a hello is routed as one without a name, not refused.
    pub server_name: Option<String>,
    /// Protocols offered by ALPN, in the client's order.
    pub alpn: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    Complete(ClientHello),
    /// Could still become a valid ClientHello; read more (at least this many bytes in total).
    Incomplete {
        needed: usize,
    },
}

/// Why the bytes are not a usable ClientHello.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("not a TLS handshake record")]
    NotTls,
    #[error("first handshake message is not a ClientHello")]
    NotClientHello,
    #[error("ClientHello larger than {MAX_HELLO_LEN} bytes")]
    TooLarge,
    #[error("ClientHello spread over more than {MAX_RECORDS} records")]
    TooManyRecords,
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
}

/// Parses the ClientHello at the start of a connection's byte stream.
pub fn parse(buf: &[u8]) -> Result<Parsed, Error> {
    // Reassemble the handshake layer from as many records as needed, up to MAX_RECORDS.
    let mut handshake = Vec::new();
    let mut at = 0;
    for _ in 0..MAX_RECORDS {
        let Some(header) = buf.get(at..at + RECORD_HEADER) else {
            check_record_prefix(&buf[at.min(buf.len())..])?;
            return Ok(Parsed::Incomplete {
                needed: at + RECORD_HEADER,
            });
        };
        check_record_prefix(header)?;
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 {
            return Err(Error::Malformed("empty handshake record"));
        }
        if len > 16384 {
            return Err(Error::Malformed("record longer than 2^14"));
        }
        let body_start = at + RECORD_HEADER;
        let available = &buf[body_start..buf.len().min(body_start + len)];
        handshake.extend_from_slice(available);
        // Fail early on the handshake header, before the whole message arrived.
        if let Some(&kind) = handshake.first() {
            if kind != HANDSHAKE_CLIENT_HELLO {
                return Err(Error::NotClientHello);
            }
        }
        if handshake.len() >= 4 {
            let msg_len = u24(&handshake[1..4]);
            if msg_len > MAX_HELLO_LEN {
                return Err(Error::TooLarge);
            }
            if handshake.len() >= 4 + msg_len {
                return parse_hello(&handshake[4..4 + msg_len]).map(Parsed::Complete);
            }
        }
        if available.len() < len {
            // This record is not fully here yet.
            let missing_in_msg = if handshake.len() >= 4 {
                4 + u24(&handshake[1..4]) - handshake.len()
            } else {
                4 - handshake.len()
            };
            let missing_in_record = len - available.len();
            return Ok(Parsed::Incomplete {
                needed: buf.len() + missing_in_msg.min(missing_in_record),
            });
        }
        at = body_start + len;
    }
    // The next record would be one too many (the message is not complete after MAX_RECORDS).
    Err(Error::TooManyRecords)
}

/// Checks as much of a record header as is present: handshake type, TLS major version 3.
fn check_record_prefix(header: &[u8]) -> Result<(), Error> {
    match header {
        [] => Ok(()),
        [t, ..] if *t != CONTENT_HANDSHAKE => Err(Error::NotTls),
        [_, major, ..] if *major != 3 => Err(Error::NotTls),
        [_, _, minor, ..] if *minor > 4 => Err(Error::NotTls),
        _ => Ok(()),
    }
}

fn u24(b: &[u8]) -> usize {
    (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2])
}

/// A bounds-checked reader over the ClientHello body.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Error> {
        if self.buf.len() < n {
            return Err(Error::Malformed(what));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, Error> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, Error> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one- or two-byte length prefix.
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], Error> {
        let n = self.u8(what)?;
        self.take(usize::from(n), what)
    }

    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], Error> {
        let n = self.u16(what)?;
        self.take(usize::from(n), what)
    }
}

fn parse_hello(body: &[u8]) -> Result<ClientHello, Error> {
    let mut r = Reader { buf: body };
    r.take(2, "legacy_version")?;
    r.take(32, "random")?;
    let session = r.vec8("session_id")?;
    if session.len() > 32 {
        return Err(Error::Malformed("session_id longer than 32"));
    }
    let suites = r.vec16("cipher_suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(Error::Malformed("cipher_suites"));
    }
    if r.vec8("compression_methods")?.is_empty() {
        return Err(Error::Malformed("compression_methods"));
    }
    let mut hello = ClientHello::default();
    if r.buf.is_empty() {
        // A ClientHello without extensions is legal (old clients) and names no server.
        return Ok(hello);
    }
    let mut exts = Reader {
        buf: r.vec16("extensions")?,
    };
    if !r.buf.is_empty() {
        return Err(Error::Malformed("bytes after extensions"));
    }
    let mut seen_sni = false;
    while !exts.buf.is_empty() {
        let kind = exts.u16("extension type")?;
        let data = exts.vec16("extension data")?;
        match kind {
            EXT_SERVER_NAME => {
                if seen_sni {
                    return Err(Error::Malformed("server_name twice"));
                }
                seen_sni = true;
                hello.server_name = parse_server_name(data)?;
            }
            EXT_ALPN => hello.alpn = parse_alpn(data)?,
            _ => {}
        }
    }
    Ok(hello)
}

fn parse_server_name(data: &[u8]) -> Result<Option<String>, Error> {
    let mut r = Reader { buf: data };
    let mut list = Reader {
        buf: r.vec16("server_name list")?,
    };
    if !r.buf.is_empty() {
        return Err(Error::Malformed("bytes after server_name list"));
    }
    let mut found = None;
    let mut seen = false;
    while !list.buf.is_empty() {
        let name_type = list.u8("server_name type")?;
        let name = list.vec16("server_name")?;
        // RFC 6066: at most one name per type; host_name is type 0, others are ignored.
        if name_type == 0 {
            if seen {
                return Err(Error::Malformed("two host names"));
            }
            seen = true;
            found = host_name(name)?;
        }
    }
    Ok(found)
}

/// A DNS host name: letters, digits, '-', '.', '_' (seen in the wild), 1..=253 bytes, lowercased.
/// An IPv6 literal (`fe80::1`, `[2001:db8::1]`), which some clients send against RFC 6066, is no
/// name: the hello goes where a hello without SNI goes (before, an SNI-routing listener refused
/// the connection). Anything else (`*`, a space, `name:443`, a non-ASCII byte) is malformed:
/// a backend reading the raw name its own way (nginx drops a `:port`) must not be reached by a
/// name the routing could not read.
fn host_name(raw: &[u8]) -> Result<Option<String>, Error> {
    let ok = !raw.is_empty()
        && raw.len() <= 253
        && raw
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !ok {
        return match is_ipv6_literal(raw) {
            true => Ok(None),
            false => Err(Error::Malformed("server_name is not a DNS host name")),
        };
    }
    let mut name = String::from_utf8_lossy(raw).to_ascii_lowercase();
    if name.ends_with('.') {
        name.pop();
    }
    // "." alone names nothing.
    match name.is_empty() {
        true => Err(Error::Malformed("server_name is not a DNS host name")),
        false => Ok(Some(name)),
    }
}

/// An IPv6 address, bare or in brackets.
fn is_ipv6_literal(raw: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(raw) else {
        return false;
    };
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse::<std::net::Ipv6Addr>().is_ok()
}

fn parse_alpn(data: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
    let mut r = Reader { buf: data };
    let mut list = Reader {
        buf: r.vec16("alpn list")?,
    };
    let mut out = Vec::new();
    while !list.buf.is_empty() {
        let proto = list.vec8("alpn protocol")?;
        if proto.is_empty() {
            return Err(Error::Malformed("empty alpn protocol"));
        }
        out.push(proto.to_vec());
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
