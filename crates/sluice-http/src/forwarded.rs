//! `X-Forwarded-For`/`-Proto`/`-Host`, `Forwarded` (RFC 7239) and `Via` for a request going upstream,
//! with trusted-proxy semantics: a chain from a trusted peer is extended, any other is replaced.
//! The other proxies' fields this proxy does not write (`X-Forwarded-Scheme`, `-Port`...) pass
//! only from a trusted peer. No I/O.

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};

const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");
const XFP: HeaderName = HeaderName::from_static("x-forwarded-proto");
const XFH: HeaderName = HeaderName::from_static("x-forwarded-host");
const FORWARDED: HeaderName = HeaderName::from_static("forwarded");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Every field [`apply`] may write or remove (`Via` only when the hop names one).
pub const FIELDS: [HeaderName; 6] = [XFF, XFP, XFH, FORWARDED, X_REAL_IP, http::header::VIA];

/// Forwarding fields other proxies write and this one does not, which frameworks believe: Rack
/// reads `X-Forwarded-Scheme` and `X-Forwarded-Ssl` before `X-Forwarded-Proto` and builds URLs
/// from `X-Forwarded-Port`, as Django does; Spring and Werkzeug prepend `X-Forwarded-Prefix`;
/// others take the host from `X-Host` or `X-Original-Host`, or HTTPS from `Front-End-Https`. No
/// cache key holds them, so a client's own would shape an answer stored for everyone (a
/// `force_ssl` redirect loop): only a trusted proxy's pass ([`strip_proxy_fields`]).
pub const PROXY_FIELDS: [HeaderName; 8] = [
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-host"),
    HeaderName::from_static("x-original-host"),
    HeaderName::from_static("front-end-https"),
];

/// Whether `name` (lowercase) is one of [`PROXY_FIELDS`].
pub fn is_proxy_field(name: &str) -> bool {
    proxy_field_index(name).is_some()
}

/// `name`'s place in [`PROXY_FIELDS`]. (A match on the text: searching the constant array would
/// build and drop it at every use.)
fn proxy_field_index(name: &str) -> Option<usize> {
    Some(match name {
        "x-forwarded-scheme" => 0,
        "x-forwarded-port" => 1,
        "x-forwarded-ssl" => 2,
        "x-forwarded-prefix" => 3,
        "x-forwarded-server" => 4,
        "x-host" => 5,
        "x-original-host" => 6,
        "front-end-https" => 7,
        _ => return None,
    })
}

/// Removes [`PROXY_FIELDS`] from a head that did not come from a trusted proxy. One pass over the
/// names finds them (a head rarely has any) instead of a hashed removal of each.
pub fn strip_proxy_fields(headers: &mut HeaderMap) {
    crate::fields::remove_listed(headers, &PROXY_FIELDS, proxy_field_index);
}

/// What the proxy knows about the downstream side of this hop.
#[derive(Debug, Clone)]
pub struct Hop<'a> {
    /// The address of the peer that connected to us.
    pub peer: IpAddr,
    /// Whether that peer is a trusted proxy (its forwarding headers are believed and extended).
    pub trusted: bool,
    /// The client as this proxy determined it (the peer, or from a trusted proxy's
    /// `X-Forwarded-For`); `None` when unknown. It alone sets `X-Real-IP`: a client's own value
    /// never passes.
    pub client: Option<IpAddr>,
    /// `https` when the downstream connection used TLS.
    pub proto: &'static str,
    /// The `Host` the client asked for.
    pub host: Option<&'a str>,
    /// `host` as a field value already made (the client's own `Host` field, when that is where
    /// `host` came from): `X-Forwarded-Host` shares it instead of copying `host`. It must hold
    /// the same text as `host`.
    pub host_value: Option<HeaderValue>,
    /// Also write a `Forwarded` header.
    pub forwarded: bool,
    /// This proxy's `Via` pseudonym and the downstream protocol version (`1.1`, `2`).
    pub via: Option<(&'static str, &'static str)>,
}

/// Whether `name` is one of the fields [`apply`] writes or removes ([`FIELDS`]).
pub fn is_forwarding_field(name: &str) -> bool {
    matches!(
        name,
        "x-forwarded-for"
            | "x-forwarded-proto"
            | "x-forwarded-host"
            | "forwarded"
            | "x-real-ip"
            | "via"
    )
}

/// This hop's forwarding fields for a head that has none of them ([`is_forwarding_field`]) and no
/// `Forwarded` to write: the fields [`apply`] would append to it, in its order, kept aside so that
/// a head encoder writes them straight after the head's other fields ([`Fresh::each`]) instead of
/// values being made and inserted into the map ([`Fresh::add_to`] does that for a head that is not
/// encoded so).
#[derive(Debug, Clone)]
pub struct Fresh {
    peer: IpAddr,
    /// Whether the peer is a trusted proxy: its [`PROXY_FIELDS`] stay ([`Fresh::add_to`]).
    trusted: bool,
    client: Option<IpAddr>,
    proto: &'static str,
    host: Option<FreshHost>,
    via: Option<(&'static str, &'static str)>,
}

/// The `X-Forwarded-Host` text of a [`Fresh`]: a value or an authority the request already holds
/// (a clone shares its bytes).
#[derive(Debug, Clone)]
pub enum FreshHost {
    /// The client's own `Host` field.
    Value(HeaderValue),
    /// The authority of the request's target.
    Authority(http::uri::Authority),
}

impl FreshHost {
    fn bytes(&self) -> &[u8] {
        match self {
            FreshHost::Value(v) => v.as_bytes(),
            FreshHost::Authority(a) => a.as_str().as_bytes(),
        }
    }

    fn text(&self) -> &str {
        // Only kept when its bytes are the hop's host text ([`Fresh::new`]).
        std::str::from_utf8(self.bytes()).unwrap_or_default()
    }
}

impl Fresh {
    /// The fields `hop` adds to a head without forwarding fields, with `host` holding
    /// `hop.host`'s text. `None` when they cannot be kept aside: `hop` writes `Forwarded`, or
    /// `host` does not hold `hop.host`'s text.
    pub fn new(hop: &Hop<'_>, host: Option<FreshHost>) -> Option<Fresh> {
        if hop.forwarded {
            return None;
        }
        let host = match (hop.host, host) {
            (None, _) => None,
            (Some(h), Some(given)) if given.bytes() == h.as_bytes() && !h.is_empty() => Some(given),
            _ => return None,
        };
        Some(Fresh {
            peer: hop.peer,
            trusted: hop.trusted,
            client: hop.client,
            proto: hop.proto,
            host,
            via: hop.via,
        })
    }

    /// Calls `field` with each field's name and value, in the order [`apply`] appends them.
    pub fn each(&self, mut field: impl FnMut(&'static str, &[u8])) {
        let mut text = IpText::default();
        field("x-forwarded-for", text.bytes_of(self.peer));
        field("x-forwarded-proto", self.proto.as_bytes());
        if let Some(h) = &self.host {
            field("x-forwarded-host", h.bytes());
        }
        if let Some(ip) = self.client {
            field("x-real-ip", text.bytes_of(ip));
        }
        if let Some((name, version)) = self.via {
            let mut buf = [0u8; 64];
            let (v, n) = (version.as_bytes(), name.as_bytes());
            let len = v.len() + 1 + n.len();
            if len <= buf.len() {
                buf[..v.len()].copy_from_slice(v);
                buf[v.len()] = b' ';
                buf[v.len() + 1..len].copy_from_slice(n);
                field("via", &buf[..len]);
            } else {
                field("via", format!("{version} {name}").as_bytes());
            }
        }
    }

    /// Adds the fields to `headers` (a head without forwarding fields) as [`apply`] would have.
    pub fn add_to(&self, headers: &mut HeaderMap) {
        let host_value = match &self.host {
            Some(FreshHost::Value(v)) => Some(v.clone()),
            _ => None,
        };
        apply(
            headers,
            &Hop {
                peer: self.peer,
                trusted: self.trusted,
                client: self.client,
                proto: self.proto,
                host: self.host.as_ref().map(FreshHost::text),
                host_value,
                forwarded: false,
                via: self.via,
            },
        );
    }
}

/// Rewrites the forwarding headers of an outgoing request in place (and, from a peer that is not
/// a trusted proxy, removes [`PROXY_FIELDS`]).
pub fn apply(headers: &mut HeaderMap, hop: &Hop<'_>) {
    if !hop.trusted {
        strip_proxy_fields(headers);
    }
    let mut peer_text = IpText::default();
    peer_text.of(hop.peer);
    let peer = peer_text.text();
    // The prior chains are read only where they are extended (a trusted peer).
    let prior_fwd = if hop.trusted && hop.forwarded {
        joined(headers, &FORWARDED)
    } else {
        None
    };
    // The peer's own value, when it is `X-Forwarded-For` whole, serves `X-Real-IP` too.
    let mut peer_value = None;
    if hop.trusted {
        let xff = match joined(headers, &XFF) {
            Some(chain) if !chain.trim().is_empty() => format!("{chain}, {peer}"),
            _ => peer.to_string(),
        };
        // A trusted proxy in front already said what the client used; keep it.
        let xfp = text(headers, &XFP);
        let xfh = text(headers, &XFH).or_else(|| hop.host.map(str::to_string));
        set(headers, XFF, &xff);
        match xfp {
            Some(p) => set(headers, XFP, &p),
            None => set_proto(headers, hop.proto),
        }
        set_host(headers, xfh.as_deref());
    } else {
        // The common case on the request path: no joined strings, the proto without a copy, the
        // peer's text in one allocation that `X-Real-IP` shares.
        match peer_text.value() {
            Ok(v) => {
                headers.insert(XFF, v.clone());
                peer_value = Some(v);
            }
            Err(_) => {
                headers.remove(XFF);
            }
        }
        set_proto(headers, hop.proto);
        match &hop.host_value {
            Some(v) => {
                headers.insert(XFH, v.clone());
            }
            None => set_host(headers, hop.host),
        }
    }
    match hop.client {
        Some(ip) if ip == hop.peer => match peer_value {
            Some(v) => {
                headers.insert(X_REAL_IP, v);
            }
            None => set(headers, X_REAL_IP, peer),
        },
        Some(ip) => set(headers, X_REAL_IP, IpText::default().of(ip)),
        None => {
            headers.remove(X_REAL_IP);
        }
    }
    headers.remove(FORWARDED);
    if hop.forwarded {
        let mut element = format!("for={}", node(hop.peer));
        if let Some(h) = hop.host {
            element.push_str(&format!(";host={}", quoted(h)));
        }
        element.push_str(&format!(";proto={}", hop.proto));
        let value = match prior_fwd {
            Some(prior) if hop.trusted && !prior.trim().is_empty() => format!("{prior}, {element}"),
            _ => element,
        };
        set(headers, FORWARDED, &value);
    }
    if let Some((name, version)) = hop.via {
        let mine = format!("{version} {name}");
        let value = match joined(headers, &http::header::VIA) {
            Some(prior) if !prior.trim().is_empty() => format!("{prior}, {mine}"),
            _ => mine,
        };
        set(headers, http::header::VIA, &value);
    }
}

/// What the fields [`apply`] sends up tell an origin of the client's scheme and host beyond this
/// hop's own (`hop.proto`, `hop.host`), as text for a cache key; `None` when they tell nothing
/// more. Only a trusted peer's fields pass (any other peer's are replaced by the hop's own), and
/// an origin builds redirects and absolute URLs from them (`force_ssl`'s `301`, a page linking
/// to `X-Forwarded-Host`): keyed on route, host and target alone, an answer made for one scheme
/// or host was stored and served for the others. The text holds the `X-Forwarded-Proto` and
/// `X-Forwarded-Host` values `apply` keeps (the host in lower case, as the key's own), the
/// `proto` and `host` parameters of the `Forwarded` chain it extends, and the other proxies'
/// fields ([`PROXY_FIELDS`], but for `X-Forwarded-Server`) that pass; each value prefixed by its length, so no value can reach
/// into another. [`claimed_text`] writes the first two.
pub fn claimed_scope(headers: &HeaderMap, hop: &Hop<'_>) -> Option<String> {
    if !hop.trusted {
        return None;
    }
    // As `apply` reads them: the first line, when it is text.
    let value = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let proto = value(&XFP).unwrap_or(hop.proto);
    let host = value(&XFH).or(hop.host);
    let mut rest = String::new();
    if hop.forwarded {
        for line in headers.get_all(&FORWARDED) {
            let Ok(line) = line.to_str() else { continue };
            for pair in line.split([',', ';']) {
                let Some((name, v)) = pair.split_once('=') else {
                    continue;
                };
                let name = name.trim().to_ascii_lowercase();
                // A value equal to this hop's own tells the origin nothing more (the chain of a
                // peer in front that saw the same scheme and host): keyed on, it split the cache
                // from requests that came without one.
                let own = match name.as_str() {
                    "proto" => Some(hop.proto),
                    "host" => hop.host,
                    _ => continue,
                };
                let bare = v.trim().trim_matches('"');
                if own.is_some_and(|o| o.eq_ignore_ascii_case(bare)) {
                    continue;
                }
                {
                    push_field(&mut rest, name.as_bytes());
                    push_field(&mut rest, v.trim().as_bytes());
                }
            }
        }
    }
    // `X-Forwarded-Server` names the balancer instance (Traefik sends its host name), not the
    // client's scheme or host: keyed on, every replica of a front end would split the cache.
    for name in PROXY_FIELDS
        .into_iter()
        .filter(|n| n != "x-forwarded-server")
    {
        for v in headers.get_all(&name) {
            push_field(&mut rest, name.as_str().as_bytes());
            push_field(&mut rest, v.as_bytes());
        }
    }
    let same_host = match (host, hop.host) {
        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
        (a, b) => a.is_none() && b.is_none(),
    };
    if proto == hop.proto && same_host && rest.is_empty() {
        return None;
    }
    let mut text = claimed_text(proto, host);
    text.push_str(&rest);
    Some(text)
}

/// The start of a [`claimed_scope`]: `proto` and `host` (lower case; `-` when there is none),
/// each prefixed by its length. A cache that drops what was stored for a target writes the
/// scopes a trusted peer usually makes (the other scheme, the same host) with it.
pub fn claimed_text(proto: &str, host: Option<&str>) -> String {
    let mut text = String::new();
    push_field(&mut text, proto.as_bytes());
    match host {
        Some(h) => push_field(&mut text, h.to_ascii_lowercase().as_bytes()),
        None => text.push('-'),
    }
    text
}

/// Appends `<length>:<bytes>` to a key's text, any byte that is not visible ASCII (or is `%`)
/// written `%XX`: a field value need not be text, and two values never make the same text.
fn push_field(out: &mut String, bytes: &[u8]) {
    use std::fmt::Write;
    let mut field = String::with_capacity(bytes.len());
    for &b in bytes {
        if (b.is_ascii_graphic() && b != b'%') || b == b' ' {
            field.push(char::from(b));
        } else {
            let _ = write!(field, "%{b:02X}");
        }
    }
    let _ = write!(out, "{}:{field}", field.len());
}

/// An address's text, written into a buffer on the stack: `Display` for `IpAddr` goes through the
/// formatting machinery and a `String` (most of this module's cost per request when it did). IPv4
/// is written by hand; IPv6, rarer, still through `Display`, into the same buffer.
#[derive(Clone, Copy)]
struct IpText {
    buf: [u8; 46],
    len: usize,
}

impl AsRef<[u8]> for IpText {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Default for IpText {
    fn default() -> IpText {
        IpText {
            buf: [0; 46],
            len: 0,
        }
    }
}

impl IpText {
    /// The address as `Display` writes it (dotted decimal; RFC 5952 for IPv6).
    fn of(&mut self, ip: IpAddr) -> &str {
        self.bytes_of(ip);
        self.text()
    }

    /// [`IpText::of`] as bytes, for a head's encoder (no check that they are text).
    fn bytes_of(&mut self, ip: IpAddr) -> &[u8] {
        self.len = 0;
        match ip {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        self.push(b'.');
                    }
                    if octet >= 100 {
                        self.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        self.push(b'0' + octet / 10 % 10);
                    }
                    self.push(b'0' + octet % 10);
                }
            }
            IpAddr::V6(v6) => {
                use std::io::Write;
                let mut cursor = std::io::Cursor::new(&mut self.buf[..]);
                // 45 characters at most (an IPv4-mapped form): it always fits.
                let _ = write!(cursor, "{v6}");
                self.len = cursor.position() as usize;
            }
        }
        &self.buf[..self.len]
    }

    /// The text written last.
    fn text(&self) -> &str {
        // Only ASCII digits, dots, colons and hex digits were written.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }

    /// The text written last, as a field value whose clones share one allocation (a value made
    /// from a copied `Vec` allocates again at its first clone).
    fn value(&self) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
        HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(*self))
    }

    fn push(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }
}

/// A `Forwarded` node: IPv6 addresses are bracketed and quoted (RFC 7239 §6).
fn node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// A token when it is one, else a quoted string.
fn quoted(v: &str) -> String {
    let token = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if token {
        v.to_string()
    } else {
        let escaped: String = v
            .chars()
            .flat_map(|c| match c {
                '"' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        format!("\"{escaped}\"")
    }
}

fn text(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// All values of a header joined with `, ` (visible ASCII only; anything else is dropped).
fn joined(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    let parts: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// `X-Forwarded-Host` from this hop's host, or none when the client sent no host.
fn set_host(headers: &mut HeaderMap, host: Option<&str>) {
    match host {
        Some(h) => set(headers, XFH, h),
        None => {
            headers.remove(XFH);
        }
    }
}

/// `X-Forwarded-Proto`; the two usual values need no copy.
fn set_proto(headers: &mut HeaderMap, proto: &str) {
    match proto {
        "http" => {
            headers.insert(XFP, HeaderValue::from_static("http"));
        }
        "https" => {
            headers.insert(XFP, HeaderValue::from_static("https"));
        }
        other => set(headers, XFP, other),
    }
}

fn set(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    match HeaderValue::from_str(value) {
        Ok(v) => {
            headers.insert(name, v);
        }
        Err(_) => {
            headers.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(trusted: bool) -> Hop<'static> {
        Hop {
            peer: "10.0.0.2".parse().unwrap(),
            trusted,
            client: Some("10.0.0.2".parse().unwrap()),
            proto: "http",
            host: Some("example.com"),
            host_value: None,
            forwarded: true,
            via: Some(("sluice", "1.1")),
        }
    }

    fn with(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_given_host_value_makes_the_same_fields() {
        for trusted in [false, true] {
            let start = with(&[("x-forwarded-host", "old"), ("accept", "*/*")]);
            let (mut copied, mut shared) = (start.clone(), start);
            apply(&mut copied, &hop(trusted));
            let given = Hop {
                host_value: Some(HeaderValue::from_static("example.com")),
                ..hop(trusted)
            };
            apply(&mut shared, &given);
            let fields = |h: &HeaderMap| {
                h.iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(fields(&copied), fields(&shared), "trusted: {trusted}");
        }
    }

    #[test]
    fn untrusted_peer_chain_is_replaced() {
        let mut h = with(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil"),
            ("forwarded", "for=1.2.3.4"),
            ("x-real-ip", "6.6.6.6"),
        ]);
        apply(&mut h, &hop(false));
        assert_eq!(h["x-real-ip"], "10.0.0.2");
        let mut unknown = h.clone();
        apply(
            &mut unknown,
            &Hop {
                client: None,
                ..hop(false)
            },
        );
        assert!(unknown.get("x-real-ip").is_none());
        assert_eq!(h["x-forwarded-for"], "10.0.0.2");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "example.com");
        assert_eq!(h["forwarded"], "for=10.0.0.2;host=example.com;proto=http");
        assert_eq!(h["via"], "1.1 sluice");
    }

    #[test]
    fn trusted_peer_chain_is_extended() {
        let mut h = with(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-for", "5.6.7.8"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=1.2.3.4"),
            ("via", "1.1 edge"),
        ]);
        apply(&mut h, &hop(true));
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 5.6.7.8, 10.0.0.2");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(
            h["forwarded"],
            "for=1.2.3.4, for=10.0.0.2;host=example.com;proto=http"
        );
        assert_eq!(h["via"], "1.1 edge, 1.1 sluice");
    }

    #[test]
    fn ipv6_and_odd_hosts_are_quoted() {
        let mut h = HeaderMap::new();
        let mut hp = hop(false);
        hp.peer = "::1".parse().unwrap();
        hp.host = Some("[::1]:8080");
        apply(&mut h, &hp);
        assert_eq!(
            h["forwarded"],
            "for=\"[::1]\";host=\"[::1]:8080\";proto=http"
        );
    }

    proptest::proptest! {
        /// The hand-written address text is exactly `Display`'s, for any address.
        #[test]
        fn address_text_is_displays(bits in proptest::prelude::any::<u32>(), six in proptest::prelude::any::<u128>()) {
            let v4 = IpAddr::from(std::net::Ipv4Addr::from(bits));
            proptest::prop_assert_eq!(IpText::default().of(v4).to_string(), v4.to_string());
            let v6 = IpAddr::from(std::net::Ipv6Addr::from(six));
            proptest::prop_assert_eq!(IpText::default().of(v6).to_string(), v6.to_string());
            let mapped = IpAddr::from(std::net::Ipv4Addr::from(bits).to_ipv6_mapped());
            proptest::prop_assert_eq!(IpText::default().of(mapped).to_string(), mapped.to_string());
        }
    }

    #[test]
    fn address_text_edges() {
        for a in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.0.2",
            "100.9.90.199",
            "::",
            "::1",
            "::ffff:255.255.255.255",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            let ip: IpAddr = a.parse().unwrap();
            assert_eq!(IpText::default().of(ip), a);
        }
    }

    #[test]
    fn untrusted_head_is_exact() {
        // The fields and values a plain request from a direct client gets, in order.
        let mut h = with(&[("accept", "*/*"), ("x-real-ip", "6.6.6.6")]);
        let mut hp = hop(false);
        hp.peer = "127.0.0.1".parse().unwrap();
        hp.client = Some(hp.peer);
        hp.forwarded = false;
        hp.via = None;
        apply(&mut h, &hp);
        let got: Vec<(String, String)> = h
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        let want = [
            ("accept", "*/*"),
            ("x-real-ip", "127.0.0.1"),
            ("x-forwarded-for", "127.0.0.1"),
            ("x-forwarded-proto", "http"),
            ("x-forwarded-host", "example.com"),
        ];
        assert_eq!(
            got,
            want.map(|(k, v)| (k.to_string(), v.to_string())).to_vec()
        );
    }

    #[test]
    fn fields_kept_aside_are_the_ones_apply_appends() {
        let authority = http::uri::Authority::from_static("example.com");
        let value = HeaderValue::from_static("example.com");
        let hosts = [
            None,
            Some(FreshHost::Value(value.clone())),
            Some(FreshHost::Authority(authority.clone())),
        ];
        for peer in ["10.0.0.2", "::1", "::ffff:1.2.3.4"] {
            for client in [None, Some(peer), Some("192.0.2.7")] {
                for via in [None, Some(("sluice", "2"))] {
                    for (i, given) in hosts.iter().enumerate() {
                        for trusted in [false, true] {
                            let hp = Hop {
                                peer: peer.parse().unwrap(),
                                trusted,
                                client: client.map(|c| c.parse().unwrap()),
                                proto: "https",
                                host: (i > 0).then_some("example.com"),
                                host_value: (i == 1).then(|| value.clone()),
                                forwarded: false,
                                via,
                            };
                            let start = with(&[("accept", "*/*"), ("x-other", "1")]);
                            let mut applied = start.clone();
                            apply(&mut applied, &hp);
                            let fresh = Fresh::new(&hp, given.clone()).unwrap();
                            let mut added = start.clone();
                            fresh.add_to(&mut added);
                            let fields = |h: &HeaderMap| {
                                h.iter()
                                    .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
                                    .collect::<Vec<_>>()
                            };
                            assert_eq!(fields(&applied), fields(&added));
                            let mut each = fields(&start);
                            fresh.each(|name, value| each.push((name.to_string(), value.to_vec())));
                            assert_eq!(fields(&applied), each, "{peer} {client:?} {via:?} {i}");
                        }
                    }
                }
            }
        }
        // `Forwarded` is not kept aside, nor a host the given text is not.
        let hp = hop(false);
        assert!(Fresh::new(&hp, Some(FreshHost::Value(value.clone()))).is_none());
        let hp = Hop {
            forwarded: false,
            ..hop(false)
        };
        assert!(Fresh::new(&hp, None).is_none());
        assert!(Fresh::new(
            &hp,
            Some(FreshHost::Value(HeaderValue::from_static("other")))
        )
        .is_none());
        assert!(Fresh::new(&hp, Some(FreshHost::Authority(authority))).is_some());
    }

    /// A cache keys on what a trusted peer tells the origin of the scheme and host beyond this
    /// hop's own: a balancer's `X-Forwarded-Proto: http` for its plain clients and `https` for
    /// the others made two answers (a `force_ssl` redirect for one), stored under one key.
    #[test]
    fn a_trusted_peers_scheme_and_host_make_a_scope() {
        let plain = Hop {
            forwarded: false,
            ..hop(true)
        };
        let scope = |pairs: &[(&str, &str)], hop: &Hop<'_>| claimed_scope(&with(pairs), hop);
        // Nothing beyond the hop's own: no scope, the key stays as it was.
        assert_eq!(scope(&[], &plain), None);
        assert_eq!(scope(&[("x-forwarded-proto", "http")], &plain), None);
        assert_eq!(scope(&[("x-forwarded-host", "Example.COM")], &plain), None);
        // A client's own fields are replaced, whatever they say.
        let untrusted = Hop {
            trusted: false,
            ..plain.clone()
        };
        let forged = [
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil"),
            ("x-forwarded-port", "443"),
        ];
        assert_eq!(scope(&forged, &untrusted), None);
        // Another scheme, another host, or both: three scopes, none the plain key.
        let https = scope(&[("x-forwarded-proto", "https")], &plain).unwrap();
        assert_eq!(https, "5:https11:example.com");
        assert_eq!(https, claimed_text("https", Some("example.com")));
        let other = scope(&[("x-forwarded-host", "Other.test")], &plain).unwrap();
        assert_eq!(other, "4:http10:other.test");
        let both = scope(
            &[
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "other.test"),
            ],
            &plain,
        )
        .unwrap();
        assert!(https != other && other != both && both != https);
        // The other proxies' fields that pass, and a `Forwarded` chain's scheme and host when
        // it is extended (not its `for`, which would split the cache per client).
        assert_eq!(scope(&[("x-forwarded-server", "traefik-7")], &plain), None);
        let port = scope(&[("x-forwarded-port", "443")], &plain).unwrap();
        assert_eq!(port, "4:http11:example.com16:x-forwarded-port3:443");
        let chain = |v: &'static str| scope(&[("forwarded", v)], &hop(true));
        assert_eq!(chain("for=1.2.3.4"), None);
        assert_eq!(chain("for=1.2.3.4"), chain("for=5.6.7.8"));
        assert_ne!(
            chain("for=1.2.3.4;proto=https"),
            chain("for=1.2.3.4;proto=http")
        );
        // The hop's own scheme and host in the chain tell nothing more.
        assert_eq!(chain("for=1.2.3.4;proto=http"), None);
        assert_eq!(chain("for=1.2.3.4;proto=HTTP;host=\"Example.com\""), None);
        assert_eq!(
            chain("for=1.2.3.4;Proto=https").unwrap(),
            "4:http11:example.com5:proto5:https"
        );
        // No host at all is not an empty one; a value's bytes cannot reach into the next.
        let hostless = Hop {
            host: None,
            ..plain.clone()
        };
        assert_eq!(scope(&[], &hostless), None);
        assert_ne!(
            scope(&[("x-forwarded-host", "")], &hostless),
            scope(&[("x-forwarded-proto", "https")], &hostless)
        );
        assert_ne!(
            scope(&[("x-forwarded-host", "a4:b")], &plain),
            scope(
                &[("x-forwarded-host", "a"), ("x-forwarded-port", "b")],
                &plain
            )
        );
    }

    #[test]
    fn forwarding_field_names() {
        for name in FIELDS {
            assert!(is_forwarding_field(name.as_str()));
        }
        assert!(!is_forwarding_field("x-forwarded-port"));
    }

    #[test]
    fn no_forwarded_unless_asked() {
        let mut h = with(&[("forwarded", "for=9.9.9.9")]);
        let mut hp = hop(false);
        hp.forwarded = false;
        hp.via = None;
        apply(&mut h, &hp);
        assert!(h.get("forwarded").is_none());
        assert!(h.get("via").is_none());
    }

    /// Another proxy's fields that frameworks read (`X-Forwarded-Scheme`: Rack's scheme) go from
    /// a client's head, and stay in a trusted proxy's.
    #[test]
    fn other_proxies_fields_pass_only_from_a_trusted_peer() {
        let names = PROXY_FIELDS;
        let mut pairs: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "x")).collect();
        pairs.push(("X-Forwarded-Scheme", "http"));
        pairs.push(("accept", "*/*"));
        for name in PROXY_FIELDS {
            assert!(is_proxy_field(name.as_str()));
            assert!(!is_forwarding_field(name.as_str()));
        }
        assert!(!is_proxy_field("x-forwarded-proto"));
        let mut untrusted = with(&pairs);
        apply(&mut untrusted, &hop(false));
        for name in PROXY_FIELDS {
            assert!(untrusted.get(&name).is_none(), "{name} passed");
        }
        assert_eq!(untrusted["accept"], "*/*");
        let mut trusted = with(&pairs);
        apply(&mut trusted, &hop(true));
        for name in PROXY_FIELDS {
            assert!(trusted.get(&name).is_some(), "{name} lost");
        }
        assert_eq!(trusted.get_all("x-forwarded-scheme").iter().count(), 2);
        // Alone, the strip leaves any other field.
        let mut h = with(&[("x-host", "evil"), ("host", "good")]);
        strip_proxy_fields(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["host"], "good");
    }
}
