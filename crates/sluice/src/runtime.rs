//! The runtime model (`server.runtime`): one work-stealing runtime for everything, or one
//! current-thread runtime per core, each accepting on its own `SO_REUSEPORT` listener and keeping its
//! own reverse proxy upstream pools. Also which per-core worker (or the cache's fill lane) the
//! calling thread is, which picks its upstream pool.

use std::cell::Cell;

use serde::{Deserialize, Serialize};

/// `server.runtime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeModel {
    /// One multi-threaded tokio runtime; idle workers steal tasks from busy ones.
    #[default]
    WorkStealing,
    /// One current-thread runtime per core, each with its own listening sockets
    /// (`SO_REUSEPORT`, the kernel spreads connections) and its own upstream pools: a connection
    /// and its upstream requests stay on one thread. Process-wide state (cache, IPTV hubs,
    /// metrics, upstream groups and their health checks) is shared.
    PerCore,
}

/// How many threads serve connections: `server.threads`, or one per available core when 0.
pub fn threads(configured: usize) -> usize {
    match configured {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// How many copies of each reverse proxy upstream pool to keep: one per per-core runtime, or one
/// shared by all the work-stealing workers; plus one, the last, for the cache's fill lane (its
/// connections are registered with its own runtime and must stay there).
pub fn pools(model: RuntimeModel, configured_threads: usize) -> usize {
    let serving = match model {
        RuntimeModel::WorkStealing => 1,
        RuntimeModel::PerCore => threads(configured_threads),
    };
    serving + 1
}

/// Which of `count` pools (as built from [`pools`]) the calling thread uses: the last on the
/// fill lane, its worker's among the others elsewhere.
pub fn pool(count: usize) -> usize {
    if count <= 1 {
        return 0;
    }
    if in_fill_lane() {
        return count - 1;
    }
    worker() % (count - 1)
}

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
    static FILL_LANE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as the cache's fill lane (`cache::lane`).
pub fn enter_fill_lane() {
    FILL_LANE.with(|l| l.set(true));
}

/// Whether the calling thread is the cache's fill lane.
pub fn in_fill_lane() -> bool {
    FILL_LANE.with(Cell::get)
}

/// Marks the calling thread as per-core worker `index` (its pools are `index`).
pub fn enter_worker(index: usize) {
    WORKER.with(|w| w.set(index));
}

/// The per-core worker the calling thread is (0 outside per-core runtimes).
pub fn worker() -> usize {
    WORKER.with(Cell::get)
}

/// Tasks a work-stealing worker runs between looks at its runtime's shared (inject) queue, where
/// wakes from other threads land: the cache's fill lane wakes the readers of a fill from its own
/// thread. tokio tunes this to ~200 µs of polls, but from an average that many tiny polls pull
/// down, up to 127 tasks; a burst of 100 requests being read then kept the first readers of a
/// fill waiting behind the whole burst. Looking costs one atomic load when the queue is empty.
pub const SHARED_QUEUE_INTERVAL: u32 = 4;

/// Builds the runtime `main` runs on: under per-core, it runs only the control plane (signals,
/// reload, health checks, the TCP front end), so it gets one worker thread; the per-core runtimes
/// are started by the server.
#[cfg(feature = "multi-thread")]
pub fn main_runtime(
    model: RuntimeModel,
    configured_threads: usize,
) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .enable_all()
        .global_queue_interval(SHARED_QUEUE_INTERVAL);
    match model {
        RuntimeModel::WorkStealing => {
            builder.worker_threads(threads(configured_threads));
        }
        RuntimeModel::PerCore => {
            builder.worker_threads(1);
        }
    }
    builder.build()
}

/// Without `multi-thread` (the router build) `main` runs on one current-thread runtime: under
/// `work-stealing` it serves everything (a gateway's work is a few sockets, and every extra worker
/// thread costs a router memory and wake-ups); under `per-core` it runs the control plane and the
/// server starts the per-core runtimes beside it, as in the full build.
#[cfg(not(feature = "multi-thread"))]
pub fn main_runtime(
    _model: RuntimeModel,
    _configured_threads: usize,
) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_follow_the_model() {
        assert_eq!(pools(RuntimeModel::WorkStealing, 8), 2);
        assert_eq!(pools(RuntimeModel::PerCore, 3), 4);
        assert!(pools(RuntimeModel::PerCore, 0) >= 2);
        let m: RuntimeModel = serde_json::from_str("\"per-core\"").unwrap();
        assert_eq!(m, RuntimeModel::PerCore);
    }

    #[test]
    fn the_worker_index_is_per_thread() {
        enter_worker(3);
        assert_eq!(worker(), 3);
        assert_eq!(std::thread::spawn(worker).join().unwrap(), 0);
    }

    #[test]
    fn the_fill_lane_has_the_last_pool_and_workers_the_others() {
        // Per-core with 3 workers: pools 0..3 for the workers, 3 for the lane.
        let count = pools(RuntimeModel::PerCore, 3);
        let picks = std::thread::spawn(move || {
            (0..3)
                .map(|i| {
                    enter_worker(i);
                    pool(count)
                })
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap();
        assert_eq!(picks, vec![0, 1, 2]);
        let lane = std::thread::spawn(move || {
            enter_fill_lane();
            (
                in_fill_lane(),
                pool(count),
                pool(pools(RuntimeModel::WorkStealing, 1)),
            )
        })
        .join()
        .unwrap();
        assert_eq!(lane, (true, 3, 1));
        // Work-stealing workers share pool 0; a single pool (built elsewhere) is everyone's.
        assert_eq!(pool(pools(RuntimeModel::WorkStealing, 4)), 0);
        assert_eq!(pool(1), 0);
        assert!(!in_fill_lane());
    }
}
