//! How many `/proxy/*` requests one client IP, or one token, may have in flight: a place is taken
//! when the request arrives and given back when its response body ends or is dropped.

use std::collections::HashMap;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Frame, SizeHint};

use crate::body::{self, Body, BoxError};

/// Places held per key, at most `max` each (0: no limit).
#[derive(Debug)]
pub struct InFlight<K> {
    max: usize,
    held: Mutex<HashMap<K, usize>>,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> InFlight<K> {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(InFlight {
            max,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A place for `key`, or `None` when it holds `max` already.
    pub fn take(self: &Arc<Self>, key: K) -> Option<Place> {
        if self.max == 0 {
            return Some(Place(None));
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(key.clone()).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        let owner = Arc::clone(self);
        Some(Place(Some(Box::new(move || {
            let mut held = owner.held.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = held.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    held.remove(&key);
                }
            }
        }))))
    }

    /// Keys holding a place now (for tests and the status page).
    pub fn len(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One request's place; given back on drop.
pub struct Place(Option<Box<dyn FnOnce() + Send + Sync>>);

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(release) = self.0.take() {
            release();
        }
    }
}

/// `resp` with `places` held until its body ends or is dropped.
pub fn hold(resp: Response<Body>, places: Vec<Place>) -> Response<Body> {
    resp.map(|inner| {
        body::boxed(Holding {
            inner,
            places: Some(places),
        })
    })
}

pin_project_lite::pin_project! {
    struct Holding {
        #[pin]
        inner: Body,
        places: Option<Vec<Place>>,
    }
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let poll = this.inner.poll_frame(cx);
        if matches!(poll, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.places.take();
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_given_back() {
        let limit = InFlight::new(2);
        let a = limit.take("ip").unwrap();
        let b = limit.take("ip").unwrap();
        assert!(limit.take("ip").is_none());
        assert!(limit.take("other").is_some());
        drop(a);
        let c = limit.take("ip").unwrap();
        drop((b, c));
        assert!(limit.is_empty());
        assert!(InFlight::new(0).take("x").is_some());
    }
}
