//! The fill lane: one thread with its own current-thread runtime that runs every fill's writer
//! (origin connection, response head, body into slices, waking readers), so an origin's answer is
//! handled when it arrives instead of behind the connection runtime's queue of client tasks.
//!
//! Why a thread of its own: the connection runtime sees an origin socket's readiness only when it
//! polls its I/O driver (when its queue runs dry, or every `event_interval` tasks), and the writer
//! it then wakes is queued behind every client request of a burst still waiting to be read. On the
//! lane, the writer's thread sleeps in its own `epoll_wait` and the kernel runs it as soon as the
//! origin's bytes arrive. Readers stay on the connection runtime; a wake from the lane reaches them
//! through the runtime's inject queue (which a busy work-stealing worker checks every ~200 µs of
//! task time, tokio's self-tuned `global_queue_interval`).
//!
//! I/O objects stay on the runtime that registered them: an origin connection dialled here is
//! pooled in the lane's own pools (`runtime::pool`), never handed to the connection runtime.

use std::future::Future;
use std::io;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// A running fill lane. Dropping it (or [`FillLane::stop`]) ends the thread: the writers still
/// running are dropped, and each ends its fill as failed, so no reader waits on them.
pub struct FillLane {
    handle: Handle,
    stop: std::sync::Mutex<Option<oneshot::Sender<()>>>,
}

impl FillLane {
    /// Starts the lane's thread and runtime.
    pub fn start() -> io::Result<FillLane> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("sluice-fill")
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("sluice-fill".into())
            .spawn(move || {
                crate::runtime::enter_fill_lane();
                short_slice();
                // Either a stop or the lane dropped: both end the thread. The runtime is dropped
                // here, outside `block_on`, which cancels the writers still running.
                let _ = runtime.block_on(stopped);
                drop(runtime);
            })?;
        Ok(FillLane {
            handle,
            stop: std::sync::Mutex::new(Some(stop)),
        })
    }

    /// Runs `writer` on the lane.
    pub fn spawn<F>(&self, writer: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // After a stop the runtime is gone and the future is dropped unpolled, which ends its
        // fill (the writer's guard) like a shutdown does.
        drop(self.handle.spawn(writer));
    }

    /// Whether the lane takes writers (not stopped).
    pub fn running(&self) -> bool {
        self.stop
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Ends the lane's thread (process shutdown); fills still running end as failed.
    pub fn stop(&self) {
        let sender = self.stop.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = sender {
            let _ = s.send(());
        }
    }
}

/// Asks the kernel for a short time slice for the calling thread (Linux's EEVDF scheduler,
/// 6.12 and later: `sched_setattr` with `sched_runtime` under `SCHED_OTHER`, allowed without
/// privileges). A waking thread whose slice is shorter than the running one's may preempt it, so
/// when the origin's bytes arrive the lane runs at once instead of after the connection thread's
/// slice (up to 3 ms by default) on a shared core. Best effort: older kernels refuse it, and the
/// lane then runs when the scheduler gets to it.
#[cfg(target_os = "linux")]
fn short_slice() {
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: 0, // SCHED_OTHER
        flags: 0,
        nice: 0,
        priority: 0,
        runtime: LANE_SLICE_NS,
        deadline: 0,
        period: 0,
    };
    // SAFETY: the attribute struct is the kernel's `sched_attr` (first version, 48 bytes) and
    // lives across the call; pid 0 is the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if rc != 0 {
        tracing::debug!(
            "fill thread: no short time slice ({})",
            io::Error::last_os_error()
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn short_slice() {}

/// The lane's time slice: it runs for tens of µs per wake (a read, a push, the wakes).
#[cfg(target_os = "linux")]
const LANE_SLICE_NS: u64 = 100_000;

impl Drop for FillLane {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread")]
    async fn writers_run_on_the_lane_and_stop_ends_it() {
        let lane = FillLane::start().unwrap();
        let (tx, rx) = oneshot::channel();
        lane.spawn(async move {
            let name = std::thread::current().name().map(str::to_string);
            // The lane's tasks use its own timer and I/O driver.
            tokio::time::sleep(Duration::from_millis(1)).await;
            let _ = tx.send((name, crate::runtime::in_fill_lane()));
        });
        let (name, in_lane) = rx.await.unwrap();
        assert_eq!(name.as_deref(), Some("sluice-fill"));
        assert!(in_lane);
        assert!(!crate::runtime::in_fill_lane());

        // A writer still running when the lane stops is dropped (its guard runs), promptly.
        struct Guard(Option<oneshot::Sender<()>>);
        impl Drop for Guard {
            fn drop(&mut self) {
                if let Some(t) = self.0.take() {
                    let _ = t.send(());
                }
            }
        }
        let (gone_tx, gone_rx) = oneshot::channel();
        let started = Arc::new(tokio::sync::Notify::new());
        let s = started.clone();
        lane.spawn(async move {
            let _g = Guard(Some(gone_tx));
            s.notify_one();
            std::future::pending::<()>().await;
        });
        started.notified().await;
        assert!(lane.running());
        lane.stop();
        assert!(!lane.running());
        tokio::time::timeout(Duration::from_secs(5), gone_rx)
            .await
            .expect("the writer was dropped when the lane stopped")
            .unwrap();
        // A writer handed over after the stop is dropped unpolled, not leaked.
        let (late_tx, late_rx) = oneshot::channel::<()>();
        lane.spawn(async move {
            let _keep = late_tx;
        });
        assert!(tokio::time::timeout(Duration::from_secs(5), late_rx)
            .await
            .expect("dropped")
            .is_err());
    }
}
