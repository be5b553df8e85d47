//! sluice: one binary for five streaming proxy jobs.
//!
//! # Layout
//! - `cli`: the command line's grammar and help text (`main` acts on it).
//! - `config`: TOML config with env and flag overrides, validated before anything binds.
//! - `server`: listeners, TLS, HTTP/1.1 + HTTP/2, idle timeout, graceful shutdown.
//! - `app`: dispatch: metering, auth, and the front end that owns a path.
//! - `media`: the MediaFlow-compatible `/proxy/*` front end.
//! - `upstream`: the pooled upstream HTTP client every front end shares.
//! - `auth`: password check and trusted-proxy client IP.
//! - `metrics`: the server's metric families and the Prometheus text rendering.
//! - `error`: the proxy error that knows which side failed.
//! - `logging`: the log filter read from `RUST_LOG`.
//! - `body`: the response body type every front end returns.
//! - `iptv`: the IPTV gateway front end: multicast hubs to HTTP, playlist, status.
//! - `reverse`: the HTTP reverse proxy front end: routes to upstream groups, WebSocket, retries.
//! - `request`: the request context every front end sees (peer, client IP, path, query, token scope).
//! - `redact`: masking secrets for logs and printed configs.
//! - `runtime`: the runtime model (work-stealing or per-core) and the per-core worker index.
//! - `net`: socket services: multicast join on a named interface, batched receive, splice relay.
//! - `tcp`: the TCP (L4) front end: `[[tcp]]` listeners relayed to upstream groups.
//! - `cache`: the slice cache service (memory + disk tiers, coalescing, RFC 9111 policy, purge).
//! - `dropin`: MediaFlow's container environment variables read as sluice's own.
//! - `acme`: automatic HTTPS: certificates from an ACME CA, renewed, shared through a directory.
//! - `atomic`: 64-bit atomics on every target (32-bit MIPS routers have none).
//!
//! Each front end is a Cargo feature, all on by default: `media`, `iptv`, `reverse` (with the
//! `cache` service), `tcp`; `groups` (upstream groups) comes with `reverse` or `tcp`. Services
//! that cost flash on a router are features too: `tls` (rustls, both sides), `dns` (hickory),
//! `http2`, `multi-thread` (the work-stealing runtime). `app`, `config`, `server` and this file
//! are the wiring points that know which are built; see `docs/iptv.md` for the gateway-only build.

#[cfg(feature = "acme")]
pub mod acme;
pub mod app;
pub mod atomic;
pub mod auth;
pub mod body;
#[cfg(feature = "cache")]
pub mod cache;
pub mod cli;
pub mod config;
#[cfg(feature = "tls")]
pub mod crypto;
pub mod dropin;
pub mod error;
#[cfg(feature = "iptv")]
pub mod iptv;
pub mod logging;
#[cfg(feature = "media")]
pub mod media;
pub mod metrics;
pub mod net;
pub mod redact;
pub mod request;
#[cfg(feature = "reverse")]
pub mod reverse;
pub mod runtime;
pub mod section;
pub mod server;
#[cfg(feature = "tcp")]
pub mod tcp;
pub mod upstream;

use std::sync::Arc;

/// Builds the app, the upstream groups and the TCP listeners from `config`, binds, and serves until
/// `shutdown` resolves; then HTTP and TCP drain side by side within `server.shutdown_grace_secs`.
pub async fn serve(
    config: config::Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    serve_reloadable(config, None, shutdown).await
}

/// [`serve`], plus live reload from `source` (the config file and the command-line overrides) on
/// SIGHUP and `POST /admin/reload`, and the pid file `sluice reload` signals.
pub async fn serve_reloadable(
    config: config::Config,
    source: Option<(Option<std::path::PathBuf>, config::Overrides)>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    if let Err(e) = server::listener::raise_nofile_limit() {
        tracing::warn!(error = %e, "cannot read the open-file limit");
    }
    // Every signal this process answers gets its handler now, before the pid file names it and
    // before it says it is ready: until then SIGHUP and SIGUSR2 would kill it (their default
    // action). The caller made `shutdown`'s (SIGTERM, SIGINT) the same way.
    let usr2 = server::upgrade::sigusr2();
    let hup = match source {
        Some(_) => sighup(),
        None => None,
    };
    #[cfg_attr(not(feature = "tcp"), allow(unused_mut))]
    let mut registry = prometheus_client::registry::Registry::with_prefix("sluice");
    #[cfg(feature = "tcp")]
    let tcp_metrics = tcp::TcpMetrics::register(&mut registry);
    // The app owns the one set of upstream groups (with their health checkers and gauges); the
    // TCP listeners take theirs from the same generation.
    let app: Arc<app::App> = app::App::with_registry(&config, registry)?;
    #[cfg(feature = "tcp")]
    let tcp = Arc::new(tcp::TcpProxy::new(tcp_metrics));
    #[cfg(feature = "tcp")]
    tcp.apply(&config.tcp, app.groups().current())?;
    let server = server::Server::bind(&config.server, app.clone())?;
    #[cfg(feature = "acme")]
    if let Some(acme) = app.acme() {
        // Bound like the server's listeners: handed over on a binary upgrade.
        acme.start(server::listener::bind_reuseport)?;
    }
    for (listener, addr) in server.bound() {
        tracing::info!(%addr, %listener, runtime = ?config.server.runtime, "listening");
    }
    let mut draining = None;
    if let Some((file, flags)) = source {
        let mut reloader = app::reload::Reloader::new(file, flags).running(&config);
        if let Some(pid_file) = &config.server.pid_file {
            reloader = reloader.report_to(app::reload::report_path(pid_file));
        }
        reloader.add_live(app.live_keys());
        // Order matters: the routes part installs the new upstream generation in its commit, and
        // the TCP part's commit (run after it) re-applies the listeners over that generation.
        reloader.add("routes", app.reload_part());
        #[cfg(feature = "tls")]
        reloader.add(
            "tls",
            server::tls_reload(server.tls_handle(), app.managed_certs()),
        );
        #[cfg(feature = "tcp")]
        reloader.add(
            "tcp",
            tcp::reload_part(Arc::clone(&tcp), Arc::clone(app.groups())),
        );
        let reloader = Arc::new(reloader);
        app.set_reloader(reloader.clone());
        draining = Some(reloader.clone());
        if let Some(hup) = hup {
            tokio::spawn(app::reload::on_sighup(hup, reloader));
        }
    }
    let _pid = match &config.server.pid_file {
        Some(path) => Some(PidFile::write(path)?),
        None => None,
    };
    for addr in server::listener::inherited::close_unclaimed() {
        tracing::warn!(%addr, "an inherited listening socket the config no longer names: closed");
    }
    // Every listener is bound: tell the previous process (upgrade) or the service manager.
    server::upgrade::announce_ready();
    tokio::spawn(server::notify::watchdog());
    let release = if config.server.release_memory && runtime::release::supported() {
        runtime::release::after_start();
        let app = app.clone();
        Some(tokio::spawn(runtime::release::run(move || {
            use server::Handler;
            let m = app.http_metrics();
            let p = &m.protocol;
            m.connections.get() + p.http1.get() + p.http2.get() + p.http3.get()
        })))
    } else {
        None
    };
    #[cfg(any(feature = "tcp", feature = "cache"))]
    let grace = std::time::Duration::from_secs(config.server.shutdown_grace_secs);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tokio::join!(
        async {
            // A signal drains and exits; so does a binary upgrade, once the new process serves
            // (the service manager then already knows it as the main process: no STOPPING).
            let handed_over = tokio::select! {
                _ = shutdown => {
                    server::notify::stopping();
                    false
                }
                _ = server::upgrade::on_sigusr2(usr2, config.server.pid_file.clone()) => true,
            };
            // No reload from here on (SIGHUP, `/admin/reload` on a connection still open): it
            // would bind `[[tcp]]` listeners afresh in a process on its way out. Marked without
            // waiting, and the drain starts at once: a reload under way may be stuck reading its
            // file (a hung mount), and the listeners must not accept on until SIGKILL. That
            // reload is refused once its file is read, and a `[[tcp]]` commit that comes after
            // `TcpProxy::shutdown` binds nothing.
            if let Some(reloader) = &draining {
                reloader.mark_draining(handed_over);
            }
            let _ = stop_tx.send(true);
            // Alongside the drain, a reload under way is given the grace period to end and
            // write its outcome (`sluice reload` waits for it); one stuck longer is logged.
            if let Some(reloader) = draining.filter(|r| r.busy()) {
                let grace = std::time::Duration::from_secs(config.server.shutdown_grace_secs);
                let settled = tokio::task::spawn_blocking(move || reloader.settle());
                if tokio::time::timeout(grace, settled).await.is_err() {
                    tracing::warn!(
                        "a reload is still under way (reading the config file?) after the grace \
                         period; the process ends once it does"
                    );
                }
            }
        },
        server.run(stopped(stop_rx.clone())),
        async {
            #[cfg(feature = "tcp")]
            {
                stopped(stop_rx.clone()).await;
                tcp.shutdown(grace).await;
            }
        },
    );
    if let Some(release) = release {
        release.abort();
    }
    // Slices queued for the disk tier are hits after the restart only once written.
    #[cfg(feature = "cache")]
    if let Some(cache) = app.cache() {
        if !cache.flush(grace).await {
            tracing::warn!("grace period over before the cache's disk queue was written out");
        }
    }
    Ok(())
}

/// The SIGHUP stream, made before the pid file is written (see `serve_reloadable`); `None`
/// (logged) when it cannot be.
fn sighup() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot install the SIGHUP handler; live reload by signal is off");
            None
        }
    }
}

/// The pid file: written at startup, removed at exit.
struct PidFile(std::path::PathBuf);

impl PidFile {
    fn write(path: &std::path::Path) -> anyhow::Result<PidFile> {
        PidFile::put(path)
            .map_err(|e| anyhow::anyhow!("cannot write pid file {}: {e}", path.display()))?;
        Ok(PidFile(path.to_path_buf()))
    }

    /// Writes this process's id to `path` whole: into a new file beside it, then renamed over
    /// it. The pid file often sits in a directory other users can write (`/tmp`, a shared
    /// run directory) and sluice may run as root: a symlink planted at `path` is replaced, not
    /// written through (rename replaces the link itself), and the new file is opened with
    /// `O_EXCL`, which never follows one. A reader never finds the file empty or half written.
    fn put(path: &std::path::Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        let name = path.file_name().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "names no file")
        })?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        // A name nobody can take ahead of us: one already there (planted, or left by a crash)
        // makes `create_new` fail, and the next name is tried.
        for attempt in 0..16u32 {
            let mut tmp_name = std::ffi::OsString::from(".");
            tmp_name.push(name);
            tmp_name.push(format!(".{}.{nanos}.{attempt}.tmp", std::process::id()));
            let tmp = dir.join(tmp_name);
            // 0644: `sluice reload` and service managers read it, maybe as another user.
            let mut file = match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&tmp)
            {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            };
            let written = file
                .write_all(format!("{}\n", std::process::id()).as_bytes())
                .and_then(|()| std::fs::rename(&tmp, path));
            if written.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            return written;
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "no free temporary name beside it",
        ))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // After a binary upgrade the file names the new process: leave it.
        let ours = std::fs::read_to_string(&self.0)
            .is_ok_and(|t| t.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
