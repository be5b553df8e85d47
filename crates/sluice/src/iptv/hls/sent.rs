//! What playlists hold while their answers are sent: every large one is charged once, to the
//! channels' kept playlists ([`super::kept`]) or to the answers' own budget ([`MAX_SENT_TOTAL`],
//! a quarter of it per client while others hold some), until the last answer sending it is done.
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

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::super::registry;
use super::kept::Held;
use super::render::INLINE_BYTES;
use crate::body::{self, Body};
use crate::net::per_ip::network_of;

/// What the playlists answers hold (and no channel keeps) may take together: 256 MiB, six
/// catch-up playlists of the longest query, or some forty of a full window with a 200-byte token.
pub(super) const MAX_SENT_TOTAL: u64 = 256 << 20;

/// An answer goes out in slices this big, so the whole of it is held until the last is taken.
const SLICE: usize = 64 << 10;

/// The answers' budget: what they hold in all, and by client.
#[derive(Debug)]
pub(super) struct Sent {
    limit: u64,
    /// What one client's answers may hold while another client's hold some.
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

    /// `bytes` for an answer to `client`, when they fit in what is left and, while other
    /// clients' answers hold some, in the client's share (alone, a client may take it all).
    fn reserve(self: &Arc<Self>, client: IpAddr, bytes: u64) -> Option<Charge> {
        let client = network_of(client);
        let mut held = registry::lock(&self.held);
        let mine = held.clients.get(&client).copied().unwrap_or(0);
        let others = held.total - mine;
        let total = held
            .total
            .checked_add(bytes)
            .filter(|total| *total <= self.limit)?;
        if others > 0 && mine.saturating_add(bytes) > self.share {
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

    /// The body of an answer to `client`; `None` when the playlist is large, not kept, not
    /// charged yet, and its bytes fit neither in what `sent` has left nor in the client's share.
    pub(super) fn body(self: &Arc<Self>, sent: &Arc<Sent>, client: IpAddr) -> Option<Body> {
        if self.text.len() < INLINE_BYTES {
            return Some(body::full(self.text.clone()));
        }
        if self.kept.get().is_none() {
            let mut charge = registry::lock(&self.sent);
            if charge.is_none() {
                *charge = Some(sent.reserve(client, self.text.len() as u64)?);
            }
        }
        Some(body::boxed(Sending {
            rest: self.text.clone(),
            playlist: Some(self.clone()),
        }))
    }
}

/// A large playlist's answer, in slices: it holds its playlist (and so its charge) until the
/// last slice is taken (hyper asks for the next only when it has room to write it) or it is
/// dropped.
struct Sending {
    rest: Bytes,
    playlist: Option<Arc<Playlist>>,
}

impl http_body::Body for Sending {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.rest.is_empty() {
            self.playlist = None;
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(SLICE);
        let mut slice = self.rest.split_to(n);
        if self.rest.is_empty() {
            // Sent: the playlist goes (with its charge, when no other answer holds it). The
            // last slice is a copy: a view would keep the whole text alive, uncharged, while a
            // client that stops reading leaves it unwritten until the send timeout.
            slice = Bytes::copy_from_slice(&slice);
            self.playlist = None;
        }
        Poll::Ready(Some(Ok(Frame::data(slice))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}
