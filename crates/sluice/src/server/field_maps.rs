//! A per-thread stock of emptied field maps for the HTTP/1.1 fast path's heads: a request's map
//! and its upstream response's map each take one back instead of allocating their own. A map for
//! a dozen fields holds 1.2 KiB of entries, more than the allocator keeps per thread, so making
//! and freeing one per head took the allocator's slow path both ways.

use std::cell::RefCell;

use http::HeaderMap;

/// Maps kept per thread at most (about the heads a thread has in flight at once).
const KEEP: usize = 16;
/// A map that grew to hold more fields than this (an unusual head) is freed, not kept.
const MAX_KEPT: usize = 24;

thread_local! {
    static STOCK: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
}

/// An empty map with room for `capacity` fields: one from the thread's stock when it has one.
pub fn take(capacity: usize) -> HeaderMap {
    match STOCK.try_with(|s| s.borrow_mut().pop()).ok().flatten() {
        Some(mut map) => {
            map.reserve(capacity);
            map
        }
        None => HeaderMap::with_capacity(capacity),
    }
}

/// Gives `map` back to the thread's stock, emptied (its fields dropped now), unless it grew past
/// `MAX_KEPT` fields or the stock is full.
pub fn give(mut map: HeaderMap) {
    if map.capacity() > MAX_KEPT {
        return;
    }
    map.clear();
    let _ = STOCK.try_with(|s| {
        let mut stock = s.borrow_mut();
        if stock.len() < KEEP {
            stock.push(map);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HeaderValue, ACCEPT, HOST};

    #[test]
    fn maps_come_back_empty_and_the_stock_is_bounded() {
        let mut a = take(8);
        a.insert(HOST, HeaderValue::from_static("x"));
        a.append(ACCEPT, HeaderValue::from_static("*/*"));
        give(a);
        let mut b = take(8);
        assert!(b.is_empty());
        assert!(b.capacity() >= 8);
        // A reused map keeps the order of what is put in it.
        b.insert(ACCEPT, HeaderValue::from_static("a"));
        b.insert(HOST, HeaderValue::from_static("h"));
        let names: Vec<_> = b.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["accept", "host"]);
        // One that grew is freed.
        let mut big = take(8);
        big.reserve(MAX_KEPT * 2);
        give(big);
        give(b);
        let all: Vec<_> = (0..KEEP + 4).map(|_| take(8)).collect();
        all.into_iter().for_each(give);
        assert_eq!(STOCK.with(|s| s.borrow().len()), KEEP);
    }
}
