//! HTTP-level metric families of the server; other modules register their own in the same registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of per-request series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    pub status: u16,
}

/// Labels of per-endpoint series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: &'static str,
}

/// Labels of error series: which side failed and how.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub side: &'static str,
    pub kind: &'static str,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The server's families.
#[derive(Clone)]
pub struct HttpMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub sent_bytes: Family<EndpointLabels, Counter>,
    pub active: Family<EndpointLabels, Gauge>,
    pub first_byte: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    pub total: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    pub errors: Family<ErrorLabels, Counter>,
    pub connections: Counter,
    /// Accept pauses at `server.max_connections` and connections open now.
    pub accept: crate::server::listener::AcceptMetrics,
    /// Connections cut because the client stopped reading for `server.send_timeout_secs`.
    pub send_timeouts: Counter,
    /// TLS handshakes not finished within `server.tls_handshake_timeout_secs`.
    pub tls_handshake_timeouts: Counter,
}

impl HttpMetrics {
    /// Creates the families and registers them under `sluice_`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = HttpMetrics {
            requests: Family::default(),
            sent_bytes: Family::default(),
            active: Family::default(),
            first_byte: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            total: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            errors: Family::default(),
            connections: Counter::default(),
            accept: Default::default(),
            send_timeouts: Counter::default(),
            tls_handshake_timeouts: Counter::default(),
        };
        registry.register(
            "requests",
            "Requests by endpoint and status",
            m.requests.clone(),
        );
        registry.register(
            "sent_bytes",
            "Body bytes sent to clients",
            m.sent_bytes.clone(),
        );
        registry.register(
            "active_streams",
            "Responses being streamed now",
            m.active.clone(),
        );
        registry.register(
            "time_to_first_byte_seconds",
            "Time from request to response head",
            m.first_byte.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from request to the end of the response body",
            m.total.clone(),
        );
        registry.register(
            "errors",
            "Failed requests by side (downstream, upstream, internal) and kind",
            m.errors.clone(),
        );
        registry.register(
            "downstream_connections",
            "Client connections accepted",
            m.connections.clone(),
        );
        registry.register(
            "downstream_accept_paused",
            "Times accepting paused because server.max_connections connections were open",
            m.accept.paused.clone(),
        );
        registry.register(
            "downstream_open_connections",
            "Client connections open now",
            m.accept.open.clone(),
        );
        registry.register(
            "downstream_send_timeouts",
            "Connections cut or responses released because the client stopped reading (server.send_timeout_secs)",
            m.send_timeouts.clone(),
        );
        registry.register(
            "downstream_tls_handshake_timeouts",
            "TLS handshakes not finished within server.tls_handshake_timeout_secs",
            m.tls_handshake_timeouts.clone(),
        );
        m
    }
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        out = format!("# encoding failed: {e}\n");
    }
    out
}
