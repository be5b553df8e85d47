//! PROXY protocol v1 (text) and v2 (binary) headers: parse with an "incomplete" case, and encode.
//! No I/O: the caller peeks bytes, asks [`parse`], and reads more while the answer is
//! [`Parsed::Incomplete`].
//!
//! Reference: the HAProxy PROXY protocol specification (versions 1 and 2).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The 12-byte signature that opens every v2 header.
pub const V2_SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];

/// A v1 header is at least 15 bytes (`PROXY UNKNOWN\r\n`).
pub const V1_MIN_LEN: usize = 15;

/// A v1 header is at most 107 bytes including CRLF.
pub const V1_MAX_LEN: usize = 107;

/// Largest v2 header this parser accepts (16-byte fixed part + the largest length field).
pub const V2_MAX_LEN: usize = 16 + u16::MAX as usize;

/// What a PROXY header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addresses {
    /// The original client and the address it connected to.
    Tcp {
        source: SocketAddr,
        destination: SocketAddr,
    },
    /// `UNKNOWN` (v1) or `LOCAL` / unsupported family (v2): the receiver keeps the real peer.
    Unknown,
}

/// A parsed header and how many bytes of the stream it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: Version,
    pub addresses: Addresses,
    /// Bytes to consume before the proxied payload begins.
    pub len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The result of looking at the first bytes of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    Complete(Header),
    /// Could still become a valid header; read more (at least this many bytes in total).
    Incomplete {
        needed: usize,
    },
}

/// Why the bytes are not a PROXY header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("no PROXY protocol signature")]
    NoSignature,
    #[error("PROXY v1 line longer than 107 bytes")]
    V1TooLong,
    #[error("malformed PROXY v1 line: {0}")]
    V1Malformed(&'static str),
    #[error("PROXY v2: unsupported version {0}")]
    V2Version(u8),
    #[error("PROXY v2: unknown command {0}")]
    V2Command(u8),
    #[error("PROXY v2: address block too short for its family")]
    V2ShortAddresses,
}

/// Parses a PROXY v1 or v2 header at the start of `buf`.
pub fn parse(buf: &[u8]) -> Result<Parsed, Error> {
    if buf.first() == Some(&V2_SIGNATURE[0]) {
        parse_v2(buf)
    } else {
        parse_v1(buf)
    }
}

fn parse_v1(buf: &[u8]) -> Result<Parsed, Error> {
    const PREFIX: &[u8] = b"PROXY ";
    let n = buf.len().min(PREFIX.len());
    if buf[..n] != PREFIX[..n] {
        return Err(Error::NoSignature);
    }
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() >= V1_MAX_LEN {
            return Err(Error::V1TooLong);
        }
        // A lone LF or any control byte can never become a valid line.
        if buf.iter().any(|&b| b == b'\n' || (b < 0x20 && b != b'\r')) {
            return Err(Error::V1Malformed("control character in line"));
        }
        // The shortest line ("PROXY UNKNOWN\r\n") is 15 bytes and a v2 header at least 16, so a
        // reader may ask for 15 at once without reading past a header into the payload.
        return Ok(Parsed::Incomplete {
            needed: (buf.len() + 1).max(V1_MIN_LEN),
        });
    };
    let len = end + 2;
    if len > V1_MAX_LEN {
        return Err(Error::V1TooLong);
    }
    let line = std::str::from_utf8(&buf[PREFIX.len()..end])
        .map_err(|_| Error::V1Malformed("not ASCII"))?;
    let addresses = parse_v1_fields(line)?;
    Ok(Parsed::Complete(Header {
        version: Version::V1,
        addresses,
        len,
    }))
}

fn parse_v1_fields(line: &str) -> Result<Addresses, Error> {
    let mut parts = line.split(' ');
    let family = parts.next().unwrap_or_default();
    if family == "UNKNOWN" {
        // The spec lets the sender put anything after UNKNOWN; the receiver ignores it.
        return Ok(Addresses::Unknown);
    }
    let fields: Vec<&str> = parts.collect();
    let [src, dst, sport, dport] = fields[..] else {
        return Err(Error::V1Malformed("expected 4 fields after the family"));
    };
    let (src, dst): (IpAddr, IpAddr) = match family {
        "TCP4" => (
            parse_v4(src).ok_or(Error::V1Malformed("bad IPv4 source"))?,
            parse_v4(dst).ok_or(Error::V1Malformed("bad IPv4 destination"))?,
        ),
        "TCP6" => (
            src.parse::<Ipv6Addr>()
                .map_err(|_| Error::V1Malformed("bad IPv6 source"))?
                .into(),
            dst.parse::<Ipv6Addr>()
                .map_err(|_| Error::V1Malformed("bad IPv6 destination"))?
                .into(),
        ),
        _ => return Err(Error::V1Malformed("family is not TCP4, TCP6 or UNKNOWN")),
    };
    Ok(Addresses::Tcp {
        source: SocketAddr::new(src, parse_port(sport)?),
        destination: SocketAddr::new(dst, parse_port(dport)?),
    })
}

fn parse_v4(s: &str) -> Option<IpAddr> {
    s.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// Ports are decimal without leading zeros or signs, 0..=65535.
fn parse_port(s: &str) -> Result<u16, Error> {
    let ok = !s.is_empty()
        && s.len() <= 5
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'));
    if !ok {
        return Err(Error::V1Malformed("bad port"));
    }
    s.parse().map_err(|_| Error::V1Malformed("bad port"))
}

fn parse_v2(buf: &[u8]) -> Result<Parsed, Error> {
    let n = buf.len().min(V2_SIGNATURE.len());
    if buf[..n] != V2_SIGNATURE[..n] {
        return Err(Error::NoSignature);
    }
    if buf.len() < 16 {
        if let Some(&vc) = buf.get(12) {
            check_version_command(vc)?;
        }
        return Ok(Parsed::Incomplete { needed: 16 });
    }
    let command = check_version_command(buf[12])?;
    let family = buf[13];
    let body_len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let len = 16 + body_len;
    if buf.len() < len {
        return Ok(Parsed::Incomplete { needed: len });
    }
    let body = &buf[16..len];
    let addresses = if command == 0 {
        // LOCAL: a health check from the proxy itself; addresses are ignored.
        Addresses::Unknown
    } else {
        match family {
            // TCP over IPv4
            0x11 => {
                let b: &[u8; 12] = body
                    .get(..12)
                    .and_then(|s| s.try_into().ok())
                    .ok_or(Error::V2ShortAddresses)?;
                let ip = |o: usize| IpAddr::V4(Ipv4Addr::new(b[o], b[o + 1], b[o + 2], b[o + 3]));
                let port = |o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
                Addresses::Tcp {
                    source: SocketAddr::new(ip(0), port(8)),
                    destination: SocketAddr::new(ip(4), port(10)),
                }
            }
            // TCP over IPv6
            0x21 => {
                let b: &[u8; 36] = body
                    .get(..36)
                    .and_then(|s| s.try_into().ok())
                    .ok_or(Error::V2ShortAddresses)?;
                let ip = |o: usize| {
                    let mut a = [0u8; 16];
                    a.copy_from_slice(&b[o..o + 16]);
                    IpAddr::V6(Ipv6Addr::from(a))
                };
                let port = |o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
                Addresses::Tcp {
                    source: SocketAddr::new(ip(0), port(32)),
                    destination: SocketAddr::new(ip(16), port(34)),
                }
            }
            // UNSPEC, UDP, UNIX: the spec says to accept the connection and use the real peer.
            _ => Addresses::Unknown,
        }
    };
    Ok(Parsed::Complete(Header {
        version: Version::V2,
        addresses,
        len,
    }))
}

/// Returns the command (0 LOCAL, 1 PROXY) after checking the version nibble.
fn check_version_command(vc: u8) -> Result<u8, Error> {
    if vc >> 4 != 2 {
        return Err(Error::V2Version(vc >> 4));
    }
    match vc & 0x0F {
        c @ (0 | 1) => Ok(c),
        c => Err(Error::V2Command(c)),
    }
}

/// Encodes a v1 line for a TCP connection from `source` to `destination`. Mixed families (an IPv4
/// client on an IPv6 listener) are written as TCP6 with the IPv4 address mapped.
pub fn encode_v1(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let line = match unify(source, destination) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => format!(
            "PROXY TCP4 {} {} {} {}\r\n",
            s.ip(),
            d.ip(),
            s.port(),
            d.port()
        ),
        (s, d) => format!(
            "PROXY TCP6 {} {} {} {}\r\n",
            s.ip(),
            d.ip(),
            s.port(),
            d.port()
        ),
    };
    line.into_bytes()
}

/// Encodes a v2 PROXY command for a TCP connection (no TLVs).
pub fn encode_v2(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 36);
    out.extend_from_slice(&V2_SIGNATURE);
    out.push(0x21); // version 2, PROXY
    match unify(source, destination) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            out.push(0x11);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s.ip().octets());
            out.extend_from_slice(&d.ip().octets());
            out.extend_from_slice(&s.port().to_be_bytes());
            out.extend_from_slice(&d.port().to_be_bytes());
        }
        (s, d) => {
            out.push(0x21);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&v6(s.ip()).octets());
            out.extend_from_slice(&v6(d.ip()).octets());
            out.extend_from_slice(&s.port().to_be_bytes());
            out.extend_from_slice(&d.port().to_be_bytes());
        }
    }
    out
}

/// Encodes a v2 LOCAL command (no addresses): what a health check sends.
pub fn encode_v2_local() -> Vec<u8> {
    let mut out = V2_SIGNATURE.to_vec();
    out.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
    out
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// Both addresses in one family: IPv4 only when both are IPv4 (or IPv4-mapped IPv6).
fn unify(s: SocketAddr, d: SocketAddr) -> (SocketAddr, SocketAddr) {
    let canon = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (s, d) = (canon(s), canon(d));
    if s.is_ipv4() && d.is_ipv4() {
        (s, d)
    } else {
        (
            SocketAddr::new(IpAddr::V6(v6(s.ip())), s.port()),
            SocketAddr::new(IpAddr::V6(v6(d.ip())), d.port()),
        )
    }
}

#[cfg(test)]
mod tests;
