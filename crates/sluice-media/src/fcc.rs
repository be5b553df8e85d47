//! Fast channel change (FCC) signalling: the Telecom/ZTE/FiberHome and Huawei packets a client
//! and an operator's FCC server exchange, built and parsed in both directions. No I/O.
//!
//! Every signalling packet is an RTCP Generic RTP Feedback packet (RFC 4585: V = 2, PT = 205,
//! the FMT in the low five bits of the first byte, the length in 32-bit words minus one),
//! sender SSRC 0, media source SSRC = the multicast group's IPv4 address, then the FCI. All
//! fields big-endian. Offsets below count from the start of the packet.
//!
//! Telecom, ZTE, FiberHome:
//! - request, FMT 2, 24 bytes: 16..18 client port, 18..20 group port, 20..24 group address;
//! - response, FMT 3, 36 bytes: 12 result (0 = accepted), 13 action (1 = join the multicast
//!   now, 2 = a unicast burst follows, 3 = ask another server), 14..16 new signalling port,
//!   16..18 new media port, 20..24 new server address (0 = unchanged), 24..28 valid time,
//!   28..32 burst bit rate, 32..36 bit rate after the sync;
//! - sync, FMT 4: the server's "join the multicast now";
//! - termination, FMT 5, 16 bytes: 12 1 = forced stop, 0 = normal; 14..16 the first multicast
//!   sequence number the client holds (the server stops the burst before it).
//!
//! Huawei:
//! - request, FMT 5, 32 bytes: 20..24 the client's address, 24..26 client port, 26..28 0x8000,
//!   28..32 0x20000000 (redirects understood);
//! - response, FMT 6, 16 or 36 bytes: 12 result (1 = accepted), 14..16 action (as above),
//!   24 flags (0x20: the server wants a NAT probe), 26..28 server media port, 28..32 session
//!   id, 32..36 server address;
//! - sync, FMT 8;
//! - termination, FMT 9, 16 bytes: 12 status (1 = joined, 2 = could not join), 14..16 the
//!   first multicast sequence number;
//! - NAT probe, 8 bytes (not RTCP): 00 03 00 00 and the session id, sent to the media port.

use std::net::{Ipv4Addr, SocketAddrV4};

/// RTCP payload type of Generic RTP Feedback.
pub const RTPFB: u8 = 205;

/// Which operator's dialect a server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Flavor {
    /// China Telecom, ZTE and FiberHome servers (FMT 2/3/4/5).
    #[default]
    Telecom,
    /// Huawei servers (FMT 5/6/8/9, NAT probe).
    Huawei,
}

impl Flavor {
    /// Parses rtp2httpd's `fcc-type` values (and the vendor names it groups).
    pub fn parse(s: &str) -> Option<Flavor> {
        match s.to_ascii_lowercase().as_str() {
            "telecom" | "zte" | "fiberhome" => Some(Flavor::Telecom),
            "huawei" => Some(Flavor::Huawei),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Flavor::Telecom => "telecom",
            Flavor::Huawei => "huawei",
        }
    }

    const fn formats(self) -> Formats {
        match self {
            Flavor::Telecom => Formats {
                request: 2,
                response: 3,
                sync: 4,
                terminate: 5,
            },
            Flavor::Huawei => Formats {
                request: 5,
                response: 6,
                sync: 8,
                terminate: 9,
            },
        }
    }
}

struct Formats {
    request: u8,
    response: u8,
    sync: u8,
    terminate: u8,
}

/// Why a signalling packet is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FccError {
    #[error("not an RTCP feedback packet (version 2, type 205)")]
    NotFeedback,
    #[error("FMT {0} is not a message of this FCC dialect")]
    Format(u8),
    #[error("{kind} of {len} bytes is shorter than the {need} it needs")]
    Short {
        kind: &'static str,
        len: usize,
        need: usize,
    },
}

/// What the server asks the client to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// No burst: join the multicast now.
    JoinMulticast,
    /// A unicast burst follows.
    Unicast,
    /// Ask the server named in the response instead.
    Redirect,
    /// An action this client does not know (treated as "join the multicast").
    Other(u16),
}

impl Action {
    fn from_code(code: u16) -> Action {
        match code {
            1 => Action::JoinMulticast,
            2 => Action::Unicast,
            3 => Action::Redirect,
            n => Action::Other(n),
        }
    }

    fn code(self) -> u16 {
        match self {
            Action::JoinMulticast => 1,
            Action::Unicast => 2,
            Action::Redirect => 3,
            Action::Other(n) => n,
        }
    }
}

/// A server's answer to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Response {
    /// The result code as sent (Telecom accepts with 0, Huawei with 1).
    pub result: u8,
    pub action: Option<Action>,
    /// Where later signalling goes (Telecom), or redirects point (Huawei).
    pub signal_port: Option<u16>,
    /// Where the burst comes from, and where a Huawei NAT probe goes.
    pub media_port: Option<u16>,
    pub server: Option<Ipv4Addr>,
    /// Huawei: the server wants a NAT probe carrying `session`.
    pub nat_probe: bool,
    pub session: u32,
    /// Telecom: burst and post-sync bit rates (bits per second), for logs.
    pub burst_bps: u32,
    pub after_sync_bps: u32,
}

impl Response {
    /// Whether the server accepted the request.
    pub fn accepted(&self, flavor: Flavor) -> bool {
        match flavor {
            Flavor::Telecom => self.result == 0,
            Flavor::Huawei => self.result == 1,
        }
    }
}

/// A packet from the server on the signalling socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerMessage {
    Response(Response),
    /// Join the multicast now; the burst has caught up with it.
    Sync,
}

/// A packet from the client (what a server reads; the gateway builds these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMessage {
    Request {
        group: SocketAddrV4,
        client_port: u16,
        /// Huawei requests name the client's address (Telecom's carry none).
        client_ip: Option<Ipv4Addr>,
    },
    /// Stop the burst before `first_multicast_seq`; `None` means stop now (the client gave up
    /// or is leaving).
    Terminate { first_multicast_seq: Option<u16> },
}

/// Whether a datagram is RTCP feedback rather than RTP media (an RTP packet of payload type
/// 77 with the marker bit has the same second byte, so the length must fit too).
pub fn is_feedback(buf: &[u8]) -> bool {
    buf.len() >= 12
        && buf[0] >> 6 == 2
        && buf[1] == RTPFB
        && (usize::from(u16::from_be_bytes([buf[2], buf[3]])) + 1) * 4 == buf.len()
}

fn header(fmt: u8, len: usize, group: Ipv4Addr) -> Vec<u8> {
    let mut p = vec![0u8; len];
    p[0] = 0x80 | fmt;
    p[1] = RTPFB;
    p[2..4].copy_from_slice(&((len / 4 - 1) as u16).to_be_bytes());
    p[8..12].copy_from_slice(&group.octets());
    p
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn nonzero16(v: u16) -> Option<u16> {
    (v != 0).then_some(v)
}

fn nonzero_ip(b: &[u8], at: usize) -> Option<Ipv4Addr> {
    let ip = Ipv4Addr::from(be32(b, at));
    (!ip.is_unspecified()).then_some(ip)
}

/// The client's request for a burst of `group`, answered to `client_port`.
pub fn request(
    flavor: Flavor,
    group: SocketAddrV4,
    client_port: u16,
    client_ip: Ipv4Addr,
) -> Vec<u8> {
    let fmt = flavor.formats().request;
    match flavor {
        Flavor::Telecom => {
            let mut p = header(fmt, 24, *group.ip());
            p[16..18].copy_from_slice(&client_port.to_be_bytes());
            p[18..20].copy_from_slice(&group.port().to_be_bytes());
            p[20..24].copy_from_slice(&group.ip().octets());
            p
        }
        Flavor::Huawei => {
            let mut p = header(fmt, 32, *group.ip());
            p[20..24].copy_from_slice(&client_ip.octets());
            p[24..26].copy_from_slice(&client_port.to_be_bytes());
            p[26..28].copy_from_slice(&0x8000u16.to_be_bytes());
            p[28..32].copy_from_slice(&0x2000_0000u32.to_be_bytes());
            p
        }
    }
}

/// The client's termination: the first multicast sequence number it holds, or a forced stop.
pub fn terminate(flavor: Flavor, group: Ipv4Addr, first_multicast_seq: Option<u16>) -> Vec<u8> {
    let mut p = header(flavor.formats().terminate, 16, group);
    p[12] = match (flavor, first_multicast_seq) {
        (Flavor::Telecom, Some(_)) => 0,
        (Flavor::Telecom, None) => 1,
        (Flavor::Huawei, Some(_)) => 1,
        (Flavor::Huawei, None) => 2,
    };
    p[14..16].copy_from_slice(&first_multicast_seq.unwrap_or(0).to_be_bytes());
    p
}

/// Huawei's NAT probe, sent to the server's media port so the burst finds its way back.
pub fn nat_probe(session: u32) -> [u8; 8] {
    let mut p = [0, 3, 0, 0, 0, 0, 0, 0];
    p[4..8].copy_from_slice(&session.to_be_bytes());
    p
}

/// Parses a packet the server sent on the signalling socket.
pub fn parse_server(flavor: Flavor, buf: &[u8]) -> Result<ServerMessage, FccError> {
    if buf.len() < 8 || buf[0] >> 6 != 2 || buf[1] != RTPFB {
        return Err(FccError::NotFeedback);
    }
    let fmt = buf[0] & 0x1f;
    let f = flavor.formats();
    if fmt == f.sync {
        return Ok(ServerMessage::Sync);
    }
    if fmt != f.response {
        return Err(FccError::Format(fmt));
    }
    let short = |need: usize| FccError::Short {
        kind: "response",
        len: buf.len(),
        need,
    };
    match flavor {
        Flavor::Telecom => {
            if buf.len() < 36 {
                return Err(short(36));
            }
            Ok(ServerMessage::Response(Response {
                result: buf[12],
                action: Some(Action::from_code(u16::from(buf[13]))),
                signal_port: nonzero16(be16(buf, 14)),
                media_port: nonzero16(be16(buf, 16)),
                server: nonzero_ip(buf, 20),
                burst_bps: be32(buf, 28),
                after_sync_bps: be32(buf, 32),
                ..Response::default()
            }))
        }
        Flavor::Huawei => {
            if buf.len() < 16 {
                return Err(short(16));
            }
            let mut r = Response {
                result: buf[12],
                action: Some(Action::from_code(be16(buf, 14))),
                ..Response::default()
            };
            let needs_more = matches!(r.action, Some(Action::Unicast | Action::Redirect));
            if r.accepted(flavor) && needs_more {
                if buf.len() < 36 {
                    return Err(short(36));
                }
                r.nat_probe = buf[24] & 0x20 != 0;
                r.media_port = nonzero16(be16(buf, 26));
                r.session = be32(buf, 28);
                r.server = nonzero_ip(buf, 32);
                if r.action == Some(Action::Redirect) {
                    // A Huawei redirect names the new server's signalling port there.
                    r.signal_port = r.media_port.take();
                }
            }
            Ok(ServerMessage::Response(r))
        }
    }
}

/// Builds a server's response (for scripted servers in tests, and the fuzz target).
pub fn response(flavor: Flavor, group: Ipv4Addr, r: &Response) -> Vec<u8> {
    let f = flavor.formats();
    let action = r.action.map_or(0, Action::code);
    match flavor {
        Flavor::Telecom => {
            let mut p = header(f.response, 36, group);
            p[12] = r.result;
            p[13] = action as u8;
            p[14..16].copy_from_slice(&r.signal_port.unwrap_or(0).to_be_bytes());
            p[16..18].copy_from_slice(&r.media_port.unwrap_or(0).to_be_bytes());
            p[20..24].copy_from_slice(&r.server.unwrap_or(Ipv4Addr::UNSPECIFIED).octets());
            p[28..32].copy_from_slice(&r.burst_bps.to_be_bytes());
            p[32..36].copy_from_slice(&r.after_sync_bps.to_be_bytes());
            p
        }
        Flavor::Huawei => {
            let mut p = header(f.response, 36, group);
            p[12] = r.result;
            p[14..16].copy_from_slice(&action.to_be_bytes());
            p[24] = if r.nat_probe { 0x20 } else { 0 };
            let port = if r.action == Some(Action::Redirect) {
                r.signal_port
            } else {
                r.media_port
            };
            p[26..28].copy_from_slice(&port.unwrap_or(0).to_be_bytes());
            p[28..32].copy_from_slice(&r.session.to_be_bytes());
            p[32..36].copy_from_slice(&r.server.unwrap_or(Ipv4Addr::UNSPECIFIED).octets());
            p
        }
    }
}

/// The server's sync notification.
pub fn sync(flavor: Flavor, group: Ipv4Addr) -> Vec<u8> {
    header(flavor.formats().sync, 12, group)
}

/// Parses a packet a client sent (what a server reads).
pub fn parse_client(flavor: Flavor, buf: &[u8]) -> Result<ClientMessage, FccError> {
    if buf.len() < 8 || buf[0] >> 6 != 2 || buf[1] != RTPFB {
        return Err(FccError::NotFeedback);
    }
    let fmt = buf[0] & 0x1f;
    let f = flavor.formats();
    let need = |kind: &'static str, need: usize| {
        if buf.len() < need {
            Err(FccError::Short {
                kind,
                len: buf.len(),
                need,
            })
        } else {
            Ok(())
        }
    };
    if fmt == f.request {
        match flavor {
            Flavor::Telecom => {
                need("request", 24)?;
                Ok(ClientMessage::Request {
                    group: SocketAddrV4::new(Ipv4Addr::from(be32(buf, 20)), be16(buf, 18)),
                    client_port: be16(buf, 16),
                    client_ip: None,
                })
            }
            Flavor::Huawei => {
                need("request", 32)?;
                Ok(ClientMessage::Request {
                    // Huawei requests carry the group address but not its port.
                    group: SocketAddrV4::new(Ipv4Addr::from(be32(buf, 8)), 0),
                    client_port: be16(buf, 24),
                    client_ip: Some(Ipv4Addr::from(be32(buf, 20))),
                })
            }
        }
    } else if fmt == f.terminate {
        need("termination", 16)?;
        let normal = match flavor {
            Flavor::Telecom => buf[12] == 0,
            Flavor::Huawei => buf[12] == 1,
        };
        Ok(ClientMessage::Terminate {
            first_multicast_seq: normal.then(|| be16(buf, 14)),
        })
    } else {
        Err(FccError::Format(fmt))
    }
}

#[cfg(test)]
#[path = "fcc/tests.rs"]
mod tests;
