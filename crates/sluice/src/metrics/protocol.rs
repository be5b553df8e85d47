//! Downstream requests by HTTP version, and the QUIC endpoint's own families (connections,
//! handshakes, Retry, refusals).

use crate::atomic::Counter;
use crate::atomic::Gauge;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The `http_version` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub http_version: &'static str,
}

/// The series, fetched once so a request only increments an atomic.
#[derive(Clone)]
pub struct ProtocolMetrics {
    pub http1: Counter,
    pub http2: Counter,
    pub http3: Counter,
    /// QUIC connections open now (handshake done).
    pub quic_open: Gauge,
    /// QUIC handshakes in progress now.
    pub quic_handshakes: Gauge,
    /// Clients asked to prove their address first (Retry packets sent).
    pub quic_retries: Counter,
    /// Connection attempts refused (the connection or handshake limit).
    pub quic_refused: Counter,
}

impl ProtocolMetrics {
    /// Creates the families and registers them.
    pub fn new(registry: &mut Registry) -> Self {
        let by_version: Family<VersionLabels, Counter> = Family::default();
        let series = |v| {
            by_version
                .get_or_create(&VersionLabels { http_version: v })
                .clone()
        };
        let m = ProtocolMetrics {
            http1: series("1.1"),
            http2: series("2"),
            http3: series("3"),
            quic_open: Gauge::default(),
            quic_handshakes: Gauge::default(),
            quic_retries: Counter::default(),
            quic_refused: Counter::default(),
        };
        registry.register(
            "downstream_requests_by_version",
            "Requests by the HTTP version the client spoke (1.1 includes 1.0)",
            by_version,
        );
        registry.register(
            "quic_open_connections",
            "HTTP/3 (QUIC) connections open now",
            m.quic_open.clone(),
        );
        registry.register(
            "quic_handshakes",
            "QUIC handshakes in progress now",
            m.quic_handshakes.clone(),
        );
        registry.register(
            "quic_retries",
            "QUIC clients asked to prove their address with a Retry (many handshakes pending)",
            m.quic_retries.clone(),
        );
        registry.register(
            "quic_refused",
            "QUIC connection attempts refused at server.http3.max_connections or max_handshakes",
            m.quic_refused.clone(),
        );
        m
    }

    /// The counter of requests in `version`.
    pub fn requests(&self, version: http::Version) -> &Counter {
        match version {
            http::Version::HTTP_2 => &self.http2,
            http::Version::HTTP_3 => &self.http3,
            _ => &self.http1,
        }
    }
}
