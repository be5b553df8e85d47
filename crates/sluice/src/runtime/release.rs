//! Memory a burst leaves free goes back to the system once the burst is over
//! (`server.release_memory`): after a second with no new connection and no new request, following
//! one with some, the C library is asked to hand back the free pages inside its heaps.
//!
//! Why: glibc returns memory to the system only from the top of a heap. A burst of new
//! connections allocates and frees request state and buffers (an HTTP/2 connection's 8, 16 and
//! 4 KiB codec buffers among them) between the small blocks of the connections that stay open,
//! and the pages of those freed chunks stay resident: with 5,000 connections left idle after one
//! request each, 2.5 MB of the process's memory (HTTP/1.1) and 5.4 MB (h2c) were such pages,
//! half a KiB and one KiB per connection. `malloc_trim(0)` walks the heaps' free chunks and gives
//! back every whole page inside them (`madvise`); a page used again later costs a page fault.
//! A process that never pauses is never trimmed, and its free memory is reused by its own traffic.
//!
//! With glibc's allocator, and in the static (musl) build, where what is released is the large
//! blocks kept for reuse (`aligned_pool`, `big_blocks`): that build's `malloc` returns the rest
//! itself or never. jemalloc (the `jemalloc` feature) returns its free pages itself.

use std::time::Duration;

/// How long the process must have started nothing new before its free memory is released.
const QUIET: Duration = Duration::from_secs(1);

/// Releases free memory after each burst, for as long as it runs. `work` counts what the process
/// has started (connections accepted, requests begun); it only ever grows.
pub async fn run(work: impl Fn() -> u64) {
    after_bursts(work, || async {
        // Off the workers: it holds each heap's lock while it walks it.
        if let Ok(Some((took, large))) = tokio::task::spawn_blocking(trim).await {
            tracing::debug!(?took, large, "free memory released after a burst");
        }
    })
    .await
}

/// Gives back the large blocks that starting up left kept for reuse (the static build; 80 KiB
/// with the callgrind harness's config); the heaps' free pages are left to the first burst.
pub fn after_start() {
    let large = super::aligned_pool::release_large();
    tracing::debug!(large, "large free blocks released after the start");
}

/// Calls `release` once after each burst of `work`: at the first quiet second that follows it.
async fn after_bursts<F: std::future::Future<Output = ()>>(
    work: impl Fn() -> u64,
    mut release: impl FnMut() -> F,
) {
    let mut seen = work();
    let mut dirty = false;
    let mut tick = tokio::time::interval(QUIET);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = work();
        if now != seen {
            seen = now;
            dirty = true;
        } else if dirty {
            dirty = false;
            release().await;
        }
    }
}

/// Whether this build can release memory this way.
pub fn supported() -> bool {
    cfg!(all(
        target_os = "linux",
        any(target_env = "gnu", target_env = "musl"),
        not(feature = "jemalloc")
    ))
}

/// Hands the heaps' free pages back; how long it took, and the bytes of large blocks given back.
fn trim() -> Option<(Duration, usize)> {
    if !supported() {
        return None;
    }
    let start = std::time::Instant::now();
    let large = super::aligned_pool::release_large();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only rearranges the allocator's own free memory.
    unsafe {
        libc::malloc_trim(0);
    }
    Some((start.elapsed(), large))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// Released once after a quiet second that follows work, once per burst, never while busy.
    #[tokio::test(start_paused = true)]
    async fn released_once_after_each_burst() {
        let work = Arc::new(AtomicU64::new(0));
        let released = Arc::new(AtomicU64::new(0));
        let task = {
            let (work, released) = (work.clone(), released.clone());
            tokio::spawn(after_bursts(
                move || work.load(Ordering::Relaxed),
                move || {
                    released.fetch_add(1, Ordering::Relaxed);
                    async {}
                },
            ))
        };
        let count = || released.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(count(), 0, "nothing was done: nothing to release");
        // Busy for five seconds: new work every 300 ms.
        for _ in 0..16 {
            work.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert_eq!(count(), 0, "released while busy");
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        assert_eq!(count(), 1);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(count(), 1, "released again with nothing new");
        work.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        assert_eq!(count(), 2);
        task.abort();
    }

    #[tokio::test]
    async fn a_trim_returns() {
        if supported() {
            assert!(trim().is_some());
        }
    }
}
