//! The command line's grammar: the subcommands, their flags and the help text (no I/O; `main` acts).
//!
//! Hand-written instead of clap: this grammar is three subcommands and nine flags, and clap's
//! builder was 130 KiB of the router build's 2.4 MiB (`docs/decisions/footprint.md`).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

/// What this build ships: `--help` names only the front ends compiled in.
pub const ABOUT: &str = if cfg!(all(
    feature = "media",
    feature = "iptv",
    feature = "reverse",
    feature = "tcp"
)) {
    "Streaming proxy in one binary: a MediaFlow-compatible media proxy (HTTP streams, HLS,\n\
     DASH with ClearKey), an HTTP reverse proxy with a slice cache, a TCP proxy, and a\n\
     multicast RTP/UDP and RTSP to HTTP IPTV gateway."
} else if cfg!(all(
    feature = "iptv",
    not(any(feature = "media", feature = "reverse", feature = "tcp"))
)) {
    "Multicast RTP/UDP and RTSP to HTTP IPTV gateway: the gateway-only build of sluice, for\n\
     routers."
} else {
    "Streaming proxy in one binary, built with part of its front ends (see the Cargo features\n\
     in docs/architecture.md)."
};

const USAGE: &str = "\
Usage: sluice <COMMAND>

Commands:
  serve         Run the proxy. With no config file it listens on 127.0.0.1:8888 with its
                built-in endpoints on and no password (allowed only while every listener is
                loopback).
  check-config  Validate a config file and print the effective settings (file, then SLUICE_*
                environment variables) with secrets masked, then the effective route table in
                precedence order.
  reload        Ask a running sluice to re-read its config file (sends SIGHUP). Routes, upstream
                groups, reverse proxy settings and TLS certificates change live; an invalid file
                changes nothing.
  upgrade       Ask a running sluice to start the binary now installed at its path and hand it
                the listening sockets (sends SIGUSR2); the old process drains and exits.
  health        GET /health from the sluice serving this config (the container's HEALTHCHECK);
                exits 0 when it answers 200.
  help          Print this message or the help of the given command.

Options:
  -h, --help     Print help
  -V, --version  Print version

Options of serve (more in 'sluice serve --help'; every command has its own --help):
  -c, --config <CONFIG>           TOML config file (default: /etc/sluice/sluice.toml if present)
      --listen <ADDR>             Address to listen on; repeat for several
      --api-password-file <PATH>  Read the API password from this file
      --api-password <PW>         The API password (visible in the process list: prefer the file)
      --allow-private-upstreams   Allow upstreams on loopback, private and link-local addresses
      --multicast-interface <NAME>
                                  Interface for the IPTV gateway's multicast joins

Quick start: 'sluice serve' listens on 127.0.0.1:8888; open http://127.0.0.1:8888/ for what
runs. Every key of the config file can also be set as SLUICE_<SECTION>_<KEY>.
";

const SERVE_HELP: &str = "\
Run the proxy. With no config file it listens on 127.0.0.1:8888 with its built-in endpoints on
and no password (allowed only while every listener is loopback).

Usage: sluice serve [OPTIONS]

Options:
  -c, --config <CONFIG>
          TOML config file (see sluice.example.toml); without it, /etc/sluice/sluice.toml
          when that file exists. Environment variables SLUICE_<SECTION>_<KEY> override it,
          and the flags below override both.
      --listen <ADDR>
          Address to listen on; repeat for several (= server.listen).
      --api-password <PW>
          Password required on every endpoint that fetches for a client (= auth.api_password).
          Visible to every local user in the process list: prefer --api-password-file or the
          SLUICE_AUTH_API_PASSWORD environment variable.
      --api-password-file <PATH>
          Read the password from this file (first line; a trailing newline is ignored).
      --allow-private-upstreams
          Allow upstreams on loopback, private and link-local addresses
          (= upstream.allow_private).
      --multicast-interface <NAME>
          Default interface for multicast joins of /rtp/ and /udp/ requests (= iptv.interface).
  -h, --help
          Print help
";

const CHECK_CONFIG_HELP: &str = "\
Validate a config file and print the effective settings (file, then SLUICE_* environment
variables) with secrets masked, then the effective route table in precedence order.

Usage: sluice check-config <FILE>

Arguments:
  <FILE>  The TOML file to check.

Options:
  -h, --help  Print help
";

const RELOAD_HELP: &str = "\
Ask a running sluice to re-read its config file (sends SIGHUP). Routes, upstream groups, reverse
proxy settings and TLS certificates change live; an invalid file changes nothing.

Usage: sluice reload [OPTIONS]

Options:
      --pid <PID>          Process id of the running sluice.
      --pid-file <PATH>    File holding the process id (server.pid_file).
  -c, --config <CONFIG>    The config file of the running sluice; its server.pid_file is used.
                           Without any of these: /etc/sluice/sluice.toml's server.pid_file.
  -h, --help               Print help

Under systemd, `systemctl reload sluice` does the same.
";

const HEALTH_HELP: &str = "\
GET /health from the sluice serving this config, on its first listen address (a wildcard
address is asked on loopback). Exits 0 when it answers 200 within 3 seconds, 1 otherwise. The
container image's HEALTHCHECK; it needs no shell or curl.

Usage: sluice health [OPTIONS]

Options:
  -c, --config <CONFIG>    The config file (default: /etc/sluice/sluice.toml when it exists);
                           SLUICE_* environment variables apply as for serve.
  -h, --help               Print help
";

const UPGRADE_HELP: &str = "\
Ask a running sluice to upgrade itself (sends SIGUSR2): it starts the binary now installed at
its own path with its own arguments, hands it every listening socket, and once the new process
serves, stops accepting and drains (in-flight requests, streams, TCP relays and IPTV viewers
finish within server.shutdown_grace_secs). If the new process fails to start (a config error),
the old one goes on serving and logs why.

Usage: sluice upgrade [OPTIONS]

Options:
      --pid <PID>          Process id of the running sluice.
      --pid-file <PATH>    File holding the process id (server.pid_file).
  -c, --config <CONFIG>    The config file of the running sluice; its server.pid_file is used.
                           Without any of these: /etc/sluice/sluice.toml's server.pid_file.
  -h, --help               Print help

Under systemd: `systemctl kill -s USR2 --kill-whom=main sluice`.
";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Print this text to stdout and exit successfully (`--help`, `--version`).
    Print(String),
    Serve(ServeArgs),
    CheckConfig {
        file: PathBuf,
    },
    Reload(ReloadArgs),
    /// `sluice upgrade`: the same ways to name the process as `reload`.
    Upgrade(ReloadArgs),
    /// `sluice health`: the config whose listener to ask.
    Health {
        config: Option<PathBuf>,
    },
}

/// `sluice serve`'s flags.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ServeArgs {
    pub config: Option<PathBuf>,
    pub listen: Vec<SocketAddr>,
    pub api_password: Option<String>,
    pub api_password_file: Option<PathBuf>,
    pub allow_private_upstreams: bool,
    pub multicast_interface: Option<String>,
}

/// `sluice reload`'s and `sluice upgrade`'s flags: at most one of them names the process.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReloadArgs {
    pub pid: Option<i32>,
    pub pid_file: Option<PathBuf>,
    pub config: Option<PathBuf>,
}

/// A command line that does not parse; the message ends with where to find help.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CliError {
    #[error("no command given\n\n{USAGE}")]
    NoCommand,
    #[error("unrecognized subcommand '{0}'\n\nFor more information, try 'sluice --help'.")]
    UnknownCommand(String),
    #[error("unexpected argument '{arg}' for 'sluice {command}'\n\nFor more information, try 'sluice {command} --help'.")]
    UnknownArgument { command: &'static str, arg: String },
    #[error("a value is required for '{0}' but none was supplied")]
    MissingValue(&'static str),
    #[error("invalid value '{value}' for '{flag}': {reason}")]
    InvalidValue {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error("the argument '{0}' cannot be used more than once")]
    Repeated(&'static str),
    #[error("the argument '{0}' cannot be used with '{1}'")]
    Conflict(&'static str, &'static str),
    #[error("'sluice check-config' needs the config file to check: sluice check-config <FILE>")]
    MissingFile,
    #[error("argument '{0}' is not valid UTF-8")]
    NotUtf8(String),
}

/// One argument split into what it is: `--name[=value]`, `-x[value]`, or a plain word.
enum Arg {
    Long(String, Option<OsString>),
    Short(char, Option<OsString>),
    Word(OsString),
}

/// The arguments after the program name, split as they are read; `--` ends the flags.
struct Args {
    rest: std::vec::IntoIter<OsString>,
    only_words: bool,
}

impl Args {
    fn next(&mut self) -> Result<Option<Arg>, CliError> {
        let Some(raw) = self.rest.next() else {
            return Ok(None);
        };
        if self.only_words {
            return Ok(Some(Arg::Word(raw)));
        }
        let Some(text) = raw.to_str() else {
            // Only values may be non-UTF-8 (paths); a flag never is.
            return Ok(Some(Arg::Word(raw)));
        };
        if text == "--" {
            self.only_words = true;
            return self.next();
        }
        if let Some(long) = text.strip_prefix("--") {
            return Ok(Some(match long.split_once('=') {
                Some((name, value)) => Arg::Long(name.to_string(), Some(value.into())),
                None => Arg::Long(long.to_string(), None),
            }));
        }
        if let Some(short) = text.strip_prefix('-') {
            let mut chars = short.chars();
            if let Some(c) = chars.next() {
                let value = chars.as_str();
                let value = value.strip_prefix('=').unwrap_or(value);
                return Ok(Some(Arg::Short(
                    c,
                    (!value.is_empty()).then(|| value.into()),
                )));
            }
        }
        Ok(Some(Arg::Word(raw)))
    }

    /// The flag's value: the one attached (`--flag=v`, `-cv`) or the next argument.
    fn value(
        &mut self,
        flag: &'static str,
        attached: Option<OsString>,
    ) -> Result<OsString, CliError> {
        attached
            .or_else(|| self.rest.next())
            .ok_or(CliError::MissingValue(flag))
    }
}

fn utf8(value: OsString) -> Result<String, CliError> {
    value
        .into_string()
        .map_err(|v| CliError::NotUtf8(v.to_string_lossy().into_owned()))
}

fn once<T>(slot: &mut Option<T>, flag: &'static str, value: T) -> Result<(), CliError> {
    if slot.replace(value).is_some() {
        return Err(CliError::Repeated(flag));
    }
    Ok(())
}

/// `-c`/`--config PATH`, given at most once (`serve`, `check-config`, `reload`).
fn config_path(
    slot: &mut Option<PathBuf>,
    args: &mut Args,
    attached: Option<OsString>,
) -> Result<(), CliError> {
    let path = args.value("--config", attached)?.into();
    once(slot, "--config", path)
}

fn shown(arg: &Arg) -> String {
    match arg {
        Arg::Long(name, _) => format!("--{name}"),
        Arg::Short(c, _) => format!("-{c}"),
        Arg::Word(w) => w.to_string_lossy().into_owned(),
    }
}

/// The help for `command` (`None`: the top level).
pub fn help(command: Option<&str>) -> Result<String, CliError> {
    Ok(match command {
        None => format!("{ABOUT}\n\n{USAGE}"),
        Some("serve") => SERVE_HELP.to_string(),
        Some("check-config") => CHECK_CONFIG_HELP.to_string(),
        Some("reload") => RELOAD_HELP.to_string(),
        Some("upgrade") => UPGRADE_HELP.to_string(),
        Some("health") => HEALTH_HELP.to_string(),
        Some(other) => return Err(CliError::UnknownCommand(other.to_string())),
    })
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Action, CliError> {
    let mut args = Args {
        rest: args.into_iter().collect::<Vec<_>>().into_iter(),
        only_words: false,
    };
    let command = match args.next()? {
        None => return Err(CliError::NoCommand),
        Some(Arg::Long(name, None)) if name == "help" => return help(None).map(Action::Print),
        Some(Arg::Short('h', None)) => return help(None).map(Action::Print),
        Some(Arg::Long(name, None)) if name == "version" => return Ok(version()),
        Some(Arg::Short('V', None)) => return Ok(version()),
        Some(Arg::Word(word)) => utf8(word)?,
        Some(other) => return Err(CliError::UnknownCommand(shown(&other))),
    };
    match command.as_str() {
        "serve" => serve(&mut args),
        "check-config" => check_config(&mut args),
        "reload" => reload(&mut args, "reload", Action::Reload),
        "upgrade" => reload(&mut args, "upgrade", Action::Upgrade),
        "health" => health(&mut args),
        "help" => match args.next()? {
            None => help(None).map(Action::Print),
            Some(Arg::Word(w)) => help(Some(&utf8(w)?)).map(Action::Print),
            Some(other) => Err(CliError::UnknownCommand(shown(&other))),
        },
        _ => Err(CliError::UnknownCommand(command)),
    }
}

/// The Cargo features this binary was built with (`sluice --version` lists them).
pub const FEATURES: &[(&str, bool)] = &[
    ("media", cfg!(feature = "media")),
    ("iptv", cfg!(feature = "iptv")),
    ("reverse", cfg!(feature = "reverse")),
    ("cache", cfg!(feature = "cache")),
    ("tcp", cfg!(feature = "tcp")),
    ("tls", cfg!(feature = "tls")),
    ("aws-lc", cfg!(feature = "aws-lc")),
    ("ring", cfg!(feature = "ring")),
    ("dns", cfg!(feature = "dns")),
    ("http2", cfg!(feature = "http2")),
    ("http3", cfg!(feature = "http3")),
    ("acme", cfg!(feature = "acme")),
    ("multi-thread", cfg!(feature = "multi-thread")),
    ("jemalloc", cfg!(feature = "jemalloc")),
    ("static-memcpy", cfg!(feature = "static-memcpy")),
];

/// `sluice --version`: the version, the commit, the features built in and the target.
pub fn version_text() -> String {
    let features: Vec<&str> = FEATURES
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect();
    format!(
        "sluice {} (commit {})\nfeatures: {}\ntarget: {}\n",
        env!("CARGO_PKG_VERSION"),
        env!("BUILT_COMMIT"),
        features.join(" "),
        env!("BUILT_TARGET"),
    )
}

fn version() -> Action {
    Action::Print(version_text())
}

fn is_help(arg: &Arg) -> bool {
    matches!(arg, Arg::Long(n, None) if n == "help") || matches!(arg, Arg::Short('h', None))
}

fn serve(args: &mut Args) -> Result<Action, CliError> {
    let mut out = ServeArgs::default();
    while let Some(arg) = args.next()? {
        if is_help(&arg) {
            return help(Some("serve")).map(Action::Print);
        }
        match arg {
            Arg::Short('c', v) => config_path(&mut out.config, args, v)?,
            Arg::Long(n, v) if n == "config" => config_path(&mut out.config, args, v)?,
            Arg::Long(n, v) if n == "listen" => {
                let value = utf8(args.value("--listen", v)?)?;
                let addr = value.parse().map_err(|e: std::net::AddrParseError| {
                    CliError::InvalidValue {
                        flag: "--listen",
                        value: value.clone(),
                        reason: e.to_string(),
                    }
                })?;
                out.listen.push(addr);
            }
            Arg::Long(n, v) if n == "api-password" => {
                let pw = utf8(args.value("--api-password", v)?)?;
                once(&mut out.api_password, "--api-password", pw)?
            }
            Arg::Long(n, v) if n == "api-password-file" => {
                let path = args.value("--api-password-file", v)?.into();
                once(&mut out.api_password_file, "--api-password-file", path)?
            }
            Arg::Long(n, None) if n == "allow-private-upstreams" => {
                out.allow_private_upstreams = true
            }
            Arg::Long(n, v) if n == "multicast-interface" => {
                let name = utf8(args.value("--multicast-interface", v)?)?;
                once(&mut out.multicast_interface, "--multicast-interface", name)?
            }
            other => {
                return Err(CliError::UnknownArgument {
                    command: "serve",
                    arg: shown(&other),
                })
            }
        }
    }
    if out.api_password.is_some() && out.api_password_file.is_some() {
        return Err(CliError::Conflict("--api-password", "--api-password-file"));
    }
    Ok(Action::Serve(out))
}

fn check_config(args: &mut Args) -> Result<Action, CliError> {
    let mut file = None;
    while let Some(arg) = args.next()? {
        if is_help(&arg) {
            return help(Some("check-config")).map(Action::Print);
        }
        match arg {
            Arg::Word(w) if file.is_none() => file = Some(PathBuf::from(w)),
            other => {
                return Err(CliError::UnknownArgument {
                    command: "check-config",
                    arg: shown(&other),
                })
            }
        }
    }
    let file = file.ok_or(CliError::MissingFile)?;
    Ok(Action::CheckConfig { file })
}

fn health(args: &mut Args) -> Result<Action, CliError> {
    let mut config = None;
    while let Some(arg) = args.next()? {
        if is_help(&arg) {
            return help(Some("health")).map(Action::Print);
        }
        match arg {
            Arg::Short('c', v) => config_path(&mut config, args, v)?,
            Arg::Long(n, v) if n == "config" => config_path(&mut config, args, v)?,
            other => {
                return Err(CliError::UnknownArgument {
                    command: "health",
                    arg: shown(&other),
                })
            }
        }
    }
    Ok(Action::Health { config })
}

/// `reload` and `upgrade`: the process is named the same way; `action` says which.
fn reload(
    args: &mut Args,
    command: &'static str,
    action: fn(ReloadArgs) -> Action,
) -> Result<Action, CliError> {
    let mut out = ReloadArgs::default();
    while let Some(arg) = args.next()? {
        if is_help(&arg) {
            return help(Some(command)).map(Action::Print);
        }
        match arg {
            Arg::Long(n, v) if n == "pid" => {
                let value = utf8(args.value("--pid", v)?)?;
                let pid =
                    value
                        .parse()
                        .map_err(|e: std::num::ParseIntError| CliError::InvalidValue {
                            flag: "--pid",
                            value: value.clone(),
                            reason: e.to_string(),
                        })?;
                once(&mut out.pid, "--pid", pid)?
            }
            Arg::Long(n, v) if n == "pid-file" => {
                let path = args.value("--pid-file", v)?.into();
                once(&mut out.pid_file, "--pid-file", path)?
            }
            Arg::Short('c', v) => config_path(&mut out.config, args, v)?,
            Arg::Long(n, v) if n == "config" => config_path(&mut out.config, args, v)?,
            other => {
                return Err(CliError::UnknownArgument {
                    command,
                    arg: shown(&other),
                })
            }
        }
    }
    let named = [
        ("--pid", out.pid.is_some()),
        ("--pid-file", out.pid_file.is_some()),
        ("--config", out.config.is_some()),
    ];
    let mut given = named.iter().filter(|(_, set)| *set).map(|(n, _)| *n);
    if let (Some(a), Some(b)) = (given.next(), given.next()) {
        return Err(CliError::Conflict(a, b));
    }
    Ok(action(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Action, CliError> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn serve_flags_in_both_spellings() {
        let Action::Serve(a) = p(&[
            "serve",
            "-c",
            "/etc/sluice.toml",
            "--listen",
            "127.0.0.1:1",
            "--listen=[::1]:2",
            "--api-password-file=/run/pw",
            "--allow-private-upstreams",
            "--multicast-interface",
            "eth0",
        ])
        .unwrap() else {
            panic!("not serve")
        };
        assert_eq!(
            a,
            ServeArgs {
                config: Some("/etc/sluice.toml".into()),
                listen: vec!["127.0.0.1:1".parse().unwrap(), "[::1]:2".parse().unwrap()],
                api_password: None,
                api_password_file: Some("/run/pw".into()),
                allow_private_upstreams: true,
                multicast_interface: Some("eth0".into()),
            }
        );
        let Action::Serve(a) = p(&["serve", "-c/x.toml", "--api-password", "s3"]).unwrap() else {
            panic!("not serve")
        };
        assert_eq!(a.config, Some("/x.toml".into()));
        assert_eq!(a.api_password.as_deref(), Some("s3"));
        assert_eq!(p(&["serve"]).unwrap(), Action::Serve(ServeArgs::default()));
    }

    #[test]
    fn bad_lines_are_refused_with_the_reason() {
        assert_eq!(p(&[]), Err(CliError::NoCommand));
        assert_eq!(p(&["serv"]), Err(CliError::UnknownCommand("serv".into())));
        assert!(matches!(
            p(&["serve", "--listen", "localhost:x"]),
            Err(CliError::InvalidValue {
                flag: "--listen",
                ..
            })
        ));
        assert_eq!(
            p(&["serve", "--listen"]),
            Err(CliError::MissingValue("--listen"))
        );
        assert_eq!(
            p(&["serve", "--bogus"]),
            Err(CliError::UnknownArgument {
                command: "serve",
                arg: "--bogus".into()
            })
        );
        assert_eq!(
            p(&["serve", "--allow-private-upstreams=yes"]),
            Err(CliError::UnknownArgument {
                command: "serve",
                arg: "--allow-private-upstreams".into()
            })
        );
        assert_eq!(
            p(&["serve", "--api-password", "a", "--api-password-file", "f"]),
            Err(CliError::Conflict("--api-password", "--api-password-file"))
        );
        assert_eq!(
            p(&["serve", "-c", "a", "--config", "b"]),
            Err(CliError::Repeated("--config"))
        );
        assert_eq!(p(&["check-config"]), Err(CliError::MissingFile));
        assert!(p(&["check-config", "a", "b"]).is_err());
        assert_eq!(
            p(&["reload", "--pid", "12", "-c", "x"]),
            Err(CliError::Conflict("--pid", "--config"))
        );
        assert!(matches!(
            p(&["reload", "--pid", "twelve"]),
            Err(CliError::InvalidValue { flag: "--pid", .. })
        ));
    }

    #[test]
    fn check_config_and_reload() {
        assert_eq!(
            p(&["check-config", "--", "-odd.toml"]).unwrap(),
            Action::CheckConfig {
                file: "-odd.toml".into()
            }
        );
        assert_eq!(
            p(&["reload", "--pid-file=/run/sluice.pid"]).unwrap(),
            Action::Reload(ReloadArgs {
                pid_file: Some("/run/sluice.pid".into()),
                ..ReloadArgs::default()
            })
        );
        assert_eq!(
            p(&["reload", "--pid", "42"]).unwrap(),
            Action::Reload(ReloadArgs {
                pid: Some(42),
                ..ReloadArgs::default()
            })
        );
    }

    #[test]
    fn help_and_version_name_every_flag() {
        let Action::Print(top) = p(&["--help"]).unwrap() else {
            panic!()
        };
        assert!(top.starts_with(ABOUT));
        for c in ["serve", "check-config", "reload"] {
            assert!(top.contains(c), "{c}");
            assert_eq!(p(&["help", c]).unwrap(), p(&[c, "--help"]).unwrap());
            assert_eq!(p(&[c, "-h"]).unwrap(), p(&[c, "--help"]).unwrap());
        }
        let Action::Print(serve) = p(&["serve", "--help"]).unwrap() else {
            panic!()
        };
        for flag in [
            "--config",
            "--listen",
            "--api-password ",
            "--api-password-file",
            "--allow-private-upstreams",
            "--multicast-interface",
        ] {
            assert!(serve.contains(flag), "{flag}");
        }
        let Action::Print(v) = p(&["-V"]).unwrap() else {
            panic!("-V prints")
        };
        let first = v.lines().next().unwrap();
        assert!(
            first.starts_with(&format!("sluice {} (commit ", env!("CARGO_PKG_VERSION"))),
            "{v}"
        );
        assert!(
            v.contains("\nfeatures: ") && v.contains("\ntarget: "),
            "{v}"
        );
        #[cfg(feature = "media")]
        assert!(v.contains(" media"), "{v}");
        assert_eq!(
            p(&["upgrade", "--pid", "7"]).unwrap(),
            Action::Upgrade(ReloadArgs {
                pid: Some(7),
                ..Default::default()
            })
        );
        assert_eq!(p(&["--version"]).unwrap(), p(&["-V"]).unwrap());
    }

    #[test]
    fn non_utf8_paths_pass_through() {
        use std::os::unix::ffi::OsStringExt;
        let path = OsString::from_vec(vec![b'/', 0xff, b'.', b't']);
        let got = parse(vec!["check-config".into(), path.clone()]).unwrap();
        assert_eq!(
            got,
            Action::CheckConfig {
                file: PathBuf::from(path)
            }
        );
    }
}
