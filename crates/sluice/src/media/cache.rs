//! The in-process media cache: MPDs, init segments and prefetched segments, bounded in bytes (least
//! recently used goes first, every entry also expires), with single-flight misses.
//!
//! Entries are keyed on the whole upstream request ([`CacheKey::for_request`]): two viewers share an
//! entry only when sluice would send the origin byte-identical requests for it, so one user's
//! cookie or authorization never fetches bytes for another, and a header a client adds (`h_range`,
//! `h_host`) makes its own entry instead of poisoning the common one.
//!
//! A miss starts the fetch as its own task and records it as in flight; concurrent requests for the
//! same key wait for that one fetch instead of starting another, and a requester that goes away
//! does not cancel it (the result still lands in the cache for the others and for later requests).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_media::cenc::InitInfo;
use sluice_media::dash::Mpd;
use tokio::time::Instant;

use crate::error::ProxyError;
use crate::upstream::UpstreamRequest;

/// Label of per-kind cache series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// What a cache entry holds; also its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheKind {
    Mpd,
    /// A SegmentBase track's `sidx` bytes.
    Sidx,
    /// An init segment as fetched.
    RawInit,
    /// An init segment with protection removed, for one key set.
    ClearInit,
    /// A media segment as fetched (by a player request or by prefetch).
    Segment,
}

impl CacheKind {
    fn label(self) -> &'static str {
        match self {
            CacheKind::Mpd => "mpd",
            CacheKind::Sidx => "sidx",
            CacheKind::RawInit => "raw_init",
            CacheKind::ClearInit => "clear_init",
            CacheKind::Segment => "segment",
        }
    }
}

/// Identifies one cached object: its kind and the fingerprint of the upstream request that fetches
/// it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub kind: CacheKind,
    pub request: [u8; 32],
}

impl CacheKey {
    /// The same request held as another kind of entry (an init segment as fetched and decrypted).
    pub fn with_kind(mut self, kind: CacheKind) -> Self {
        self.kind = kind;
        self
    }

    /// The key of whatever `req` fetches. The fingerprint covers everything that shapes the request
    /// sluice sends: method, URL, and every header with every value (names sorted, values in
    /// order). The outgoing route (direct, proxy, TLS checks) is a function of the URL's host and
    /// the default User-Agent a constant of the configuration, so both are covered by the URL.
    pub fn for_request(kind: CacheKind, req: &UpstreamRequest) -> Self {
        CacheKey {
            kind,
            request: request_fingerprint(req),
        }
    }
}

/// SHA-256 over a length-prefixed encoding of the request, so no two different requests can
/// produce the same byte stream.
pub fn request_fingerprint(req: &UpstreamRequest) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(req.method.as_str().as_bytes());
    field(req.url.as_str().as_bytes());
    let mut names: Vec<&http::HeaderName> = req.headers.keys().collect();
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    for name in names {
        for value in req.headers.get_all(name) {
            field(name.as_str().as_bytes());
            field(value.as_bytes());
        }
    }
    h.finalize().into()
}

/// A cached value.
#[derive(Debug, Clone)]
pub enum CacheValue {
    Bytes(Bytes),
    /// A parsed MPD and the size of its text (its weight).
    Mpd(Arc<Mpd>, usize),
    /// A decrypted init segment and what decryption needs to know about its tracks.
    Init(Bytes, Arc<InitInfo>),
}

impl CacheValue {
    /// Approximate bytes held.
    fn weight(&self) -> u64 {
        let n = match self {
            CacheValue::Bytes(b) => b.len(),
            // The parsed model is a few times the text.
            CacheValue::Mpd(_, text) => text.saturating_mul(3),
            CacheValue::Init(b, _) => b.len() + 256,
        };
        n as u64 + 128
    }
}

/// A fetch in flight, shared by every requester of its key.
type Flight = Shared<BoxFuture<'static, Result<CacheValue, ProxyError>>>;

struct Slot {
    value: CacheValue,
    weight: u64,
    expires: Instant,
    /// Position in the recency order.
    tick: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<CacheKey, Slot>,
    /// Recency order: oldest tick first.
    order: BTreeMap<u64, CacheKey>,
    tick: u64,
    bytes: u64,
    flights: HashMap<CacheKey, Flight>,
}

/// Metric families of the cache.
#[derive(Clone, Default)]
pub struct CacheMetrics {
    hits: Family<KindLabels, Counter>,
    misses: Family<KindLabels, Counter>,
    coalesced: Family<KindLabels, Counter>,
    evictions: Counter,
    bytes: Gauge,
}

impl CacheMetrics {
    /// Registers the families under `media_cache_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = CacheMetrics::default();
        let sub = registry.sub_registry_with_prefix("media_cache");
        sub.register(
            "hits",
            "Media cache lookups answered from memory, by entry kind",
            m.hits.clone(),
        );
        sub.register(
            "misses",
            "Media cache lookups that started an upstream fetch, by entry kind",
            m.misses.clone(),
        );
        sub.register(
            "coalesced",
            "Media cache lookups that joined a fetch already in flight, by entry kind",
            m.coalesced.clone(),
        );
        sub.register(
            "evictions",
            "Entries dropped to stay under media.cache_bytes",
            m.evictions.clone(),
        );
        sub.register("bytes", "Bytes held by the media cache", m.bytes.clone());
        m
    }

    fn label(kind: CacheKind) -> KindLabels {
        KindLabels { kind: kind.label() }
    }
}

/// The cache. Cheap to share behind an `Arc`.
pub struct MediaCache {
    inner: Mutex<Inner>,
    capacity: u64,
    metrics: CacheMetrics,
}

impl MediaCache {
    pub fn new(capacity: u64, metrics: CacheMetrics) -> Arc<Self> {
        Arc::new(MediaCache {
            inner: Mutex::new(Inner::default()),
            capacity,
            metrics,
        })
    }

    /// The cached value for `key`, or the result of `fetch` (which also returns how long the value
    /// stays fresh). Concurrent callers with one key share a single `fetch`; failures are not
    /// cached.
    pub async fn get_or_fetch<F, Fut>(
        self: &Arc<Self>,
        key: CacheKey,
        fetch: F,
    ) -> Result<CacheValue, ProxyError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(CacheValue, Duration), ProxyError>> + Send + 'static,
    {
        let label = CacheMetrics::label(key.kind);
        let flight = {
            let mut inner = self.lock();
            if let Some(value) = inner.lookup(&key) {
                self.metrics.hits.get_or_create(&label).inc();
                return Ok(value);
            }
            match inner.flights.get(&key) {
                Some(flight) => {
                    self.metrics.coalesced.get_or_create(&label).inc();
                    flight.clone()
                }
                None => {
                    self.metrics.misses.get_or_create(&label).inc();
                    let flight = self.start(key.clone(), fetch());
                    inner.flights.insert(key, flight.clone());
                    flight
                }
            }
        };
        flight.await
    }

    /// True when `key` is cached and fresh, or being fetched.
    pub fn holds(&self, key: &CacheKey) -> bool {
        let mut inner = self.lock();
        inner.flights.contains_key(key) || inner.lookup(key).is_some()
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Spawns the fetch; its task stores the result and clears the in-flight mark. The caller holds
    /// the lock while registering the flight, so the task cannot finish before it is registered.
    fn start<Fut>(self: &Arc<Self>, key: CacheKey, fetch: Fut) -> Flight
    where
        Fut: Future<Output = Result<(CacheValue, Duration), ProxyError>> + Send + 'static,
    {
        let cache = Arc::clone(self);
        let task = tokio::spawn(async move {
            let result = fetch.await;
            let mut inner = cache.lock();
            inner.flights.remove(&key);
            match result {
                Ok((value, ttl)) => {
                    cache.store(&mut inner, key, value.clone(), ttl);
                    Ok(value)
                }
                Err(e) => Err(e),
            }
        });
        async move {
            task.await
                .unwrap_or_else(|e| Err(ProxyError::internal(format!("cache fetch failed: {e}"))))
        }
        .boxed()
        .shared()
    }

    fn store(&self, inner: &mut Inner, key: CacheKey, value: CacheValue, ttl: Duration) {
        let weight = value.weight();
        // One object may not crowd out everything else.
        if ttl.is_zero() || weight > self.capacity / 4 {
            return;
        }
        inner.remove(&key);
        inner.tick += 1;
        let tick = inner.tick;
        inner.order.insert(tick, key.clone());
        inner.bytes += weight;
        inner.entries.insert(
            key,
            Slot {
                value,
                weight,
                expires: Instant::now() + ttl,
                tick,
            },
        );
        while inner.bytes > self.capacity {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            if let Some(slot) = inner.entries.remove(&oldest) {
                inner.bytes -= slot.weight;
                self.metrics.evictions.inc();
            }
        }
        self.metrics.bytes.set(inner.bytes as i64);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent maps behind, so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// A fresh entry, marked most recently used; an expired one is dropped.
    fn lookup(&mut self, key: &CacheKey) -> Option<CacheValue> {
        let now = Instant::now();
        let slot = self.entries.get(key)?;
        if slot.expires <= now {
            self.remove(key);
            return None;
        }
        let old_tick = slot.tick;
        self.tick += 1;
        let tick = self.tick;
        self.order.remove(&old_tick);
        self.order.insert(tick, key.clone());
        let slot = self.entries.get_mut(key)?;
        slot.tick = tick;
        Some(slot.value.clone())
    }

    fn remove(&mut self, key: &CacheKey) {
        if let Some(slot) = self.entries.remove(key) {
            self.order.remove(&slot.tick);
            self.bytes -= slot.weight;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn key(name: &str) -> CacheKey {
        let url = url::Url::parse(&format!("http://o/{name}")).unwrap();
        CacheKey::for_request(CacheKind::Segment, &UpstreamRequest::get(url))
    }

    fn with(headers: &[(&'static str, &'static str)]) -> CacheKey {
        let mut req = UpstreamRequest::get(url::Url::parse("http://o/seg.ts").unwrap());
        for (n, v) in headers {
            req.headers.append(*n, http::HeaderValue::from_static(v));
        }
        CacheKey::for_request(CacheKind::Segment, &req)
    }

    #[test]
    fn key_covers_every_request_header() {
        let plain = with(&[]);
        assert_eq!(plain, with(&[]));
        assert_ne!(plain, key("seg.ts").clone().with_kind(CacheKind::RawInit));
        // Every header and value counts; order of different names does not.
        assert_ne!(plain, with(&[("cookie", "a=1")]));
        assert_ne!(with(&[("cookie", "a=1")]), with(&[("cookie", "a=2")]));
        assert_ne!(with(&[("authorization", "A")]), with(&[("cookie", "A")]));
        assert_ne!(plain, with(&[("range", "bytes=0-9")]));
        assert_ne!(plain, with(&[("host", "other")]));
        assert_eq!(
            with(&[("x-a", "1"), ("x-b", "2")]),
            with(&[("x-b", "2"), ("x-a", "1")])
        );
        assert_ne!(
            with(&[("x-a", "1"), ("x-a", "2")]),
            with(&[("x-a", "2"), ("x-a", "1")])
        );
        // Length prefixes: moving bytes between name and value changes the key.
        assert_ne!(with(&[("x-ab", "c")]), with(&[("x-a", "bc")]));
        let mut head = UpstreamRequest::get(url::Url::parse("http://o/seg.ts").unwrap());
        head.method = http::Method::HEAD;
        assert_ne!(plain, CacheKey::for_request(CacheKind::Segment, &head));
    }

    fn bytes_of(v: CacheValue) -> Bytes {
        match v {
            CacheValue::Bytes(b) => b,
            _ => panic!("not bytes"),
        }
    }

    #[tokio::test]
    async fn concurrent_misses_share_one_fetch() {
        let cache = MediaCache::new(1 << 20, CacheMetrics::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let mut waiters = Vec::new();
        for _ in 0..8 {
            let (cache, calls) = (cache.clone(), calls.clone());
            waiters.push(tokio::spawn(async move {
                cache
                    .get_or_fetch(key("a"), move || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok((
                            CacheValue::Bytes(Bytes::from_static(b"x")),
                            Duration::from_secs(5),
                        ))
                    })
                    .await
            }));
        }
        for w in waiters {
            assert_eq!(bytes_of(w.await.unwrap().unwrap()), "x");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(cache.holds(&key("a")));
    }

    #[tokio::test]
    async fn bounded_lru_and_ttl() {
        let cache = MediaCache::new(4 * 1024, CacheMetrics::default());
        let put = |name: &'static str, ttl_ms: u64| {
            let cache = cache.clone();
            async move {
                cache
                    .get_or_fetch(key(name), move || async move {
                        let value = CacheValue::Bytes(Bytes::from(vec![0u8; 800]));
                        Ok((value, Duration::from_millis(ttl_ms)))
                    })
                    .await
                    .unwrap();
            }
        };
        for name in ["a", "b", "c", "d"] {
            put(name, 60_000).await;
        }
        // "a" is used again, so "b" is the least recently used when "e" needs room.
        assert!(cache.holds(&key("a")));
        put("e", 60_000).await;
        assert!(cache.bytes() <= 4 * 1024);
        assert!(cache.holds(&key("a")) && !cache.holds(&key("b")));
        put("short", 30).await;
        assert!(cache.holds(&key("short")));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(!cache.holds(&key("short")));
    }

    #[tokio::test]
    async fn failures_are_not_cached() {
        let cache = MediaCache::new(1 << 20, CacheMetrics::default());
        let r = cache
            .get_or_fetch(key("f"), || async { Err(ProxyError::internal("boom")) })
            .await;
        assert!(r.is_err());
        assert!(!cache.holds(&key("f")));
    }
}
