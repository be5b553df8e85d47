//! One slice being fetched from the origin (read-while-write): the writer appends chunks, every
//! reader follows at its own pace and is woken by the writer (no polling). The chunks are held
//! once, shared by all readers.
//!
//! Readers are polled (`FillReader::poll_next`), so a response body can follow a fill from the
//! connection's own task. A waiting reader leaves its waker in the fill; the writer takes the whole
//! list under the lock and wakes it after letting go, so a push costs one short lock and one wake
//! per waiting reader, and no reader ever waits on the lock while another is woken.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::Response;

use super::nudge::Nudge;
use super::object::ObjectMeta;
use crate::body::Body;

/// How a fill ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FillEnd {
    /// Every byte of the slice arrived; `last` when it ends the object.
    Complete { last: bool },
    /// The origin failed; readers may elect a new writer and carry on from where they are.
    Failed(String),
    /// This process was out of its own resources to ask the origin (`OriginError::Local`): a
    /// miss waiting for the head answers 503 `local_resources` without electing another writer;
    /// a body under way takes it as [`FillEnd::Failed`].
    Local,
    /// The origin answered with another version of the object; it has been dropped.
    Mismatch,
    /// The answer is not cacheable: one reader takes the response, the others go to the origin.
    Pass { reason: &'static str },
}

#[derive(Default)]
struct State {
    head: Option<Arc<ObjectMeta>>,
    chunks: Vec<Bytes>,
    end: Option<FillEnd>,
    pass: Option<Response<Body>>,
    /// Readers waiting for the next change; emptied by every change.
    waiters: Vec<Waker>,
    /// Bumped by every change, so a reader knows whether its waker is still in `waiters`.
    version: u64,
}

/// A slice in flight.
pub struct Fill {
    state: Mutex<State>,
    readers: AtomicUsize,
    /// Whether any reader ever followed it (`Fill::forsaken_by_all`).
    followed: AtomicBool,
    /// How joiners ask the writer to read the origin's head now.
    nudge: Arc<Nudge>,
}

impl Fill {
    pub fn new() -> Arc<Fill> {
        Arc::new(Fill {
            state: Mutex::new(State::default()),
            readers: AtomicUsize::new(0),
            followed: AtomicBool::new(false),
            nudge: Nudge::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every change under the lock is a single assignment or push: a poisoned state is still
        // consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `change` and wakes every waiting reader once the lock is released.
    fn change(&self, change: impl FnOnce(&mut State) -> bool) {
        let waiters = {
            let mut s = self.lock();
            if !change(&mut s) {
                return;
            }
            s.version += 1;
            std::mem::take(&mut s.waiters)
        };
        for w in waiters {
            w.wake();
        }
    }

    /// A fill that is already over: `chunks` and then `end` (a slice stored as its reader
    /// looked for a fill to follow).
    pub fn stored(chunks: &[Bytes], end: FillEnd) -> Arc<Fill> {
        let fill = Fill::new();
        {
            let mut s = fill.lock();
            s.chunks = chunks.to_vec();
            s.end = Some(end);
        }
        fill
    }

    /// The nudge the writer runs under.
    pub fn nudge(&self) -> &Arc<Nudge> {
        &self.nudge
    }

    /// Neither a head nor an end yet: the writer still waits for the origin's answer.
    pub fn awaits_head(&self) -> bool {
        let s = self.lock();
        s.head.is_none() && s.end.is_none() && s.pass.is_none()
    }

    /// Publishes the object the slice belongs to (before any chunk).
    pub fn set_head(&self, meta: Arc<ObjectMeta>) {
        self.change(|s| {
            s.head = Some(meta);
            true
        });
    }

    pub fn push(&self, chunk: Bytes) {
        self.change(|s| {
            s.chunks.push(chunk);
            true
        });
    }

    /// The chunks so far (the writer stores them when the slice is complete).
    pub fn chunks(&self) -> Vec<Bytes> {
        self.lock().chunks.clone()
    }

    /// Once the slice is stored as one allocation (`Slice::compacted`), readers still following
    /// the fill take their chunks from it too (same boundaries, views of `whole`), so the
    /// allocation the chunks arrived in is freed as soon as the readers' queued chunks are sent.
    pub fn share(&self, whole: &Bytes) {
        let mut s = self.lock();
        let total: usize = s.chunks.iter().map(Bytes::len).sum();
        if total != whole.len() {
            return;
        }
        let mut at = 0;
        for c in s.chunks.iter_mut() {
            let n = c.len();
            *c = whole.slice(at..at + n);
            at += n;
        }
    }

    /// Ends the fill; the first end given wins.
    pub fn finish(&self, end: FillEnd) {
        self.change(|s| {
            if s.end.is_some() {
                return false;
            }
            s.end = Some(end);
            true
        });
    }

    /// Ends the fill as uncacheable, leaving `response` for the first reader that asks.
    pub fn finish_pass(&self, reason: &'static str, response: Response<Body>) {
        self.change(|s| {
            if s.end.is_some() {
                return false;
            }
            s.pass = Some(response);
            s.end = Some(FillEnd::Pass { reason });
            true
        });
    }

    /// Takes the uncacheable response, if nobody has yet.
    pub fn take_pass(&self) -> Option<Response<Body>> {
        self.lock().pass.take()
    }

    /// Readers currently following this fill.
    pub fn readers(&self) -> usize {
        self.readers.load(Ordering::Relaxed)
    }

    /// Followed once and by nobody now: every client that wanted the slice went away. A fill
    /// nobody has followed yet (a read-ahead, or one whose starter has not joined it yet) is not.
    pub fn forsaken_by_all(&self) -> bool {
        self.followed.load(Ordering::Acquire) && self.readers() == 0
    }

    pub fn reader(self: &Arc<Self>) -> FillReader {
        self.readers.fetch_add(1, Ordering::Relaxed);
        self.followed.store(true, Ordering::Release);
        FillReader {
            fill: self.clone(),
            next: 0,
            waiting: None,
        }
    }
}

/// What a reader sees next.
pub enum Event {
    Chunk(Bytes),
    End(FillEnd),
}

/// One reader's position in a fill.
pub struct FillReader {
    fill: Arc<Fill>,
    next: usize,
    /// The fill's version when this reader last left its waker, and that waker: while both still
    /// hold, polling again adds nothing to the fill's list.
    waiting: Option<(u64, Waker)>,
}

impl Drop for FillReader {
    fn drop(&mut self) {
        self.fill.readers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl FillReader {
    pub fn fill(&self) -> &Arc<Fill> {
        &self.fill
    }

    /// The object head, or the end if the fill ends without one.
    pub fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Arc<ObjectMeta>, FillEnd>> {
        let mut s = self.fill.lock();
        if let Some(h) = &s.head {
            return Poll::Ready(Ok(h.clone()));
        }
        if let Some(end) = &s.end {
            return Poll::Ready(Err(end.clone()));
        }
        wait(&mut self.waiting, &mut s, cx);
        Poll::Pending
    }

    /// Waits for the object head, or for the end if the fill ends without one.
    pub async fn head(&mut self) -> Result<Arc<ObjectMeta>, FillEnd> {
        poll_fn(|cx| self.poll_head(cx)).await
    }

    /// The next chunk, or the end.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        let mut s = self.fill.lock();
        if let Some(c) = s.chunks.get(self.next) {
            self.next += 1;
            return Poll::Ready(Event::Chunk(c.clone()));
        }
        if let Some(end) = &s.end {
            return Poll::Ready(Event::End(end.clone()));
        }
        wait(&mut self.waiting, &mut s, cx);
        Poll::Pending
    }

    /// The next chunk, or the end.
    pub async fn next(&mut self) -> Event {
        poll_fn(|cx| self.poll_next(cx)).await
    }
}

/// Leaves `cx`'s waker in the fill unless the reader's is there already.
fn wait(waiting: &mut Option<(u64, Waker)>, s: &mut State, cx: &Context<'_>) {
    if let Some((v, w)) = waiting {
        if *v == s.version && w.will_wake(cx.waker()) {
            return;
        }
    }
    s.waiters.push(cx.waker().clone());
    *waiting = Some((s.version, cx.waker().clone()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readers_follow_the_writer_and_see_the_end() {
        let fill = Fill::new();
        let (a, b) = (fill.reader(), fill.reader());
        assert_eq!(fill.readers(), 2);
        let writer = {
            let fill = fill.clone();
            tokio::spawn(async move {
                for i in 0..50u8 {
                    fill.push(Bytes::from(vec![i; 10]));
                    tokio::task::yield_now().await;
                }
                fill.finish(FillEnd::Complete { last: true });
                // A second end never replaces the first.
                fill.finish(FillEnd::Failed("late".into()));
            })
        };
        let read = |mut r: FillReader| async move {
            let mut out = Vec::new();
            loop {
                match r.next().await {
                    Event::Chunk(c) => out.extend_from_slice(&c),
                    Event::End(e) => return (out, e),
                }
            }
        };
        let (ra, rb) = tokio::join!(read(a), read(b));
        writer.await.unwrap();
        assert_eq!(ra.0.len(), 500);
        assert_eq!(ra.0, rb.0);
        assert_eq!(ra.1, FillEnd::Complete { last: true });
        assert_eq!(fill.readers(), 0);
        // Shared from one allocation: the same bytes at the same boundaries.
        let whole = Bytes::from(ra.0.clone());
        fill.share(&whole);
        assert_eq!(fill.chunks().len(), 50);
        assert_eq!(fill.chunks()[0].as_ptr(), whole.as_ptr());
        // A reader that joins after the end still gets every chunk.
        let (late, end) = read(fill.reader()).await;
        assert_eq!(late, ra.0);
        assert_eq!(end, FillEnd::Complete { last: true });
    }

    struct Count(AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_waiting_reader_is_listed_once_and_woken_once_per_change() {
        let fill = Fill::new();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut r = fill.reader();
        // Polled again and again while nothing changes (a connection polling its body after
        // every write): one entry, not one per poll.
        for _ in 0..5 {
            assert!(r.poll_next(&mut cx).is_pending());
        }
        assert_eq!(fill.lock().waiters.len(), 1);
        fill.push(Bytes::from_static(b"abc"));
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert!(fill.lock().waiters.is_empty());
        match r.poll_next(&mut cx) {
            Poll::Ready(Event::Chunk(c)) => assert_eq!(&c[..], b"abc"),
            _ => panic!("the pushed chunk"),
        }
        // Waiting again after the change lists it again; a second end is no change and wakes
        // nobody.
        assert!(r.poll_next(&mut cx).is_pending());
        assert_eq!(fill.lock().waiters.len(), 1);
        fill.finish(FillEnd::Complete { last: true });
        fill.finish(FillEnd::Failed("late".into()));
        assert_eq!(count.0.load(Ordering::Relaxed), 2);
        assert!(matches!(
            r.poll_next(&mut cx),
            Poll::Ready(Event::End(FillEnd::Complete { last: true }))
        ));
        // The head is waited for the same way.
        let other = Fill::new();
        let mut h = other.reader();
        assert!(h.poll_head(&mut cx).is_pending());
        assert!(h.poll_head(&mut cx).is_pending());
        assert_eq!(other.lock().waiters.len(), 1);
        other.finish(FillEnd::Failed("gone".into()));
        assert_eq!(count.0.load(Ordering::Relaxed), 3);
        assert!(matches!(
            h.poll_head(&mut cx),
            Poll::Ready(Err(FillEnd::Failed(_)))
        ));
    }
}
