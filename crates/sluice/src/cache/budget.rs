//! The one byte budget (`memory_bytes`) shared by the memory tier and the slices in transit
//! (being fetched, or queued for the disk writer): a slice in transit reserves its bytes first,
//! and the memory tier shrinks (evicting) by as much until the reservation ends.
//!
//! Why one budget rather than a tier plus side allowances: with the tier alone bounded, twenty
//! cold streams and a busy disk queue held 120 MB beside a full 256 MiB tier (S4 (d)). Here the
//! slices in transit are capped at a quarter of the budget (they wait for room beyond that), and
//! what they hold is taken from the tier, so tier + transit ≤ `memory_bytes` at every instant.
//!
//! The heads of indexed objects (their fields and tags, `ObjectMeta::charge`) are charged here
//! too, and taken from the tier the same way: `max_objects` records with 64 KiB of fields each
//! held gigabytes beside a full tier. They may take at most half the budget ([`Budget::head_room`]);
//! past that the object index drops its oldest objects, as it does past `max_objects`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::memory::MemoryTier;

/// The shared budget; cheap to clone.
#[derive(Clone)]
pub struct Budget {
    shared: Arc<Shared>,
}

struct Shared {
    total: u64,
    transit_cap: u64,
    room: Arc<Semaphore>,
    /// Bytes held beside the tier; the lock also orders the tier's resizes.
    held: Mutex<Held>,
    /// The most bytes ever accounted (tier + transit), sampled at every change of a reservation
    /// and every slice the tier takes from a fill.
    peak: AtomicU64,
    memory: Arc<MemoryTier>,
}

/// What the budget holds beside the memory tier.
#[derive(Default)]
struct Held {
    /// Reserved by slices in transit.
    transit: u64,
    /// Charged by the object index for the heads it holds. Signed: the index passes on each
    /// change after its own lock is gone, so a release may arrive before the charge it undoes;
    /// a count that clipped at zero kept that charge for good (the tier lost as much capacity).
    /// Below zero only until the charge arrives, and then counted as zero.
    heads: i64,
}

impl Held {
    fn heads(&self) -> u64 {
        self.heads.max(0) as u64
    }

    fn total(&self) -> u64 {
        self.transit.saturating_add(self.heads())
    }
}

/// Bytes held for one slice in transit; given back (and to the tier) when dropped.
pub struct Reservation {
    shared: Arc<Shared>,
    bytes: u64,
    _permit: OwnedSemaphorePermit,
}

impl Budget {
    /// `total` is `memory_bytes`; at most a quarter of it (at least one slice) is in transit.
    pub fn new(total: u64, slice_bytes: u64, memory: Arc<MemoryTier>) -> Budget {
        let transit_cap = transit_cap(total, slice_bytes, Semaphore::MAX_PERMITS as u64);
        Budget {
            shared: Arc::new(Shared {
                total,
                transit_cap,
                room: Arc::new(Semaphore::new(transit_cap as usize)),
                held: Mutex::new(Held::default()),
                peak: AtomicU64::new(0),
                memory,
            }),
        }
    }

    /// Waits until `bytes` (at most one slice) fit in transit, then takes them from the tier.
    pub async fn reserve(&self, bytes: u64) -> Reservation {
        // Never more than the semaphore holds (a wait for more would never end), nor than one
        // call takes: the bytes booked are the permits held.
        let bytes = bytes.min(self.shared.transit_cap).min(u64::from(u32::MAX));
        let permit = self
            .shared
            .room
            .clone()
            .acquire_many_owned(bytes as u32)
            .await
            .expect("the budget's semaphore is never closed");
        self.shared
            .adjust(|held| held.transit = held.transit.saturating_add(bytes));
        Reservation {
            shared: self.shared.clone(),
            bytes,
            _permit: permit,
        }
    }

    /// `memory_bytes`.
    pub fn total(&self) -> u64 {
        self.shared.total
    }

    /// Bytes reserved by slices in transit now.
    pub fn in_transit(&self) -> u64 {
        self.shared.lock().transit
    }

    /// Bytes the object index is charged for its heads now.
    pub fn heads(&self) -> u64 {
        self.shared.lock().heads()
    }

    /// The most the object index may be charged for heads: half the budget, so the tier keeps
    /// at least a quarter beside them and the transit.
    pub fn head_room(&self) -> u64 {
        self.shared.total / 2
    }

    /// Charges (positive) or releases (negative) head bytes; a charge shrinks the tier, evicting
    /// slices, before the call returns. Changes may arrive in any order (the count is signed).
    pub fn charge_heads(&self, delta: i64) {
        if delta != 0 {
            self.shared
                .adjust(|held| held.heads = held.heads.saturating_add(delta));
        }
    }

    /// Tier + transit + heads now.
    pub fn accounted(&self) -> u64 {
        let held = self.shared.lock();
        self.shared.memory.weight() + held.total()
    }

    /// Records the current total for [`Budget::peak`] (after the tier took a slice).
    pub fn sample(&self) {
        let now = self.accounted();
        self.shared.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// The most bytes accounted at once so far.
    pub fn peak(&self) -> u64 {
        self.shared
            .peak
            .load(Ordering::Relaxed)
            .max(self.accounted())
    }
}

/// The bytes in transit at once: a quarter of `total` in whole slices (at least one), and at
/// most `max_permits` (`Semaphore::MAX_PERMITS`, 536,870,911 on a 32-bit target), in whole slices
/// too: the semaphore's permits are these bytes, and one past what it holds panicked in
/// `Semaphore::new` (`memory_bytes = "2GiB"` on a 32-bit router; 16 GiB and more was truncated
/// by `as usize` there). The budget's transit share is cut to that: slices in transit wait for
/// room sooner, and tier + transit still stays under `total`. `slice_bytes` (at most 64 MiB) is
/// under `max_permits` on every target.
fn transit_cap(total: u64, slice_bytes: u64, max_permits: u64) -> u64 {
    let slices = (total / 4 / slice_bytes).min(max_permits / slice_bytes);
    slices.max(1) * slice_bytes
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // Plain counters: a poisoned lock still holds consistent values.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn adjust(&self, change: impl FnOnce(&mut Held)) {
        let mut held = self.lock();
        change(&mut held);
        // Shrinking evicts before the reserving fill reads a byte (or the charged head is
        // indexed for long); growing lets the tier use what transit and heads no longer hold.
        self.memory
            .set_capacity(self.total.saturating_sub(held.total()));
        let now = self.memory.weight() + held.total();
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let bytes = self.bytes;
        self.shared
            .adjust(|held| held.transit = held.transit.saturating_sub(bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::memory::Slice;
    use crate::cache::object::{ObjectId, SliceKey};
    use bytes::Bytes;

    fn key(i: u64) -> SliceKey {
        SliceKey {
            object: ObjectId(3),
            generation: 1,
            index: i,
        }
    }

    #[tokio::test]
    async fn transit_is_taken_from_the_tier_and_capped() {
        let slice = 64 * 1024;
        let memory = Arc::new(MemoryTier::new(16 * slice, slice));
        let budget = Budget::new(16 * slice, slice, memory.clone());
        // Fill the tier.
        for i in 0..32 {
            memory.insert(
                key(i),
                Slice::new(vec![Bytes::from(vec![1u8; slice as usize])]),
            );
        }
        assert!(budget.accounted() <= budget.total() + 16 * 128);
        // A quarter of the budget can be in transit; the tier gives up as much.
        let held: Vec<Reservation> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(budget.reserve(slice).await);
            }
            v
        };
        assert_eq!(budget.in_transit(), 4 * slice);
        assert!(
            memory.weight() <= 12 * slice + 16 * 128,
            "{}",
            memory.weight()
        );
        // A fifth reservation waits for room.
        let fifth =
            tokio::time::timeout(std::time::Duration::from_millis(50), budget.reserve(slice)).await;
        assert!(fifth.is_err(), "reserved past the transit cap");
        drop(held);
        assert_eq!(budget.in_transit(), 0);
        // The tier may grow back to the whole budget.
        for i in 100..132 {
            memory.insert(
                key(i),
                Slice::new(vec![Bytes::from(vec![1u8; slice as usize])]),
            );
        }
        assert!(memory.weight() > 12 * slice + 16 * 128);
        assert!(
            budget.peak() <= budget.total() + 16 * 128,
            "{}",
            budget.peak()
        );
    }

    /// The transit share is bytes in a semaphore, which holds at most `Semaphore::MAX_PERMITS`
    /// (536,870,911 on a 32-bit target): `memory_bytes = "2GiB"` there made a quarter one past
    /// it, and `Semaphore::new` panicked. The share is cut to whole slices under what it holds,
    /// and a reservation books exactly the permits it holds.
    #[tokio::test]
    async fn the_transit_share_fits_in_a_semaphore_on_every_target() {
        const MAX_PERMITS_32: u64 = (u32::MAX >> 3) as u64;
        let (mib, gib) = (1u64 << 20, 1u64 << 30);
        // 32-bit arithmetic: 2 GiB and 64 GiB (which `as usize` truncated) stay under the limit.
        for total in [2 * gib, 16 * gib, 64 * gib] {
            let cap = transit_cap(total, mib, MAX_PERMITS_32);
            assert!(cap <= MAX_PERMITS_32, "{total}: {cap}");
            assert_eq!(cap % mib, 0, "{total}: {cap}");
            assert_eq!(cap, 511 * mib, "{total}");
        }
        assert_eq!(transit_cap(gib, mib, MAX_PERMITS_32), gib / 4);
        assert_eq!(transit_cap(64 * gib, 64 * mib, MAX_PERMITS_32), 448 * mib);
        assert_eq!(transit_cap(16 * mib, 16 * mib, MAX_PERMITS_32), 16 * mib);

        // On this target too: a total whose quarter is past `MAX_PERMITS` builds and reserves.
        let slice = 64 * 1024;
        let memory = Arc::new(MemoryTier::new(16 * slice, slice));
        let budget = Budget::new(u64::MAX, slice, memory);
        let cap = budget.shared.transit_cap;
        assert!(cap <= Semaphore::MAX_PERMITS as u64, "{cap}");
        assert_eq!(budget.shared.room.available_permits() as u64, cap);
        let held = budget.reserve(slice).await;
        assert_eq!(budget.in_transit(), slice);
        assert_eq!(
            budget.shared.room.available_permits() as u64,
            cap - slice,
            "the bytes booked are the permits held"
        );
        drop(held);
        assert_eq!(budget.in_transit(), 0);
        assert_eq!(budget.shared.room.available_permits() as u64, cap);
    }

    /// Heads charged by the object index are taken from the tier like transit, and given back.
    #[test]
    fn heads_are_taken_from_the_tier_and_given_back() {
        let slice = 64 * 1024;
        let memory = Arc::new(MemoryTier::new(16 * slice, slice));
        let budget = Budget::new(16 * slice, slice, memory.clone());
        let fill = || {
            for i in 0..32 {
                memory.insert(
                    key(i),
                    Slice::new(vec![Bytes::from(vec![1u8; slice as usize])]),
                );
            }
        };
        fill();
        budget.charge_heads(6 * slice as i64);
        assert_eq!(budget.heads(), 6 * slice);
        assert!(memory.weight() <= 10 * slice, "{}", memory.weight());
        fill();
        assert!(budget.accounted() <= budget.total() + 16 * 128);
        assert!(budget.peak() <= budget.total() + 16 * 128);
        budget.charge_heads(-6 * slice as i64);
        assert_eq!(budget.heads(), 0);
        fill();
        assert!(memory.weight() > 12 * slice, "{}", memory.weight());
    }

    /// Finding: the index passes each change on after releasing its lock, so the release of an
    /// object can reach the budget before its charge; the count clipped the release at zero and
    /// then kept the charge, and the tier lost that much capacity for good. Now the order of
    /// changes does not matter.
    #[test]
    fn a_release_before_its_charge_leaves_nothing_charged() {
        let slice = 64 * 1024;
        let memory = Arc::new(MemoryTier::new(16 * slice, slice));
        let budget = Budget::new(16 * slice, slice, memory.clone());
        budget.charge_heads(-4 * slice as i64);
        assert_eq!(budget.heads(), 0, "below zero counts as nothing");
        budget.charge_heads(4 * slice as i64);
        assert_eq!(budget.heads(), 0);
        for i in 0..32 {
            memory.insert(
                key(i),
                Slice::new(vec![Bytes::from(vec![1u8; slice as usize])]),
            );
        }
        // The whole budget is the tier's again (less its per-entry bookkeeping).
        assert!(memory.weight() > 14 * slice, "{}", memory.weight());
    }
}
