//! The slice cache service below the front ends: RFC 9111 policy (from `sluice_http`), a memory
//! tier and a disk tier of aligned slices, coalesced read-while-write fills, purge, metrics.
//!
//! A front end calls [`Cache::serve`] with the downstream request head, a [`CacheKey`] and an
//! [`Origin`] that can fetch (ranged, conditional) upstream responses, and gets a streaming
//! response back. The phases of one request: lookup (index: key → variant → object) → decide
//! (fresh / stale-while-revalidate / revalidate / miss / pass) → body (each covered slice from
//! memory, disk, or a fill that one writer feeds and every reader follows).
//!
//! # Layout
//! - `config`: `[cache]` keys, per-route policy keys, byte sizes.
//! - `object`: an object's stored head, version and disk record; slice keys.
//! - `index`: primary key → `Vary` → objects; hit-for-pass memos.
//! - `memory`: the memory tier (S3-FIFO, bounded in bytes).
//! - `budget`: the one byte budget the memory tier and slices in transit share.
//! - `disk`: the disk tier (checksummed slice files, bounded, rebuilt at start).
//! - `fill`: one slice in flight, followed by its readers.
//! - `writer`: the detached task that fetches a slice and feeds its fill and the tiers.
//! - `serve`: the request phases and response heads.
//! - `stream`: the response body, slice after slice.
//! - `origin`: an `Origin` over the shared upstream client.
//! - `purge`: `PURGE` by URL, prefix or tag, and invalidation after unsafe methods.
//! - `slot`: the process's one cache, built on first need and kept across reloads.
//! - `metrics`: the cache's metric families.
//! - `cluster`: several nodes as one cache (owners on a ring, peer fills, cluster purge).

pub mod budget;
pub mod cluster;
pub mod config;
pub mod disk;
pub mod fill;
pub mod index;
pub mod memory;
pub mod metrics;
pub mod nudge;
pub mod object;
pub mod origin;
pub mod purge;
mod serve;
pub mod shm;
pub mod slot;
mod stream;
mod turn;
mod writer;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;

pub use config::{ByteSize, CacheConfig, RoutePolicyConfig};
pub use serve::StoredHead;
pub use slot::CacheSlot;
pub use sluice_http::freshness::FreshnessPolicy;

use crate::body::Body;
use budget::Budget;
use disk::DiskTier;
use fill::{Fill, FillEnd};
use index::ObjectIndex;
use memory::{MemoryTier, Slice};
use object::{ObjectId, SliceKey};

/// Why an origin exchange failed before a response head.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OriginError {
    #[error("origin unreachable: {0}")]
    Unreachable(String),
    #[error("origin timed out")]
    Timeout,
    /// This process is out of its own resources (descriptors, memory, local ports) to reach the
    /// origin with: not the origin's failure. Answered as the reverse path answers it (503
    /// `local_resources`), counted as no origin error, and final for every request that waited
    /// for the fetch (another writer would fail the same way).
    #[error("out of local resources: {0}")]
    Local(String),
}

/// A future of an origin response.
pub type OriginFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, OriginError>> + Send>>;

/// What the cache calls to reach the origin. The request is bodiless (GET), carries the path and
/// query of the downstream request, the client's end-to-end headers, and the cache's own `Range`
/// and conditional headers; the implementation picks the upstream and sends it.
pub trait Origin: Send + Sync + 'static {
    fn fetch(&self, req: Request<()>) -> OriginFuture;
}

/// The primary cache key: everything that shapes the upstream request apart from `Vary`d headers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey(pub String);

impl CacheKey {
    /// `scope` names what the path is relative to (route, upstream group, host); the path and
    /// query follow. Purge by prefix compares these strings.
    pub fn new(scope: &str, uri: &http::Uri) -> CacheKey {
        let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let mut key = String::with_capacity(scope.len() + 1 + pq.len());
        key.push_str(scope);
        key.push('|');
        key.push_str(pq);
        CacheKey(key)
    }
}

/// The slice cache service; cheap to clone.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    config: CacheConfig,
    slice_bytes: u64,
    memory: Arc<MemoryTier>,
    budget: Budget,
    disk: Option<DiskTier>,
    index: ObjectIndex,
    inflight: Mutex<HashMap<SliceKey, Arc<Fill>>>,
    permits: Arc<Semaphore>,
    /// Cold writers started and not yet holding a permit (`writer::Waiting`).
    waiting: AtomicUsize,
    revalidating: Mutex<HashSet<ObjectId>>,
    /// Revalidations made for clients, one per object version at a time; the other requests
    /// that find the object in need of one wait for its answer (`serve::Recheck`).
    rechecks: Mutex<HashMap<(ObjectId, u64), Arc<serve::Recheck>>>,
    generation: AtomicU64,
    metrics: metrics::CacheMetrics,
    /// Who may purge; a reload swaps it (`Cache::set_purge`).
    purge: arc_swap::ArcSwap<purge::PurgeSecrets>,
    /// Where wrong purge keys are charged, and checked before one is compared: the cache's own
    /// until [`Cache::share_guesses`] hands it the server's (the API password's limiter).
    guesses: arc_swap::ArcSwap<crate::auth::guesses::Guesses>,
    /// This node's part in a cache cluster (`[cache.cluster]`).
    cluster: Option<Arc<cluster::Cluster>>,
    /// Whether [`Cache::start`] ran.
    started: std::sync::atomic::AtomicBool,
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("in [cache]: {0}")]
    Config(#[from] config::CacheConfigError),
    #[error("in [cache.cluster]: {0}")]
    Cluster(String),
    #[error("cache disk_path {path}: {source}")]
    Disk {
        path: String,
        source: std::io::Error,
    },
}

impl Cache {
    /// Builds the tiers (indexing a disk tier left by a previous run) and registers the metrics.
    /// Must run inside a tokio runtime (the disk writer is a task). `api_password`, when set, is
    /// accepted as a purge key.
    pub fn new(
        config: &CacheConfig,
        api_password: Option<&str>,
        registry: &mut Registry,
    ) -> Result<Cache, CacheError> {
        Cache::with_metrics(config, api_password, metrics::CacheMetrics::new(registry))
    }

    /// Like [`Cache::new`] with families registered beforehand, so a cache can be built after
    /// the registry is shared (a reload that adds the first caching route).
    pub fn with_metrics(
        config: &CacheConfig,
        api_password: Option<&str>,
        metrics: metrics::CacheMetrics,
    ) -> Result<Cache, CacheError> {
        let cache = Cache::prepare(config, api_password, metrics)?;
        cache.start()?;
        Ok(cache)
    }

    /// The first half of [`Cache::with_metrics`], for a live reload's prepare step: everything
    /// that can refuse the config (its checks, the disk directory looked at, the cluster's
    /// control port bound), and nothing that lasts once it is dropped (the disk directory is
    /// not written, no task runs, and the bound port closes with it). [`Cache::start`] does
    /// the rest when the reload commits. Must run inside a tokio runtime.
    pub(crate) fn prepare(
        config: &CacheConfig,
        api_password: Option<&str>,
        metrics: metrics::CacheMetrics,
    ) -> Result<Cache, CacheError> {
        config.validate()?;
        let slice_bytes = config.slice_bytes.0;
        let index = ObjectIndex::new(config.max_objects);
        let disk = match &config.disk_path {
            Some(path) => Some(
                DiskTier::prepare(
                    path,
                    disk::DiskOptions {
                        capacity: config.disk_bytes.0,
                        slice_bytes,
                        holds: Some(Arc::new(index.holder())),
                        queue: config.disk_queue,
                        read_timeout: Duration::from_millis(config.disk_read_timeout_ms),
                        write_timeout: Duration::from_millis(config.disk_write_timeout_ms),
                    },
                )
                .map_err(|source| CacheError::Disk {
                    path: path.display().to_string(),
                    source,
                })?,
            ),
            None => None,
        };
        let mut seed = [0u8; 8];
        let _ = getrandom::getrandom(&mut seed);
        let cluster = match config.cluster.as_ref() {
            Some(c) => {
                let cluster = cluster::Cluster::new(
                    c,
                    metrics.cluster.clone(),
                    (
                        Duration::from_secs(config.origin_header_timeout_secs),
                        Duration::from_secs(config.origin_idle_timeout_secs),
                    ),
                )
                .map_err(CacheError::Cluster)?;
                // Bound now, so a port in use refuses the config; served from `start`.
                cluster.bind().map_err(|e| {
                    CacheError::Cluster(format!("control listener on {}: {e}", c.control_bind()))
                })?;
                Some(Arc::new(cluster))
            }
            None => None,
        };
        let memory = Arc::new(MemoryTier::new(config.memory_bytes.0, slice_bytes));
        let budget = Budget::new(config.memory_bytes.0, slice_bytes, memory.clone());
        // Stored heads count against `memory_bytes` too.
        let index = index.charged_to(budget.clone());
        let inner = Arc::new(Inner {
            config: config.clone(),
            slice_bytes,
            memory,
            budget,
            disk,
            index,
            inflight: Mutex::new(HashMap::new()),
            permits: Arc::new(Semaphore::new(config.max_inflight_slices)),
            waiting: AtomicUsize::new(0),
            revalidating: Mutex::new(HashSet::new()),
            rechecks: Mutex::new(HashMap::new()),
            // Generations only need to differ between versions of one object; a random start
            // keeps them distinct across restarts too.
            generation: AtomicU64::new(u64::from_le_bytes(seed) >> 1 | 1),
            metrics,
            purge: arc_swap::ArcSwap::from_pointee(purge::PurgeSecrets::new(config, api_password)),
            guesses: arc_swap::ArcSwap::new(crate::auth::guesses::Guesses::new(
                Default::default(),
                Default::default(),
            )),
            cluster,
            started: std::sync::atomic::AtomicBool::new(false),
        });
        Ok(Cache { inner })
    }

    /// The second half of [`Cache::with_metrics`], run once the cache is the process's: opens
    /// the disk tier ([`DiskTier::start`]: the directory emptied if cut with another slice size,
    /// stamped, indexed) and puts what it holds in the object index, then serves the cluster's
    /// control port and starts its checks (after the index is filled, so a purge they apply
    /// reaches the objects found on disk) and the gauges. Does everything it can even when a
    /// step fails, and returns the first failure; a second call does nothing.
    pub(crate) fn start(&self) -> Result<(), CacheError> {
        let inner = &self.inner;
        if inner.started.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut outcome = Ok(());
        if let (Some(tier), Some(path)) = (&inner.disk, &inner.config.disk_path) {
            match tier.start() {
                Ok(metas) => {
                    for meta in metas {
                        // Over max_objects: the oldest records go, with their files.
                        for gone in inner.index.insert(Arc::new(meta)) {
                            tier.remove_object(gone.id, gone.generation);
                        }
                    }
                }
                Err(source) => {
                    outcome = Err(CacheError::Disk {
                        path: path.display().to_string(),
                        source,
                    })
                }
            }
        }
        if let (Some(c), Some(config)) = (&inner.cluster, &inner.config.cluster) {
            if let Err(e) = c.start(Arc::downgrade(inner)) {
                outcome = outcome.and(Err(CacheError::Cluster(format!(
                    "control listener on {}: {e}",
                    config.control_bind()
                ))));
            }
        }
        metrics::spawn_gauges(Arc::downgrade(inner));
        outcome
    }

    /// Serves a GET or HEAD through the cache (other methods: see [`Cache::invalidate`]).
    pub async fn serve(
        &self,
        req: &http::request::Parts,
        key: &CacheKey,
        origin: Arc<dyn Origin>,
        policy: &FreshnessPolicy,
    ) -> Response<Body> {
        self.inner.serve(req, key, origin, policy).await
    }

    /// A fresh hit that needs no origin (every slice of its body in the memory tier), answered
    /// at once; `None` otherwise, and then [`Cache::serve`] answers the request. `unseen` names
    /// request fields `req` lacks or holds as the client sent them rather than as the origin
    /// would get them (a front end's forwarding fields, added only when an origin is asked): an
    /// object that varies on one of them is left to `serve`. With `wire`, a plain GET's whole
    /// answer comes with its head as a [`StoredHead`] extension and an empty header map (for a
    /// writer of HTTP/1.1 bytes that adds nothing to the head).
    pub fn serve_fresh(
        &self,
        req: &http::request::Parts,
        key: &CacheKey,
        policy: &FreshnessPolicy,
        unseen: &[http::HeaderName],
        wire: bool,
    ) -> Option<Response<Body>> {
        self.inner.serve_fresh(req, key, policy, unseen, wire)
    }

    /// Handles a `PURGE` request for `key` from `peer` (see `purge`).
    pub fn purge(
        &self,
        req: &http::request::Parts,
        key: &CacheKey,
        peer: std::net::IpAddr,
    ) -> Response<Body> {
        self.inner.handle_purge(req, key, peer)
    }

    /// Marks every stored response for these keys as in need of validation (after a successful
    /// unsafe method, RFC 9111 §4.4: the target URI and same-origin `Location` /
    /// `Content-Location`). Marked, not dropped (§4.4 allows either): an unsafe request any client
    /// may send costs the next reader a conditional request (a 304 when nothing changed), never a
    /// refetch of the object.
    pub fn invalidate(&self, keys: &[CacheKey]) {
        // Each key looked up, not the whole index walked under its lock: any client's POST on
        // a caching route lands here.
        for key in keys {
            self.inner
                .purge_in(index::Primaries::Key(&key.0), |_, _| true, true);
        }
    }

    /// Whether a request with no headers for `key` would be answered without the origin now (a
    /// fresh object), or joins a fetch already under way for its first slice. Used to skip work
    /// (prefetching what is already there), never to decide what a client gets.
    pub fn holds(&self, key: &CacheKey) -> bool {
        let none = http::HeaderMap::new();
        let lookup = self
            .inner
            .index
            .lookup(&key.0, &none, std::time::Instant::now());
        if let index::Lookup::Hit(meta) = lookup {
            return meta.ttl(std::time::SystemTime::now()) > 0;
        }
        let cold = SliceKey {
            object: ObjectId::new(&key.0, &sluice_http::freshness::variant_key(&[], &none)),
            generation: 0,
            index: 0,
        };
        self.inner
            .inflight
            .lock()
            .expect("inflight")
            .contains_key(&cold)
    }

    /// Whether `key` is marked to pass (hit-for-pass: its last answer could not be stored), so a
    /// fetch now would go to the origin and its bytes be thrown away. Used to skip work
    /// (prefetching what cannot be kept), never to decide what a client gets.
    pub fn passes(&self, key: &CacheKey) -> bool {
        let none = http::HeaderMap::new();
        matches!(
            self.inner
                .index
                .lookup(&key.0, &none, std::time::Instant::now()),
            index::Lookup::Pass
        )
    }

    /// This node's part in a cache cluster, when `[cache.cluster]` is set.
    pub fn cluster(&self) -> Option<&Arc<cluster::Cluster>> {
        self.inner.cluster.as_ref()
    }

    /// Whether both handles are the same cache.
    pub fn same_as(&self, other: &Cache) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Counts the memory-tier bytes a writer sent with `sendfile` (`shm::FileBody`).
    pub fn sendfile_meter(&self) -> crate::atomic::Counter {
        self.inner.metrics.bytes_sendfile.clone()
    }

    /// Objects indexed.
    pub fn objects(&self) -> usize {
        self.inner.index.len()
    }

    /// For a graceful shutdown: waits (at most `grace`) until the slices and records queued for
    /// the disk tier are written, so they are hits after a restart. Returns whether all were.
    pub async fn flush(&self, grace: Duration) -> bool {
        match &self.inner.disk {
            Some(disk) => disk.flush(grace).await,
            None => true,
        }
    }
}

impl Inner {
    fn next_generation(&self) -> u64 {
        self.generation.fetch_add(2, Ordering::Relaxed)
    }

    /// Puts a complete slice in the memory tier as one allocation (readers still following
    /// `fill` switch to it), and queues it for the disk tier, which keeps its reservation of the
    /// budget until the file is written (waiting for room in the queue).
    async fn store_slice(
        &self,
        key: SliceKey,
        slice: Slice,
        bytes: budget::Reservation,
        fill: Option<&Fill>,
    ) {
        let slice = slice.compacted();
        if let (Some(f), Some(whole)) = (fill, slice.chunks.first()) {
            f.share(whole);
        }
        self.memory.insert(key, slice.clone());
        self.budget.sample();
        if let Some(disk) = &self.disk {
            disk.write_slice(key, slice, Some(bytes)).await;
        }
    }

    /// Forgets objects everywhere (a new version, a purge, an eviction from the index). From
    /// the memory tier go the slices the disk tier had, and the first ones up to what the memory
    /// tier can hold: never a loop over an announced length (an origin can announce 10^18
    /// bytes). Slices left (those of an object whose length never became known, or far into an
    /// object larger than the memory tier and not on disk) are under a generation nothing asks
    /// for again, and age out of memory.
    fn drop_objects(&self, metas: &[Arc<object::ObjectMeta>]) {
        let room = self.config.memory_bytes.0 / self.slice_bytes + 1;
        for meta in metas {
            let key = |index| SliceKey {
                object: meta.id,
                generation: meta.generation,
                index,
            };
            if let Some(len) = meta.length {
                let count = sluice_http::range::slice_count(len, self.slice_bytes);
                for index in 0..count.min(room) {
                    self.memory.remove(&key(index));
                }
            }
            if let Some(disk) = &self.disk {
                for index in disk.remove_object(meta.id, meta.generation) {
                    self.memory.remove(&key(index));
                }
            }
        }
    }

    /// Joins the fill for `key`, or starts one with the job `make` builds.
    fn join_or_start(
        self: &Arc<Self>,
        key: SliceKey,
        make: impl FnOnce() -> writer::FillJob,
    ) -> (Arc<Fill>, bool) {
        let map = self.inflight.lock().expect("inflight");
        self.join_or_start_locked(map, key, make)
    }

    /// [`Inner::join_or_start`] with the in-flight map already locked by the caller (who may
    /// have looked at the index under the same lock).
    fn join_or_start_locked(
        self: &Arc<Self>,
        mut map: std::sync::MutexGuard<'_, HashMap<SliceKey, Arc<Fill>>>,
        key: SliceKey,
        make: impl FnOnce() -> writer::FillJob,
    ) -> (Arc<Fill>, bool) {
        if let Some(f) = map.get(&key) {
            let f = f.clone();
            drop(map);
            self.metrics.coalesced.inc();
            // The origin's head may be in the writer's socket already, unseen until the runtime
            // polls its driver: ask the writer to look now (`nudge`).
            if f.awaits_head() {
                f.nudge().nudge();
            }
            return (f, false);
        }
        // The caller found the slice neither stored nor in flight; its writer may have stored
        // it and left the map since (it stores before it leaves): follow the stored bytes then,
        // not a second fetch.
        if let Some(stored) = self.memory.get(&key) {
            drop(map);
            let last = stored.len < self.slice_bytes;
            return (
                Fill::stored(&stored.chunks, FillEnd::Complete { last }),
                false,
            );
        }
        let job = make();
        if matches!(job.kind, writer::JobKind::Cold { .. })
            && self.permits.available_permits() == 0
            && self.waiting.load(Ordering::Relaxed) >= self.max_waiting()
        {
            // Every fill place taken and a queue of cold writers behind them already: a new
            // miss is passed on to the origin as it is (bound to its client, whose going away
            // ends it) rather than queued behind misses that may all have been abandoned. Only
            // misses count: read-ahead and refetches of stored slices do real clients' work.
            // The pass registers nothing here, so it is not coalesced.
            drop(map);
            return (Fill::stored(&[], FillEnd::Pass { reason: "busy" }), false);
        }
        let fill = Fill::new();
        map.insert(key, fill.clone());
        let waiting = writer::Waiting::new(self.clone(), &job);
        drop(map);
        let writer = writer::run(self.clone(), fill.clone(), key, job, waiting);
        tokio::spawn(fill.nudge().clone().drive(writer));
        (fill, true)
    }

    /// How many cold writers may wait for a fill place before a new miss is passed instead.
    fn max_waiting(&self) -> usize {
        self.config
            .max_inflight_slices
            .saturating_mul(writer::WAITING_PER_PERMIT)
    }

    /// [`Inner::join_or_start`] for a miss's first slice: `None` when the object the miss was
    /// for is in the index by now (its fill ended between the caller's lookup and this call;
    /// a writer indexes the object before it leaves the map), so the caller serves it as a hit
    /// instead of fetching the slice again; or when the URL has been marked to pass since (a
    /// fill found it uncacheable), so the caller passes the request on as it is instead of
    /// starting a fill that would only pass too.
    fn join_or_start_miss(
        self: &Arc<Self>,
        key: SliceKey,
        primary: &str,
        req: &http::HeaderMap,
        make: impl FnOnce() -> writer::FillJob,
    ) -> Option<(Arc<Fill>, bool)> {
        // One critical section for the look at the index and the election: with two, a whole
        // fill could index its object and leave the map in between (a preempted thread on a
        // loaded machine), and this request would fetch the object a second time.
        let map = self.inflight.lock().expect("inflight");
        if !map.contains_key(&key)
            && matches!(
                self.index.lookup(primary, req, std::time::Instant::now()),
                index::Lookup::Hit(_) | index::Lookup::Pass
            )
        {
            return None;
        }
        Some(self.join_or_start_locked(map, key, make))
    }

    /// Removes `fill` from the in-flight map if it is still the one registered for `key`.
    fn release(&self, key: SliceKey, fill: &Arc<Fill>) {
        let mut map = self.inflight.lock().expect("inflight");
        if map.get(&key).is_some_and(|f| Arc::ptr_eq(f, fill)) {
            map.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    /// Finding: each successful unsafe method soft-purged every variant of its URL and queued a
    /// copy of each record for the disk tier, marked or not, in an unbounded queue the writer
    /// wrote in full: a client POSTing in a loop to a URL with 64 variants (each then
    /// revalidated by a GET) queued 64 copies per request, held as long as the disk was slow.
    /// Now a record already marked is left alone, and each object has at most one record
    /// waiting for the writer (the latest).
    #[tokio::test]
    async fn repeated_posts_queue_one_record_per_object() {
        let dir = tempfile::tempdir().unwrap();
        let config = CacheConfig {
            disk_path: Some(dir.path().join("tier")),
            ..Default::default()
        };
        // Prepared, not started: nothing is written, as behind a disk that never answers.
        let metrics = metrics::CacheMetrics::new(&mut Registry::default());
        let cache = Cache::prepare(&config, None, metrics).unwrap();
        let (index, disk) = (&cache.inner.index, cache.inner.disk.as_ref().unwrap());
        let key = CacheKey("1:r1:h|/many".into());
        let ua = http::header::USER_AGENT;
        let mut ids = Vec::new();
        for i in 0..index::MAX_VARIANTS {
            let mut h = HeaderMap::new();
            h.insert(&ua, HeaderValue::from_str(&format!("agent {i}")).unwrap());
            let v = sluice_http::freshness::variant_key(std::slice::from_ref(&ua), &h);
            let m = index::tests::meta(&key.0, vec![ua.clone()], &v, 1);
            assert!(index.insert(m.clone()).is_empty());
            disk.write_meta(m.clone());
            ids.push(m.id);
        }
        for _ in 0..50 {
            // A POST (twice: answered 2xx, its `Location` the same URL)...
            cache.invalidate(std::slice::from_ref(&key));
            cache.invalidate(std::slice::from_ref(&key));
            // ...then a GET of each variant, revalidated (a 304): fresh again, and written.
            for id in &ids {
                let mut m = (*index.get(&key.0, *id).unwrap()).clone();
                m.soft_purged = false;
                let m = Arc::new(m);
                assert!(index.update(m.clone()));
                disk.write_meta(m);
            }
        }
        assert_eq!(disk.queued_records(), index::MAX_VARIANTS);
        assert!(
            disk.pending() <= index::MAX_VARIANTS,
            "{} jobs queued for {} objects",
            disk.pending(),
            index::MAX_VARIANTS
        );
    }
}
