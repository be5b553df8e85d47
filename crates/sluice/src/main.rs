//! The `sluice` command line: `serve`, `check-config`, `reload`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use sluice::config::{Config, Overrides};

/// What this build ships: `--help` names only the front ends compiled in.
const ABOUT: &str = if cfg!(all(
    feature = "media",
    feature = "iptv",
    feature = "reverse",
    feature = "tcp"
)) {
    "Streaming proxy in one binary: a MediaFlow-compatible media proxy (HTTP streams, HLS, \
     DASH with ClearKey), an HTTP reverse proxy with a slice cache, a TCP proxy, and a \
     multicast RTP/UDP and RTSP to HTTP IPTV gateway."
} else if cfg!(all(
    feature = "iptv",
    not(any(feature = "media", feature = "reverse", feature = "tcp"))
)) {
    "Multicast RTP/UDP and RTSP to HTTP IPTV gateway: the gateway-only build of sluice, for routers."
} else {
    "Streaming proxy in one binary, built with part of its front ends (see the Cargo features \
     in docs/architecture.md)."
};

#[derive(Parser)]
#[command(name = "sluice", version, about = ABOUT)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy. With no config file it listens on 127.0.0.1:8888 with the media proxy on and
    /// no password (allowed only while every listener is loopback).
    Serve(ServeArgs),
    /// Validate a config file and print the effective settings (file, then SLUICE_* environment
    /// variables) with secrets masked, then the effective route table in precedence order.
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
    /// Ask a running sluice to re-read its config file (sends SIGHUP). Routes, upstream groups,
    /// reverse proxy settings and TLS certificates change live; an invalid file changes nothing.
    Reload(ReloadArgs),
}

#[derive(Args)]
struct ReloadArgs {
    /// Process id of the running sluice.
    #[arg(long, conflicts_with_all = ["pid_file", "config"])]
    pid: Option<i32>,
    /// File holding the process id (server.pid_file).
    #[arg(long, value_name = "PATH", conflicts_with = "config")]
    pid_file: Option<PathBuf>,
    /// The config file of the running sluice; its server.pid_file is used.
    #[arg(long, short)]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct ServeArgs {
    /// TOML config file (see sluice.example.toml). Environment variables SLUICE_<SECTION>_<KEY>
    /// override it, and the flags below override both.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address to listen on; repeat for several (= server.listen).
    #[arg(long = "listen", value_name = "ADDR")]
    listen: Vec<SocketAddr>,
    /// Password required on every endpoint that fetches for a client (= auth.api_password).
    /// Visible to every local user in the process list: prefer --api-password-file or the
    /// SLUICE_AUTH_API_PASSWORD environment variable.
    #[arg(long, value_name = "PW", conflicts_with = "api_password_file")]
    api_password: Option<String>,
    /// Read the password from this file (first line; a trailing newline is ignored).
    #[arg(long, value_name = "PATH")]
    api_password_file: Option<PathBuf>,
    /// Allow upstreams on loopback, private and link-local addresses (= upstream.allow_private).
    #[arg(long)]
    allow_private_upstreams: bool,
    /// Default interface for multicast joins of /rtp/ and /udp/ requests (= iptv.interface).
    #[arg(long, value_name = "NAME")]
    multicast_interface: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::CheckConfig { file } => {
            let config = Config::load(Some(&file), std::env::vars(), &Overrides::default())?;
            print!("{}", config.masked());
            println!();
            print!("{}", sluice::app::describe_routes(&config)?);
            Ok(())
        }
        Command::Reload(args) => reload(args),
        Command::Serve(args) => {
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
            let runtime =
                sluice::runtime::main_runtime(config.server.runtime, config.server.threads)?;
            let source = (args.config.clone(), flags);
            runtime.block_on(sluice::serve_reloadable(
                config,
                Some(source),
                shutdown_signal(),
            ))
        }
    }
}

/// Sends SIGHUP to the running sluice named by `--pid`, `--pid-file` or the config's pid file.
fn reload(args: ReloadArgs) -> anyhow::Result<()> {
    let pid = match (args.pid, args.pid_file, args.config) {
        (Some(pid), _, _) => pid,
        (None, Some(path), _) => read_pid(&path)?,
        (None, None, Some(file)) => {
            let config = Config::load(Some(&file), std::env::vars(), &Overrides::default())?;
            let path = config.server.pid_file.ok_or_else(|| {
                anyhow::anyhow!("{} sets no server.pid_file; pass --pid", file.display())
            })?;
            read_pid(&path)?
        }
        (None, None, None) => anyhow::bail!("name the process: --pid, --pid-file or --config"),
    };
    if pid <= 1 {
        anyhow::bail!("refusing to signal pid {pid}");
    }
    // SAFETY: kill(2) with a positive pid and SIGHUP has no memory effects in this process.
    let rc = unsafe { libc::kill(pid, libc::SIGHUP) };
    if rc != 0 {
        anyhow::bail!(
            "cannot signal pid {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
    println!("sent SIGHUP to {pid}; the server log says whether the new config was applied");
    Ok(())
}

fn read_pid(path: &std::path::Path) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read pid file {}: {e}", path.display()))?;
    text.trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("{} does not hold a process id", path.display()))
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
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let value = std::env::var_os("RUST_LOG").map(|v| v.to_string_lossy().into_owned());
    let (filter, warning) = sluice::logging::filter_from(value.as_deref());
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .with(filter)
        .init();
    if let Some(warning) = warning {
        tracing::warn!("{warning}");
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
