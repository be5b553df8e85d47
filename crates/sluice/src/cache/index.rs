//! The object index: primary key → the `Vary` names of its responses → one object per variant,
//! plus hit-for-pass memos. Bounded by object count (oldest inserted goes first), by variants
//! per key ([`MAX_VARIANTS`]) and, with a budget, by the bytes the objects' heads cost: each
//! object's fields and tags are charged to `memory_bytes` while it is indexed (`budget.rs`), and
//! a head over [`MAX_HEAD_BYTES`] is not indexed at all. Each primary key is charged too
//! ([`key_charge`]), and so is each memo's; memos live apart from the objects' keys, within their
//! own share of the heads' room ([`MEMO_SHARE`]), so a flood of uncacheable URLs pushes out older
//! memos once that share is full (objects that filled the room give up at most the share).
//! Likewise a primary key made for an object whose keys are long ([`is_long`]) is kept apart,
//! within its own share ([`LONG_SHARE`]): a flood of long cache-busting URLs pushes out older
//! long keys, not the others.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::header::{HeaderMap, HeaderName};
use sluice_http::freshness::variant_key;

use super::budget::Budget;
use super::object::{head_bytes, ObjectId, ObjectMeta, MAX_HEAD_BYTES};

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

/// What a primary key costs beside its own bytes: its entry in the map (the key's `String` and a
/// [`Primary`], about 150 bytes with the table's slack), its `String` in the insertion order and
/// the allocator's headers of the two copies of the key.
const PRIMARY_BYTES: u64 = 256;

/// What a primary key costs while indexed, with objects or with only a hit-for-pass memo: the key
/// twice (the map's key and the insertion order's entry) and [`PRIMARY_BYTES`]. A memo holds
/// nothing else, so uncharged, unique URLs of up to 64 KiB answered `private` held ~128 KB each,
/// `max_objects` of them far past `memory_bytes`.
pub fn key_charge(key: &str) -> u64 {
    let claim = claim_base(key).map_or(0, |b| (key.len() + b.len()) as u64 + CLAIM_BYTES);
    2 * key.len() as u64 + PRIMARY_BYTES + claim
}

/// What a claimed key's entry in [`Inner::claimed`] costs beside the two keys' bytes: the set's
/// slot and the table's slack, and the allocators' headers.
const CLAIM_BYTES: u64 = 128;

/// The plain key a claimed one (`<scope><target> <claim>`: what a trusted proxy's forwarding
/// fields tell the origin beyond the hop's own) is a variant of: all before the first space after
/// the scope, since a target holds none. `None` for a plain key.
pub fn claim_base(key: &str) -> Option<&str> {
    let scope = super::purge::key_scope(key).len();
    let i = key.get(scope..)?.find(' ')?;
    Some(&key[..scope + i])
}

/// The part of the heads' room hit-for-pass memos may take together (one eighth): each request
/// to a new uncacheable URL leaves a memo, so a client sending unique URLs to an origin that
/// answers `private` makes memos as fast as it likes; within this share they only push out
/// older memos.
pub const MEMO_SHARE: u64 = 8;

/// The most a primary key and a variant key may hold together (bytes) for the object to be kept
/// with the others: past it the key is long ([`is_long`]).
pub const LONG_KEY: usize = 2 << 10;

/// The part of the heads' room, and of `max_objects`, long keys may take together (one eighth).
/// A key is charged about three times its length ([`key_charge`], [`ObjectMeta::charge`]): a
/// cache-busting GET with a 60 KiB query cost ~185 KB of the room, and ~725 of them pushed every
/// other object out of the index (and so out of every tier). Within this share they only push
/// out older long keys.
pub const LONG_SHARE: u64 = 8;

/// Whether an object with these keys is long ([`LONG_KEY`]). A primary key is long when the
/// object it was made for is (the class stays with the key while it is indexed; a long object
/// under a short key is not stored: [`ObjectIndex::insert`]).
pub fn is_long(primary: &str, variant: &str) -> bool {
    primary.len() + variant.len() > LONG_KEY
}

#[derive(Default)]
struct Primary {
    /// Made for a long object ([`is_long`]): in [`LongKeys::order`], charged to its share.
    long: bool,
    vary: Vec<HeaderName>,
    variants: HashMap<String, Arc<ObjectMeta>>,
    /// The keys of `variants`, oldest inserted first.
    order: VecDeque<String>,
}

/// Hit-for-pass memos: primary keys whose last answer was uncacheable, with the time each
/// passes until, oldest marked first. Each is charged [`key_charge`] while held.
#[derive(Default)]
struct Memos {
    /// Key → (until, the mark's number in `order`).
    until: HashMap<String, (Instant, u64)>,
    /// Marks, oldest first; one whose number is no longer its key's in `until` is stale (the
    /// memo was cleared or marked again since) and skipped.
    order: VecDeque<(String, u64)>,
    marks: u64,
    bytes: u64,
    /// The key bytes stale marks hold in `order` (not charged: kept below half of `bytes`, plus
    /// 64 KiB, by [`Memos::compact`]).
    stale: u64,
}

impl Memos {
    /// When `key` passes until, if it has a memo.
    fn get(&self, key: &str) -> Option<Instant> {
        self.until.get(key).map(|(t, _)| *t)
    }

    /// Marks `key` to pass until `until`; returns what that adds to the charge.
    fn mark(&mut self, key: &str, until: Instant) -> u64 {
        if let Some(held) = self.until.get_mut(key) {
            held.0 = until;
            return 0;
        }
        self.marks += 1;
        self.until.insert(key.to_string(), (until, self.marks));
        self.order.push_back((key.to_string(), self.marks));
        self.compact();
        let charge = key_charge(key);
        self.bytes += charge;
        charge
    }

    /// Drops `key`'s memo, its mark left stale in `order`; returns the charge released.
    fn clear(&mut self, key: &str) -> u64 {
        let charge = self.forget(key);
        if charge > 0 {
            self.stale += key.len() as u64;
            self.compact();
        }
        charge
    }

    /// Drops `key` from `until`; returns the charge released.
    fn forget(&mut self, key: &str) -> u64 {
        if self.until.remove(key).is_none() {
            return 0;
        }
        let charge = key_charge(key);
        self.bytes -= charge;
        charge
    }

    /// Drops the oldest memo other than `keep`; returns the charge released (0: none to drop).
    fn pop_oldest(&mut self, keep: &str) -> u64 {
        let mut kept = None;
        let mut released = 0;
        while let Some((key, mark)) = self.order.pop_front() {
            let live = self.until.get(&key).is_some_and(|(_, m)| *m == mark);
            if !live {
                self.stale = self.stale.saturating_sub(key.len() as u64);
                continue;
            }
            if key == keep {
                kept = Some((key, mark));
                continue;
            }
            released = self.forget(&key);
            break;
        }
        if let Some(kept) = kept {
            self.order.push_front(kept);
        }
        released
    }

    /// Drops stale marks once they outnumber the live ones, or their keys' bytes pass half of
    /// what the live memos are charged plus 64 KiB (a cleared memo of a 64 KiB URL leaves its
    /// key in `order`). Amortised: each pass drops at least as many marks, or bytes, as the
    /// live ones hold.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.until.len() + 16 || self.stale > self.bytes / 2 + (64 << 10)
        {
            let until = &self.until;
            self.order
                .retain(|(key, mark)| until.get(key).is_some_and(|(_, m)| m == mark));
            self.stale = 0;
        }
    }
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
    /// This one and every claimed variant of it ([`claim_base`]): a URL purge or an unsafe
    /// method's invalidation has no trusted proxy's fields, or other ones, than those the
    /// objects were stored with.
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
            // Already marked: nothing to change, nor to write again (an unsafe method any
            // client may send in a loop would otherwise copy and queue every variant each time).
            if m.soft_purged {
                return true;
            }
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

/// The long primary keys ([`LONG_SHARE`]) and what they cost.
#[derive(Default)]
struct LongKeys {
    /// Oldest inserted first; these keys are not in [`Inner::order`].
    order: VecDeque<String>,
    /// Their keys' charges ([`key_charge`]) and their objects' ([`ObjectMeta::charge`]).
    bytes: u64,
    objects: usize,
}

/// Books a long key's objects a hard purge dropped.
fn long_gone(long: &mut LongKeys, objects: usize, gone: &[Arc<ObjectMeta>]) {
    long.objects = long.objects.saturating_sub(objects);
    let bytes: u64 = gone.iter().map(|m| m.charge()).sum();
    long.bytes = long.bytes.saturating_sub(bytes);
}

#[derive(Default)]
struct Inner {
    primaries: HashMap<String, Primary>,
    /// Plain key → the claimed keys in `primaries` that are variants of it ([`claim_base`]):
    /// looked up, not the whole index walked, by a URL purge or an invalidation.
    claimed: HashMap<String, HashSet<String>>,
    /// The primary keys other than the long ones, oldest inserted first.
    order: VecDeque<String>,
    long: LongKeys,
    objects: usize,
    memos: Memos,
    /// What the indexed objects, primary keys and memos cost ([`ObjectMeta::charge`],
    /// [`key_charge`]).
    head_bytes: u64,
    /// Objects dropped by an [`ObjectIndex::update`] to keep the heads within their room, handed
    /// to the caller of the next call that returns dropped objects (their slices must go too).
    dropped_later: Vec<Arc<ObjectMeta>>,
}

impl Inner {
    /// Takes `m` out of the head count (it left `primaries`).
    fn release(&mut self, m: &ObjectMeta) {
        self.head_bytes = self.head_bytes.saturating_sub(m.charge());
    }

    /// Books objects and bytes a long key gained.
    fn long_add(&mut self, long: bool, objects: usize, bytes: u64) {
        if long {
            self.long.objects += objects;
            self.long.bytes += bytes;
        }
    }

    /// Books objects and bytes a long key gave up.
    fn long_sub(&mut self, long: bool, objects: usize, bytes: u64) {
        if long {
            self.long.objects = self.long.objects.saturating_sub(objects);
            self.long.bytes = self.long.bytes.saturating_sub(bytes);
        }
    }

    /// The insertion order a key is in: the long keys' or the others'.
    fn keys(&mut self, long: bool) -> &mut VecDeque<String> {
        if long {
            &mut self.long.order
        } else {
            &mut self.order
        }
    }

    /// Adds a new primary key to its insertion order and the head count (the caller adds it to
    /// `primaries`).
    fn add_key(&mut self, key: &str, long: bool) {
        self.keys(long).push_back(key.to_string());
        self.head_bytes += key_charge(key);
        self.long_add(long, 0, key_charge(key));
        if let Some(base) = claim_base(key) {
            self.claimed
                .entry(base.to_string())
                .or_default()
                .insert(key.to_string());
        }
    }

    /// Takes a key that left `primaries` out of [`Inner::claimed`].
    fn unlink_claim(&mut self, key: &str) {
        let Some(base) = claim_base(key) else { return };
        if let Some(set) = self.claimed.get_mut(base) {
            set.remove(key);
            if set.is_empty() {
                self.claimed.remove(base);
            }
        }
    }

    /// Removes `key` from `primaries` if the objects are all gone. Its entry in `order` is left
    /// to the caller, which may remove many at once. Returns whether it went.
    fn drop_if_empty(&mut self, key: &str) -> bool {
        let empty = self
            .primaries
            .get(key)
            .is_some_and(|p| p.variants.is_empty());
        if empty {
            let long = self.primaries.remove(key).is_some_and(|p| p.long);
            self.unlink_claim(key);
            self.head_bytes = self.head_bytes.saturating_sub(key_charge(key));
            self.long_sub(long, 0, key_charge(key));
        }
        empty
    }
}

/// A bound [`ObjectIndex::evict_from`] keeps to.
type Bound = fn(&ObjectIndex, &Inner) -> bool;

/// The object index.
pub struct ObjectIndex {
    /// Shared with the disk tier's writer (`ObjectIndex::holder`).
    inner: Arc<Mutex<Inner>>,
    max_objects: usize,
    /// Where the heads are charged ([`ObjectIndex::charged_to`]).
    budget: Option<Budget>,
    /// The most the indexed heads may cost together.
    head_room: u64,
}

impl ObjectIndex {
    pub fn new(max_objects: usize) -> ObjectIndex {
        ObjectIndex {
            inner: Arc::new(Mutex::new(Inner::default())),
            max_objects,
            budget: None,
            head_room: u64::MAX,
        }
    }

    /// Charges the heads of the objects indexed from now on to `budget`, within its
    /// [`Budget::head_room`]: past that the oldest objects go, as past `max_objects`.
    pub fn charged_to(mut self, budget: Budget) -> ObjectIndex {
        self.head_room = budget.head_room();
        self.budget = Some(budget);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("object index")
    }

    /// Runs `change` under the lock and then passes the change in the heads' cost on to the
    /// budget (out of the lock: the tier evicts as it shrinks, and lookups need not wait). Two
    /// calls may so reach the budget in either order; its count is signed, so that is harmless.
    fn charged<R>(&self, change: impl FnOnce(&mut Inner) -> R) -> R {
        let (out, delta) = {
            let mut inner = self.lock();
            let before = inner.head_bytes;
            let out = change(&mut inner);
            (out, inner.head_bytes as i64 - before as i64)
        };
        if let Some(budget) = &self.budget {
            budget.charge_heads(delta);
        }
        out
    }

    /// The most an object's fields and tags ([`head_bytes`]) may cost for it to be stored:
    /// [`MAX_HEAD_BYTES`], or less when the budget's whole head room is smaller.
    pub fn head_limit(&self) -> u64 {
        MAX_HEAD_BYTES.min(self.head_room / 2)
    }

    /// Whether an object with this head may be indexed (a long one: within the long keys'
    /// whole share).
    pub fn admits(&self, meta: &ObjectMeta) -> bool {
        let room = if is_long(&meta.primary, &meta.variant) {
            self.long_room()
        } else {
            self.head_room
        };
        head_bytes(&meta.headers, &meta.tags) <= self.head_limit()
            && meta.charge() + key_charge(&meta.primary) <= room
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
        // A memo never lives beside objects (`mark_pass` drops them, `insert` clears it): a key
        // with objects needs no look at the memos.
        if let Some(p) = inner.primaries.get(primary) {
            if !p.variants.is_empty() {
                return match p.variants.get(&variant_key(&p.vary, req)) {
                    Some(meta) => Lookup::Hit(meta.clone()),
                    None => Lookup::VaryMiss {
                        vary: p.vary.clone(),
                    },
                };
            }
        }
        match inner.memos.get(primary) {
            Some(t) if t > now => Lookup::Pass,
            _ => Lookup::UriMiss,
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
    /// version or `Vary` list (their slices must go too). An object whose head the index does
    /// not admit ([`ObjectIndex::admits`]) is not stored, and is handed back with them (a record
    /// the disk tier found at start goes with its files).
    pub fn insert(&self, meta: Arc<ObjectMeta>) -> Vec<Arc<ObjectMeta>> {
        if !self.admits(&meta) {
            let mut dropped = std::mem::take(&mut self.lock().dropped_later);
            dropped.push(meta);
            return dropped;
        }
        self.charged(|inner| {
            let mut dropped = std::mem::take(&mut inner.dropped_later);
            let long = is_long(&meta.primary, &meta.variant);
            // A key's class is its first object's: a long object under a short key (a long
            // `User-Agent` under `Vary: User-Agent` after a short one) would be booked outside
            // the long keys' share, and a flood of them would push out every short object. Not
            // stored (served as a pass): moving the key into the long order would walk the
            // short one under the lock.
            if long && inner.primaries.get(&meta.primary).is_some_and(|p| !p.long) {
                dropped.push(meta);
                return dropped;
            }
            let is_new_primary = !inner.primaries.contains_key(&meta.primary);
            let memo = inner.memos.clear(&meta.primary);
            let p = inner
                .primaries
                .entry(meta.primary.clone())
                .or_insert_with(|| Primary {
                    long,
                    ..Primary::default()
                });
            let long = p.long;
            let mut released = 0;
            let mut added = 0;
            let mut removed = 0;
            if p.vary != meta.vary {
                removed += p.variants.len();
                for old in p.drain() {
                    released += old.charge();
                    dropped.push(old);
                }
                p.vary = meta.vary.clone();
            }
            match p.variants.insert(meta.variant.clone(), meta.clone()) {
                Some(old) => {
                    released += old.charge();
                    if old.generation != meta.generation {
                        dropped.push(old);
                    }
                }
                None => {
                    p.order.push_back(meta.variant.clone());
                    if p.variants.len() > MAX_VARIANTS {
                        if let Some(old) = p.pop_oldest(Some(&meta.variant)) {
                            removed += 1;
                            released += old.charge();
                            dropped.push(old);
                        }
                    }
                    added = 1;
                }
            }
            inner.objects = inner.objects + added - removed;
            inner.head_bytes = (inner.head_bytes + meta.charge()).saturating_sub(released + memo);
            inner.long_add(long, added, meta.charge());
            inner.long_sub(long, removed, released);
            if is_new_primary {
                inner.add_key(&meta.primary, long);
            }
            self.evict(inner, (&meta.primary, Some(&meta.variant)), &mut dropped);
            dropped
        })
    }

    /// The most the memos may cost together ([`MEMO_SHARE`]).
    fn memo_room(&self) -> u64 {
        self.head_room / MEMO_SHARE
    }

    /// The most long keys may cost together ([`LONG_SHARE`]).
    fn long_room(&self) -> u64 {
        self.head_room / LONG_SHARE
    }

    /// The most long keys, or objects under them, the index may hold ([`LONG_SHARE`]).
    fn long_max(&self) -> usize {
        (self.max_objects / LONG_SHARE as usize).max(1)
    }

    /// Whether the index is over one of its bounds.
    fn over(&self, inner: &Inner) -> bool {
        inner.objects > self.max_objects
            || inner.primaries.len() > self.max_objects
            || inner.head_bytes > self.head_room
    }

    /// Whether the index holds too many objects or bytes (not only too many keys).
    fn too_many(&self, inner: &Inner) -> bool {
        inner.objects > self.max_objects || inner.head_bytes > self.head_room
    }

    /// Whether the long keys are over their share.
    fn long_over(&self, inner: &Inner) -> bool {
        self.long_too_many(inner) || inner.long.order.len() > self.long_max()
    }

    fn long_too_many(&self, inner: &Inner) -> bool {
        inner.long.objects > self.long_max() || inner.long.bytes > self.long_room()
    }

    /// Drops the oldest primaries while over a bound: the long keys' first while over their
    /// share (never another key for them), then the others' while over the index's bounds
    /// (objects, keys, or the heads' room), then long ones if nothing else is left to go.
    fn evict(
        &self,
        inner: &mut Inner,
        keep: (&str, Option<&str>),
        dropped: &mut Vec<Arc<ObjectMeta>>,
    ) {
        self.evict_from(
            inner,
            true,
            keep,
            dropped,
            (Self::long_over, Self::long_too_many),
        );
        self.evict_from(inner, false, keep, dropped, (Self::over, Self::too_many));
        self.evict_from(inner, true, keep, dropped, (Self::over, Self::too_many));
    }

    /// Drops the oldest primaries of one insertion order (the long keys' or the others') while
    /// `over`. `keep` (the key and variant just stored, or a memo's key) stays: when its key is
    /// the oldest, its other variants go first (while `too_many`), oldest first (else one URL
    /// with a new variant at each request would grow past the bound while everything else
    /// went), then the next oldest key.
    fn evict_from(
        &self,
        inner: &mut Inner,
        long: bool,
        (keep, variant): (&str, Option<&str>),
        dropped: &mut Vec<Arc<ObjectMeta>>,
        (over, too_many): (Bound, Bound),
    ) {
        while over(self, inner) {
            let Some(oldest) = inner.keys(long).pop_front() else {
                break;
            };
            if oldest == keep {
                let too_many = too_many(self, inner);
                let popped = match inner.primaries.get_mut(keep) {
                    Some(p) if too_many => p.pop_oldest(variant).map(|old| (old, p.long)),
                    _ => None,
                };
                inner.keys(long).push_front(oldest);
                match popped {
                    Some((old, long)) => {
                        inner.objects -= 1;
                        inner.release(&old);
                        inner.long_sub(long, 1, old.charge());
                        dropped.push(old);
                        continue;
                    }
                    // Nothing of it can go: the next oldest key does, if there is one.
                    None if inner.keys(long).len() > 1 => {
                        let Some(next) = inner.keys(long).remove(1) else {
                            break;
                        };
                        self.drop_primary(inner, &next, dropped);
                        continue;
                    }
                    None => break,
                }
            }
            self.drop_primary(inner, &oldest, dropped);
        }
    }

    /// Drops a primary key and every variant of it (already out of `order`).
    fn drop_primary(&self, inner: &mut Inner, key: &str, dropped: &mut Vec<Arc<ObjectMeta>>) {
        if let Some(p) = inner.primaries.remove(key) {
            inner.unlink_claim(key);
            inner.head_bytes = inner.head_bytes.saturating_sub(key_charge(key));
            inner.objects -= p.variants.len();
            inner.long_sub(p.long, p.variants.len(), key_charge(key));
            for old in p.variants.into_values() {
                inner.release(&old);
                inner.long_sub(p.long, 0, old.charge());
                dropped.push(old);
            }
        }
    }

    /// Replaces an object's record if it is still the same version (after a 304 or a length
    /// update). A new head the index does not admit leaves the record as it was; one that
    /// grows the heads past their room makes the oldest objects go (handed back by the next
    /// call that returns dropped objects).
    pub fn update(&self, meta: Arc<ObjectMeta>) -> bool {
        if !self.admits(&meta) {
            return false;
        }
        self.charged(|inner| {
            let Some(p) = inner.primaries.get_mut(&meta.primary) else {
                return false;
            };
            let long = p.long;
            let old = match p.variants.get_mut(&meta.variant) {
                Some(slot) if slot.generation == meta.generation => {
                    std::mem::replace(slot, meta.clone())
                }
                _ => return false,
            };
            inner.head_bytes = (inner.head_bytes + meta.charge()).saturating_sub(old.charge());
            inner.long_add(long, 0, meta.charge());
            inner.long_sub(long, 0, old.charge());
            let mut dropped = std::mem::take(&mut inner.dropped_later);
            self.evict(inner, (&meta.primary, Some(&meta.variant)), &mut dropped);
            inner.dropped_later = dropped;
            true
        })
    }

    /// Drops one version of an object (a version change or a vanished origin object); a newer
    /// version stored meanwhile stays. A primary key left with no object stays, charged
    /// ([`key_charge`]), until evicted like any key: taking it out of `order` would walk it under
    /// the lock, and removals follow clients' requests.
    pub fn remove_object(&self, primary: &str, id: ObjectId, generation: u64) -> bool {
        self.charged(|inner| {
            let Some(p) = inner.primaries.get_mut(primary) else {
                return false;
            };
            let mut released = 0;
            let before = p.variants.len();
            p.variants.retain(|_, m| {
                let gone = m.id == id && m.generation == generation;
                if gone {
                    released += m.charge();
                }
                !gone
            });
            let removed = before - p.variants.len();
            if removed > 0 {
                p.reorder();
            }
            let long = p.long;
            inner.objects -= removed;
            inner.head_bytes = inner.head_bytes.saturating_sub(released);
            inner.long_sub(long, removed, released);
            removed > 0
        })
    }

    /// Keeps `primary` out of the cache path until `until` (hit-for-pass).
    /// Returns the objects it replaces. Memos stay within their share of the heads' room and
    /// within `max_objects` in number, the oldest going first; a key too long for the whole
    /// share gets none (the next request goes to the origin as a miss, not stored either).
    pub fn mark_pass(&self, primary: &str, until: Instant) -> Vec<Arc<ObjectMeta>> {
        self.charged(|inner| {
            let mut dropped = std::mem::take(&mut inner.dropped_later);
            // The objects go; the key, now empty, stays charged until evicted (as after a
            // removal).
            if let Some(p) = inner.primaries.get_mut(primary) {
                let (removed, long) = (p.variants.len(), p.long);
                let gone: Vec<Arc<ObjectMeta>> = p.drain().collect();
                inner.objects -= removed;
                inner.long_sub(long, removed, 0);
                for old in gone {
                    inner.release(&old);
                    inner.long_sub(long, 0, old.charge());
                    dropped.push(old);
                }
            }
            let room = self.memo_room();
            if key_charge(primary) > room {
                return dropped;
            }
            inner.head_bytes += inner.memos.mark(primary, until);
            while inner.memos.bytes > room || inner.memos.until.len() > self.max_objects {
                let released = inner.memos.pop_oldest(primary);
                if released == 0 {
                    break;
                }
                inner.head_bytes = inner.head_bytes.saturating_sub(released);
            }
            self.evict(inner, (primary, None), &mut dropped);
            dropped
        })
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
        self.charged(|inner| {
            let mut out = Vec::new();
            let mut removed = 0;
            // Keys a hard purge by prefix emptied: they go too (that purge walks the index
            // anyway). A key purge leaves its key, charged, to eviction, as `remove_object` does.
            let mut emptied = Vec::new();
            match which {
                Primaries::Key(key) => {
                    let claimed = inner.claimed.get(key).cloned().unwrap_or_default();
                    for k in std::iter::once(key).chain(claimed.iter().map(String::as_str)) {
                        if let Some(p) = inner.primaries.get_mut(k) {
                            let from = out.len();
                            let n = purge_variants(k, p, &matches, soft, &mut out);
                            if p.long && !soft {
                                long_gone(&mut inner.long, n, &out[from..]);
                            }
                            removed += n;
                        }
                    }
                }
                Primaries::Prefix(prefix) => {
                    for (key, p) in inner.primaries.iter_mut() {
                        if key.starts_with(prefix) {
                            let from = out.len();
                            let n = purge_variants(key, p, &matches, soft, &mut out);
                            if p.long && !soft {
                                long_gone(&mut inner.long, n, &out[from..]);
                            }
                            removed += n;
                            // Emptied now, or left empty by an earlier removal.
                            if p.variants.is_empty() {
                                emptied.push(key.clone());
                            }
                        }
                    }
                }
            }
            inner.objects -= removed;
            let mut gone = 0;
            for key in &emptied {
                gone += usize::from(inner.drop_if_empty(key));
            }
            if gone > 0 {
                // One pass through `order` for all of them.
                let primaries = &inner.primaries;
                inner.order.retain(|k| primaries.contains_key(k));
                inner.long.order.retain(|k| primaries.contains_key(k));
            }
            // A soft purge keeps each record as a copy of the same head: the same cost.
            if !soft {
                for m in &out {
                    inner.release(m);
                }
            }
            out
        })
    }

    /// What the indexed objects' heads and primary keys cost now ([`ObjectMeta::charge`],
    /// [`key_charge`]).
    pub fn head_bytes(&self) -> u64 {
        self.lock().head_bytes
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

    /// What the index holds, counted afresh: each object's charge, each primary key's and each
    /// memo's.
    fn charged_now(idx: &ObjectIndex) -> u64 {
        let inner = idx.lock();
        let objects: u64 = inner
            .primaries
            .values()
            .flat_map(|p| p.variants.values())
            .map(|m| m.charge())
            .sum();
        let keys: u64 = inner.primaries.keys().map(|k| key_charge(k)).sum();
        let memos: u64 = inner.memos.until.keys().map(|k| key_charge(k)).sum();
        assert_eq!(
            inner.order.len() + inner.long.order.len(),
            inner.primaries.len()
        );
        // The long keys' share, counted afresh.
        let long = inner.primaries.iter().filter(|(_, p)| p.long);
        let (mut long_bytes, mut long_objects) = (0, 0);
        for (k, p) in long {
            assert!(inner.long.order.contains(k));
            long_bytes += key_charge(k) + p.variants.values().map(|m| m.charge()).sum::<u64>();
            long_objects += p.variants.len();
        }
        assert_eq!(
            (inner.long.bytes, inner.long.objects),
            (long_bytes, long_objects)
        );
        assert_eq!(inner.memos.bytes, memos);
        objects + keys + memos
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

    /// Finding: a soft purge copied every variant it matched and handed each copy on (to be
    /// queued for the disk tier) even when it was marked already, so an unsafe method any
    /// client may send in a loop to a URL with many variants made and queued copies of all of
    /// them at each request. Now what is marked already is left as it is.
    #[test]
    fn a_soft_purge_leaves_what_is_marked_already() {
        let idx = ObjectIndex::new(1_000);
        let ua = http::header::USER_AGENT;
        for i in 0..MAX_VARIANTS {
            let mut h = HeaderMap::new();
            h.insert(&ua, HeaderValue::from_str(&format!("agent {i}")).unwrap());
            let v = variant_key(std::slice::from_ref(&ua), &h);
            idx.insert(meta("s|/v", vec![ua.clone()], &v, 1));
        }
        let first = idx.purge(Primaries::Key("s|/v"), |_, _| true, true);
        assert_eq!(first.len(), MAX_VARIANTS);
        for _ in 0..10 {
            let again = idx.purge(Primaries::Key("s|/v"), |_, _| true, true);
            assert!(again.is_empty(), "{} copies made again", again.len());
        }
        // The records held are the first purge's, untouched.
        let inner = idx.lock();
        for m in &first {
            assert!(Arc::ptr_eq(
                m,
                &inner.primaries["s|/v"].variants[&m.variant]
            ));
        }
    }

    /// A URL purge (or an invalidation) by the plain key reaches the variants stored under a
    /// trusted proxy's claims (`<key> <claim>`), not a longer path's, nor another scope's; the
    /// claimed keys' links go with them.
    #[test]
    fn a_url_purge_reaches_the_claimed_variants_of_its_key() {
        let idx = ObjectIndex::new(100);
        let keys = [
            "1:r1:h|/a 5:https1:h",
            "1:r1:h|/a 4:http1:h16:x-forwarded-port3:443",
            "1:r1:h|/ab 5:https1:h",
            "1:r1:g|/a 5:https1:h",
            "1:r1:h|/a",
        ];
        for key in keys {
            idx.insert(meta(key, vec![], "", 1));
        }
        assert_eq!(claim_base(keys[0]), Some("1:r1:h|/a"));
        assert_eq!(claim_base(keys[4]), None);
        let mut purged: Vec<String> = idx
            .purge(Primaries::Key("1:r1:h|/a"), |_, _| true, false)
            .iter()
            .map(|m| m.primary.clone())
            .collect();
        purged.sort();
        assert_eq!(purged, [keys[4], keys[1], keys[0]]);
        assert_eq!(idx.len(), 2);
        // Evicted or emptied keys leave no link behind.
        idx.purge(Primaries::Prefix(""), |_, _| true, false);
        assert!(idx.lock().claimed.is_empty());
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

    /// Finding: the heads of indexed objects counted against nothing, so `max_objects` records
    /// with large fields (or many tags) held memory far past `memory_bytes`. Now each is charged
    /// to the budget while indexed (the tier gives up as much, evicting slices), the heads stay
    /// within their room (the oldest objects go), a head over the limit is refused, and what
    /// leaves the index gives its bytes back.
    #[test]
    fn heads_are_charged_to_the_budget_and_bounded() {
        use crate::cache::budget::Budget;
        use crate::cache::memory::{MemoryTier, Slice};
        use crate::cache::object::SliceKey;

        let slice = 16 * 1024;
        let total = 64 * slice;
        let memory = Arc::new(MemoryTier::new(total, slice));
        let budget = Budget::new(total, slice, memory.clone());
        let idx = ObjectIndex::new(100_000).charged_to(budget.clone());
        let fill_tier = || {
            for i in 0..200 {
                let key = SliceKey {
                    object: ObjectId(9),
                    generation: 1,
                    index: i,
                };
                memory.insert(key, Slice::new(vec![vec![7u8; slice as usize].into()]));
            }
        };
        fill_tier();
        let with_head = |primary: &str, filler: usize, tags: usize| {
            let mut m = (*meta(primary, vec![], "", 1)).clone();
            m.headers.insert(
                "x-filler",
                HeaderValue::from_str(&"f".repeat(filler)).unwrap(),
            );
            m.tags = (0..tags).map(|i| format!("tag-{i:05}")).collect();
            Arc::new(m)
        };
        let mut dropped = Vec::new();
        for i in 0..100 {
            dropped.extend(idx.insert(with_head(&format!("k{i}"), 12_000, 0)));
            let held = charged_now(&idx);
            assert_eq!(idx.head_bytes(), held);
            assert_eq!(budget.heads(), held);
            assert!(held <= budget.head_room(), "{held}");
            // Per-entry bookkeeping may round the tier up by a little.
            assert!(
                budget.accounted() <= total + 1024,
                "{} over {total}",
                budget.accounted()
            );
        }
        assert!(idx.len() >= 15 && idx.len() < 30, "{}", idx.len());
        assert_eq!(idx.len() + dropped.len(), 100);
        assert!(budget.heads() > 15 * 24_000);
        // The tier gave up what the heads took.
        assert!(
            memory.weight() <= total - budget.heads(),
            "{}",
            memory.weight()
        );

        // Over the limit, in fields or in tags: refused and handed back, nothing charged.
        let before = idx.head_bytes();
        assert!(idx.head_limit() == MAX_HEAD_BYTES);
        for big in [with_head("big", 40_000, 0), with_head("tags", 10, 1_000)] {
            assert!(head_bytes(&big.headers, &big.tags) > MAX_HEAD_BYTES);
            let out = idx.insert(big.clone());
            assert!(out.iter().any(|m| Arc::ptr_eq(m, &big)));
            assert!(matches!(
                idx.lookup(&big.primary, &HeaderMap::new(), Instant::now()),
                Lookup::UriMiss
            ));
            assert!(!idx.update(big));
        }
        assert_eq!(idx.head_bytes(), before);

        // A head that grows (a 304's fields) past the room makes the oldest go, handed back by
        // the next insert.
        let newest = format!("k{}", 99);
        let mut grown = (*idx.get(&newest, ObjectId::new(&newest, "")).unwrap()).clone();
        grown.headers.insert(
            "x-more",
            HeaderValue::from_str(&"m".repeat(12_000)).unwrap(),
        );
        let held =
            |idx: &ObjectIndex| -> Vec<String> { idx.lock().primaries.keys().cloned().collect() };
        let before = held(&idx);
        assert!(idx.update(Arc::new(grown)));
        assert!(idx.head_bytes() <= budget.head_room());
        assert_eq!(budget.heads(), idx.head_bytes());
        let after = held(&idx);
        let gone: Vec<&String> = before.iter().filter(|k| !after.contains(k)).collect();
        assert_eq!(gone.len(), 1);
        let later = idx.insert(meta("small", vec![], "", 1));
        assert!(
            later.iter().any(|m| &m.primary == gone[0]),
            "the object the update dropped is handed back"
        );

        // Everything purged: every byte given back, and the tier may use the whole budget again.
        idx.purge(Primaries::Prefix(""), |_, _| true, false);
        assert_eq!((idx.len(), idx.head_bytes(), budget.heads()), (0, 0, 0));
        fill_tier();
        assert!(memory.weight() > total * 3 / 4, "{}", memory.weight());
    }

    /// Finding: a hit-for-pass memo (a primary key with no objects) was charged nothing, though
    /// it holds its key twice, and URLs go up to 64 KiB: unique long-query GETs to an origin
    /// answering `private` held ~128 KB each beside the budget, bounded only by `max_objects`.
    /// Now each memo is charged and memos stay within their share of the heads' room, the oldest
    /// going.
    #[test]
    fn memos_with_long_urls_are_charged_and_bounded() {
        use crate::cache::budget::Budget;
        use crate::cache::memory::MemoryTier;

        let slice = 16 * 1024;
        let total = 64 * slice;
        let memory = Arc::new(MemoryTier::new(total, slice));
        let budget = Budget::new(total, slice, memory);
        let idx = ObjectIndex::new(100_000).charged_to(budget.clone());
        let until = Instant::now() + std::time::Duration::from_secs(60);
        let url = |i: usize| format!("s|h|/q?{i:05}{}", "x".repeat(6_000));
        for i in 0..100 {
            assert!(idx.mark_pass(&url(i), until).is_empty());
            let held = charged_now(&idx);
            assert_eq!((idx.head_bytes(), budget.heads()), (held, held));
            assert!(
                held <= budget.head_room() / MEMO_SHARE,
                "{held} past the share"
            );
            assert!(budget.accounted() <= total, "{}", budget.accounted());
        }
        let memos = idx.lock().memos.until.len();
        // Each costs about 12 KB: five fit in the share (64 KiB).
        assert_eq!(memos, 5);
        assert!(idx.lock().memos.order.len() <= 2 * memos + 16);
        let now = Instant::now();
        assert!(matches!(
            idx.lookup(&url(99), &HeaderMap::new(), now),
            Lookup::Pass
        ));
        assert!(matches!(
            idx.lookup(&url(0), &HeaderMap::new(), now),
            Lookup::UriMiss
        ));
        // A key too long for the whole share gets no memo.
        let huge = "y".repeat((budget.head_room() / MEMO_SHARE) as usize);
        assert!(idx.mark_pass(&huge, until).is_empty());
        assert!(matches!(
            idx.lookup(&huge, &HeaderMap::new(), now),
            Lookup::UriMiss
        ));
        assert_eq!(idx.head_bytes(), charged_now(&idx));
    }

    /// Finding (a review of the memo share): a memo cleared by a store left its key, up to
    /// 64 KiB, in the marks' order, uncharged, until the marks outnumbered the live memos twice:
    /// many short live memos let thousands of long stale keys stay. Stale keys' bytes are now
    /// bounded by half of what the live memos are charged, plus 64 KiB.
    #[test]
    fn keys_of_cleared_memos_do_not_pile_up() {
        let idx = ObjectIndex::new(100_000);
        let until = Instant::now() + std::time::Duration::from_secs(60);
        for i in 0..1_000 {
            idx.mark_pass(&format!("short{i}"), until);
        }
        for i in 0..200 {
            let long = format!("s|h|/flip?{i:04}{}", "x".repeat(60_000));
            idx.mark_pass(&long, until);
            idx.insert(meta(&long, vec![], "", 1));
        }
        let inner = idx.lock();
        let held: u64 = inner
            .memos
            .order
            .iter()
            .filter(|(k, m)| inner.memos.until.get(k).is_none_or(|(_, live)| live != m))
            .map(|(k, _)| k.len() as u64)
            .sum();
        assert!(
            held <= inner.memos.bytes / 2 + (64 << 10) + 61_000,
            "{held} stale bytes"
        );
        assert_eq!(inner.memos.until.len(), 1_000);
    }

    /// Finding: memos shared the heads' room with the objects, so ~2,000 requests with unique
    /// 60 KB URLs to a path the origin answers `private` (no auth needed) pushed every stored
    /// object out of the index. Now memos push out only older memos.
    #[test]
    fn a_flood_of_memos_leaves_the_objects_stored() {
        use crate::cache::budget::Budget;
        use crate::cache::memory::MemoryTier;

        let slice = 16 * 1024;
        let total = 64 * slice;
        let memory = Arc::new(MemoryTier::new(total, slice));
        let budget = Budget::new(total, slice, memory);
        let idx = ObjectIndex::new(100_000).charged_to(budget.clone());
        let objects: Vec<String> = (0..50).map(|i| format!("s|h|/object{i}")).collect();
        for key in &objects {
            assert!(idx.insert(meta(key, vec![], "", 1)).is_empty());
        }
        let until = Instant::now() + std::time::Duration::from_secs(60);
        for i in 0..2_000 {
            let url = format!("s|h|/private?{i:05}{}", "x".repeat(60_000));
            let dropped = idx.mark_pass(&url, until);
            assert!(
                dropped.is_empty(),
                "memo {i} dropped {}",
                dropped[0].primary
            );
        }
        let now = Instant::now();
        for key in &objects {
            assert!(
                matches!(idx.lookup(key, &HeaderMap::new(), now), Lookup::Hit(_)),
                "{key} gone"
            );
        }
        assert_eq!(idx.len(), objects.len());
        assert_eq!(
            (idx.head_bytes(), budget.heads()),
            (charged_now(&idx), charged_now(&idx))
        );
        // A URL marked after it was stored loses its object; storing it again clears the memo.
        let dropped = idx.mark_pass(&objects[0], until);
        assert_eq!(dropped.len(), 1);
        assert!(matches!(
            idx.lookup(&objects[0], &HeaderMap::new(), now),
            Lookup::Pass
        ));
        assert!(idx.insert(meta(&objects[0], vec![], "", 2)).is_empty());
        assert!(matches!(
            idx.lookup(&objects[0], &HeaderMap::new(), now),
            Lookup::Hit(_)
        ));
        assert!(idx.lock().memos.get(&objects[0]).is_none());
        assert_eq!(idx.head_bytes(), charged_now(&idx));
    }

    /// Finding: a key's class was fixed by its first object, so under `Vary: User-Agent` one
    /// request with a short `User-Agent` then ones with ~60 KiB agents (per cache-busting URL)
    /// booked the long variants outside the long keys' share, and pushed every short object
    /// out. A long object under a short key is now not stored.
    #[test]
    fn long_variants_under_a_short_key_leave_the_short_ones_stored() {
        use crate::cache::budget::Budget;
        use crate::cache::memory::MemoryTier;

        let slice = 16 * 1024;
        let total = 1024 * slice;
        let memory = Arc::new(MemoryTier::new(total, slice));
        let budget = Budget::new(total, slice, memory);
        let idx = ObjectIndex::new(10_000).charged_to(budget.clone());
        let short: Vec<String> = (0..200).map(|i| format!("s|h|/object{i}")).collect();
        for key in &short {
            assert!(idx.insert(meta(key, vec![], "", 1)).is_empty());
        }
        let ua = http::header::USER_AGENT;
        let variant = |agent: &str| {
            let mut h = HeaderMap::new();
            h.insert(&ua, HeaderValue::from_str(agent).unwrap());
            variant_key(std::slice::from_ref(&ua), &h)
        };
        let mut refused = 0;
        for url in 0..40 {
            let primary = format!("s|h|/q?{url:05}");
            let first = meta(&primary, vec![ua.clone()], &variant("curl"), 1);
            assert!(!is_long(&first.primary, &first.variant));
            assert!(idx.insert(first).is_empty());
            for i in 0..63 {
                let agent = format!("{i}{}", "a".repeat(60 << 10));
                let m = meta(&primary, vec![ua.clone()], &variant(&agent), 1);
                assert!(is_long(&m.primary, &m.variant));
                let dropped = idx.insert(m.clone());
                refused += dropped.iter().filter(|d| d.id == m.id).count();
            }
        }
        let now = Instant::now();
        for key in &short {
            assert!(
                matches!(idx.lookup(key, &HeaderMap::new(), now), Lookup::Hit(_)),
                "{key} pushed out by long variants under a short key"
            );
        }
        assert_eq!(
            refused,
            40 * 63,
            "long variants under a short key are not stored"
        );
        assert_eq!(
            (idx.head_bytes(), budget.heads()),
            (charged_now(&idx), charged_now(&idx))
        );
    }

    /// Finding: a key is charged about three times its length and the index dropped its oldest
    /// keys first, so ~725 cache-busting GETs with 60 KiB queries (or long URLs with a long
    /// `User-Agent` under `Vary: User-Agent`) pushed every other object out of the index, and
    /// with it out of both tiers. Now objects with long keys live within their own share of the
    /// heads' room (and of `max_objects`): they push out older long keys only.
    #[test]
    fn a_flood_of_long_keys_leaves_the_short_ones_stored() {
        use crate::cache::budget::Budget;
        use crate::cache::memory::MemoryTier;

        let slice = 16 * 1024;
        let total = 1024 * slice;
        let memory = Arc::new(MemoryTier::new(total, slice));
        let budget = Budget::new(total, slice, memory);
        let idx = ObjectIndex::new(10_000).charged_to(budget.clone());
        let short: Vec<String> = (0..200).map(|i| format!("s|h|/object{i}")).collect();
        for key in &short {
            assert!(idx.insert(meta(key, vec![], "", 1)).is_empty());
        }
        let ua = http::header::USER_AGENT;
        let mut dropped = Vec::new();
        for i in 0..2_000 {
            let m = if i % 2 == 0 {
                // A long URL.
                meta(
                    &format!("s|h|/q?{i:05}{}", "x".repeat(8_000)),
                    vec![],
                    "",
                    1,
                )
            } else {
                // A short URL with a long variant.
                let mut h = HeaderMap::new();
                let agent = format!("{i}{}", "a".repeat(8_000));
                h.insert(&ua, HeaderValue::from_str(&agent).unwrap());
                let v = variant_key(std::slice::from_ref(&ua), &h);
                meta(&format!("s|h|/q?{i:05}"), vec![ua.clone()], &v, 1)
            };
            assert!(is_long(&m.primary, &m.variant));
            dropped.extend(idx.insert(m));
            let inner = idx.lock();
            assert!(inner.long.bytes <= idx.long_room(), "{}", inner.long.bytes);
        }
        assert!(dropped.iter().all(|m| is_long(&m.primary, &m.variant)));
        let now = Instant::now();
        for key in &short {
            assert!(
                matches!(idx.lookup(key, &HeaderMap::new(), now), Lookup::Hit(_)),
                "{key} pushed out by long keys"
            );
        }
        // The newest long keys are held; what they cost is counted right.
        assert!(idx.lock().long.objects > 10);
        assert_eq!(
            (idx.head_bytes(), budget.heads()),
            (charged_now(&idx), charged_now(&idx))
        );
        // A long key too large for the whole share is not stored.
        let huge = meta(&format!("s|h|/{}", "y".repeat(400_000)), vec![], "", 1);
        assert!(huge.charge() + key_charge(&huge.primary) > idx.long_room());
        assert!(!idx.admits(&huge));
        // Everything purged: every byte of the share given back.
        idx.purge(Primaries::Prefix(""), |_, _| true, false);
        let inner = idx.lock();
        assert_eq!((inner.long.bytes, inner.long.objects), (0, 0));
        assert!(inner.long.order.is_empty() && inner.primaries.is_empty());
    }

    /// Finding: removing an object's last version, or hard-purging its key, left the key in the
    /// index with nothing under it, uncharged and never swept. Now such a key is charged until
    /// evicted (a hard purge by prefix takes it at once), and every byte is given back.
    #[test]
    fn a_key_left_with_no_object_is_charged_until_it_goes() {
        use crate::cache::budget::Budget;
        use crate::cache::memory::MemoryTier;

        let slice = 16 * 1024;
        // Room for the three long keys within their share ([`LONG_SHARE`]).
        let memory = Arc::new(MemoryTier::new(256 * slice, slice));
        let budget = Budget::new(256 * slice, slice, memory);
        let idx = ObjectIndex::new(100).charged_to(budget.clone());
        let long = |name: &str| format!("s|h|/{name}?{}", "z".repeat(10_000));
        let (a, b, c) = (long("a"), long("b"), long("c"));
        for key in [&a, &b, &c] {
            idx.insert(meta(key, vec![], "", 1));
        }
        assert_eq!(budget.heads(), charged_now(&idx));
        assert!(idx.remove_object(&a, ObjectId::new(&a, ""), 1));
        idx.purge(Primaries::Key(&b), |_, _| true, false);
        // Emptied by a removal or a key purge, a key stays charged until evicted (taking it
        // out of the order would walk it under the lock).
        assert_eq!(idx.lock().primaries.len(), 3);
        assert_eq!(budget.heads(), charged_now(&idx));
        assert_eq!(
            budget.heads(),
            meta(&c, vec![], "", 1).charge() + key_charge(&a) + key_charge(&b) + key_charge(&c)
        );
        // A purge by prefix takes every empty key it passes (a soft one keeps c's stale copy).
        idx.purge(Primaries::Prefix("s|"), |_, _| true, true);
        assert_eq!(idx.lock().primaries.len(), 1);
        idx.purge(Primaries::Prefix("s|"), |_, _| true, false);
        {
            let inner = idx.lock();
            assert!(inner.primaries.is_empty());
            assert!(inner.order.is_empty());
        }
        assert_eq!(charged_now(&idx), 0, "no key left");
        assert_eq!((idx.head_bytes(), budget.heads()), (0, 0));
    }
}
