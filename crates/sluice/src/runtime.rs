//! The runtime model (`server.runtime`): one work-stealing runtime for everything, or one
//! current-thread runtime per core, each accepting on its own `SO_REUSEPORT` listener and keeping its
//! own reverse proxy upstream pools. Also which per-core worker the calling thread is.

pub mod aligned_pool;
pub mod big_blocks;
pub mod busy_poll;
pub mod copy;
pub mod cpu;
pub mod recent;
pub mod release;

use std::cell::Cell;
use std::time::Duration;

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
/// shared by all the work-stealing workers.
pub fn pools(model: RuntimeModel, configured_threads: usize) -> usize {
    match model {
        RuntimeModel::WorkStealing => 1,
        RuntimeModel::PerCore => threads(configured_threads),
    }
}

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as per-core worker `index` (its pools are `index`).
pub fn enter_worker(index: usize) {
    WORKER.with(|w| w.set(index));
}

/// The per-core worker the calling thread is (0 outside per-core runtimes).
pub fn worker() -> usize {
    WORKER.with(Cell::get)
}

/// Task polls between two looks at the I/O driver while tasks are runnable (tokio's default is 61).
///
/// A busy worker's queue holds 256 tasks; what a driver poll wakes beyond that goes to the shared
/// queue, oldest first, and is taken from there one task every few polls. With 61, the driver
/// refilled the local queue before it ever ran dry, so at 1,000 busy connections a quarter of
/// them waited in the shared queue and S2's p99 at c = 1000 was about 9× its median. At 1,024 (the driver's event
/// buffer) a worker serves what one poll woke, then polls again, as an `epoll_wait` loop does,
/// and the latencies are one narrow band. An idle or lightly loaded worker polls the driver
/// whenever it runs out of tasks, so this changes nothing below saturation
/// (`docs/history/reverse-proxy-tuning.md`, "Fairness at 1,000 connections").
#[cfg(feature = "multi-thread")]
const EVENT_INTERVAL: u32 = 1024;

/// Builds the runtime `main` runs on: under per-core, it runs only the control plane (signals,
/// reload, health checks, the TCP front end), so it gets one worker thread; the per-core runtimes
/// are started by the server.
///
/// Work-stealing with one thread is a current-thread runtime: one worker has nobody to steal
/// from, and the multi-threaded scheduler's cost (atomic task states, a shared queue and a
/// driver handed between threads, `main`'s own thread beside the worker) buys nothing there. It
/// is what the per-core model runs on each core, and from 100 connections on it served the same
/// requests with less CPU each in every paired run (4–31 %, most pairs 14–16 %;
/// `docs/history/reverse-proxy-tuning.md`, "One thread"). That runtime polls for `busy_poll` after each
/// request before it sleeps ([`busy_poll`]); the multi-threaded one leaves it to tokio's workers.
#[cfg(feature = "multi-thread")]
pub fn main_runtime(
    model: RuntimeModel,
    configured_threads: usize,
    busy_poll: Duration,
) -> std::io::Result<tokio::runtime::Runtime> {
    let workers = match model {
        RuntimeModel::WorkStealing => threads(configured_threads),
        RuntimeModel::PerCore => 1,
    };
    if model == RuntimeModel::WorkStealing && workers == 1 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        if let Some(poller) = busy_poll::install(busy_poll) {
            runtime.spawn(poller);
        }
        return Ok(runtime);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .event_interval(EVENT_INTERVAL)
        .worker_threads(workers)
        .build()
}

/// Without `multi-thread` (the router build) `main` runs on one current-thread runtime: under
/// `work-stealing` it serves everything (a gateway's work is a few sockets, and every extra worker
/// thread costs a router memory and wake-ups); under `per-core` it runs the control plane and the
/// server starts the per-core runtimes beside it, as in the full build. Under `work-stealing` it
/// polls for `busy_poll` after each request before it sleeps ([`busy_poll`]).
#[cfg(not(feature = "multi-thread"))]
pub fn main_runtime(
    model: RuntimeModel,
    _configured_threads: usize,
    busy_poll: Duration,
) -> std::io::Result<tokio::runtime::Runtime> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if model == RuntimeModel::WorkStealing {
        if let Some(poller) = busy_poll::install(busy_poll) {
            runtime.spawn(poller);
        }
    }
    Ok(runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_follow_the_model() {
        assert_eq!(pools(RuntimeModel::WorkStealing, 8), 1);
        assert_eq!(pools(RuntimeModel::PerCore, 3), 3);
        assert!(pools(RuntimeModel::PerCore, 0) >= 1);
        let m: RuntimeModel = serde_json::from_str("\"per-core\"").unwrap();
        assert_eq!(m, RuntimeModel::PerCore);
    }

    #[test]
    fn the_worker_index_is_per_thread() {
        enter_worker(3);
        assert_eq!(worker(), 3);
        assert_eq!(std::thread::spawn(worker).join().unwrap(), 0);
    }
}
