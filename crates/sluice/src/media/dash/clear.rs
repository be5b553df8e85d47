//! Decrypted media segments, kept for a short while: the viewers of one live DASH ClearKey channel
//! ask for the same segment with the same keys within a second or two, and should cost one
//! decryption between them, not one each. Concurrent requests for a segment that is being
//! decrypted wait for that one. Failures are not kept.

use std::time::{Duration, Instant};

use bytes::Bytes;
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use sluice_media::dash::proxy::Part;
use sluice_media::keys::KeyRing;

use crate::cache::CacheKey;
use crate::error::ProxyError;

/// Bytes of clear segments held at most.
const CAPACITY_BYTES: u64 = 32 << 20;

/// What a clear segment is a function of: the fetched bytes (URL, range and upstream headers),
/// the init that describes them, and the keys.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClearKey {
    pub segment: CacheKey,
    pub segment_part: Part,
    pub init: Part,
    pub keys: KeyRing,
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
    /// made now by `decrypt`.
    pub async fn get_or_decrypt(
        &self,
        key: ClearKey,
        decrypt: impl FnOnce() -> Result<Bytes, ProxyError>,
    ) -> Result<Bytes, ProxyError> {
        if self.ttl.is_zero() {
            return decrypt();
        }
        for _ in 0..2 {
            match self.cache.get_value_or_guard_async(&key).await {
                Ok((bytes, made)) if made.elapsed() < self.ttl => return Ok(bytes),
                Ok(_) => {
                    self.cache.remove(&key);
                }
                Err(guard) => {
                    let bytes = decrypt()?;
                    let _ = guard.insert((bytes.clone(), Instant::now()));
                    return Ok(bytes);
                }
            }
        }
        decrypt()
    }
}
