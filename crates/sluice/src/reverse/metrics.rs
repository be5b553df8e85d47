//! The reverse proxy's metric families: per route (requests by status class, time to first byte,
//! total time, retries) and per upstream server (requests, failures, in flight, health).

use crate::atomic::Counter;
use crate::atomic::Gauge;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

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
    pub spliced: Family<RouteLabels, Counter>,
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
            spliced: Family::default(),
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
            "spliced_bodies",
            "Response bodies moved socket to socket with splice(2) per route",
            m.spliced.clone(),
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

/// One route's series, looked up once and kept: the request path only bumps counters, with no
/// label strings built or family locks taken per request. Each series is created on first use,
/// as a family lookup would, so `/metrics` lists only what happened.
pub struct RouteMeters {
    families: ReverseMetrics,
    route: String,
    group: String,
    ttfb: OnceLock<Histogram>,
    total: OnceLock<Histogram>,
    retries: OnceLock<Counter>,
    spliced: OnceLock<Counter>,
    /// Requests by status class: 1xx .. 5xx.
    classes: [OnceLock<Counter>; 5],
    /// The group's servers, in `Group::servers` order.
    servers: Vec<ServerMeters>,
}

/// One upstream server's series, as one route sees them.
#[derive(Clone)]
pub struct ServerMeters {
    labels: ServerLabels,
    requests: OnceLock<Counter>,
    failures: OnceLock<Counter>,
    in_flight: OnceLock<Gauge>,
    healthy: OnceLock<Gauge>,
}

impl RouteMeters {
    /// The series of route `route` over `group`'s servers (`server_addrs`, in group order).
    pub fn new<'a>(
        families: &ReverseMetrics,
        route: &str,
        group: &str,
        server_addrs: impl Iterator<Item = &'a str>,
    ) -> RouteMeters {
        RouteMeters {
            families: families.clone(),
            route: route.to_string(),
            group: group.to_string(),
            ttfb: OnceLock::new(),
            total: OnceLock::new(),
            retries: OnceLock::new(),
            spliced: OnceLock::new(),
            classes: Default::default(),
            servers: server_addrs
                .map(|addr| ServerMeters::new(group, addr))
                .collect(),
        }
    }

    fn labels(&self) -> RouteLabels {
        RouteLabels {
            route: self.route.clone(),
        }
    }

    pub fn ttfb(&self) -> &Histogram {
        self.ttfb
            .get_or_init(|| self.families.ttfb.get_or_create(&self.labels()).clone())
    }

    pub fn total(&self) -> &Histogram {
        self.total
            .get_or_init(|| self.families.total.get_or_create(&self.labels()).clone())
    }

    pub fn retries(&self) -> &Counter {
        self.retries
            .get_or_init(|| self.families.retries.get_or_create(&self.labels()).clone())
    }

    pub fn spliced(&self) -> &Counter {
        self.spliced
            .get_or_init(|| self.families.spliced.get_or_create(&self.labels()).clone())
    }

    /// The request counter for `status`'s class.
    pub fn requests(&self, status: u16) -> &Counter {
        let class = class(status);
        let i = usize::from(class.as_bytes()[0] - b'1');
        self.classes[i].get_or_init(|| {
            let labels = RouteClassLabels {
                route: self.route.clone(),
                class,
            };
            self.families.requests.get_or_create(&labels).clone()
        })
    }

    /// The series of the group's server at `index` (`Group::servers` order); a server the route
    /// was not built with (never expected) gets fresh handles on the same series.
    pub fn server(&self, index: Option<usize>, addr: &str) -> std::borrow::Cow<'_, ServerMeters> {
        match index.and_then(|i| self.servers.get(i)) {
            Some(m) if m.labels.server == addr => std::borrow::Cow::Borrowed(m),
            _ => std::borrow::Cow::Owned(ServerMeters::new(&self.group, addr)),
        }
    }

    pub fn server_requests<'m>(&self, m: &'m ServerMeters) -> &'m Counter {
        m.requests.get_or_init(|| {
            self.families
                .server_requests
                .get_or_create(&m.labels)
                .clone()
        })
    }

    pub fn server_failures<'m>(&self, m: &'m ServerMeters) -> &'m Counter {
        m.failures.get_or_init(|| {
            self.families
                .server_failures
                .get_or_create(&m.labels)
                .clone()
        })
    }

    pub fn server_in_flight<'m>(&self, m: &'m ServerMeters) -> &'m Gauge {
        m.in_flight.get_or_init(|| {
            self.families
                .server_in_flight
                .get_or_create(&m.labels)
                .clone()
        })
    }

    pub fn server_healthy<'m>(&self, m: &'m ServerMeters) -> &'m Gauge {
        m.healthy.get_or_init(|| {
            self.families
                .server_healthy
                .get_or_create(&m.labels)
                .clone()
        })
    }
}

impl ServerMeters {
    fn new(group: &str, addr: &str) -> ServerMeters {
        ServerMeters {
            labels: ServerLabels {
                group: group.to_string(),
                server: addr.to_string(),
            },
            requests: OnceLock::new(),
            failures: OnceLock::new(),
            in_flight: OnceLock::new(),
            healthy: OnceLock::new(),
        }
    }
}
