//! CPU-heavy media work (decryption, remuxing, parsing and rewriting large answers) on the
//! blocking pool, in three lanes of a few jobs each.
//!
//! A job runs to its end once started, even when the request that asked for it is gone (a
//! blocking thread cannot be stopped), so the jobs running are bounded here, not by the requests
//! in flight: a client that resets each request once its job has started would otherwise start
//! up to the pool's 512 threads, each holding its segment, and starve the pool's other users
//! (the disk tier, the system resolver). Waiting for a place is an ordinary await, so a request
//! dropped before its job starts never starts it.
//!
//! Segments (decryption, remux), manifests (playlists and MPDs a player reloads) and whole
//! documents (guides, merged lists, provider answers) have a lane each: seconds of work on a
//! 256 MiB guide never queue a live segment behind them, and a backlog of segment jobs never
//! holds up the reload a player needs to learn the next segments. Each lane has a place per
//! core the process may use, and at least two (`available_parallelism` is 1 under a CPU quota
//! of a core or less).

use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;
use tokio::task::JoinError;

/// Which lane a job waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A segment's decryption or remux.
    Segment,
    /// What a player reloads to learn the next segments: a large playlist's rewrite, an MPD's
    /// parse or rewrite, a media playlist built from an MPD.
    Manifest,
    /// A whole document: an EPG guide, a playlist merge, an Xtream answer.
    Document,
}

/// Places in each lane.
fn places_per_lane() -> usize {
    static PLACES: OnceLock<usize> = OnceLock::new();
    *PLACES.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .max(2)
    })
}

fn lane(which: Lane) -> &'static Arc<Semaphore> {
    static SEGMENT: OnceLock<Arc<Semaphore>> = OnceLock::new();
    static MANIFEST: OnceLock<Arc<Semaphore>> = OnceLock::new();
    static DOCUMENT: OnceLock<Arc<Semaphore>> = OnceLock::new();
    let cell = match which {
        Lane::Segment => &SEGMENT,
        Lane::Manifest => &MANIFEST,
        Lane::Document => &DOCUMENT,
    };
    cell.get_or_init(|| Arc::new(Semaphore::new(places_per_lane())))
}

/// Runs `job` on the blocking pool once a place in `which` is free; the place is held until the
/// job ends.
pub async fn run<T: Send + 'static>(
    which: Lane,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, JoinError> {
    let place = Arc::clone(lane(which))
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

    /// However many jobs are asked for at once, no more than a lane's places run together; a
    /// full lane does not hold the others up; and a request dropped while it waits never runs
    /// its job.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_run_a_few_at_once_per_lane() {
        let places = places_per_lane();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let jobs: Vec<_> = (0..places * 4 + 3)
            .map(|_| {
                let (running, most) = (Arc::clone(&running), Arc::clone(&most));
                tokio::spawn(run(Lane::Document, move || {
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
        assert!(most.load(Ordering::SeqCst) <= places, "{most:?} > {places}");
        // The document and segment lanes held whole (other tests of this binary may hold a place
        // for a moment: waited for, not assumed): a manifest job still runs, a waiting document
        // job dropped never does.
        let held = Arc::clone(lane(Lane::Document))
            .acquire_many_owned(places as u32)
            .await
            .unwrap();
        let segments = Arc::clone(lane(Lane::Segment))
            .acquire_many_owned(places as u32)
            .await
            .unwrap();
        assert_eq!(run(Lane::Manifest, || 7).await.unwrap(), 7);
        drop(segments);
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        let waiter = tokio::spawn(run(Lane::Document, move || {
            r.fetch_add(1, Ordering::SeqCst);
        }));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waiter.abort();
        drop(held);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }
}
