//! The HTTP/1.1 fast path's proxying: one plain GET or HEAD on a plain-HTTP route without a cache,
//! relayed as bytes over an owned upstream connection (no hyper on either side), with the same
//! server choice, retries, forwarding headers, errors and metrics as `forward` (see
//! `docs/decisions/h1-fast-path.md`). A large body of known length is spliced from the upstream
//! socket into the client's (`reverse.splice_bodies`). A GET or HEAD on a caching route goes to
//! the cache instead (`cached::serve_cached_fast`, written by `fast_write`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::atomic::Counter;
use http::header::{self, HeaderMap};
use http::{Method, StatusCode, Version};
use sluice_http::chunked;
use sluice_http::plain_head::{self, PlainHead};
use sluice_http::response_head::{self, BodyLength, ResponseHead};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::dial::{self, EagerStream};
use super::forward::via_value;
use super::forward::{
    attempt_loop, connect_failure, hash_key, hold_server, AttemptFailure, ClientHead, ClientHost,
    Done, Downstream, FetchError, HeadClock, UpstreamHead,
};
use super::{Reverse, Route};
use crate::body::Body;
use crate::error::ErrorMark;
use crate::runtime::recent::{self, recent};
use crate::server::{date, field_maps};
use crate::upstream::h1::{push_field as field, MAX_HEAD as MAX_RESPONSE_HEAD};

/// Upstream reads go into a buffer of this size, kept with the connection: a 64 KiB body comes
/// in one read with its head when the server has written both (the 4 KiB is room for the head;
/// with 64 KiB alone, the last bytes of such a body took a second read, which cost S2's 64 KiB
/// cell 12 % of its rate).
pub(super) const READ_BUF: usize = 68 * 1024;
/// A large body's reads grow the buffer up to this.
const MAX_READ_BUF: usize = 256 * 1024;
/// A body with at least this much left after the response head's read is spliced (when the
/// client is a plain TCP socket and `reverse.splice_bodies` is on); less is cheaper to copy than
/// to move through a pipe (one pipe's default capacity, as for the TCP relay).
const SPLICE_MIN: u64 = 64 * 1024;

// The fast path's client, request and outcome belong to the server's handler interface.
pub use crate::server::handler::{FastClient, FastRequest, Served};

/// Why a relay ended early.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("upstream: {0}")]
    Upstream(String),
    #[error("client write failed: {0}")]
    Client(std::io::Error),
}

/// Whether a route's requests can be relayed by the fast path: plain HTTP/1.1 upstream, no
/// cache (a caching route is served by `serve_cached_fast` instead; see `Reverse::serves_fast`).
pub fn serves(route: &Route) -> bool {
    route.fast.get().is_some() && route.cache_policy.is_none()
}

impl Reverse {
    /// Whether the fast path serves GET and HEAD on `route`: a relayed route ([`serves`]), or a
    /// caching one (answered by the cache, written by `fast_write`).
    pub fn serves_fast(&self, route: &Route) -> bool {
        serves(route) || (self.cache.is_some() && route.cache_policy.is_some())
    }

    /// Proxies `req` (routed to `route` by the normalised `path`) and writes the response to
    /// `client`. `on_head` is called once with the status and error mark just before the
    /// response head is written (the server's first-byte clock).
    pub async fn serve_fast<W: FastClient>(
        &self,
        route: &Arc<Route>,
        req: FastRequest<'_>,
        path: &str,
        down: &Downstream,
        client: &mut W,
        (on_head, sent_meter): (impl FnOnce(u16, Option<ErrorMark>), &Counter),
    ) -> Served {
        if route.cache_policy.is_some() {
            // In a box of its own: the cache's future is several times the relay's, and inline
            // it would set the size of this one, which is built (and copied into its box) at
            // every request of a plain route too.
            return crate::server::boxed_in_place(|| {
                self.serve_cached_fast(route, req, path, down, client, (on_head, sent_meter))
            })
            .await;
        }
        let start = recent();
        let close = req.close;
        let alt_svc = req.alt_svc.clone();
        let req_head_only = req.method == Method::HEAD;
        self.budget.record_request();
        let mut entry = self.log_entry(
            route,
            down,
            &req.method,
            req.target,
            Version::HTTP_11,
            &req.headers,
        );
        let key = hash_key(route, req.target, &req.headers, down);
        let query = req.target.split_once('?').map(|(_, q)| q);
        let client_head = ClientHead {
            method: &req.method,
            version: Version::HTTP_11,
            query,
            has_authority: false,
            target: Some(&req.path_and_query),
        };
        let head = self.upstream_head(route, client_head, req.headers, path, down, false);
        // On a route without response field edits, a plain response head is passed on as it
        // came (`plain_head`); any other takes the field map.
        let plain = (route.resp_add.is_empty() && route.resp_remove.is_empty()).then_some(Plain {
            via: self.settings.via,
            hpack: false,
        });
        let fetched = match head {
            Err(e) => Err(e),
            Ok(head) => {
                let fetched = fetch(
                    &self.budget,
                    route,
                    &head,
                    key.as_deref(),
                    plain,
                    HeadClock::Polled,
                )
                .await
                .map_err(FetchError::into_proxy_error);
                field_maps::give(head.headers);
                fetched
            }
        };
        let ttfb = recent::since(start);
        route.meters.ttfb().observe(ttfb.as_secs_f64());
        let (exchanged, in_flight) = match fetched {
            Ok(f) => f,
            Err(e) => {
                let mut resp = e.into_response();
                offer_alt_svc(resp.headers_mut(), alt_svc);
                let status = resp.status().as_u16();
                on_head(status, resp.extensions().get::<ErrorMark>().copied());
                self.finish_record(route, status, ttfb, entry);
                let reusable =
                    write_full(client, resp, req_head_only, close).await.is_ok() && !close;
                return Served { status, reusable };
            }
        };
        let Exchanged {
            mut conn,
            head,
            body_at,
            length,
            pool,
            index,
        } = exchanged;
        let status = head.status().as_u16();
        let hold = hold_server(route, in_flight, &mut entry);
        let mut done = Done {
            access_log: self.access_log.clone(),
            route: route.clone(),
            start,
            status,
            entry,
            _hold: hold,
        };
        let (length, keep_alive, reusable, mut out) = match head {
            Answer::Plain(plain, out) => {
                // Its length is counted (or it answers HEAD): the connection stays open unless
                // the client asked otherwise.
                let keep_alive = !close;
                let out = plain_head_end(out, &plain, self.settings.via, alt_svc, keep_alive);
                (length, keep_alive, !plain.close, out)
            }
            Answer::Hpack(..) => unreachable!("asked for the HTTP/1.1 form"),
            Answer::Map(head) => {
                let reusable = head.minor_version == 1 && !head.close;
                let (length, keep_alive, out) =
                    self.map_head(route, head, (length, req_head_only), alt_svc, close);
                (length, keep_alive, reusable, out)
            }
        };
        on_head(status, None);
        let splice = self.settings.splice_bodies.then(|| route.meters.spliced());
        let relayed = relay(
            &mut conn,
            (length, body_at),
            &mut out,
            client,
            route.idle_timeout,
            (splice, sent_meter),
        )
        .await;
        let (sent, complete, upstream_clean) = match relayed {
            Ok((sent, clean)) => (sent, true, clean),
            Err((sent, e)) => {
                tracing::debug!(route = %route.name, error = %e, "fast path relay cut");
                (sent, false, false)
            }
        };
        if complete && upstream_clean && reusable {
            pool.checkin(index, conn);
        }
        done.status = status;
        done.record(sent, complete);
        Served {
            status,
            reusable: complete && keep_alive,
        }
    }

    /// The client's head from a head parsed into a field map: hop-by-hop fields out, this hop's
    /// and the route's edits, the body's framing, `Alt-Svc`. With the body's length as relayed
    /// (a coded body not ending in `chunked` is read until close) and whether the client's
    /// connection stays open. `head_only`: it answers HEAD.
    fn map_head(
        &self,
        route: &Route,
        head: ResponseHead,
        (length, head_only): (BodyLength, bool),
        alt_svc: Option<header::HeaderValue>,
        close: bool,
    ) -> (BodyLength, bool, Vec<u8>) {
        let status = head.status.as_u16();
        let mut headers = head.headers;
        let coding = codings(&headers);
        // A coded body whose last coding is not `chunked` ends when the server closes
        // (RFC 9112 §6.3): it is relayed until then, its codings named as they came.
        let close_coded = length == BodyLength::Coded && !ends_chunked(coding.as_ref());
        let length = if close_coded {
            BodyLength::UntilClose
        } else {
            length
        };
        let keep_alive = !close && length != BodyLength::UntilClose;
        let version = if head.minor_version == 0 {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        // A server's `Content-Length` beside its `Transfer-Encoding` goes with the coding in
        // `response_fields` (the coding wins, RFC 9112 §6.3), on a HEAD answer too.
        self.response_fields(route, &mut headers, version);
        // The framing the body is relayed with, whatever the route's header edits did: a
        // counted body keeps its length, a coded one is relayed as it came (never with a length
        // beside it, RFC 9112 §6.3), and one read until close gets neither.
        match (length, coding) {
            (BodyLength::Exact(n), _) => {
                // The server's own single `Content-Length` is usually that length already: kept
                // as it is (where it is), not formatted again.
                if !says_length(&headers, n) {
                    headers.insert(header::CONTENT_LENGTH, n.into());
                }
                headers.remove(header::TRANSFER_ENCODING);
            }
            (BodyLength::Coded, Some(te)) => {
                headers.remove(header::CONTENT_LENGTH);
                headers.insert(header::TRANSFER_ENCODING, te);
            }
            (BodyLength::UntilClose, te) => {
                headers.remove(header::CONTENT_LENGTH);
                match te.filter(|_| close_coded) {
                    Some(te) => headers.insert(header::TRANSFER_ENCODING, te),
                    None => headers.remove(header::TRANSFER_ENCODING),
                };
            }
            (BodyLength::Empty, _) => h1_bodiless_fields(head.status, head_only, &mut headers),
            (BodyLength::Coded, None) => {}
        }
        offer_alt_svc(&mut headers, alt_svc);
        let mut out = Vec::with_capacity(512);
        write_head(&mut out, status, &headers, None, !keep_alive);
        field_maps::give(headers);
        (length, keep_alive, out)
    }
}

/// The end of a head `plain_head` passed on: this hop's `Via`, the listener's `Alt-Svc` when the
/// server named none, `Connection: close` when the client's connection ends with it, and `Date`
/// when the server sent none, in the order `map_head` writes them; then the blank line.
fn plain_head_end(
    mut out: Vec<u8>,
    plain: &PlainHead,
    via: bool,
    alt_svc: Option<header::HeaderValue>,
    keep_alive: bool,
) -> Vec<u8> {
    if via {
        field(&mut out, "via", via_value(Version::HTTP_11).as_bytes());
    }
    if let Some(value) = alt_svc.filter(|_| !plain.has_alt_svc) {
        field(&mut out, "alt-svc", value.as_bytes());
    }
    if !keep_alive {
        field(&mut out, "connection", b"close");
    }
    if !plain.has_date {
        date::with_text(|d| field(&mut out, "date", d.as_bytes()));
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The listener's `Alt-Svc` (HTTP/3 offered on a TLS listener) on a response that names none, as
/// the server adds it to hyper's responses.
pub(super) fn offer_alt_svc(headers: &mut HeaderMap, alt_svc: Option<header::HeaderValue>) {
    if let Some(value) = alt_svc {
        headers.entry(header::ALT_SVC).or_insert(value);
    }
}

/// The length fields of an answer without a body (`BodyLength::Empty`), as hyper writes them
/// (and `fast_write`): none on a 1xx or 204, which may carry neither (RFC 9112 §6.1, RFC 9110
/// §8.6); on a 304 or the answer to HEAD, where it tells the length of the GET answer, one
/// `Content-Length` kept when it is one valid decimal, else dropped (`5, 7`, `abc`, two fields:
/// a server's garbage is not relayed). An HTTP/1.1 answer has more rules
/// ([`h1_bodiless_fields`]); an HTTP/2 one keeps the length on a 304 to GET, as hyper's HTTP/2
/// server does.
pub(super) fn bodiless_fields(status: StatusCode, headers: &mut HeaderMap) {
    if status.is_informational() || status == StatusCode::NO_CONTENT {
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::TRANSFER_ENCODING);
        return;
    }
    let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
    let valid = match (values.next(), values.next()) {
        (Some(v), None) => response_head::decimal(v.as_bytes()).is_some(),
        (None, _) => true,
        _ => false,
    };
    if !valid {
        headers.remove(header::CONTENT_LENGTH);
    }
}

/// [`bodiless_fields`] for an HTTP/1.1 client: a 304 that does not answer HEAD (`head_only`)
/// gets no length field at all, as hyper's HTTP/1.1 server and `fast_write` write it; and a
/// `Content-Length` is dropped beside a `Transfer-Encoding` (one a route adds: the server's own
/// is hop-by-hop), as RFC 9112 §6.2 forbids both in one message.
fn h1_bodiless_fields(status: StatusCode, head_only: bool, headers: &mut HeaderMap) {
    if status == StatusCode::NOT_MODIFIED && !head_only {
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::TRANSFER_ENCODING);
        return;
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    bodiless_fields(status, headers);
}

/// Whether `headers` hold exactly one `Content-Length`, and it is `n` written plainly (digits
/// only, no leading zero): then inserting `n` again would change nothing.
pub(super) fn says_length(headers: &HeaderMap, n: u64) -> bool {
    let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
    let (Some(v), None) = (values.next(), values.next()) else {
        return false;
    };
    let v = v.as_bytes();
    let plain = v.len() == 1 || v.first() != Some(&b'0');
    plain && response_head::decimal(v) == Some(n)
}

/// A response's codings as one value: its `Transfer-Encoding` fields joined in order, since the
/// last coding of the last field is the one that frames the body (RFC 9112 §6.1). A server that
/// sends `chunked` and then `gzip` in two fields has a body that ends at its close, and the
/// client is told both codings, not the first field alone.
pub(super) fn codings(headers: &header::HeaderMap) -> Option<header::HeaderValue> {
    let mut fields = headers.get_all(header::TRANSFER_ENCODING).iter();
    let first = fields.next()?;
    let mut rest = fields.peekable();
    if rest.peek().is_none() {
        return Some(first.clone());
    }
    let mut joined = first.as_bytes().to_vec();
    for v in rest {
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(v.as_bytes());
    }
    // Each part was a valid value, so the joined bytes are one too.
    header::HeaderValue::from_bytes(&joined).ok()
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked`.
pub(super) fn ends_chunked(te: Option<&header::HeaderValue>) -> bool {
    te.and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// An upstream response head as the exchange read it.
pub(super) enum Answer {
    /// Parsed into a field map (`response_head`).
    Map(ResponseHead),
    /// Passed on as it came (`plain_head`): its status line and fields, written for the client.
    Plain(PlainHead, Vec<u8>),
    /// Passed on as it came, for an HTTP/2 client (`plain_head::write_plain_hpack`): its fields as
    /// HPACK field lines (a `Date` added when it had none), but for an `Alt-Svc`, which is in the
    /// map (empty without one).
    Hpack(PlainHead, Vec<u8>, HeaderMap),
}

impl Answer {
    pub(super) fn status(&self) -> StatusCode {
        match self {
            Answer::Map(h) => h.status,
            Answer::Plain(h, _) | Answer::Hpack(h, ..) => h.status,
        }
    }
}

/// A plain response head may be passed on as it came: written for an HTTP/1.1 client
/// (`Answer::Plain`) or, with `hpack`, an HTTP/2 one (`Answer::Hpack`), with this hop's `Via`
/// added (`via`) or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plain {
    pub(super) via: bool,
    pub(super) hpack: bool,
}

/// A response head from one server, the connection it came on (its buffer holds the head and,
/// from `body_at` on, the body bytes read with it), and where that connection goes back to.
pub(super) struct Exchanged {
    pub(super) conn: UpConn,
    pub(super) head: Answer,
    pub(super) body_at: usize,
    pub(super) length: BodyLength,
    pub(super) pool: Arc<FastPool>,
    pub(super) index: usize,
}

/// The attempts across the group's servers (`forward::attempt_loop`): no body, so every failure
/// may move on to the next server. `plain`: whether and how a plain response head may be passed
/// on as it came.
///
/// `clock` keeps the header timeout: [`HeadClock::Polled`] only for a task polled at least once
/// a tick while it waits (the HTTP/1.1 fast path's connection, `server::h1fast`; an HTTP/2
/// stream, woken by its connection's tick through `server::ticks`); an HTTP/3 stream's task has
/// no tick and takes [`HeadClock::Timer`].
pub(super) async fn fetch(
    budget: &super::budget::RetryBudget,
    route: &Arc<Route>,
    head: &UpstreamHead,
    key: Option<&[u8]>,
    plain: Option<Plain>,
    clock: HeadClock,
) -> Result<(Exchanged, crate::upstream::group::InFlight), FetchError> {
    attempt_loop(
        budget,
        route,
        key,
        true,
        (None, clock),
        |server, index, _final| {
            let pool = route.fast.get()?.clone();
            let index = index?;
            let group = route.group.name();
            Some(async move {
                match pool.exchange(index, server.addr(), head, plain).await {
                    Ok((conn, head, body_at, length)) => Ok(Exchanged {
                        conn,
                        head,
                        body_at,
                        length,
                        pool,
                        index,
                    }),
                    Err(Failure::Connect(cf)) => {
                        Err(AttemptFailure::Failed(connect_failure(&cf, group)))
                    }
                    Err(Failure::Broken(detail)) => {
                        Err(AttemptFailure::Failed(FetchError::Broken {
                            server: server.addr().to_string(),
                            detail,
                        }))
                    }
                }
            })
        },
    )
    .await
}

/// The upstream request head as bytes, exactly as hyper's HTTP/1.1 client writes the same
/// [`UpstreamHead`] on the owned-connection path: origin-form target, the fields in the map's
/// order with lower-case names, `host` in place when the map has one, else last.
pub fn encode_request(head: &UpstreamHead, server_addr: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + head.headers.len() * 48);
    encode_request_into(&mut out, head, server_addr);
    out
}

/// [`encode_request`] appending to `out` (an upstream connection's emptied read buffer: no
/// allocation of its own).
fn encode_request_into(out: &mut Vec<u8>, head: &UpstreamHead, server_addr: &str) {
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(head.path_and_query.as_str().as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let host = match &head.host {
        Some(h) => ClientHost::as_bytes(h),
        None => server_addr.as_bytes(),
    };
    let mut host_written = false;
    for (name, value) in head.headers.iter() {
        if name == header::HOST {
            // `insert` replaces every value of the field with one, where the field stood.
            if !host_written {
                field(out, "host", host);
                host_written = true;
            }
            continue;
        }
        field(out, name.as_str(), value.as_bytes());
    }
    // Where inserting them into the map would have put them: after its fields.
    if let Some(fresh) = &head.forwarding {
        fresh.each(|name, value| field(out, name, value));
    }
    if !host_written {
        field(out, "host", host);
    }
    out.extend_from_slice(b"\r\n");
}

/// A response head as hyper's server writes it: status line with the canonical reason, the
/// fields in map order, `content-length` when given, `connection: close` when closing, `date`
/// unless the map has one.
pub(super) fn write_head(
    out: &mut Vec<u8>,
    status: u16,
    headers: &HeaderMap,
    length: Option<usize>,
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    out.extend_from_slice(code.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(code.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers.iter() {
        if close && name == header::CONNECTION {
            continue;
        }
        field(out, name.as_str(), value.as_bytes());
    }
    if let Some(n) = length {
        field(out, "content-length", n.to_string().as_bytes());
    }
    if close {
        field(out, "connection", b"close");
    }
    if !headers.contains_key(header::DATE) {
        date::with_text(|d| field(out, "date", d.as_bytes()));
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes a whole response sluice made itself (an error) with its body; the answer to a HEAD
/// gets the head alone, its length still the body's.
async fn write_full<W: AsyncWrite + Unpin>(
    client: &mut W,
    resp: http::Response<Body>,
    head_only: bool,
    close: bool,
) -> std::io::Result<()> {
    use http_body_util::BodyExt;
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let mut out = Vec::with_capacity(256 + body.len());
    write_head(
        &mut out,
        parts.status.as_u16(),
        &parts.headers,
        Some(body.len()),
        close,
    );
    if !head_only {
        out.extend_from_slice(&body);
    }
    client.write_all(&out).await?;
    client.flush().await
}

/// Relays the body after a response head: `out` holds the client head; the connection's buffer,
/// from `body_at` on, the body bytes read with the upstream head (written beside the client head
/// in one vectored write where the client takes one, so they are never copied). Returns the body bytes sent and whether the
/// upstream connection ended exactly at the body's end (it can carry another request); on error,
/// the bytes sent before it. Body bytes are counted in `sent_meter` as they go out (a send
/// timeout drops this future). With `splice` (counting the bodies it moves), a counted body with at
/// least `SPLICE_MIN` left after the first read goes on socket to socket ([`splice_rest`]).
async fn relay<W: FastClient>(
    conn: &mut UpConn,
    (length, body_at): (BodyLength, usize),
    out: &mut Vec<u8>,
    client: &mut W,
    idle: Duration,
    (mut splice, sent_meter): (Option<&Counter>, &Counter),
) -> Result<(u64, bool), (u64, RelayError)> {
    let mut sent = 0u64;
    let mut decoder = chunked::Decoder::new();
    let mut left = match length {
        BodyLength::Exact(n) => n,
        _ => 0,
    };
    // The first pass sends the head with whatever body came with it.
    let mut fresh = std::mem::take(&mut conn.buf);
    let mut timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let mut first = true;
    // Where the body starts in `fresh`: past the upstream head on the first pass, 0 after.
    let mut at = body_at;
    loop {
        let got = &fresh[at..];
        let (take, finished, clean) = match length {
            BodyLength::Empty => (0, true, got.is_empty()),
            BodyLength::Exact(_) => {
                let take = usize::try_from(left).unwrap_or(usize::MAX).min(got.len());
                left -= take as u64;
                (take, left == 0, take == got.len())
            }
            BodyLength::Coded => {
                let used = decoder
                    .skip(got)
                    .map_err(|e| (sent, RelayError::Upstream(e.to_string())))?;
                (used, decoder.is_done(), used == got.len())
            }
            BodyLength::UntilClose => (got.len(), false, false),
        };
        let body = &got[..take];
        if first {
            head_and_body(client, out, body)
                .await
                .map_err(|e| (sent, RelayError::Client(e)))?;
            first = false;
            at = 0;
        } else if take > 0 {
            client
                .write_all(body)
                .await
                .map_err(|e| (sent, RelayError::Client(e)))?;
        }
        sent += take as u64;
        sent_meter.inc_by(take as u64);
        let spliceable = matches!(length, BodyLength::Exact(_)) && left >= SPLICE_MIN;
        if let Some(spliced) = splice.filter(|_| spliceable && client.socket().is_some()) {
            let mut body = crate::net::splice::feed::BodySplice::new(left, idle);
            // The pipe first: with none to be had (the descriptor limit), the body goes on by
            // copy, where a splice without one could only cut it short after its head went out.
            if body.take_pipe().is_ok() {
                spliced.inc();
                // Every byte read so far was the body's (`left` > 0), and went out with the head.
                hand_back(conn, fresh, client, sent).await?;
                return match splice_rest(conn.io.tcp(), client, body, sent_meter).await {
                    Ok(n) => Ok((sent + n, true)),
                    Err((n, e)) => Err((sent + n, e)),
                };
            }
            splice = None;
        }
        if finished {
            hand_back(conn, fresh, client, sent).await?;
            return Ok((sent, clean));
        }
        // A read that filled the buffer says the body comes faster than it is read: the buffer
        // doubles (up to `MAX_READ_BUF`), so a large body costs few reads and wake-ups.
        let filled = !fresh.is_empty() && fresh.len() == fresh.capacity();
        let mut want = if filled {
            (fresh.capacity() * 2).min(MAX_READ_BUF)
        } else {
            fresh.capacity().max(READ_BUF)
        };
        if let BodyLength::Exact(_) = length {
            // No more room than the rest of the body: a response a little longer than the
            // buffer would otherwise grow it for its last bytes (and `hand_back` shrink it
            // again), two reallocations per response.
            want = want.min(usize::try_from(left).unwrap_or(usize::MAX));
        }
        fresh.clear();
        fresh.reserve(want);
        // One timer for the whole body, pushed back at each read.
        let deadline = recent() + idle;
        let sleep = match timer.as_mut() {
            Some(t) => {
                t.as_mut().reset(deadline);
                t
            }
            None => timer.insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        let read = tokio::select! {
            biased;
            r = conn.io.read_buf(&mut fresh) => Ok(r),
            _ = sleep.as_mut() => Err(()),
        };
        match read {
            Ok(Ok(0)) if length == BodyLength::UntilClose => {
                client
                    .flush()
                    .await
                    .map_err(|e| (sent, RelayError::Client(e)))?;
                return Ok((sent, false));
            }
            Ok(Ok(0)) => {
                return Err((
                    sent,
                    RelayError::Upstream("connection closed inside the body".into()),
                ))
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err((sent, RelayError::Upstream(e.to_string()))),
            Err(_) => {
                return Err((
                    sent,
                    RelayError::Upstream(format!("no body byte for {} s", idle.as_secs())),
                ))
            }
        }
    }
}

/// Writes the client head in `out` and the first body bytes: one vectored write where the client
/// takes one (the body stays in the upstream read buffer), else the body appended to `out`.
async fn head_and_body<W: AsyncWrite + Unpin>(
    client: &mut W,
    out: &mut Vec<u8>,
    body: &[u8],
) -> std::io::Result<()> {
    use std::io::IoSlice;
    if body.is_empty() || !client.is_write_vectored() {
        out.extend_from_slice(body);
        return client.write_all(out).await;
    }
    let mut slices = [IoSlice::new(out), IoSlice::new(body)];
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = client.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// Ends `relay`'s use of the read buffer: it goes back to the connection emptied, shrunk to the
/// small size an idle connection keeps, and whatever the client writer holds is flushed.
async fn hand_back<W: FastClient>(
    conn: &mut UpConn,
    mut fresh: Vec<u8>,
    client: &mut W,
    sent: u64,
) -> Result<(), (u64, RelayError)> {
    fresh.clear();
    fresh.shrink_to(READ_BUF);
    conn.buf = fresh;
    client
        .flush()
        .await
        .map_err(|e| (sent, RelayError::Client(e)))
}

/// Moves the rest of a counted body (`body`, its pipe taken) from `up` into the client's socket
/// with `splice(2)` (`net::splice::feed`): the kernel moves page references, user space never sees the
/// bytes. `idle` bounds the wait for each upstream chunk; the client's stalls are the
/// connection's send timeout's, told through `write_blocked` and `wrote`. Returns the bytes sent;
/// on error, those sent before it.
async fn splice_rest<W: FastClient>(
    up: &TcpStream,
    client: &W,
    mut body: crate::net::splice::feed::BodySplice,
    sent_meter: &Counter,
) -> Result<u64, (u64, RelayError)> {
    use crate::net::splice::feed::{FeedError, Waiting};
    let Some(dst) = client.socket() else {
        return Err((
            0,
            RelayError::Upstream("no client socket to splice into".into()),
        ));
    };
    let mut sent = 0u64;
    while !body.is_done() {
        let moved = std::future::poll_fn(|cx| {
            let p = body.poll_send(cx, up, dst, usize::MAX, &|_| {});
            if p.is_pending() && body.waiting() == Waiting::Downstream {
                client.write_blocked();
            }
            p
        })
        .await;
        match moved {
            Ok(n) => {
                sent += n as u64;
                sent_meter.inc_by(n as u64);
                client.wrote();
            }
            Err(FeedError::Downstream(e)) => return Err((sent, RelayError::Client(e))),
            Err(e) => return Err((sent, RelayError::Upstream(e.to_string()))),
        }
    }
    Ok(sent)
}

/// How one exchange with a server failed.
enum Failure {
    Connect(super::client::ConnectFailure),
    Broken(String),
}

/// An owned upstream connection and its read buffer.
pub(super) struct UpConn {
    pub(super) io: EagerStream,
    pub(super) buf: Vec<u8>,
    /// The last plain response head passed on from this connection, to pass on the next one like
    /// it without a parse (an origin answers one resource with the same head, its date aside).
    /// Boxed: a connection is moved through the pool and the exchange's futures.
    memo: Box<plain_head::Memo>,
}

impl UpConn {
    /// Whether nothing arrived while the connection sat idle, as far as the runtime has seen.
    /// Bytes nobody asked for (a body sent after the head of a HEAD, 204 or 304 answer, or past a
    /// body's length, which a splice leaves in the socket) would be read as the next request's
    /// answer, and handed to another client; an end of stream means the server closed it. A read
    /// that found the socket drained (a short one) cleared its readiness, so most quiet
    /// connections cost no system call; after a splice, or a last read that filled its buffer
    /// exactly, the look is one `recvfrom` answering EAGAIN (which the exchange's first read
    /// would have made). Best effort: bytes the runtime has not seen yet, or that come after this
    /// look, are still taken for the next answer (as by any HTTP/1.1 client).
    fn quiet(&self) -> bool {
        // `try_read` asks the runtime's readiness without a waker or the task's cooperative
        // budget (a readiness poll answers `Pending` once a busy task has spent that, which
        // would pass anything as quiet), and reads only when the socket was seen readable.
        let mut byte = [0u8; 1];
        let read = self.io.tcp().try_read(&mut byte);
        matches!(read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

struct Idle {
    conn: UpConn,
    since: Instant,
}

/// One route's fast-path connections (per per-core runtime, like `h1pool`): an idle stack per
/// server, newest on top, at most `max_idle` each; a connection idle past `idle_timeout` is closed
/// when next looked at, and by a sweep at each check-in.
pub struct FastPool {
    servers: Vec<Mutex<std::collections::VecDeque<Idle>>>,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    /// A sweep task is running (see [`FastPool::sweep_later`]).
    sweeping: std::sync::atomic::AtomicBool,
}

/// A route's fast-path pools, one per per-core runtime; empty on a route the fast path does
/// not serve.
pub struct FastPools(Vec<Arc<FastPool>>);

impl FastPools {
    pub fn build(
        route: &super::RouteConfig,
        shared: &super::ReverseConfig,
        servers: usize,
        count: usize,
    ) -> FastPools {
        if route.upstream_protocol != super::config::UpstreamProtocol::Http1 || route.cache {
            return FastPools(Vec::new());
        }
        FastPools(
            (0..count.max(1))
                .map(|_| {
                    Arc::new(FastPool {
                        servers: (0..servers).map(|_| Mutex::default()).collect(),
                        max_idle: shared.pool_max_idle_per_server,
                        idle_timeout: Duration::from_secs(shared.pool_idle_secs),
                        connect_timeout: Duration::from_secs(route.connect_timeout_secs),
                        sweeping: std::sync::atomic::AtomicBool::new(false),
                    })
                })
                .collect(),
        )
    }

    /// The calling worker's pool.
    pub fn get(&self) -> Option<&Arc<FastPool>> {
        if self.0.is_empty() {
            return None;
        }
        self.0.get(crate::runtime::worker() % self.0.len())
    }
}

impl FastPool {
    /// Writes `request` to server `index` and reads the response head (1xx heads skipped). A
    /// reused connection that fails before any byte of an answer is replaced by a new one once:
    /// the server closed it while idle, and a GET or HEAD is safe to send again. The retry
    /// dials a fresh connection rather than taking the next idle one: a server that drops
    /// every request unanswered would otherwise get the same request once per pooled
    /// connection.
    async fn exchange(
        &self,
        index: usize,
        addr: &str,
        request: &UpstreamHead,
        plain: Option<Plain>,
    ) -> Result<(UpConn, Answer, usize, BodyLength), Failure> {
        // Taken from the pool on the first try only; the retry, if any, connects.
        let mut pooled = self.checkout(index);
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(c) => c,
                None => {
                    // In a box of its own: the dial's future (name lookup, connect) is several
                    // times the exchange's, and inline it would set the size of every
                    // exchange, which is built and moved at each request on a pooled
                    // connection too.
                    Box::pin(self.connect(addr)).await?
                }
            };
            match round_trip(&mut conn, request, addr, plain).await {
                Ok((head, body_at, length)) => return Ok((conn, head, body_at, length)),
                Err((answered, detail)) => {
                    if reused && !answered {
                        continue;
                    }
                    return Err(Failure::Broken(detail));
                }
            }
        }
    }

    fn checkout(&self, index: usize) -> Option<UpConn> {
        let slot = self.servers.get(index)?;
        loop {
            let idle = {
                let mut stack = slot.lock().ok()?;
                let idle = stack.pop_back()?;
                if recent::since(idle.since) >= self.idle_timeout {
                    // The newest is expired, so is every older one.
                    stack.clear();
                    return None;
                }
                idle
            };
            if idle.conn.quiet() {
                return Some(idle.conn);
            }
        }
    }

    pub(super) fn checkin(self: &Arc<Self>, index: usize, conn: UpConn) {
        if self.max_idle == 0 {
            return;
        }
        let Some(Ok(mut stack)) = self.servers.get(index).map(Mutex::lock) else {
            return;
        };
        let now = recent();
        self.expire(&mut stack, now);
        if stack.len() >= self.max_idle {
            stack.pop_front();
        }
        stack.push_back(Idle { conn, since: now });
        drop(stack);
        self.sweep_later();
    }

    /// Closes the connections at the old end of `stack` that have been idle too long at `now`.
    fn expire(&self, stack: &mut std::collections::VecDeque<Idle>, now: Instant) {
        while stack
            .front()
            .is_some_and(|i| now.saturating_duration_since(i.since) >= self.idle_timeout)
        {
            stack.pop_front();
        }
    }

    /// Makes sure idle connections are closed on time even when no request comes: one task per
    /// pool while it holds any, holding it weakly, sweeping every half idle timeout.
    fn sweep_later(self: &Arc<Self>) {
        use std::sync::atomic::Ordering::{AcqRel, Release};
        if self.sweeping.swap(true, AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweeping.store(false, Release);
            return;
        };
        let weak = Arc::downgrade(self);
        let every = (self.idle_timeout / 2).max(Duration::from_millis(100));
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(pool) = weak.upgrade() else { return };
                let mut held = 0;
                for slot in &pool.servers {
                    if let Ok(mut stack) = slot.lock() {
                        pool.expire(&mut stack, recent());
                        held += stack.len();
                    }
                }
                if held == 0 {
                    // A check-in racing this store starts its own sweep, or its connection
                    // expires at check-out.
                    pool.sweeping.store(false, Release);
                    return;
                }
            }
        });
    }

    async fn connect(&self, addr: &str) -> Result<UpConn, Failure> {
        match tokio::time::timeout(self.connect_timeout, dial::dial(addr)).await {
            Ok(Ok(c)) => Ok(UpConn {
                io: EagerStream::new(c),
                buf: Vec::with_capacity(READ_BUF),
                memo: Box::default(),
            }),
            Ok(Err(e)) => Err(Failure::Connect(e)),
            Err(_) => Err(Failure::Connect(super::client::ConnectFailure::Timeout {
                addr: addr.to_string(),
                secs: self.connect_timeout.as_secs(),
            })),
        }
    }
}

/// Interim (1xx) answers taken before the final one; more is a broken or hostile server.
const MAX_INTERIM_HEADS: usize = 16;

/// One request written (encoded in the connection's read buffer, which it leaves empty) and its
/// final response head read; the bytes after the head stay in the connection's buffer, from the
/// offset returned on (left where they were read: a body that came with its head is not moved).
/// On failure, whether any byte of an answer had arrived.
async fn round_trip(
    conn: &mut UpConn,
    request: &UpstreamHead,
    server_addr: &str,
    plain: Option<Plain>,
) -> Result<(Answer, usize, BodyLength), (bool, String)> {
    let head_only = request.method == Method::HEAD;
    conn.buf.clear();
    encode_request_into(&mut conn.buf, request, server_addr);
    // Where the head being parsed starts (past any interim heads).
    let mut at = 0;
    let mut interim = 0;
    // Failures are worded as hyper's client words them, so the error body is the hyper path's.
    let written = conn.io.write_all(&conn.buf).await;
    conn.buf.clear();
    written.map_err(|_| (false, "connection error".to_string()))?;
    loop {
        if conn.buf.capacity() - conn.buf.len() < 1024 {
            conn.buf.reserve(READ_BUF);
        }
        let start = conn.buf.len();
        let n = conn
            .io
            .read_buf(&mut conn.buf)
            .await
            .map_err(|_| (!conn.buf.is_empty(), "connection error".to_string()))?;
        if n == 0 {
            return Err((
                !conn.buf.is_empty(),
                "connection closed before message completed".into(),
            ));
        }
        // A head is only ever complete at an LF: a later read that brought none, under the
        // limit, changes no answer, and the head is not parsed again from its start (a server
        // that sent a long head a byte at a time cost a parse of all of it per byte: quadratic).
        // A head's first read is parsed whatever it holds: bytes that are no HTTP at all (a TLS
        // alert from a port that speaks TLS, 7 bytes without an LF) are refused at once, a 502,
        // not left waiting for an LF until the header timeout.
        if start > at
            && conn.buf.len() - at < MAX_RESPONSE_HEAD
            && !conn.buf[start..].contains(&b'\n')
        {
            continue;
        }
        loop {
            #[cfg(test)]
            tests::HEAD_PARSES.with(|n| n.set(n.get() + 1));
            match plain {
                Some(Plain { via, hpack: false }) => {
                    let mut out = Vec::new();
                    if let Some(p) =
                        conn.memo
                            .write_plain(&conn.buf[at..], head_only, via, &mut out)
                    {
                        return Ok((Answer::Plain(p, out), at + p.len, p.length));
                    }
                }
                Some(Plain { via, hpack: true }) => {
                    let mut out = Vec::new();
                    if let Some(p) =
                        conn.memo
                            .write_plain_hpack(&conn.buf[at..], head_only, via, &mut out)
                    {
                        let map = hpack_rest(&p, &mut out);
                        let head = p.head;
                        return Ok((Answer::Hpack(head, out, map), at + head.len, head.length));
                    }
                }
                None => {}
            }
            match response_head::parse_with(&conn.buf[at..], field_maps::take) {
                Ok(None) if conn.buf.len() - at >= MAX_RESPONSE_HEAD => {
                    return Err((true, "message head is too large".into()))
                }
                Ok(None) => break,
                Ok(Some(head)) if head.status.is_informational() => {
                    if head.status == StatusCode::SWITCHING_PROTOCOLS {
                        return Err((true, "invalid HTTP status-code parsed".into()));
                    }
                    // An interim answer (100, 103): the final one follows. A few at most:
                    // each stays in the buffer, and an endless run would grow it until the
                    // header timeout.
                    interim += 1;
                    if interim > MAX_INTERIM_HEADS {
                        return Err((true, "too many informational responses".into()));
                    }
                    at += head.len;
                    if at == conn.buf.len() {
                        // Nothing of the next head yet: its first read is parsed.
                        break;
                    }
                }
                Ok(Some(head)) => {
                    let length = head
                        .body_length(head_only)
                        .map_err(|_| (true, "invalid content-length parsed".to_string()))?;
                    let body_at = at + head.len;
                    return Ok((Answer::Map(head), body_at, length));
                }
                Err(e) => return Err((true, hyper_wording(&e).to_string())),
            }
        }
    }
}

/// What a plain head's HPACK lines still need: a `Date` line when the server sent none (hyper's
/// server does not date HTTP/2 responses here; `server::date`), and the server's `Alt-Svc` in the
/// response's map, where the listener looks before adding its own. Most heads need no map.
fn hpack_rest(p: &plain_head::PlainHpack<'_>, out: &mut Vec<u8>) -> HeaderMap {
    if !p.head.has_date {
        date::with_text(|d| plain_head::hpack_field(out, b"date", d.as_bytes()));
    }
    // (httparse refused control characters in values: this converts.)
    match p
        .alt_svc
        .and_then(|v| header::HeaderValue::from_bytes(v).ok())
    {
        Some(alt_svc) => {
            let mut map = field_maps::take(1);
            map.insert(header::ALT_SVC, alt_svc);
            map
        }
        None => HeaderMap::new(),
    }
}

/// What hyper's client says of a response head it cannot parse.
fn hyper_wording(e: &response_head::HeadError) -> &'static str {
    use response_head::HeadError;
    match e {
        HeadError::Malformed(m) if m.contains("version") => "invalid HTTP version parsed",
        HeadError::Malformed(m) if m.contains("status") => "invalid HTTP status-code parsed",
        HeadError::TooManyFields => "message head is too large",
        HeadError::BadLength => "invalid content-length parsed",
        _ => "invalid HTTP header parsed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::uri::PathAndQuery;
    use http::HeaderValue;

    thread_local! {
        /// The looks at an upstream's response head `round_trip` took on this thread.
        pub(super) static HEAD_PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// The last field's last coding frames the body: `chunked` then `gzip` in two fields is
    /// a body read until close, named to the client as both codings.
    #[test]
    fn codings_join_every_transfer_encoding_field() {
        let mut headers = HeaderMap::new();
        assert!(codings(&headers).is_none());
        headers.append(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert!(ends_chunked(codings(&headers).as_ref()));
        headers.append(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
        let joined = codings(&headers).unwrap();
        assert_eq!(joined, "chunked, gzip");
        assert!(!ends_chunked(Some(&joined)));
        let mut reversed = HeaderMap::new();
        reversed.append(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
        reversed.append(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert!(ends_chunked(codings(&reversed).as_ref()));
    }

    fn head(fields: &[(&str, &str)], host: Option<&str>) -> UpstreamHead {
        let mut headers = HeaderMap::new();
        for (k, v) in fields {
            headers.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        UpstreamHead {
            method: Method::GET,
            path_and_query: PathAndQuery::from_static("/a?b=c"),
            headers,
            upgrade: false,
            host: host.map(|h| ClientHost::Field(HeaderValue::from_str(h).unwrap())),
            forwarding: None,
        }
    }

    /// Stray bytes on an idle connection are seen even by a task that has spent its cooperative
    /// budget (an HTTP/2 connection's task polls every stream's exchange): the connection is
    /// dropped, not reused.
    #[tokio::test]
    async fn stray_bytes_are_seen_even_out_of_budget() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let pool = Arc::new(FastPool {
            servers: vec![Mutex::default()],
            max_idle: 4,
            idle_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(1),
            sweeping: false.into(),
        });
        for stray in [false, true] {
            let Ok(conn) = pool.connect(&addr).await else {
                panic!("connect")
            };
            let (mut server, _) = listener.accept().await.unwrap();
            pool.checkin(0, conn);
            if stray {
                server
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!")
                    .await
                    .unwrap();
            }
            // The runtime sees the socket readable.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
            for _ in 0..1000 {
                tx.send(()).unwrap();
            }
            let reused = std::future::poll_fn(|cx| {
                // Until the budget is spent: then a ready channel answers `Pending`.
                while let std::task::Poll::Ready(Some(())) = rx.poll_recv(cx) {}
                std::task::Poll::Ready(pool.checkout(0).is_some())
            })
            .await;
            assert_eq!(reused, !stray, "stray bytes: {stray}");
            drop(server);
        }
    }

    /// A response head a server sends a byte at a time (an interim head first) is looked at once
    /// per read that brought an LF and once at each head's first read (two here), not once per
    /// read: parsing it all again after every byte was quadratic (a 64 KiB head cost about 4e9
    /// bytes scanned). Both ways of reading it (passed on as it came, or into a field map) still
    /// end at the right place.
    #[tokio::test]
    async fn a_response_head_sent_a_byte_at_a_time_is_parsed_once_per_line() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let pool = Arc::new(FastPool {
            servers: vec![Mutex::default()],
            max_idle: 4,
            idle_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(1),
            sweeping: false.into(),
        });
        let mut answer =
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..4 {
            answer.extend_from_slice(format!("X-{i}: {}\r\n", "v".repeat(100)).as_bytes());
        }
        answer.extend_from_slice(b"Content-Length: 2\r\n\r\nok");
        let lines = answer.iter().filter(|&&b| b == b'\n').count();
        for plain in [
            None,
            Some(Plain {
                via: false,
                hpack: false,
            }),
        ] {
            let Ok(mut conn) = pool.connect(&addr).await else {
                panic!("connect")
            };
            let (mut server, _) = listener.accept().await.unwrap();
            server.set_nodelay(true).unwrap();
            let sent = answer.clone();
            let origin = tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let mut byte = [0u8];
                    tokio::io::AsyncReadExt::read_exact(&mut server, &mut byte)
                        .await
                        .unwrap();
                    head.push(byte[0]);
                }
                for b in sent {
                    server.write_all(&[b]).await.unwrap();
                    // Each byte in a segment (and a read) of its own, mostly.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                server
            });
            HEAD_PARSES.with(|n| n.set(0));
            let request = head(&[], Some("x"));
            let Ok((got, body_at, length)) = round_trip(&mut conn, &request, &addr, plain).await
            else {
                panic!("no answer")
            };
            let parses = HEAD_PARSES.with(std::cell::Cell::get);
            assert_eq!(got.status(), StatusCode::OK);
            assert_eq!(length, BodyLength::Exact(2));
            let _server = origin.await.unwrap();
            assert!(
                parses <= lines + 2,
                "{parses} looks at a {}-byte head of {lines} lines (plain: {plain:?})",
                answer.len()
            );
            // The head ended where it did: what follows is (a start of) the body.
            assert!(b"ok".starts_with(&conn.buf[body_at..]));
        }
    }

    #[test]
    fn request_head_bytes() {
        let h = head(
            &[("accept", "*/*"), ("x-a", "1"), ("x-a", "2")],
            Some("example.com"),
        );
        assert_eq!(
            encode_request(&h, "127.0.0.1:9"),
            b"GET /a?b=c HTTP/1.1\r\naccept: */*\r\nx-a: 1\r\nx-a: 2\r\nhost: example.com\r\n\r\n"
        );
        let h = head(&[("host", "added"), ("x-b", "1")], None);
        assert_eq!(
            encode_request(&h, "127.0.0.1:9"),
            b"GET /a?b=c HTTP/1.1\r\nhost: 127.0.0.1:9\r\nx-b: 1\r\n\r\n"
        );
    }

    #[test]
    fn a_plain_length_is_kept_and_any_other_rewritten() {
        let with = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::CONTENT_LENGTH, HeaderValue::from_str(v).unwrap());
            }
            h
        };
        assert!(says_length(&with(&["42"]), 42));
        assert!(says_length(&with(&["0"]), 0));
        for odd in [
            &["042"][..],
            &["42", "42"],
            &["+42"],
            &["4 2"],
            &["43"],
            &[],
        ] {
            assert!(!says_length(&with(odd), 42), "{odd:?}");
        }
    }

    #[test]
    fn response_head_bytes() {
        let mut headers = HeaderMap::new();
        headers.insert(header::DATE, HeaderValue::from_static("x"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        let mut out = Vec::new();
        write_head(&mut out, 404, &headers, Some(3), true);
        assert_eq!(
            out,
            b"HTTP/1.1 404 Not Found\r\ndate: x\r\ncontent-length: 3\r\nconnection: close\r\n\r\n"
        );
    }
}
