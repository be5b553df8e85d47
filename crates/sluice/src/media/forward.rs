//! `/proxy/forward`: any HTTP request relayed to `d` from sluice's own address (MediaFlow's
//! transparent relay for debrid APIs), its body streamed both ways under byte caps.
//!
//! The upstream request carries the method, the body, a few of the client's content headers and
//! the `h_*` headers, never the client's address (no `X-Forwarded-For` or the like, whatever
//! `h_*` asks). `{mediaflow_ip}` in `d`, or in a body small enough to be read ahead, becomes the
//! address `/proxy/ip` reports. Private destinations are refused by the upstream client's address
//! guard (`upstream.allow_private`), and `[media.forward]` may narrow the hosts further: for `d`
//! and for every redirect the relay would follow, each refused alike.

pub mod body;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::body::Incoming;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use sluice_http::route::HostPattern;
use url::Url;

use self::body::{read_ahead, Capped, Held, Idle, Late, Stalled, TooLarge, Watch};
use crate::body::{self as bodies, Body};
use crate::error::ProxyError;
use crate::request::RequestContext;
use crate::upstream::relay::RelayBody;
use crate::upstream::{UpstreamError, UpstreamRequest};

/// MediaFlow's placeholder for the proxy's public address.
pub const IP_PLACEHOLDER: &str = "{mediaflow_ip}";

/// Request bodies up to this size are read whole before the upstream request starts, so the
/// placeholder can be replaced in them and a redirect can replay them.
const READ_AHEAD_BYTES: usize = 64 * 1024;

/// Client request headers relayed upstream (besides `h_*`): what describes the body and what the
/// caller accepts. Never `Authorization` or `Cookie`: a browser sends those for sluice itself.
const CLIENT_HEADERS: &[HeaderName] = &[
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::ACCEPT,
    header::ACCEPT_LANGUAGE,
    header::RANGE,
    header::IF_RANGE,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
];

/// Headers that would tell the upstream who the caller is: never sent, not even through `h_*`.
const IP_DISCLOSURE: &[&str] = &[
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "x-client-ip",
    "true-client-ip",
    "forwarded",
    "cf-connecting-ip",
    "x-original-forwarded-for",
    "x-cluster-client-ip",
    "via",
];

/// `[media.forward]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ForwardConfig {
    /// Serve `/proxy/forward`.
    pub enabled: bool,
    /// When not empty, only these hosts (`host` or `*.domain`, every subdomain) may be forwarded to.
    pub allowed_hosts: Vec<String>,
    /// Hosts never forwarded to, in the same form.
    pub denied_hosts: Vec<String>,
    /// Largest request body relayed, in bytes; past it the answer is 413.
    pub max_request_bytes: u64,
    /// Largest response body relayed, in bytes: a larger declared length is a 502, and a body
    /// that grows past it is cut off.
    pub max_response_bytes: u64,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        ForwardConfig {
            enabled: true,
            allowed_hosts: Vec::new(),
            denied_hosts: Vec::new(),
            // MediaFlow's limits: torrent and NZB uploads in, API answers out.
            max_request_bytes: 50 * 1024 * 1024,
            max_response_bytes: 10 * 1024 * 1024,
        }
    }
}

impl ForwardConfig {
    /// Checks the values before anything binds.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (key, list) in [
            ("allowed_hosts", &self.allowed_hosts),
            ("denied_hosts", &self.denied_hosts),
        ] {
            for h in list {
                HostPattern::parse(h).map_err(|e| anyhow::anyhow!("media.forward.{key}: {e}"))?;
            }
        }
        if self.max_request_bytes == 0 || self.max_response_bytes == 0 {
            anyhow::bail!("media.forward.max_request_bytes and max_response_bytes must be above 0");
        }
        Ok(())
    }
}

/// The relay, built from its config.
pub struct Forward {
    config: ForwardConfig,
    allowed: Vec<HostPattern>,
    denied: Vec<HostPattern>,
}

impl Forward {
    pub fn new(config: &ForwardConfig) -> Self {
        let parse = |list: &[String]| {
            list.iter()
                .filter_map(|h| HostPattern::parse(h).ok())
                .collect()
        };
        Forward {
            allowed: parse(&config.allowed_hosts),
            denied: parse(&config.denied_hosts),
            config: config.clone(),
        }
    }

    /// Relays one request.
    pub async fn serve(
        &self,
        media: &super::Media,
        req: Request<Incoming>,
        ctx: &RequestContext,
    ) -> Result<Response<Body>, ProxyError> {
        if !self.config.enabled {
            return Err(ProxyError::downstream(
                StatusCode::NOT_FOUND,
                "not_found",
                "/proxy/forward is turned off (media.forward.enabled)",
            ));
        }
        let method = req.method().clone();
        if !matches!(
            method.as_str(),
            "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS"
        ) {
            return Err(ProxyError::downstream(
                StatusCode::METHOD_NOT_ALLOWED,
                "method",
                "/proxy/forward relays GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS",
            ));
        }
        let params = super::stream::parse_params(ctx)?;
        let mut url = params.destination.clone();
        if has_placeholder(url.as_str()) {
            let ip = media.public_ip.lookup().await?.to_string();
            url = replace_in_url(&url, &ip)?;
        }
        self.check_host(&url)?;
        self.check_virtual_host(&params.request_headers)?;
        let headers = request_headers(req.headers(), &params.request_headers)?;
        let declared = declared_length(req.headers())?;
        if declared.is_some_and(|n| n > self.config.max_request_bytes) {
            return Err(too_large(self.config.max_request_bytes));
        }
        let over = Arc::new(AtomicBool::new(false));
        let (parts, incoming) = req.into_parts();
        // The client's body under the upstream idle deadline, read ahead and streamed alike:
        // nothing else bounds a client that declares a length and then goes silent. The part
        // read ahead is a body held whole, so it also has `upstream.whole_body_timeout_secs`
        // (120 s by default: 64 KiB at 550 bytes a second) to arrive; past the read-ahead, the
        // upstream's header timeout counts the upload.
        let idle = media.upstream.idle_read_timeout();
        let total = media.upstream.whole_body_timeout();
        let watch = Arc::new(Watch::default());
        let incoming = Idle::new(incoming, idle, watch.clone());
        let max = self.config.max_request_bytes;
        let body = match read_ahead(incoming, READ_AHEAD_BYTES, max, total).await {
            Ok(Held::Whole(bytes)) if bytes.is_empty() => RelayBody::Empty,
            Ok(Held::Whole(bytes)) => RelayBody::Whole(self.fill(media, bytes).await?),
            Ok(Held::Partial(head, rest)) => RelayBody::Stream(bodies::boxed(Capped::new(
                Some(head),
                rest,
                self.config.max_request_bytes,
                over.clone(),
            ))),
            Err(e) if e.is::<TooLarge>() => return Err(too_large(max)),
            Err(e) if e.is::<Stalled>() => return Err(stalled(idle)),
            Err(e) if e.is::<Late>() => return Err(late(total)),
            Err(e) => {
                return Err(ProxyError::downstream(
                    StatusCode::BAD_REQUEST,
                    "request_body",
                    format!("reading the request body failed: {e}"),
                ))
            }
        };
        let mut headers = headers;
        if let (RelayBody::Stream(_), Some(n)) = (&body, declared) {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        let up = media
            .upstream
            .relay(
                UpstreamRequest {
                    method: parts.method,
                    url,
                    headers,
                },
                body,
                &|next| self.allows(next),
            )
            .await
            .map_err(|e| match e {
                _ if over.load(Ordering::Relaxed) => too_large(self.config.max_request_bytes),
                // A streamed body the client stopped sending is the client's failure, and so is
                // one still waiting for the client when the upstream's header timeout ran out
                // (that timeout counts the upload): neither is booked to the upstream. The
                // second need not have been idle at all (a steady upload longer than the
                // timeout), so it says which deadline it met.
                _ if watch.stalled() => stalled(idle),
                UpstreamError::HeaderTimeout { secs, .. } if watch.waiting() => unfinished(secs),
                UpstreamError::RedirectRefused { host } => refused(&host),
                e => ProxyError::from_upstream(&e),
            })?;
        let max = self.config.max_response_bytes;
        // A `Content-Length` beside `Transfer-Encoding` declares nothing (RFC 9112 6.3): the
        // chunks frame the body, and the cap counts them as they come.
        let framed_by_chunks = up.headers.contains_key(header::TRANSFER_ENCODING);
        if !framed_by_chunks
            && declared_length(&up.headers)
                .ok()
                .flatten()
                .is_some_and(|n| n > max)
        {
            return Err(ProxyError::new(
                crate::error::Side::Upstream,
                StatusCode::BAD_GATEWAY,
                "response_too_large",
                format!(
                    "the upstream answer is larger than media.forward.max_response_bytes ({max})"
                ),
            ));
        }
        let mut resp = Response::new(bodies::boxed(Capped::new(
            None,
            up.body,
            max,
            Arc::new(AtomicBool::new(false)),
        )));
        *resp.status_mut() = up.status;
        relay_response_headers(&up.headers, up.status, resp.headers_mut());
        super::stream::apply_params(&params, resp.headers_mut())?;
        Ok(resp)
    }

    /// `d`'s host against `allowed_hosts` and `denied_hosts`.
    fn check_host(&self, url: &Url) -> Result<(), ProxyError> {
        match self.allows(url) {
            true => Ok(()),
            false => Err(refused(url.host_str().unwrap_or(""))),
        }
    }

    /// `h_host`, the site the upstream is asked for, against the same lists: before, `d` on an
    /// allowed host (or an address, which `denied_hosts` does not name) with `h_host` naming
    /// another site reached that site's virtual host. (A redirect is asked for without it.)
    fn check_virtual_host(&self, headers: &[(String, String)]) -> Result<(), ProxyError> {
        if self.allowed.is_empty() && self.denied.is_empty() {
            return Ok(());
        }
        for (_, value) in headers.iter().filter(|(name, _)| name == "host") {
            let authority = value.trim().parse::<http::uri::Authority>().map_err(|_| {
                ProxyError::downstream(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("`h_host` is not a host: `{value}`"),
                )
            })?;
            if !self.allows_host(authority.host()) {
                return Err(refused(authority.host()));
            }
        }
        Ok(())
    }

    /// Whether `url`'s host passes `allowed_hosts` and `denied_hosts`: `d`, and every redirect.
    fn allows(&self, url: &Url) -> bool {
        self.allows_host(url.host_str().unwrap_or(""))
    }

    /// Whether a host (a name or an address, an IPv6 one with or without brackets) passes the lists.
    fn allows_host(&self, host: &str) -> bool {
        let host = bare(host);
        // An IPv4 address written IPv4-mapped (`[::ffff:1.2.3.4]`) is that IPv4 address: the
        // lists name it one way only.
        let mapped = host
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .and_then(|v6| v6.to_ipv4_mapped())
            .map(|v4| v4.to_string());
        let host = mapped.as_deref().unwrap_or(host);
        let listed = |list: &[HostPattern]| list.iter().any(|p| p.matches(host));
        (self.allowed.is_empty() || listed(&self.allowed)) && !listed(&self.denied)
    }

    /// The placeholder replaced in a body held whole.
    async fn fill(&self, media: &super::Media, bytes: Bytes) -> Result<Bytes, ProxyError> {
        if !contains(&bytes, IP_PLACEHOLDER.as_bytes()) {
            return Ok(bytes);
        }
        let ip = media.public_ip.lookup().await?.to_string();
        Ok(replace_bytes(
            &bytes,
            IP_PLACEHOLDER.as_bytes(),
            ip.as_bytes(),
        ))
    }
}

/// The one refusal of a host `[media.forward]` does not allow, whether `d` or a redirect named it.
fn refused(host: &str) -> ProxyError {
    ProxyError::downstream(
        StatusCode::FORBIDDEN,
        "forward_host",
        format!(
            "forwarding to {} is not allowed (media.forward)",
            bare(host)
        ),
    )
}

/// A host as the lists name it: an IPv6 literal without its brackets.
fn bare(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

fn too_large(max: u64) -> ProxyError {
    ProxyError::downstream(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        format!("the request body is larger than media.forward.max_request_bytes ({max})"),
    )
}

/// The client's body stalled: 408, as nginx answers a request body that stops coming.
fn stalled(idle: std::time::Duration) -> ProxyError {
    ProxyError::downstream(
        StatusCode::REQUEST_TIMEOUT,
        "client_body_timeout",
        format!(
            "the request body sent no bytes for {} s (upstream.idle_read_timeout_secs)",
            idle.as_secs()
        ),
    )
}

/// The body read ahead did not arrive whole in time, though it never went idle: the same 408.
fn late(total: std::time::Duration) -> ProxyError {
    ProxyError::downstream(
        StatusCode::REQUEST_TIMEOUT,
        "client_body_timeout",
        format!(
            "the request body did not arrive whole within {} s (upstream.whole_body_timeout_secs)",
            total.as_secs()
        ),
    )
}

/// The upstream's header timeout ran out while the streamed body still waited for the client's
/// bytes: the client's 408, though it may never have been idle.
fn unfinished(secs: u64) -> ProxyError {
    ProxyError::downstream(
        StatusCode::REQUEST_TIMEOUT,
        "client_body_timeout",
        format!(
            "the request body was still being sent when the upstream's answer was due \
             ({secs} s, upstream.header_timeout_secs, which counts the upload)"
        ),
    )
}

/// `Content-Length` as a number; a value that is not one is the client's error.
fn declared_length(headers: &HeaderMap) -> Result<Option<u64>, ProxyError> {
    match headers.get(header::CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| {
                ProxyError::downstream(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "Content-Length is not a number",
                )
            }),
    }
}

/// The upstream request's headers: the client's content headers, then `h_*`, minus anything that
/// would disclose the client.
fn request_headers(
    client: &HeaderMap,
    extra: &[(String, String)],
) -> Result<HeaderMap, ProxyError> {
    let mut out = HeaderMap::new();
    for name in CLIENT_HEADERS {
        if let Some(v) = client.get(name) {
            out.insert(name.clone(), v.clone());
        }
    }
    for (name, value) in extra {
        if IP_DISCLOSURE.contains(&name.to_ascii_lowercase().as_str()) {
            continue;
        }
        let bad = || {
            ProxyError::downstream(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("header `{name}` is not valid"),
            )
        };
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
        let value = HeaderValue::from_str(value).map_err(|_| bad())?;
        out.insert(name, value);
    }
    Ok(out)
}

/// The upstream's headers as the client gets them: all but hop-by-hop ones (with every field
/// `Connection` names, RFC 9110 7.6.1), `Alt-Svc` (it names the upstream's endpoints, not
/// sluice's), a `Content-Length` that came with `Transfer-Encoding` (the chunks framed that
/// body, not the length: kept, it would cut the body short or leave the client waiting, as
/// `stream::mirror_headers` knows), and those that would act on sluice's own origin or on a web
/// server in front of it (cookies, security policies, `X-Accel-Redirect`, `X-Sendfile`...; a
/// `Location` only on a redirect).
fn relay_response_headers(from: &HeaderMap, status: StatusCode, to: &mut HeaderMap) {
    let mut kept = from.clone();
    if kept.contains_key(header::TRANSFER_ENCODING) {
        kept.remove(header::CONTENT_LENGTH);
    }
    sluice_http::hop::strip_hop_by_hop(&mut kept, false);
    for (name, value) in &kept {
        let keep = *name != header::ALT_SVC
            && !name.as_str().starts_with("proxy-")
            && (!sluice_media::query::is_forbidden_response_header(name.as_str())
                || (*name == header::LOCATION && status.is_redirection()));
        if keep {
            to.append(name.clone(), value.clone());
        }
    }
}

fn has_placeholder(url: &str) -> bool {
    url.contains(IP_PLACEHOLDER) || url.to_ascii_lowercase().contains("%7bmediaflow_ip%7d")
}

/// `url` with the placeholder (as written or as the URL parser percent-encoded it) replaced. The
/// URL is lowercased once and scanned once (a URL of many placeholders costs its length, not its
/// length for each one).
fn replace_in_url(url: &Url, ip: &str) -> Result<Url, ProxyError> {
    let text = url.as_str();
    // ASCII lowercasing keeps every byte where it was: an index into `lower` is one into `text`.
    let lower = text.to_ascii_lowercase();
    let lower = lower.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut at, mut copied) = (0, 0);
    while at < lower.len() {
        #[cfg(test)]
        tests::SCANNED.with(|n| n.set(n.get() + 1));
        let found = [IP_PLACEHOLDER, "%7bmediaflow_ip%7d"]
            .iter()
            .find(|p| lower[at..].starts_with(p.as_bytes()));
        match found {
            Some(p) => {
                // Both patterns start with an ASCII byte: `at` is a character boundary.
                out.push_str(&text[copied..at]);
                out.push_str(ip);
                at += p.len();
                copied = at;
            }
            None => at += 1,
        }
    }
    out.push_str(&text[copied..]);
    Url::parse(&out).map_err(|e| {
        ProxyError::downstream(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("`d` with the address filled in is not a URL: {e}"),
        )
    })
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn replace_bytes(hay: &[u8], needle: &[u8], with: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Positions `replace_in_url` looked at, on this thread.
        pub(super) static SCANNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn many_placeholders_are_replaced_in_one_pass() {
        let query: String = (0..5000)
            .map(|i| match i % 2 {
                0 => format!("a{i}={{mediaflow_ip}}&"),
                _ => format!("b{i}=%7BMediaFlow_IP%7D&"),
            })
            .collect();
        let url = Url::parse(&format!("https://api.example/{{mediaflow_ip}}/x?{query}")).unwrap();
        SCANNED.with(|n| n.set(0));
        let out = replace_in_url(&url, "203.0.113.9").unwrap();
        let scanned = SCANNED.with(|n| n.get());
        assert!(scanned <= url.as_str().len(), "{scanned} positions");
        let expected: String = (0..5000)
            .map(|i| format!("{}{i}=203.0.113.9&", if i % 2 == 0 { 'a' } else { 'b' }))
            .collect();
        assert_eq!(
            out.as_str(),
            format!("https://api.example/203.0.113.9/x?{expected}")
        );
        // A URL without one is unchanged, odd bytes and all.
        let plain = Url::parse("https://api.example/%7Bmediaflow/ip%7D?x=%25&y={}").unwrap();
        assert_eq!(replace_in_url(&plain, "1.2.3.4").unwrap(), plain);
    }

    #[test]
    fn placeholder_in_url_and_body() {
        let url =
            Url::parse("https://api.example/x?ip={mediaflow_ip}&b=%7BMediaflow_IP%7D").unwrap();
        assert!(has_placeholder(url.as_str()));
        assert_eq!(
            replace_in_url(&url, "203.0.113.9").unwrap().as_str(),
            "https://api.example/x?ip=203.0.113.9&b=203.0.113.9"
        );
        assert_eq!(
            &replace_bytes(
                b"a={mediaflow_ip}&b={mediaflow_ip}",
                IP_PLACEHOLDER.as_bytes(),
                b"1.2.3.4"
            )[..],
            b"a=1.2.3.4&b=1.2.3.4"
        );
    }

    #[test]
    fn client_address_never_leaves() {
        let mut client = HeaderMap::new();
        client.insert("x-forwarded-for", HeaderValue::from_static("198.51.100.7"));
        client.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic eDpw"),
        );
        client.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let extra = vec![
            ("X-Real-IP".to_string(), "198.51.100.7".to_string()),
            ("authorization".to_string(), "Bearer t".to_string()),
        ];
        let out = request_headers(&client, &extra).unwrap();
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[header::CONTENT_TYPE], "application/json");
        assert_eq!(out[header::AUTHORIZATION], "Bearer t");
    }

    #[test]
    fn response_headers_that_would_act_on_sluice_stay_behind() {
        let mut up = HeaderMap::new();
        for (k, v) in [
            ("set-cookie", "a=b"),
            ("content-type", "application/json"),
            ("connection", "close, X-Backend"),
            ("x-backend", "10.0.0.5"),
            ("keep-alive", "timeout=5"),
            ("alt-svc", "h3=\":443\""),
            ("location", "https://elsewhere.example/"),
            ("x-ratelimit-remaining", "9"),
        ] {
            up.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let mut out = HeaderMap::new();
        relay_response_headers(&up, StatusCode::OK, &mut out);
        let names: Vec<_> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "x-ratelimit-remaining"]);
        let mut out = HeaderMap::new();
        relay_response_headers(&up, StatusCode::TEMPORARY_REDIRECT, &mut out);
        assert!(out.contains_key(header::LOCATION));
    }
}
