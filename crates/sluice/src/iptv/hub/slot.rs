//! The read-slot clock: one timer for every hub that reads its socket by slots.
//!
//! Each hub arming its own timer for the next slot made tokio's timer wake its driver (an
//! `eventfd` write) once per hub per slot, because each new timer was earlier than the wakeup
//! the driver had planned. One ticker task per process arms one timer per slot and wakes the
//! subscribed hubs through a `watch` channel. It runs only while some hub is subscribed: the
//! hubs' receivers are counted, and the ticker stops at the first slot with none.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

/// Spacing of the read slots: how long, at most, a flowing channel's datagrams wait in the
/// socket before the hub reads them.
///
/// Senders pace in ticks of about a millisecond, and on a fast host a hub woken by readiness
/// woke on the first datagram of each tick's train: at 40 Mb/s two or three datagrams per
/// wakeup, each paying for `epoll_wait`, a task poll, two `recvmmsg` (the second only to hear
/// `EAGAIN`) and often a thread switch, and with 8 channels 8 times over. Reading by slots of
/// one clock, every flowing hub is woken by the same tick, and each reads its whole queue with
/// one call. The cost is at most a slot of added delay, far below what `write_batch` already
/// adds, and that much data waiting in the socket buffer (about 150 KB at 400 Mb/s, well
/// inside `recv_buffer_bytes`).
pub const READ_SLOT: Duration = Duration::from_millis(2);

/// The running ticker's channel, kept as a receiver to clone for new subscribers; `None`
/// while no ticker runs. Subscribing and the ticker's decision to stop both happen under
/// this lock, so a subscriber never joins a ticker that is about to stop.
static CLOCK: Mutex<Option<watch::Receiver<u64>>> = Mutex::new(None);

/// A hub's subscription to the slot clock; dropping it unsubscribes.
#[derive(Debug)]
pub struct Slots {
    rx: watch::Receiver<u64>,
}

impl Slots {
    /// Subscribes, starting the ticker on the current runtime when none runs.
    pub fn subscribe() -> Slots {
        let mut clock = CLOCK.lock().unwrap_or_else(|e| e.into_inner());
        // A ticker whose runtime has shut down dropped its sender: start a new one.
        if let Some(rx) = clock.as_ref().filter(|rx| rx.has_changed().is_ok()) {
            let mut rx = rx.clone();
            rx.mark_unchanged();
            return Slots { rx };
        }
        let (tx, mut rx) = watch::channel(0u64);
        *clock = Some(rx.clone());
        tokio::spawn(tick(tx));
        rx.mark_unchanged();
        Slots { rx }
    }

    /// Waits for the next slot (at once when one passed since the last wait).
    pub async fn next(&mut self) {
        if self.rx.changed().await.is_err() {
            // The ticker's runtime went away under a hub still running on another one.
            *self = Slots::subscribe();
            let _ = self.rx.changed().await;
        }
    }
}

/// The ticker: one timer per slot, as long as some hub listens.
async fn tick(tx: watch::Sender<u64>) {
    let mut every = tokio::time::interval(READ_SLOT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    every.tick().await;
    loop {
        every.tick().await;
        {
            let mut clock = CLOCK.lock().unwrap_or_else(|e| e.into_inner());
            // The only receiver left is the one kept for cloning: nobody listens.
            if tx.receiver_count() <= 1 {
                *clock = None;
                return;
            }
        }
        tx.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Whether a ticker is running (for tests).
#[cfg(test)]
fn running() -> bool {
    CLOCK
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|rx| rx.has_changed().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test for the whole lifecycle: the clock is process-wide, so parallel tests would
    // see each other's subscribers.
    #[test]
    fn ticks_while_subscribed_stops_after_and_survives_its_runtime() {
        for round in 0..2 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            rt.block_on(async {
                let (mut a, mut b) = (Slots::subscribe(), Slots::subscribe());
                let start = tokio::time::Instant::now();
                for _ in 0..5 {
                    a.next().await;
                    b.next().await;
                }
                let took = start.elapsed();
                // Five slots: at least four slot lengths, and far from a stuck clock.
                assert!(took >= READ_SLOT * 4, "{took:?}");
                assert!(took < Duration::from_secs(2), "{took:?}");
                assert!(running());
                drop((a, b));
                if round == 0 {
                    // Leave the ticker armed: the runtime's end must not strand the next one.
                    return;
                }
                let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                while running() {
                    assert!(tokio::time::Instant::now() < deadline, "ticker kept running");
                    tokio::time::sleep(READ_SLOT).await;
                }
            });
            // The runtime goes with a ticker that may still be armed; the next round's
            // subscribers must get a fresh one.
            drop(rt);
        }
    }
}
