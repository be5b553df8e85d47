use slab::Slab;

/// Buffers frames for multiple streams.
#[derive(Debug)]
pub struct Buffer<T> {
    slab: Slab<Slot<T>>,
    regrow: Regrow,
}

/// How much room a released slab takes back with its first entry.
///
/// A connection frees its stream store and frame buffers whenever it has no stream open
/// (`Streams::release_idle_memory`), so a client that sends its streams in bursts would make
/// them grow back one doubling at a time after every burst, each doubling a `realloc` that
/// copies every entry. Instead the first entry after a release reserves room for as many as
/// the busy period before it held at once, up to `MAX_REGROW`.
#[derive(Debug, Default)]
pub(super) struct Regrow {
    /// The most entries held at once since the last release.
    peak: usize,
    /// Room to reserve when the released slab takes its first entry.
    room: usize,
}

/// The most entries a released slab reserves at once (the busy period's peak beyond this
/// grows by doubling as usual).
const MAX_REGROW: usize = 32;

impl Regrow {
    /// Called before an entry goes into a slab holding `len` with room for `capacity`: how
    /// many entries to reserve first (zero for none).
    #[inline]
    pub(super) fn before_insert(&mut self, len: usize, capacity: usize) -> usize {
        if len >= self.peak {
            self.peak = len + 1;
        }
        if capacity == 0 {
            std::mem::take(&mut self.room)
        } else {
            0
        }
    }

    /// Called when the slab is freed. A release with nothing inserted since the last one
    /// keeps the room it had.
    pub(super) fn released(&mut self) {
        if self.peak > 0 {
            self.room = self.peak.min(MAX_REGROW);
            self.peak = 0;
        }
    }
}

/// A sequence of frames in a `Buffer`
#[derive(Debug)]
pub struct Deque {
    indices: Option<Indices>,
}

/// Tracks the head & tail for a sequence of frames in a `Buffer`.
#[derive(Debug, Default, Copy, Clone)]
struct Indices {
    head: usize,
    tail: usize,
}

#[derive(Debug)]
struct Slot<T> {
    value: T,
    next: Option<usize>,
}

impl<T> Buffer<T> {
    pub fn new() -> Self {
        Buffer {
            slab: Slab::new(),
            regrow: Regrow::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    /// Frees the slab's slots once no frame is left in it.
    pub fn release_if_empty(&mut self) {
        if self.slab.is_empty() {
            self.slab = Slab::new();
            self.regrow.released();
        }
    }

    fn insert(&mut self, value: T) -> usize {
        let room = self
            .regrow
            .before_insert(self.slab.len(), self.slab.capacity());
        if room > 0 {
            self.slab.reserve(room);
        }
        self.slab.insert(Slot { value, next: None })
    }
}

impl Deque {
    pub fn new() -> Self {
        Deque { indices: None }
    }

    pub fn is_empty(&self) -> bool {
        self.indices.is_none()
    }

    pub fn push_back<T>(&mut self, buf: &mut Buffer<T>, value: T) {
        let key = buf.insert(value);

        match self.indices {
            Some(ref mut idxs) => {
                buf.slab[idxs.tail].next = Some(key);
                idxs.tail = key;
            }
            None => {
                self.indices = Some(Indices {
                    head: key,
                    tail: key,
                });
            }
        }
    }

    pub fn push_front<T>(&mut self, buf: &mut Buffer<T>, value: T) {
        let key = buf.insert(value);

        match self.indices {
            Some(ref mut idxs) => {
                buf.slab[key].next = Some(idxs.head);
                idxs.head = key;
            }
            None => {
                self.indices = Some(Indices {
                    head: key,
                    tail: key,
                });
            }
        }
    }

    pub fn pop_front<T>(&mut self, buf: &mut Buffer<T>) -> Option<T> {
        match self.indices {
            Some(mut idxs) => {
                let mut slot = buf.slab.remove(idxs.head);

                if idxs.head == idxs.tail {
                    assert!(slot.next.is_none());
                    self.indices = None;
                } else {
                    idxs.head = slot.next.take().unwrap();
                    self.indices = Some(idxs);
                }

                Some(slot.value)
            }
            None => None,
        }
    }
}
