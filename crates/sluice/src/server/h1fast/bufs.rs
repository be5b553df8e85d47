//! A per-thread stock of request-head read buffers: a keep-alive connection's next request takes
//! one back instead of allocating (and then freeing) its own, and an idle connection holds none.

use std::cell::RefCell;

/// The size of a head buffer as first taken; one that grew past it (a long head) is not kept.
pub(super) const SIZE: usize = 4096;
/// Buffers kept per thread at most: as many as connections a thread has mid-request at once,
/// about; above that they are freed (at most 128 KiB per thread kept).
const KEEP: usize = 32;

thread_local! {
    static STOCK: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer with room for `SIZE` bytes.
pub(super) fn take() -> Vec<u8> {
    STOCK
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Vec::with_capacity(SIZE))
}

/// Gives `buf` back to the thread's stock (emptied), unless it grew or the stock is full.
pub(super) fn give(mut buf: Vec<u8>) {
    if buf.capacity() != SIZE {
        return;
    }
    buf.clear();
    let _ = STOCK.try_with(|s| {
        let mut stock = s.borrow_mut();
        if stock.len() < KEEP {
            stock.push(buf);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_empty_and_the_stock_is_bounded() {
        let mut a = take();
        assert_eq!((a.len(), a.capacity()), (0, SIZE));
        a.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let at = a.as_ptr();
        give(a);
        let b = take();
        assert_eq!((b.len(), b.as_ptr()), (0, at));
        // A buffer that grew is freed, not kept.
        let mut big = take();
        big.reserve(SIZE * 2);
        give(big);
        give(b);
        let all: Vec<_> = (0..KEEP + 8).map(|_| take()).collect();
        all.into_iter().for_each(give);
        assert_eq!(STOCK.with(|s| s.borrow().len()), KEEP);
    }
}
