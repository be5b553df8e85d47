//! The memory all HLS catch-up channels and ended channels hold together, within
//! `catchup_total_bytes`.
//!
//! Each `playseek` is its own channel, kept up to `catchup_max_bytes` and for `CATCHUP_IDLE`
//! after its last request, ended or not; a live channel whose source ended keeps its last
//! segments (up to `MAX_SEGMENT_BYTES` each) while anyone asks for it, outside every
//! subscriber limit. Without a bound over all of them, one client asking for many programmes
//! or ended channels in turn would hold that much memory per channel. Bytes count the TS
//! segments and their fMP4 rewrites.

use std::sync::Arc;

use super::super::registry;
use super::{Channel, Iptv};

/// Whether `c` counts against `catchup_total_bytes`: a catch-up channel, or one that ended
/// (a running live channel holds only its window).
fn pooled(c: &Channel) -> (bool, u64, bool) {
    let (bytes, ended) = c.held();
    (c.catchup.is_some() || ended, bytes, ended)
}

impl Iptv {
    /// The bytes `channel` may keep once `incoming` more arrive. Ended channels idle longest
    /// are dropped first to make room; what the others still hold beyond that comes off
    /// `channel`'s own budget (its oldest segments go, as with `catchup_max_bytes`).
    pub(super) fn catchup_room(&self, channel: &Arc<Channel>, incoming: u64) -> u64 {
        self.make_room(Some(channel), incoming)
    }

    /// A channel ended (or an ended one's segments were rewritten as fMP4): drops the ended
    /// channels idle longest until all of them fit in `catchup_total_bytes` again.
    pub(super) fn bound_ended(&self) {
        self.make_room(None, 0);
        self.count_catchup();
    }

    fn make_room(&self, channel: Option<&Arc<Channel>>, incoming: u64) -> u64 {
        let limit = self.config.hls.catchup_total_bytes;
        let mut table = registry::lock(&self.hls.channels);
        let mut others = Vec::new();
        let mut held = 0;
        let mut own = 0;
        for c in table.values() {
            let (counted, bytes, ended) = pooled(c);
            if channel.is_some_and(|own| Arc::ptr_eq(c, own)) {
                own = bytes;
            } else if counted {
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
            // Its segmenter task sees it gone from the table and lets it go; a request for it
            // starts the channel again, within every limit.
            table.remove(&gone.key);
            // Its fMP4 rewrite stops too: it held the channel's segments and went on remuxing
            // them, no longer counted, until it had written them all.
            gone.fmp4.close();
            held -= bytes;
            tracing::info!(channel = %gone.key.channel(), bytes, "HLS channel dropped: catchup_total_bytes reached");
        }
        limit.saturating_sub(held)
    }

    /// Publishes what the catch-up and ended channels hold now.
    pub(super) fn count_catchup(&self) {
        let held: u64 = registry::lock(&self.hls.channels)
            .values()
            .map(|c| pooled(c))
            .filter(|(counted, _, _)| *counted)
            .map(|(_, bytes, _)| bytes)
            .sum();
        let held = i64::try_from(held).unwrap_or(i64::MAX);
        self.registry.metrics.hls_catchup_bytes.set(held);
    }
}
