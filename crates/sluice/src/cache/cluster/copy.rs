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
