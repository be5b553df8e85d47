//! The process's one current generation of upstream groups, shared by the reverse and TCP front ends.
//!
//! A reload prepares the next generation ([`Live::prepare`], state carried over by
//! [`Groups::rebuild`]) without touching the running one; only [`Live::install`] swaps it in,
//! restarts the active health checkers and re-points the group gauges. That keeps a reload
//! all-or-nothing: a part that fails to prepare leaves the current generation running.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::health::{self, HealthChecks};
use super::metrics::GroupMetrics;
use super::{GroupConfig, Groups};

/// The current generation, its health checkers and the gauges that report it.
#[derive(Debug)]
pub struct Live {
    current: ArcSwap<Groups>,
    /// The checkers of the current generation; replacing them stops the old ones.
    checks: Mutex<HealthChecks>,
    metrics: GroupMetrics,
}

impl Live {
    /// Builds the first generation, starts its health checkers and reports it through `metrics`.
    /// Checkers are tokio tasks: call this inside the runtime when any group has `health_check`.
    pub fn start(configs: &[GroupConfig], metrics: GroupMetrics) -> anyhow::Result<Arc<Live>> {
        let groups = Arc::new(Groups::new(configs)?);
        metrics.track(&groups);
        let checks = health::spawn(&groups);
        Ok(Arc::new(Live {
            current: ArcSwap::new(groups),
            checks: Mutex::new(checks),
            metrics,
        }))
    }

    /// The generation in use now.
    pub fn current(&self) -> Arc<Groups> {
        self.current.load_full()
    }

    /// Builds the next generation from `configs`, keeping the health and ejection state of servers
    /// that stay; nothing runs on it until [`Live::install`].
    pub fn prepare(&self, configs: &[GroupConfig]) -> anyhow::Result<Arc<Groups>> {
        Ok(Arc::new(Groups::rebuild(configs, Some(&self.current()))?))
    }

    /// Makes `next` the current generation: gauges follow it and its checkers replace the old ones.
    pub fn install(&self, next: Arc<Groups>) {
        self.metrics.track(&next);
        let checks = health::spawn(&next);
        self.current.store(next);
        // The old checkers stop when their handle drops here.
        *self.checks.lock().unwrap_or_else(|e| e.into_inner()) = checks;
    }
}
