//! The cluster's metric families (`sluice_cache_cluster_*`): peer fills, hops served for peers,
//! owner failures, purge fan-out, and the ring itself (one `member_up` series per member).

use crate::atomic::Counter;
use crate::atomic::Gauge;
use crate::metrics::Escaped;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of per-member series; `member` is a peer's name as configured or resolved by DNS.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct MemberLabels {
    pub member: String,
}

impl EncodeLabelSet for MemberLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [("member", Escaped(&self.member))].encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Default)]
pub struct ClusterMetrics {
    /// Misses this node fetched through their owner.
    pub peer_fills: Counter,
    /// Requests this node served for a peer (they carried a valid hop marker).
    pub hops: Counter,
    /// Fetches or checks of an owner that failed (the request went on to the next node or the
    /// origin).
    pub owner_failures: Counter,
    /// Requests whose owner failed mid-body and that went on from the byte reached.
    pub resumed: Counter,
    /// Purges sent to peers, by outcome.
    pub purges_sent: Family<ResultLabels, Counter>,
    /// Purges applied from peers' logs (missed while away).
    pub purges_replayed: Counter,
    /// Members on the ring, and 1 or 0 per member for up or out.
    pub members: Gauge,
    pub member_up: Family<MemberLabels, Gauge>,
    pub dns_resolutions: Counter,
}

impl ClusterMetrics {
    pub fn register(registry: &mut Registry) -> ClusterMetrics {
        let m = ClusterMetrics::default();
        let r = registry.sub_registry_with_prefix("cluster");
        r.register(
            "peer_fills",
            "Misses fetched through the owner node",
            m.peer_fills.clone(),
        );
        r.register("hops", "Requests served for a peer node", m.hops.clone());
        r.register(
            "owner_failures",
            "Owner fetches or checks that failed",
            m.owner_failures.clone(),
        );
        r.register(
            "resumed",
            "Responses whose owner failed mid-body, continued from the byte reached",
            m.resumed.clone(),
        );
        r.register(
            "purges_sent",
            "Purges fanned out to peers, by outcome",
            m.purges_sent.clone(),
        );
        r.register(
            "purges_replayed",
            "Purges applied from a peer's purge log",
            m.purges_replayed.clone(),
        );
        r.register("members", "Members on the ring", m.members.clone());
        r.register(
            "member_up",
            "Each member of the ring: 1 up, 0 out",
            m.member_up.clone(),
        );
        r.register(
            "dns_resolutions",
            "Membership DNS answers received",
            m.dns_resolutions.clone(),
        );
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member's name is written with the text format's escapes: a `"` in it (from the config
    /// or a DNS answer) does not end the label value and break the scrape.
    #[test]
    fn member_names_are_escaped() {
        let mut registry = Registry::default();
        let m = ClusterMetrics::register(&mut registry);
        for member in ["a\"b\\c\nd:8080", "10.0.0.1:8080"] {
            let labels = MemberLabels {
                member: member.to_string(),
            };
            m.member_up.get_or_create(&labels).set(1);
        }
        let text = crate::metrics::render(&registry);
        assert!(
            text.contains("cluster_member_up{member=\"a\\\"b\\\\c\\nd:8080\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("cluster_member_up{member=\"10.0.0.1:8080\"} 1\n"),
            "{text}"
        );
    }
}
