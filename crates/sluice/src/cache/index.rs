//! The object index: primary key → the `Vary` names of its responses → one object per variant,
//! plus hit-for-pass memos. Bounded by object count (oldest inserted goes first) and by variants
//! per key ([`MAX_VARIANTS`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::header::{HeaderMap, HeaderName};
use sluice_http::freshness::variant_key;

use super::object::{ObjectId, ObjectMeta};

/// What the index knows about a request.
pub enum Lookup {
    Hit(Arc<ObjectMeta>),
    /// The URL is stored, not for this request's variant; `vary` names the headers that matter.
    VaryMiss {
        vary: Vec<HeaderName>,
    },
    UriMiss,
    /// A recent answer for this URL was uncacheable: go straight to the origin.
    Pass,
}

/// Variants one primary key may hold. A response that varies on a field each client sets at will
/// (`Origin`, `User-Agent`) would otherwise let one client fill the cache with one URL's
/// variants; past this the key's oldest variant goes.
pub const MAX_VARIANTS: usize = 64;

#[derive(Default)]
struct Primary {
    vary: Vec<HeaderName>,
    variants: HashMap<String, Arc<ObjectMeta>>,
    /// The keys of `variants`, oldest inserted first.
    order: VecDeque<String>,
    pass_until: Option<Instant>,
}

impl Primary {
    /// Drops every variant; returns them.
    fn drain(&mut self) -> impl Iterator<Item = Arc<ObjectMeta>> + '_ {
        self.order.clear();
        self.variants.drain().map(|(_, m)| m)
    }

    /// Drops the oldest variant other than `keep`, if there is one.
    fn pop_oldest(&mut self, keep: Option<&str>) -> Option<Arc<ObjectMeta>> {
        let i = self.order.iter().position(|v| Some(v.as_str()) != keep)?;
        let variant = self.order.remove(i)?;
        self.variants.remove(&variant)
    }

    /// `order` after variants went from `variants` (at most [`MAX_VARIANTS`] to look through).
    fn reorder(&mut self) {
        let variants = &self.variants;
        self.order.retain(|v| variants.contains_key(v));
    }
}

/// Which primary keys a purge looks at.
#[derive(Debug, Clone, Copy)]
pub enum Primaries<'a> {
    /// This one.
    Key(&'a str),
    /// Every one that starts with this (`""`: all).
    Prefix(&'a str),
}

/// Purges the variants of `p` (primary key `key`) that `matches` (see [`ObjectIndex::purge`]);
/// returns how many it dropped.
fn purge_variants(
    key: &str,
    p: &mut Primary,
    matches: &impl Fn(&str, &ObjectMeta) -> bool,
    soft: bool,
    out: &mut Vec<Arc<ObjectMeta>>,
) -> usize {
    let mut removed = 0;
    p.variants.retain(|_, m| {
        if !matches(key, m) {
            return true;
        }
        if soft {
            let mut stale = (**m).clone();
            stale.soft_purged = true;
            let stale = Arc::new(stale);
            out.push(stale.clone());
            *m = stale;
            true
        } else {
            out.push(m.clone());
            removed += 1;
            false
        }
    });
    if removed > 0 {
        p.reorder();
    }
    removed
}

#[derive(Default)]
struct Inner {
    primaries: HashMap<String, Primary>,
    order: VecDeque<String>,
    objects: usize,
}

/// The object index.
pub struct ObjectIndex {
    /// Shared with the disk tier's writer (`ObjectIndex::holder`).
    inner: Arc<Mutex<Inner>>,
    max_objects: usize,
}

impl ObjectIndex {
    pub fn new(max_objects: usize) -> ObjectIndex {
        ObjectIndex {
            inner: Arc::new(Mutex::new(Inner::default())),
            max_objects,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("object index")
    }

    /// Whether the index holds this version of the object (for the disk tier, which must not
    /// write the record of a version dropped since it was queued).
    pub fn holder(&self) -> impl Fn(&ObjectMeta) -> bool + Send + Sync + 'static {
        let inner = self.inner.clone();
        move |meta| {
            inner
                .lock()
                .expect("object index")
                .primaries
                .get(&meta.primary)
                .and_then(|p| p.variants.get(&meta.variant))
                .is_some_and(|m| m.id == meta.id && m.generation == meta.generation)
        }
    }

    pub fn lookup(&self, primary: &str, req: &HeaderMap, now: Instant) -> Lookup {
        let inner = self.lock();
        let Some(p) = inner.primaries.get(primary) else {
            return Lookup::UriMiss;
        };
        if matches!(p.pass_until, Some(t) if t > now) {
            return Lookup::Pass;
        }
        match p.variants.get(&variant_key(&p.vary, req)) {
            Some(meta) => Lookup::Hit(meta.clone()),
            None if p.variants.is_empty() => Lookup::UriMiss,
            None => Lookup::VaryMiss {
                vary: p.vary.clone(),
            },
        }
    }

    /// The current object with this id, if any.
    pub fn get(&self, primary: &str, id: ObjectId) -> Option<Arc<ObjectMeta>> {
        let inner = self.lock();
        inner
            .primaries
            .get(primary)?
            .variants
            .values()
            .find(|m| m.id == id)
            .cloned()
    }

    /// Stores or replaces an object; returns objects dropped to make room or replaced by a new
    /// version or `Vary` list (their slices must go too).
    pub fn insert(&self, meta: Arc<ObjectMeta>) -> Vec<Arc<ObjectMeta>> {
        let mut dropped = Vec::new();
        let mut inner = self.lock();
        let inner = &mut *inner;
        let is_new_primary = !inner.primaries.contains_key(&meta.primary);
        let p = inner.primaries.entry(meta.primary.clone()).or_default();
        p.pass_until = None;
        if p.vary != meta.vary {
            inner.objects -= p.variants.len();
            dropped.extend(p.drain());
            p.vary = meta.vary.clone();
        }
        match p.variants.insert(meta.variant.clone(), meta.clone()) {
            Some(old) if old.generation != meta.generation => dropped.push(old),
            Some(_) => {}
            None => {
                inner.objects += 1;
                p.order.push_back(meta.variant.clone());
                if p.variants.len() > MAX_VARIANTS {
                    if let Some(old) = p.pop_oldest(Some(&meta.variant)) {
                        inner.objects -= 1;
                        dropped.push(old);
                    }
                }
            }
        }
        if is_new_primary {
            inner.order.push_back(meta.primary.clone());
        }
        self.evict(inner, (&meta.primary, Some(&meta.variant)), &mut dropped);
        dropped
    }

    /// Drops the oldest primaries while over the bound (objects, or keys held only by a memo).
    /// `keep` (the key and variant just stored, or a memo's key) stays: when its key is the
    /// oldest, its other variants go first, oldest first (else one URL with a new variant at
    /// each request would grow past the bound while everything else went), then the next oldest
    /// key.
    fn evict(
        &self,
        inner: &mut Inner,
        (keep, variant): (&str, Option<&str>),
        dropped: &mut Vec<Arc<ObjectMeta>>,
    ) {
        while inner.objects > self.max_objects || inner.primaries.len() > self.max_objects {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if oldest == keep {
                let popped = match inner.primaries.get_mut(keep) {
                    Some(p) if inner.objects > self.max_objects => p.pop_oldest(variant),
                    _ => None,
                };
                inner.order.push_front(oldest);
                match popped {
                    Some(old) => {
                        inner.objects -= 1;
                        dropped.push(old);
                        continue;
                    }
                    // Nothing of it can go: the next oldest key does, if there is one.
                    None if inner.order.len() > 1 => {
                        let Some(next) = inner.order.remove(1) else {
                            break;
                        };
                        if let Some(p) = inner.primaries.remove(&next) {
                            inner.objects -= p.variants.len();
                            dropped.extend(p.variants.into_values());
                        }
                        continue;
                    }
                    None => break,
                }
            }
            if let Some(p) = inner.primaries.remove(&oldest) {
                inner.objects -= p.variants.len();
                dropped.extend(p.variants.into_values());
            }
        }
    }

    /// Replaces an object's record if it is still the same version (after a 304 or a length update).
    pub fn update(&self, meta: Arc<ObjectMeta>) -> bool {
        let mut inner = self.lock();
        let Some(p) = inner.primaries.get_mut(&meta.primary) else {
            return false;
        };
        match p.variants.get_mut(&meta.variant) {
            Some(slot) if slot.generation == meta.generation => {
                *slot = meta;
                true
            }
            _ => false,
        }
    }

    /// Drops one version of an object (a version change or a vanished origin object); a newer
    /// version stored meanwhile stays.
    pub fn remove_object(&self, primary: &str, id: ObjectId, generation: u64) -> bool {
        let mut inner = self.lock();
        let Some(p) = inner.primaries.get_mut(primary) else {
            return false;
        };
        let before = p.variants.len();
        p.variants
            .retain(|_, m| m.id != id || m.generation != generation);
        let removed = before - p.variants.len();
        if removed > 0 {
            p.reorder();
        }
        inner.objects -= removed;
        removed > 0
    }

    /// Keeps `primary` out of the cache path until `until` (hit-for-pass).
    /// Returns the objects it replaces.
    pub fn mark_pass(&self, primary: &str, until: Instant) -> Vec<Arc<ObjectMeta>> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        if !inner.primaries.contains_key(primary) {
            inner.order.push_back(primary.to_string());
        }
        let p = inner.primaries.entry(primary.to_string()).or_default();
        inner.objects -= p.variants.len();
        let mut dropped: Vec<Arc<ObjectMeta>> = p.drain().collect();
        p.pass_until = Some(until);
        self.evict(inner, (primary, None), &mut dropped);
        dropped
    }

    /// Purges the objects of the primary keys `which` names that `matches`; hard purges drop
    /// them, soft purges mark them stale. Returns the records affected (dropped or updated).
    /// One key is looked up, not searched for: the lock is held for its variants alone.
    pub fn purge(
        &self,
        which: Primaries<'_>,
        matches: impl Fn(&str, &ObjectMeta) -> bool,
        soft: bool,
    ) -> Vec<Arc<ObjectMeta>> {
        let mut out = Vec::new();
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut removed = 0;
        match which {
            Primaries::Key(key) => {
                if let Some(p) = inner.primaries.get_mut(key) {
                    removed += purge_variants(key, p, &matches, soft, &mut out);
                }
            }
            Primaries::Prefix(prefix) => {
                for (key, p) in inner.primaries.iter_mut() {
                    if key.starts_with(prefix) {
                        removed += purge_variants(key, p, &matches, soft, &mut out);
                    }
                }
            }
        }
        inner.objects -= removed;
        out
    }

    pub fn len(&self) -> usize {
        self.lock().objects
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http::{HeaderValue, StatusCode};
    use sluice_http::freshness::{AgeClock, Freshness};
    use std::time::{Duration, SystemTime};

    /// A fresh object record for tests.
    pub(crate) fn meta(
        primary: &str,
        vary: Vec<HeaderName>,
        variant: &str,
        generation: u64,
    ) -> Arc<ObjectMeta> {
        Arc::new(ObjectMeta {
            id: ObjectId::new(primary, variant),
            primary: primary.into(),
            variant: variant.into(),
            generation,
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            length: Some(1),
            freshness: Freshness {
                lifetime: 60,
                stale_while_revalidate: 0,
                stale_if_error: 0,
                must_revalidate: false,
                no_cache: false,
                targeted: false,
            },
            clock: AgeClock {
                initial_age: 0,
                response_time: SystemTime::now(),
            },
            tags: Vec::new(),
            vary,
            soft_purged: false,
            range_capable: true,
            wire: Default::default(),
        })
    }

    #[test]
    fn variants_versions_memos_and_the_bound() {
        let idx = ObjectIndex::new(2);
        let now = Instant::now();
        let ae = http::header::ACCEPT_ENCODING;
        let mut gzip = HeaderMap::new();
        gzip.insert(&ae, HeaderValue::from_static("gzip"));
        let v = variant_key(std::slice::from_ref(&ae), &gzip);
        assert!(idx.insert(meta("a", vec![ae.clone()], &v, 1)).is_empty());
        assert!(matches!(idx.lookup("a", &gzip, now), Lookup::Hit(_)));
        assert!(matches!(
            idx.lookup("a", &HeaderMap::new(), now),
            Lookup::VaryMiss { .. }
        ));
        // A new version replaces the old one, which is handed back to be dropped.
        let dropped = idx.insert(meta("a", vec![ae.clone()], &v, 3));
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].generation, 1);
        // The old version dropped late (a revalidation or a warm fill that saw it change) leaves
        // the new one in place.
        let id = ObjectId::new("a", &v);
        assert!(!idx.remove_object("a", id, 1));
        assert!(matches!(idx.lookup("a", &gzip, now), Lookup::Hit(m) if m.generation == 3));
        // Hit-for-pass until it expires.
        idx.mark_pass("b", now + Duration::from_secs(5));
        assert!(matches!(
            idx.lookup("b", &HeaderMap::new(), now),
            Lookup::Pass
        ));
        assert!(matches!(
            idx.lookup("b", &HeaderMap::new(), now + Duration::from_secs(6)),
            Lookup::UriMiss
        ));
        // Over the bound, the oldest key goes.
        let mut dropped = idx.insert(meta("c", vec![], "", 5));
        dropped.extend(idx.insert(meta("d", vec![], "", 7)));
        assert!(idx.len() <= 2);
        assert!(matches!(idx.lookup("a", &gzip, now), Lookup::UriMiss));
        assert!(matches!(
            idx.lookup("d", &HeaderMap::new(), now),
            Lookup::Hit(_)
        ));
        assert!(dropped.iter().any(|m| m.primary == "a"));
    }

    /// Finding: with `Vary: Origin`, one client made a new variant of one URL per request; past
    /// `max_objects` every other URL went, then each insert stopped at the URL itself, and the
    /// index grew without bound. Now a URL holds at most `MAX_VARIANTS`, the bound holds, and
    /// what goes is handed back (its slices must go too).
    #[test]
    fn one_url_cannot_grow_past_the_bounds() {
        let idx = ObjectIndex::new(100);
        let origin = HeaderName::from_static("origin");
        let mut dropped = Vec::new();
        for i in 0..10 {
            dropped.extend(idx.insert(meta(&format!("other{i}"), vec![], "", 1)));
        }
        for i in 0..1_000 {
            let mut h = HeaderMap::new();
            h.insert(
                &origin,
                HeaderValue::from_str(&format!("https://{i}.test")).unwrap(),
            );
            let v = variant_key(std::slice::from_ref(&origin), &h);
            dropped.extend(idx.insert(meta("u", vec![origin.clone()], &v, 1)));
            assert!(idx.len() <= 100, "{} objects", idx.len());
        }
        let inner = idx.lock();
        let p = &inner.primaries["u"];
        assert!(p.variants.len() <= MAX_VARIANTS, "{}", p.variants.len());
        assert_eq!(p.order.len(), p.variants.len());
        assert_eq!(
            inner.objects,
            inner
                .primaries
                .values()
                .map(|p| p.variants.len())
                .sum::<usize>()
        );
        // Every variant inserted is held or was handed back; the newest are held.
        assert_eq!(dropped.len() + inner.objects, 1_010);
        let mut h = HeaderMap::new();
        h.insert(&origin, HeaderValue::from_static("https://999.test"));
        assert!(p
            .variants
            .contains_key(&variant_key(std::slice::from_ref(&origin), &h)));
        h.insert(&origin, HeaderValue::from_static("https://0.test"));
        assert!(!p
            .variants
            .contains_key(&variant_key(std::slice::from_ref(&origin), &h)));
        drop(inner);
        // Removing a variant keeps the order in step.
        let held: Vec<Arc<ObjectMeta>> = idx.lock().primaries["u"]
            .variants
            .values()
            .cloned()
            .collect();
        assert!(idx.remove_object("u", held[0].id, held[0].generation));
        let inner = idx.lock();
        assert_eq!(inner.primaries["u"].order.len(), held.len() - 1);
    }

    /// Finding: a purge of one URL walked every primary key under the lock. Now it looks the key
    /// up: only its own variants are visited (counted by the match), and a prefix purge visits
    /// only the keys under its prefix.
    #[test]
    fn a_url_purge_visits_its_own_key_alone() {
        let idx = ObjectIndex::new(100);
        for key in ["s|/a", "s|/b", "s|/c", "t|/a"] {
            idx.insert(meta(key, vec![], "", 1));
        }
        let visited = std::sync::Mutex::new(Vec::new());
        let count = |k: &str, _: &ObjectMeta| {
            visited.lock().unwrap().push(k.to_string());
            true
        };
        let out = idx.purge(Primaries::Key("s|/b"), count, false);
        assert_eq!(out.len(), 1);
        assert_eq!(*visited.lock().unwrap(), ["s|/b"]);
        assert_eq!(idx.len(), 3);
        assert!(idx
            .purge(Primaries::Key("s|/nothing"), count, false)
            .is_empty());
        assert_eq!(visited.lock().unwrap().len(), 1);
        visited.lock().unwrap().clear();
        let soft = idx.purge(Primaries::Prefix("s|"), count, true);
        assert_eq!(soft.len(), 2);
        assert!(soft.iter().all(|m| m.soft_purged));
        let mut seen = visited.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen, ["s|/a", "s|/c"]);
        assert_eq!(idx.len(), 3, "a soft purge keeps them");
    }

    /// A small bound with the inserted key the oldest: its own older variants go, not the bound.
    #[test]
    fn the_kept_key_gives_up_its_older_variants() {
        let idx = ObjectIndex::new(3);
        let ua = http::header::USER_AGENT;
        let key = |i: usize| {
            let mut h = HeaderMap::new();
            h.insert(&ua, HeaderValue::from_str(&format!("agent {i}")).unwrap());
            variant_key(std::slice::from_ref(&ua), &h)
        };
        idx.insert(meta("u", vec![ua.clone()], &key(0), 1));
        idx.insert(meta("b", vec![], "", 1));
        for i in 1..6 {
            idx.insert(meta("u", vec![ua.clone()], &key(i), 1));
            assert!(idx.len() <= 3);
        }
        let inner = idx.lock();
        assert!(inner.primaries["u"].variants.contains_key(&key(5)));
        assert!(!inner.primaries["u"].variants.contains_key(&key(0)));
    }
}
