//! What a login answer costs once parsed into a `serde_json::Value`, estimated from above by a
//! first pass over its text that builds nothing, so the memory can be asked for before it is used.

use std::fmt;
use std::mem::size_of;

use serde::de::{self, MapAccess, SeqAccess};
use serde_json::Value;

/// Entries per node of a `serde_json::Map` (std's `BTreeMap`, whose nodes are allocated whole).
const NODE_ENTRIES: usize = 11;

/// Bytes the value parsed from `text` holds, or `None` when `serde_json::from_str` would refuse
/// `text`.
pub fn parsed(text: &str) -> Option<usize> {
    let Cost(heap) = serde_json::from_str::<Cost>(text).ok()?;
    Some(heap.saturating_add(size_of::<Value>()))
}

/// Bytes `entries` inserted into maps add to a parsed value (each a new key and a string value of
/// `text` bytes in all): what editing the value may add to [`parsed`].
pub fn inserted(entries: usize, text: usize) -> usize {
    let entry = 2 * (size_of::<String>() + size_of::<Value>()) + 2 * heap(1);
    entries.saturating_mul(entry).saturating_add(text)
}

/// An allocation of `n` bytes with the allocator's header and rounding.
fn heap(n: usize) -> usize {
    match n {
        0 => 0,
        n => n.saturating_add(16).next_multiple_of(16),
    }
}

/// A `Vec<Value>` of `n` pushed one by one: it doubles from 4.
fn array(n: usize) -> usize {
    match n {
        0 => 0,
        n => {
            let cap = n.checked_next_power_of_two().unwrap_or(n).max(4);
            heap(cap.saturating_mul(size_of::<Value>()))
        }
    }
}

/// A map of `n` entries: every node but the root holds at least half its entries, and an
/// internal node carries its children's pointers too.
fn map(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let entry = size_of::<String>() + size_of::<Value>();
    let node = NODE_ENTRIES * entry + (NODE_ENTRIES + 1) * size_of::<usize>() + 16;
    let nodes = n.div_ceil(NODE_ENTRIES / 2) + 1;
    nodes.saturating_mul(heap(node))
}

/// The heap bytes one JSON value owns (its own slot is counted by what holds it).
struct Cost(usize);

impl<'de> de::Deserialize<'de> for Cost {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Measure)
    }
}

struct Measure;

impl<'de> de::Visitor<'de> for Measure {
    type Value = Cost;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Cost, E> {
        Ok(Cost(0))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Cost, E> {
        Ok(Cost(0))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Cost, E> {
        Ok(Cost(0))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Cost, E> {
        Ok(Cost(0))
    }

    fn visit_unit<E>(self) -> Result<Cost, E> {
        Ok(Cost(0))
    }

    fn visit_str<E>(self, s: &str) -> Result<Cost, E> {
        Ok(Cost(heap(s.len())))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Cost, A::Error> {
        let (mut n, mut inner) = (0usize, 0usize);
        while let Some(Cost(item)) = seq.next_element()? {
            n += 1;
            inner = inner.saturating_add(item);
        }
        Ok(Cost(inner.saturating_add(array(n))))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Cost, A::Error> {
        let (mut n, mut inner) = (0usize, 0usize);
        // A key is measured as a string value is: its own heap bytes; its slot is the map's.
        while let Some(Cost(key)) = m.next_key()? {
            let Cost(value) = m.next_value()?;
            n += 1;
            inner = inner.saturating_add(key).saturating_add(value);
        }
        Ok(Cost(inner.saturating_add(map(n))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_covers_what_parsing_builds() {
        // `[0,0,...]`: a 32-byte value per two bytes of text, in a buffer that doubled.
        let zeros = format!("[{}0]", "0,".repeat(99_999));
        let cost = parsed(&zeros).unwrap();
        assert!(cost >= 100_000 * size_of::<Value>(), "{cost}");
        assert!(cost <= 2 * 131_072 * size_of::<Value>(), "{cost}");
        // Strings and keys count their text; maps their nodes.
        let strings = parsed(r#"{"abcdefgh":"0123456789abcdef0123456789"}"#).unwrap();
        let bare = parsed(r#"{"":""}"#).unwrap();
        assert!(strings >= bare + 8 + 26, "{strings} {bare}");
        assert!(bare >= NODE_ENTRIES * (size_of::<String>() + size_of::<Value>()));
        assert_eq!(parsed("0"), Some(size_of::<Value>()));
        assert_eq!(parsed("[1"), None);
        assert_eq!(parsed("1 2"), None);
    }
}
