//! Prometheus metric families of the IPTV gateway (all names in this one file), and the per-hub
//! handles the hot path increments without touching the families' locks.

use crate::atomic::Counter;
use crate::atomic::Gauge;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Bytes a label value must not carry as they are: prometheus-client (0.23) writes label
/// values verbatim, so a `"` or `\` (or a line break) from a request path would end the value
/// early and Prometheus would reject the whole scrape. Control characters and non-ASCII
/// (always encoded by `utf8_percent_encode`) are escaped too, so logs and the status page show
/// them plainly. `%` itself is left alone: a path already percent-encoded reads as sent.
const LABEL_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'"').add(b'\\');

/// `value` made safe as a Prometheus label value (see `LABEL_ESCAPED`): for any label built
/// from client or upstream input.
pub fn label_value(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, LABEL_ESCAPED).to_string()
}

/// Labels identifying one hub.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HubLabels {
    /// `rtp://[source@]group:port` or `udp://…`.
    pub channel: String,
    pub interface: String,
}

/// Every IPTV family, registered once under the `iptv` prefix.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    received_bytes: Family<HubLabels, Counter>,
    received_datagrams: Family<HubLabels, Counter>,
    sent_bytes: Family<HubLabels, Counter>,
    rtp_lost: Family<HubLabels, Counter>,
    rtp_reordered: Family<HubLabels, Counter>,
    rtp_duplicates: Family<HubLabels, Counter>,
    malformed: Family<HubLabels, Counter>,
    ts_cc_errors: Family<HubLabels, Counter>,
    slow_skips: Family<HubLabels, Counter>,
    slow_disconnects: Family<HubLabels, Counter>,
    slow_released: Family<HubLabels, Counter>,
    refreshes: Family<HubLabels, Counter>,
    refresh_failures: Family<HubLabels, Counter>,
    fec_recovered: Family<HubLabels, Counter>,
    fec_unrecoverable: Family<HubLabels, Counter>,
    fec_over_budget: Family<HubLabels, Counter>,
    hub_subscribers: Family<HubLabels, Gauge>,
    /// Hubs currently joined.
    pub hubs: Gauge,
    /// Subscribers across all hubs.
    pub subscribers: Gauge,
    /// Segment bytes (TS and fMP4) held by HLS catch-up channels and ended live ones (bounded
    /// together by `catchup_total_bytes`).
    pub hls_catchup_bytes: Gauge,
    /// Requests refused by a limit, by no data, or by a bad URL.
    pub refused: Family<RefusedLabels, Counter>,
    /// Fast channel change sessions ended, by outcome.
    pub fcc: Family<FccLabels, Counter>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct FccLabels {
    pub outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusedLabels {
    pub reason: &'static str,
}

/// Handles for one hub; clones share the same atomics as the families.
#[derive(Debug, Clone)]
pub struct HubMetrics {
    pub labels: HubLabels,
    pub received_bytes: Counter,
    pub received_datagrams: Counter,
    pub sent_bytes: Counter,
    pub rtp_lost: Counter,
    pub rtp_reordered: Counter,
    pub rtp_duplicates: Counter,
    pub malformed: Counter,
    pub ts_cc_errors: Counter,
    pub slow_skips: Counter,
    pub slow_disconnects: Counter,
    pub slow_released: Counter,
    pub refreshes: Counter,
    pub refresh_failures: Counter,
    pub fec_recovered: Counter,
    pub fec_unrecoverable: Counter,
    pub fec_over_budget: Counter,
    pub subscribers: Gauge,
    /// The gateway-wide FCC outcome family (not per hub: outcomes are few, channels many).
    pub fcc: Family<FccLabels, Counter>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("iptv");
        let hub_counters: [(&str, &str, &Family<HubLabels, Counter>); 16] = [
            (
                "received_bytes",
                "Payload bytes received from multicast",
                &m.received_bytes,
            ),
            (
                "received_datagrams",
                "Datagrams received from multicast",
                &m.received_datagrams,
            ),
            ("sent_bytes", "Bytes written to subscribers", &m.sent_bytes),
            (
                "rtp_lost",
                "RTP sequence numbers never received",
                &m.rtp_lost,
            ),
            (
                "rtp_reordered",
                "RTP packets restored to order",
                &m.rtp_reordered,
            ),
            (
                "rtp_duplicates",
                "RTP packets dropped as duplicate or too late",
                &m.rtp_duplicates,
            ),
            (
                "malformed",
                "Datagrams dropped as neither RTP nor TS (RTP mode) or truncated",
                &m.malformed,
            ),
            (
                "ts_cc_errors",
                "MPEG-TS continuity-counter errors",
                &m.ts_cc_errors,
            ),
            (
                "slow_skips",
                "Times a lapped subscriber was moved ahead",
                &m.slow_skips,
            ),
            (
                "slow_disconnects",
                "Lapped subscribers disconnected",
                &m.slow_disconnects,
            ),
            (
                "slow_released",
                "Stalled subscribers whose unread history the hub stopped holding",
                &m.slow_released,
            ),
            (
                "membership_refreshes",
                "Multicast leave+join refreshes done",
                &m.refreshes,
            ),
            (
                "membership_refresh_failures",
                "Multicast refreshes that failed",
                &m.refresh_failures,
            ),
            (
                "fec_recovered",
                "Lost RTP packets rebuilt from FEC (SMPTE 2022-1 or Reed-Solomon)",
                &m.fec_recovered,
            ),
            (
                "fec_unrecoverable",
                "FEC packets (2022-1) or lost packets (Reed-Solomon) that could not be repaired",
                &m.fec_unrecoverable,
            ),
            (
                "fec_over_budget",
                "Reed-Solomon blocks passed on unrepaired: the channel's decode budget was spent",
                &m.fec_over_budget,
            ),
        ];
        for (name, help, family) in hub_counters {
            r.register(name, help, family.clone());
        }
        r.register(
            "hub_subscribers",
            "Subscribers per hub",
            m.hub_subscribers.clone(),
        );
        r.register(
            "hubs",
            "Hubs joined (including lingering ones)",
            m.hubs.clone(),
        );
        r.register(
            "subscribers",
            "Subscribers across all hubs",
            m.subscribers.clone(),
        );
        r.register(
            "hls_catchup_bytes",
            "Segment bytes (TS and fMP4) held by HLS catch-up channels and by live channels that ended",
            m.hls_catchup_bytes.clone(),
        );
        r.register(
            "refused",
            "Channel requests refused, by reason",
            m.refused.clone(),
        );
        r.register(
            "fcc_sessions",
            "Fast channel change sessions ended, by outcome",
            m.fcc.clone(),
        );
        m
    }

    /// Handles for a new hub.
    pub fn hub(&self, labels: HubLabels) -> HubMetrics {
        let c = |f: &Family<HubLabels, Counter>| f.get_or_create(&labels).clone();
        HubMetrics {
            received_bytes: c(&self.received_bytes),
            received_datagrams: c(&self.received_datagrams),
            sent_bytes: c(&self.sent_bytes),
            rtp_lost: c(&self.rtp_lost),
            rtp_reordered: c(&self.rtp_reordered),
            rtp_duplicates: c(&self.rtp_duplicates),
            malformed: c(&self.malformed),
            ts_cc_errors: c(&self.ts_cc_errors),
            slow_skips: c(&self.slow_skips),
            slow_disconnects: c(&self.slow_disconnects),
            slow_released: c(&self.slow_released),
            refreshes: c(&self.refreshes),
            refresh_failures: c(&self.refresh_failures),
            fec_recovered: c(&self.fec_recovered),
            fec_unrecoverable: c(&self.fec_unrecoverable),
            fec_over_budget: c(&self.fec_over_budget),
            subscribers: self.hub_subscribers.get_or_create(&labels).clone(),
            fcc: self.fcc.clone(),
            labels,
        }
    }

    /// Drops a closed hub's series so label sets do not pile up as channels come and go.
    pub fn remove_hub(&self, labels: &HubLabels) {
        for f in [
            &self.received_bytes,
            &self.received_datagrams,
            &self.sent_bytes,
            &self.rtp_lost,
            &self.rtp_reordered,
            &self.rtp_duplicates,
            &self.malformed,
            &self.ts_cc_errors,
            &self.slow_skips,
            &self.slow_disconnects,
            &self.slow_released,
            &self.refreshes,
            &self.refresh_failures,
            &self.fec_recovered,
            &self.fec_unrecoverable,
            &self.fec_over_budget,
        ] {
            f.remove(labels);
        }
        self.hub_subscribers.remove(labels);
    }

    /// Counts a refused request.
    pub fn refuse(&self, reason: &'static str) {
        self.refused.get_or_create(&RefusedLabels { reason }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(
            label_value("rtsp://h:554/a\"b\\c\nd\u{1b}[0m\u{e9}%20"),
            "rtsp://h:554/a%22b%5Cc%0Ad%1B[0m%C3%A9%20"
        );
        assert_eq!(label_value("rtp://239.1.1.1:5000"), "rtp://239.1.1.1:5000");
    }
}
