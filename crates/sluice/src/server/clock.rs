//! One clock per runtime for its connections' deadlines (keep-alive idle, header read, drain,
//! send-stall checks; the HTTP/1.1 fast path's and those of the connections hyper serves): a
//! sorted set of deadlines and the task to wake at each, fired by one task, instead of a timer
//! owned by every connection. A connection holds only its place on it ([`Alarm`]), so an idle one
//! costs its socket and a few bytes of task.
//!
//! An alarm is armed lazily: a connection asks to be woken *by* a deadline, and an entry already
//! due earlier (and still ahead) is kept; when it fires early the connection finds its deadline
//! not reached and asks again. A busy keep-alive connection therefore touches the clock's lock a
//! couple of times a second, not once per request.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Duration;

use slab::Slab;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::runtime::recent::recent;

/// After shutdown, how often the firing task looks whether every connection has let go of it.
const STOPPED_POLL: Duration = Duration::from_millis(100);

/// The deadlines of one runtime's connections.
#[derive(Debug)]
pub struct Clock {
    /// Deadlines are kept in whole milliseconds since this instant.
    epoch: Instant,
    wheel: Mutex<Wheel>,
    /// A deadline earlier than every other was set: the firing task sleeps again.
    earlier: Notify,
}

#[derive(Debug, Default)]
struct Wheel {
    /// (due, key), earliest first.
    due: BTreeSet<(u64, u32)>,
    entries: Slab<Entry>,
    /// Tells a reused key from the entry an alarm armed before.
    generation: u32,
}

#[derive(Debug)]
struct Entry {
    waker: Waker,
    due: u64,
    generation: u32,
}

impl Wheel {
    fn remove(&mut self, key: u32, generation: u32) {
        let key = key as usize;
        if self
            .entries
            .get(key)
            .is_some_and(|e| e.generation == generation)
        {
            let entry = self.entries.remove(key);
            self.due.remove(&(entry.due, key as u32));
        }
    }

    /// Takes every entry due at or before `now` (all of them with `u64::MAX`).
    fn take_due(&mut self, now: u64, woken: &mut Vec<Waker>) {
        while let Some(&(due, key)) = self.due.first() {
            if due > now {
                break;
            }
            self.due.pop_first();
            woken.push(self.entries.remove(key as usize).waker);
        }
    }
}

impl Clock {
    /// A clock whose firing task runs on the current runtime until shutdown (`stop` turns true
    /// or its sender is gone) and every connection has dropped its alarm.
    pub fn start(stop: watch::Receiver<bool>) -> Arc<Clock> {
        let clock = Arc::new(Clock {
            epoch: Instant::now(),
            wheel: Mutex::default(),
            earlier: Notify::new(),
        });
        tokio::spawn(clock.clone().run(stop));
        clock
    }

    fn lock(&self) -> MutexGuard<'_, Wheel> {
        self.wheel.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `at` in whole milliseconds since the epoch, rounded up: firing at that millisecond is
    /// never early.
    fn ms_ceil(&self, at: Instant) -> u64 {
        let d = at.saturating_duration_since(self.epoch);
        let ms = d.as_millis() as u64;
        if d > Duration::from_millis(ms) {
            ms + 1
        } else {
            ms
        }
    }

    fn ms_floor(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut stopping = *stop.borrow();
        let mut woken = Vec::new();
        loop {
            self.lock()
                .take_due(self.ms_floor(Instant::now()), &mut woken);
            woken.drain(..).for_each(Waker::wake);
            if stopping && Arc::strong_count(&self) == 1 {
                return;
            }
            let next = self.lock().due.first().map(|&(due, _)| due);
            let mut until = match next {
                Some(due) => self.epoch + Duration::from_millis(due),
                None => Instant::now() + Duration::from_secs(3600),
            };
            if stopping {
                until = until.min(Instant::now() + STOPPED_POLL);
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = self.earlier.notified() => {}
                changed = stop.changed(), if !stopping => {
                    stopping = changed.is_err() || *stop.borrow();
                    if stopping {
                        // Shutdown: every waiting connection looks at the stop flag (an idle one
                        // starts its drain clock). Entries stay where they are, so an alarm's
                        // idea of what it armed stays true.
                        let wheel = self.lock();
                        woken.extend(wheel.entries.iter().map(|(_, e)| e.waker.clone()));
                        drop(wheel);
                        woken.drain(..).for_each(Waker::wake);
                    }
                }
            }
        }
    }
}

/// A connection's place on its runtime's clock: at most one deadline at a time. Dropping it
/// takes the deadline off.
#[derive(Debug)]
pub struct Alarm {
    clock: Arc<Clock>,
    armed: Option<Armed>,
}

/// (`generation` is never 0, so an `Option<Armed>` takes no more room than an `Armed`.)
#[derive(Debug, Clone, Copy)]
struct Armed {
    due: u64,
    key: u32,
    generation: std::num::NonZeroU32,
}

impl Alarm {
    pub fn new(clock: Arc<Clock>) -> Alarm {
        Alarm { clock, armed: None }
    }

    /// Makes sure `waker` is woken at `deadline` or before (to the millisecond). The waker must
    /// be the same task's each time (a connection's alarm belongs to its task).
    pub fn wake_by(&mut self, deadline: Instant, waker: &Waker) {
        self.wake_by_at(deadline, recent(), waker);
    }

    /// [`Alarm::wake_by`] for a caller that has just read the clock (`now`).
    pub fn wake_by_at(&mut self, deadline: Instant, now: Instant, waker: &Waker) {
        let due = self.clock.ms_ceil(deadline);
        if let Some(a) = self.armed {
            // Still ahead and not later than asked: it will do.
            if a.due <= due && a.due > self.clock.ms_floor(now) {
                return;
            }
        }
        let mut wheel = self.clock.lock();
        if let Some(a) = self.armed.take() {
            wheel.remove(a.key, a.generation.get());
        }
        wheel.generation = wheel.generation.wrapping_add(1).max(1);
        let generation = wheel.generation;
        let key = wheel.entries.insert(Entry {
            waker: waker.clone(),
            due,
            generation,
        }) as u32;
        wheel.due.insert((due, key));
        let first = wheel.due.first() == Some(&(due, key));
        drop(wheel);
        self.armed = Some(Armed {
            due,
            key,
            generation: std::num::NonZeroU32::new(generation).expect("never 0"),
        });
        if first {
            self.clock.earlier.notify_one();
        }
    }

    /// Ready once `deadline` has passed; until then the task is woken by it (spurious wakes
    /// included, so this is polled inside a loop or a `select!`).
    #[cfg_attr(not(feature = "reverse"), allow(dead_code))]
    pub fn until(&mut self, deadline: Instant) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            let now = recent();
            if now >= deadline {
                return std::task::Poll::Ready(());
            }
            self.wake_by_at(deadline, now, cx.waker());
            std::task::Poll::Pending
        })
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        if let Some(a) = self.armed.take() {
            self.clock.lock().remove(a.key, a.generation.get());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many entries the clock holds.
    fn held(clock: &Clock) -> usize {
        let wheel = clock.lock();
        assert_eq!(wheel.due.len(), wheel.entries.len());
        wheel.entries.len()
    }

    #[tokio::test(start_paused = true)]
    async fn an_alarm_fires_at_its_deadline_not_before() {
        let (_tx, rx) = watch::channel(false);
        let clock = Clock::start(rx);
        let mut alarm = Alarm::new(clock.clone());
        let start = Instant::now();
        alarm.until(start + Duration::from_millis(1500)).await;
        assert!(start.elapsed() >= Duration::from_millis(1500));
        assert!(start.elapsed() < Duration::from_millis(1510));
        // Fired entries leave the clock.
        assert_eq!(held(&clock), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_rearms_a_later_one_does_not() {
        let (_tx, rx) = watch::channel(false);
        let clock = Clock::start(rx);
        let mut alarm = Alarm::new(clock.clone());
        let start = Instant::now();
        let waker = Waker::noop();
        alarm.wake_by(start + Duration::from_secs(10), waker);
        let first = alarm.armed.unwrap();
        // Later: the 10 s entry is kept.
        alarm.wake_by(start + Duration::from_secs(20), waker);
        assert_eq!(alarm.armed.unwrap().key, first.key);
        assert_eq!(alarm.armed.unwrap().generation, first.generation);
        // Earlier: re-armed, and the old entry is gone.
        alarm.until(start + Duration::from_secs(2)).await;
        assert!(start.elapsed() >= Duration::from_secs(2));
        assert!(start.elapsed() < Duration::from_secs(3));
        assert_eq!(held(&clock), 0);
        // Dropping an armed alarm takes its entry off.
        alarm.wake_by(Instant::now() + Duration::from_secs(5), waker);
        assert_eq!(held(&clock), 1);
        drop(alarm);
        assert_eq!(held(&clock), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn many_alarms_fire_in_order_and_shutdown_wakes_the_rest() {
        let (tx, rx) = watch::channel(false);
        let clock = Clock::start(rx);
        let start = Instant::now();
        let fired = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in (0..50u64).rev() {
            let (clock, fired) = (clock.clone(), fired.clone());
            tasks.push(tokio::spawn(async move {
                let mut alarm = Alarm::new(clock);
                alarm
                    .until(start + Duration::from_millis(100 * (i + 1)))
                    .await;
                fired.lock().unwrap().push(i);
            }));
        }
        // A connection waiting for its keep-alive deadline, minutes away, or for shutdown.
        let waiting = {
            let (clock, stop) = (clock.clone(), tx.subscribe());
            tokio::spawn(async move {
                let mut alarm = Alarm::new(clock);
                std::future::poll_fn(|cx| {
                    if *stop.borrow() {
                        return std::task::Poll::Ready(Instant::now());
                    }
                    alarm.wake_by(start + Duration::from_secs(300), cx.waker());
                    std::task::Poll::Pending
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(2_550)).await;
        assert_eq!(*fired.lock().unwrap(), (0..25).collect::<Vec<_>>());
        // Shutdown wakes every waiting alarm at once: the waiting connection sees it there and
        // then; the others ask again and fire on time.
        let before = Instant::now();
        tx.send(true).unwrap();
        let woke = waiting.await.unwrap();
        assert!(woke - before < Duration::from_millis(5));
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(fired.lock().unwrap().len(), 50);
        assert!(before.elapsed() >= Duration::from_millis(2_450));
        // Once every alarm is gone, the firing task ends and lets go of the clock.
        let weak = Arc::downgrade(&clock);
        drop(clock);
        tokio::time::sleep(STOPPED_POLL * 3).await;
        assert!(weak.upgrade().is_none());
    }
}
