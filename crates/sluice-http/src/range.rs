//! `Range` request sets, `Content-Range`, multipart/byteranges framing, and the aligned slices that
//! cover a byte range (RFC 9110 §14). No I/O.

/// Most ranges honoured in one request; more is treated as no `Range` at all (RFC 9110 §14.2 lets a
/// server ignore a range set it finds abusive), so a client cannot make one request fan out.
pub const MAX_RANGES: usize = 32;

/// What one part of a `multipart/byteranges` answer costs beyond its bytes (delimiter and part
/// head, rounded up): the measure of whether several parts are cheaper than the whole.
pub const PART_OVERHEAD: u64 = 96;

/// One range as asked for, before the length is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeSpec {
    /// `first-last` or `first-` (`last` = None).
    From { first: u64, last: Option<u64> },
    /// `-n`: the last n bytes.
    Suffix(u64),
}

/// A resolved, satisfiable range: `start..=end` within the representation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    pub fn len(&self) -> u64 {
        self.end - self.start + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// What a `Range` header means for a representation of a known length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeOutcome {
    /// Ignore it and send the whole representation (malformed, not `bytes`, too many ranges).
    Whole,
    /// Send these ranges (206).
    Partial(Vec<ByteRange>),
    /// Nothing in it overlaps the representation (416 with `Content-Range: bytes */len`).
    Unsatisfiable,
}

/// Parses a `Range` field value into specs; `None` when it is malformed or not in bytes.
pub fn parse_range(value: &str) -> Option<Vec<RangeSpec>> {
    let (unit, set) = value.trim().split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    let mut specs = Vec::new();
    for item in set.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (a, b) = item.split_once('-')?;
        let (a, b) = (a.trim(), b.trim());
        let spec = if a.is_empty() {
            RangeSpec::Suffix(digits(b)?)
        } else {
            let first = digits(a)?;
            let last = if b.is_empty() { None } else { Some(digits(b)?) };
            if matches!(last, Some(l) if l < first) {
                return None;
            }
            RangeSpec::From { first, last }
        };
        specs.push(spec);
        if specs.len() > MAX_RANGES {
            return None;
        }
    }
    (!specs.is_empty()).then_some(specs)
}

fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Resolves a `Range` header against a representation of `length` bytes.
///
/// Against amplification (`bytes=0-` 32 times would send the object 32 times), ranges that
/// overlap or touch are coalesced (RFC 9110 §14.2 allows it; the rest keep the order they were
/// asked in), and a set of several ranges whose parts would cost as much as the whole
/// representation is answered with the whole, as a 200 (§14.2 lets a server ignore `Range`). So
/// no answer is much longer than the representation.
pub fn resolve_range(value: &str, length: u64) -> RangeOutcome {
    let Some(specs) = parse_range(value) else {
        return RangeOutcome::Whole;
    };
    let mut out = Vec::new();
    for spec in specs {
        let r = match spec {
            RangeSpec::From { first, .. } if first >= length => continue,
            RangeSpec::From { first, last } => ByteRange {
                start: first,
                end: last.unwrap_or(u64::MAX).min(length - 1),
            },
            RangeSpec::Suffix(0) => continue,
            RangeSpec::Suffix(_) if length == 0 => continue,
            RangeSpec::Suffix(n) => ByteRange {
                start: length.saturating_sub(n),
                end: length - 1,
            },
        };
        out.push(r);
    }
    if out.is_empty() {
        return RangeOutcome::Unsatisfiable;
    }
    let out = coalesce(out);
    if out.len() > 1 {
        let cost = out
            .iter()
            .map(|r| r.len().saturating_add(PART_OVERHEAD))
            .fold(0u64, u64::saturating_add);
        if cost >= length {
            return RangeOutcome::Whole;
        }
    }
    RangeOutcome::Partial(out)
}

/// Merges ranges that overlap or touch, in ascending order; a set with none keeps its order.
pub fn coalesce(ranges: Vec<ByteRange>) -> Vec<ByteRange> {
    let mut sorted = ranges.clone();
    sorted.sort_by_key(|r| (r.start, r.end));
    let touching = sorted
        .windows(2)
        .any(|w| w[1].start <= w[0].end.saturating_add(1));
    if !touching {
        return ranges;
    }
    let mut out: Vec<ByteRange> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match out.last_mut() {
            Some(last) if r.start <= last.end.saturating_add(1) => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// A parsed `Content-Range` of a 206 or 416.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    /// `None` for `bytes */len`.
    pub range: Option<ByteRange>,
    /// `None` for `/*`.
    pub complete_length: Option<u64>,
}

/// Parses `bytes first-last/len`, `bytes first-last/*` or `bytes */len`.
pub fn parse_content_range(value: &str) -> Option<ContentRange> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    let (range, len) = rest.split_once('/')?;
    let complete_length = match len.trim() {
        "*" => None,
        l => Some(digits(l)?),
    };
    let range = match range.trim() {
        "*" => None,
        r => {
            let (a, b) = r.split_once('-')?;
            let (start, end) = (digits(a.trim())?, digits(b.trim())?);
            if end < start || matches!(complete_length, Some(l) if end >= l) {
                return None;
            }
            Some(ByteRange { start, end })
        }
    };
    if range.is_none() && complete_length.is_none() {
        return None;
    }
    Some(ContentRange {
        range,
        complete_length,
    })
}

/// Renders `bytes start-end/len`.
pub fn content_range(r: ByteRange, length: u64) -> String {
    format!("bytes {}-{}/{}", r.start, r.end, length)
}

/// The indexes of the `slice_bytes`-aligned slices that cover `r` (inclusive).
pub fn slices_covering(r: ByteRange, slice_bytes: u64) -> std::ops::RangeInclusive<u64> {
    (r.start / slice_bytes)..=(r.end / slice_bytes)
}

/// The byte range of slice `index`, clipped to `length` when known. The arithmetic saturates:
/// a client's range may start anywhere up to `u64::MAX`, and with a slice size that is not a
/// power of two (`1MB`) the last slice's end lies past it.
pub fn slice_range(index: u64, slice_bytes: u64, length: Option<u64>) -> ByteRange {
    let start = index.saturating_mul(slice_bytes);
    let mut end = start.saturating_add(slice_bytes - 1);
    if let Some(len) = length {
        end = end.min(len.saturating_sub(1));
    }
    ByteRange { start, end }
}

/// The number of slices of a representation of `length` bytes.
pub fn slice_count(length: u64, slice_bytes: u64) -> u64 {
    length.div_ceil(slice_bytes)
}

/// The framing of a `multipart/byteranges` body.
#[derive(Debug, Clone)]
pub struct Multipart {
    pub boundary: String,
    pub content_type: Option<String>,
    pub length: u64,
}

impl Multipart {
    /// The header block that opens the part for `r`.
    pub fn part_head(&self, r: ByteRange) -> String {
        let mut s = format!("\r\n--{}\r\n", self.boundary);
        if let Some(ct) = &self.content_type {
            s.push_str(&format!("Content-Type: {ct}\r\n"));
        }
        s.push_str(&format!(
            "Content-Range: {}\r\n\r\n",
            content_range(r, self.length)
        ));
        s
    }

    /// The closing delimiter.
    pub fn tail(&self) -> String {
        format!("\r\n--{}--\r\n", self.boundary)
    }

    /// The whole body length for these ranges, for `Content-Length`.
    pub fn body_length(&self, ranges: &[ByteRange]) -> u64 {
        ranges
            .iter()
            .map(|r| self.part_head(*r).len() as u64 + r.len())
            .sum::<u64>()
            + self.tail().len() as u64
    }

    /// The `Content-Type` of the whole response.
    pub fn response_type(&self) -> String {
        format!("multipart/byteranges; boundary={}", self.boundary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn br(start: u64, end: u64) -> ByteRange {
        ByteRange { start, end }
    }

    #[test]
    fn resolves_forms() {
        assert_eq!(
            resolve_range("bytes=0-9", 100),
            RangeOutcome::Partial(vec![br(0, 9)])
        );
        assert_eq!(
            resolve_range("bytes=90-", 100),
            RangeOutcome::Partial(vec![br(90, 99)])
        );
        assert_eq!(
            resolve_range("bytes=-10", 100),
            RangeOutcome::Partial(vec![br(90, 99)])
        );
        assert_eq!(
            resolve_range("bytes=-1000", 100),
            RangeOutcome::Partial(vec![br(0, 99)])
        );
        assert_eq!(
            resolve_range("bytes=50-1000", 100),
            RangeOutcome::Partial(vec![br(50, 99)])
        );
        assert_eq!(
            resolve_range("bytes=0-0, -1", 1000),
            RangeOutcome::Partial(vec![br(0, 0), br(999, 999)])
        );
    }

    #[test]
    fn amplifying_sets_are_coalesced_or_answered_whole() {
        let len = 3 << 20;
        let all = RangeOutcome::Partial(vec![br(0, len - 1)]);
        // `bytes=0-` 32 times is one range: the object once.
        let many = format!("bytes={}", vec!["0-"; 32].join(","));
        assert_eq!(resolve_range(&many, len), all);
        // Overlapping and touching ranges merge, whatever their order.
        assert_eq!(
            resolve_range("bytes=100-199,0-99,50-150,1000-1999,2000-2999", len),
            RangeOutcome::Partial(vec![br(0, 199), br(1000, 2999)])
        );
        // Disjoint ranges keep the order they were asked in.
        assert_eq!(
            resolve_range("bytes=5000-5009,0-9", len),
            RangeOutcome::Partial(vec![br(5000, 5009), br(0, 9)])
        );
        // Several parts that cost as much as the whole: the whole, as a 200.
        assert_eq!(resolve_range("bytes=0-40,60-99", 100), RangeOutcome::Whole);
        let halves = format!("bytes=0-{},{}-", len / 2 - 2, len / 2);
        assert_eq!(resolve_range(&halves, len), RangeOutcome::Whole);
        // One range is a 206 even when it is the whole (players ask `bytes=0-`).
        assert_eq!(
            resolve_range("bytes=0-", len),
            RangeOutcome::Partial(vec![br(0, len - 1)])
        );
    }

    #[test]
    fn unsatisfiable_and_malformed() {
        assert_eq!(
            resolve_range("bytes=100-", 100),
            RangeOutcome::Unsatisfiable
        );
        assert_eq!(resolve_range("bytes=-0", 100), RangeOutcome::Unsatisfiable);
        assert_eq!(resolve_range("bytes=0-", 0), RangeOutcome::Unsatisfiable);
        for bad in [
            "items=0-1",
            "bytes=5-1",
            "bytes=a-b",
            "bytes=",
            "bytes",
            "bytes=--1",
        ] {
            assert_eq!(resolve_range(bad, 100), RangeOutcome::Whole, "{bad}");
        }
        let many = format!("bytes={}", vec!["0-0"; MAX_RANGES + 1].join(","));
        assert_eq!(resolve_range(&many, 100), RangeOutcome::Whole);
    }

    #[test]
    fn content_range_forms() {
        assert_eq!(
            parse_content_range("bytes 0-9/100"),
            Some(ContentRange {
                range: Some(br(0, 9)),
                complete_length: Some(100)
            })
        );
        assert_eq!(
            parse_content_range("bytes 0-9/*"),
            Some(ContentRange {
                range: Some(br(0, 9)),
                complete_length: None
            })
        );
        assert_eq!(
            parse_content_range("bytes */100"),
            Some(ContentRange {
                range: None,
                complete_length: Some(100)
            })
        );
        assert_eq!(parse_content_range("bytes 0-100/100"), None);
        assert_eq!(parse_content_range("bytes */*"), None);
        assert_eq!(content_range(br(0, 9), 100), "bytes 0-9/100");
    }

    #[test]
    fn slices() {
        let s = 1024;
        assert_eq!(slices_covering(br(0, 0), s), 0..=0);
        assert_eq!(slices_covering(br(1023, 1024), s), 0..=1);
        assert_eq!(
            slices_covering(br(3 << 30, (3 << 30) + (1 << 20) - 1), 1 << 20),
            3072..=3072
        );
        assert_eq!(slice_range(2, s, Some(2100)), br(2048, 2099));
        assert_eq!(slice_range(2, s, None), br(2048, 3071));
        assert_eq!(slice_count(2048, s), 2);
        assert_eq!(slice_count(2049, s), 3);
        // The slice a client's `bytes=18446744073709551615-` lands in, with a decimal slice
        // size: its end is past u64::MAX, so it stops there.
        let decimal = 1_000_000;
        let last = slice_range(u64::MAX / decimal, decimal, None);
        assert_eq!(last, br(u64::MAX / decimal * decimal, u64::MAX));
    }

    #[test]
    fn multipart_length_matches_rendering() {
        let m = Multipart {
            boundary: "B".into(),
            content_type: Some("video/mp4".into()),
            length: 100,
        };
        let ranges = [br(0, 9), br(50, 59)];
        let mut body = String::new();
        for r in ranges {
            body.push_str(&m.part_head(r));
            body.push_str(&"x".repeat(r.len() as usize));
        }
        body.push_str(&m.tail());
        assert_eq!(body.len() as u64, m.body_length(&ranges));
        assert!(body.contains("Content-Range: bytes 50-59/100"));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,100}", len in 0u64..1_000_000) {
            let _ = resolve_range(&s, len);
            let _ = parse_content_range(&s);
        }

        /// Whatever the set, the answer is never much longer than the representation: at most
        /// the whole, or parts (with their overhead) that cost less than it.
        #[test]
        fn answers_are_bounded(
            specs in proptest::collection::vec((0u64..5_000, proptest::option::of(0u64..5_000)), 1..40),
            len in 1u64..5_000,
        ) {
            let set: Vec<String> = specs
                .iter()
                .map(|(a, b)| match b {
                    Some(b) => format!("{}-{}", a.min(b), a.max(b)),
                    None => format!("{a}-"),
                })
                .collect();
            if let RangeOutcome::Partial(rs) = resolve_range(&format!("bytes={}", set.join(",")), len) {
                let total: u64 = rs.iter().map(ByteRange::len).sum();
                proptest::prop_assert!(total <= len);
                if rs.len() > 1 {
                    proptest::prop_assert!(total + PART_OVERHEAD * rs.len() as u64 <= len);
                }
                let mut sorted = rs.clone();
                sorted.sort_by_key(|r| r.start);
                for w in sorted.windows(2) {
                    proptest::prop_assert!(w[1].start > w[0].end + 1, "{:?}", rs);
                }
            }
        }

        #[test]
        fn resolved_ranges_are_inside(a in 0u64..10_000, b in 0u64..10_000, len in 1u64..10_000) {
            let (lo, hi) = (a.min(b), a.max(b));
            if let RangeOutcome::Partial(rs) = resolve_range(&format!("bytes={lo}-{hi}"), len) {
                for r in rs {
                    proptest::prop_assert!(r.start <= r.end && r.end < len);
                }
            }
        }

        #[test]
        fn slices_cover_exactly(start in 0u64..1_000_000, n in 1u64..100_000, slice in 1u64..70_000) {
            let r = ByteRange { start, end: start + n - 1 };
            let idx = slices_covering(r, slice);
            let first = slice_range(*idx.start(), slice, None);
            let last = slice_range(*idx.end(), slice, None);
            proptest::prop_assert!(first.start <= r.start && last.end >= r.end);
            proptest::prop_assert!(first.end >= r.start && last.start <= r.end);
        }
    }
}
