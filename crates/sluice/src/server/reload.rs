//! Live reload: SIGHUP, `sluice reload` and `POST /admin/reload` re-read the config file; every part
//! that can change live first prepares its new state from the new config, and only when all of
//! them succeeded are they committed, so a bad file changes nothing (the log says why).
//!
//! Front ends hook in with [`Reloader::add`]: a prepare function returning the commit to run.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{Config, Overrides};

/// Applies a prepared change; runs only after every part prepared successfully.
pub type Commit = Box<dyn FnOnce() + Send>;

/// Prepares one part's new state from a validated config.
pub type Prepare = Box<dyn Fn(&Config) -> anyhow::Result<Commit> + Send + Sync>;

/// Where the config comes from, and who applies it.
pub struct Reloader {
    file: Option<PathBuf>,
    flags: Overrides,
    parts: Vec<(&'static str, Prepare)>,
}

impl Reloader {
    /// Reads `file` (with the environment and `flags` on top, as at startup) on each reload.
    pub fn new(file: Option<PathBuf>, flags: Overrides) -> Reloader {
        Reloader {
            file,
            flags,
            parts: Vec::new(),
        }
    }

    /// Registers a part that can change live (routes and groups, TLS certificates, TCP listeners).
    pub fn add(&mut self, name: &'static str, prepare: Prepare) {
        self.parts.push((name, prepare));
    }

    /// Re-reads and applies the config; on any error nothing changes.
    pub fn reload(&self) -> anyhow::Result<()> {
        let config = Config::load(self.file.as_deref(), std::env::vars(), &self.flags)?;
        let mut commits = Vec::with_capacity(self.parts.len());
        for (name, prepare) in &self.parts {
            commits.push(prepare(&config).map_err(|e| anyhow::anyhow!("{name}: {e:#}"))?);
        }
        for commit in commits {
            commit();
        }
        Ok(())
    }

    /// Reloads, logging the outcome.
    pub fn reload_logged(&self, why: &str) -> anyhow::Result<()> {
        match self.reload() {
            Ok(()) => {
                tracing::info!("config reloaded ({why})");
                Ok(())
            }
            Err(e) => {
                tracing::error!("config reload ({why}) refused, the running config stays: {e:#}");
                Err(e)
            }
        }
    }
}

/// Reloads on every SIGHUP until the process ends.
pub async fn on_sighup(reloader: Arc<Reloader>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot install the SIGHUP handler; live reload by signal is off");
        return;
    };
    while hup.recv().await.is_some() {
        let r = reloader.clone();
        super::notify::reloading();
        let applied = tokio::task::spawn_blocking(move || r.reload_logged("SIGHUP")).await;
        super::notify::reloaded(matches!(applied, Ok(Ok(()))));
    }
}

/// The TLS part: new certificates for new handshakes. Turning TLS on or off needs a restart.
#[cfg(feature = "tls")]
pub fn tls_part(handle: super::TlsHandle) -> Prepare {
    Box::new(move |config: &Config| {
        let new = super::tls_settings(&config.server)?;
        if new.is_some() != handle.load().is_some() {
            anyhow::bail!("turning TLS on or off needs a restart");
        }
        let handle = handle.clone();
        Ok(Box::new(move || handle.store(new)) as Commit)
    })
}
