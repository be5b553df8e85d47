//! The `sluice` binary's global allocator: the C library's `malloc`, except for small blocks
//! aligned to more than 16 bytes, which come from pools of 128-byte-aligned blocks of one size.
//!
//! tokio lays out every task in a 128-byte-aligned cell and every socket's registration
//! (`ScheduledIo`) in a 128-byte-aligned block, so each open connection holds two of them. glibc
//! serves such a request (`posix_memalign`) by carving an aligned chunk out of one 160 bytes
//! larger and freeing the two ends; with thousands of idle connections, those ends stay free
//! between the live blocks, about 200 bytes per connection (`malloc_info` on 5,000 idle
//! connections: thousands of free 48- and 240-byte chunks in each worker's heap). Here such
//! blocks are cut from 32 KiB runs of one size, packed with no gap, and a freed block goes back
//! to its size's list for the next one. Runs are never returned: the pools keep room for the
//! most tasks and sockets the process held at once, as a slab would.
//!
//! In the static (musl) build, large blocks also go through a bounded cache of freed ones
//! (`big_blocks`): that build's `malloc` maps and unmaps each of them. glibc's keeps them itself.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;
use std::sync::{Mutex, PoisonError};

use super::big_blocks::{self, BigBlocks};

/// Whether large blocks go through `LARGE` (see the module's notes).
const LARGE_CACHED: bool = cfg!(target_env = "musl");

/// The static build's freed large blocks.
static LARGE: BigBlocks = BigBlocks::new(big_blocks::TOTAL, big_blocks::PER_CLASS);

/// Gives the large blocks kept for reuse back to the system; how many bytes that was.
pub fn release_large() -> usize {
    LARGE.drain()
}

/// Pooled block sizes are multiples of this, which is also the largest alignment pooled.
const GRAIN: usize = 128;
/// Size classes: 128 bytes to 1 KiB.
const CLASSES: usize = 8;
/// Blocks are cut from runs of this size.
const RUN: usize = 32 * 1024;

/// `System`, with over-aligned small blocks pooled (see the module's notes).
#[derive(Debug, Default, Clone, Copy)]
pub struct AlignedPool;

/// A class's free blocks, linked through their first word.
struct FreeList(*mut u8);

// SAFETY: the list is only touched under its mutex; the blocks it links belong to no one else.
unsafe impl Send for FreeList {}

static POOLS: [Mutex<FreeList>; CLASSES] =
    [const { Mutex::new(FreeList(ptr::null_mut())) }; CLASSES];

/// The pool a layout is served from, if any.
#[inline]
fn class_of(layout: Layout) -> Option<usize> {
    if layout.align() <= 16 || layout.align() > GRAIN || layout.size() > GRAIN * CLASSES {
        return None;
    }
    Some(layout.size().max(1).div_ceil(GRAIN) - 1)
}

fn pool_alloc(class: usize) -> *mut u8 {
    let size = (class + 1) * GRAIN;
    let mut list = POOLS[class].lock().unwrap_or_else(PoisonError::into_inner);
    let head = list.0;
    if !head.is_null() {
        // SAFETY: every block on the list is at least a word long and holds the next one's address.
        list.0 = unsafe { head.cast::<*mut u8>().read() };
        return head;
    }
    // SAFETY: RUN and GRAIN are a valid non-zero size and a power-of-two alignment.
    let run = unsafe { System.alloc(Layout::from_size_align_unchecked(RUN, GRAIN)) };
    if run.is_null() {
        return run;
    }
    // The first block is the caller's; the others go on the (empty) list, in address order.
    let blocks = RUN / size;
    let mut next = ptr::null_mut();
    for i in (1..blocks).rev() {
        // SAFETY: block `i` lies inside the run, GRAIN-aligned, and is not yet handed out.
        unsafe {
            let block = run.add(i * size);
            block.cast::<*mut u8>().write(next);
            next = block;
        }
    }
    list.0 = next;
    run
}

/// # Safety
/// `block` came from `pool_alloc(class)` and is no longer used.
unsafe fn pool_free(block: *mut u8, class: usize) {
    let mut list = POOLS[class].lock().unwrap_or_else(PoisonError::into_inner);
    // SAFETY: the block is the caller's to give back, GRAIN-aligned and at least a word long.
    unsafe { block.cast::<*mut u8>().write(list.0) };
    list.0 = block;
}

/// # Safety
/// As `GlobalAlloc::alloc`, for a layout no pool serves.
#[inline]
unsafe fn unpooled_alloc(layout: Layout, zeroed: bool) -> *mut u8 {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match (LARGE_CACHED, zeroed) {
            (true, _) => LARGE.alloc(layout, zeroed),
            (false, false) => System.alloc(layout),
            (false, true) => System.alloc_zeroed(layout),
        }
    }
}

/// # Safety
/// As `GlobalAlloc::dealloc`, for a layout no pool serves.
#[inline]
unsafe fn unpooled_dealloc(ptr: *mut u8, layout: Layout) {
    // SAFETY: the caller's contract, passed on; `unpooled_alloc` chose the same side.
    unsafe {
        if LARGE_CACHED {
            LARGE.dealloc(ptr, layout)
        } else {
            System.dealloc(ptr, layout)
        }
    }
}

// SAFETY: pooled blocks are GRAIN-aligned (which covers every alignment pooled) and at least as
// large as asked; everything else is `System`'s. A layout decides its side the same way on
// allocation and on release, so each block goes back where it came from.
unsafe impl GlobalAlloc for AlignedPool {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match class_of(layout) {
            Some(class) => pool_alloc(class),
            // SAFETY: the caller's contract, passed on.
            None => unsafe { unpooled_alloc(layout, false) },
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match class_of(layout) {
            Some(class) => {
                let p = pool_alloc(class);
                if !p.is_null() {
                    // SAFETY: the block is at least `layout.size()` bytes and ours.
                    unsafe { p.write_bytes(0, layout.size()) };
                }
                p
            }
            // SAFETY: the caller's contract, passed on.
            None => unsafe { unpooled_alloc(layout, true) },
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match class_of(layout) {
            // SAFETY: allocated by `alloc` with this layout, so from this class's pool.
            Some(class) => unsafe { pool_free(ptr, class) },
            // SAFETY: the caller's contract, passed on.
            None => unsafe { unpooled_dealloc(ptr, layout) },
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` forms a valid layout with this alignment.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if class_of(layout).is_none() && class_of(new).is_none() {
            // SAFETY: the caller's contract, passed on; neither side is pooled.
            return unsafe {
                if LARGE_CACHED {
                    LARGE.realloc(ptr, layout, new_size)
                } else {
                    System.realloc(ptr, layout, new_size)
                }
            };
        }
        // SAFETY: as above; the old block stays valid until it is copied and released.
        unsafe {
            let p = self.alloc(new);
            if !p.is_null() {
                ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            p
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_over_aligned_blocks_are_pooled() {
        let l = |size, align| Layout::from_size_align(size, align).unwrap();
        assert_eq!(class_of(l(256, 8)), None);
        assert_eq!(class_of(l(256, 16)), None);
        assert_eq!(class_of(l(24, 32)), Some(0));
        assert_eq!(class_of(l(128, 128)), Some(0));
        assert_eq!(class_of(l(256, 128)), Some(1));
        assert_eq!(class_of(l(257, 128)), Some(2));
        assert_eq!(class_of(l(1024, 128)), Some(7));
        assert_eq!(class_of(l(1025, 128)), None);
        assert_eq!(class_of(l(256, 256)), None);
        assert_eq!(class_of(l(4096, 4096)), None);
    }

    #[test]
    fn blocks_are_aligned_distinct_and_reused() {
        let a = AlignedPool;
        let layout = Layout::from_size_align(200, 128).unwrap();
        // More than one run's worth, so a second run is cut.
        let n = RUN / 256 + 10;
        let blocks: Vec<*mut u8> = (0..n)
            .map(|i| unsafe {
                let p = a.alloc(layout);
                assert!(!p.is_null());
                assert_eq!(p as usize % 128, 0);
                p.write_bytes(i as u8, layout.size());
                p
            })
            .collect();
        let mut sorted = blocks.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), n);
        for (i, &p) in blocks.iter().enumerate() {
            // Nothing overlapped: every block still holds its own bytes.
            let bytes = unsafe { std::slice::from_raw_parts(p, layout.size()) };
            assert!(bytes.iter().all(|&b| b == i as u8));
        }
        let last = *blocks.last().unwrap();
        unsafe { a.dealloc(last, layout) };
        // Other tests may share the pool, but with nothing else freed meanwhile in this class
        // the block just freed is the next one handed out.
        let again = unsafe { a.alloc(layout) };
        assert_eq!(again, last);
        for p in blocks {
            unsafe { a.dealloc(p, layout) };
        }
    }

    #[test]
    fn zeroed_and_grown_blocks_keep_their_bytes() {
        let a = AlignedPool;
        unsafe {
            let layout = Layout::from_size_align(100, 64).unwrap();
            let p = a.alloc_zeroed(layout);
            assert!(std::slice::from_raw_parts(p, 100).iter().all(|&b| b == 0));
            p.write_bytes(7, 100);
            // Pool to pool, pool to `System`, and back.
            let p = a.realloc(p, layout, 700);
            assert_eq!(p as usize % 64, 0);
            assert!(std::slice::from_raw_parts(p, 100).iter().all(|&b| b == 7));
            let big = Layout::from_size_align(700, 64).unwrap();
            let p = a.realloc(p, big, 5000);
            assert!(std::slice::from_raw_parts(p, 100).iter().all(|&b| b == 7));
            let huge = Layout::from_size_align(5000, 64).unwrap();
            let p = a.realloc(p, huge, 64);
            assert!(std::slice::from_raw_parts(p, 64).iter().all(|&b| b == 7));
            a.dealloc(p, Layout::from_size_align(64, 64).unwrap());
        }
    }
}
