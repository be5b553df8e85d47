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

/// Playlists remembered at once; the least recently registered is forgotten first.
const MAX_PLAYLISTS: usize = 256;

/// Where a segment sits: which playlist, which position.
#[derive(Debug, Clone)]
struct Position {
    playlist: String,
    index: usize,
}

#[derive(Default)]
struct Playlists {
    /// Segments of each playlist, with the registration tick.
    by_key: HashMap<String, (u64, Arc<[Part]>)>,
    by_part: HashMap<Part, Position>,
    tick: u64,
}

/// Fetches segments through the cache and fetches ahead of the player.
pub struct Prefetcher {
    cache: Arc<MediaCache>,
    upstream: Upstream,
    /// Segments fetched ahead; 0 turns prefetch off.
    depth: usize,
    ttl: Duration,
    limit: usize,
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
        let mut lists = self.lock();
        lists.forget(key);
        if lists.by_key.len() >= MAX_PLAYLISTS {
            let oldest = lists
                .by_key
                .iter()
                .min_by_key(|(_, (tick, _))| *tick)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                lists.forget(&oldest);
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
        lists.by_key.insert(key.to_owned(), (tick, segments.into()));
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
        let key = CacheKey::new(CacheKind::Segment, &part.url, part.range);
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
                Ok((CacheValue::Bytes(fetch.await?), ttl))
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
            let Some((_, segments)) = lists.by_key.get(&position.playlist) else {
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
            let key = CacheKey::new(CacheKind::Segment, &part.url, part.range);
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
        if let Some((_, segments)) = self.by_key.remove(key) {
            for part in segments.iter() {
                if self.by_part.get(part).is_some_and(|p| p.playlist == key) {
                    self.by_part.remove(part);
                }
            }
        }
    }
}

/// Fetches one object whole: GET with `headers` plus `Range` for a byte range, at most `limit`
/// bytes. A non-2xx answer becomes an error with the upstream's status, so players see the 404 or
/// 403 the origin gave. A server that ignores `Range` is answered from the slice asked for.
pub async fn fetch_part(
    upstream: Upstream,
    part: Part,
    mut headers: HeaderMap,
    limit: usize,
) -> Result<Bytes, ProxyError> {
    if let Some((a, b)) = part.range {
        let value = HeaderValue::from_str(&format!("bytes={a}-{b}"))
            .map_err(|e| ProxyError::internal(e.to_string()))?;
        headers.insert(header::RANGE, value);
    }
    let host = part.url.host_str().unwrap_or("").to_owned();
    let req = UpstreamRequest {
        method: http::Method::GET,
        url: part.url.clone(),
        headers,
    };
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
    match part.range {
        Some((a, b)) if !partial => {
            let end = (b as usize).saturating_add(1).min(body.len());
            let start = (a as usize).min(end);
            Ok(body.slice(start..end))
        }
        _ => Ok(body),
    }
}
