//! A subscriber's response body: a read position in its hub's ring, turned into body frames.
//!
//! Each wakeup takes every published chunk (up to `max_read` bytes) under one short lock, then
//! yields them one by one; hyper queues consecutive frames and writes them with one vectored
//! write, so a subscriber costs about one `writev` per published batch and never a payload copy.
//! A subscriber can only fall behind its own socket: the hub never waits for it.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::Stream;
use http_body::Frame;
use tokio::sync::watch;

use super::hub::Published;
use super::registry::{lock, Subscription};
use super::ring::{Position, Read};
use crate::body::BoxError;

/// What happens to a subscriber whose position fell out of the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlowPolicy {
    /// Jump ahead to a fresh start point (like a new viewer) and keep going; counted.
    #[default]
    Skip,
    /// End the response; counted. For clients that would rather reconnect than see a jump.
    Disconnect,
}

/// The reader state behind one response body.
pub struct Reader {
    sub: Subscription,
    pos: Position,
    rx: watch::Receiver<Published>,
    queue: VecDeque<Bytes>,
    policy: SlowPolicy,
    burst: usize,
    max_read: usize,
}

impl Reader {
    pub fn new(sub: Subscription, start: Position, policy: SlowPolicy, burst: usize) -> Self {
        let rx = sub.hub.published.subscribe();
        sub.client.position.store(start.index, Ordering::Release);
        Self {
            sub,
            pos: start,
            rx,
            queue: VecDeque::new(),
            policy,
            burst,
            max_read: 256 * 1024,
        }
    }

    /// The body stream: frames until the hub ends, the client goes, or the policy disconnects.
    pub fn into_stream(self) -> impl Stream<Item = Result<Frame<Bytes>, BoxError>> + Send {
        futures_util::stream::unfold(self, |mut r| async move {
            let item = r.next().await?;
            Some((item.map(Frame::data), r))
        })
    }

    async fn next(&mut self) -> Option<Result<Bytes, BoxError>> {
        loop {
            if let Some(chunk) = self.queue.pop_front() {
                self.account(chunk.len());
                return Some(Ok(chunk));
            }
            let published = *self.rx.borrow_and_update();
            match self.fill(published.end) {
                Ok(0) => {}
                Ok(_) => continue,
                Err(e) => return Some(Err(e)),
            }
            if published.closed {
                return None;
            }
            self.rx.changed().await.ok()?;
        }
    }

    /// Takes published chunks into the local queue; applies the slow policy when lapped.
    fn fill(&mut self, until: u64) -> Result<usize, BoxError> {
        let hub = &self.sub.hub;
        let ring = lock(&hub.ring);
        let got = match ring.read(&mut self.pos, until, self.max_read, &mut self.queue) {
            Read::Chunks(n) => n,
            Read::Lapped => match self.policy {
                SlowPolicy::Skip => {
                    self.pos = ring.start(until, self.burst);
                    hub.metrics.slow_skips.inc();
                    self.sub.client.skips.fetch_add(1, Ordering::Relaxed);
                    let n = ring.read(&mut self.pos, until, self.max_read, &mut self.queue);
                    matches!(n, Read::Chunks(n) if n > 0) as usize
                }
                SlowPolicy::Disconnect => {
                    drop(ring);
                    hub.metrics.slow_disconnects.inc();
                    return Err("subscriber too slow: fell out of the channel's buffer".into());
                }
            },
        };
        self.sub
            .client
            .position
            .store(self.pos.index, Ordering::Relaxed);
        Ok(got)
    }

    fn account(&self, len: usize) {
        self.sub.hub.metrics.sent_bytes.inc_by(len as u64);
        self.sub
            .client
            .bytes_out
            .fetch_add(len as u64, Ordering::Relaxed);
    }
}
