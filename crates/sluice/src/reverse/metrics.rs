//! The reverse proxy's metric families: per route (requests by status class, time to first byte,
//! total time, retries) and per upstream server (requests, failures, in flight, health).

use crate::atomic::Counter;
use crate::atomic::Gauge;
use crate::metrics::Escaped;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use crate::upstream::group::Group;

/// Labels of per-route series; `route` is `host+path` as configured.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RouteLabels {
    pub route: String,
}

/// Labels of per-route series split by status class (`2xx`, `5xx`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RouteClassLabels {
    pub route: String,
    pub class: &'static str,
}

/// Labels of per-server series.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ServerLabels {
    pub group: String,
    pub server: String,
}

impl EncodeLabelSet for RouteLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [("route", Escaped(&self.route))].encode(encoder)
    }
}

impl EncodeLabelSet for RouteClassLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            ("route", Escaped(&self.route)),
            ("class", Escaped(self.class)),
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
    pub server_healthy: HealthyServers,
    pub reloads: Family<ReloadLabels, Counter>,
    pub access_log_dropped: Counter,
    /// Who holds the per-route and per-server series (see [`Holders`]).
    holders: Holders,
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
            server_healthy: HealthyServers::default(),
            reloads: Family::default(),
            access_log_dropped: Counter::default(),
            holders: Holders::default(),
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
        r.register_collector(Box::new(m.server_healthy.clone()));
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

/// What a route table's routes name: a route, and each server of its group.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Holder {
    Route(String),
    Server(ServerLabels),
}

/// How many [`RouteMeters`] (routes of the tables alive: the live one, an old one while requests
/// or tunnels finish on it, one a reload is building) name each route and each group's server.
/// When the last goes (a reload took the route or the group out, or the server out of its group,
/// and the old table's last request ended) the series go with it: kept, they stayed in `/metrics`
/// for good with their values frozen, and a config churning names grew the scrape with every
/// reload. A route or server the new table names again keeps its series and counts.
#[derive(Clone, Default)]
struct Holders(Arc<Mutex<HashMap<Holder, usize>>>);

impl ReverseMetrics {
    fn hold(&self, holder: Holder) {
        let mut held = self.holders.0.lock().unwrap_or_else(|e| e.into_inner());
        *held.entry(holder).or_insert(0) += 1;
    }

    /// Lets go of `holder`; the last one out removes its series (under the lock, so a table
    /// being built meanwhile either holds it first, and it stays, or makes its series after).
    fn release(&self, holder: Holder) {
        let mut held = self.holders.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(count) = held.get_mut(&holder) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        held.remove(&holder);
        match holder {
            Holder::Route(route) => {
                for class in CLASSES {
                    self.requests.remove(&RouteClassLabels {
                        route: route.clone(),
                        class,
                    });
                }
                let labels = RouteLabels { route };
                self.ttfb.remove(&labels);
                self.total.remove(&labels);
                self.retries.remove(&labels);
                self.spliced.remove(&labels);
            }
            Holder::Server(labels) => {
                self.server_requests.remove(&labels);
                self.server_failures.remove(&labels);
                self.server_in_flight.remove(&labels);
            }
        }
    }
}

/// `server_healthy`: 1 while a server of a route's group is usable (healthy by the active check
/// and not ejected), read off the server when `/metrics` is scraped. Set by request attempts
/// before, it stayed 1 through an outage the check found (or an ejection no request followed)
/// and 0 after an ejection had ended.
#[derive(Clone, Default)]
pub struct HealthyServers {
    /// The groups of the route tables built, newest last; a group no route table (nor the
    /// live generation) holds any more is dropped at the next scrape or build.
    groups: Arc<Mutex<Vec<Weak<Group>>>>,
}

impl HealthyServers {
    /// Reports `group`'s servers from now on (a route over it was built).
    fn watch(&self, group: &Arc<Group>) {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.retain(|g| g.strong_count() > 0);
        if !groups
            .iter()
            .any(|g| std::ptr::eq(g.as_ptr(), Arc::as_ptr(group)))
        {
            groups.push(Arc::downgrade(group));
        }
    }
}

impl std::fmt::Debug for HealthyServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HealthyServers")
    }
}

impl Collector for HealthyServers {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let groups: Vec<Arc<Group>> = {
            let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            groups.retain(|g| g.strong_count() > 0);
            groups.iter().filter_map(Weak::upgrade).collect()
        };
        let mut family = encoder.encode_descriptor(
            "server_healthy",
            "1 while an upstream server is usable.",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        // During a reload the old generation's groups live on with the requests still on them:
        // one series per group and server, the newest generation's.
        let mut seen = std::collections::HashSet::new();
        for group in groups.iter().rev() {
            for server in group.servers() {
                if !seen.insert((group.name(), server.addr())) {
                    continue;
                }
                let labels = [
                    ("group", Escaped(group.name())),
                    ("server", Escaped(server.addr())),
                ];
                ConstGauge::new(i64::from(server.is_usable()))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The status classes, in [`RouteMeters`]'s order.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// `2xx`, `4xx`... for a status code.
pub fn class(status: u16) -> &'static str {
    match status {
        100..=199 => CLASSES[0],
        200..=299 => CLASSES[1],
        300..=399 => CLASSES[2],
        400..=499 => CLASSES[3],
        _ => CLASSES[4],
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
}

impl RouteMeters {
    /// The series of route `route` over `group`'s servers; their `server_healthy` is reported
    /// from now on.
    pub fn new(families: &ReverseMetrics, route: &str, group: &Arc<Group>) -> RouteMeters {
        families.server_healthy.watch(group);
        let name = group.name();
        let meters = RouteMeters {
            families: families.clone(),
            route: route.to_string(),
            group: name.to_string(),
            ttfb: OnceLock::new(),
            total: OnceLock::new(),
            retries: OnceLock::new(),
            spliced: OnceLock::new(),
            classes: Default::default(),
            servers: group
                .servers()
                .iter()
                .map(|server| ServerMeters::new(name, server.addr()))
                .collect(),
        };
        families.hold(Holder::Route(meters.route.clone()));
        for server in &meters.servers {
            families.hold(Holder::Server(server.labels.clone()));
        }
        meters
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
}

impl Drop for RouteMeters {
    fn drop(&mut self) {
        self.families
            .release(Holder::Route(std::mem::take(&mut self.route)));
        for server in &self.servers {
            self.families.release(Holder::Server(server.labels.clone()));
        }
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, servers: &str) -> Arc<Group> {
        let config: crate::upstream::group::GroupConfig = toml::from_str(&format!(
            "name = \"{name}\"\nservers = {servers}\nmax_fails = 1\nfail_timeout_secs = 3600\n"
        ))
        .unwrap();
        Arc::new(Group::new(&config).unwrap())
    }

    fn healthy_lines(registry: &Registry) -> Vec<String> {
        crate::metrics::render(registry)
            .lines()
            .filter(|l| l.starts_with("reverse_server_healthy{"))
            .map(str::to_string)
            .collect()
    }

    /// The gauge is what the server is when `/metrics` is read: the active check taking it down
    /// (`Server::set_healthy`, as `health.rs` calls it) reads 0, an ejection 0, its bringing
    /// back 1. Set by request attempts alone, it stayed 1 through the check's whole outage.
    #[test]
    fn a_server_the_check_takes_down_reads_0() {
        let mut registry = Registry::default();
        let families = ReverseMetrics::new(&mut registry);
        let g = group("app", "[\"127.0.0.1:1\", \"127.0.0.1:2\"]");
        // Two routes over one group: one series per server.
        let _a = RouteMeters::new(&families, "/a", &g);
        let _b = RouteMeters::new(&families, "/b", &g);
        let line = |addr: &str, v: u8| {
            format!("reverse_server_healthy{{group=\"app\",server=\"{addr}\"}} {v}")
        };
        assert_eq!(
            healthy_lines(&registry),
            [line("127.0.0.1:1", 1), line("127.0.0.1:2", 1)]
        );
        g.servers()[0].set_healthy(false);
        assert_eq!(
            healthy_lines(&registry),
            [line("127.0.0.1:1", 0), line("127.0.0.1:2", 1)]
        );
        g.servers()[1].report_failure();
        assert_eq!(
            healthy_lines(&registry),
            [line("127.0.0.1:1", 0), line("127.0.0.1:2", 0)]
        );
        g.servers()[0].set_healthy(true);
        assert_eq!(
            healthy_lines(&registry),
            [line("127.0.0.1:1", 1), line("127.0.0.1:2", 0)]
        );
    }

    /// The series of a route or group a reload took out go when the last table naming them
    /// does (the old one, once its requests end); those the new table names again keep their
    /// counts, a request on the old table meanwhile included.
    #[test]
    fn series_go_with_the_last_table_naming_them() {
        let mut registry = Registry::default();
        let families = ReverseMetrics::new(&mut registry);
        let series = |needle: &str| -> Vec<String> {
            crate::metrics::render(&registry)
                .lines()
                .filter(|l| !l.starts_with('#') && l.contains(needle))
                .map(str::to_string)
                .collect()
        };
        let use_route = |m: &RouteMeters| {
            m.requests(200).inc();
            m.ttfb().observe(0.001);
            m.retries().inc();
            let s = m
                .server(Some(0), &m.servers[0].labels.server.clone())
                .into_owned();
            m.server_requests(&s).inc();
        };
        let (a, both) = (
            group("a", "[\"127.0.0.1:1\"]"),
            group("both", "[\"127.0.0.1:2\"]"),
        );
        let old = [
            RouteMeters::new(&families, "/a", &a),
            RouteMeters::new(&families, "/both", &both),
        ];
        old.iter().for_each(use_route);
        assert!(!series("\"/a\"").is_empty());
        assert!(!series("group=\"a\"").is_empty());
        let b = group("b", "[\"127.0.0.1:3\"]");
        let both2 = group("both", "[\"127.0.0.1:2\"]");
        let new = [
            RouteMeters::new(&families, "/b", &b),
            RouteMeters::new(&families, "/both", &both2),
        ];
        // A request still on the old table.
        use_route(&old[1]);
        drop(old);
        drop((a, both));
        new.iter().for_each(use_route);
        assert_eq!(series("\"/a\""), Vec::<String>::new());
        assert_eq!(series("group=\"a\""), Vec::<String>::new());
        assert!(!series("\"/b\"").is_empty());
        assert_eq!(
            series("reverse_requests_total{route=\"/both\""),
            ["reverse_requests_total{route=\"/both\",class=\"2xx\"} 3"]
        );
        assert_eq!(
            series("reverse_server_requests_total{group=\"both\""),
            ["reverse_server_requests_total{group=\"both\",server=\"127.0.0.1:2\"} 3"]
        );
        drop(new);
        assert_eq!(series("route="), Vec::<String>::new());
    }

    /// A reload's new generation is reported, once per server; a group no route holds any more
    /// leaves the exposition.
    #[test]
    fn a_reloaded_group_replaces_the_old_one() {
        let mut registry = Registry::default();
        let families = ReverseMetrics::new(&mut registry);
        let old = group("app", "[\"127.0.0.1:1\"]");
        let old_route = RouteMeters::new(&families, "/", &old);
        old.servers()[0].set_healthy(false);
        let new = group("app", "[\"127.0.0.1:1\"]");
        let _new_route = RouteMeters::new(&families, "/", &new);
        let line =
            |v: u8| format!("reverse_server_healthy{{group=\"app\",server=\"127.0.0.1:1\"}} {v}");
        // The old one still held (a request on it): the new generation's value, once.
        assert_eq!(healthy_lines(&registry), [line(1)]);
        let gone = group("gone", "[\"127.0.0.1:9\"]");
        let gone_route = RouteMeters::new(&families, "/gone", &gone);
        assert_eq!(healthy_lines(&registry).len(), 2);
        drop((old_route, old, gone_route, gone));
        assert_eq!(healthy_lines(&registry), [line(1)]);
    }
}
