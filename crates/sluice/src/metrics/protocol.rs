//! Downstream requests by HTTP version, and the QUIC endpoint's own families (connections,
//! handshakes, Retry, refusals, handshakes that failed).

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

/// The `reason` label of QUIC handshakes that did not finish.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// The `transport` label of the HTTP/1.1 fast path's requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransportLabels {
    pub transport: &'static str,
}

/// The series, fetched once so a request only increments an atomic.
#[derive(Clone)]
pub struct ProtocolMetrics {
    pub http1: Counter,
    pub http2: Counter,
    pub http3: Counter,
    /// HTTP/1.1 requests served by the fast path (no hyper), over plain TCP and over TLS.
    pub fast_tcp: Counter,
    pub fast_tls: Counter,
    /// QUIC connections open now (handshake done).
    pub quic_open: Gauge,
    /// QUIC handshakes in progress now.
    pub quic_handshakes: Gauge,
    /// Clients asked to prove their address first (Retry packets sent).
    pub quic_retries: Counter,
    /// Connection attempts refused (the connection or handshake limit).
    pub quic_refused: Counter,
    /// Handshakes that did not finish in `server.tls_handshake_timeout_secs`, and ones that
    /// failed (the client's TLS refused, the connection lost).
    pub quic_handshake_timeouts: Counter,
    pub quic_handshake_errors: Counter,
    /// After a binary upgrade: the previous process's QUIC datagrams this process could not
    /// pass on to it.
    pub quic_upgrade_dropped: Counter,
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
        let fast: Family<TransportLabels, Counter> = Family::default();
        let fast_series = |t| {
            fast.get_or_create(&TransportLabels { transport: t })
                .clone()
        };
        let failed: Family<ReasonLabels, Counter> = Family::default();
        let failed_series = |r| failed.get_or_create(&ReasonLabels { reason: r }).clone();
        let m = ProtocolMetrics {
            http1: series("1.1"),
            http2: series("2"),
            http3: series("3"),
            fast_tcp: fast_series("tcp"),
            fast_tls: fast_series("tls"),
            quic_open: Gauge::default(),
            quic_handshakes: Gauge::default(),
            quic_retries: Counter::default(),
            quic_refused: Counter::default(),
            quic_handshake_timeouts: failed_series("timeout"),
            quic_handshake_errors: failed_series("error"),
            quic_upgrade_dropped: Counter::default(),
        };
        registry.register(
            "downstream_requests_by_version",
            "Requests by the HTTP version the client spoke (1.1 includes 1.0)",
            by_version,
        );
        registry.register(
            "h1_fast_path_requests",
            "HTTP/1.1 requests served by the fast path (server.h1_fast_path), by transport",
            fast,
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
            "QUIC connection attempts refused at a limit (server.max_connections or \
             max_connections_per_ip, server.http3.max_connections, max_handshakes or \
             max_handshakes_per_ip)",
            m.quic_refused.clone(),
        );
        registry.register(
            "quic_handshakes_failed",
            "QUIC handshakes that did not finish, by reason (timeout: \
             server.tls_handshake_timeout_secs; error: refused by TLS or lost)",
            failed,
        );
        registry.register(
            "quic_upgrade_datagrams_dropped",
            "After a binary upgrade, datagrams of the previous process's QUIC connections not \
             passed on to it (its channel full: the process behind, or a flood carrying its tag)",
            m.quic_upgrade_dropped.clone(),
        );
        m
    }

    /// The counter of fast-path requests over TLS (`secure`) or plain TCP.
    pub fn fast_path(&self, secure: bool) -> &Counter {
        if secure {
            &self.fast_tls
        } else {
            &self.fast_tcp
        }
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
