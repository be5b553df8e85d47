//! What playlists hold while their answers are sent: every one of [`CHARGED_BYTES`] or more is
//! charged once, to the channels' kept playlists ([`super::kept`]) or to the answers' own budget
//! ([`MAX_SENT_TOTAL`], a quarter of it per client), until the last answer sending it is done.
//!
//! A catch-up playlist lists up to 20,000 segments with the request's query (up to 2 KiB) on
//! every line: tens of megabytes, each distinct query its own playlist. A client asking with
//! distinct long queries and reading nothing held one per request, without bound. Now a large
//! playlist's bytes are counted for as long as anything holds it:
//! - one its channel keeps is counted by the kept playlists' bound, for as long as it lives (a
//!   kept one replaced while answers still send it stays counted there, never charged again);
//! - any other is charged to the answers' budget by the first answer that takes it, once
//!   however many answers share it, and given back when the last of them is sent or dropped.
//!
//! Past the budget, or past the client's share, the request is refused (503).
//!
//! Such a playlist's answer hands out slices that hold the playlist itself (not only its text):
//! hyper may still queue a slice after the answer is done, and a plain view would keep the
//! whole text alive, uncharged, once the last answer gave its charge back. Nothing is copied:
//! a kept 8 MiB catch-up playlist polled by hundreds of viewers is sent from its one text.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::super::registry;
use super::kept::Held;
use crate::body::{self, Body};
use crate::net::per_ip::network_of;

/// What the playlists answers hold (and no channel keeps) may take together: 256 MiB, six
/// catch-up playlists of the longest query, or some forty of a full window with a 200-byte token.
pub(super) const MAX_SENT_TOTAL: u64 = 256 << 20;

/// A playlist at least this large is charged while its answers send it (a live window's, a few
/// kilobytes, is not). With 256 KiB, a client choosing its query's length had catch-up
/// playlists of just under it written, and held them uncharged on HTTP/2 streams it never
/// opened a window for; under 16 KiB, what such streams hold stays small.
pub(super) const CHARGED_BYTES: usize = 16 << 10;

/// An answer goes out in slices this big (hyper writes a slice at a time).
const SLICE: usize = 64 << 10;

/// The answers' budget: what they hold in all, and by client.
#[derive(Debug)]
pub(super) struct Sent {
    limit: u64,
    /// What one client's answers may hold, whatever others hold: alone, a client that took it
    /// all and read a few bytes a minute would keep every other at 503.
    share: u64,
    held: Mutex<Holders>,
}

#[derive(Debug, Default)]
struct Holders {
    total: u64,
    /// By [`network_of`] the client's address; a client leaves at zero.
    clients: HashMap<IpAddr, u64>,
}

impl Default for Sent {
    fn default() -> Self {
        Self::new(MAX_SENT_TOTAL)
    }
}

impl Sent {
    /// Answers holding at most `limit` bytes together, a quarter of it per client.
    pub(super) fn new(limit: u64) -> Self {
        Self {
            limit,
            share: limit / 4,
            held: Mutex::default(),
        }
    }

    /// `bytes` for an answer to `client`, when they fit in what is left and in the client's
    /// share.
    fn reserve(self: &Arc<Self>, client: IpAddr, bytes: u64) -> Option<Charge> {
        let client = network_of(client);
        let mut held = registry::lock(&self.held);
        let mine = held.clients.get(&client).copied().unwrap_or(0);
        let total = held
            .total
            .checked_add(bytes)
            .filter(|total| *total <= self.limit)?;
        if mine.saturating_add(bytes) > self.share {
            return None;
        }
        held.total = total;
        *held.clients.entry(client).or_insert(0) += bytes;
        Some(Charge {
            sent: self.clone(),
            client,
            bytes,
        })
    }

    /// Bytes the answers hold now.
    #[cfg(test)]
    pub(super) fn used(&self) -> u64 {
        registry::lock(&self.held).total
    }
}

/// Bytes of the answers' budget, given back when dropped.
#[derive(Debug)]
struct Charge {
    sent: Arc<Sent>,
    client: IpAddr,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut held = registry::lock(&self.sent.held);
        held.total -= self.bytes;
        if let Some(mine) = held.clients.get_mut(&self.client) {
            *mine -= self.bytes;
            if *mine == 0 {
                held.clients.remove(&self.client);
            }
        }
    }
}

/// A playlist as written, and what its bytes are charged to.
#[derive(Debug)]
pub(super) struct Playlist {
    pub(super) text: Bytes,
    /// Its part of the kept playlists' bound, once its channel keeps it: held as long as the
    /// playlist lives, so one replaced while answers still send it is still counted.
    kept: OnceLock<Held>,
    /// Its part of the answers' budget, once an answer took it unkept.
    sent: Mutex<Option<Charge>>,
}

impl Playlist {
    pub(super) fn new(text: impl Into<Bytes>) -> Arc<Playlist> {
        Arc::new(Playlist {
            text: text.into(),
            kept: OnceLock::new(),
            sent: Mutex::new(None),
        })
    }

    /// Its channel keeps it, within `held`.
    pub(super) fn keep(&self, held: Held) {
        let _ = self.kept.set(held);
    }

    /// The body of an answer to `client`; `None` when the playlist is [`CHARGED_BYTES`] or more,
    /// not kept, not charged yet, and its bytes do not fit in what `sent` has left or in the
    /// client's share.
    pub(super) fn body(self: &Arc<Self>, sent: &Arc<Sent>, client: IpAddr) -> Option<Body> {
        if self.text.len() < CHARGED_BYTES {
            return Some(body::full(self.text.clone()));
        }
        if self.kept.get().is_none() {
            let mut charge = registry::lock(&self.sent);
            if charge.is_none() {
                *charge = Some(sent.reserve(client, self.text.len() as u64)?);
            }
        }
        Some(body::boxed(Sending {
            playlist: Some(self.clone()),
            at: 0,
        }))
    }
}

/// A charged (or kept) playlist's answer, in slices: it holds its playlist (and so its charge)
/// until the last slice is taken (hyper asks for the next only when it has room to write it)
/// or it is dropped, and every slice holds it too until hyper is done with that slice, so the
/// text is never alive past its charge.
struct Sending {
    /// `None` once the last slice is taken.
    playlist: Option<Arc<Playlist>>,
    /// Bytes of the text handed out so far.
    at: usize,
}

impl Sending {
    /// Bytes left to hand out.
    fn left(&self) -> usize {
        self.playlist
            .as_ref()
            .map_or(0, |p| p.text.len().saturating_sub(self.at))
    }
}

impl http_body::Body for Sending {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let Some(playlist) = &this.playlist else {
            return Poll::Ready(None);
        };
        let end = playlist.text.len().min(this.at.saturating_add(SLICE));
        if end <= this.at {
            this.playlist = None;
            return Poll::Ready(None);
        }
        // Not a plain view: hyper may keep a slice queued after it took the next (up to a
        // slice on HTTP/1), and a view would keep the whole text alive once its charge went
        // back. The slice holds the playlist, with its charge.
        let slice = Bytes::from_owner(Slice {
            playlist: playlist.clone(),
            start: this.at,
            end,
        });
        this.at = end;
        if end == playlist.text.len() {
            // Sent: the playlist goes (with its charge, when no other answer holds it).
            this.playlist = None;
        }
        Poll::Ready(Some(Ok(Frame::data(slice))))
    }

    fn is_end_stream(&self) -> bool {
        self.left() == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left() as u64)
    }
}

/// A part of a playlist's text that keeps the playlist (and so its charge) while it lives.
struct Slice {
    playlist: Arc<Playlist>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for Slice {
    fn as_ref(&self) -> &[u8] {
        &self.playlist.text[self.start..self.end]
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::super::kept;
    use super::*;

    /// A playlist of `len` bytes, its text its own.
    fn playlist(len: usize) -> Arc<Playlist> {
        Playlist::new((0..len).map(|i| i as u8).collect::<Vec<u8>>())
    }

    /// Attack: a client alone takes answers up to the whole budget (others' answers, sent
    /// fast, hold nothing for long) and reads a few bytes a minute. It holds at most a quarter,
    /// however little the others hold.
    #[test]
    fn a_lone_client_holds_at_most_a_quarter() {
        let sent = Arc::new(Sent::new(400 << 10));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = playlist(60 << 10).body(&sent, a).expect("within the share");
        assert_eq!(sent.used(), 60 << 10);
        // Alone, past its quarter (100 KiB), though 340 KiB are left.
        assert!(playlist(60 << 10).body(&sent, a).is_none());
        assert_eq!(sent.used(), 60 << 10);
        // Another client has its own quarter.
        let theirs = playlist(60 << 10).body(&sent, b).expect("its own share");
        assert_eq!(sent.used(), 120 << 10);
        drop((first, theirs));
        assert_eq!(sent.used(), 0);
        assert!(playlist(60 << 10).body(&sent, a).is_some());
    }

    /// Attack: a client picks its query's length so each playlist is just under the size that
    /// was charged (256 KiB), and holds the answers on HTTP/2 streams with a zero window. A
    /// playlist of `CHARGED_BYTES` or more is charged while its answer holds it; a smaller one
    /// (a live window's) is not.
    #[tokio::test]
    async fn a_mid_sized_playlist_held_unread_is_charged() {
        let sent = Arc::new(Sent::default());
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        let held = playlist(100 << 10).body(&sent, client).expect("fits");
        assert_eq!(sent.used(), 100 << 10);
        let small = playlist(CHARGED_BYTES - 1).body(&sent, client).unwrap();
        assert_eq!(sent.used(), 100 << 10);
        let text = held.collect().await.unwrap().to_bytes();
        assert_eq!(text.len(), 100 << 10);
        assert_eq!(sent.used(), 0);
        let small = small.collect().await.unwrap().to_bytes();
        assert_eq!(small.len(), CHARGED_BYTES - 1);
        // Dropped unread, it gives its charge back too.
        let dropped = playlist(100 << 10).body(&sent, client).expect("fits");
        assert_eq!(sent.used(), 100 << 10);
        drop(dropped);
        assert_eq!(sent.used(), 0);
    }

    /// The slices an answer hands out may outlive it in hyper's queue: each holds the playlist
    /// with its charge, so while one is queued the bytes stay counted, and once the last is gone
    /// the text goes with its charge, whether charged or kept. No slice is a copy.
    #[tokio::test]
    async fn a_queued_slice_keeps_the_charge_and_nothing_is_copied() {
        let sent = Arc::new(Sent::default());
        let shared = Arc::new(kept::Shared::default());
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        let len = 3 * SLICE + 7;
        for keep in [false, true] {
            let p = playlist(len);
            if keep {
                p.keep(shared.reserve_playlist(len as u64).unwrap());
            }
            let text = p.text.clone();
            let mut body = p.body(&sent, client).unwrap();
            // Queued, as hyper may hold them, until the body is gone.
            let mut queued = Vec::new();
            while let Some(frame) = body.frame().await {
                queued.push(frame.unwrap().into_data().unwrap());
            }
            drop(body);
            assert_eq!(queued.len(), 4);
            assert_eq!(queued.concat(), text, "kept: {keep}");
            // Views of the one text, not copies.
            assert_eq!(queued[1].as_ptr(), text[SLICE..].as_ptr(), "kept: {keep}");
            // The playlist goes (replaced, say): the queued slices still hold it and its bytes.
            drop(p);
            let counted = (len as u64, 0);
            let counted = if keep { (0, counted.0) } else { counted };
            assert_eq!((sent.used(), shared.used()), counted, "kept: {keep}");
            drop(queued);
            assert_eq!((sent.used(), shared.used()), (0, 0), "kept: {keep}");
            assert!(text.is_unique(), "kept: {keep}");
        }
    }
}
