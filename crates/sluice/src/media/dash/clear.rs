//! Decrypted media segments, kept for a short while: the viewers of one live DASH ClearKey channel
//! ask for the same segment with the same keys within a second or two, and should cost one
//! decryption between them, not one each. Concurrent requests for a segment that is being
//! decrypted wait for that one. Failures are not kept.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use sluice_media::dash::proxy::Part;
use sluice_media::keys::KeyRing;

use crate::cache::CacheKey;
use crate::error::ProxyError;
use crate::media::cache::request_key;

/// Bytes of clear segments held at most.
const CAPACITY_BYTES: u64 = 32 << 20;

/// What a clear segment is a function of: the fetched bytes (URL, range and upstream headers),
/// the init that describes them, and the keys. Built only by [`ClearKey::new`] (the fields are
/// private), so no call site can key a segment without its init's request.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClearKey {
    segment: CacheKey,
    segment_part: Part,
    init: Part,
    keys: KeyRing,
}

impl ClearKey {
    /// What a clear (or remuxed) segment is cached under: the segment's request key, its init's
    /// (URL and upstream headers: each is fetched with the credentials decided for its own URL,
    /// so the two differ when only one of them is on the viewer's origin), the parts and the
    /// keys.
    pub(super) fn new(
        segment: &Part,
        headers: &HeaderMap,
        init: &Part,
        init_headers: &HeaderMap,
        keys: KeyRing,
    ) -> ClearKey {
        let segment_key = request_key(&segment.url, headers).0;
        let init_key = request_key(&init.url, init_headers).0;
        // Length-prefixed: no two pairs of keys give one string.
        let both = format!("{}|{segment_key}|{init_key}", segment_key.len());
        ClearKey {
            segment: CacheKey(both),
            segment_part: segment.clone(),
            init: init.clone(),
            keys,
        }
    }
}

#[derive(Clone)]
struct ByLength;

impl Weighter<ClearKey, (Bytes, Instant)> for ByLength {
    fn weight(&self, _key: &ClearKey, val: &(Bytes, Instant)) -> u64 {
        val.0.len() as u64 + 256
    }
}

/// The kept clear segments.
pub struct ClearSegments {
    cache: Cache<ClearKey, (Bytes, Instant), ByLength>,
    ttl: Duration,
}

impl ClearSegments {
    /// Segments are kept `ttl` after their decryption.
    pub fn new(ttl: Duration) -> Self {
        ClearSegments {
            cache: Cache::with_weighter(256, CAPACITY_BYTES, ByLength),
            ttl,
        }
    }

    /// The clear segment for `key`: kept, or being made by another request (waited for), or
    /// made now by `decrypt` on the blocking pool (see [`off_runtime`]).
    pub async fn get_or_decrypt(
        &self,
        key: ClearKey,
        decrypt: impl FnOnce() -> Result<Bytes, ProxyError> + Send + 'static,
    ) -> Result<Bytes, ProxyError> {
        if self.ttl.is_zero() {
            return off_runtime(decrypt).await;
        }
        for _ in 0..2 {
            match self.cache.get_value_or_guard_async(&key).await {
                Ok((bytes, made)) if made.elapsed() < self.ttl => return Ok(bytes),
                Ok(_) => {
                    self.cache.remove(&key);
                }
                Err(guard) => {
                    // A failure (a panic included) drops the guard: the waiters try again.
                    let bytes = off_runtime(decrypt).await?;
                    let _ = guard.insert((bytes.clone(), Instant::now()));
                    return Ok(bytes);
                }
            }
        }
        off_runtime(decrypt).await
    }
}

/// Runs `make` on the blocking pool, in the segment lane of `media::cpu`.
/// Decrypting or remuxing a segment of up to `media.max_segment_bytes` holds a thread for a long
/// time; on a runtime worker it would stall every other request queued there. A panic in `make`
/// is this request's 500, not a hang.
async fn off_runtime(
    make: impl FnOnce() -> Result<Bytes, ProxyError> + Send + 'static,
) -> Result<Bytes, ProxyError> {
    match crate::media::cpu::run(crate::media::cpu::Lane::Segment, make).await {
        Ok(made) => made,
        Err(e) if e.is_panic() => {
            tracing::error!("a segment decryption or remux panicked");
            Err(ProxyError::internal(
                "the segment could not be decrypted or remuxed (internal failure)",
            ))
        }
        Err(_) => Err(ProxyError::internal(
            "the segment's decryption or remux was cancelled (shutting down)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;

    use http::StatusCode;

    use super::*;
    use crate::error::Side;

    fn key(path: &str) -> ClearKey {
        let part = Part {
            url: url::Url::parse(&format!("http://o/{path}")).unwrap(),
            range: None,
        };
        let none = HeaderMap::new();
        ClearKey::new(&part, &none, &part, &none, KeyRing::default())
    }

    /// The work runs on another thread than the request's: on this single-threaded runtime, the
    /// runtime's only worker.
    #[tokio::test]
    async fn segments_are_made_off_the_runtime_thread() {
        for ttl in [Duration::ZERO, Duration::from_secs(5)] {
            let clear = ClearSegments::new(ttl);
            let ran_on: Arc<Mutex<Option<ThreadId>>> = Arc::default();
            let r = Arc::clone(&ran_on);
            let bytes = clear
                .get_or_decrypt(key("a.m4s"), move || {
                    *r.lock().unwrap() = Some(std::thread::current().id());
                    Ok(Bytes::from_static(b"clear"))
                })
                .await
                .unwrap();
            assert_eq!(bytes, "clear");
            let ran_on = ran_on.lock().unwrap().expect("the work ran");
            assert_ne!(ran_on, std::thread::current().id(), "ttl {ttl:?}");
        }
    }

    /// A panic in the work is a 500 booked to sluice, and the segment is made on the next ask.
    #[tokio::test]
    async fn a_panic_is_an_internal_error_and_the_next_request_makes_the_segment() {
        let clear = ClearSegments::new(Duration::from_secs(5));
        let err = clear
            .get_or_decrypt(key("b.m4s"), || panic!("remuxer bug"))
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(err.side, Side::Internal);
        assert!(err.message.contains("internal failure"), "{}", err.message);
        let bytes = clear
            .get_or_decrypt(key("b.m4s"), || Ok(Bytes::from_static(b"made")))
            .await
            .unwrap();
        assert_eq!(bytes, "made");
    }
}
