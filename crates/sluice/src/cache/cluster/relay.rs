//! A miss through its owner: the request goes to the owner with the hop marker and the answer
//! streams back as it arrives. An owner that fails before its head costs a retry on the next
//! node of the ring, then this node's own fill; one that fails mid-body is continued from the
//! byte reached (a `Range` with `If-Range` on the next node or this node's cache), so a dead
//! node cuts only its own clients' connections.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use http_body::{Frame, SizeHint};
use sluice_http::range::{parse_range, RangeSpec};

use super::peer::RelayRequest;
use super::ring::Owner;
use super::Cluster;
use crate::body::{Body, BoxError};
use crate::cache::CacheKey;

/// Serves a request on this node (its own cache and origin), given the request headers to use.
pub type Local =
    Arc<dyn Fn(HeaderMap) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>> + Send + Sync>;

/// Owners tried before a request (or the rest of a body) is served here.
const OWNER_TRIES: usize = 2;

impl Cluster {
    /// The answer to a miss owned by another node, fetched through it; `None` when this node
    /// owns the key or no owner answered (serve it here).
    pub async fn through_owner(
        self: &Arc<Self>,
        key: &CacheKey,
        req: RelayRequest,
        local: Local,
    ) -> Option<Response<Body>> {
        let mut skip: Option<String> = None;
        for _ in 0..OWNER_TRIES {
            let Owner::Peer(owner) = self.ring.owner(&key.0, skip.as_deref()) else {
                return None;
            };
            match self.peer.relay(&owner, &req).await {
                // Any answer is the owner's to give (a 5xx is the origin's, passed on).
                Ok(resp) => {
                    owner.state.report_success();
                    self.metrics.peer_fills.inc();
                    let resp = self.peer.relayed(resp, &owner.addr, req.body_idle);
                    let resume = Resume::plan(&req, &resp);
                    return Some(match resume {
                        Some((next, end, validator)) => resp.map(|body| {
                            crate::body::boxed(Resuming {
                                cluster: self.clone(),
                                key: key.clone(),
                                req,
                                local,
                                current: body,
                                next,
                                end,
                                validator,
                                failed: owner.addr.clone(),
                                tries: 0,
                                pending: None,
                            })
                        }),
                        None => resp,
                    });
                }
                Err(e) => {
                    tracing::debug!(error = %e, "owner unreachable");
                    self.owner_failed(&owner.state);
                    skip = Some(owner.addr.clone());
                }
            }
        }
        None
    }

    pub(super) fn owner_failed(&self, state: &super::ring::PeerState) {
        self.metrics.owner_failures.inc();
        if state.report_failure(self.config.max_fails) {
            tracing::warn!("cache cluster owner taken out of the ring after failures");
        }
    }
}

/// How a body can be continued: the next byte, the last byte, and the validator that proves a
/// continuation is of the same version.
struct Resume;

impl Resume {
    fn plan(req: &RelayRequest, resp: &Response<Body>) -> Option<(u64, u64, HeaderValue)> {
        if req.method != http::Method::GET {
            return None;
        }
        if let Some(r) = req.headers.get(header::RANGE) {
            // One range only: several come back as multipart, not continued.
            let specs = r.to_str().ok().and_then(parse_range)?;
            if specs.len() != 1 || !matches!(specs[0], RangeSpec::From { .. }) {
                return None;
            }
        }
        let h = resp.headers();
        let validator = h
            .get(header::ETAG)
            .filter(|v| !v.as_bytes().starts_with(b"W/"))
            .or_else(|| h.get(header::LAST_MODIFIED))?
            .clone();
        match resp.status() {
            StatusCode::OK => {
                let len: u64 = h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()?;
                (len > 0).then_some((0, len - 1, validator))
            }
            StatusCode::PARTIAL_CONTENT => {
                let cr = h.get(header::CONTENT_RANGE)?.to_str().ok()?;
                let span = cr.strip_prefix("bytes ")?.split('/').next()?;
                let (a, b) = span.split_once('-')?;
                Some((a.parse().ok()?, b.parse().ok()?, validator))
            }
            _ => None,
        }
    }
}

type Continuation = Pin<Box<dyn Future<Output = Option<Body>> + Send>>;

/// A relayed body that carries on elsewhere when the owner fails mid-body.
struct Resuming {
    cluster: Arc<Cluster>,
    key: CacheKey,
    req: RelayRequest,
    local: Local,
    current: Body,
    /// The next byte to send and the last one, in the object.
    next: u64,
    end: u64,
    validator: HeaderValue,
    failed: String,
    tries: usize,
    pending: Option<Continuation>,
}

/// Whether `resp` continues at `next`.
fn continues_at(resp: &Response<Body>, next: u64) -> bool {
    resp.status() == StatusCode::PARTIAL_CONTENT
        && resp
            .headers()
            .get(header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes "))
            .and_then(|v| v.split('-').next())
            .and_then(|a| a.parse::<u64>().ok())
            == Some(next)
}

impl Resuming {
    fn continuation(&mut self) -> Continuation {
        let cluster = self.cluster.clone();
        let key = self.key.clone();
        let mut req = self.req.clone();
        let local = self.local.clone();
        let (next, end, failed) = (self.next, self.end, self.failed.clone());
        req.headers.insert(
            header::RANGE,
            HeaderValue::from_str(&format!("bytes={next}-{end}")).expect("ascii"),
        );
        req.headers.insert(header::IF_RANGE, self.validator.clone());
        for h in [
            header::IF_NONE_MATCH,
            header::IF_MODIFIED_SINCE,
            header::IF_MATCH,
        ] {
            req.headers.remove(h);
        }
        Box::pin(async move {
            cluster.metrics.resumed.inc();
            if let Some(m) = cluster
                .ring
                .view()
                .members
                .iter()
                .find(|m| m.addr == failed)
            {
                cluster.owner_failed(&m.state);
            }
            if let Owner::Peer(owner) = cluster.ring.owner(&key.0, Some(&failed)) {
                if let Ok(resp) = cluster.peer.relay(&owner, &req).await {
                    let resp = cluster.peer.relayed(resp, &owner.addr, req.body_idle);
                    if continues_at(&resp, next) {
                        return Some(resp.into_body());
                    }
                }
            }
            let resp = local(req.headers).await;
            continues_at(&resp, next).then(|| resp.into_body())
        })
    }
}

impl http_body::Body for Resuming {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        loop {
            if let Some(p) = this.pending.as_mut() {
                match p.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(body)) => {
                        this.pending = None;
                        this.current = body;
                    }
                    Poll::Ready(None) => {
                        this.pending = None;
                        return Poll::Ready(Some(Err(
                            "cache cluster: owner failed mid-body and no node could continue"
                                .into(),
                        )));
                    }
                }
            }
            let failed = match Pin::new(&mut this.current).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(d) = frame.data_ref() {
                        this.next += d.len() as u64;
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(None) if this.next > this.end => return Poll::Ready(None),
                Poll::Ready(None) => "ended short".to_string(),
                Poll::Ready(Some(Err(e))) => e.to_string(),
            };
            if this.tries >= OWNER_TRIES || this.next > this.end {
                return Poll::Ready(Some(Err(failed.into())));
            }
            tracing::debug!(error = %failed, next = this.next, "owner failed mid-body; continuing");
            this.tries += 1;
            this.pending = Some(this.continuation());
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.end + 1 - self.next.min(self.end + 1))
    }
}
