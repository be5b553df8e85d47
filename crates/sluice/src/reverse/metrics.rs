//! The reverse proxy's metric families: per route (requests by status class, time to first byte,
//! total time, retries) and per upstream server (requests, failures, in flight, health).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of per-route series; `route` is `host+path` as configured.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

/// Labels of per-route series split by status class (`2xx`, `5xx`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteClassLabels {
    pub route: String,
    pub class: &'static str,
}

/// Labels of per-server series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerLabels {
    pub group: String,
    pub server: String,
}

fn latency() -> Histogram {
    // 0.25 ms .. ~16 s
    Histogram::new(exponential_buckets(0.00025, 2.0, 17))
}

/// Every family; registered once, shared by every route table a reload builds.
#[derive(Clone)]
pub struct ReverseMetrics {
    pub requests: Family<RouteClassLabels, Counter>,
    pub ttfb: Family<RouteLabels, Histogram, fn() -> Histogram>,
    pub total: Family<RouteLabels, Histogram, fn() -> Histogram>,
    pub retries: Family<RouteLabels, Counter>,
    pub server_requests: Family<ServerLabels, Counter>,
    pub server_failures: Family<ServerLabels, Counter>,
    pub server_in_flight: Family<ServerLabels, Gauge>,
    pub server_healthy: Family<ServerLabels, Gauge>,
    pub reloads: Family<ReloadLabels, Counter>,
    pub access_log_dropped: Counter,
}

/// Outcome of a reload.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub result: &'static str,
}

impl ReverseMetrics {
    /// Creates the families under `sluice_reverse_`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = ReverseMetrics {
            requests: Family::default(),
            ttfb: Family::new_with_constructor(latency as fn() -> Histogram),
            total: Family::new_with_constructor(latency as fn() -> Histogram),
            retries: Family::default(),
            server_requests: Family::default(),
            server_failures: Family::default(),
            server_in_flight: Family::default(),
            server_healthy: Family::default(),
            reloads: Family::default(),
            access_log_dropped: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("reverse");
        r.register(
            "requests",
            "Requests per route by status class",
            m.requests.clone(),
        );
        r.register(
            "ttfb_seconds",
            "Time to the response head per route",
            m.ttfb.clone(),
        );
        r.register(
            "duration_seconds",
            "Time to the end of the response body per route",
            m.total.clone(),
        );
        r.register(
            "retries",
            "Attempts on another server per route",
            m.retries.clone(),
        );
        r.register(
            "server_requests",
            "Attempts per upstream server",
            m.server_requests.clone(),
        );
        r.register(
            "server_failures",
            "Failed attempts (refused, timed out, reset) per upstream server",
            m.server_failures.clone(),
        );
        r.register(
            "server_in_flight",
            "Requests and tunnels open per upstream server",
            m.server_in_flight.clone(),
        );
        r.register(
            "server_healthy",
            "1 while an upstream server is usable",
            m.server_healthy.clone(),
        );
        r.register(
            "reloads",
            "Route table reloads by result",
            m.reloads.clone(),
        );
        r.register(
            "access_log_dropped",
            "Access log lines dropped because the writer fell behind",
            m.access_log_dropped.clone(),
        );
        m
    }
}

/// `2xx`, `4xx`... for a status code.
pub fn class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}
