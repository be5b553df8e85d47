//! Segment fetching through the media cache, and prefetch: when a player fetches segment n of a
//! playlist we served, segments n+1..=n+N are fetched into the cache with the same upstream headers.
//!
//! The hooks are format-neutral, so the DASH and HLS segment endpoints use them alike:
//! 1. the media-playlist endpoint calls [`Prefetcher::register_playlist`] with the playlist's segments
//!    in order (URL and byte range each);
//! 2. the segment endpoint gets its bytes with [`Prefetcher::get_or_fetch`] (a cache hit, a join of
//!    the fetch already in flight, prefetch's included, or a new fetch) and then calls
//!    [`Prefetcher::segment_fetched`], which looks the segment up in the registered playlists and
//!    starts fetching the next ones that are neither cached nor in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use sluice_media::dash::proxy::Part;

use super::cache::{CacheKey, CacheKind, CacheValue, MediaCache};
use crate::error::{ProxyError, Side};
use crate::upstream::{Upstream, UpstreamRequest};

/// Bytes one remembered segment costs beyond its URL text: the `Url` itself, its copy in the
/// by-part index, and map slots.
const PART_OVERHEAD: usize = 256;

/// What remembering `segments` under `key` costs, approximately, in bytes.
fn registry_weight(key: &str, segments: &[Part]) -> usize {
    let urls: usize = segments.iter().map(|p| 2 * p.url.as_str().len()).sum();
    key.len() + urls + segments.len() * PART_OVERHEAD
}

/// Where a segment sits: which playlist, which position.
#[derive(Debug, Clone)]
struct Position {
    playlist: String,
    index: usize,
}

#[derive(Default)]
struct Playlists {
    /// Segments of each playlist, with the registration tick and the weight.
    by_key: HashMap<String, (u64, Arc<[Part]>, usize)>,
    by_part: HashMap<Part, Position>,
    tick: u64,
    /// Sum of the weights held; at most the registry budget.
    bytes: usize,
}

/// Fetches segments through the cache and fetches ahead of the player.
pub struct Prefetcher {
    cache: Arc<MediaCache>,
    upstream: Upstream,
    /// Segments fetched ahead; 0 turns prefetch off.
    depth: usize,
    ttl: Duration,
    limit: usize,
    /// Bytes the remembered playlists may take; the least recently registered go first.
    budget: usize,
    playlists: Mutex<Playlists>,
    started: Counter,
}

impl Prefetcher {
    pub fn new(
        cache: Arc<MediaCache>,
        upstream: Upstream,
        depth: usize,
        ttl: Duration,
        limit: usize,
        budget: usize,
        registry: &mut Registry,
    ) -> Arc<Self> {
        let started = Counter::default();
        registry.register(
            "media_prefetches",
            "Segments fetched ahead of the player",
            started.clone(),
        );
        Arc::new(Prefetcher {
            cache,
            upstream,
            depth,
            ttl,
            limit,
            budget,
            playlists: Mutex::new(Playlists::default()),
            started,
        })
    }

    /// Remembers the segments of a media playlist just served, in playback order. A live playlist
    /// registered again under the same key replaces its previous window.
    pub fn register_playlist(&self, key: &str, segments: Vec<Part>) {
        if self.depth == 0 {
            return;
        }
        let weight = registry_weight(key, &segments);
        let mut lists = self.lock();
        lists.forget(key);
        if weight > self.budget {
            // Prefetch is skipped for a playlist bigger than the whole registry.
            return;
        }
        while lists.bytes + weight > self.budget {
            let oldest = lists
                .by_key
                .iter()
                .min_by_key(|(_, (tick, _, _))| *tick)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(oldest) => lists.forget(&oldest),
                None => break,
            }
        }
        for (index, part) in segments.iter().enumerate() {
            let position = Position {
                playlist: key.to_owned(),
                index,
            };
            lists.by_part.insert(part.clone(), position);
        }
        lists.tick += 1;
        let tick = lists.tick;
        lists.bytes += weight;
        lists
            .by_key
            .insert(key.to_owned(), (tick, segments.into(), weight));
    }

    /// Bytes the remembered playlists take now.
    pub fn registry_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// `true` when `part` is a segment of a playlist registered here (worth caching whole).
    pub fn knows(&self, part: &Part) -> bool {
        self.depth > 0 && self.lock().by_part.contains_key(part)
    }

    /// The bytes of one segment: from the cache, from a fetch in flight, or fetched now (and cached).
    pub async fn get_or_fetch(
        &self,
        part: &Part,
        headers: &HeaderMap,
    ) -> Result<Bytes, ProxyError> {
        let key = part_key(CacheKind::Segment, part, headers);
        let fetch = fetch_part(
            self.upstream.clone(),
            part.clone(),
            headers.clone(),
            self.limit,
        );
        let ttl = self.ttl;
        match self
            .cache
            .get_or_fetch(key, move || async move {
                let fetched = fetch.await?;
                let ttl = fetched.ttl(ttl);
                Ok((CacheValue::Bytes(fetched.bytes), ttl))
            })
            .await?
        {
            CacheValue::Bytes(bytes) => Ok(bytes),
            _ => Err(ProxyError::internal(
                "segment cache entry of the wrong kind",
            )),
        }
    }

    /// The player fetched `part`: fetch the following segments of its playlist in the background.
    pub fn segment_fetched(self: &Arc<Self>, part: &Part, headers: &HeaderMap) {
        if self.depth == 0 {
            return;
        }
        let next: Vec<Part> = {
            let lists = self.lock();
            let Some(position) = lists.by_part.get(part) else {
                return;
            };
            let Some((_, segments, _)) = lists.by_key.get(&position.playlist) else {
                return;
            };
            segments
                .iter()
                .skip(position.index + 1)
                .take(self.depth)
                .cloned()
                .collect()
        };
        for part in next {
            let key = part_key(CacheKind::Segment, &part, headers);
            if self.cache.holds(&key) {
                continue;
            }
            self.started.inc();
            let this = Arc::clone(self);
            let headers = headers.clone();
            tokio::spawn(async move {
                if let Err(e) = this.get_or_fetch(&part, &headers).await {
                    tracing::debug!(error = %e.message, "prefetch failed");
                }
            });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Playlists> {
        self.playlists.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Playlists {
    fn forget(&mut self, key: &str) {
        if let Some((_, segments, weight)) = self.by_key.remove(key) {
            self.bytes -= weight;
            for part in segments.iter() {
                if self.by_part.get(part).is_some_and(|p| p.playlist == key) {
                    self.by_part.remove(part);
                }
            }
        }
    }
}

/// The upstream request for one object: GET with `headers`, plus `Range` for a byte range.
pub fn part_request(part: &Part, headers: &HeaderMap) -> UpstreamRequest {
    let mut headers = headers.clone();
    if let Some((a, b)) = part.range {
        headers.insert(header::RANGE, HeaderValue::from(RangeValue(a, b)));
    }
    UpstreamRequest {
        method: http::Method::GET,
        url: part.url.clone(),
        headers,
    }
}

/// `bytes=a-b` as a header value (digits only, so always valid).
struct RangeValue(u64, u64);

impl From<RangeValue> for HeaderValue {
    fn from(r: RangeValue) -> Self {
        HeaderValue::from_str(&format!("bytes={}-{}", r.0, r.1))
            .unwrap_or_else(|_| HeaderValue::from_static("bytes=0-"))
    }
}

/// The cache key of `part` fetched with `headers`: the key of the exact request [`fetch_part`] sends.
pub fn part_key(kind: CacheKind, part: &Part, headers: &HeaderMap) -> CacheKey {
    CacheKey::for_request(kind, &part_request(part, headers))
}

/// One object fetched whole, and whether it may be shared through the cache.
pub struct Fetched {
    pub bytes: Bytes,
    /// A complete answer to exactly what was asked: 200 for the whole object (no `Range` in the
    /// request), or exactly the byte range asked for; and not marked `no-store` or `private`.
    pub storable: bool,
}

impl Fetched {
    /// `ttl` when the object may be cached, zero (not stored) otherwise.
    pub fn ttl(&self, ttl: Duration) -> Duration {
        if self.storable {
            ttl
        } else {
            Duration::ZERO
        }
    }
}

/// `true` unless `Cache-Control` forbids a shared cache to keep the response.
pub fn shareable(headers: &HeaderMap) -> bool {
    !headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|d| {
            d.trim()
                .split('=')
                .next()
                .unwrap_or("")
                .to_ascii_lowercase()
        })
        .any(|d| d == "no-store" || d == "private")
}

/// `Content-Range: bytes a-b/len` naming exactly `a`..=`b`.
fn content_range_is(headers: &HeaderMap, a: u64, b: u64) -> bool {
    let Some(v) = headers
        .get(header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some(spec) = v.trim().strip_prefix("bytes ") else {
        return false;
    };
    let range = spec.split('/').next().unwrap_or("");
    range == format!("{a}-{b}")
}

/// Fetches one object whole: GET with `headers` plus `Range` for a byte range, at most `limit`
/// bytes. A non-2xx answer becomes an error with the upstream's status, so players see the 404 or
/// 403 the origin gave. A server that ignores `Range` is answered from the slice asked for.
pub async fn fetch_part(
    upstream: Upstream,
    part: Part,
    headers: HeaderMap,
    limit: usize,
) -> Result<Fetched, ProxyError> {
    let req = part_request(&part, &headers);
    let asked_range = req.headers.contains_key(header::RANGE);
    let host = part.url.host_str().unwrap_or("").to_owned();
    let resp = upstream
        .send(req)
        .await
        .map_err(|e| ProxyError::from_upstream(&e))?;
    if !resp.status.is_success() {
        return Err(ProxyError::upstream_status(
            resp.status,
            &host,
            "a media object",
        ));
    }
    let partial = resp.status == StatusCode::PARTIAL_CONTENT;
    let mut storable = shareable(&resp.headers);
    match part.range {
        None => storable &= resp.status == StatusCode::OK && !asked_range,
        Some((a, b)) if partial => storable &= content_range_is(&resp.headers, a, b),
        Some(_) => storable &= resp.status == StatusCode::OK,
    }
    let body = resp.body.collect_limited(limit).await.map_err(|e| {
        let mut err = ProxyError::new(
            Side::Upstream,
            StatusCode::BAD_GATEWAY,
            "upstream_body",
            e.to_string(),
        );
        err.upstream = Some(host.clone());
        err
    })?;
    let bytes = match part.range {
        Some((a, b)) if !partial => {
            let end = (b as usize).saturating_add(1).min(body.len());
            let start = (a as usize).min(end);
            // A 200 shorter than the range asked for is not the object the key names.
            storable &= end == (b as usize).saturating_add(1);
            body.slice(start..end)
        }
        Some((a, b)) => {
            storable &= body.len() as u64 == b.saturating_sub(a) + 1;
            body
        }
        None => body,
    };
    Ok(Fetched { bytes, storable })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::cache::CacheMetrics;

    fn parts(playlist: &str, n: usize) -> Vec<Part> {
        (0..n)
            .map(|i| Part {
                url: url::Url::parse(&format!("http://o/{playlist}/seg{i}.ts")).unwrap(),
                range: None,
            })
            .collect()
    }

    fn prefetcher(budget: usize) -> Arc<Prefetcher> {
        let mut registry = Registry::default();
        let upstream =
            Upstream::new(&crate::config::UpstreamConfig::default(), &mut registry).unwrap();
        let cache = MediaCache::new(1 << 20, CacheMetrics::default());
        Prefetcher::new(
            cache,
            upstream,
            3,
            Duration::from_secs(5),
            1 << 20,
            budget,
            &mut registry,
        )
    }

    #[tokio::test]
    async fn registry_is_bounded_in_bytes() {
        let one = registry_weight("a", &parts("a", 100));
        let p = prefetcher(one * 3 + one / 2);
        for name in ["a", "b", "c", "d"] {
            p.register_playlist(name, parts(name, 100));
            assert!(p.registry_bytes() <= one * 3 + one / 2);
        }
        // The oldest playlist went first; the newest three are remembered.
        assert!(!p.knows(&parts("a", 1)[0]));
        for name in ["b", "c", "d"] {
            assert!(p.knows(&parts(name, 100)[99]), "{name}");
        }
        // Registering one again replaces it instead of counting it twice.
        let before = p.registry_bytes();
        p.register_playlist("d", parts("d", 100));
        assert_eq!(p.registry_bytes(), before);
        // A playlist bigger than the whole budget is not remembered (prefetch skips it).
        p.register_playlist("huge", parts("huge", 1000));
        assert!(!p.knows(&parts("huge", 1)[0]));
        assert!(p.registry_bytes() <= one * 3 + one / 2);
    }

    #[test]
    fn part_request_adds_range_and_keys_follow_it() {
        let part = Part {
            url: url::Url::parse("http://o/init.mp4").unwrap(),
            range: Some((0, 99)),
        };
        let req = part_request(&part, &HeaderMap::new());
        assert_eq!(req.headers[header::RANGE], "bytes=0-99");
        let other = Part {
            range: Some((0, 100)),
            ..part.clone()
        };
        let none = HeaderMap::new();
        assert_ne!(
            part_key(CacheKind::RawInit, &part, &none),
            part_key(CacheKind::RawInit, &other, &none)
        );
        let mut cookie = HeaderMap::new();
        cookie.insert(header::COOKIE, HeaderValue::from_static("u=a"));
        assert_ne!(
            part_key(CacheKind::RawInit, &part, &none),
            part_key(CacheKind::RawInit, &part, &cookie)
        );
    }

    #[test]
    fn cache_control_private_or_no_store_is_not_shareable() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static(v));
            h
        };
        assert!(shareable(&HeaderMap::new()));
        assert!(shareable(&with("public, max-age=60")));
        assert!(!shareable(&with("private, max-age=60")));
        assert!(!shareable(&with("max-age=0, No-Store")));
    }
}
