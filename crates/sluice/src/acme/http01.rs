//! The plain-HTTP listener of `acme.http_listen`: HTTP-01 answers under
//! `/.well-known/acme-challenge/` (this process's open challenges, then those other nodes recorded
//! in the shared state directory), and a redirect to `https://` for everything else. Nothing else
//! runs here: no route, no auth, no body read.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::certs::Certs;
use super::metrics::AcmeMetrics;
use crate::net::per_ip::PerIp;

/// Marks the 400 of a target no redirect can name (told apart from a missing Host in metrics).
#[derive(Clone, Copy)]
struct NoTarget;

/// The challenge path prefix (RFC 8555 section 8.3).
pub const PREFIX: &str = "/.well-known/acme-challenge/";

/// Connections open at once on these listeners; past it, new ones wait in the backlog.
const MAX_CONNECTIONS: usize = 1024;

/// Connections one client address (an IPv6 one by its /64, which one host commonly holds whole)
/// may hold at once; past it, a new one is closed at once. A CA's validation is one or two
/// connections from each of its vantage points, so one client cannot hold the listener's every
/// place and keep validations out; visitors sent on to `https://` from behind one NAT share the
/// allowance (each holds a connection briefly).
const MAX_PER_IP: usize = 32;

/// How long a request head may take to arrive, and a whole connection to last: a validation is
/// one small request on a connection of its own, and a connection serves one request only, so
/// a place is held briefly whatever a client does.
const HEAD_TIME: Duration = Duration::from_secs(5);
const CONNECTION_TIME: Duration = Duration::from_secs(15);

/// Tokens looked up in the state directory at once (a file read each, off the runtime's
/// threads); a request that finds none free within `LOOKUP_TIME` gets the 404 of an unknown
/// token, so made-up tokens cannot tie up the blocking threads the disk cache shares.
const MAX_LOOKUPS: usize = 4;

/// How long a token's look-up in the state directory (a slow network file system) may take.
const LOOKUP_TIME: Duration = Duration::from_secs(5);

/// How a plain listener is bound: an address in, a listening socket out.
pub type Bind = fn(SocketAddr) -> std::io::Result<std::net::TcpListener>;

/// Binds every address with `bind` and serves until the runtime ends. Returns the bound
/// addresses.
pub fn start(
    addrs: &[SocketAddr],
    certs: Arc<Certs>,
    bind: Bind,
    metrics: AcmeMetrics,
) -> anyhow::Result<Vec<SocketAddr>> {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let per_ip = PerIp::by_network(MAX_PER_IP, Vec::new());
    let mut bound = Vec::new();
    for addr in addrs {
        let std = bind(*addr).map_err(|e| anyhow::anyhow!("acme.http_listen {addr}: {e}"))?;
        std.set_nonblocking(true)?;
        let listener = TcpListener::from_std(std)?;
        bound.push(listener.local_addr()?);
        tokio::spawn(accept(
            listener,
            certs.clone(),
            permits.clone(),
            per_ip.clone(),
            metrics.clone(),
        ));
    }
    Ok(bound)
}

async fn accept(
    listener: TcpListener,
    certs: Arc<Certs>,
    permits: Arc<Semaphore>,
    per_ip: Arc<PerIp>,
    metrics: AcmeMetrics,
) {
    let lookups = Arc::new(Semaphore::new(MAX_LOOKUPS));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (stream, place) = match listener.accept().await {
            Ok((s, peer)) => match per_ip.take(peer.ip()) {
                Some(place) => (s, place),
                None => {
                    metrics.plain("per_client_refused");
                    tracing::debug!(%peer, "acme.http_listen: connection closed: too many from this address");
                    continue;
                }
            },
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "acme.http_listen: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let certs = certs.clone();
        let lookups = lookups.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let resp = answer(&certs, &req);
                let (certs, lookups, metrics) = (certs.clone(), lookups.clone(), metrics.clone());
                async move {
                    let resp = or_shared(resp, &req, certs, lookups, &metrics).await;
                    metrics.plain(match resp.status() {
                        StatusCode::OK => "challenge",
                        StatusCode::NOT_FOUND => "no_challenge",
                        StatusCode::PERMANENT_REDIRECT => "redirect",
                        _ if resp.extensions().get::<NoTarget>().is_some() => "bad_target",
                        _ => "bad_host",
                    });
                    Ok::<_, Infallible>(resp)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIME)
                .keep_alive(false)
                .max_buf_size(16 * 1024)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIME, conn).await;
            drop((permit, place));
        });
    }
}

/// The answer to one request on the plain listener.
pub fn answer<B>(certs: &Certs, req: &Request<B>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if let Some(token) = path.strip_prefix(PREFIX) {
        return match certs.http_token(token) {
            Some(key_auth) => reply(StatusCode::OK, "text/plain", key_auth),
            None => reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                "no such challenge\n".into(),
            ),
        };
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<http::uri::Authority>().ok());
    let Some(host) = host else {
        return reply(
            StatusCode::BAD_REQUEST,
            "text/plain",
            "a Host header is required\n".into(),
        );
    };
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let location = format!("https://{}{target}", host.host());
    match header::HeaderValue::from_str(&location) {
        Ok(v) => {
            let mut resp = reply(StatusCode::PERMANENT_REDIRECT, "text/plain", String::new());
            resp.headers_mut().insert(header::LOCATION, v);
            resp
        }
        // Never a redirect that says nowhere.
        Err(_) => {
            let mut resp = reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                "no redirect for this target\n".into(),
            );
            resp.extensions_mut().insert(NoTarget);
            resp
        }
    }
}

/// A challenge this process does not hold (`answer` said 404) may be another node's, placed
/// through the shared state directory, or the previous process's before a binary upgrade: its
/// answer is looked up there. Any other response is returned as it is.
async fn or_shared<B>(
    resp: Response<Full<Bytes>>,
    req: &Request<B>,
    certs: Arc<Certs>,
    lookups: Arc<Semaphore>,
    metrics: &AcmeMetrics,
) -> Response<Full<Bytes>> {
    let token = match req.uri().path().strip_prefix(PREFIX) {
        Some(t)
            if resp.status() == StatusCode::NOT_FOUND
                && certs.shares_http_tokens()
                && super::store::well_formed_token(t) =>
        {
            t
        }
        _ => return resp,
    };
    let token = token.to_string();
    let found = tokio::time::timeout(LOOKUP_TIME, async {
        // The place is held by the read itself, so one that outlives the wait still counts.
        let place = lookups.acquire_owned().await.ok()?;
        tokio::task::spawn_blocking(move || {
            let found = certs.shared_http_token(&token);
            drop(place);
            found
        })
        .await
        .ok()
        .flatten()
    })
    .await;
    match found {
        Ok(Some(key_auth)) => reply(StatusCode::OK, "text/plain", key_auth),
        Ok(None) => resp,
        Err(_) => {
            metrics.plain("lookup_timeout");
            resp
        }
    }
}

fn reply(status: StatusCode, kind: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenge_or_redirect() {
        let certs = Certs::default();
        certs.open_http_token("tok", "tok.thumb");
        let get = |uri: &str, host: Option<&str>| {
            let mut b = Request::builder().uri(uri);
            if let Some(h) = host {
                b = b.header("host", h);
            }
            answer(&certs, &b.body(()).unwrap())
        };
        let r = get("/.well-known/acme-challenge/tok", None);
        assert_eq!(r.status(), 200);
        assert_eq!(get("/.well-known/acme-challenge/other", None).status(), 404);
        let r = get("/a/b?c=d", Some("example.com:80"));
        assert_eq!(r.status(), 308);
        assert_eq!(r.headers()["location"], "https://example.com/a/b?c=d");
        assert_eq!(get("/", None).status(), 400);
        assert_eq!(get("/", Some("bad host")).status(), 400);
    }
}
