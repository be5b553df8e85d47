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
    /// Where a cache built later charges wrong purge keys: the API password's limiter.
    guesses: Mutex<Option<std::sync::Arc<crate::auth::guesses::Guesses>>>,
}

impl CacheSlot {
    /// Registers the cache's families; builds nothing yet.
    pub fn new(api_password: Option<&str>, registry: &mut Registry) -> CacheSlot {
        CacheSlot {
            cache: Mutex::new(None),
            metrics: CacheMetrics::new(registry),
            api_password: Mutex::new(api_password.map(str::to_string)),
            guesses: Mutex::new(None),
        }
    }

    /// Wrong purge keys are charged to `guesses` (the server's API-password limiter), by the
    /// cache built and every one built later, so a purge is no second, uncounted oracle for the
    /// password it also accepts.
    pub fn share_guesses(&self, guesses: std::sync::Arc<crate::auth::guesses::Guesses>) {
        if let Some(cache) = self.get() {
            cache.share_guesses(guesses.clone());
        }
        *self.guesses.lock().unwrap_or_else(|e| e.into_inner()) = Some(guesses);
    }

    /// The cache, if one was built.
    pub fn get(&self) -> Option<Cache> {
        self.lock().clone()
    }

    /// The cache, built from `config` if there is none yet. An existing cache is returned as it
    /// is: its tiers and sizes (`[cache]`) change only with a restart. Must run inside a tokio
    /// runtime the first time (the disk writer and the gauges are tasks).
    pub fn get_or_create(&self, config: &CacheConfig) -> Result<Cache, CacheError> {
        let cache = match self.candidate(config)? {
            Candidate::Running(cache) => return Ok(cache),
            Candidate::New(cache) => cache,
        };
        let mut slot = self.lock();
        if let Some(running) = &*slot {
            return Ok(running.clone());
        }
        // At start a disk directory that cannot be made stops the process.
        cache.start()?;
        Ok(slot.insert(cache).clone())
    }

    /// The cache a reload would use: the one running, or a new one built from `config` and not
    /// stored. A new one is only prepared ([`Cache::prepare`]): its disk directory is looked
    /// at, not written, and nothing of it runs, so a reload refused after this step leaves the
    /// slot empty and the directory as it was (dropping the new cache closes the cluster port
    /// it bound). [`CacheSlot::install`] stores and starts it when the reload commits.
    pub fn candidate(&self, config: &CacheConfig) -> Result<Candidate, CacheError> {
        if let Some(c) = self.get() {
            return Ok(Candidate::Running(c));
        }
        let password = self
            .api_password
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let cache = Cache::prepare(config, password.as_deref(), self.metrics.clone())?;
        if let Some(guesses) = &*self.guesses.lock().unwrap_or_else(|e| e.into_inner()) {
            cache.share_guesses(guesses.clone());
        }
        Ok(Candidate::New(cache))
    }

    /// Stores and starts `cache` ([`Cache::start`]: the disk directory emptied if cut with
    /// another slice size, indexed, the cluster served) unless the slot holds one already (the
    /// first one stored stays, so every table and the shutdown flush see the same cache; the
    /// one given is dropped unstarted); returns the one the slot holds. A reload's commit
    /// cannot fail: a directory that cannot be made since the prepare step is logged, and the
    /// cache runs on with its disk writes dropped.
    pub fn install(&self, cache: Cache) -> Cache {
        let mut slot = self.lock();
        if let Some(running) = &*slot {
            return running.clone();
        }
        if let Err(e) = cache.start() {
            tracing::error!(error = %e, "the slice cache started without part of itself");
        }
        slot.insert(cache).clone()
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

/// What [`CacheSlot::candidate`] found or built.
pub enum Candidate {
    /// The cache the process runs.
    Running(Cache),
    /// Built for a reload, not stored yet.
    New(Cache),
}

impl Candidate {
    pub fn cache(&self) -> &Cache {
        match self {
            Candidate::Running(c) | Candidate::New(c) => c,
        }
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

    /// A reload's new cache is stored only by its commit; one dropped instead (a refused reload)
    /// ends what it started: nothing keeps the cache, and its disk directory was never written
    /// (not even created).
    #[tokio::test]
    async fn a_candidate_is_stored_only_when_installed() {
        let dir = tempfile::tempdir().unwrap();
        let slot = CacheSlot::new(None, &mut Registry::default());
        let config = CacheConfig {
            disk_path: Some(dir.path().join("tier")),
            ..CacheConfig::default()
        };
        let Candidate::New(dropped) = slot.candidate(&config).unwrap() else {
            panic!("no cache runs yet");
        };
        assert!(slot.get().is_none());
        let inner = std::sync::Arc::downgrade(&dropped.inner);
        let stats = std::sync::Arc::downgrade(&dropped.inner.disk.as_ref().unwrap().stats);
        drop(dropped);
        assert!(inner.upgrade().is_none(), "something still holds the cache");
        assert!(stats.upgrade().is_none(), "a disk writer runs");
        assert!(!dir.path().join("tier").exists());
        assert!(slot.get().is_none());
        // A committed one is the slot's from then on, and a later candidate is that cache.
        let Candidate::New(kept) = slot.candidate(&config).unwrap() else {
            panic!("no cache runs yet");
        };
        assert!(slot.install(kept.clone()).same_as(&kept));
        assert!(dir.path().join("tier").join("layout").exists());
        match slot.candidate(&config).unwrap() {
            Candidate::Running(c) => assert!(c.same_as(&kept)),
            Candidate::New(_) => panic!("a second cache was built"),
        }
        // The first one stored stays.
        let other =
            Cache::with_metrics(&CacheConfig::default(), None, slot.metrics.clone()).unwrap();
        assert!(slot.install(other).same_as(&kept));
    }

    /// A candidate over a directory cut with another slice size leaves it as it was until it
    /// is installed, which empties and stamps it; a candidate's cluster control port is bound
    /// (so a port in use refuses it) and closed the moment the candidate is dropped.
    #[tokio::test]
    async fn a_candidate_writes_nothing_and_its_port_closes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tier");
        std::fs::create_dir_all(root.join("slices")).unwrap();
        std::fs::write(root.join("layout"), "slice_bytes 4096\n").unwrap();
        std::fs::write(root.join("slices").join("old"), b"old").unwrap();
        let control = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let config = CacheConfig {
            disk_path: Some(root.clone()),
            cluster: Some(super::super::cluster::ClusterConfig {
                secret: "0123456789abcdef".into(),
                peers: vec![super::super::cluster::config::PeerSpec::Addr(
                    "127.0.0.1:9".into(),
                )],
                control_listen: Some(control),
                ..Default::default()
            }),
            ..CacheConfig::default()
        };
        let slot = CacheSlot::new(None, &mut Registry::default());
        let Candidate::New(dropped) = slot.candidate(&config).unwrap() else {
            panic!("no cache runs yet");
        };
        assert!(std::net::TcpListener::bind(control).is_err(), "not bound");
        drop(dropped);
        let refused = std::net::TcpStream::connect(control).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            std::fs::read(root.join("slices").join("old")).unwrap(),
            b"old"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("layout")).unwrap(),
            "slice_bytes 4096\n"
        );
        let Candidate::New(kept) = slot.candidate(&config).unwrap() else {
            panic!("no cache runs yet");
        };
        let kept = slot.install(kept);
        assert!(!root.join("slices").join("old").exists());
        assert_eq!(
            std::fs::read_to_string(root.join("layout")).unwrap(),
            format!("slice_bytes {}\n", 1 << 20)
        );
        assert_eq!(kept.cluster().unwrap().control_addr(), Some(control));
        tokio::net::TcpStream::connect(control).await.unwrap();
    }
}
