//! `transformer=ts_stream`: where MPEG-TS really starts behind a fake wrapper, and a streaming
//! stripper that drops what comes before it. No I/O.
//!
//! Some hosters disguise TS segments as images or style sheets: a PNG (signature, IHDR, IEND,
//! sometimes 0xFF padding), a GIF or a CSS rule is put in front of the packets, and the URL ends in
//! `.png` or `.css`. Players that sniff the first bytes refuse it. The start of the real stream is
//! the first offset where the sync byte repeats every 188 bytes, [`CONFIRM`] times in a row: a lone
//! 0x47 is common in any binary (the `G` of `PNG` is one), five at the right spacing by chance are
//! not (2^-32 per candidate offset).
//!
//! The search is bounded: offsets beyond the window are not considered, so at most the window plus
//! four packets are held back. A body where no offset within the window confirms is not TS behind a
//! wrapper, and passes through unchanged rather than being cut.

use bytes::{Bytes, BytesMut};

use super::{PACKET_LEN, SYNC_BYTE};

/// Sync bytes that must line up, 188 bytes apart, before an offset is taken as the stream start.
pub const CONFIRM: usize = 5;

/// Default search window: wrappers seen in the wild are a few hundred bytes to a few KiB; a fake
/// image can be bigger, but not a quarter of a MiB in front of a segment.
pub const DEFAULT_WINDOW: usize = 256 * 1024;

/// Where the stream starts in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Packets line up from this offset.
    At(usize),
    /// A candidate offset cannot be decided until more bytes arrive.
    NeedMore,
    /// No offset within the window lines up: not a wrapped TS stream.
    NotFound,
}

/// Finds the first offset at most `window` where [`CONFIRM`] sync bytes line up. `complete` says
/// `buf` is the whole body: then a body too short for [`CONFIRM`] packets is accepted from an
/// offset where every packet start it has is a sync byte and it ends on a packet boundary.
pub fn find_start(buf: &[u8], window: usize, complete: bool) -> Start {
    scan(buf, 0, window, complete).0
}

/// [`find_start`] over offsets from `from` on (every earlier one known not to start the stream),
/// with the first offset a later call must look at again: the undecided candidate, or the end.
/// An offset ruled out stays ruled out as the buffer grows (a byte that is not a sync byte
/// stays so), so the stripper resumes there instead of rescanning what it held.
fn scan(buf: &[u8], mut from: usize, window: usize, complete: bool) -> (Start, usize) {
    while let Some(rel) = memchr::memchr(SYNC_BYTE, &buf[from..]) {
        let at = from + rel;
        if at > window {
            return (Start::NotFound, at);
        }
        match confirm(buf, at, complete) {
            Some(true) => return (Start::At(at), at),
            Some(false) => from = at + 1,
            // An earlier offset wins over a later one, so an undecided candidate blocks.
            None => return (Start::NeedMore, at),
        }
    }
    let end = buf.len();
    if complete || end > window {
        (Start::NotFound, end)
    } else {
        (Start::NeedMore, end)
    }
}

/// `Some(true)` when packets line up from `at`, `Some(false)` when they do not, `None` when the
/// buffer ends too early to say.
fn confirm(buf: &[u8], at: usize, complete: bool) -> Option<bool> {
    for k in 0..CONFIRM {
        let offset = at + k * PACKET_LEN;
        if offset >= buf.len() {
            if !complete {
                return None;
            }
            // A short whole body: at least one packet, and nothing but whole packets.
            let tail = buf.len() - at;
            return Some(tail >= PACKET_LEN && tail.is_multiple_of(PACKET_LEN));
        }
        if buf[offset] != SYNC_BYTE {
            return Some(false);
        }
    }
    Some(true)
}

/// The whole-body form: `body` from the stream start, or unchanged when no start is found.
pub fn unwrap_whole(body: Bytes, window: usize) -> Bytes {
    match find_start(&body, window, true) {
        Start::At(at) => body.slice(at..),
        Start::NeedMore | Start::NotFound => body,
    }
}

/// What the stripper decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Still looking (bytes are held back).
    Searching,
    /// This many wrapper bytes were dropped (0: the body was TS from its first byte).
    Stripped(usize),
    /// No stream start in the window: the body passes through unchanged.
    NotTs,
}

/// Streaming stripper: feed body chunks in order, send what comes out.
///
/// Memory: while searching it holds at most `window + (CONFIRM - 1) * 188` bytes plus the chunk
/// that crossed that bound; once decided, chunks pass through without a copy.
#[derive(Debug)]
pub struct TsUnwrap {
    window: usize,
    held: BytesMut,
    /// The first offset in `held` not yet ruled out: a body trickling in a byte at a time would
    /// otherwise be rescanned whole on every chunk (quadratic in the window).
    from: usize,
    /// Bytes handed to the search so far (for the tests: linear in the body, not quadratic).
    #[cfg(test)]
    scanned: usize,
    outcome: Outcome,
}

impl TsUnwrap {
    pub fn new(window: usize) -> Self {
        TsUnwrap {
            window,
            held: BytesMut::new(),
            from: 0,
            #[cfg(test)]
            scanned: 0,
            outcome: Outcome::Searching,
        }
    }

    /// What has been decided so far.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Feeds one chunk; returns the bytes to send now, if any.
    pub fn push(&mut self, chunk: Bytes) -> Option<Bytes> {
        if self.outcome != Outcome::Searching {
            return Some(chunk).filter(|c| !c.is_empty());
        }
        if self.held.is_empty() {
            // The common case decides on the first chunk: no copy at all.
            match self.search(&chunk, false) {
                Start::NeedMore => {
                    self.held.extend_from_slice(&chunk);
                    return None;
                }
                decided => return self.decide(decided, chunk),
            }
        }
        self.held.extend_from_slice(&chunk);
        let held = std::mem::take(&mut self.held);
        let start = self.search(&held, false);
        self.held = held;
        match start {
            Start::NeedMore => None,
            decided => {
                let held = std::mem::take(&mut self.held).freeze();
                self.decide(decided, held)
            }
        }
    }

    /// End of the body: whatever is still held back, from the stream start if one is found.
    pub fn finish(&mut self) -> Option<Bytes> {
        if self.outcome != Outcome::Searching {
            return None;
        }
        let held = std::mem::take(&mut self.held).freeze();
        let decided = self.search(&held, true);
        self.decide(decided, held)
    }

    /// [`find_start`] over `buf` (what is held), resuming where the last search stopped.
    fn search(&mut self, buf: &[u8], complete: bool) -> Start {
        #[cfg(test)]
        {
            self.scanned += buf.len() - self.from;
        }
        let (start, from) = scan(buf, self.from, self.window, complete);
        self.from = from;
        start
    }

    fn decide(&mut self, start: Start, buf: Bytes) -> Option<Bytes> {
        let out = match start {
            Start::At(at) => {
                self.outcome = Outcome::Stripped(at);
                buf.slice(at..)
            }
            Start::NeedMore | Start::NotFound => {
                self.outcome = Outcome::NotTs;
                buf
            }
        };
        Some(out).filter(|b| !b.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packets(n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            let mut p = vec![(i % 251) as u8; PACKET_LEN];
            p[0] = SYNC_BYTE;
            // Payload bytes equal to the sync byte, as real payloads have.
            p[100] = SYNC_BYTE;
            out.extend(p);
        }
        out
    }

    /// A real PNG's first bytes: signature, IHDR, IEND (the `G` of `PNG` is a sync byte).
    fn png() -> Vec<u8> {
        let mut out = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\0\x10\0\0\0\x10\x08\x02\0\0\0".to_vec();
        out.extend(b"\x90\x91\x68\x36\0\0\0\0IEND\xaeB`\x82");
        out.extend([0xff; 37]);
        out
    }

    fn run(chunks: &[&[u8]], window: usize) -> (Vec<u8>, Outcome) {
        let mut u = TsUnwrap::new(window);
        let mut out = Vec::new();
        for c in chunks {
            if let Some(b) = u.push(Bytes::copy_from_slice(c)) {
                out.extend_from_slice(&b);
            }
        }
        if let Some(b) = u.finish() {
            out.extend_from_slice(&b);
        }
        (out, u.outcome())
    }

    #[test]
    fn strips_a_png_wrapper() {
        let ts = packets(20);
        let body = [png(), ts.clone()].concat();
        assert_eq!(
            find_start(&body, DEFAULT_WINDOW, false),
            Start::At(png().len())
        );
        let (out, outcome) = run(&[&body], DEFAULT_WINDOW);
        assert_eq!(out, ts);
        assert_eq!(outcome, Outcome::Stripped(png().len()));
    }

    #[test]
    fn plain_ts_passes_from_byte_zero() {
        let ts = packets(8);
        assert_eq!(run(&[&ts], DEFAULT_WINDOW), (ts, Outcome::Stripped(0)));
    }

    #[test]
    fn byte_by_byte_feeding_gives_the_same_bytes() {
        let ts = packets(9);
        let body = [b"body{color:red}".to_vec(), ts.clone()].concat();
        let chunks: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(run(&chunks, DEFAULT_WINDOW), (ts, Outcome::Stripped(15)));
    }

    #[test]
    fn short_whole_body_needs_whole_packets() {
        let ts = packets(2);
        let body = [png(), ts.clone()].concat();
        assert_eq!(run(&[&body], DEFAULT_WINDOW).0, ts);
        // A short body that does not end on a packet boundary is left alone.
        let odd = [png(), ts, vec![1, 2, 3]].concat();
        assert_eq!(run(&[&odd], DEFAULT_WINDOW), (odd.clone(), Outcome::NotTs));
    }

    #[test]
    fn not_ts_passes_unchanged_and_holds_a_bounded_amount() {
        let window = 1000;
        let junk: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut u = TsUnwrap::new(window);
        let mut out = Vec::new();
        for c in junk.chunks(100) {
            if let Some(b) = u.push(Bytes::copy_from_slice(c)) {
                out.extend_from_slice(&b);
            }
            assert!(u.held.len() <= window + (CONFIRM - 1) * PACKET_LEN + 100);
        }
        assert_eq!(u.outcome(), Outcome::NotTs);
        assert!(u.finish().is_none());
        assert_eq!(out, junk);
    }

    #[test]
    fn a_start_beyond_the_window_is_not_taken() {
        let body = [vec![0u8; 600], packets(6)].concat();
        assert_eq!(find_start(&body, 500, false), Start::NotFound);
        assert_eq!(find_start(&body, 600, false), Start::At(600));
        assert_eq!(unwrap_whole(Bytes::from(body.clone()), 500), body);
    }

    #[test]
    fn undecided_candidate_waits_for_more() {
        let ts = packets(6);
        assert_eq!(
            find_start(&ts[..400], DEFAULT_WINDOW, false),
            Start::NeedMore
        );
        assert_eq!(find_start(&[], DEFAULT_WINDOW, false), Start::NeedMore);
        assert_eq!(find_start(&[], DEFAULT_WINDOW, true), Start::NotFound);
        assert_eq!(run(&[], DEFAULT_WINDOW), (Vec::new(), Outcome::NotTs));
    }

    #[test]
    fn a_trickled_body_is_searched_once_not_once_per_chunk() {
        // Near misses everywhere: blocks of sync bytes, each 188 bytes ahead of a block of zeros,
        // so every other offset is a candidate ruled out only when the next block arrives.
        let window = 16 * 1024;
        let mut body = Vec::new();
        while body.len() < window {
            body.extend([SYNC_BYTE; PACKET_LEN]);
            body.extend([0; PACKET_LEN]);
        }
        let wrapper = body.len();
        let ts = packets(6);
        body.extend(&ts);
        let chunks: Vec<&[u8]> = body.chunks(1).collect();
        let mut u = TsUnwrap::new(window + PACKET_LEN);
        let mut out = Vec::new();
        for c in &chunks {
            if let Some(b) = u.push(Bytes::copy_from_slice(c)) {
                out.extend_from_slice(&b);
            }
        }
        out.extend(u.finish().unwrap_or_default());
        assert_eq!(out, ts);
        assert_eq!(u.outcome(), Outcome::Stripped(wrapper));
        // The same bytes as the body whole.
        let (whole, outcome) = run(&[&body], window + PACKET_LEN);
        assert_eq!((whole, outcome), (ts, Outcome::Stripped(wrapper)));
        // An undecided candidate is looked at again for at most four packets' worth of chunks;
        // rescanning the held bytes per chunk would be ~body²/2 (about 150 million here).
        let bound = body.len() * CONFIRM * PACKET_LEN;
        assert!(u.scanned <= bound, "{} > {bound}", u.scanned);
    }

    proptest! {
        #[test]
        fn any_prefix_without_sync_bytes_is_stripped_whatever_the_chunking(
            prefix in proptest::collection::vec(any::<u8>().prop_filter("no sync", |b| *b != SYNC_BYTE), 0..3000),
            n in 1usize..12,
            cuts in proptest::collection::vec(1usize..700, 0..20),
        ) {
            let ts = packets(n);
            let body = [prefix.clone(), ts.clone()].concat();
            let mut chunks = Vec::new();
            let mut rest = &body[..];
            for c in cuts {
                let c = c.min(rest.len());
                let (a, b) = rest.split_at(c);
                chunks.push(a);
                rest = b;
            }
            chunks.push(rest);
            let (out, outcome) = run(&chunks, DEFAULT_WINDOW);
            prop_assert_eq!(out, ts);
            prop_assert_eq!(outcome, Outcome::Stripped(prefix.len()));
        }

        #[test]
        fn output_is_a_suffix_of_the_input_and_chunking_never_matters(
            body in proptest::collection::vec(prop_oneof![Just(SYNC_BYTE), any::<u8>()], 0..4000),
            cut in 0usize..4000,
            window in 0usize..3000,
        ) {
            let whole = unwrap_whole(Bytes::from(body.clone()), window);
            prop_assert!(body.ends_with(&whole));
            let cut = cut.min(body.len());
            let (out, _) = run(&[&body[..cut], &body[cut..]], window);
            prop_assert_eq!(out, whole.to_vec());
        }
    }
}
