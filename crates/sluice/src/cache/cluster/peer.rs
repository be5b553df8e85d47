//! Talking to peers: the keep-alive client, a miss relayed to its owner (streamed back as it
//! arrives, continued from the byte reached on the next node or the origin when the owner fails
//! mid-body), and the signed control requests (purge fan-out, purge log).

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sha2::Digest;
use sluice_http::hop::strip_hop_by_hop;

use super::hop::{HopKey, HOP_HEADER};
use super::ring::Member;
use crate::body::Body;

/// A request relayed to the owner: as the client sent it (method, authority, target, end-to-end
/// headers), so the owner routes and keys it exactly as this node would.
#[derive(Debug, Clone)]
pub struct RelayRequest {
    pub method: Method,
    pub authority: String,
    pub target: String,
    pub headers: HeaderMap,
    /// The route's idle wait on its origin: an answer the owner passes straight through (one it
    /// does not cache) goes as slowly as that allows.
    pub body_idle: Duration,
}

/// The largest control answer taken from a peer (a purge log page: at most 1,000 entries and,
/// past its first, 16 MiB of them, `purge_log::PAGE_BYTES`). A longer one fails the exchange
/// (the check, for a log pull) instead of growing this node's memory at the peer's pace.
pub const MAX_CONTROL_ANSWER: usize = 64 << 20;

/// Why a peer exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("peer {0}: {1}")]
    Failed(String, String),
    #[error("peer {0} timed out")]
    Timeout(String),
}

/// The keep-alive client every peer exchange goes through.
#[derive(Clone)]
pub struct PeerClient {
    client: Client<HttpConnector, Full<Bytes>>,
    key: HopKey,
    from: String,
    /// Connecting and control exchanges.
    timeout: Duration,
    /// A relayed miss's response head: the owner's own wait for the origin's head, and a
    /// connect timeout more, so a slow origin times out at the owner (answered there, booked to
    /// the origin) before this side gives the owner up as failed.
    head_timeout: Duration,
    /// A relayed body's longest silence: the owner's own idle wait on the origin, and a connect
    /// timeout more. Past it the owner counts as failed mid-body.
    idle_timeout: Duration,
}

/// The body hash a control request's marker binds.
pub fn body_digest(body: &[u8]) -> String {
    sha2::Sha256::digest(body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl PeerClient {
    /// `origin_head` and `origin_idle` are the origin timeouts an owner fills with.
    pub fn new(
        key: HopKey,
        from: &str,
        timeout: Duration,
        origin_head: Duration,
        origin_idle: Duration,
    ) -> PeerClient {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(64)
            .build(http);
        PeerClient {
            client,
            key,
            from: from.to_string(),
            timeout,
            head_timeout: origin_head + timeout,
            idle_timeout: origin_idle + timeout,
        }
    }

    /// Sends `req` to `owner` with the hop marker; the response head, with the body streaming.
    pub async fn relay(
        &self,
        owner: &Member,
        req: &RelayRequest,
    ) -> Result<Response<hyper::body::Incoming>, PeerError> {
        let fail = |e: String| PeerError::Failed(owner.addr.clone(), e);
        let mut headers = req.headers.clone();
        strip_hop_by_hop(&mut headers, false);
        headers.remove(HOP_HEADER);
        // The relayed request carries no body (a cached route's GET or HEAD): the client's
        // framing fields must not go on with it, or the owner waits for bytes that never come.
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::EXPECT);
        headers.insert(
            header::HOST,
            HeaderValue::from_str(&req.authority).map_err(|e| fail(e.to_string()))?,
        );
        // The marker vouches for the forwarding fields too (`hop::vouched_target`).
        let vouched = super::hop::vouched_target(&req.target, &headers);
        headers.insert(
            HOP_HEADER,
            self.key
                .sign(&self.from, req.method.as_str(), &req.authority, &vouched),
        );
        let mut out = Request::new(Full::new(Bytes::new()));
        *out.method_mut() = req.method.clone();
        *out.uri_mut() = format!("http://{}{}", owner.addr, req.target)
            .parse()
            .map_err(|e: http::uri::InvalidUri| fail(e.to_string()))?;
        *out.headers_mut() = headers;
        match tokio::time::timeout(self.head_timeout, self.client.request(out)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(fail(e.to_string())),
            Err(_) => Err(PeerError::Timeout(owner.addr.clone())),
        }
    }

    /// A signed control request to `member`'s control listener; the whole answer body.
    pub async fn control(
        &self,
        member: &Member,
        method: Method,
        target: &str,
        body: Bytes,
    ) -> Result<(http::StatusCode, Bytes), PeerError> {
        let fail = |e: String| PeerError::Failed(member.addr.clone(), e);
        let digest = body_digest(&body);
        let mut req = Request::new(Full::new(body));
        *req.uri_mut() = format!("http://{}{target}", member.control)
            .parse()
            .map_err(|e: http::uri::InvalidUri| fail(e.to_string()))?;
        req.headers_mut().insert(
            HOP_HEADER,
            self.key.sign(&self.from, method.as_str(), &digest, target),
        );
        *req.method_mut() = method;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| fail(e.to_string()))?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_CONTROL_ANSWER)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        fail(format!("answer over {MAX_CONTROL_ANSWER} bytes"))
                    } else {
                        fail(e.to_string())
                    }
                })?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| PeerError::Timeout(member.addr.clone()))?
    }
}

impl PeerClient {
    /// A signed control request whose answer streams back (a fill another front end asked the
    /// owner for); the head within the relay's head timeout.
    pub async fn control_stream(
        &self,
        member: &Member,
        target: &str,
        body: Bytes,
    ) -> Result<Response<hyper::body::Incoming>, PeerError> {
        let fail = |e: String| PeerError::Failed(member.addr.clone(), e);
        let digest = body_digest(&body);
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = format!("http://{}{target}", member.control)
            .parse()
            .map_err(|e: http::uri::InvalidUri| fail(e.to_string()))?;
        req.headers_mut().insert(
            HOP_HEADER,
            self.key.sign(&self.from, "POST", &digest, target),
        );
        match tokio::time::timeout(self.head_timeout, self.client.request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(fail(e.to_string())),
            Err(_) => Err(PeerError::Timeout(member.addr.clone())),
        }
    }
}

impl PeerClient {
    /// `owner`'s answer as this node passes it on: hop-by-hop fields gone, the body streaming,
    /// given up (an error, which the relay continues elsewhere) after [`PeerClient::idle_timeout`]
    /// without a byte: an owner that stops sending without closing (paused, or cut off by a
    /// network that drops packets) would otherwise hold the client for good.
    /// `body_idle` is the route's own idle wait (zero for none): the longer of the two, and a
    /// connect timeout, is the relayed body's.
    pub fn relayed(
        &self,
        resp: Response<hyper::body::Incoming>,
        owner: &str,
        body_idle: Duration,
    ) -> Response<Body> {
        let (mut parts, incoming) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers, false);
        let body = crate::upstream::body::UpstreamBody::new(
            incoming,
            self.idle_timeout.max(body_idle + self.timeout),
            format!("cache cluster peer {owner}"),
            crate::atomic::Counter::default(),
        );
        Response::from_parts(parts, crate::body::boxed(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A member at `addr` (a test's own owner).
    fn owner_at(addr: std::net::SocketAddr) -> Member {
        Member {
            addr: addr.to_string(),
            control: addr,
            weight: 1,
            state: std::sync::Arc::new(crate::cache::cluster::ring::PeerState::new(false)),
        }
    }

    /// A `GET /object` for `app.test` with `headers`, relayed with the route's `body_idle`.
    fn get_object(headers: HeaderMap, body_idle: Duration) -> RelayRequest {
        RelayRequest {
            method: Method::GET,
            authority: "app.test".into(),
            target: "/object".into(),
            headers,
            body_idle,
        }
    }

    /// A client's `GET` with a body, relayed: the owner gets the head without the client's
    /// `Content-Length` or `Expect` (there is no body to go with them), and answers at once.
    #[tokio::test]
    async fn a_relayed_request_carries_no_framing_field_of_the_clients() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let owner_saw = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "the head ended early");
                head.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            String::from_utf8(head).unwrap().to_ascii_lowercase()
        });
        let peer = PeerClient::new(
            HopKey::new("a shared secret"),
            "127.0.0.1:1",
            Duration::from_secs(2),
            Duration::from_secs(2),
            Duration::from_secs(2),
        );
        let owner = owner_at(addr);
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        headers.insert(header::EXPECT, HeaderValue::from_static("100-continue"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        let req = get_object(headers, Duration::ZERO);
        let resp = peer.relay(&owner, &req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let head = owner_saw.await.unwrap();
        assert!(head.starts_with("get /object http/1.1\r\n"), "{head}");
        assert!(head.contains("x-kept: 1\r\n"), "{head}");
        assert!(!head.contains("content-length"), "{head}");
        assert!(!head.contains("expect"), "{head}");
    }

    /// A control answer longer than [`MAX_CONTROL_ANSWER`] (a peer, or something in its place,
    /// sending a log page without end) fails the exchange instead of being kept whole.
    #[tokio::test]
    async fn a_control_answer_over_the_bound_fails_the_exchange() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await.unwrap();
            let len = MAX_CONTROL_ANSWER + 1;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
            s.write_all(head.as_bytes()).await.unwrap();
            let chunk = vec![b' '; 1 << 20];
            let mut left = len;
            while left > 0 {
                let n = left.min(chunk.len());
                // The client may stop reading at the bound.
                if s.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
                left -= n;
            }
        });
        let peer = PeerClient::new(
            HopKey::new("a shared secret"),
            "127.0.0.1:1",
            Duration::from_secs(20),
            Duration::from_secs(2),
            Duration::from_secs(2),
        );
        let got = peer
            .control(&owner_at(addr), Method::GET, "/cluster/log", Bytes::new())
            .await;
        let e = match got {
            Ok((_, b)) => panic!("an answer over the bound was kept ({} bytes)", b.len()),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("answer over 67108864 bytes"), "{e}");
    }

    /// An owner that sends the head and part of the body, then nothing (paused, or cut off by
    /// a network that drops packets) while its connection stays open: the relayed body ends in
    /// an error after the idle wait (which the relay continues elsewhere) instead of holding the
    /// client for good.
    #[tokio::test]
    async fn a_relayed_body_that_goes_silent_ends_in_an_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (hold_tx, hold_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
                .await
                .unwrap();
            s.write_all(&[7u8; 400]).await.unwrap();
            // The connection stays open, silent, until the test ends.
            let _ = hold_rx.await;
        });
        let peer = PeerClient::new(
            HopKey::new("a shared secret"),
            "127.0.0.1:1",
            Duration::from_millis(200),
            Duration::from_secs(2),
            Duration::from_millis(300),
        );
        let owner = owner_at(addr);
        let req = get_object(HeaderMap::new(), Duration::ZERO);
        let resp = peer.relay(&owner, &req).await.unwrap();
        let mut body = peer.relayed(resp, &owner.addr, Duration::ZERO).into_body();
        let mut got = 0;
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match body.frame().await {
                    Some(Ok(f)) => got += f.into_data().map_or(0, |d| d.len()),
                    Some(Err(e)) => return Err(e.to_string()),
                    None => return Ok(()),
                }
            }
        })
        .await
        .expect("the silent body held on past its idle wait");
        assert_eq!(got, 400);
        let e = ended.unwrap_err();
        assert!(e.contains("sent nothing"), "{e}");
        drop(hold_tx);
    }

    /// A route whose own idle wait is longer than the origin's (an answer the owner passes
    /// through uncached: a long poll, a stream with gaps): the relayed body keeps the longer one.
    #[tokio::test]
    async fn a_relayed_body_keeps_the_routes_longer_idle_wait() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 800\r\n\r\n")
                .await
                .unwrap();
            s.write_all(&[7u8; 400]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(900)).await;
            s.write_all(&[7u8; 400]).await.unwrap();
        });
        let peer = PeerClient::new(
            HopKey::new("a shared secret"),
            "127.0.0.1:1",
            Duration::from_millis(200),
            Duration::from_secs(2),
            Duration::from_millis(300),
        );
        let owner = owner_at(addr);
        let req = get_object(HeaderMap::new(), Duration::from_secs(2));
        let resp = peer.relay(&owner, &req).await.unwrap();
        let body = peer.relayed(resp, &owner.addr, req.body_idle).into_body();
        let got = tokio::time::timeout(Duration::from_secs(5), body.collect())
            .await
            .unwrap()
            .expect("cut at the origin's shorter idle wait")
            .to_bytes();
        assert_eq!(got.len(), 800);
    }
}
