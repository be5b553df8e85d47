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
}

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
    /// A relayed miss's response head (the owner may be asking the origin).
    head_timeout: Duration,
}

/// The body hash a control request's marker binds.
pub fn body_digest(body: &[u8]) -> String {
    sha2::Sha256::digest(body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl PeerClient {
    pub fn new(key: HopKey, from: &str, timeout: Duration, head_timeout: Duration) -> PeerClient {
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
            head_timeout,
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
        headers.insert(
            header::HOST,
            HeaderValue::from_str(&req.authority).map_err(|e| fail(e.to_string()))?,
        );
        headers.insert(
            HOP_HEADER,
            self.key
                .sign(&self.from, req.method.as_str(), &req.authority, &req.target),
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
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| fail(e.to_string()))?
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

/// The owner's answer as this node passes it on: hop-by-hop fields gone, the body streaming.
pub fn relayed(resp: Response<hyper::body::Incoming>) -> Response<Body> {
    let (mut parts, incoming) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    Response::from_parts(parts, crate::body::boxed(incoming))
}
