//! The cache's metric families (registered under `sluice_cache_`), and the task that keeps the
//! tier size gauges current.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use crate::atomic::Counter;
use crate::atomic::Gauge;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::Inner;

/// Label of the request outcome series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// Label of per-tier series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabels {
    pub tier: &'static str,
}

/// The cache's families.
#[derive(Clone)]
pub struct CacheMetrics {
    /// hit, miss, stale, revalidated, bypass.
    pub requests: Family<ResultLabels, Counter>,
    /// Requests that joined a fill another request had started.
    pub coalesced: Counter,
    pub bytes_memory: Counter,
    /// Of those, bytes sent with `sendfile` from file-backed slices (`shm.rs`).
    pub bytes_sendfile: Counter,
    pub bytes_disk: Counter,
    pub bytes_origin: Counter,
    pub tier_bytes: Family<TierLabels, Gauge>,
    pub evictions: Family<TierLabels, Counter>,
    pub disk_dropped: Counter,
    pub disk_corrupt: Counter,
    pub disk_read_errors: Counter,
    pub disk_layout_dropped: Counter,
    /// Disk reads refused at the process's cap on reads at once (no place within their timeout).
    pub disk_reads_refused: Counter,
    pub objects: Gauge,
    /// `memory_bytes`, and what is counted against it now and at most so far (`budget`).
    pub budget: Gauge,
    pub accounted: Gauge,
    pub accounted_peak: Gauge,
    pub disk_queue: Gauge,
    /// 1 while the disk writer's current job (a write or a removal) has run past
    /// `disk_write_timeout_ms` and not returned (new slices are dropped meanwhile), else 0.
    pub disk_stalled: Gauge,
    pub stored: Counter,
    pub uncacheable: Counter,
    pub version_mismatch: Counter,
    pub origin_errors: Counter,
    /// Fills given up with nobody reading (`origin_slice_timeout_secs`).
    pub fills_given_up: Counter,
    pub origin_latency: Histogram,
    /// `sluice_cache_cluster_*`.
    pub cluster: super::cluster::metrics::ClusterMetrics,
}

impl CacheMetrics {
    pub fn new(registry: &mut Registry) -> CacheMetrics {
        let m = CacheMetrics {
            requests: Family::default(),
            coalesced: Counter::default(),
            bytes_memory: Counter::default(),
            bytes_sendfile: Counter::default(),
            bytes_disk: Counter::default(),
            bytes_origin: Counter::default(),
            tier_bytes: Family::default(),
            evictions: Family::default(),
            disk_dropped: Counter::default(),
            disk_corrupt: Counter::default(),
            disk_read_errors: Counter::default(),
            disk_layout_dropped: Counter::default(),
            disk_reads_refused: Counter::default(),
            objects: Gauge::default(),
            budget: Gauge::default(),
            accounted: Gauge::default(),
            accounted_peak: Gauge::default(),
            disk_queue: Gauge::default(),
            disk_stalled: Gauge::default(),
            stored: Counter::default(),
            uncacheable: Counter::default(),
            version_mismatch: Counter::default(),
            origin_errors: Counter::default(),
            fills_given_up: Counter::default(),
            // 0.5 ms .. ~16 s
            origin_latency: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            cluster: Default::default(),
        };
        let r = registry.sub_registry_with_prefix("cache");
        let m = CacheMetrics {
            cluster: super::cluster::metrics::ClusterMetrics::register(r),
            ..m
        };
        r.register("requests", "Cached requests by outcome", m.requests.clone());
        r.register(
            "coalesced_waiters",
            "Requests that followed a fill or a revalidation another request started",
            m.coalesced.clone(),
        );
        r.register(
            "memory_sent_bytes",
            "Bytes sent from the memory tier",
            m.bytes_memory.clone(),
        );
        r.register(
            "memory_sendfile_bytes",
            "Bytes sent from the memory tier with sendfile (no copy into the socket)",
            m.bytes_sendfile.clone(),
        );
        r.register(
            "disk_sent_bytes",
            "Bytes sent from the disk tier",
            m.bytes_disk.clone(),
        );
        r.register(
            "origin_received_bytes",
            "Bytes fetched from origins",
            m.bytes_origin.clone(),
        );
        r.register(
            "tier_bytes",
            "Bytes held by each tier",
            m.tier_bytes.clone(),
        );
        r.register(
            "evictions",
            "Slices evicted by each tier",
            m.evictions.clone(),
        );
        r.register(
            "disk_dropped_writes",
            "Disk writes dropped (disk too slow, full or failing)",
            m.disk_dropped.clone(),
        );
        r.register(
            "disk_corrupt_slices",
            "Slice files dropped for a bad length or checksum",
            m.disk_corrupt.clone(),
        );
        r.register(
            "disk_read_errors",
            "Disk slice reads that failed for another reason than a bad file (a miss; the file is kept)",
            m.disk_read_errors.clone(),
        );
        r.register(
            "disk_layout_dropped_files",
            "Disk tier files deleted at start because the directory was cut with another slice size",
            m.disk_layout_dropped.clone(),
        );
        r.register(
            "disk_reads_refused",
            "Disk slice reads refused (a miss, no thread taken): every place of the 32 reads at once held for the whole read timeout",
            m.disk_reads_refused.clone(),
        );
        r.register("objects", "Objects indexed", m.objects.clone());
        r.register("stored_objects", "Objects stored", m.stored.clone());
        r.register(
            "uncacheable",
            "Origin answers that could not be stored",
            m.uncacheable.clone(),
        );
        r.register(
            "version_mismatches",
            "Objects dropped because a slice came from another version",
            m.version_mismatch.clone(),
        );
        r.register(
            "origin_errors",
            "Origin exchanges that failed",
            m.origin_errors.clone(),
        );
        r.register(
            "fills_given_up",
            "Fills given up because their slice took origin_slice_timeout_secs with nobody reading",
            m.fills_given_up.clone(),
        );
        r.register(
            "budget_bytes",
            "The byte budget (memory_bytes) the memory tier, slices in transit and indexed heads share",
            m.budget.clone(),
        );
        r.register(
            "accounted_bytes",
            "Bytes counted against the budget: memory tier, slices in transit and indexed objects' heads",
            m.accounted.clone(),
        );
        r.register(
            "accounted_peak_bytes",
            "The most bytes counted against the budget at once since start",
            m.accounted_peak.clone(),
        );
        r.register(
            "disk_queue_jobs",
            "Slices and records waiting for (or being written by) the disk writer",
            m.disk_queue.clone(),
        );
        r.register(
            "disk_stalled",
            "1 while a disk job (a write or a removal) has not returned within disk_write_timeout_ms (new slices are dropped meanwhile), else 0",
            m.disk_stalled.clone(),
        );
        r.register(
            "origin_fetch_seconds",
            "Time from an origin request to its response head",
            m.origin_latency.clone(),
        );
        m
    }

    pub fn result(&self, result: &'static str) {
        self.requests.get_or_create(&ResultLabels { result }).inc();
    }
}

/// Refreshes the size gauges and tier counters once a second while the cache lives.
pub(super) fn spawn_gauges(inner: Weak<Inner>) {
    tokio::spawn(async move {
        let mut last_mem_evictions = 0;
        let (mut last_disk_evictions, mut last_dropped, mut last_corrupt) = (0, 0, 0);
        let (mut last_read_errors, mut last_layout_dropped, mut last_refused) = (0, 0, 0);
        loop {
            {
                let Some(inner) = inner.upgrade() else { return };
                let m = &inner.metrics;
                let tier = |t| TierLabels { tier: t };
                m.tier_bytes
                    .get_or_create(&tier("memory"))
                    .set(inner.memory.weight() as i64);
                let ev = inner.memory.evictions();
                m.evictions
                    .get_or_create(&tier("memory"))
                    .inc_by(ev - last_mem_evictions);
                last_mem_evictions = ev;
                m.objects.set(inner.index.len() as i64);
                m.tier_bytes
                    .get_or_create(&tier("transit"))
                    .set(inner.budget.in_transit() as i64);
                m.budget.set(inner.budget.total() as i64);
                m.accounted.set(inner.budget.accounted() as i64);
                m.accounted_peak.set(inner.budget.peak() as i64);
                if let Some(disk) = &inner.disk {
                    m.tier_bytes
                        .get_or_create(&tier("disk"))
                        .set(disk.bytes() as i64);
                    m.disk_queue.set(disk.pending() as i64);
                    m.disk_stalled.set(i64::from(disk.stalled()));
                    let s = &disk.stats;
                    let ev = s.evictions.load(Ordering::Relaxed);
                    m.evictions
                        .get_or_create(&tier("disk"))
                        .inc_by(ev - last_disk_evictions);
                    last_disk_evictions = ev;
                    let d = s.dropped.load(Ordering::Relaxed);
                    m.disk_dropped.inc_by(d - last_dropped);
                    last_dropped = d;
                    let c = s.corrupt.load(Ordering::Relaxed);
                    m.disk_corrupt.inc_by(c - last_corrupt);
                    last_corrupt = c;
                    let e = s.read_errors.load(Ordering::Relaxed);
                    m.disk_read_errors.inc_by(e - last_read_errors);
                    last_read_errors = e;
                    let l = s.layout_dropped.load(Ordering::Relaxed);
                    m.disk_layout_dropped.inc_by(l - last_layout_dropped);
                    last_layout_dropped = l;
                    let r = s.reads_refused.load(Ordering::Relaxed);
                    m.disk_reads_refused.inc_by(r - last_refused);
                    last_refused = r;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}
