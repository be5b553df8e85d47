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
//! so a segment only finds lists registered for those very headers. Anyone may register a
//! playlist listing someone else's segment URL followed by a URL of their own: keyed by URL
//! alone, the victim's next segment request would send the victim's credentials there. Viewers
//! whose loads of one playlist key gave the same segments share one list, which holds a
//! fingerprint of each one's headers (32 bytes a viewer, not another copy of the list), so the
//! registry's byte budget holds a long VOD playlist for a thousand viewers with their own cookies.
//!
//! Fetches ahead run on their own, past the request that started them, so they are bounded for
//! the whole process ([`MAX_BACKGROUND`]) and skipped when no place is free; without the media
//! cache none start, since their bytes would have nowhere to go, nor with headers that send
//! fetches around it (a client's `h_range` or `h_if-*`).

use std::collections::{HashMap, VecDeque};
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

/// Bytes one remembered segment costs beyond its URL text (held twice: in its list and as a
/// key of the by-part index): its `Part` in the list, its by-part slot (a `Part` and a vector of
/// positions, with the table's spare room) and one position with its allocation.
const PART_OVERHEAD: usize = size_of::<Part>()
    + 2 * (size_of::<Part>() + size_of::<Vec<Position>>())
    + size_of::<Position>()
    + 64;

/// Bytes one list costs beyond its key text and its segments: the `List`, its slot, its entry in
/// the by-key index.
const LIST_OVERHEAD: usize = 2 * size_of::<List>() + 128;

/// Bytes one viewer's fingerprint costs in a list's set: 32, with room for the set's growth.
const PRINT_WEIGHT: usize = 2 * size_of::<Fingerprint>();

/// Most viewers (distinct upstream headers) one list is remembered for; past it the one that
/// registered least recently is forgotten (its segments no longer fetch ahead until it loads
/// the playlist again).
const MAX_PRINTS: usize = 1024;

/// What remembering `segments` under `key` costs, approximately, in bytes, before any viewer.
fn registry_weight(key: &str, segments: &[Part]) -> usize {
    let urls: usize = segments.iter().map(|p| 2 * p.url.as_str().len()).sum();
    key.len() + LIST_OVERHEAD + urls + segments.len() * PART_OVERHEAD
}

/// SHA-256 of a set of upstream headers (every name with every value, names sorted, each field
/// length-prefixed, as the media cache's request fingerprint): two viewers match only with the
/// very same headers.
type Fingerprint = [u8; 32];

fn fingerprint(headers: &HeaderMap) -> Fingerprint {
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

/// Which list a segment is in (its id), at which position.
type Position = (u64, usize);

/// A segment list as loaded under one playlist key, shared by every viewer whose load of that
/// key gave these very segments.
struct List {
    /// The playlist key, one allocation shared with the by-key index.
    key: Arc<str>,
    segments: Arc<[Part]>,
    /// Fingerprints of the headers of the viewers it was registered for, least recent first; each
    /// viewer is in at most one list of a key (the one its last load gave).
    prints: VecDeque<Fingerprint>,
    /// Registration tick: the least recently registered list goes first.
    tick: u64,
    /// What it costs: [`registry_weight`] plus [`PRINT_WEIGHT`] per fingerprint.
    weight: usize,
}

#[derive(Default)]
struct Playlists {
    lists: HashMap<u64, List>,
    /// The lists of each playlist key (usually one; more while viewers got different windows of
    /// a live playlist, or their own segment URLs).
    by_key: HashMap<Arc<str>, Vec<u64>>,
    /// Each segment, then where it sits in each list holding it.
    /// A list is there once per segment, at the segment's first position in it, however often
    /// the list repeats the URL (a slate, an ad played twice): one look per list, not one per
    /// repetition, when a segment is fetched or a list forgotten. In id order (a new list has the
    /// highest id).
    by_part: HashMap<Part, Vec<Position>>,
    tick: u64,
    next_id: u64,
    /// Sum of the weights held; at most the registry budget.
    bytes: usize,
    /// Positions looked at (by `next` and `forget`), for the tests' bounds on the work.
    #[cfg(test)]
    looks: std::cell::Cell<usize>,
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

    /// Remembers the segments of a media playlist just served under `key`, in playback order, for
    /// the viewer whose segment fetches carry exactly `headers` (the upstream headers its segment
    /// links carry). Viewers whose loads of `key` gave the same segments share one list, each
    /// adding only its fingerprint; a viewer's new load (a live playlist's next window) takes
    /// it off the list its previous load gave, which goes once no viewer is left on it.
    pub fn register_playlist_for(&self, key: &str, headers: &HeaderMap, segments: Vec<Part>) {
        if self.depth == 0 {
            return;
        }
        let print = fingerprint(headers);
        let mut lists = self.lock();
        let ids = lists.by_key.get(key).cloned().unwrap_or_default();
        let same = ids.iter().copied().find(|id| {
            lists
                .lists
                .get(id)
                .is_some_and(|l| l.segments[..] == segments[..])
        });
        for id in ids {
            if Some(id) != same {
                lists.drop_print(id, &print);
            }
        }
        lists.tick += 1;
        let tick = lists.tick;
        if let Some(id) = same {
            lists.add_print(id, print, tick);
            lists.shrink_to(self.budget);
            return;
        }
        let weight = registry_weight(key, &segments) + PRINT_WEIGHT;
        if weight > self.budget {
            // Prefetch is skipped for a playlist bigger than the whole registry.
            return;
        }
        lists.shrink_to(self.budget - weight);
        lists.insert(key, print, segments, tick, weight);
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
    /// registered for those same headers, in the background. `hosts`: `media.credential_hosts`.
    pub fn segment_fetched(
        self: &Arc<Self>,
        part: &Part,
        headers: &HeaderMap,
        hosts: &super::links::CredentialHosts,
    ) {
        // A segment the origin would not let the cache keep says its neighbours are the same:
        // fetched ahead, they would be thrown away and fetched again when the player asks.
        if self.depth == 0 || self.cache.passes(part, headers) {
            return;
        }
        let Some(next) = self.lock().next(part, &fingerprint(headers), self.depth) else {
            return;
        };
        // `headers` are those this segment's link carries: the viewer's credentials only if it is
        // on their `d`'s origin or a `credential_hosts` host. A segment after it on another origin
        // (an ad break, another CDN) gets them only on such a host (never `h_host`), over http
        // only if this one is http (so `d` was), never more than its own link carries.
        let scope = super::links::CredentialScope::new(&part.url, hosts.clone());
        let mut groups: Vec<(super::links::Reach, Vec<Part>)> = Vec::new();
        for p in next {
            let reach = scope.reach(&p.url);
            match groups.iter_mut().find(|(r, _)| *r == reach) {
                Some((_, parts)) => parts.push(p),
                None => groups.push((reach, vec![p])),
            }
        }
        for (reach, parts) in groups {
            let headers = super::links::scoped_headers(headers, reach);
            self.warm(parts, &headers);
        }
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
            // Cached, in flight, or marked to pass (its bytes could not be kept).
            if self.cache.holds(&part, headers) || self.cache.passes(&part, headers) {
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
    /// Up to `depth` segments after `part` in the most recently registered list holding it that
    /// was registered for `print`.
    fn next(&self, part: &Part, print: &Fingerprint, depth: usize) -> Option<Vec<Part>> {
        let (list, index) = self
            .by_part
            .get(part)?
            .iter()
            .filter_map(|&(id, index)| {
                #[cfg(test)]
                self.looks.set(self.looks.get() + 1);
                let list = self.lists.get(&id)?;
                list.prints.contains(print).then_some((list, index))
            })
            .max_by_key(|(list, _)| list.tick)?;
        Some(
            list.segments
                .iter()
                .skip(index + 1)
                .take(depth)
                .cloned()
                .collect(),
        )
    }

    /// A new list under `key` for one viewer; the caller made room for its `weight`.
    fn insert(
        &mut self,
        key: &str,
        print: Fingerprint,
        segments: Vec<Part>,
        tick: u64,
        weight: usize,
    ) {
        let id = self.next_id;
        self.next_id += 1;
        // One allocation of the key text, shared by every list of the key and the index.
        let key: Arc<str> = match self.by_key.get_key_value(key) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::from(key),
        };
        for (index, part) in segments.iter().enumerate() {
            let positions = self.by_part.entry(part.clone()).or_default();
            // The list is the newest there: a repeated segment already has its first position.
            if positions.last().is_none_or(|&(last, _)| last != id) {
                positions.push((id, index));
            }
        }
        self.by_key.entry(Arc::clone(&key)).or_default().push(id);
        self.bytes += weight;
        self.lists.insert(
            id,
            List {
                key,
                segments: segments.into(),
                prints: VecDeque::from([print]),
                tick,
                weight,
            },
        );
    }

    /// Puts `print` on list `id` as its most recent viewer, forgetting the least recent one past
    /// [`MAX_PRINTS`].
    fn add_print(&mut self, id: u64, print: Fingerprint, tick: u64) {
        let Some(list) = self.lists.get_mut(&id) else {
            return;
        };
        list.tick = tick;
        match list.prints.iter().position(|p| *p == print) {
            Some(i) => {
                list.prints.remove(i);
            }
            None => {
                list.weight += PRINT_WEIGHT;
                self.bytes += PRINT_WEIGHT;
            }
        }
        list.prints.push_back(print);
        if list.prints.len() > MAX_PRINTS {
            list.prints.pop_front();
            list.weight -= PRINT_WEIGHT;
            self.bytes -= PRINT_WEIGHT;
        }
    }

    /// Takes `print` off list `id`; the list goes with its last viewer.
    fn drop_print(&mut self, id: u64, print: &Fingerprint) {
        let Some(list) = self.lists.get_mut(&id) else {
            return;
        };
        let Some(i) = list.prints.iter().position(|p| p == print) else {
            return;
        };
        list.prints.remove(i);
        list.weight -= PRINT_WEIGHT;
        self.bytes -= PRINT_WEIGHT;
        if list.prints.is_empty() {
            self.forget(id);
        }
    }

    /// Forgets the least recently registered lists until at most `limit` bytes are held.
    fn shrink_to(&mut self, limit: usize) {
        while self.bytes > limit {
            let oldest = self
                .lists
                .iter()
                .min_by_key(|(_, list)| list.tick)
                .map(|(id, _)| *id);
            match oldest {
                Some(id) => self.forget(id),
                None => break,
            }
        }
    }

    fn forget(&mut self, id: u64) {
        let Some(list) = self.lists.remove(&id) else {
            return;
        };
        self.bytes -= list.weight;
        if let Some(ids) = self.by_key.get_mut(&list.key) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                self.by_key.remove(&list.key);
            }
        }
        for (index, part) in list.segments.iter().enumerate() {
            let Some(positions) = self.by_part.get_mut(part) else {
                continue;
            };
            // Positions are in list order (a new list has the highest id), one per list: the
            // list's is found by a binary search, and taken at the segment's first position
            // only (a repeat has nothing left to take).
            #[cfg(test)]
            self.looks.set(self.looks.get() + 1);
            match positions.binary_search_by_key(&id, |&(i, _)| i) {
                Ok(at) if positions[at].1 == index => {
                    positions.remove(at);
                }
                _ => continue,
            }
            if positions.is_empty() {
                self.by_part.remove(part);
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

    fn viewer(n: usize) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("cookie", format!("session={n}").parse().unwrap());
        h
    }

    #[tokio::test]
    async fn registry_is_bounded_in_bytes() {
        let none = HeaderMap::new();
        let one = registry_weight("a", &parts("a", 100)) + PRINT_WEIGHT;
        let p = prefetcher(one * 3 + one / 2);
        for name in ["a", "b", "c", "d"] {
            p.register_playlist_for(name, &none, parts(name, 100));
            assert!(p.registry_bytes() <= one * 3 + one / 2);
        }
        // The oldest playlist went first; the newest three are remembered.
        assert!(!p.knows(&parts("a", 1)[0]));
        for name in ["b", "c", "d"] {
            assert!(p.knows(&parts(name, 100)[99]), "{name}");
        }
        // Registering one again replaces it instead of counting it twice.
        let before = p.registry_bytes();
        p.register_playlist_for("d", &none, parts("d", 100));
        assert_eq!(p.registry_bytes(), before);
        // A playlist bigger than the whole budget is not remembered (prefetch skips it).
        p.register_playlist_for("huge", &none, parts("huge", 1000));
        assert!(!p.knows(&parts("huge", 1)[0]));
        assert!(p.registry_bytes() <= one * 3 + one / 2);
    }

    #[tokio::test]
    async fn a_segment_finds_only_the_playlist_registered_with_its_headers() {
        let p = prefetcher(1 << 20);
        let (a, b) = (viewer(1), viewer(2));
        let mine = parts("v", 3);
        let mut theirs = parts("e", 3);
        theirs[0] = mine[0].clone();
        p.register_playlist_for("v", &a, mine.clone());
        p.register_playlist_for("e", &b, theirs.clone());
        let lists = p.lock();
        let next = |h: &HeaderMap| lists.next(&mine[0], &fingerprint(h), 3);
        assert_eq!(next(&a), Some(mine[1..].to_vec()));
        assert_eq!(next(&b), Some(theirs[1..].to_vec()));
        assert_eq!(next(&HeaderMap::new()), None);
        drop(lists);
        // Forgetting one registration leaves the other's entry for the shared segment.
        p.register_playlist_for("e", &b, parts("x", 1));
        assert!(p.knows(&mine[0]));
        assert_eq!(p.lock().next(&mine[0], &fingerprint(&b), 3), None);
    }

    #[tokio::test]
    async fn viewers_of_one_playlist_share_its_list() {
        // A two-hour VOD of 4-second segments, loaded by viewers with their own cookies, in a
        // registry of about three such lists.
        let vod = parts("vod", 1800);
        let budget = 3 * registry_weight("vod", &vod) + (1 << 16);
        let p = prefetcher(budget);
        p.register_playlist_for("vod", &viewer(0), vod.clone());
        let first = p.registry_bytes();
        for n in 1..100 {
            p.register_playlist_for("vod", &viewer(n), vod.clone());
        }
        // Each viewer adds its fingerprint, not another copy of the list...
        let per_viewer = (p.registry_bytes() - first) / 99;
        assert!(per_viewer <= 64, "{per_viewer} bytes a viewer");
        // ...so the first is still remembered, and every viewer fetches ahead in it.
        for n in [0, 50, 99] {
            let next = p.lock().next(&vod[10], &fingerprint(&viewer(n)), 3);
            assert_eq!(next, Some(vod[11..14].to_vec()), "viewer {n}");
        }
        assert_eq!(p.lock().next(&vod[10], &fingerprint(&viewer(100)), 3), None);
        // A viewer loading again is not counted twice.
        let before = p.registry_bytes();
        p.register_playlist_for("vod", &viewer(7), vod.clone());
        assert_eq!(p.registry_bytes(), before);
        // The set is bounded: past MAX_PRINTS the least recent viewer is forgotten.
        for n in 100..MAX_PRINTS + 1 {
            p.register_playlist_for("vod", &viewer(n), vod.clone());
        }
        let lists = p.lock();
        assert_eq!(lists.lists.len(), 1);
        let list = lists.lists.values().next().unwrap();
        assert_eq!(list.prints.len(), MAX_PRINTS);
        assert_eq!(lists.next(&vod[10], &fingerprint(&viewer(0)), 3), None);
        assert!(lists.next(&vod[10], &fingerprint(&viewer(7)), 3).is_some());
        assert_eq!(
            lists.bytes,
            registry_weight("vod", &vod) + MAX_PRINTS * PRINT_WEIGHT
        );
    }

    #[tokio::test]
    async fn a_viewers_new_window_leaves_its_old_list() {
        let p = prefetcher(1 << 20);
        let (a, b) = (viewer(1), viewer(2));
        let all = parts("live", 5);
        let (old, new) = (all[..4].to_vec(), all[1..].to_vec());
        p.register_playlist_for("live", &a, old.clone());
        p.register_playlist_for("live", &b, old.clone());
        p.register_playlist_for("live", &a, new.clone());
        // Each viewer fetches ahead in the window it loaded last.
        assert_eq!(
            p.lock().next(&all[1], &fingerprint(&a), 3),
            Some(all[2..5].to_vec())
        );
        assert_eq!(
            p.lock().next(&all[1], &fingerprint(&b), 3),
            Some(all[2..4].to_vec())
        );
        // Once the last viewer of the old window moves on, it is forgotten.
        p.register_playlist_for("live", &b, new.clone());
        assert!(!p.knows(&all[0]));
        assert_eq!(
            p.registry_bytes(),
            registry_weight("live", &new) + 2 * PRINT_WEIGHT
        );
    }

    #[tokio::test]
    async fn a_repeated_segment_costs_one_look_per_list() {
        // Two playlists repeating one slate 5,000 times, then a segment of their own.
        const N: usize = 5000;
        let slate = Part {
            url: url::Url::parse("http://o/slate.ts").unwrap(),
            range: None,
        };
        let list = |name: &str| {
            let mut v = vec![slate.clone(); N];
            v.extend(parts(name, 1));
            v
        };
        let p = prefetcher(64 << 20);
        let (a, b) = (viewer(1), viewer(2));
        p.register_playlist_for("a", &a, list("a"));
        p.register_playlist_for("b", &b, list("b"));
        let lists = p.lock();
        assert_eq!(lists.by_part[&slate].len(), 2);
        // The slate's fetch looks at each list once, and fetches ahead from its first position.
        lists.looks.set(0);
        let next = lists.next(&slate, &fingerprint(&a), 3);
        assert_eq!(next, Some(vec![slate.clone(); 3]));
        assert!(lists.looks.get() <= 2, "{} looks", lists.looks.get());
        drop(lists);
        // Forgetting one list looks at each of its segments once, not at every repetition of
        // the slate in both lists for each of its own (5,000 x 10,000).
        p.lock().looks.set(0);
        p.register_playlist_for("a", &a, parts("a2", 1));
        let lists = p.lock();
        assert!(lists.looks.get() <= N + 1, "{} looks", lists.looks.get());
        assert_eq!(lists.by_part[&slate].len(), 1);
        assert_eq!(
            lists.next(&parts("b", 1)[0], &fingerprint(&b), 3),
            Some(vec![])
        );
        assert!(lists.next(&slate, &fingerprint(&b), 3).is_some());
        drop(lists);
        p.register_playlist_for("b", &b, parts("b2", 1));
        assert!(!p.knows(&slate));
    }

    #[tokio::test]
    async fn a_long_key_is_held_and_counted_once() {
        // A ~60 KB playlist key (a `d=` URL) with ~25,000 short segment URLs.
        let key = format!("http://o/{}", "k".repeat(60_000));
        let segments: Vec<Part> = (0..24_900)
            .map(|i| Part {
                url: url::Url::parse(&format!("http://o/{i}")).unwrap(),
                range: None,
            })
            .collect();
        let p = prefetcher(64 << 20);
        p.register_playlist_for(&key, &viewer(1), segments.clone());
        p.register_playlist_for(&key, &viewer(2), segments.clone());
        let lists = p.lock();
        // One allocation of the key, shared by its list and the by-key index; the segments'
        // positions name the list by number.
        let list = lists.lists.values().next().unwrap();
        assert_eq!(lists.lists.len(), 1);
        assert_eq!(Arc::strong_count(&list.key), 2);
        let (indexed, _) = lists.by_key.get_key_value(key.as_str()).unwrap();
        assert!(Arc::ptr_eq(indexed, &list.key));
        // The weight counts the key once, and covers the key and URL bytes held.
        let weight = registry_weight(&key, &segments) + 2 * PRINT_WEIGHT;
        assert_eq!(lists.bytes, weight);
        let urls: usize = segments.iter().map(|s| s.url.as_str().len()).sum();
        assert!(key.len() + 2 * urls < weight);
        assert!(weight < key.len() + 2 * urls + segments.len() * PART_OVERHEAD + 4096);
    }
}
