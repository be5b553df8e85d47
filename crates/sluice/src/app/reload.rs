//! Live reload: SIGHUP, `sluice reload` and `POST /admin/reload` re-read the config file; every part
//! that can change live first prepares its new state from the new config, and only when all of
//! them succeeded are they committed, so a bad file changes nothing (the log says why).
//!
//! Front ends hook in with [`Reloader::add`]: a prepare function returning the commit to run. A
//! module's hook reads only its own section (`section::Prepare<S>`); [`Part`] hands it that
//! section of the new config, so only this composition root knows the whole `Config`.
//!
//! A reload compares the new settings with the running ones key by key: a changed key that no
//! part applies live ([`LIVE_KEYS`], plus what [`Reloader::add_live`] reports) refuses the whole
//! reload and names the key, so a reload never reports a change it did not make
//! (docs/reload.md has the table).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::{Config, Overrides};
pub use crate::section::Commit;

/// Prepares one part's new state from the whole validated config.
pub type Prepare = crate::section::Prepare<Config>;

/// A reload hook, by the section it reads: each becomes a [`Prepare`] over the whole config that
/// hands the hook its own section.
pub trait Part {
    fn into_prepare(self) -> Prepare;
}

impl Part for Prepare {
    fn into_prepare(self) -> Prepare {
        self
    }
}

impl Part for crate::section::Prepare<crate::server::ServerConfig> {
    fn into_prepare(self) -> Prepare {
        Box::new(move |config: &Config| self(&config.server))
    }
}

#[cfg(feature = "tcp")]
impl Part for crate::section::Prepare<[crate::tcp::TcpConfig]> {
    fn into_prepare(self) -> Prepare {
        Box::new(move |config: &Config| self(&config.tcp))
    }
}

/// Keys (and whole sections or arrays, by prefix) a reload applies to the running server.
pub const LIVE_KEYS: &[&str] = &[
    "auth",
    "routes",
    "upstreams",
    "reverse",
    "endpoints",
    "tcp",
    "server.tls_cert",
    "server.tls_key",
    "server.certificates",
    "server.max_tunnels_per_ip",
    "cache.purge_key",
    "cache.purge_allow",
];

/// Reports more live keys as the running state allows (the `[cache]` sizes before any cache
/// was built, say).
pub type LiveKeys = Box<dyn Fn() -> Vec<&'static str> + Send + Sync>;

/// Where the config comes from, and who applies it.
pub struct Reloader {
    file: Option<PathBuf>,
    flags: Overrides,
    parts: Vec<(&'static str, Prepare)>,
    live: Vec<LiveKeys>,
    /// The settings running now, flattened to `section.key` paths; `None` until
    /// [`Reloader::running`] names them, and then no key check is made.
    running: Mutex<Option<BTreeMap<String, toml::Value>>>,
    /// Held by one reload from reading the file to writing its outcome: two at once (a SIGHUP
    /// and `/admin/reload`) could otherwise apply an older read of the file over a newer one,
    /// and write their outcomes through the same temporary file.
    turn: Mutex<()>,
    /// Where each outcome is written for `sluice reload` to read (beside the pid file).
    report: Option<PathBuf>,
    /// [`SERVING`], [`DRAINING`] or [`HANDED_OVER`]: once the process drains, a reload would
    /// bind every `[[tcp]]` listener afresh and start accept loops in a process on its way out.
    state: AtomicU8,
}

/// Reloads are applied.
const SERVING: u8 = 0;
/// Shutting down (SIGTERM, SIGINT): reloads are refused, and the refusal is reported.
const DRAINING: u8 = 1;
/// Drained after a binary upgrade: reloads are refused, and the outcome file beside the pid file
/// is left to the new process, which owns it now.
const HANDED_OVER: u8 = 2;

/// What a reload asked for while the process drains answers.
pub const DRAINING_REFUSAL: &str =
    "draining: this process is shutting down or handing over to a new one, so nothing was \
     reloaded (reload the process that serves now)";

/// The file beside `pid_file` where a running server writes each reload's outcome.
pub fn report_path(pid_file: &std::path::Path) -> PathBuf {
    let mut name = pid_file.as_os_str().to_owned();
    name.push(".reload");
    PathBuf::from(name)
}

/// What a reload that went through changed (key names only, never values).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub changed: Vec<String>,
}

impl Reloader {
    /// Reads `file` (with the environment and `flags` on top, as at startup) on each reload.
    pub fn new(file: Option<PathBuf>, flags: Overrides) -> Reloader {
        Reloader {
            file,
            flags,
            parts: Vec::new(),
            live: Vec::new(),
            running: Mutex::new(None),
            turn: Mutex::new(()),
            report: None,
            state: AtomicU8::new(SERVING),
        }
    }

    /// The process starts draining (`handed_over`: after a binary upgrade): every reload from now
    /// on is refused with [`DRAINING_REFUSAL`], and one under way is refused once its file is
    /// read. Never waits (a reload under way may be stuck reading its file from a hung mount:
    /// shutdown must not wait for it to start draining); [`Reloader::settle`] waits for it.
    pub fn mark_draining(&self, handed_over: bool) {
        let state = if handed_over { HANDED_OVER } else { DRAINING };
        self.state.store(state, Ordering::SeqCst);
    }

    /// Waits for a reload under way to end (it blocks: call it off the async threads, and bound
    /// the wait: the reload may be stuck on its file).
    pub fn settle(&self) {
        drop(self.turn.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Whether a reload is under way now (its turn is taken). Does not wait.
    pub fn busy(&self) -> bool {
        matches!(
            self.turn.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    /// Whether [`Reloader::mark_draining`] was called.
    pub fn draining(&self) -> bool {
        self.state.load(Ordering::SeqCst) != SERVING
    }

    /// Names the settings the server started with, so each reload can tell which keys it changes.
    pub fn running(self, config: &Config) -> Reloader {
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(flatten(config));
        self
    }

    /// Writes each outcome to `path` as one JSON object (`reloaded`, `changed`, `error`).
    pub fn report_to(mut self, path: PathBuf) -> Reloader {
        self.report = Some(path);
        self
    }

    fn write_report(&self, outcome: &anyhow::Result<Applied>) {
        let Some(path) = &self.report else { return };
        if self.state.load(Ordering::SeqCst) == HANDED_OVER {
            return;
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let body = match outcome {
            Ok(a) => {
                serde_json::json!({"at": stamp.to_string(), "reloaded": true, "changed": a.changed})
            }
            Err(e) => {
                serde_json::json!({"at": stamp.to_string(), "reloaded": false, "error": format!("{e:#}")})
            }
        };
        // Written whole then renamed, so a reader never sees half of it; readable by the
        // server's user only (an error can quote a config value).
        let tmp = path.with_extension("reload.tmp");
        let write = || {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::remove_file(&tmp);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(format!("{body}\n").as_bytes())?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the reload outcome");
        }
    }

    /// Registers a source of keys that are live in the running state (see [`LiveKeys`]).
    pub fn add_live(&mut self, live: LiveKeys) {
        self.live.push(live);
    }

    /// Registers a part that can change live (routes and groups, TLS certificates, TCP listeners).
    pub fn add(&mut self, name: &'static str, part: impl Part) {
        let prepare = part.into_prepare();
        self.parts.push((name, prepare));
    }

    /// Re-reads and applies the config; on any error nothing changes. A changed key that needs a
    /// restart is an error naming it.
    pub fn reload(&self) -> anyhow::Result<Applied> {
        let _turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        self.reload_in_turn()
    }

    fn reload_in_turn(&self) -> anyhow::Result<Applied> {
        if self.draining() {
            anyhow::bail!(DRAINING_REFUSAL);
        }
        // The upstream guard refuses this machine's own addresses: a reload reads them again.
        crate::upstream::guard::refresh_own_addresses();
        let config = Config::load(self.file.as_deref(), std::env::vars(), &self.flags)?;
        // Reading the file can take long (a slow or hung mount): a drain that began meanwhile
        // refuses this reload before any part prepares (binds) or commits.
        if self.draining() {
            anyhow::bail!(DRAINING_REFUSAL);
        }
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let new = flatten(&config);
        let changed = match running.as_ref() {
            Some(old) => changed_keys(old, &new),
            None => Vec::new(),
        };
        let extra: Vec<&str> = self.live.iter().flat_map(|f| f()).collect();
        let stuck: Vec<&str> = changed
            .iter()
            .map(String::as_str)
            .filter(|k| !is_live(k, LIVE_KEYS) && !is_live(k, &extra))
            .collect();
        if !stuck.is_empty() {
            anyhow::bail!(
                "changed keys need a restart, so nothing was applied: {} (restart sluice, or \
                 put the old values back to reload the rest)",
                stuck.join(", ")
            );
        }
        let mut commits = Vec::with_capacity(self.parts.len());
        for (name, prepare) in &self.parts {
            commits.push(prepare(&config).map_err(|e| anyhow::anyhow!("{name}: {e:#}"))?);
        }
        for commit in commits {
            commit();
        }
        if running.is_some() {
            *running = Some(new);
        }
        Ok(Applied { changed })
    }

    /// Reloads, logging the outcome.
    pub fn reload_logged(&self, why: &str) -> anyhow::Result<Applied> {
        let turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        let outcome = self.reload_in_turn();
        self.write_report(&outcome);
        drop(turn);
        match outcome {
            Ok(applied) => {
                if applied.changed.is_empty() {
                    tracing::info!("config reloaded ({why}); no key changed");
                } else {
                    tracing::info!(
                        "config reloaded ({why}); changed: {}",
                        applied.changed.join(", ")
                    );
                }
                Ok(applied)
            }
            Err(e) => {
                tracing::error!("config reload ({why}) refused, the running config stays: {e:#}");
                Err(e)
            }
        }
    }
}

/// `key` is one of `live` or under one of them (`auth` covers `auth.api_password`).
fn is_live(key: &str, live: &[&str]) -> bool {
    live.iter().any(|l| {
        key == *l
            || key
                .strip_prefix(l)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// The settings as `section.key` paths; arrays (routes, listeners, groups) are one value each.
fn flatten(config: &Config) -> BTreeMap<String, toml::Value> {
    fn walk(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, toml::Value>) {
        for (k, v) in table {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(t) => walk(&path, t, out),
                other => {
                    out.insert(path, other.clone());
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(table) = toml::Table::try_from(config) {
        walk("", &table, &mut out);
    }
    out
}

/// Keys whose value differs, or that one side lacks, in key order.
fn changed_keys(
    old: &BTreeMap<String, toml::Value>,
    new: &BTreeMap<String, toml::Value>,
) -> Vec<String> {
    let mut keys: Vec<String> = old
        .iter()
        .filter(|(k, v)| new.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    keys.extend(new.keys().filter(|k| !old.contains_key(*k)).cloned());
    keys.sort();
    keys
}

/// Reloads on every SIGHUP on `hup` until the process ends. The stream is made by the caller
/// before the process announces itself (pid file, readiness), so a SIGHUP right after is not lost
/// and does not take the default action (ending the process).
pub async fn on_sighup(mut hup: tokio::signal::unix::Signal, reloader: Arc<Reloader>) {
    while hup.recv().await.is_some() {
        let r = reloader.clone();
        // Draining, the service manager was told STOPPING (or about the new main process):
        // RELOADING then READY would tell it this process serves again. The refusal is logged.
        let tell = !reloader.draining();
        if tell {
            crate::server::notify::reloading();
        }
        let applied = tokio::task::spawn_blocking(move || r.reload_logged("SIGHUP")).await;
        // A drain that began while the reload ran (SIGTERM during a slow reload): the manager
        // was told STOPPING since, and READY now would undo it.
        if tell && !reloader.draining() {
            crate::server::notify::reloaded(matches!(applied, Ok(Ok(_))));
        }
    }
}

/// The TLS part for a server without ACME: new certificates for new handshakes (see
/// [`crate::server::tls_reload`]).
#[cfg(feature = "tls")]
pub fn tls_part(handle: crate::server::TlsHandle) -> Prepare {
    crate::server::tls_reload(handle, None).into_prepare()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_compared_one_by_one_and_arrays_whole() {
        let a = Config::default();
        let mut b = a.clone();
        b.auth.api_password = "new".into();
        b.server.idle_timeout_secs += 1;
        let changed = changed_keys(&flatten(&a), &flatten(&b));
        assert_eq!(changed, ["auth.api_password", "server.idle_timeout_secs"]);
        assert!(is_live("auth.api_password", LIVE_KEYS));
        assert!(!is_live("server.idle_timeout_secs", LIVE_KEYS));
        assert!(!is_live("authx", &["auth"]));
        assert!(is_live("cache.memory_bytes", &["cache"]));
    }

    /// After shutdown or a hand-over starts, a reload (SIGHUP, `/admin/reload`) is refused with
    /// "draining" and no part prepares or commits: the TCP part would bind every listener afresh
    /// and start accept loops in a process on its way out.
    #[test]
    fn a_reload_while_draining_is_refused_and_applies_nothing() {
        use std::sync::atomic::AtomicUsize;
        let dir = std::env::temp_dir().join(format!("sluice-drain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let report = dir.join("sluice.pid.reload");
        let _ = std::fs::remove_file(&report);
        let mut reloader = Reloader::new(None, Overrides::default()).report_to(report.clone());
        let (prepared, committed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (p, c) = (prepared.clone(), committed.clone());
        let part: Prepare = Box::new(move |_: &Config| {
            p.fetch_add(1, Ordering::SeqCst);
            let c = c.clone();
            Ok(Box::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
            }) as Commit)
        });
        reloader.add("tcp", part);
        reloader.reload_logged("test").unwrap();
        assert_eq!(committed.load(Ordering::SeqCst), 1);
        assert!(!reloader.draining());

        reloader.mark_draining(false);
        let err = format!("{:#}", reloader.reload_logged("test").unwrap_err());
        assert!(err.contains("draining"), "{err}");
        assert_eq!(
            prepared.load(Ordering::SeqCst),
            1,
            "a part prepared while draining"
        );
        assert_eq!(
            committed.load(Ordering::SeqCst),
            1,
            "a part committed while draining"
        );
        // Still this process's pid file: `sluice reload` reads the refusal.
        let written = std::fs::read_to_string(&report).unwrap();
        assert!(written.contains("draining"), "{written}");

        // After a hand-over the outcome file is the new process's: left as it is.
        std::fs::write(&report, "new process\n").unwrap();
        reloader.mark_draining(true);
        assert!(reloader.reload().is_err());
        assert!(reloader.reload_logged("test").is_err());
        assert_eq!(std::fs::read_to_string(&report).unwrap(), "new process\n");
        assert_eq!(committed.load(Ordering::SeqCst), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// SIGTERM while a reload is stuck reading its file (a hung mount) marks the process
    /// draining at once: waiting for the reload's turn first kept every listener accepting for
    /// as long as the reload was stuck. [`Reloader::settle`] is the wait, apart.
    #[test]
    fn draining_is_marked_without_waiting_for_a_reload_under_way() {
        let reloader = Arc::new(Reloader::new(None, Overrides::default()));
        // A reload under way holds the turn, as one stuck in `Config::load` does.
        let turn = reloader.turn.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let r = reloader.clone();
        std::thread::spawn(move || {
            r.mark_draining(false);
            let _ = tx.send(r.draining());
        });
        let marked = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(
            marked,
            Ok(true),
            "marking the drain waited for the reload under way"
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let r = reloader.clone();
        std::thread::spawn(move || {
            r.settle();
            let _ = tx.send(());
        });
        drop(turn);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("settle returns once the reload's turn ends");
        assert!(reloader.draining());
    }

    /// Setting, changing or unsetting `server.max_tunnels_per_ip` is a change a reload applies
    /// (the routes take it, over the tunnels open).
    #[test]
    fn the_tunnel_share_is_live() {
        let a = Config::default();
        let mut b = a.clone();
        b.server.max_tunnels_per_ip = Some(50);
        let mut c = b.clone();
        c.server.max_tunnels_per_ip = Some(0);
        for (x, y) in [(&a, &b), (&b, &c), (&c, &a)] {
            let changed = changed_keys(&flatten(x), &flatten(y));
            assert_eq!(changed, ["server.max_tunnels_per_ip"]);
            assert!(is_live(&changed[0], LIVE_KEYS));
        }
    }
}
