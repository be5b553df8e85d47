//! Channel URLs: `/rtp/…` and `/udp/…` paths in the forms rtp2httpd, udpxy and msd_lite accept.
//!
//! Accepted (group `G`, source `S`, port `P`):
//! - `/rtp/G:P`, `/udp/G:P`, with an optional trailing `/` (udpxy writes one);
//! - udpxy's other separators between group and port: `%` `~` `+` `-` `^`, and `%3A` (an
//!   escaped colon, as some playlist tools write it);
//! - `/rtp/G` alone means port 1234 (msd_lite's default);
//! - source-specific: `/rtp/S@G:P`; a leading `@` with no source is VLC's "any source";
//! - IPv6: `/rtp/[ff3e::1]:P`, `/rtp/[2001:db8::1]@[ff3e::1]:P`;
//! - query `iface=NAME` (also `ifname=` from msd_lite and `r2h-ifname=` from rtp2httpd);
//! - query `fec=PORT` (rtp2httpd's name): FEC packets (SMPTE 2022-1 XOR or Reed-Solomon) for
//!   the same group on PORT;
//! - query `fcc=IP:PORT` and `fcc-type=telecom|huawei` (rtp2httpd's names; `operator=` is
//!   tvgate's spelling of the type): the fast channel change server of an IPv4 group;
//!   `r2h-ifname-fcc=NAME` (rtp2httpd's name): the interface FCC uses.

use std::net::{IpAddr, SocketAddrV4};

use sluice_media::fcc::Flavor;

/// Port used when a path names only a group (msd_lite's default).
pub const DEFAULT_PORT: u16 = 1234;

/// How the payload is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `/rtp/`: RTP headers are removed; datagrams that are neither RTP nor TS are dropped.
    Rtp,
    /// `/udp/`: RTP is removed when detected, anything else passes through untouched.
    Udp,
}

/// A parsed channel request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel {
    pub mode: Mode,
    pub group: IpAddr,
    pub port: u16,
    pub source: Option<IpAddr>,
    /// Interface named in the query, if any.
    pub interface: Option<String>,
    /// Port of the group's FEC stream (`?fec=PORT`), if any.
    pub fec: Option<u16>,
    /// FCC server and dialect (`?fcc=IP:PORT&fcc-type=…`), if any.
    pub fcc: Option<(SocketAddrV4, Flavor)>,
    /// Interface for FCC (`?r2h-ifname-fcc=`), if named.
    pub fcc_interface: Option<String>,
}

/// Why a channel URL was refused; the text goes back to the client in the 400 body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("path must start with /rtp/ or /udp/")]
    Prefix,
    #[error("missing multicast group after /rtp/ or /udp/")]
    Empty,
    #[error("{0:?} is not an IP address")]
    Address(String),
    #[error("{0:?} is not a port number (1-65535)")]
    Port(String),
    #[error("{0} is not a multicast group address")]
    NotMulticast(IpAddr),
    #[error("source {0} must be a unicast address of the same family as the group")]
    BadSource(IpAddr),
    #[error("unterminated [ in IPv6 address")]
    Bracket,
    #[error("interface name {0:?} is empty or too long")]
    Interface(String),
    #[error("fec={0:?} must be a port number (1-65535) other than the channel's")]
    FecPort(String),
    #[error("fcc={0:?} must be an IPv4 address and port (IP:PORT)")]
    FccServer(String),
    #[error("fcc-type={0:?} must be telecom, zte, fiberhome or huawei")]
    FccType(String),
    #[error("fcc= needs an IPv4 multicast group")]
    FccFamily,
}

/// Whether `group` carries a network's own control traffic rather than a channel: the local
/// and internetwork control blocks (224.0.0.0/24: routing, mDNS, IGMP; 224.0.1.0/24: NTP and
/// the like), SSDP and SLP (239.255.255.250, .253), interface- or link-local IPv6 scopes, and
/// IPv6's permanent (IANA-assigned, flags 0) groups at every scope: `ff05::c` is site-local
/// SSDP, `ff05::1:3` DHCPv6 servers, `ff0e::101` NTP (channels use transient groups: `ff1e`,
/// `ff3e`; `iptv.allow_groups` serves one of these all the same).
pub fn is_control_group(group: IpAddr) -> bool {
    match group {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            (o[0] == 224 && o[1] == 0 && o[2] <= 1)
                || (o[0], o[1], o[2]) == (239, 255, 255) && matches!(o[3], 250 | 253)
        }
        IpAddr::V6(v6) => {
            let s = v6.segments()[0];
            (s & 0xff00) == 0xff00 && (matches!(s & 0x000f, 1 | 2) || s & 0x00f0 == 0)
        }
    }
}

/// Parses a request path and query into a channel.
pub fn parse_channel(path: &str, query: Option<&str>) -> Result<Channel, UrlError> {
    let (mode, rest) = if let Some(r) = path.strip_prefix("/rtp/") {
        (Mode::Rtp, r)
    } else if let Some(r) = path.strip_prefix("/udp/") {
        (Mode::Udp, r)
    } else {
        return Err(UrlError::Prefix);
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let rest = unescape_colons(rest);
    if rest.is_empty() {
        return Err(UrlError::Empty);
    }
    let (source, endpoint) = match rest.rsplit_once('@') {
        Some(("", ep)) => (None, ep),
        Some((src, ep)) => (Some(parse_ip(src)?), ep),
        None => (None, rest.as_str()),
    };
    let (group, port) = parse_endpoint(endpoint)?;
    validate(group, source)?;
    Ok(Channel {
        mode,
        group,
        port,
        source,
        interface: query
            .map(|q| interface_param(q, &["iface", "ifname", "r2h-ifname"]))
            .transpose()?
            .flatten(),
        fcc_interface: query
            .map(|q| interface_param(q, &["r2h-ifname-fcc"]))
            .transpose()?
            .flatten(),
        fec: query.map(|q| fec_param(q, port)).transpose()?.flatten(),
        fcc: query.map(|q| fcc_params(q, group)).transpose()?.flatten(),
    })
}

/// `%3A` is an escaped `:`; udpxy's bare `%` separator is handled by `parse_endpoint`.
fn unescape_colons(s: &str) -> String {
    s.replace("%3A", ":").replace("%3a", ":")
}

fn parse_endpoint(s: &str) -> Result<(IpAddr, u16), UrlError> {
    if let Some(inner) = s.strip_prefix('[') {
        let (addr, after) = inner.split_once(']').ok_or(UrlError::Bracket)?;
        let ip = parse_ip(addr)?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((ip, parse_port(p)?)),
            None if after.is_empty() => Ok((ip, DEFAULT_PORT)),
            None => Err(UrlError::Port(echo(after))),
        };
    }
    // IPv4 (an unbracketed IPv6 literal has colons and no port).
    match s.find([':', '%', '~', '+', '-', '^']) {
        Some(at) if s[..at].parse::<std::net::Ipv4Addr>().is_ok() => {
            Ok((parse_ip(&s[..at])?, parse_port(&s[at + 1..])?))
        }
        _ => Ok((parse_ip(s)?, DEFAULT_PORT)),
    }
}

/// What of a refused value goes back in the 400: its first 64 characters (a path can be most of
/// the head limit, 64 KiB, copied into every answer otherwise).
fn echo(s: &str) -> String {
    s.chars().take(64).collect()
}

fn parse_ip(s: &str) -> Result<IpAddr, UrlError> {
    let bare = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(s);
    bare.parse().map_err(|_| UrlError::Address(echo(s)))
}

fn parse_port(s: &str) -> Result<u16, UrlError> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(UrlError::Port(echo(s))),
    }
}

fn validate(group: IpAddr, source: Option<IpAddr>) -> Result<(), UrlError> {
    if !group.is_multicast() {
        return Err(UrlError::NotMulticast(group));
    }
    if let Some(src) = source {
        let same_family = src.is_ipv4() == group.is_ipv4();
        if !same_family || src.is_multicast() || src.is_unspecified() {
            return Err(UrlError::BadSource(src));
        }
    }
    Ok(())
}

/// Finds an interface parameter (the first of `names`) in a query string; other parameters
/// (tokens, FCC) are ignored.
fn interface_param(query: &str, names: &[&str]) -> Result<Option<String>, UrlError> {
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if names.contains(&k) {
            let name = percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned();
            // IFNAMSIZ is 16 including the NUL.
            if name.is_empty() || name.len() > 15 || name.contains(['/', '\0']) {
                return Err(UrlError::Interface(echo(&name)));
            }
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// `fec=PORT`: where the group's FEC packets arrive; never the media port itself.
fn fec_param(query: &str, media_port: u16) -> Result<Option<u16>, UrlError> {
    let Some(v) = query.split('&').find_map(|pair| pair.strip_prefix("fec=")) else {
        return Ok(None);
    };
    match v.parse::<u16>() {
        Ok(p) if p > 0 && p != media_port => Ok(Some(p)),
        _ => Err(UrlError::FecPort(v.chars().take(16).collect())),
    }
}

/// `fcc=IP:PORT` and its dialect (`fcc-type=`, or tvgate's `operator=`; Telecom by default).
fn fcc_params(query: &str, group: IpAddr) -> Result<Option<(SocketAddrV4, Flavor)>, UrlError> {
    let param = |name: &str| {
        query.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            (k == name).then(|| {
                percent_encoding::percent_decode_str(v)
                    .decode_utf8_lossy()
                    .into_owned()
            })
        })
    };
    let Some(server) = param("fcc").filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let short = |v: &str| v.chars().take(32).collect::<String>();
    let server = match server.parse::<SocketAddrV4>() {
        Ok(s) if s.port() != 0 && !s.ip().is_unspecified() && !s.ip().is_multicast() => s,
        _ => return Err(UrlError::FccServer(short(&server))),
    };
    if !group.is_ipv4() {
        return Err(UrlError::FccFamily);
    }
    let flavor = match param("fcc-type").or_else(|| param("operator")) {
        None => Flavor::Telecom,
        Some(t) => Flavor::parse(&t).ok_or_else(|| UrlError::FccType(short(&t)))?,
    };
    Ok(Some((server, flavor)))
}

#[cfg(test)]
#[path = "url/tests.rs"]
mod tests;
