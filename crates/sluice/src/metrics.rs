//! HTTP-level metric families of the server; other modules (the acceptor in `server::listener`,
//! the front ends, the services) register their own in the same registry.

pub mod process;
pub mod protocol;

use std::fmt::Write;

use crate::atomic::Counter;
use crate::atomic::Gauge;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A label value from the config or the outside (a route, a group, a listener, a server name),
/// written with the text format's escapes: `\\`, `\"` and `\n` (prometheus-client writes label
/// values as they are, so a `"` in a route's path ended the value early and broke the scrape).
#[derive(Clone, Copy, Debug)]
pub struct Escaped<'a>(pub &'a str);

impl prometheus_client::encoding::EncodeLabelValue for Escaped<'_> {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> Result<(), std::fmt::Error> {
        let mut rest = self.0;
        while let Some(at) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..at])?;
            encoder.write_str(match rest.as_bytes()[at] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[at + 1..];
        }
        encoder.write_str(rest)
    }
}

/// Labels of per-request series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    /// The response's status, its class or 0 (see `RequestLabels::new`).
    pub status: StatusLabel,
}

/// A response status as a label value: `404`, `4xx`, or `0`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum StatusLabel {
    /// A status registered with IANA (`200`, `404`...).
    Code(u16),
    /// Any other status of 100-599, by its class (`1`: `1xx` ... `5`: `5xx`).
    Class(u16),
    /// A status outside 100-599 (`0`).
    Other,
}

impl StatusLabel {
    /// The label of `status`.
    pub fn of(status: u16) -> StatusLabel {
        match status {
            s if registered(s) => StatusLabel::Code(s),
            100..=599 => StatusLabel::Class(status / 100),
            _ => StatusLabel::Other,
        }
    }
}

impl prometheus_client::encoding::EncodeLabelValue for StatusLabel {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> Result<(), std::fmt::Error> {
        match self {
            StatusLabel::Code(code) => write!(encoder, "{code}"),
            StatusLabel::Class(class) => write!(encoder, "{class}xx"),
            StatusLabel::Other => encoder.write_str("0"),
        }
    }
}

/// Whether `status` is in the IANA HTTP status code registry (RFC 9110 and its updates; the
/// unused 306 left out, 418 kept: clients and servers do send it).
fn registered(status: u16) -> bool {
    matches!(
        status,
        100..=103
            | 200..=208
            | 226
            | 300..=305
            | 307
            | 308
            | 400..=418
            | 421..=426
            | 428
            | 429
            | 431
            | 451
            | 500..=508
            | 510
            | 511
    )
}

impl RequestLabels {
    /// Labels for a response with `status`. Statuses passed on from an upstream can be any of
    /// 100-999 (hyper accepts them): a hostile upstream answering every code would add some 900
    /// series per endpoint, never removed. The registered codes are kept as they are; any other
    /// status of 100-599 is counted as its class (`4xx`), any beyond (no class is defined past
    /// 5xx) as `0`: at most 5 series more than the registry per endpoint.
    pub fn new(endpoint: &'static str, status: u16) -> Self {
        Self {
            endpoint,
            status: StatusLabel::of(status),
        }
    }
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
    /// Connections cut because the client stopped reading for `server.send_timeout_secs`.
    pub send_timeouts: Counter,
    /// TLS handshakes not finished within `server.tls_handshake_timeout_secs`.
    pub tls_handshake_timeouts: Counter,
    /// TLS handshakes over TCP that failed (not a TLS client, no common version or cipher, the
    /// client's alert).
    pub tls_handshake_errors: Counter,
    /// Requests refused for ambiguous or broken body framing: HTTP/1.1's screen
    /// (`server::screen`), HTTP/2's and HTTP/3's `content-length` checks.
    pub smuggling_refused: Counter,
    /// Requests by HTTP version; QUIC connections.
    pub protocol: protocol::ProtocolMetrics,
    /// Wrong passwords counted per client network, and the limit on them
    /// (`sluice_auth_failures_total`, `sluice_auth_limited_total`).
    pub guesses: std::sync::Arc<crate::auth::guesses::Guesses>,
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
            send_timeouts: Counter::default(),
            tls_handshake_timeouts: Counter::default(),
            tls_handshake_errors: Counter::default(),
            smuggling_refused: Counter::default(),
            protocol: protocol::ProtocolMetrics::new(registry),
            guesses: {
                let (failures, limited) = (Counter::default(), Counter::default());
                registry.register(
                    "auth_failures",
                    "Wrong API passwords offered (every place one is checked, the URL generators included)",
                    failures.clone(),
                );
                registry.register(
                    "auth_limited",
                    "Requests refused with 429, their password not checked, because their client network offered too many wrong ones in the window",
                    limited.clone(),
                );
                crate::auth::guesses::Guesses::new(failures, limited)
            },
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
            "downstream_send_timeouts",
            "Connections cut or responses released because the client stopped reading (server.send_timeout_secs)",
            m.send_timeouts.clone(),
        );
        registry.register(
            "downstream_tls_handshake_timeouts",
            "TLS handshakes not finished within server.tls_handshake_timeout_secs",
            m.tls_handshake_timeouts.clone(),
        );
        registry.register(
            "downstream_tls_handshake_errors",
            "TLS handshakes over TCP that failed: not a TLS client, no common version or cipher, or the client's alert (QUIC's are in sluice_quic_handshakes_failed_total)",
            m.tls_handshake_errors.clone(),
        );
        registry.register(
            "downstream_smuggling_refused",
            "Requests refused for ambiguous or broken body framing: over HTTP/1.1 (400, connection closed) Content-Length with Transfer-Encoding and the like; over sluice's own HTTP/2 server and HTTP/3 (the stream reset) a bad or conflicting content-length, or a body longer or shorter than it",
            m.smuggling_refused.clone(),
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

/// The two text formats a scraper may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    /// Prometheus text exposition 0.0.4, for scrapers that do not ask for OpenMetrics.
    Prometheus,
}

impl Format {
    /// OpenMetrics when the `Accept` header names it (as Prometheus itself does), else 0.0.4.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The registry plus the `process_*` families, in the requested format.
pub fn exposition(registry: &Registry, format: Format) -> String {
    let mut out = render(registry);
    let mut process = String::new();
    process::render(&mut process);
    match out.rfind("# EOF") {
        Some(at) => out.insert_str(at, &process),
        None => out.push_str(&process),
    }
    match format {
        Format::OpenMetrics => out,
        Format::Prometheus => to_prometheus_text(&out),
    }
}

/// OpenMetrics text → Prometheus 0.0.4: no `# EOF` or `# UNIT`, counter families named after their
/// `_total` samples, `info` as a gauge named `_info`, `unknown` as `untyped`.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut renamed = std::collections::HashMap::new();
    for line in openmetrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        if let Some((name, kind)) = rest.split_once(' ') {
            let to = match kind {
                "counter" if !name.ends_with("_total") => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "unknown" => (name.to_string(), "untyped"),
                _ => continue,
            };
            renamed.insert(name.to_string(), to);
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (*p, rest)));
        match meta.and_then(|(p, rest)| {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            renamed.get(name).map(|to| (p, to, tail))
        }) {
            Some(("# TYPE ", (name, kind), _)) => {
                let _ = writeln!(out, "# TYPE {name} {kind}");
            }
            Some((p, (name, _), tail)) => {
                let _ = writeln!(out, "{p}{name} {tail}");
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_beyond_599_share_one_series() {
        let metrics = HttpMetrics::new(&mut Registry::default());
        for status in 100..=999 {
            metrics
                .requests
                .get_or_create(&RequestLabels::new("reverse", status))
                .inc();
        }
        let count = |status| {
            metrics
                .requests
                .get_or_create(&RequestLabels {
                    endpoint: "reverse",
                    status,
                })
                .get()
        };
        assert_eq!(count(StatusLabel::Code(200)), 1);
        assert_eq!(count(StatusLabel::Code(600)), 0);
        assert_eq!(count(StatusLabel::Code(999)), 0);
        assert_eq!(count(StatusLabel::Other), 400);
    }

    /// An upstream answering every code from 100 to 999 adds the registered codes, five classes
    /// and `0`: each unregistered code of 100-599 was a series of its own (some 3,500 over the
    /// endpoints), never removed.
    #[test]
    fn unregistered_statuses_count_as_their_class() {
        let mut registry = Registry::default();
        let metrics = HttpMetrics::new(&mut registry);
        for status in 100..=999 {
            metrics
                .requests
                .get_or_create(&RequestLabels::new("reverse", status))
                .inc();
        }
        // Rendered before `count` makes series of its own.
        let text = render(&registry);
        let series = text
            .lines()
            .filter(|l| l.starts_with("requests_total{"))
            .count();
        // 62 registered codes, 5 classes, 0.
        assert_eq!(series, 68, "{text}");
        for line in [
            "requests_total{endpoint=\"reverse\",status=\"404\"} 1",
            "requests_total{endpoint=\"reverse\",status=\"4xx\"} 71",
            "requests_total{endpoint=\"reverse\",status=\"0\"} 400",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
        }
        let count = |status| {
            metrics
                .requests
                .get_or_create(&RequestLabels {
                    endpoint: "reverse",
                    status,
                })
                .get()
        };
        assert_eq!(count(StatusLabel::Code(200)), 1);
        assert_eq!(count(StatusLabel::Code(404)), 1);
        assert_eq!(count(StatusLabel::Code(511)), 1);
        assert_eq!(count(StatusLabel::Code(599)), 0);
        assert_eq!(count(StatusLabel::Code(600)), 0);
        assert_eq!(count(StatusLabel::Other), 400);
        // 4xx: 400-499 less the 29 registered (400-418, 421-426, 428, 429, 431, 451).
        assert_eq!(count(StatusLabel::Class(4)), 100 - 29);
        assert_eq!(count(StatusLabel::Class(5)), 100 - 11);
    }

    /// A name from the config with `\\`, `"` or a newline in it is written with the text
    /// format's escapes: as it was, a `"` ended the value early and the scrape failed to parse.
    #[test]
    fn label_values_are_escaped() {
        #[derive(Clone, Debug, Hash, PartialEq, Eq)]
        struct Route(String);
        impl EncodeLabelSet for Route {
            fn encode(
                &self,
                encoder: prometheus_client::encoding::LabelSetEncoder,
            ) -> Result<(), std::fmt::Error> {
                [("route", Escaped(&self.0))].encode(encoder)
            }
        }
        let mut registry = Registry::default();
        let family: Family<Route, Counter> = Family::default();
        registry.register("hits", "Hits", family.clone());
        family
            .get_or_create(&Route("/a\"b\\c\nd".to_string()))
            .inc();
        family.get_or_create(&Route("/plain".to_string())).inc();
        let text = render(&registry);
        assert!(
            text.contains("hits_total{route=\"/a\\\"b\\\\c\\nd\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("hits_total{route=\"/plain\"} 1\n"), "{text}");
    }

    #[test]
    fn negotiation() {
        assert_eq!(Format::negotiate(None), Format::Prometheus);
        let prom = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        assert_eq!(Format::negotiate(Some(prom)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Prometheus);
    }

    #[test]
    fn openmetrics_to_prometheus_text() {
        let om = "# HELP sluice_requests Requests.\n# TYPE sluice_requests counter\n\
                  sluice_requests_total{a=\"1\"} 3\n# HELP b Build.\n# TYPE b info\nb_info{v=\"1\"} 1\n\
                  # TYPE g gauge\n# UNIT g bytes\ng 2\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP sluice_requests_total Requests.\n# TYPE sluice_requests_total counter\n\
             sluice_requests_total{a=\"1\"} 3\n# HELP b_info Build.\n# TYPE b_info gauge\n\
             b_info{v=\"1\"} 1\n# TYPE g gauge\ng 2\n"
        );
    }

    #[test]
    fn exposition_carries_process_families_before_eof() {
        let mut registry = Registry::with_prefix("sluice");
        let _ = HttpMetrics::new(&mut registry);
        let om = exposition(&registry, Format::OpenMetrics);
        assert!(om.ends_with("# EOF\n"));
        assert!(om.contains("\nprocess_open_fds "));
        let prom = exposition(&registry, Format::Prometheus);
        assert!(!prom.contains("# EOF"));
        assert!(prom.contains("# TYPE process_cpu_seconds_total counter"));
    }
}
