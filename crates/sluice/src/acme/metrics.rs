//! The ACME metric families, registered under `acme_`: certificates held by name with their
//! expiry, orders by outcome, on-demand decisions.

use crate::atomic::Counter;
use crate::atomic::Gauge;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct NameLabels {
    pub name: String,
}

impl EncodeLabelSet for NameLabels {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [("name", crate::metrics::Escaped(&self.name))].encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `issued`, `invalid`, `rate_limited` (by the CA), `throttled` (`acme.orders_per_hour`), `ca_error`, `setup_error`, `store_error`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `allowed`, `from_store`, `refused_by_ask`, `ask_failed`, `recently_tried`, `busy`,
    /// `rate_limited`, `bad_name`.
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlainLabels {
    /// Per request: `challenge` (answered), `no_challenge` (404), `redirect` (308 to https),
    /// `bad_host` (400: no usable Host), `bad_target` (400: no usable redirect). Besides:
    /// `per_client_refused` (a connection past one client's share, closed at once),
    /// `lookup_timeout` (another node's challenge not read from the state directory in time;
    /// that request is one of the `no_challenge`).
    pub what: &'static str,
}

/// Every ACME family.
#[derive(Clone, Default)]
pub struct AcmeMetrics {
    pub expiry: Family<NameLabels, Gauge>,
    pub orders: Family<OutcomeLabels, Counter>,
    pub on_demand: Family<DecisionLabels, Counter>,
    pub plain: Family<PlainLabels, Counter>,
}

impl AcmeMetrics {
    pub fn register(registry: &mut Registry) -> AcmeMetrics {
        let m = AcmeMetrics::default();
        let r = registry.sub_registry_with_prefix("acme");
        r.register(
            "certificate_expiry_timestamp_seconds",
            "Each held certificate's notAfter, by name (Unix time)",
            m.expiry.clone(),
        );
        r.register(
            "orders",
            "Certificate orders finished, by outcome",
            m.orders.clone(),
        );
        r.register(
            "on_demand_decisions",
            "Handshakes for names without a certificate, by what on-demand issuance decided",
            m.on_demand.clone(),
        );
        r.register(
            "plain_listener",
            "What the plain listener (acme.http_listen) did, by request or connection",
            m.plain.clone(),
        );
        m
    }

    pub fn plain(&self, what: &'static str) {
        self.plain.get_or_create(&PlainLabels { what }).inc();
    }

    pub fn order(&self, outcome: &'static str) {
        self.orders.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn decision(&self, decision: &'static str) {
        self.on_demand
            .get_or_create(&DecisionLabels { decision })
            .inc();
    }
}
