//! One cached object (a URL variant at one version): its stored response head, length, validators
//! and freshness, and how it is written to and read from the disk tier.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sluice_http::freshness::{AgeClock, Freshness};

/// Identifies an object: a digest of its primary key and variant key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectId(pub u128);

impl ObjectId {
    pub fn new(primary: &str, variant: &str) -> ObjectId {
        let mut h = Sha256::new();
        h.update(primary.as_bytes());
        h.update([0]);
        h.update(variant.as_bytes());
        let d = h.finalize();
        ObjectId(u128::from_be_bytes(d[..16].try_into().expect("16 bytes")))
    }

    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

/// One slice of one version of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SliceKey {
    pub object: ObjectId,
    /// The object's version; 0 names a fill for an object whose version is not known yet.
    pub generation: u64,
    pub index: u64,
}

/// Headers never stored: hop-by-hop, per-message framing, and per-user state.
const NOT_STORED: [HeaderName; 10] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::CONTENT_LENGTH,
    header::CONTENT_RANGE,
    header::AGE,
    header::SET_COOKIE,
];

/// The response head and bookkeeping of a stored object.
#[derive(Debug, Clone)]
pub struct ObjectMeta {
    pub id: ObjectId,
    pub primary: String,
    pub variant: String,
    pub generation: u64,
    /// 200 for sliced bodies (a 206 from the origin is stored as the 200 it is part of).
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Total length; `None` while an origin that sent no length is still being read.
    pub length: Option<u64>,
    pub freshness: Freshness,
    pub clock: AgeClock,
    /// `Surrogate-Key` / `Cache-Tag` values, for purge by tag.
    pub tags: Vec<String>,
    /// The request headers this object varies on.
    pub vary: Vec<HeaderName>,
    /// Marked stale by a soft purge: the next use revalidates.
    pub soft_purged: bool,
    /// The origin answered a slice request with 206: later slices may be fetched ahead.
    pub range_capable: bool,
    /// The fields of a whole 200 answer from this object, written once (`serve::WireHit`).
    pub wire: WireHead,
}

/// The stored fields of an object as a whole-body answer writes them (`name: value` lines, the
/// fields that change per answer left out), made on the first hit that asks and kept with the
/// object's metadata. A copy of the metadata (a revalidation's new head, a soft purge) starts
/// empty, so the bytes never outlive the fields they were made from.
#[derive(Debug, Default)]
pub struct WireHead(std::sync::OnceLock<bytes::Bytes>);

impl WireHead {
    pub fn get_or_make(&self, make: impl FnOnce() -> bytes::Bytes) -> &bytes::Bytes {
        self.0.get_or_init(make)
    }
}

impl Clone for WireHead {
    fn clone(&self) -> WireHead {
        WireHead::default()
    }
}

impl ObjectMeta {
    /// Whether an answer for one of this object's slices is of the version stored, so its bytes
    /// may be put together with the stored slices (RFC 9111 §3.4): the same `ETag` and
    /// `Last-Modified`, and equal lengths where both are known. Equal weak `ETag`s count as the
    /// same bytes, a departure from RFC 9110 §15.3.7.3 (`docs/cache.md`, "Versions"): nginx's
    /// gzip and most CDNs send only weak tags, and their large objects could not be cached in
    /// slices otherwise. A length missing on either side (a chunked answer's, until its body
    /// ends) leaves the validators to decide; with no validator at all there is nothing else to
    /// compare, so both lengths must be known and equal.
    ///
    /// `headers` is an origin's head as it came: its validators are read as they would be stored
    /// ([`validator`]), so a field its `Connection` names, which the stored head lacks, is
    /// missing on both sides rather than on one (every later slice was another version).
    pub fn same_version(&self, headers: &HeaderMap, length: Option<u64>) -> bool {
        let same = |name: HeaderName| validator(headers, &name) == validator(&self.headers, &name);
        let validated = self.headers.contains_key(header::ETAG)
            || self.headers.contains_key(header::LAST_MODIFIED);
        same(header::ETAG)
            && same(header::LAST_MODIFIED)
            && match (self.length, length) {
                (Some(a), Some(b)) => a == b,
                _ => validated,
            }
    }

    /// Seconds of freshness left at `now` (negative once stale).
    pub fn ttl(&self, now: SystemTime) -> i64 {
        let lifetime = if self.soft_purged {
            0
        } else {
            self.freshness.lifetime
        };
        lifetime as i64 - self.clock.current_age(now) as i64
    }
}

/// Copies the end-to-end headers of an origin response worth storing: neither the hop-by-hop
/// ones nor those its `Connection` names (RFC 9111 §3.1), which are about the connection the
/// answer came on, not the response served later to other clients.
pub fn stored_headers(from: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(from.len());
    let named = sluice_http::hop::connection_names(from);
    for (name, value) in from {
        if NOT_STORED.contains(name)
            || name.as_str().starts_with("proxy-")
            || name == "keep-alive"
            || named.contains(name)
        {
            continue;
        }
        out.append(name.clone(), owned(value));
    }
    out
}

/// A validator field (`ETag`, `Last-Modified`) of `headers` as [`stored_headers`] keeps it: none
/// when the head's `Connection` names it. The version checks compare an origin's raw head with a
/// stored one; read unfiltered, the raw side had a field the stored side never can.
fn validator<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    let value = headers.get(name)?;
    if headers.contains_key(header::CONNECTION)
        && sluice_http::hop::connection_names(headers).contains(name)
    {
        return None;
    }
    Some(value)
}

/// `value` in an allocation of its own. A value hyper parsed is a view of the connection's read
/// buffer, which holds the start of the body too (for a 256 KiB object, the whole of it): kept
/// in the index, it kept that buffer alive as long as the object was indexed, long after the
/// memory tier had evicted its bytes (RSS grew by about an object's size per indexed object,
/// far past `memory_bytes`: S7).
fn owned(value: &HeaderValue) -> HeaderValue {
    let mut v = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
    v.set_sensitive(value.is_sensitive());
    v
}

/// The most one object's stored fields and tags may cost ([`head_bytes`]). An origin may send
/// hundreds of kilobytes of fields, or thousands of `Surrogate-Key` tags, with each answer; kept
/// for each of `max_objects` objects they would hold far more than `memory_bytes`. An answer
/// over this is served but not stored (booked as uncacheable, `writer.rs`).
pub const MAX_HEAD_BYTES: u64 = 64 << 10;

/// What one stored field or tag costs beside its own bytes: the map's entry, and the allocation
/// of its own each value gets (`owned`) or each tag is.
const ENTRY_BYTES: u64 = 64;

/// What an object's record costs beside its fields and tags: the struct, its keys' allocations
/// and the index's entries for it.
const OBJECT_BYTES: u64 = 256;

/// The memory an object's stored fields and tags cost: each field's name and value twice (as
/// stored, and as the wire form a hit may make of them, [`WireHead`]), each tag, and each
/// entry's bookkeeping.
pub fn head_bytes(headers: &HeaderMap, tags: &[String]) -> u64 {
    let fields: u64 = headers
        .iter()
        .map(|(k, v)| 2 * (k.as_str().len() + v.len()) as u64 + ENTRY_BYTES)
        .sum();
    let tags: u64 = tags.iter().map(|t| t.len() as u64 + ENTRY_BYTES).sum();
    fields + tags
}

impl ObjectMeta {
    /// What this object's record costs while indexed: its fields and tags ([`head_bytes`]), its
    /// keys and the record itself. Charged to `memory_bytes` (`index.rs`, `budget.rs`).
    ///
    /// Each key is counted as often as it is held: the variant three times (the record's own,
    /// the key of its primary's variant map and the entry in that primary's insertion order),
    /// the primary once (the record's own; the index charges its map key and order entry once
    /// per primary key, `index::key_charge`). A `Vary` on a long field (`User-Agent`, `Cookie`)
    /// makes long variant keys; counted once, three copies of them went past the budget.
    pub fn charge(&self) -> u64 {
        head_bytes(&self.headers, &self.tags)
            + self.primary.len() as u64
            + 3 * self.variant.len() as u64
            + self.vary.len() as u64 * ENTRY_BYTES
            + OBJECT_BYTES
    }
}

/// Updates stored headers with those of a 304 (RFC 9111 §4.3.4), leaving framing alone. The
/// stored entity tag stays when the 304's names the same opaque tag ([`validates`]): nginx's
/// strong `"x"` on a 304 for a gzipped 200 stored as `W/"x"` would otherwise mark compressed
/// bytes as strongly validated.
pub fn merge_not_modified(stored: &mut HeaderMap, fresh: &HeaderMap) {
    let update = stored_headers(fresh);
    let mut names: Vec<&HeaderName> = update.keys().collect();
    names.dedup();
    for name in names {
        if name == header::ETAG && stored.contains_key(header::ETAG) && validates(stored, fresh) {
            continue;
        }
        stored.remove(name);
        for v in update.get_all(name) {
            stored.append(name.clone(), v.clone());
        }
    }
}

/// Whether a 304's fields `fresh` may update the stored response `stored` (RFC 9111 §4.3.4): a
/// 304 that names an entity tag selects the stored responses with that tag. The comparison is
/// the weak one (RFC 9110 §8.8.3.2: the opaque tags equal, either side weak or strong), both
/// ways: nginx weakens the tag of a 200 its gzip filter compresses (`W/"x"` stored) but sends
/// the strong `"x"` on its 304s (the filter does not run on them), and a strong comparison
/// forgot such an object at every expiry. A 304 naming another opaque tag than the stored one
/// describes another representation, and its fields (the tag among them) must not be put on
/// the stored bytes. One that names none selects the stored response.
///
/// Both sides are read as stored ([`validator`]): an `ETag` the 304's `Connection` names is no
/// tag (it is not stored either), so an origin sending `Connection: etag` validates as one that
/// sends no `ETag` at all, not as one whose every 304 names another version.
pub fn validates(stored: &HeaderMap, fresh: &HeaderMap) -> bool {
    let Some(theirs) = validator(fresh, &header::ETAG) else {
        return true;
    };
    let Some(ours) = validator(stored, &header::ETAG) else {
        return false;
    };
    fn opaque(v: &HeaderValue) -> &[u8] {
        let b = v.as_bytes();
        b.strip_prefix(b"W/").unwrap_or(b)
    }
    opaque(theirs) == opaque(ours)
}

/// Tags from `Surrogate-Key` (space separated) and `Cache-Tag` (comma separated).
pub fn tags(headers: &HeaderMap) -> Vec<String> {
    let mut out = Vec::new();
    for v in headers.get_all("surrogate-key") {
        if let Ok(s) = v.to_str() {
            out.extend(s.split_ascii_whitespace().map(str::to_string));
        }
    }
    for v in headers.get_all("cache-tag") {
        if let Ok(s) = v.to_str() {
            out.extend(
                s.split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_string),
            );
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The layout of the primary keys a record was written under; a record of another layout (the
/// `route|host|target` keys before 2, which a `|` in a host could make ambiguous) is not read, and
/// the disk tier deletes it with its slices at start.
const KEY_LAYOUT: u32 = 2;

/// The longest object a record may describe (1 PiB): a longer one (a corrupt or hostile record)
/// is not read.
pub const MAX_LENGTH: u64 = 1 << 50;

/// Ages and lifetimes a record may carry, in seconds (136 years): a larger one is clamped, so
/// the age arithmetic neither overflows nor wraps to fresh.
const MAX_SECONDS: u64 = u32::MAX as u64;

/// The on-disk form of [`ObjectMeta`].
#[derive(Serialize, Deserialize)]
struct MetaRecord {
    #[serde(default)]
    key_layout: u32,
    id: ObjectId,
    primary: String,
    variant: String,
    generation: u64,
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    length: Option<u64>,
    lifetime: u64,
    swr: u64,
    sie: u64,
    must_revalidate: bool,
    no_cache: bool,
    targeted: bool,
    initial_age: u64,
    response_time_ms: u64,
    tags: Vec<String>,
    vary: Vec<String>,
    soft_purged: bool,
    #[serde(default)]
    range_capable: bool,
}

impl ObjectMeta {
    pub fn to_bytes(&self) -> Vec<u8> {
        let rec = MetaRecord {
            key_layout: KEY_LAYOUT,
            id: self.id,
            primary: self.primary.clone(),
            variant: self.variant.clone(),
            generation: self.generation,
            status: self.status.as_u16(),
            headers: self
                .headers
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
                .collect(),
            length: self.length,
            lifetime: self.freshness.lifetime,
            swr: self.freshness.stale_while_revalidate,
            sie: self.freshness.stale_if_error,
            must_revalidate: self.freshness.must_revalidate,
            no_cache: self.freshness.no_cache,
            targeted: self.freshness.targeted,
            initial_age: self.clock.initial_age,
            response_time_ms: self
                .clock
                .response_time
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            tags: self.tags.clone(),
            vary: self.vary.iter().map(|n| n.as_str().to_string()).collect(),
            soft_purged: self.soft_purged,
            range_capable: self.range_capable,
        };
        serde_json::to_vec(&rec).expect("meta serializes")
    }

    /// Reads a record written by [`ObjectMeta::to_bytes`]; `None` for anything malformed.
    pub fn from_bytes(bytes: &[u8]) -> Option<ObjectMeta> {
        let rec: MetaRecord = serde_json::from_slice(bytes).ok()?;
        if rec.key_layout != KEY_LAYOUT {
            return None;
        }
        let mut headers = HeaderMap::new();
        for (k, v) in rec.headers {
            headers.append(
                HeaderName::from_bytes(k.as_bytes()).ok()?,
                HeaderValue::from_bytes(&v).ok()?,
            );
        }
        let vary = rec
            .vary
            .iter()
            .map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .collect::<Option<Vec<_>>>()?;
        if ObjectId::new(&rec.primary, &rec.variant) != rec.id
            || rec.generation == 0
            || rec.length.is_some_and(|l| l > MAX_LENGTH)
        {
            return None;
        }
        Some(ObjectMeta {
            id: rec.id,
            primary: rec.primary,
            variant: rec.variant,
            generation: rec.generation,
            status: StatusCode::from_u16(rec.status).ok()?,
            headers,
            length: rec.length,
            freshness: Freshness {
                lifetime: rec.lifetime.min(MAX_SECONDS),
                stale_while_revalidate: rec.swr.min(MAX_SECONDS),
                stale_if_error: rec.sie.min(MAX_SECONDS),
                must_revalidate: rec.must_revalidate,
                no_cache: rec.no_cache,
                targeted: rec.targeted,
            },
            clock: AgeClock {
                initial_age: rec.initial_age.min(MAX_SECONDS),
                response_time: UNIX_EPOCH + Duration::from_millis(rec.response_time_ms),
            },
            tags: rec.tags,
            vary,
            soft_purged: rec.soft_purged,
            range_capable: rec.range_capable,
            wire: WireHead::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finding: the variant key was counted once though the index holds it three times (the
    /// record, the variant map's key, the primary's order), and the primary once beside the
    /// index's own two copies, charged per primary key. Now each is counted as held.
    #[test]
    fn keys_are_charged_as_often_as_they_are_held() {
        let mut m =
            (*crate::cache::index::tests::meta("p".repeat(10_000).as_str(), vec![], "", 1)).clone();
        m.variant = "v".repeat(20_000);
        let fields = head_bytes(&m.headers, &m.tags);
        assert_eq!(m.charge(), fields + 10_000 + 3 * 20_000 + OBJECT_BYTES);
    }

    /// Finding: `Connection` itself was left out of what is stored, but not the fields it
    /// names (RFC 9111 §3.1), so a field the origin meant for the cache's connection alone
    /// (a session hint, a per-connection quota) was stored and sent to every later client.
    #[test]
    fn fields_named_in_connection_are_not_stored() {
        let mut from = HeaderMap::new();
        from.append(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Conn-Only"),
        );
        from.append(header::CONNECTION, HeaderValue::from_static(" x-quota "));
        from.insert("x-conn-only", HeaderValue::from_static("secret"));
        from.insert("x-quota", HeaderValue::from_static("9"));
        from.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        from.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        from.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("max-age=60"),
        );
        let stored = stored_headers(&from);
        let names: Vec<&str> = stored.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["etag", "cache-control"]);
        // Nor does a 304's named field reach the stored head.
        let mut not_modified = HeaderMap::new();
        not_modified.insert(header::CONNECTION, HeaderValue::from_static("x-quota"));
        not_modified.insert("x-quota", HeaderValue::from_static("8"));
        not_modified.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("max-age=90"),
        );
        let mut merged = stored.clone();
        merge_not_modified(&mut merged, &not_modified);
        assert!(!merged.contains_key("x-quota"));
        assert_eq!(merged[header::CACHE_CONTROL], "max-age=90");
    }

    #[test]
    fn stored_headers_do_not_pin_the_buffer_they_were_parsed_from() {
        // A read buffer with a response head and the body after it, as hyper leaves it.
        let buffer = bytes::Bytes::from(vec![b'x'; 256 << 10]);
        let range = buffer.as_ptr() as usize..buffer.as_ptr() as usize + buffer.len();
        let mut parsed = HeaderMap::new();
        parsed.insert(
            header::ETAG,
            HeaderValue::from_maybe_shared(buffer.slice(10..16)).unwrap(),
        );
        let stored = stored_headers(&parsed);
        let v = &stored[header::ETAG];
        assert_eq!(v.as_bytes(), b"xxxxxx");
        assert!(
            !range.contains(&(v.as_bytes().as_ptr() as usize)),
            "the stored value is a view of the read buffer"
        );
    }

    #[test]
    fn meta_round_trips_and_rejects_tampering() {
        let mut headers = HeaderMap::new();
        headers.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        let meta = ObjectMeta {
            id: ObjectId::new("k", ""),
            primary: "k".into(),
            variant: String::new(),
            generation: 7,
            status: StatusCode::OK,
            headers,
            length: Some(10),
            freshness: Freshness {
                lifetime: 60,
                stale_while_revalidate: 1,
                stale_if_error: 2,
                must_revalidate: false,
                no_cache: false,
                targeted: false,
            },
            clock: AgeClock {
                initial_age: 3,
                response_time: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            },
            tags: vec!["a".into()],
            vary: vec![header::ACCEPT_ENCODING],
            soft_purged: false,
            range_capable: true,
            wire: Default::default(),
        };
        let back = ObjectMeta::from_bytes(&meta.to_bytes()).unwrap();
        assert_eq!(back.headers, meta.headers);
        assert_eq!(back.freshness, meta.freshness);
        assert_eq!(back.clock, meta.clock);
        assert_eq!(back.vary, meta.vary);
        let tampered = String::from_utf8(meta.to_bytes())
            .unwrap()
            .replace("\"primary\":\"k\"", "\"primary\":\"x\"");
        assert!(ObjectMeta::from_bytes(tampered.as_bytes()).is_none());
        assert!(ObjectMeta::from_bytes(b"{").is_none());
        // A record of the old key layout (no `key_layout`) is not read.
        let old = String::from_utf8(meta.to_bytes())
            .unwrap()
            .replace("\"key_layout\":2,", "");
        assert!(!old.contains("key_layout"));
        assert!(ObjectMeta::from_bytes(old.as_bytes()).is_none());
    }

    /// A record's ages and length are not trusted: an age near `u64::MAX` overflowed the age
    /// arithmetic (a panic in debug builds, fresh for ever once wrapped in release builds), and
    /// an absurd length is not read at all.
    #[test]
    fn a_record_s_ages_and_length_are_bounded() {
        let meta = crate::cache::index::tests::meta("k", vec![], "", 7);
        let rec = String::from_utf8(meta.to_bytes()).unwrap();
        assert!(rec.contains("\"initial_age\":0,") && rec.contains("\"length\":1,"));
        let old = rec.replace(
            "\"initial_age\":0,",
            &format!("\"initial_age\":{},", u64::MAX),
        );
        let back = ObjectMeta::from_bytes(old.as_bytes()).unwrap();
        assert!(
            back.ttl(SystemTime::now()) < 0,
            "a record that old is stale"
        );
        let forever = rec.replace("\"lifetime\":60,", &format!("\"lifetime\":{},", u64::MAX));
        let back = ObjectMeta::from_bytes(forever.as_bytes()).unwrap();
        assert!(back.freshness.lifetime <= u64::from(u32::MAX));
        let huge = rec.replace("\"length\":1,", &format!("\"length\":{},", MAX_LENGTH + 1));
        assert!(ObjectMeta::from_bytes(huge.as_bytes()).is_none());
        let big = rec.replace("\"length\":1,", &format!("\"length\":{MAX_LENGTH},"));
        assert!(ObjectMeta::from_bytes(big.as_bytes()).is_some());
    }

    /// Findings: slices of two versions could make one body when a length was missing on
    /// either side of an answer without validators; and (the mend of that) a weak `ETag` or a
    /// chunked record's missing length no longer matched, so every refetched slice of such an
    /// object was taken for another version and its responses cut. Equal tags, weak or strong,
    /// match; a missing length is left to the validators, and without any both must be known.
    #[test]
    fn versions_are_told_by_validators_then_by_known_lengths() {
        let head = |fields: &[(HeaderName, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in fields {
                h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
            }
            h
        };
        let stored = |fields: &[(HeaderName, &str)], length| {
            let mut m = (*crate::cache::index::tests::meta("k", vec![], "", 7)).clone();
            m.headers = head(fields);
            m.length = length;
            m
        };
        let strong = [(header::ETAG, "\"a\"")];
        let m = stored(&strong, Some(100));
        assert!(m.same_version(&head(&strong), Some(100)));
        assert!(!m.same_version(&head(&strong), Some(99)));
        assert!(!m.same_version(&head(&[(header::ETAG, "\"b\"")]), Some(100)));
        assert!(!m.same_version(&HeaderMap::new(), Some(100)));
        // A length missing on either side (a chunked answer) is left to the validators.
        assert!(m.same_version(&head(&strong), None));
        assert!(stored(&strong, None).same_version(&head(&strong), Some(100)));
        assert!(stored(&strong, None).same_version(&head(&strong), None));
        assert!(!stored(&strong, None).same_version(&head(&[(header::ETAG, "\"b\"")]), None));
        // Equal weak tags are trusted to name the same bytes; different ones, or a weak and a
        // strong form of one tag, are not.
        let weak = [(header::ETAG, "W/\"a\"")];
        assert!(stored(&weak, Some(100)).same_version(&head(&weak), Some(100)));
        assert!(stored(&weak, None).same_version(&head(&weak), None));
        assert!(
            !stored(&weak, Some(100)).same_version(&head(&[(header::ETAG, "W/\"b\"")]), Some(100))
        );
        assert!(!stored(&weak, Some(100)).same_version(&head(&strong), Some(100)));
        // A Last-Modified alone is a validator too.
        let dated = [(header::LAST_MODIFIED, "Tue, 14 Nov 2023 22:13:20 GMT")];
        assert!(stored(&dated, None).same_version(&head(&dated), Some(100)));
        // No validator at all: only the lengths, both known.
        assert!(stored(&[], Some(100)).same_version(&HeaderMap::new(), Some(100)));
        assert!(!stored(&[], Some(100)).same_version(&HeaderMap::new(), Some(99)));
        assert!(!stored(&[], Some(100)).same_version(&HeaderMap::new(), None));
        assert!(!stored(&[], None).same_version(&HeaderMap::new(), Some(100)));
        assert!(!stored(&[], None).same_version(&HeaderMap::new(), None));
    }

    /// A 304 updates the stored response only when the tag it names is the stored one, by the
    /// weak comparison both ways (RFC 9111 §4.3.4): nginx's gzipped 200 carries `W/"a"` and
    /// its 304 the strong `"a"`, which must not forget the object at every expiry.
    #[test]
    fn a_304_updates_only_the_response_its_tag_names() {
        let tagged = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::ETAG, HeaderValue::from_static(v));
            h
        };
        let untagged = HeaderMap::new();
        assert!(validates(&tagged("\"a\""), &tagged("\"a\"")));
        assert!(validates(&tagged("\"a\""), &untagged));
        assert!(!validates(&tagged("\"a\""), &tagged("\"b\"")));
        assert!(validates(&tagged("W/\"a\""), &tagged("\"a\"")));
        assert!(!validates(&tagged("W/\"a\""), &tagged("\"b\"")));
        assert!(!validates(&tagged("\"a\""), &tagged("W/\"b\"")));
        assert!(!validates(&tagged("\"a\""), &tagged("\"W/a\"")));
        // The stored (weak) tag stays on the stored bytes.
        let mut stored = tagged("W/\"a\"");
        merge_not_modified(&mut stored, &tagged("\"a\""));
        assert_eq!(stored.get(header::ETAG).unwrap(), "W/\"a\"");
        assert!(!validates(&untagged, &tagged("\"a\"")));
        assert!(validates(&tagged("\"a\""), &tagged("W/\"a\"")));
        assert!(validates(&tagged("W/\"a\""), &tagged("W/\"a\"")));
        assert!(!validates(&tagged("W/\"a\""), &tagged("W/\"b\"")));
    }

    /// Finding (review of a9211f4b): a field the origin's `Connection` names is not stored, but
    /// the version checks read the origin's raw head, so `Connection: etag` left the stored head
    /// without the tag the raw one had: every later slice was "another version" and every 304
    /// named "another" tag. Both sides are now read as stored.
    #[test]
    fn a_validator_named_in_connection_is_absent_on_both_sides() {
        let mut raw = HeaderMap::new();
        raw.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, ETag"),
        );
        raw.insert(header::ETAG, HeaderValue::from_static("\"a\""));
        raw.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("max-age=60"),
        );
        let mut m = (*crate::cache::index::tests::meta("k", vec![], "", 7)).clone();
        m.headers = stored_headers(&raw);
        m.length = Some(100);
        assert!(!m.headers.contains_key(header::ETAG));
        assert!(m.same_version(&raw, Some(100)));
        assert!(!m.same_version(&raw, Some(99)));
        // A 304 with the named tag validates as one without a tag; an unnamed tag still counts.
        let mut not_modified = HeaderMap::new();
        not_modified.insert(header::CONNECTION, HeaderValue::from_static("etag"));
        not_modified.insert(header::ETAG, HeaderValue::from_static("\"a\""));
        assert!(validates(&m.headers, &not_modified));
        not_modified.remove(header::CONNECTION);
        assert!(!validates(&m.headers, &not_modified));
    }

    #[test]
    fn tags_from_both_fields() {
        let mut h = HeaderMap::new();
        h.insert("surrogate-key", HeaderValue::from_static("a b"));
        h.insert("cache-tag", HeaderValue::from_static("c, a"));
        assert_eq!(tags(&h), vec!["a", "b", "c"]);
    }
}
