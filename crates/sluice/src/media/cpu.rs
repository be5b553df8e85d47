//! CPU-heavy media work (decryption, remuxing, parsing and rewriting large answers) on the
//! blocking pool, at most one job per core at once.
//!
//! A job runs to its end once started, even when the request that asked for it is gone (a
//! blocking thread cannot be stopped), so the jobs running are bounded here, not by the requests
//! in flight: a client that resets each request once its job has started would otherwise start
//! up to the pool's 512 threads, each holding its segment, and starve the pool's other users
//! (the disk tier, the system resolver). Waiting for a place is an ordinary await, so a request
//! dropped before its job starts never starts it.

use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;
use tokio::task::JoinError;

/// Places for jobs: one per core the process may use.
fn places() -> &'static Arc<Semaphore> {
    static PLACES: OnceLock<Arc<Semaphore>> = OnceLock::new();
    PLACES.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Arc::new(Semaphore::new(cores))
    })
}

/// Runs `job` on the blocking pool once a place is free; the place is held until the job ends.
pub async fn run<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, JoinError> {
    // The semaphore is never closed.
    let place = Arc::clone(places())
        .acquire_owned()
        .await
        .expect("the CPU job places are never closed");
    tokio::task::spawn_blocking(move || {
        let _place = place;
        job()
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// However many jobs are asked for at once, no more than the places run together, and a
    /// request dropped while it waits never runs its job.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_run_at_most_one_per_core_at_once() {
        let cores = places().available_permits();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let jobs: Vec<_> = (0..cores * 4 + 3)
            .map(|_| {
                let (running, most) = (Arc::clone(&running), Arc::clone(&most));
                tokio::spawn(run(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    running.fetch_sub(1, Ordering::SeqCst);
                }))
            })
            .collect();
        for j in jobs {
            j.await.unwrap().unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= cores, "{most:?} > {cores}");
        // Every place is held for a while: a dropped waiter never runs.
        // (Other tests of this binary may hold places for a moment: waited for, not assumed.)
        let held = Arc::clone(places())
            .acquire_many_owned(cores as u32)
            .await
            .unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        let waiter = tokio::spawn(run(move || {
            r.fetch_add(1, Ordering::SeqCst);
        }));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waiter.abort();
        drop(held);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }
}
