//! Per-server gauges of the upstream groups, read from the servers' atomics at scrape time, so the
//! data path never touches a metric family and a reload just swaps the tracked set.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::{Group, Groups};
use crate::metrics::Escaped;

/// The groups currently reported; share it with whoever swaps groups on reload.
#[derive(Debug, Clone, Default)]
pub struct GroupMetrics {
    tracked: Arc<Mutex<Vec<Arc<Group>>>>,
}

impl GroupMetrics {
    /// Registers the `upstream_server_*` families and `upstream_fallback_plans`.
    pub fn register(registry: &mut Registry) -> GroupMetrics {
        let metrics = GroupMetrics::default();
        registry.register_collector(Box::new(metrics.clone()));
        metrics
    }

    /// Reports these groups from now on (replacing the previous set).
    pub fn track(&self, groups: &Groups) {
        let mut list: Vec<Arc<Group>> = groups.iter().cloned().collect();
        list.sort_by(|a, b| a.name().cmp(b.name()));
        *self.tracked.lock().unwrap_or_else(|e| e.into_inner()) = list;
    }
}

/// Reads one gauge's value off a server.
type ServerValue = fn(&super::Server) -> i64;

impl Collector for GroupMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let groups = self
            .tracked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let gauges: [(&str, &str, ServerValue); 3] = [
            (
                "upstream_server_up",
                "1 when the server is usable (healthy and not ejected)",
                |s| i64::from(s.is_usable()),
            ),
            (
                "upstream_server_in_flight",
                "Requests or connections in flight on the server",
                |s| s.in_flight() as i64,
            ),
            (
                "upstream_server_consecutive_failures",
                "Failures in a row since the last success",
                |s| i64::from(s.failures()),
            ),
        ];
        for (name, help, value) in gauges {
            let mut family =
                encoder.encode_descriptor(name, help, None, ConstGauge::new(0i64).metric_type())?;
            for group in &groups {
                for server in group.servers() {
                    let labels = [
                        ("group", Escaped(group.name())),
                        ("server", Escaped(server.addr())),
                    ];
                    ConstGauge::new(value(server)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "upstream_server_ejections",
            "Times the server was ejected after consecutive failures",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for group in &groups {
            for server in group.servers() {
                let labels = [
                    ("group", Escaped(group.name())),
                    ("server", Escaped(server.addr())),
                ];
                ConstCounter::new(server.ejections()).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "upstream_fallback_plans",
            "Requests or connections sent to a server passive ejection took out, no server being usable",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for group in &groups {
            let labels = [("group", Escaped(group.name()))];
            ConstCounter::new(group.fallback_plans()).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
