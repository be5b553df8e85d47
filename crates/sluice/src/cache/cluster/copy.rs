//! Local copies on non-owners (`cache_peer_copy` routes): this node's own cache fills from the
//! owner instead of the origin, so a hot object becomes a hit here too. The copy's freshness is
//! capped (`peer_copy_ttl_secs`), which bounds both its memory and how long it can outlive a
//! change at the owner; an owner that fails sends the fill to the next node or the origin.

use std::sync::Arc;

use http::header;
use http::Request;

use super::peer::RelayRequest;
use super::ring::Owner;
use super::Cluster;
use crate::cache::{CacheKey, FreshnessPolicy, Origin, OriginError, OriginFuture};

/// The conditional and range fields the cache sets on its own requests.
const CACHE_FIELDS: [header::HeaderName; 6] = [
    header::RANGE,
    header::IF_RANGE,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
];

/// Fields the cache may leave out of its own requests: `Cookie` for a slice fetched for the
/// shared object, and credentials and the client's cache directives for a background
/// revalidation. A relay carries each only when the cache's request does, or the owner would
/// answer for a client's cookie or credentials while the answer is judged (and stored) as if
/// they had not been sent.
const LEFT_OUT_FIELDS: [header::HeaderName; 4] = [
    header::COOKIE,
    header::AUTHORIZATION,
    header::CACHE_CONTROL,
    header::PRAGMA,
];

/// An origin that is the key's owner (then the next node, then `fallback`).
pub struct OwnerOrigin {
    cluster: Arc<Cluster>,
    key: CacheKey,
    client: RelayRequest,
    fallback: Arc<dyn Origin>,
}

impl Cluster {
    /// The origin a local copy of `key` fills from: `client` is the request as the client sent
    /// it (the owner routes and keys it as this node does).
    pub fn owner_origin(
        self: &Arc<Self>,
        key: &CacheKey,
        client: RelayRequest,
        fallback: Arc<dyn Origin>,
    ) -> Arc<dyn Origin> {
        Arc::new(OwnerOrigin {
            cluster: self.clone(),
            key: key.clone(),
            client,
            fallback,
        })
    }

    /// The route's policy for a local copy: its freshness capped.
    pub fn copy_policy(&self, policy: &FreshnessPolicy) -> FreshnessPolicy {
        let mut p = policy.clone();
        let secs = u32::try_from(self.config.peer_copy_ttl_secs).unwrap_or(u32::MAX);
        p.copy_ttl_secs = std::num::NonZeroU32::new(secs.max(1));
        p
    }
}

impl Origin for OwnerOrigin {
    fn fetch(&self, req: Request<()>) -> OriginFuture {
        let mut relay = self.client.clone();
        relay.method = req.method().clone();
        for name in &CACHE_FIELDS {
            relay.headers.remove(name);
            for v in req.headers().get_all(name) {
                relay.headers.append(name.clone(), v.clone());
            }
        }
        for name in &LEFT_OUT_FIELDS {
            if !req.headers().contains_key(name) {
                relay.headers.remove(name);
            }
        }
        let (cluster, key, fallback) = (
            self.cluster.clone(),
            self.key.clone(),
            self.fallback.clone(),
        );
        Box::pin(async move {
            let mut skip: Option<String> = None;
            for _ in 0..2 {
                let Owner::Peer(owner) = cluster.ring.owner(&key.0, skip.as_deref()) else {
                    break;
                };
                match cluster.peer.relay(&owner, &relay).await {
                    Ok(resp) => {
                        owner.state.report_success();
                        cluster.metrics.peer_fills.inc();
                        let mut resp = cluster.peer.relayed(resp, &owner.addr, relay.body_idle);
                        // This node's cache writes its own.
                        resp.headers_mut().remove("cache-status");
                        return Ok(resp);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "owner unreachable for a local copy");
                        cluster.owner_failed(&owner.state);
                        skip = Some(owner.addr.clone());
                    }
                }
            }
            let r: Result<_, OriginError> = fallback.fetch(req).await;
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An origin that must not be reached: the owner answers.
    struct NoFallback;

    impl Origin for NoFallback {
        fn fetch(&self, _req: Request<()>) -> OriginFuture {
            Box::pin(async { panic!("the fallback was asked") })
        }
    }

    /// A copy filling a slice the cache asked for without the client's Cookie, Authorization,
    /// Cache-Control and Pragma reaches the owner without them; those the cache's request does
    /// carry go on. Before, the relay started from the client's headers and took only the range
    /// and conditional fields from the cache's: the client's cookie and credentials went to the
    /// owner, and an answer shaped by them was stored as the shared copy.
    #[tokio::test]
    async fn a_copy_sends_the_owner_only_what_the_cache_sent() {
        let config = super::super::ClusterConfig {
            secret: "0123456789abcdef".into(),
            self_addr: "10.0.0.99:8888".into(),
            ..Default::default()
        };
        let metrics = crate::cache::metrics::CacheMetrics::new(&mut Default::default()).cluster;
        let cluster = Arc::new(
            Cluster::new(
                &config,
                metrics,
                (Duration::from_secs(2), Duration::from_secs(2)),
            )
            .unwrap(),
        );
        // A fake owner: answers each request with an empty 200 and hands back its head.
        let owner = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = owner.local_addr().unwrap();
        cluster
            .ring
            .set_members(vec![super::super::ring::MemberSpec {
                addr: addr.to_string(),
                control: addr,
                weight: 1,
            }]);
        let (heads_tx, mut heads) = tokio::sync::mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = owner.accept().await {
                let heads_tx = heads_tx.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        head.extend_from_slice(&buf[..n]);
                        if head.windows(4).any(|w| w == b"\r\n\r\n") {
                            let _ = heads_tx.send(String::from_utf8_lossy(&head).to_lowercase());
                            head.clear();
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                                .await;
                        }
                    }
                });
            }
        });
        let mut client = http::HeaderMap::new();
        client.insert(header::COOKIE, "session=alice".parse().unwrap());
        client.insert(header::AUTHORIZATION, "Bearer alice".parse().unwrap());
        client.insert(header::CACHE_CONTROL, "no-cache".parse().unwrap());
        client.insert(header::PRAGMA, "no-cache".parse().unwrap());
        client.insert(header::ACCEPT, "video/mp4".parse().unwrap());
        let origin = cluster.owner_origin(
            &CacheKey("2:*/6:a.test|/v.mp4".into()),
            RelayRequest {
                method: http::Method::GET,
                authority: "a.test".into(),
                target: "/v.mp4".into(),
                headers: client,
                body_idle: Duration::from_secs(2),
            },
            Arc::new(NoFallback),
        );
        // The cache's request for a missing slice: no Cookie, nor the rest.
        let slice = Request::get("/v.mp4")
            .header(header::RANGE, "bytes=1048576-2097151")
            .header(header::ACCEPT, "video/mp4")
            .body(())
            .unwrap();
        let resp = origin.fetch(slice).await.unwrap();
        assert_eq!(resp.status(), 200);
        let head = heads.recv().await.unwrap();
        assert!(head.contains("range: bytes=1048576-2097151"), "{head}");
        assert!(head.contains("accept: video/mp4"), "{head}");
        for gone in ["cookie:", "authorization:", "cache-control:", "pragma:"] {
            assert!(!head.contains(gone), "{gone} relayed: {head}");
        }
        // A request that carries them (cookie requests cached, a client's own fetch) keeps them.
        let carried = Request::get("/v.mp4")
            .header(header::COOKIE, "session=alice")
            .header(header::AUTHORIZATION, "Bearer alice")
            .header(header::CACHE_CONTROL, "no-cache")
            .header(header::PRAGMA, "no-cache")
            .body(())
            .unwrap();
        origin.fetch(carried).await.unwrap();
        let head = heads.recv().await.unwrap();
        for kept in [
            "cookie: session=alice",
            "authorization: bearer alice",
            "cache-control: no-cache",
            "pragma: no-cache",
        ] {
            assert!(head.contains(kept), "{kept} missing: {head}");
        }
    }
}
