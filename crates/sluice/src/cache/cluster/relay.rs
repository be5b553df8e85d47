//! A miss through its owner: the request goes to the owner with the hop marker and the answer
//! streams back as it arrives. An owner that fails before its head costs a retry on the next
//! node of the ring, then this node's own fill, and is booked a failure; one that fails mid-body
//! is continued from the byte reached (a `Range` with `If-Range` on the next node or this node's
//! cache), so a dead node cuts only its own clients' connections, and is booked nothing (the
//! failure may be the origin's, only passed on).

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
                // Only a failure to connect or to get the head is the owner's (a body that
                // fails later is continued, and booked to nobody).
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
                let (a, b) = partial_span(h)?;
                Some((a, b, validator))
            }
            _ => None,
        }
    }
}

/// The span `a-b` a 206 says it carries, when it makes sense: `a <= b`, `b` below the complete
/// length when that is known, and the body's `Content-Length` (when given) the span's. A span
/// that does not (a broken or hostile owner) is passed on as it is but not continued: its end
/// would make the continuation's range and the body's length nonsense.
fn partial_span(h: &HeaderMap) -> Option<(u64, u64)> {
    let cr = h.get(header::CONTENT_RANGE)?.to_str().ok()?;
    let (span, total) = cr.strip_prefix("bytes ")?.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
    // `b + 1` must exist: the body's length is counted from it.
    let len = b.checked_sub(a)?.checked_add(1)?;
    if total != "*" && b >= total.parse::<u64>().ok()? {
        return None;
    }
    if let Some(cl) = h.get(header::CONTENT_LENGTH) {
        if cl.to_str().ok()?.parse::<u64>().ok()? != len {
            return None;
        }
    }
    Some((a, b))
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
            // The failed owner is not booked a failure: a body that fails after its head is as
            // often the origin's (an idle timeout, a reset the owner only passes on) as the
            // owner's, and an owner that is really gone fails its next connection or head.
            if let Owner::Peer(owner) = cluster.ring.owner(&key.0, Some(&failed)) {
                match cluster.peer.relay(&owner, &req).await {
                    Ok(resp) => {
                        owner.state.report_success();
                        let resp = cluster.peer.relayed(resp, &owner.addr, req.body_idle);
                        if continues_at(&resp, next) {
                            return Some(resp.into_body());
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "next owner unreachable for a continuation");
                        cluster.owner_failed(&owner.state);
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
        // Saturating: `end` is checked where it is read, but a hint must never wrap to 0 (a
        // chunked answer sent as `Content-Length: 0`).
        SizeHint::with_exact(self.end.saturating_add(1).saturating_sub(self.next))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use http_body::Body as _;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::ring::MemberSpec;
    use super::super::ClusterConfig;
    use super::*;

    /// A node outside the ring (every key has a peer owner) taking owners out at the first
    /// failure booked to them.
    fn cluster(owner: std::net::SocketAddr) -> Arc<Cluster> {
        let config = ClusterConfig {
            secret: "0123456789abcdef".into(),
            self_addr: "127.0.0.1:1".into(),
            max_fails: 1,
            rampup_secs: 0,
            ..ClusterConfig::default()
        };
        let metrics = crate::cache::metrics::CacheMetrics::new(&mut Default::default()).cluster;
        let c = Cluster::new(
            &config,
            metrics,
            (Duration::from_secs(2), Duration::from_secs(2)),
        )
        .unwrap();
        c.ring.set_members(vec![MemberSpec {
            addr: owner.to_string(),
            control: owner,
            weight: 1,
        }]);
        Arc::new(c)
    }

    fn get() -> RelayRequest {
        RelayRequest {
            method: http::Method::GET,
            authority: "app.test".into(),
            target: "/object".into(),
            headers: HeaderMap::new(),
            body_idle: Duration::ZERO,
        }
    }

    /// An owner that sends its head and 400 of 1000 bytes, then closes (its origin reset, say):
    /// the body is continued here from byte 400 and the owner stays in the ring. An owner that
    /// cannot be reached at all is booked the failure.
    #[tokio::test]
    async fn only_a_failure_before_the_head_is_booked_to_the_owner() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let owner = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "the head ended early");
                head.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\netag: \"v1\"\r\n\r\n")
                .await
                .unwrap();
            s.write_all(&[1u8; 400]).await.unwrap();
        });
        let c = cluster(addr);
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        let local: Local = Arc::new(move |h: HeaderMap| {
            seen.lock().unwrap().push(h);
            Box::pin(async move {
                Response::builder()
                    .status(206)
                    .header("content-range", "bytes 400-999/1000")
                    .header("content-length", "600")
                    .body(crate::body::full(vec![2u8; 600]))
                    .unwrap()
            })
        });
        let key = CacheKey("k".into());
        let resp = c.through_owner(&key, get(), local.clone()).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        owner.await.unwrap();
        assert_eq!(body.len(), 1000);
        assert!(body[..400].iter().all(|b| *b == 1) && body[400..].iter().all(|b| *b == 2));
        let h = asked.lock().unwrap().pop().expect("continued here");
        assert_eq!(h[header::RANGE], "bytes=400-999");
        assert_eq!(h[header::IF_RANGE], "\"v1\"");
        assert_eq!(c.metrics.resumed.get(), 1);
        assert_eq!(c.metrics.owner_failures.get(), 0);
        assert!(c.ring.view().members[0].state.is_up());

        // The owner gone (its port closed): a failure to connect is its own.
        assert!(c.through_owner(&key, get(), local).await.is_none());
        assert_eq!(c.metrics.owner_failures.get(), 1);
        assert!(!c.ring.view().members[0].state.is_up());
    }

    fn answer(status: u16, fields: &[(&str, &str)]) -> Response<Body> {
        let mut b = Response::builder().status(status).header("etag", "\"v1\"");
        for (k, v) in fields {
            b = b.header(*k, *v);
        }
        b.body(crate::body::empty()).unwrap()
    }

    /// A 206 whose span makes no sense is not continued (its end would overflow or lie).
    #[test]
    fn a_partial_answer_is_continued_only_when_its_span_makes_sense() {
        let plan = |cr: &str, cl: Option<&str>| {
            let mut fields = vec![("content-range", cr)];
            fields.extend(cl.map(|v| ("content-length", v)));
            Resume::plan(&get(), &answer(206, &fields)).map(|(a, b, _)| (a, b))
        };
        assert_eq!(plan("bytes 400-999/1000", None), Some((400, 999)));
        assert_eq!(plan("bytes 400-999/*", Some("600")), Some((400, 999)));
        assert_eq!(plan("bytes 0-18446744073709551615/*", None), None);
        assert_eq!(plan("bytes 500-400/1000", None), None);
        assert_eq!(plan("bytes 400-1000/1000", None), None);
        assert_eq!(plan("bytes 400-999/x", None), None);
        assert_eq!(plan("bytes 400-999/1000", Some("10")), None);
        let ok = answer(200, &[("content-length", "1000")]);
        assert_eq!(
            Resume::plan(&get(), &ok).map(|(a, b, _)| (a, b)),
            Some((0, 999))
        );
    }

    /// The length a continued body announces saturates instead of wrapping to 0.
    #[tokio::test]
    async fn a_continued_bodys_length_never_wraps() {
        let c = cluster("127.0.0.1:9".parse().unwrap());
        let local: Local = Arc::new(|_| Box::pin(async { Response::new(crate::body::empty()) }));
        let resuming = |next: u64, end: u64| Resuming {
            cluster: c.clone(),
            key: CacheKey("k".into()),
            req: get(),
            local: local.clone(),
            current: crate::body::empty(),
            next,
            end,
            validator: HeaderValue::from_static("\"v1\""),
            failed: String::new(),
            tries: 0,
            pending: None,
        };
        assert_eq!(resuming(0, u64::MAX).size_hint().exact(), Some(u64::MAX));
        assert_eq!(resuming(400, 999).size_hint().exact(), Some(600));
        assert_eq!(resuming(1000, 999).size_hint().exact(), Some(0));
    }
}
