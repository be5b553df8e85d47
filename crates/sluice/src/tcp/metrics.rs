//! The TCP front end's metric families (per listener and per upstream server), registered under
//! `tcp_`; a connection takes its counter handles once, so the relay only does atomic adds.

use crate::atomic::Counter;
use crate::atomic::Gauge;
use crate::metrics::Escaped;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ListenerLabels {
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RefusedLabels {
    pub listener: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ServerLabels {
    pub group: String,
    pub server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct EndLabels {
    pub listener: String,
    /// `closed`, `reset`, `idle_timeout`, `total_timeout`, `shutdown`, `error`.
    pub how: &'static str,
}

impl EncodeLabelSet for ListenerLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [("listener", Escaped(&self.listener))].encode(encoder)
    }
}

impl EncodeLabelSet for RefusedLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            ("listener", Escaped(&self.listener)),
            ("reason", Escaped(self.reason)),
        ]
        .encode(encoder)
    }
}

impl EncodeLabelSet for ServerLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            ("group", Escaped(&self.group)),
            ("server", Escaped(&self.server)),
        ]
        .encode(encoder)
    }
}

impl EncodeLabelSet for EndLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            ("listener", Escaped(&self.listener)),
            ("how", Escaped(self.how)),
        ]
        .encode(encoder)
    }
}

fn duration_histogram() -> Histogram {
    // 1 ms .. ~9 h: TCP sessions range from health probes to database connections held all day.
    Histogram::new(exponential_buckets(0.001, 4.0, 13))
}

/// Every TCP family.
#[derive(Clone)]
pub struct TcpMetrics {
    pub open: Family<ListenerLabels, Gauge>,
    pub accepted: Family<ListenerLabels, Counter>,
    pub refused: Family<RefusedLabels, Counter>,
    pub ended: Family<EndLabels, Counter>,
    pub duration: Family<ListenerLabels, Histogram, fn() -> Histogram>,
    pub listener_up_bytes: Family<ListenerLabels, Counter>,
    pub listener_down_bytes: Family<ListenerLabels, Counter>,
    pub server_connections: Family<ServerLabels, Counter>,
    pub server_open: Family<ServerLabels, Gauge>,
    pub server_up_bytes: Family<ServerLabels, Counter>,
    pub server_down_bytes: Family<ServerLabels, Counter>,
    pub connect_failures: Family<ServerLabels, Counter>,
}

impl TcpMetrics {
    pub fn register(registry: &mut Registry) -> TcpMetrics {
        let m = TcpMetrics {
            open: Family::default(),
            accepted: Family::default(),
            refused: Family::default(),
            ended: Family::default(),
            duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            listener_up_bytes: Family::default(),
            listener_down_bytes: Family::default(),
            server_connections: Family::default(),
            server_open: Family::default(),
            server_up_bytes: Family::default(),
            server_down_bytes: Family::default(),
            connect_failures: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("tcp");
        r.register(
            "connections_open",
            "Downstream connections open",
            m.open.clone(),
        );
        r.register(
            "connections_accepted",
            "Downstream connections accepted",
            m.accepted.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed before relaying, by reason",
            m.refused.clone(),
        );
        r.register(
            "connections_ended",
            "Relayed connections by how they ended",
            m.ended.clone(),
        );
        r.register(
            "connection_duration_seconds",
            "Connection lifetime from accept to close",
            m.duration.clone(),
        );
        r.register(
            "received_bytes",
            "Bytes from clients, relayed upstream",
            m.listener_up_bytes.clone(),
        );
        r.register(
            "sent_bytes",
            "Bytes from upstreams, relayed to clients",
            m.listener_down_bytes.clone(),
        );
        r.register(
            "server_connections",
            "Upstream connections established per server",
            m.server_connections.clone(),
        );
        r.register(
            "server_connections_open",
            "Upstream connections open per server",
            m.server_open.clone(),
        );
        r.register(
            "server_sent_bytes",
            "Bytes sent to each upstream server",
            m.server_up_bytes.clone(),
        );
        r.register(
            "server_received_bytes",
            "Bytes received from each upstream server",
            m.server_down_bytes.clone(),
        );
        r.register(
            "server_connect_failures",
            "Connect attempts that failed (refused, timed out, unreachable)",
            m.connect_failures.clone(),
        );
        m
    }

    pub fn listener(&self, name: &str) -> ListenerLabels {
        ListenerLabels {
            listener: name.to_string(),
        }
    }
}
