//! Freed large blocks kept for reuse, for the static (musl) build's allocator.
//!
//! The static binary's `malloc` (zig's, docs/decisions/allocator.md, "The static build") maps
//! every block larger than 32 KiB with `mmap` and unmaps it on `free`. A large body moving through
//! user space allocates and frees such blocks all the time (hyper's ~400 KiB read buffers, the
//! cache's 1 MiB slices, TLS relays), so every byte of it went through freshly mapped memory: a
//! page fault per 4 KiB and two system calls per block. glibc's `malloc` keeps freed blocks in its
//! heap instead. This is the same idea with a bound: sizes from 32 KiB to 8 MiB are rounded up to
//! one of four classes per doubling (at most 25 % more), a freed block goes on its class's list
//! (last in, first out, linked through its first word), and the next request of that class takes
//! it. At most `PER_CLASS` bytes per class and `TOTAL` bytes in all are kept; a block beyond
//! either goes back to the system at once, and `drain` gives back everything (after a burst,
//! `runtime::release`).
//!
//! Over-aligned blocks (more than 16 bytes) and sizes outside the classes pass straight through
//! to `System`. Each block is allocated from `System` at its class's size, so a layout
//! maps to the same class on allocation and on release and the block always goes back whole.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;
use std::sync::{Mutex, PoisonError};

/// Requests above this go to a class: zig's `malloc` maps anything whose size plus its 16-byte
/// header exceeds 32 KiB.
const SMALL_MAX: usize = 32 * 1024 - 16;
/// The smallest class; classes are this, then four per doubling.
const FIRST: usize = 32 * 1024;
/// The largest class; larger requests pass through.
const LAST: usize = 8 * 1024 * 1024;
/// Classes: 32 KiB, then 40, 48, 56, 64 KiB, 80 KiB, … up to 8 MiB.
const CLASSES: usize = 1 + 4 * (LAST.ilog2() - FIRST.ilog2()) as usize;
/// The largest alignment served from the classes (`malloc`'s own).
const MAX_ALIGN: usize = 16;

/// Bytes kept in all classes together, at most. Cold 7 MB objects through a 32 MiB memory tier
/// (every miss evicts): 16 MiB and 4 MiB per class took page faults per miss from ~4,450 to ~150
/// and held ~9 MB while busy; 32 and 8 MiB, ~125 and ~13 MB (docs/decisions/allocator.md).
pub const TOTAL: usize = 16 * 1024 * 1024;
/// Bytes kept in any one class, at most: four 1 MiB cache slices, nine of hyper's 448 KiB read
/// buffers, sixty-four 64 KiB blocks.
pub const PER_CLASS: usize = 4 * 1024 * 1024;

/// The class of a request, if it has one.
#[inline]
pub fn class_of(layout: Layout) -> Option<usize> {
    let size = layout.size();
    // Small blocks first: nearly every request, one comparison.
    if size <= SMALL_MAX || size > LAST || layout.align() > MAX_ALIGN {
        return None;
    }
    if size <= FIRST {
        return Some(0);
    }
    // `size` lies in (2^k, 2^(k+1)]; that range is cut into four steps of 2^(k-2).
    let k = (size - 1).ilog2();
    let step = 1usize << (k - 2);
    let quarter = (size - (1usize << k)).div_ceil(step);
    Some(4 * (k - FIRST.ilog2()) as usize + quarter)
}

/// The size of every block in a class.
pub fn class_size(class: usize) -> usize {
    if class == 0 {
        return FIRST;
    }
    let k = FIRST.ilog2() as usize + (class - 1) / 4;
    let quarter = (class - 1) % 4 + 1;
    (1usize << k) + quarter * (1usize << (k - 2))
}

/// The cache: one free list per class, and the bounds.
pub struct BigBlocks {
    lists: Mutex<Lists>,
    total: usize,
    per_class: usize,
}

struct Lists {
    heads: [*mut u8; CLASSES],
    /// Blocks on each list.
    counts: [usize; CLASSES],
    /// Bytes on all lists.
    bytes: usize,
}

// SAFETY: the lists are only touched under their mutex; the blocks they link belong to no one else.
unsafe impl Send for Lists {}

impl BigBlocks {
    pub const fn new(total: usize, per_class: usize) -> BigBlocks {
        BigBlocks {
            lists: Mutex::new(Lists {
                heads: [ptr::null_mut(); CLASSES],
                counts: [0; CLASSES],
                bytes: 0,
            }),
            total,
            per_class,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A kept block of `class`, if there is one.
    fn take(&self, class: usize) -> *mut u8 {
        let mut lists = self.lock();
        let head = lists.heads[class];
        if !head.is_null() {
            // SAFETY: every block on a list is at least a word long and holds the next one's address.
            lists.heads[class] = unsafe { head.cast::<*mut u8>().read() };
            lists.counts[class] -= 1;
            lists.bytes -= class_size(class);
        }
        head
    }

    /// Keeps `block` of `class` if the bounds allow; whether it was kept.
    ///
    /// # Safety
    /// `block` is a free block of `class_size(class)` bytes from `System`, no longer used.
    unsafe fn keep(&self, block: *mut u8, class: usize) -> bool {
        let size = class_size(class);
        let mut lists = self.lock();
        if lists.bytes + size > self.total || (lists.counts[class] + 1) * size > self.per_class {
            return false;
        }
        // SAFETY: the block is the caller's to give, word-aligned and far longer than a word.
        unsafe { block.cast::<*mut u8>().write(lists.heads[class]) };
        lists.heads[class] = block;
        lists.counts[class] += 1;
        lists.bytes += size;
        true
    }

    /// Bytes kept now.
    pub fn kept(&self) -> usize {
        self.lock().bytes
    }

    /// Gives every kept block back to the system; how many bytes that was.
    pub fn drain(&self) -> usize {
        let (heads, bytes) = {
            let mut lists = self.lock();
            let heads = std::mem::replace(&mut lists.heads, [ptr::null_mut(); CLASSES]);
            lists.counts = [0; CLASSES];
            (heads, std::mem::take(&mut lists.bytes))
        };
        for (class, mut block) in heads.into_iter().enumerate() {
            while !block.is_null() {
                // SAFETY: the lists' blocks came from `System` at their class's size with an
                // alignment of at most MAX_ALIGN, which `System` ignores on release; they are
                // now off every list.
                unsafe {
                    let next = block.cast::<*mut u8>().read();
                    System.dealloc(block, class_layout(class));
                    block = next;
                }
            }
        }
        bytes
    }

    /// `GlobalAlloc::alloc` (or `alloc_zeroed`).
    ///
    /// # Safety
    /// As `GlobalAlloc::alloc`.
    #[inline]
    pub unsafe fn alloc(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        match class_of(layout) {
            Some(class) => self.alloc_in(class, layout, zeroed),
            // SAFETY: the caller's contract, passed on.
            None => unsafe { system_alloc(layout, zeroed) },
        }
    }

    /// A block of `class` for `layout`: a kept one, or a new one of the class's size.
    #[inline(never)]
    fn alloc_in(&self, class: usize, layout: Layout, zeroed: bool) -> *mut u8 {
        let block = self.take(class);
        if block.is_null() {
            // SAFETY: a class layout is valid and non-zero.
            return unsafe { system_alloc(class_layout(class), zeroed) };
        }
        if zeroed {
            // SAFETY: the block is ours and at least `layout.size()` bytes long.
            unsafe { block.write_bytes(0, layout.size()) };
        }
        block
    }

    /// `GlobalAlloc::dealloc`.
    ///
    /// # Safety
    /// As `GlobalAlloc::dealloc`, for a block from this cache's `alloc` or `realloc`.
    #[inline]
    pub unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        match class_of(layout) {
            // SAFETY: as this function's.
            Some(class) => unsafe { self.dealloc_in(class, block) },
            // SAFETY: the caller's contract, passed on.
            None => unsafe { System.dealloc(block, layout) },
        }
    }

    /// # Safety
    /// `block` was allocated for a layout of `class` by this cache and is no longer used.
    #[inline(never)]
    unsafe fn dealloc_in(&self, class: usize, block: *mut u8) {
        // SAFETY: a block of this class was allocated at the class's size.
        unsafe {
            if !self.keep(block, class) {
                System.dealloc(block, class_layout(class));
            }
        }
    }

    /// `GlobalAlloc::realloc`.
    ///
    /// # Safety
    /// As `GlobalAlloc::realloc`, for a block from this cache's `alloc` or `realloc`.
    #[inline]
    pub unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` forms a valid layout with this alignment.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class_of(layout), class_of(new)) {
            // SAFETY: the caller's contract, passed on.
            (None, None) => unsafe { System.realloc(block, layout, new_size) },
            // SAFETY: as this function's.
            (from, to) => unsafe { self.realloc_classes(block, layout, new_size, from, to) },
        }
    }

    /// `realloc` where either side has a class (`from`, `to`: the old and new layouts' classes).
    ///
    /// # Safety
    /// As `realloc`.
    #[inline(never)]
    unsafe fn realloc_classes(
        &self,
        block: *mut u8,
        layout: Layout,
        new_size: usize,
        from: Option<usize>,
        to: Option<usize>,
    ) -> *mut u8 {
        if from.is_some() && from == to {
            // The block is already its class's size.
            return block;
        }
        if let Some(class) = to {
            let kept = self.take(class);
            if !kept.is_null() {
                // SAFETY: both blocks are live and distinct; the old one is released once copied.
                unsafe {
                    ptr::copy_nonoverlapping(block, kept, layout.size().min(new_size));
                    self.dealloc(block, layout);
                }
                return kept;
            }
        }
        // Otherwise the system's `realloc` on the sizes the blocks really have (it may remap
        // instead of copying); the result has the size its new layout's class (or none) implies.
        let actual = from.map_or(layout, class_layout);
        let new_actual = to.map_or(new_size, class_size);
        // SAFETY: `block` was allocated by `System` with `actual`.
        unsafe { System.realloc(block, actual, new_actual) }
    }
}

fn class_layout(class: usize) -> Layout {
    // The sizes are powers of two and their quarters, far below `isize::MAX`.
    Layout::from_size_align(class_size(class), MAX_ALIGN).expect("class layout")
}

/// # Safety
/// As `GlobalAlloc::alloc`.
#[inline]
unsafe fn system_alloc(layout: Layout, zeroed: bool) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe {
        if zeroed {
            System.alloc_zeroed(layout)
        } else {
            System.alloc(layout)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1024;
    const MIB: usize = 1024 * KIB;

    fn l(size: usize) -> Layout {
        Layout::from_size_align(size, 8).unwrap()
    }

    #[test]
    fn classes_round_up_by_at_most_a_quarter() {
        assert_eq!(class_of(l(SMALL_MAX)), None);
        assert_eq!(class_of(l(SMALL_MAX + 1)), Some(0));
        assert_eq!(class_of(l(32 * KIB)), Some(0));
        assert_eq!(class_of(l(32 * KIB + 1)), Some(1));
        assert_eq!(class_size(1), 40 * KIB);
        assert_eq!(class_of(l(64 * KIB)), Some(4));
        assert_eq!(class_size(4), 64 * KIB);
        assert_eq!(class_size(class_of(l(MIB)).unwrap()), MIB);
        // hyper's largest read buffer.
        assert_eq!(class_size(class_of(l(417_792)).unwrap()), 448 * KIB);
        assert_eq!(class_of(l(LAST)), Some(CLASSES - 1));
        assert_eq!(class_size(CLASSES - 1), LAST);
        assert_eq!(class_of(l(LAST + 1)), None);
        assert_eq!(
            class_of(Layout::from_size_align(MIB, 16).unwrap()),
            Some(20)
        );
        assert_eq!(class_of(Layout::from_size_align(MIB, 32).unwrap()), None);
        assert_eq!(class_of(Layout::from_size_align(MIB, 4096).unwrap()), None);
        // Around every class edge: the edge is in the class, one byte more in the next, and no
        // class is more than a quarter larger than what it serves.
        for class in 0..CLASSES {
            let edge = class_size(class);
            assert_eq!(class_of(l(edge)), Some(class), "{edge}");
            assert_eq!(class_of(l(edge - 1)), Some(class), "{edge}");
            if class + 1 < CLASSES {
                assert_eq!(class_of(l(edge + 1)), Some(class + 1), "{edge}");
                assert!(class_size(class + 1) * 4 <= (edge + 1) * 5, "{edge}");
            }
            if class > 0 {
                assert!(class_size(class - 1) < edge);
            }
        }
    }

    #[test]
    fn freed_blocks_are_reused_last_in_first_out() {
        let cache = BigBlocks::new(TOTAL, PER_CLASS);
        unsafe {
            let a = cache.alloc(l(MIB), false);
            let b = cache.alloc(l(MIB - 100), false);
            assert!(!a.is_null() && !b.is_null() && a != b);
            a.write_bytes(1, MIB);
            cache.dealloc(a, l(MIB));
            cache.dealloc(b, l(MIB - 100));
            assert_eq!(cache.kept(), 2 * MIB);
            // Any size of the class takes the block freed last.
            assert_eq!(cache.alloc(l(900 * KIB), false), b);
            assert_eq!(cache.alloc(l(MIB), false), a);
            assert_eq!(cache.kept(), 0);
            // Another class does not take them.
            cache.dealloc(a, l(MIB));
            let c = cache.alloc(l(512 * KIB), false);
            assert_ne!(c, a);
            assert_eq!(cache.kept(), MIB);
            cache.dealloc(b, l(MIB));
            cache.dealloc(c, l(512 * KIB));
            assert_eq!(cache.drain(), 2 * MIB + 512 * KIB);
            assert_eq!(cache.kept(), 0);
        }
    }

    #[test]
    fn the_bounds_hold() {
        let cache = BigBlocks::new(3 * MIB, 2 * MIB);
        unsafe {
            let blocks: Vec<*mut u8> = (0..4).map(|_| cache.alloc(l(MIB), false)).collect();
            for &b in &blocks {
                cache.dealloc(b, l(MIB));
            }
            // Two of four kept: the class's bound.
            assert_eq!(cache.kept(), 2 * MIB);
            let halves: Vec<*mut u8> = (0..4).map(|_| cache.alloc(l(512 * KIB), false)).collect();
            for &b in &halves {
                cache.dealloc(b, l(512 * KIB));
            }
            // Two more halves: the total's bound.
            assert_eq!(cache.kept(), 3 * MIB);
            // Over-aligned and larger blocks pass through, and are not kept.
            let big = Layout::from_size_align(LAST + 1, 8).unwrap();
            let p = cache.alloc(big, false);
            cache.dealloc(p, big);
            let aligned = Layout::from_size_align(64 * KIB, 4096).unwrap();
            let p = cache.alloc(aligned, false);
            assert_eq!(p as usize % 4096, 0);
            cache.dealloc(p, aligned);
            assert_eq!(cache.drain(), 3 * MIB);
        }
    }

    #[test]
    fn reused_blocks_come_back_zeroed_when_asked() {
        let cache = BigBlocks::new(TOTAL, PER_CLASS);
        unsafe {
            let p = cache.alloc(l(200 * KIB), false);
            p.write_bytes(0xAB, 200 * KIB);
            cache.dealloc(p, l(200 * KIB));
            let q = cache.alloc(l(220 * KIB), true);
            assert_eq!(q, p);
            assert!(std::slice::from_raw_parts(q, 220 * KIB)
                .iter()
                .all(|&b| b == 0));
            cache.dealloc(q, l(220 * KIB));
            cache.drain();
        }
    }

    #[test]
    fn realloc_up_and_down_keeps_the_bytes() {
        let cache = BigBlocks::new(TOTAL, PER_CLASS);
        let fill = |p: *mut u8, n: usize| unsafe {
            for i in 0..n {
                p.add(i).write(i as u8 ^ (i >> 8) as u8);
            }
        };
        let check = |p: *mut u8, n: usize| unsafe {
            for i in 0..n {
                assert_eq!(p.add(i).read(), i as u8 ^ (i >> 8) as u8, "byte {i}");
            }
        };
        unsafe {
            // Small to a class (no kept block: the system's realloc).
            let p = cache.alloc(l(1000), false);
            fill(p, 1000);
            let p = cache.realloc(p, l(1000), 100 * KIB);
            check(p, 1000);
            fill(p, 100 * KIB);
            // Within its class: the same block.
            let q = cache.realloc(p, l(100 * KIB), 110 * KIB);
            assert_eq!(q, p);
            check(q, 100 * KIB);
            // Up a class with a kept block of the new class ready: that block.
            let spare = cache.alloc(l(MIB), false);
            cache.dealloc(spare, l(MIB));
            fill(q, 110 * KIB);
            let r = cache.realloc(q, l(110 * KIB), MIB);
            assert_eq!(r, spare);
            check(r, 110 * KIB);
            // The old block was kept.
            assert_eq!(cache.kept(), class_size(class_of(l(110 * KIB)).unwrap()));
            fill(r, MIB);
            // Up without a kept block, past the classes, and back down.
            let s = cache.realloc(r, l(MIB), 3 * MIB);
            check(s, MIB);
            let t = cache.realloc(s, l(3 * MIB), LAST + 4096);
            check(t, MIB);
            let u = cache.realloc(t, l(LAST + 4096), 600 * KIB);
            check(u, 600 * KIB);
            let v = cache.realloc(u, l(600 * KIB), 40);
            check(v, 40);
            cache.dealloc(v, l(40));
            cache.drain();
        }
    }
}
