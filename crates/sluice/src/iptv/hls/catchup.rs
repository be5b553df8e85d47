//! The memory all HLS catch-up channels hold together, within `catchup_total_bytes`.
//!
//! Each `playseek` is its own channel, kept up to `catchup_max_bytes` and for `CATCHUP_IDLE`
//! after its last request, ended or not: without a bound over all of them, one client asking
//! for many programmes in turn would hold that much memory per programme.

use std::sync::Arc;

use super::super::registry;
use super::{Channel, Iptv};

impl Iptv {
    /// The bytes `channel` may keep once `incoming` more arrive. Ended catch-up programmes
    /// idle longest are dropped first to make room; what the others still hold beyond that
    /// comes off `channel`'s own budget (its oldest segments go, as with `catchup_max_bytes`).
    pub(super) fn catchup_room(&self, channel: &Arc<Channel>, incoming: u64) -> u64 {
        let limit = self.config.hls.catchup_total_bytes;
        let mut table = registry::lock(&self.hls.channels);
        let mut others = Vec::new();
        let mut held = 0;
        let mut own = 0;
        for c in table.values().filter(|c| c.catchup.is_some()) {
            let (bytes, ended) = c.held();
            if Arc::ptr_eq(c, channel) {
                own = bytes;
            } else {
                held += bytes;
                if ended {
                    others.push((c.idle(), bytes, c.clone()));
                }
            }
        }
        // Longest idle first.
        others.sort_by_key(|o| std::cmp::Reverse(o.0));
        for (_, bytes, gone) in others {
            if held + own + incoming <= limit {
                break;
            }
            // Its segmenter task sees it gone from the table and lets it go.
            table.remove(&gone.key);
            held -= bytes;
            tracing::info!(channel = %gone.key.channel(), bytes, "HLS catch-up dropped: catchup_total_bytes reached");
        }
        limit.saturating_sub(held)
    }

    /// Publishes what the catch-up channels hold now.
    pub(super) fn count_catchup(&self) {
        let held: u64 = registry::lock(&self.hls.channels)
            .values()
            .filter(|c| c.catchup.is_some())
            .map(|c| c.held().0)
            .sum();
        let held = i64::try_from(held).unwrap_or(i64::MAX);
        self.registry.metrics.hls_catchup_bytes.set(held);
    }
}
