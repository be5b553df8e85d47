//! `POST /generate_url`, `/generate_urls`, the deprecated `/generate_encrypted_or_encoded_url`, and
//! `/base64/{encode,decode,check}`: MediaFlow's URL helpers. They fetch nothing, so like MediaFlow's
//! they need no password. A body whose `api_password` is this server's gets sluice's sealed token,
//! scoped to the URL's one path and holding no password; any other `api_password` gets MediaFlow's
//! token, byte for byte (it may be for another MediaFlow server, and opens nothing here).
//!
//! The two answers can be told apart, so the endpoint says whether a password is this server's:
//! no more than `/proxy/stream?api_password=` already says (403 or not), one guess per request,
//! compared in constant time (`auth::Auth::check`), and counted as a wrong one against the
//! client's network as the gate's are (`auth::guesses`: past the limit, 429). Only for a URL on
//! this server (`mediaflow_proxy_url` naming the host and port the request came to, or, from a
//! trusted front proxy, the host it says the client asked for: `reached_host`): a link for
//! another MediaFlow server, with that server's password, is MediaFlow's token with nothing
//! compared, so it is never a guess (`this_server`).
//!
//! `/generate_urls` is bounded before it builds anything (`generate::check_size`): 413 past 1,000
//! items, a base URL or password over 8 KiB, or an answer estimated over 16 MiB.
//!
//! Every JSON body here (and `/playlist/link`'s) is read under [`BODY_IDLE`] and [`BODY_WHOLE`]:
//! these paths are open without a password, and the connection's idle timeout does not run while
//! a request is in flight.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::body::Incoming;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use serde::Serialize;
use sluice_media::generate::SealPlan;
use sluice_media::{b64url, generate};

use super::forward::body::{read_ahead, Held, Idle, Late, Stalled, TooLarge, Watch};
use crate::auth::guesses::Attempt;
use crate::auth::token::{self, TokenGate, TokenScope};
use crate::auth::{Auth, Keys, Walked};
use crate::body::{self, Body, BoxError};
use crate::error::ProxyError;
use crate::request::RequestContext;

/// Largest JSON body accepted.
const BODY_LIMIT: usize = 256 * 1024;

/// Longest a JSON body may go without a byte. Fixed rather than taken from `[upstream]`: these
/// handlers see no config, and a body of a few hundred bytes (256 KiB at most) that pauses this
/// long is not coming (a lost segment's first retransmissions take a few seconds, not ten).
pub(crate) const BODY_IDLE: Duration = Duration::from_secs(10);

/// Longest a JSON body may take to arrive whole: 256 KiB at 9 KB/s, a rate any link that can
/// use a streaming proxy beats. The idle deadline alone restarts at every byte.
pub(crate) const BODY_WHOLE: Duration = Duration::from_secs(30);

/// Paths served here.
pub fn serves(path: &str) -> bool {
    matches!(
        path,
        "/generate_url"
            | "/generate_urls"
            | "/generate_encrypted_or_encoded_url"
            | "/proxy/generate_url"
            | "/base64/encode"
            | "/base64/decode"
            | "/base64/check"
    )
}

/// Serves one of [`serves`]' paths; `keys` decide whose token a generated URL gets.
pub async fn handle(
    req: Request<Incoming>,
    ctx: &RequestContext,
    keys: &Keys,
) -> Result<Response<Body>, ProxyError> {
    let method = req.method().clone();
    // Dispatch's handle to the wrong-password limit (`auth::guesses`), taken before the body.
    let attempt = req.extensions().get::<Attempt>().cloned();
    // The peer is trusted as it is for the client's address (`auth.trusted_proxies`).
    let host = reached_host(
        req.headers(),
        ctx.host.as_deref(),
        &keys.load().auth,
        ctx.peer.ip(),
    );
    match ctx.path.as_str() {
        "/base64/check" => Ok(json_response(&b64url::check_response(
            ctx.query.get("url").unwrap_or(""),
        ))),
        "/base64/encode" => {
            require(&method, Method::POST)?;
            let url = ctx.query.get("url").ok_or_else(|| missing("url"))?;
            Ok(json_response(&b64url::encode_response(url)))
        }
        "/base64/decode" => {
            require(&method, Method::POST)?;
            let encoded = ctx
                .query
                .get("encoded_url")
                .ok_or_else(|| missing("encoded_url"))?;
            b64url::decode_response(encoded)
                .map(|r| json_response(&r))
                .ok_or_else(|| bad("encoded_url is not base64 of a URL"))
        }
        "/generate_urls" => {
            require(&method, Method::POST)?;
            let request: generate::GenerateUrlsRequest = read_json(req).await?;
            // Before anything is built: the base URL is copied into every URL, so an unbounded
            // request made gigabytes on this runtime worker.
            generate::check_size(&request).map_err(too_large)?;
            let now = token::now();
            let response = match own_gate(
                keys,
                this_server(&request.mediaflow_proxy_url, host.as_deref()),
                request.api_password.as_deref(),
                attempt.as_ref(),
            )? {
                Some(gate) => generate::UrlsResponse {
                    urls: generate::plan_urls(&request, now)
                        .map_err(unsealable)?
                        .iter()
                        .map(|plan| seal(&gate, plan, now))
                        .collect(),
                },
                None => generate::generate_urls(&request, now, random_iv),
            };
            Ok(json_response(&response))
        }
        path => {
            require(&method, Method::POST)?;
            let request: generate::GenerateUrlRequest = read_json(req).await?;
            let now = token::now();
            let response = match own_gate(
                keys,
                this_server(&request.mediaflow_proxy_url, host.as_deref()),
                request.api_password.as_deref(),
                attempt.as_ref(),
            )? {
                Some(gate) => generate::UrlResponse {
                    url: seal(
                        &gate,
                        &generate::plan_url(&request, now).map_err(unsealable)?,
                        now,
                    ),
                },
                None => generate::generate_url(&request, now, random_iv()),
            };
            if path == "/generate_encrypted_or_encoded_url" {
                Ok(json_response(&generate::EncodedUrlResponse::from(response)))
            } else {
                Ok(json_response(&response))
            }
        }
    }
}

/// The token gate when the URL is for this server (`own`, [`this_server`]) and `offered` is its
/// password (compared in constant time), so the URL gets sluice's sealed token; `None`
/// (MediaFlow's format) for any other password or none. The answer tells the two apart, so a
/// password other than this server's is a wrong guess, charged to the client's network under
/// `attempt`'s limit, and a network past it gets the 429 before its password is compared
/// (`attempt` is dispatch's; without it nothing is limited). A URL for another MediaFlow server
/// (a documented use: minting links for it with its password) gets MediaFlow's format with no
/// comparison, so its password is neither a guess nor limited: the answer then says nothing of
/// this server's password.
fn own_gate(
    keys: &Keys,
    own: bool,
    offered: Option<&str>,
    attempt: Option<&Attempt>,
) -> Result<Option<Arc<TokenGate>>, ProxyError> {
    let credentials = keys.load();
    let Some(offered) = offered.filter(|p| !p.is_empty() && own) else {
        return Ok(None);
    };
    if !credentials.auth.required() {
        return Ok(None);
    }
    let check = |o: Option<&str>| credentials.auth.check(o);
    let own = match attempt {
        Some(attempt) => attempt.attempt(Some(offered), check)?,
        None => check(Some(offered)),
    };
    Ok(credentials.tokens.clone().filter(|_| own))
}

/// Whether `base` (a request's `mediaflow_proxy_url`) is this server as the client reached it:
/// an `http` or `https` URL whose host is `host` ([`reached_host`]), and whose port is the one
/// `host` names or, when it names none (the scheme's default port, which a TLS front proxy may
/// have changed), its scheme's default too. Anything unsure (no host, a base that does not
/// parse, another scheme) is another server: no password is compared for it.
fn this_server(base: &str, host: Option<&str>) -> bool {
    let (Ok(url), Some(host)) = (url::Url::parse(base.trim()), host) else {
        return false;
    };
    let Ok(authority) = host.parse::<http::uri::Authority>() else {
        return false;
    };
    let same_host = url
        .host_str()
        .is_some_and(|h| h.eq_ignore_ascii_case(authority.host()));
    let same_port = match authority.port_u16() {
        Some(port) => url.port_or_known_default() == Some(port),
        None => url.port().is_none(),
    };
    matches!(url.scheme(), "http" | "https") && same_host && same_port
}

/// The host the client asked for: the request's `Host` (or HTTP/2 authority), `host`; or, when
/// the `peer` is a trusted front proxy, the one it forwards: `X-Forwarded-Host`, or `host=` in
/// `Forwarded` (RFC 7239), which such a proxy sets when it rewrites `Host` to reach this server.
/// From a peer that is not trusted they are not read.
///
/// Each proxy of a chain may add its own (Apache appends to `X-Forwarded-Host`, an RFC 7239 proxy
/// adds an element with its `Host`): the public host is the one the outermost trusted proxy
/// wrote, where the client address's walk stops ([`Auth::client_ip`]: right to left through
/// the trusted proxies). In `Forwarded`, the `host=` of the element whose `for=` it stops at; in
/// `X-Forwarded-Host`, the entry at the index of the `X-Forwarded-For` hop it stops at, when
/// both name as many. Otherwise (no chain, or one naming proxies alone, or lists of unequal
/// length) every host the field names must be the same (case aside). The hosts both fields give
/// must be the same too: fields that disagree (a client's own value passed on beside the
/// proxy's) or do not parse leave the host unknown (`None`), and the link is then another
/// server's.
fn reached_host(
    headers: &HeaderMap,
    host: Option<&str>,
    auth: &Auth,
    peer: IpAddr,
) -> Option<String> {
    if !auth.is_trusted(peer) {
        return host.map(str::to_string);
    }
    let mut named: Vec<&str> = Vec::new();
    let mut entries: Vec<&str> = Vec::new();
    for line in headers.get_all("x-forwarded-host") {
        let line = line.to_str().ok()?;
        entries.extend(line.split(',').map(str::trim));
    }
    match auth.forwarded_for(peer, headers) {
        Some(Walked {
            at: Some(at), of, ..
        }) if of == entries.len() => named.push(entries[at]),
        _ => named.extend(entries),
    }
    // Each non-empty element's `host=` values, as `Auth::forwarded` counts its elements.
    let mut elements: Vec<Vec<&str>> = Vec::new();
    for line in headers.get_all(header::FORWARDED) {
        for element in crate::auth::split_unquoted(line.to_str().ok()?, b',')? {
            if element.trim().is_empty() {
                continue;
            }
            let mut hosts = Vec::new();
            for pair in crate::auth::split_unquoted(element, b';')? {
                let pair = pair.trim();
                if pair.is_empty() {
                    continue;
                }
                let (name, value) = pair.split_once('=')?;
                if name.trim().eq_ignore_ascii_case("host") {
                    let value = value.trim();
                    let value = match value.strip_prefix('"') {
                        Some(quoted) => quoted.strip_suffix('"')?,
                        None => value,
                    };
                    hosts.push(value);
                }
            }
            elements.push(hosts);
        }
    }
    match auth.forwarded(peer, headers) {
        Some(Walked {
            at: Some(at), of, ..
        }) if of == elements.len() && !elements[at].is_empty() => {
            named.append(&mut elements[at]);
        }
        _ => named.extend(elements.into_iter().flatten()),
    }
    let Some(first) = named.first() else {
        return host.map(str::to_string);
    };
    let readable = |h: &&str| {
        !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    };
    (named.iter().all(readable) && named.iter().all(|h| h.eq_ignore_ascii_case(first)))
        .then(|| first.to_string())
}

/// The planned URL under a sealed token that opens its one path (nothing when it has none), with
/// the request's expiry and address, and no expiry of its own beyond that.
fn seal(gate: &TokenGate, plan: &SealPlan, now: u64) -> String {
    let limit = TokenScope {
        exp: plan.exp,
        ip: plan.ip.clone(),
        paths: None,
    };
    let scope: Vec<&str> = plan.path.as_deref().into_iter().collect();
    plan.url(&gate.mint(&plan.params, &scope, Some(&limit), false, now))
}

fn unsealable(e: sluice_media::token::TokenError) -> ProxyError {
    ProxyError::downstream(
        StatusCode::UNPROCESSABLE_ENTITY,
        "bad_request",
        format!("query_params cannot go into a token: {e}"),
    )
}

fn too_large(e: generate::TooLarge) -> ProxyError {
    ProxyError::downstream(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        e.to_string(),
    )
}

/// The request's JSON body as `T`, read under [`BODY_IDLE`] and [`BODY_WHOLE`].
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<T, ProxyError> {
    // A body declared past the limit is refused before a byte of it is awaited: read first, a
    // slow client held its connection and place for the whole-body deadline to get the same
    // refusal.
    // The length as the HTTP layer read it (every version, repeated equal values), not a
    // second parse of the field.
    if http_body::Body::size_hint(req.body()).lower() > BODY_LIMIT as u64 {
        return Err(over_limit());
    }
    let bytes = read_body(req.into_body(), BODY_IDLE, BODY_WHOLE).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ProxyError::downstream(
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad_request",
            format!("request body is not valid: {e}"),
        )
    })
}

/// `body` whole, at most [`BODY_LIMIT`] bytes; one that stalls for `idle` or is not whole
/// within `whole` is the client's 408, as `/proxy/forward`'s are.
async fn read_body<B>(body: B, idle: Duration, whole: Duration) -> Result<Bytes, ProxyError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let body = Idle::new(body, idle, Arc::new(Watch::default()));
    // With the window at the limit, a body past it is refused before it could be `Partial`.
    match read_ahead(body, BODY_LIMIT, BODY_LIMIT as u64, whole).await {
        Ok(Held::Whole(bytes)) => Ok(bytes),
        Ok(Held::Partial(..)) => Err(over_limit()),
        Err(e) if e.is::<TooLarge>() => Err(over_limit()),
        Err(e) if e.is::<Stalled>() || e.is::<Late>() => Err(ProxyError::downstream(
            StatusCode::REQUEST_TIMEOUT,
            "client_body_timeout",
            match e.is::<Stalled>() {
                true => format!("the request body sent no bytes for {} s", idle.as_secs()),
                false => e.to_string(),
            },
        )),
        Err(e) => Err(bad(&format!("cannot read the request body: {e}"))),
    }
}

fn over_limit() -> ProxyError {
    bad(&format!(
        "the request body is larger than {BODY_LIMIT} bytes"
    ))
}

pub(crate) fn json_response<T: Serialize>(value: &T) -> Response<Body> {
    let text = serde_json::to_string(value).unwrap_or_else(|_| "{}".to_string());
    let mut resp = Response::new(body::full(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn require(method: &Method, want: Method) -> Result<(), ProxyError> {
    if *method == want {
        Ok(())
    } else {
        Err(ProxyError::downstream(
            StatusCode::METHOD_NOT_ALLOWED,
            "method",
            format!("use {want} here"),
        ))
    }
}

fn missing(name: &str) -> ProxyError {
    bad(&format!("missing query parameter `{name}`"))
}

fn bad(message: &str) -> ProxyError {
    ProxyError::downstream(StatusCode::BAD_REQUEST, "bad_request", message.to_string())
}

/// A fresh random IV for one token.
pub fn random_iv() -> [u8; 16] {
    let mut iv = [0u8; 16];
    getrandom::getrandom(&mut iv).expect("the OS random source is available");
    iv
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt as _;
    use http_body::Frame;
    use http_body_util::StreamBody;
    use tokio::time::Instant;

    /// Only a URL naming the host and port the client reached is this server's; anything else,
    /// or anything unsure, is another MediaFlow server's (its password is not compared).
    #[test]
    fn a_url_is_this_servers_only_by_its_hosts_name_and_port() {
        for (base, host) in [
            ("http://127.0.0.1:8888", "127.0.0.1:8888"),
            ("http://127.0.0.1:8888/", "127.0.0.1:8888"),
            ("HTTP://Proxy.Example:8888/base", "proxy.example:8888"),
            ("https://proxy.example", "proxy.example"),
            ("http://proxy.example", "PROXY.example"),
            ("https://proxy.example/", "proxy.example:443"),
            ("http://[::1]:8888", "[::1]:8888"),
        ] {
            assert!(this_server(base, Some(host)), "{base} at {host}");
        }
        for (base, host) in [
            ("https://other.example", Some("proxy.example")),
            ("http://proxy.example:8889", Some("proxy.example:8888")),
            ("http://proxy.example:8888", Some("proxy.example")),
            ("http://proxy.example", Some("proxy.example:8888")),
            ("ftp://proxy.example", Some("proxy.example")),
            ("not a url", Some("proxy.example")),
            ("/relative", Some("proxy.example")),
            ("http://proxy.example", None),
            ("http://proxy.example", Some("bad host/")),
        ] {
            assert!(!this_server(base, host), "{base} at {host:?}");
        }
    }

    /// A trusted front proxy's forwarded host is the one the client asked for; a peer that is not
    /// trusted has its fields ignored; fields that disagree or do not parse leave it unknown.
    #[test]
    fn the_forwarded_host_counts_only_from_a_trusted_proxy_and_only_when_sure() {
        let reached = |fields: &[(&str, &str)], trusted: bool| {
            let mut headers = HeaderMap::new();
            for (name, value) in fields {
                headers.append(
                    http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            let auth = Auth::new(&crate::auth::AuthConfig {
                trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
                ..Default::default()
            });
            let peer = if trusted { "10.0.0.9" } else { "198.51.100.1" };
            reached_host(&headers, Some("backend:8888"), &auth, peer.parse().unwrap())
        };
        let public = Some("proxy.example".to_string());
        let xfh = [("x-forwarded-host", "proxy.example")];
        assert_eq!(reached(&xfh, true), public);
        assert_eq!(reached(&xfh, false).as_deref(), Some("backend:8888"));
        assert_eq!(reached(&[], true).as_deref(), Some("backend:8888"));
        for forwarded in [
            "for=203.0.113.7;host=proxy.example;proto=https",
            "for=203.0.113.7;HOST=\"proxy.example\"",
            "for=\"[2001:db8::1]:4711\";host=proxy.example, for=10.0.0.2",
        ] {
            assert_eq!(
                reached(&[("forwarded", forwarded)], true),
                public,
                "{forwarded}"
            );
            assert_eq!(
                reached(&[("forwarded", forwarded)], false).as_deref(),
                Some("backend:8888")
            );
        }
        assert_eq!(
            reached(&[("forwarded", "host=\"proxy.example:8443\"")], true).as_deref(),
            Some("proxy.example:8443")
        );
        // Both fields, the same host (case aside): that host.
        assert_eq!(
            reached(
                &[
                    ("x-forwarded-host", "proxy.example"),
                    ("forwarded", "host=PROXY.example")
                ],
                true
            ),
            public
        );
        for unsure in [
            vec![("x-forwarded-host", "evil.example, proxy.example")],
            vec![
                ("x-forwarded-host", "proxy.example"),
                ("x-forwarded-host", "evil.example"),
            ],
            vec![
                ("x-forwarded-host", "proxy.example"),
                ("forwarded", "host=evil.example"),
            ],
            vec![("x-forwarded-host", "")],
            vec![("forwarded", "host=\"proxy.example")],
            vec![("forwarded", "host=\"a\\\"b\"")],
            vec![("forwarded", "host")],
        ] {
            assert_eq!(reached(&unsure, true), None, "{unsure:?}");
        }
        // A `Forwarded` naming no host leaves `Host`.
        assert_eq!(
            reached(&[("forwarded", "for=203.0.113.7;proto=https")], true).as_deref(),
            Some("backend:8888")
        );
    }

    /// Two trusted proxies that each write the host they were asked for (Apache appending to
    /// `X-Forwarded-Host`, RFC 7239 proxies adding an element each): the public host is the one
    /// the outermost trusted proxy wrote, where the client address's walk stops, and a client's
    /// own value to its left is passed over. Before, the hosts differed and none was taken.
    #[test]
    fn the_outermost_trusted_proxys_host_is_the_public_one() {
        let reached = |fields: &[(&str, &str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in fields {
                headers.append(
                    http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            let auth = Auth::new(&crate::auth::AuthConfig {
                trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
                ..Default::default()
            });
            reached_host(
                &headers,
                Some("10.0.0.5:8888"),
                &auth,
                "10.0.0.9".parse().unwrap(),
            )
        };
        let public = Some("media.example".to_string());
        for sure in [
            // Apache in front of Apache.
            vec![
                ("x-forwarded-for", "203.0.113.7, 10.0.0.2"),
                ("x-forwarded-host", "media.example, p2.internal"),
            ],
            // The same over several lines, and a client's own pair passed on to the left.
            vec![
                ("x-forwarded-for", "6.6.6.6"),
                ("x-forwarded-host", "evil.example"),
                ("x-forwarded-for", "203.0.113.7, 10.0.0.2"),
                ("x-forwarded-host", "media.example, p2.internal"),
            ],
            // A single proxy that overwrites the host and appends to a client's chain.
            vec![
                ("x-forwarded-for", "6.6.6.6, 203.0.113.7"),
                ("x-forwarded-host", "media.example"),
            ],
            // RFC 7239 proxies, one element each.
            vec![(
                "forwarded",
                "for=203.0.113.7;host=media.example;proto=https, for=10.0.0.2;host=p2.internal",
            )],
            vec![
                ("forwarded", "for=6.6.6.6;host=evil.example"),
                (
                    "forwarded",
                    "for=\"[2001:db8::7]:1\";host=\"media.example\"",
                ),
                ("forwarded", "for=10.0.0.2;host=p2.internal"),
            ],
            // The client's node unreadable: still the element the outermost proxy wrote.
            vec![(
                "forwarded",
                "for=_hidden;host=media.example, for=10.0.0.2;host=p2.internal",
            )],
            // Both fields, each its own chain, naming the same public host.
            vec![
                ("x-forwarded-for", "203.0.113.7, 10.0.0.2"),
                ("x-forwarded-host", "media.example, p2.internal"),
                (
                    "forwarded",
                    "for=203.0.113.7;host=MEDIA.example, for=10.0.0.2;host=p2.internal",
                ),
            ],
        ] {
            assert_eq!(reached(&sure), public, "{sure:?}");
        }
        for unsure in [
            // Lists of unequal length (a client's host with no hop of its own): all must agree.
            vec![
                ("x-forwarded-for", "203.0.113.7, 10.0.0.2"),
                (
                    "x-forwarded-host",
                    "evil.example, media.example, p2.internal",
                ),
            ],
            // Proxies alone: nowhere to stop.
            vec![
                ("x-forwarded-for", "10.0.0.3, 10.0.0.2"),
                ("x-forwarded-host", "media.example, p2.internal"),
            ],
            vec![(
                "forwarded",
                "for=10.0.0.3;host=media.example, for=10.0.0.2;host=p2.internal",
            )],
            // The fields' public hosts differ.
            vec![
                ("x-forwarded-for", "203.0.113.7, 10.0.0.2"),
                ("x-forwarded-host", "media.example, p2.internal"),
                (
                    "forwarded",
                    "for=203.0.113.7;host=other.example, for=10.0.0.2;host=p2.internal",
                ),
            ],
            // The element stopped at names no host: every host named must agree.
            vec![(
                "forwarded",
                "for=6.6.6.6;host=evil.example, for=203.0.113.7, for=10.0.0.2;host=p2.internal",
            )],
        ] {
            assert_eq!(reached(&unsure), None, "{unsure:?}");
        }
    }

    /// `/generate_urls` and the other JSON endpoints are open without a password: a body that
    /// goes silent, or trickles a byte at a time, ends as the client's 408 at its deadline.
    #[tokio::test(start_paused = true)]
    async fn json_bodies_that_stall_or_trickle_end_as_408() {
        let silent = futures_util::stream::iter([Ok::<_, BoxError>(Frame::data(
            Bytes::from_static(b"{\"urls\":"),
        ))])
        .chain(futures_util::stream::pending());
        let started = Instant::now();
        let err = read_body(StreamBody::new(silent), BODY_IDLE, BODY_WHOLE)
            .await
            .unwrap_err();
        assert_eq!(started.elapsed(), BODY_IDLE);
        assert_eq!(
            (err.status, err.kind),
            (StatusCode::REQUEST_TIMEOUT, "client_body_timeout")
        );
        assert_eq!(err.side, crate::error::Side::Downstream);
        assert!(err.message.contains("no bytes for 10 s"), "{}", err.message);
        let trickle = futures_util::stream::iter(0..u8::MAX).then(|_| async {
            tokio::time::sleep(BODY_IDLE / 2).await;
            Ok::<_, BoxError>(Frame::data(Bytes::from_static(b" ")))
        });
        let started = Instant::now();
        let err = read_body(StreamBody::new(Box::pin(trickle)), BODY_IDLE, BODY_WHOLE)
            .await
            .unwrap_err();
        assert_eq!(started.elapsed(), BODY_WHOLE);
        assert_eq!(
            (err.status, err.kind),
            (StatusCode::REQUEST_TIMEOUT, "client_body_timeout")
        );
        assert_eq!(err.side, crate::error::Side::Downstream);
        assert!(err.message.contains("whole within 30 s"), "{}", err.message);
        // A body that comes in time is read whole; one past the limit is refused.
        let parts = futures_util::stream::iter([b"{\"a\":".as_slice(), b"1}"])
            .map(|p| Ok::<_, BoxError>(Frame::data(Bytes::from_static(p))));
        let bytes = read_body(StreamBody::new(parts), BODY_IDLE, BODY_WHOLE)
            .await
            .unwrap();
        assert_eq!(&bytes[..], b"{\"a\":1}");
        let big = http_body_util::Full::new(Bytes::from(vec![b' '; BODY_LIMIT + 1]));
        let err = read_body(big, BODY_IDLE, BODY_WHOLE).await.unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
    }
}
