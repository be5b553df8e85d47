//! Segment fetching through the media cache (the slice cache service), and prefetch: when a player fetches segment n of a
//! playlist we served, segments n+1..=n+N are fetched into the cache with the same upstream headers.
//!
//! The hooks are format-neutral, so the DASH and HLS segment endpoints use them alike:
//! 1. the media-playlist endpoint calls [`Prefetcher::register_playlist_for`] with the upstream
//!    headers its segments will be fetched with and the playlist's segments in order (URL and byte
//!    range each);
//! 2. the segment endpoint gets its bytes with [`Prefetcher::get_or_fetch`] (a cache hit, a join of
//!    the fetch already in flight, prefetch's included, or a new fetch) and then calls
//!    [`Prefetcher::segment_fetched`], which looks the segment up in the registered playlists and
//!    starts fetching the next ones that are neither cached nor in flight.
//!
//! Fetches ahead carry the triggering viewer's upstream headers (`h_authorization`, `h_cookie`...),
//! so a segment only finds playlists registered with those very headers (a fingerprint of them is
//! part of the registry's keys). Anyone may register a playlist listing someone else's segment URL
//! followed by a URL of their own: keyed by URL alone, the victim's next segment request would
//! send the victim's credentials there. A playlist registered without headers
//! ([`Prefetcher::register_playlist`]) is matched by any viewer, so only its entries on the
//! triggering segment's own origin are fetched ahead: those already receive the viewer's headers.
//!
//! Fetches ahead run on their own, past the request that started them, so they are bounded for
//! the whole process ([`MAX_BACKGROUND`]) and skipped when no place is free; without the media
//! cache none start, since their bytes would have nowhere to go, nor with headers that send
//! fetches around it (a client's `h_range` or `h_if-*`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::atomic::Counter;
use bytes::Bytes;
use http::HeaderMap;
use prometheus_client::registry::Registry;
use sluice_media::dash::proxy::Part;

use super::cache::{CacheKind, MediaCache};
use crate::error::ProxyError;

/// Most prefetch and prebuffer fetches running at once, for every client together; past it a
/// fetch ahead is skipped (the player fetches that segment itself when it gets there). A live
/// channel in steady state has about one segment in flight ahead per segment duration, and a
/// player starting needs `prebuffer_segments` (3 by default): 64 covers dozens of channels, and
/// bounds the bytes held by fetches nobody waits for to 64 × `media.max_segment_bytes` (a few
/// hundred MB with real segments of a few MB).
pub const MAX_BACKGROUND: usize = 64;

/// Bytes one remembered segment costs beyond its URL text: the `Url` itself, its copy in the
/// by-part index, and map slots.
const PART_OVERHEAD: usize = 256;

/// What remembering `segments` under `key` costs, approximately, in bytes.
fn registry_weight(key: &str, segments: &[Part]) -> usize {
    let urls: usize = segments.iter().map(|p| 2 * p.url.as_str().len()).sum();
    key.len() + size_of::<Fingerprint>() + urls + segments.len() * PART_OVERHEAD
}

/// SHA-256 of a set of upstream headers (every name with every value, names sorted, each field
/// length-prefixed, as the media cache's request fingerprint): two viewers match only with the
/// very same headers. `None`: registered without headers (matched by anyone, same origin only).
type Fingerprint = Option<[u8; 32]>;

fn fingerprint(headers: &HeaderMap) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    let mut names: Vec<&http::HeaderName> = headers.keys().collect();
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    for name in names {
        for value in headers.get_all(name) {
            field(name.as_str().as_bytes());
            field(value.as_bytes());
        }
    }
    h.finalize().into()
}

/// A registered playlist: its key and the headers it was registered with.
type ListKey = (String, Fingerprint);

/// Where a segment sits: which playlist, which position.
#[derive(Debug, Clone)]
struct Position {
    playlist: ListKey,
    index: usize,
}

#[derive(Default)]
struct Playlists {
    /// Segments of each playlist, with the registration tick and the weight.
    by_key: HashMap<ListKey, (u64, Arc<[Part]>, usize)>,
    /// Each segment, then the headers its playlists were registered with, to the last of them.
    by_part: HashMap<Part, HashMap<Fingerprint, Position>>,
    tick: u64,
    /// Sum of the weights held; at most the registry budget.
    bytes: usize,
}

/// Fetches segments through the cache and fetches ahead of the player.
pub struct Prefetcher {
    cache: Arc<MediaCache>,
    /// Segments fetched ahead; 0 turns prefetch off.
    depth: usize,
    limit: usize,
    /// Bytes the remembered playlists may take; the least recently registered go first.
    budget: usize,
    playlists: Mutex<Playlists>,
    /// Places for fetches ahead, [`MAX_BACKGROUND`] in all.
    background: Arc<Semaphore>,
    started: Counter,
    skipped: Counter,
}

impl Prefetcher {
    pub fn new(
        cache: Arc<MediaCache>,
        depth: usize,
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
        let skipped = Counter::default();
        registry.register(
            "media_prefetches_skipped",
            "Segments not fetched ahead because MAX_BACKGROUND fetches ahead were running, or \
             because the request's own Range or conditional headers send its fetches around the cache",
            skipped.clone(),
        );
        Arc::new(Prefetcher {
            cache,
            depth,
            limit,
            budget,
            playlists: Mutex::new(Playlists::default()),
            background: Arc::new(Semaphore::new(MAX_BACKGROUND)),
            started,
            skipped,
        })
    }

    /// Remembers the segments of a media playlist just served, in playback order, for viewers whose
    /// segment fetches carry exactly `headers` (the upstream headers its segment links carry). A
    /// live playlist registered again under the same key and headers replaces its previous window.
    pub fn register_playlist_for(&self, key: &str, headers: &HeaderMap, segments: Vec<Part>) {
        self.register(key, Some(fingerprint(headers)), segments);
    }

    /// [`Self::register_playlist_for`] without the headers: any viewer's segment finds it, so only
    /// its entries on that segment's own origin are fetched ahead.
    pub fn register_playlist(&self, key: &str, segments: Vec<Part>) {
        self.register(key, None, segments);
    }

    fn register(&self, key: &str, print: Fingerprint, segments: Vec<Part>) {
        if self.depth == 0 {
            return;
        }
        let weight = registry_weight(key, &segments);
        let key: ListKey = (key.to_owned(), print);
        let mut lists = self.lock();
        lists.forget(&key);
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
                playlist: key.clone(),
                index,
            };
            lists
                .by_part
                .entry(part.clone())
                .or_default()
                .insert(print, position);
        }
        lists.tick += 1;
        let tick = lists.tick;
        lists.bytes += weight;
        lists.by_key.insert(key, (tick, segments.into(), weight));
    }

    /// Bytes the remembered playlists take now.
    pub fn registry_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// `true` when `part` is a segment of a playlist registered here, with any headers (worth
    /// caching whole; the cache keys what it holds by the fetch's headers too).
    pub fn knows(&self, part: &Part) -> bool {
        self.depth > 0 && self.lock().by_part.contains_key(part)
    }

    /// The bytes of one segment: from the cache, from a fetch in flight, or fetched now (and cached).
    pub async fn get_or_fetch(
        &self,
        part: &Part,
        headers: &HeaderMap,
    ) -> Result<Bytes, ProxyError> {
        let fetched = self
            .cache
            .fetch(CacheKind::Segment, part, headers, self.limit, None)
            .await?;
        Ok(fetched.bytes)
    }

    /// The player fetched `part` with `headers`: fetch the following segments of its playlist, as
    /// registered with those same headers, in the background. Failing that, a playlist registered
    /// without headers gives its following segments on `part`'s origin.
    pub fn segment_fetched(self: &Arc<Self>, part: &Part, headers: &HeaderMap) {
        if self.depth == 0 {
            return;
        }
        let next: Vec<Part> = {
            let lists = self.lock();
            let own = lists.next(part, Some(fingerprint(headers)), self.depth);
            match own {
                Some(next) => next,
                None => match lists.next(part, None, self.depth) {
                    Some(next) => next
                        .into_iter()
                        .filter(|p| p.url.origin() == part.url.origin())
                        .collect(),
                    None => return,
                },
            }
        };
        self.warm(next, headers);
    }

    /// Whether fetching ahead can help: only with the media cache, which keeps what is fetched.
    pub fn caches(&self) -> bool {
        self.cache.cache().is_some()
    }

    /// Fetches `parts` into the cache in the background, each unless cached or in flight already
    /// (the cache's coalescing makes a viewer that asks meanwhile join the fetch). Nothing is
    /// fetched without the cache, and the parts past the last free place are skipped. Nor is
    /// anything fetched with headers that bypass the cache (`h_range`, `h_if-*`): those fetches
    /// would go straight to the origin and their bytes be thrown away.
    pub fn warm(self: &Arc<Self>, parts: Vec<Part>, headers: &HeaderMap) {
        if !self.caches() {
            return;
        }
        if super::cache::bypasses(headers) {
            self.skipped.inc_by(parts.len() as u64);
            return;
        }
        for part in parts {
            if self.cache.holds(&part, headers) {
                continue;
            }
            let Ok(place) = Arc::clone(&self.background).try_acquire_owned() else {
                self.skipped.inc();
                continue;
            };
            self.started.inc();
            let this = Arc::clone(self);
            let headers = headers.clone();
            tokio::spawn(async move {
                let _place = place;
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
    /// Up to `depth` segments after `part` in its playlist registered with `print`.
    fn next(&self, part: &Part, print: Fingerprint, depth: usize) -> Option<Vec<Part>> {
        let position = self.by_part.get(part)?.get(&print)?;
        let (_, segments, _) = self.by_key.get(&position.playlist)?;
        Some(
            segments
                .iter()
                .skip(position.index + 1)
                .take(depth)
                .cloned()
                .collect(),
        )
    }

    fn forget(&mut self, key: &ListKey) {
        if let Some((_, segments, weight)) = self.by_key.remove(key) {
            self.bytes -= weight;
            for part in segments.iter() {
                let Some(prints) = self.by_part.get_mut(part) else {
                    continue;
                };
                if prints.get(&key.1).is_some_and(|p| &p.playlist == key) {
                    prints.remove(&key.1);
                    if prints.is_empty() {
                        self.by_part.remove(part);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::Upstream;

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
            Upstream::new(&crate::upstream::UpstreamConfig::default(), &mut registry).unwrap();
        let cache = MediaCache::new(
            None,
            upstream,
            &crate::media::MediaConfig::default(),
            &crate::cache::config::PolicyConfig::default(),
            Default::default(),
        );
        Prefetcher::new(cache, 3, 1 << 20, budget, &mut registry)
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

    #[tokio::test]
    async fn a_segment_finds_only_the_playlist_registered_with_its_headers() {
        let p = prefetcher(1 << 20);
        let mut a = HeaderMap::new();
        a.insert("authorization", "Bearer a".parse().unwrap());
        let mut b = HeaderMap::new();
        b.insert("authorization", "Bearer b".parse().unwrap());
        let mine = parts("v", 3);
        let mut theirs = parts("e", 3);
        theirs[0] = mine[0].clone();
        p.register_playlist_for("v", &a, mine.clone());
        p.register_playlist_for("e", &b, theirs.clone());
        let lists = p.lock();
        let next = |h: &HeaderMap| lists.next(&mine[0], Some(fingerprint(h)), 3);
        assert_eq!(next(&a), Some(mine[1..].to_vec()));
        assert_eq!(next(&b), Some(theirs[1..].to_vec()));
        assert_eq!(next(&HeaderMap::new()), None);
        drop(lists);
        // Forgetting one registration leaves the other's entry for the shared segment.
        p.register_playlist_for("e", &b, parts("x", 1));
        assert!(p.knows(&mine[0]));
        assert_eq!(p.lock().next(&mine[0], Some(fingerprint(&b)), 3), None);
    }
}
