//! The `sluice` command line: `serve`, `check-config`, `reload`, `upgrade` (grammar in
//! `sluice::cli`).

use std::path::{Path, PathBuf};

use sluice::cli::{Action, ReloadArgs};
use sluice::config::{Config, Overrides};

/// With the opt-in `jemalloc` feature, allocations go through jemalloc instead of the C library's
/// malloc (the trade-off is in docs/decisions/allocator.md).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Otherwise the C library's malloc, with tokio's 128-byte-aligned task cells and socket
/// registrations packed in pools instead of carved out of larger chunks
/// (`sluice::runtime::aligned_pool`; docs/decisions/idle-connection-memory.md).
#[cfg(not(feature = "jemalloc"))]
#[global_allocator]
static GLOBAL: sluice::runtime::aligned_pool::AlignedPool =
    sluice::runtime::aligned_pool::AlignedPool;

fn main() -> anyhow::Result<()> {
    #[cfg(all(feature = "static-memcpy", target_arch = "x86_64", target_env = "musl"))]
    sluice::runtime::copy::init();
    let action = match sluice::cli::parse(std::env::args_os().skip(1)) {
        Ok(action) => action,
        Err(e) => {
            eprintln!("error: {e}");
            // The exit status clap used for usage errors; scripts may test for it.
            std::process::exit(2);
        }
    };
    if let Action::Print(text) = action {
        print!("{text}");
        return Ok(());
    }
    // Before any thread starts: these read (and the drop-in writes) the process environment.
    let dropin_notes = sluice::dropin::apply();
    init_logging();
    // Every way out of main from here (the return, an error returned with `?`) drops this: the
    // last lines logged are why a start failed. A panic's message is written by its hook.
    let _flush = FlushLog;
    for note in dropin_notes {
        tracing::warn!("MediaFlow environment: {note}");
    }
    match action {
        Action::Print(_) => Ok(()),
        Action::CheckConfig { file } => {
            let config = Config::load(Some(&file), std::env::vars(), &Overrides::default())?;
            print!("{}", config.masked());
            println!();
            print!("{}", sluice::app::describe_routes(&config)?);
            Ok(())
        }
        Action::Reload(args) => signal(args, libc::SIGHUP),
        Action::Upgrade(args) => signal(args, libc::SIGUSR2),
        Action::Health { config } => health(config),
        Action::Serve(mut args) => {
            use sluice::server::{listener::inherited, notify, upgrade};
            upgrade::remember_command();
            notify::init();
            let activated = inherited::adopt_systemd(
                std::env::var("LISTEN_PID").ok().as_deref(),
                std::env::var("LISTEN_FDS").ok().as_deref(),
            );
            if activated > 0 {
                tracing::info!(
                    sockets = activated,
                    "socket activation: listening sockets from systemd"
                );
            }
            let handed = upgrade::take_over()?;
            if handed > 0 {
                tracing::info!(
                    sockets = handed,
                    "upgrade: took over the previous process's listening sockets"
                );
            }
            if args.config.is_none() {
                args.config = installed_config(Path::new(INSTALLED_CONFIG));
            }
            let api_password = match (&args.api_password_file, args.api_password) {
                (Some(path), _) => Some(read_password_file(path)?),
                (None, pw) => pw,
            };
            let flags = Overrides {
                listen: args.listen,
                api_password,
                allow_private_upstreams: args.allow_private_upstreams,
                multicast_interface: args.multicast_interface,
            };
            let config = Config::load(args.config.as_deref(), std::env::vars(), &flags)?;
            let runtime = sluice::runtime::main_runtime(
                config.server.runtime,
                config.server.threads,
                std::time::Duration::from_micros(config.server.busy_poll_us),
            )?;
            let source = (args.config.clone(), flags);
            runtime.block_on(async {
                // The handlers first: a SIGTERM once the pid file names this process drains it.
                let shutdown = shutdown_signal()?;
                sluice::serve_reloadable(config, Some(source), shutdown).await
            })
        }
    }
}

/// Where the packages put the config file; `serve`, `reload` and `upgrade` read it when no other
/// is named and it exists.
const INSTALLED_CONFIG: &str = "/etc/sluice/sluice.toml";

fn installed_config(path: &Path) -> Option<PathBuf> {
    path.is_file().then(|| path.to_path_buf())
}

/// Sends `sig` (SIGHUP: reload; SIGUSR2: upgrade) to the running sluice named by `--pid`,
/// `--pid-file` or the config's pid file (the installed config's when nothing is named). After a
/// SIGHUP with a known pid file, waits for the outcome the server writes beside it.
fn signal(args: ReloadArgs, sig: libc::c_int) -> anyhow::Result<()> {
    let config = args
        .config
        .or_else(|| installed_config(Path::new(INSTALLED_CONFIG)));
    let (pid, pid_file) = match (args.pid, args.pid_file, config) {
        (Some(pid), _, _) => (pid, None),
        (None, Some(path), _) => (read_pid(&path)?, Some(path)),
        (None, None, Some(file)) => {
            let config = Config::load(Some(&file), std::env::vars(), &Overrides::default())?;
            let path = config.server.pid_file.ok_or_else(|| {
                anyhow::anyhow!(
                    "{} sets no server.pid_file, so the running process cannot be found from \
                     it; pass --pid (under systemd: systemctl reload sluice)",
                    file.display()
                )
            })?;
            (read_pid(&path)?, Some(path))
        }
        (None, None, None) => anyhow::bail!(
            "name the process: --pid, --pid-file or --config (no {INSTALLED_CONFIG} either)"
        ),
    };
    if pid <= 1 {
        anyhow::bail!("refusing to signal pid {pid}");
    }
    if let Some(path) = &pid_file {
        refuse_stale(pid, path)?;
    }
    let before = pid_file
        .as_deref()
        .and_then(|p| std::fs::read_to_string(sluice::app::reload::report_path(p)).ok());
    // SAFETY: kill(2) with a positive pid and a signal number has no memory effects here.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc != 0 {
        anyhow::bail!(
            "cannot signal pid {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
    if sig == libc::SIGUSR2 {
        println!(
            "sent SIGUSR2 to {pid}; it starts the new binary and drains once that one serves \
             (the server log says how it went)"
        );
        return Ok(());
    }
    let Some(report) = pid_file.map(|p| sluice::app::reload::report_path(&p)) else {
        println!("sent SIGHUP to {pid}; the server log says whether the new config was applied");
        return Ok(());
    };
    // The server writes each outcome beside its pid file: wait for this one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let answer = loop {
        match std::fs::read_to_string(&report) {
            Ok(now) if Some(&now) != before.as_ref() => break now,
            _ if std::time::Instant::now() > deadline => {
                println!(
                    "sent SIGHUP to {pid}; no outcome in {} after 30 s: see the server log",
                    report.display()
                );
                return Ok(());
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    };
    let outcome: serde_json::Value = serde_json::from_str(&answer).unwrap_or_default();
    if outcome["reloaded"] == serde_json::Value::Bool(true) {
        let changed: Vec<&str> = outcome["changed"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        if changed.is_empty() {
            println!("reloaded (pid {pid}); no key changed");
        } else {
            println!("reloaded (pid {pid}); changed: {}", changed.join(", "));
        }
        Ok(())
    } else {
        anyhow::bail!(
            "reload refused (pid {pid}), the running config stays: {}",
            outcome["error"].as_str().unwrap_or("see the server log")
        )
    }
}

/// `sluice health`: GET /health on the config's first listener; an error unless it answers 200.
fn health(config: Option<PathBuf>) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let file = config.or_else(|| installed_config(Path::new(INSTALLED_CONFIG)));
    let config = Config::load(file.as_deref(), std::env::vars(), &Overrides::default())?;
    let mut addr = *config
        .server
        .listen
        .first()
        .ok_or_else(|| anyhow::anyhow!("the config has no server.listen address"))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let limit = std::time::Duration::from_secs(3);
    let mut conn = std::net::TcpStream::connect_timeout(&addr, limit)
        .map_err(|e| anyhow::anyhow!("{addr}: {e}"))?;
    conn.set_read_timeout(Some(limit))?;
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut reply = Vec::new();
    let _ = conn.take(64 * 1024).read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    let status = reply.lines().next().unwrap_or("");
    anyhow::ensure!(
        status.split_whitespace().nth(1) == Some("200"),
        "{addr}/health: {status:?}"
    );
    println!("{}", reply.split("\r\n\r\n").nth(1).unwrap_or("").trim());
    Ok(())
}

fn read_pid(path: &std::path::Path) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read pid file {}: {e}", path.display()))?;
    text.trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("{} does not hold a process id", path.display()))
}

/// Refuses a pid file that names a process other than a sluice: after a crash the number can
/// belong to another process by now, and a SIGHUP (whose default action ends a process) would
/// hit it. A sluice is a process whose command name (`/proc/<pid>/comm`, the executable's file
/// name as it was started) is this one's or starts with `sluice`. Not by time: the pid file's
/// time is the wall clock's, which a clock set after boot (a board without a clock, a VM) moves
/// past any start time. Where `/proc` cannot say (the process gone), the signal is left to
/// succeed or fail; `--pid` signals whatever it names.
fn refuse_stale(pid: i32, path: &Path) -> anyhow::Result<()> {
    let comm = |p: &str| {
        std::fs::read_to_string(format!("/proc/{p}/comm"))
            .ok()
            .map(|c| c.trim_end().to_string())
    };
    let Some(theirs) = comm(&pid.to_string()) else {
        return Ok(());
    };
    let ours = comm("self").unwrap_or_default();
    if theirs != ours && !theirs.starts_with("sluice") {
        anyhow::bail!(
            "{} names pid {pid}, which is {theirs:?}, not sluice: the file is stale (is sluice \
             running?); nothing was signalled (--pid signals a process by number)",
            path.display()
        );
    }
    Ok(())
}

/// The password file's first line, without its line ending; an empty password is refused here
/// rather than silently meaning "no auth".
fn read_password_file(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --api-password-file {}", path.display()))?;
    let first = text.lines().next().unwrap_or("").trim_end_matches('\r');
    anyhow::ensure!(
        !first.is_empty(),
        "--api-password-file {} is empty",
        path.display()
    );
    Ok(first.to_string())
}

/// Logs to stderr, filtered by `RUST_LOG` (see `sluice::logging`); colours only on a terminal, so
/// files and journald get plain text.
fn init_logging() {
    use std::io::IsTerminal;
    let value = std::env::var_os("RUST_LOG").map(|v| v.to_string_lossy().into_owned());
    let (filter, warning) = sluice::logging::filter_from(value.as_deref());
    // rustls (the `tls` feature) logs through `log`: its records become events too.
    #[cfg(feature = "tls")]
    let _ = tracing_log::LogTracer::builder()
        .with_max_level(tracing_log::AsLog::as_log(&filter.max_level()))
        .init();
    let logger = sluice::logging::Logger::new(filter, std::io::stderr().is_terminal());
    if tracing::subscriber::set_global_default(logger).is_err() {
        eprintln!("warning: a log subscriber was already installed");
    }
    sluice::logging::flush_on_panic();
    if let Some(warning) = warning {
        tracing::warn!("{warning}");
    }
}

/// Waits, when dropped, for the event log's writer thread to write what is queued (bounded by
/// `FLUSH_TIMEOUT`; an error returned from `main` is then printed by std, which waits for
/// stderr as any write does). `main` returns or fails only through it once logging has
/// started: the one `std::process::exit` comes before. A panic flushes in its hook.
struct FlushLog;

impl Drop for FlushLog {
    fn drop(&mut self) {
        sluice::logging::flush(sluice::logging::FLUSH_TIMEOUT);
    }
}

/// Installs the SIGTERM and SIGINT handlers now (on the runtime), before the server binds,
/// writes its pid file or says it is ready; the future resolves on either signal.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| anyhow::anyhow!("installing the SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| anyhow::anyhow!("installing the SIGINT handler: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
