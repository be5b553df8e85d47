//! The process's one slice cache, built the first time a front end needs it (at start or by a
//! live reload) and kept for the life of the process, so reloads never drop what it holds.

use std::sync::Mutex;

use prometheus_client::registry::Registry;

use super::metrics::CacheMetrics;
use super::{Cache, CacheConfig, CacheError};

/// Holds the cache once built; its metric families are registered up front, since the registry
/// is shared (read-only) by the time a reload asks for a cache.
pub struct CacheSlot {
    cache: Mutex<Option<Cache>>,
    metrics: CacheMetrics,
    /// The API password a cache built later accepts as a purge key (swapped by a reload).
    api_password: Mutex<Option<String>>,
}

impl CacheSlot {
    /// Registers the cache's families; builds nothing yet.
    pub fn new(api_password: Option<&str>, registry: &mut Registry) -> CacheSlot {
        CacheSlot {
            cache: Mutex::new(None),
            metrics: CacheMetrics::new(registry),
            api_password: Mutex::new(api_password.map(str::to_string)),
        }
    }

    /// The cache, if one was built.
    pub fn get(&self) -> Option<Cache> {
        self.lock().clone()
    }

    /// The cache, built from `config` if there is none yet. An existing cache is returned as it
    /// is: its tiers and sizes (`[cache]`) change only with a restart. Must run inside a tokio
    /// runtime the first time (the disk writer and the gauges are tasks).
    pub fn get_or_create(&self, config: &CacheConfig) -> Result<Cache, CacheError> {
        let mut slot = self.lock();
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let password = self
            .api_password
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let cache = Cache::with_metrics(config, password.as_deref(), self.metrics.clone())?;
        *slot = Some(cache.clone());
        Ok(cache)
    }

    /// A reload's `[auth]` password and `[cache]` purge keys: for the cache if built, and for
    /// the one a later reload builds.
    pub fn set_purge(&self, config: &CacheConfig, api_password: Option<&str>) {
        *self.api_password.lock().unwrap_or_else(|e| e.into_inner()) =
            api_password.map(str::to_string);
        if let Some(cache) = self.get() {
            cache.set_purge(super::purge::PurgeSecrets::new(config, api_password));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Cache>> {
        // Nothing is left half-done under the lock, so a poisoned one is still consistent.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn built_once_then_shared() {
        let mut registry = Registry::default();
        let slot = CacheSlot::new(None, &mut registry);
        assert!(slot.get().is_none());
        let config = CacheConfig::default();
        let a = slot.get_or_create(&config).unwrap();
        let b = slot.get_or_create(&config).unwrap();
        assert!(a.same_as(&b));
        assert!(slot.get().unwrap().same_as(&a));
        // A bad section is refused and leaves the slot as it was.
        let fresh = CacheSlot::new(None, &mut Registry::default());
        let bad = CacheConfig {
            slice_bytes: super::super::ByteSize(10),
            ..CacheConfig::default()
        };
        assert!(fresh.get_or_create(&bad).is_err());
        assert!(fresh.get().is_none());
    }
}
