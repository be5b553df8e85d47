//! The TOML configuration: composes the sections the modules own, layers defaults, file,
//! environment and flag overrides, checks what spans sections, and masks secrets.
//!
//! Precedence, lowest first: built-in defaults, the config file, `SLUICE_<SECTION>_<KEY>` environment
//! variables, command-line flags. Everything is validated before anything binds.
//!
//! Each section's type, defaults, doc comments and own checks live with the module that reads it:
//! `[server]` and `[endpoints]` in `server::config`, `[auth]` in `auth::config`, `[upstream]` in
//! `upstream::config`, `[media]` in `media::config`, `[iptv]` in `iptv`, `[[upstreams]]` in
//! `upstream::group`, `[[routes]]` and `[reverse]` in `reverse::config`, `[[tcp]]` in
//! `tcp::config`, `[cache]` in `cache::config`, `[acme]` in `acme::config`. The re-exports below
//! keep the old paths working.

mod env;

use std::net::SocketAddr;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

pub use crate::auth::AuthConfig;
#[cfg(feature = "media")]
pub use crate::media::config::{public_ip, ratelimit, AcestreamConfig, MediaConfig};
pub use crate::server::config::{EndpointsConfig, NamedListener, ServerConfig, MAIN_LISTENER};
pub use crate::upstream::{RouteConfig, UpstreamConfig};

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub upstream: UpstreamConfig,
    #[cfg(feature = "media")]
    pub media: MediaConfig,
    #[cfg(feature = "iptv")]
    pub iptv: crate::iptv::IptvConfig,
    /// Named upstream groups (`[[upstreams]]`) for the reverse and TCP front ends.
    #[cfg(feature = "groups")]
    pub upstreams: Vec<crate::upstream::group::GroupConfig>,
    /// Reverse proxy routes (`[[routes]]`): host + path prefix to an upstream group.
    #[cfg(feature = "reverse")]
    pub routes: Vec<crate::reverse::RouteConfig>,
    /// Settings shared by every reverse proxy route.
    #[cfg(feature = "reverse")]
    pub reverse: crate::reverse::ReverseConfig,
    /// Where the built-in endpoints are served, or whether at all.
    pub endpoints: EndpointsConfig,
    /// TCP (L4) listeners (`[[tcp]]`).
    #[cfg(feature = "tcp")]
    pub tcp: Vec<crate::tcp::TcpConfig>,
    /// The slice cache service (`[cache]`), used by routes with `cache = true`.
    #[cfg(feature = "cache")]
    pub cache: crate::cache::CacheConfig,
    /// Automatic HTTPS (`[acme]`).
    #[cfg(feature = "acme")]
    pub acme: crate::acme::AcmeConfig,
}

/// Settings given on the command line; each equals a config key.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Vec<SocketAddr>,
    pub api_password: Option<String>,
    pub allow_private_upstreams: bool,
    pub multicast_interface: Option<String>,
}

impl Config {
    /// Whether the media front end caches (`media.cache`; the deprecated `media.cache_bytes = 0`
    /// turns it off too).
    #[cfg(feature = "media")]
    pub fn media_caches(&self) -> bool {
        self.media.enabled && self.media.cache && self.media.cache_bytes != Some(0)
    }

    /// Whether the media front end caches: never in a build without it.
    #[cfg(not(feature = "media"))]
    pub fn media_caches(&self) -> bool {
        false
    }

    /// Whether `/proxy/*` is served (`media.enabled`).
    #[cfg(feature = "media")]
    pub fn media_enabled(&self) -> bool {
        self.media.enabled
    }

    /// Whether `/proxy/*` is served: never in a build without the media front end.
    #[cfg(not(feature = "media"))]
    pub fn media_enabled(&self) -> bool {
        false
    }

    /// Every `[[routes]]` host (what `acme.routes = true` holds certificates for).
    pub fn route_hosts(&self) -> Vec<String> {
        #[cfg(feature = "reverse")]
        return self.routes.iter().filter_map(|r| r.host.clone()).collect();
        #[cfg(not(feature = "reverse"))]
        Vec::new()
    }

    /// Whether any front end uses the slice cache service.
    #[cfg(feature = "cache")]
    pub fn needs_cache(&self) -> bool {
        #[cfg(feature = "reverse")]
        if self.routes.iter().any(|r| r.cache) {
            return true;
        }
        self.media_caches()
    }

    /// The `[cache]` section as it applies: the deprecated `media.cache_bytes` raises
    /// `memory_bytes` to at least its value.
    #[cfg(feature = "cache")]
    pub fn cache_section(&self) -> crate::cache::CacheConfig {
        #[cfg_attr(not(feature = "media"), allow(unused_mut))]
        let mut c = self.cache.clone();
        #[cfg(feature = "media")]
        if let Some(n) = self.media.cache_bytes.filter(|n| *n > 0) {
            c.memory_bytes = c.memory_bytes.max(crate::cache::ByteSize(n));
        }
        c
    }

    /// Loads defaults, then the file (if any), then `SLUICE_*` variables from `env`, then flags;
    /// validates the result.
    pub fn load(
        file: Option<&std::path::Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> anyhow::Result<Config> {
        let mut table = toml::Table::try_from(Config::default()).context("encoding defaults")?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config file {}", path.display()))?;
            let parsed = Self::parse_file(&text)
                .with_context(|| format!("in config file {}", path.display()))?;
            merge(&mut table, toml::Table::try_from(parsed)?);
        }
        let base = table.clone();
        let applied = apply_env(&mut table, env)?;
        apply_flags(&mut table, flags)?;
        // Back through the text parser rather than `Value::try_into`: every config type's
        // `Deserialize` is then compiled for one deserializer, not two (~150 KiB of the router
        // build, docs/decisions/footprint.md).
        let merged = toml::to_string(&table).context("encoding the merged settings")?;
        let config: Config = match toml::from_str(&merged) {
            Ok(config) => config,
            // The merged document is no file of the user's: name the variable, not its line.
            Err(e) => match env::blame(&base, &applied) {
                Some(message) => bail!("{message}"),
                None => {
                    return Err(anyhow::anyhow!("{}", describe_toml_error(&merged, &e)))
                        .context("applying environment and flag overrides")
                }
            },
        };
        config.validate()?;
        Ok(config)
    }

    /// Parses config text, reporting unknown keys and bad values with their location. A section
    /// of a front end this build leaves out is named with the feature that brings it.
    pub fn parse_file(text: &str) -> anyhow::Result<Config> {
        toml::from_str::<Config>(text).map_err(|e| {
            let table = text.parse::<toml::Table>().unwrap_or_default();
            match left_out()
                .into_iter()
                .find(|(key, _)| table.contains_key(*key))
            {
                Some((key, feature)) => anyhow::anyhow!(
                    "[{key}]: this sluice was built without the `{feature}` feature; remove the \
                     section or use a build that has it (see docs/iptv.md, \"Router build\")"
                ),
                None => anyhow::anyhow!("{}", describe_toml_error(text, &e)),
            }
        })
    }

    /// Checks what types alone cannot: each section's own checks, then what spans sections.
    pub fn validate(&self) -> anyhow::Result<()> {
        check_magnitudes(self)?;
        let s = &self.server;
        #[cfg(feature = "acme")]
        self.acme.validate(&self.route_hosts())?;
        #[cfg(feature = "acme")]
        s.validate_with(self.acme.active(&self.route_hosts()))?;
        #[cfg(not(feature = "acme"))]
        s.validate()?;
        if s.listener_id(&self.endpoints.listener).is_none() {
            bail!(
                "endpoints.listener {:?} names no listener (have: {})",
                self.endpoints.listener,
                s.listener_names().join(", ")
            );
        }
        #[cfg(feature = "reverse")]
        for (i, r) in self.routes.iter().enumerate() {
            if let Some(name) = &r.listener {
                if s.listener_id(name).is_none() {
                    bail!("routes[{i}].listener {name:?} names no listener");
                }
            }
        }
        if self.auth.api_password.is_empty() {
            if let Some((_, open)) = s
                .all_listen()
                .into_iter()
                .find(|(_, a)| !a.ip().is_loopback())
            {
                bail!(
                    "listener {open} is reachable from other hosts but no password is set: set \
                     auth.api_password (or --api-password, or SLUICE_AUTH_API_PASSWORD), or listen \
                     on a loopback address such as 127.0.0.1"
                );
            }
        }
        self.upstream.validate()?;
        #[cfg(feature = "groups")]
        crate::upstream::group::Groups::new(&self.upstreams).context("in [[upstreams]]")?;
        #[cfg(feature = "tcp")]
        crate::tcp::config::validate(&self.tcp, &self.upstreams).map_err(anyhow::Error::msg)?;
        #[cfg(feature = "iptv")]
        self.iptv
            .validate()
            .map_err(|e| anyhow::anyhow!("in [iptv]: {e}"))?;
        #[cfg(feature = "cache")]
        self.cache
            .validate()
            .map_err(|e| anyhow::anyhow!("in [cache]: {e}"))?;
        #[cfg(feature = "reverse")]
        if let Some(i) = self.routes.iter().position(|r| r.cache) {
            if self.cache.memory_bytes.0 == 0 {
                bail!("route {i} has cache = true but [cache] memory_bytes is 0");
            }
        }
        #[cfg(feature = "reverse")]
        {
            let groups: Vec<&str> = self.upstreams.iter().map(|g| g.name.as_str()).collect();
            for (i, route) in self.routes.iter().enumerate() {
                route.validate(i, &groups).context("in [[routes]]")?;
            }
        }
        self.endpoints.validate()?;
        #[cfg(feature = "media")]
        self.media.validate()?;
        Ok(())
    }

    /// The effective settings as TOML with every secret masked.
    pub fn masked(&self) -> String {
        let mut copy = self.clone();
        if !copy.auth.api_password.is_empty() {
            copy.auth.api_password = "********".to_string();
        }
        for route in &mut copy.upstream.routes {
            route.proxy = mask_userinfo(&route.proxy);
        }
        copy.upstream.proxy_url = mask_userinfo(&copy.upstream.proxy_url);
        copy.upstream.transport_routes = copy.upstream.transport_routes.masked();
        #[cfg(feature = "cache")]
        if !copy.cache.purge_key.is_empty() {
            copy.cache.purge_key = "********".to_string();
        }
        #[cfg(feature = "cache")]
        if let Some(c) = copy.cache.cluster.as_mut() {
            c.secret = "********".to_string();
        }
        #[cfg(feature = "reverse")]
        for route in &mut copy.routes {
            for (name, value) in route
                .request_headers_add
                .iter_mut()
                .chain(route.response_headers_add.iter_mut())
            {
                if crate::redact::is_secret_header(name) {
                    *value = "********".to_string();
                }
            }
        }
        #[cfg(feature = "iptv")]
        for url in [&mut copy.iptv.playlist, &mut copy.iptv.epg_url]
            .into_iter()
            .flatten()
        {
            *url = crate::redact::mask_url(url);
        }
        #[cfg(feature = "acme")]
        if let Some(ask) = copy.acme.on_demand.ask.as_mut() {
            *ask = crate::redact::mask_url(ask);
        }
        #[cfg(feature = "media")]
        {
            copy.media.acestream.engine_url = mask_userinfo(&copy.media.acestream.engine_url);
        }
        // Through a table, like `load`: one `Serialize` instantiation per config type, not two.
        toml::Table::try_from(copy)
            .and_then(|table| toml::to_string_pretty(&table))
            .unwrap_or_else(|e| format!("# cannot print: {e}"))
    }
}

pub use crate::redact::mask_userinfo;

/// The longest duration any setting may give: ten years, past every real timeout, TTL or age,
/// and far from where adding it to a clock reading overflows (which panics).
const MAX_DURATION_SECS: u64 = 10 * 365 * 86_400;
/// The most connections any `max_connections*` setting may allow: far past any descriptor
/// limit, and under what a semaphore holds (a larger count panics when the limit is built).
const MAX_CONNECTIONS: u64 = 1 << 24;
/// The most any other count (`max_*` but sizes in bytes, `*_queue`) may be: far past any real
/// setting, and under what a semaphore holds on every target. Some of these counts size a
/// `tokio::sync::Semaphore`, which panics past `Semaphore::MAX_PERMITS` (`usize::MAX >> 3`:
/// 536,870,911 on a 32-bit router), so the ceiling is one for every build, not `1 << 32` on a
/// 64-bit one: a file that loads on a PC loads on the router too.
const MAX_COUNT: u64 = 1 << 28;
const _: () = assert!(MAX_COUNT <= tokio::sync::Semaphore::MAX_PERMITS as u64);

/// Refuses a duration (a key ending in `_secs` or `_ms`) past ten years, a connection count
/// past 2^24 and another count past 2^28 anywhere in the config, by its path: each section
/// checks its own rules, and this one check keeps a key added later from taking a value that
/// panics when it is used.
fn check_magnitudes(config: &Config) -> anyhow::Result<()> {
    fn walk(path: &str, value: &toml::Value) -> anyhow::Result<()> {
        match value {
            toml::Value::Table(table) => {
                for (key, v) in table {
                    let path = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    walk(&path, v)?;
                }
            }
            toml::Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(&format!("{path}[{i}]"), v)?;
                }
            }
            toml::Value::Integer(n) => {
                let key = path.rsplit('.').next().unwrap_or(path);
                let n = u64::try_from(*n).unwrap_or(0);
                let most = if key.ends_with("_secs") {
                    Some((MAX_DURATION_SECS, "ten years"))
                } else if key.ends_with("_ms") {
                    Some((MAX_DURATION_SECS * 1000, "ten years"))
                } else if key.starts_with("max_connections") {
                    Some((MAX_CONNECTIONS, "2^24"))
                } else if (key.starts_with("max_") || key.ends_with("_queue"))
                    && !key.ends_with("_bytes")
                {
                    // Counts (setups per host, fills, queued writes, commands running) some
                    // of which size a semaphore.
                    Some((MAX_COUNT, "2^28"))
                } else {
                    None
                };
                if let Some((most, what)) = most.filter(|(most, _)| n > *most) {
                    bail!("{path} = {n} is too large: at most {most} ({what})");
                }
            }
            _ => {}
        }
        Ok(())
    }
    let table = toml::Table::try_from(config).context("the config cannot be checked")?;
    walk("", &toml::Value::Table(table))
}

/// A TOML error as line, column, key and what is wrong, never quoting the file: the line may hold
/// a password, and this text reaches the log, the `/admin/reload` answer and `check-config`.
pub fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = redact_values(e.message().trim());
    let Some(span) = e.span() else {
        return message;
    };
    let before = &text[..span.start.min(text.len())];
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    let section = before[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .and_then(|l| l.split(']').next())
        .map(|l| l.trim_start_matches('[').trim().to_string());
    let key = line.split_once('=').map(|(k, _)| k.trim()).filter(|k| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '"'))
    });
    let place = match (section, key) {
        (Some(s), Some(k)) => format!(", key `{s}.{k}`"),
        (None, Some(k)) => format!(", key `{k}`"),
        (Some(s), None) => format!(", in [{s}]"),
        (None, None) => String::new(),
    };
    format!("TOML error at line {line_no}, column {column}{place}: {message}")
}

/// A deserializer message without the value it complains about (`invalid type: string "pw",
/// expected u64` keeps only what was expected): key names in other messages stay.
fn redact_values(message: &str) -> String {
    if !(message.starts_with("invalid type") || message.starts_with("invalid value")) {
        return message.to_string();
    }
    match message.split_once(", expected") {
        Some((what, expected)) => {
            let kind = what.split(['`', '"']).next().unwrap_or(what).trim_end();
            format!("{kind} (value not shown), expected{expected}")
        }
        None => "invalid value (not shown)".to_string(),
    }
}

/// Top-level sections whose front end or service this build leaves out, with its feature.
pub fn left_out() -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    let mut absent = |built: bool, key, feature| {
        if !built {
            out.push((key, feature));
        }
    };
    absent(cfg!(feature = "media"), "media", "media");
    absent(cfg!(feature = "iptv"), "iptv", "iptv");
    absent(cfg!(feature = "reverse"), "routes", "reverse");
    absent(cfg!(feature = "reverse"), "reverse", "reverse");
    absent(cfg!(feature = "groups"), "upstreams", "reverse");
    absent(cfg!(feature = "tcp"), "tcp", "tcp");
    absent(cfg!(feature = "cache"), "cache", "cache");
    absent(cfg!(feature = "acme"), "acme", "acme");
    out
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Whether `name=value` is one of the variables Kubernetes (and Docker's links) put in every pod
/// for each Service of its namespace: a Service named `sluice` (the Helm chart's default
/// release) gives `SLUICE_SERVICE_HOST`, `SLUICE_SERVICE_PORT[_<name>]`, `SLUICE_PORT=tcp://...`
/// and `SLUICE_PORT_<n>_TCP[_PROTO|_PORT|_ADDR]`, one named `sluice-tcp` the same under
/// `SLUICE_TCP_`. They name no key; taken for config they refused the start (a pod that never
/// came up), so they are passed over.
fn service_link(name: &str, value: &str) -> bool {
    let name = name.to_ascii_uppercase();
    if name.ends_with("_SERVICE_HOST") || name.contains("_SERVICE_PORT") {
        return true;
    }
    let value = value.to_ascii_lowercase();
    if name.ends_with("_PORT")
        && ["tcp://", "udp://", "sctp://"]
            .iter()
            .any(|p| value.starts_with(p))
    {
        return true;
    }
    // `_PORT_<digits>_<TCP|UDP|SCTP>`, then nothing or `_PROTO`, `_PORT`, `_ADDR`.
    let mut rest = name.as_str();
    while let Some(at) = rest.find("_PORT_") {
        let after = &rest[at + "_PORT_".len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 {
            let tail = &after[digits..];
            for proto in ["_TCP", "_UDP", "_SCTP"] {
                if let Some(end) = tail.strip_prefix(proto) {
                    if matches!(end, "" | "_PROTO" | "_PORT" | "_ADDR") {
                        return true;
                    }
                }
            }
        }
        rest = after;
    }
    false
}

/// Applies `SLUICE_<SECTION>_<KEY>=value`. A string key takes the value exactly as written;
/// another key reads it as a TOML literal when it parses as one (numbers, booleans, arrays), and
/// a comma list fills an array key. Kubernetes' service-link variables are passed over
/// ([`service_link`]).
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<Vec<env::Applied>> {
    let mut applied = Vec::new();
    let sections: Vec<String> = table.keys().cloned().collect();
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("SLUICE_") else {
            continue;
        };
        if service_link(&name, &raw) {
            tracing::debug!(variable = %name, "a Service's link variable, not config: passed over");
            continue;
        }
        let rest = rest.to_ascii_lowercase();
        let Some(section) = sections.iter().find(|s| rest.starts_with(&format!("{s}_"))) else {
            bail!(
                "environment variable {name}: no config section matches (sections: {})",
                sections.join(", ")
            );
        };
        let key = &rest[section.len() + 1..];
        let Some(toml::Value::Table(section_table)) = table.get_mut(section.as_str()) else {
            // `[[tcp]]`, `[[routes]]`: a list of tables has no one table a key could go in, and
            // a variable left unapplied would look set. The value is never quoted.
            bail!(
                "environment variable {name}: [[{section}]] is a list of tables, which \
                 SLUICE_* variables cannot set; set it in the config file"
            );
        };
        let existing = section_table.get(key);
        let value = env_value(&raw, existing);
        section_table.insert(key.to_string(), value.clone());
        applied.push(env::Applied {
            section: section.clone(),
            key: key.to_string(),
            value,
            name,
        });
    }
    Ok(applied)
}

/// One variable's value for a key whose current value is `existing` (`None`: a key with no
/// default). A string is never read as TOML: `'Ab3'#x9` would become `Ab3` (a quoted string, then
/// a comment), so a password could be cut short without a word. Quotes and `#` stay part of it.
fn env_value(raw: &str, existing: Option<&toml::Value>) -> toml::Value {
    let verbatim = || toml::Value::String(raw.to_string());
    if matches!(existing, Some(toml::Value::String(_))) {
        return verbatim();
    }
    if let Ok(mut doc) = format!("v = {raw}").parse::<toml::Table>() {
        if let Some(v) = doc.remove("v") {
            // A key with no default may be a string too: a TOML string is never unquoted.
            let same_kind = existing.is_none_or(|e| e.same_type(&v));
            if same_kind && !v.is_str() {
                return v;
            }
        }
    }
    if matches!(existing, Some(toml::Value::Array(_))) {
        return toml::Value::Array(
            raw.split(',')
                .map(|s| toml::Value::String(s.trim().to_string()))
                .filter(|v| v.as_str() != Some(""))
                .collect(),
        );
    }
    verbatim()
}

fn apply_flags(table: &mut toml::Table, flags: &Overrides) -> anyhow::Result<()> {
    let mut set = |section: &str, key: &str, value: toml::Value| {
        if let Some(toml::Value::Table(t)) = table.get_mut(section) {
            t.insert(key.to_string(), value);
        }
    };
    if !flags.listen.is_empty() {
        let list = flags
            .listen
            .iter()
            .map(|a| toml::Value::String(a.to_string()))
            .collect();
        set("server", "listen", toml::Value::Array(list));
    }
    if let Some(pw) = &flags.api_password {
        set("auth", "api_password", toml::Value::String(pw.clone()));
    }
    if let Some(name) = &flags.multicast_interface {
        if !cfg!(feature = "iptv") {
            bail!("--multicast-interface: this sluice was built without the IPTV gateway (the `iptv` feature)");
        }
        set("iptv", "interface", toml::Value::String(name.clone()));
    }
    if flags.allow_private_upstreams {
        set("upstream", "allow_private", toml::Value::Boolean(true));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_loopback_and_valid() {
        let c = Config::load(None, env(&[]), &Overrides::default()).unwrap();
        assert_eq!(c.server.listen, vec!["127.0.0.1:8888".parse().unwrap()]);
        // On where the media front end is built in; never in the gateway-only build.
        assert_eq!(c.media_enabled(), cfg!(feature = "media"));
    }

    #[test]
    fn unknown_key_is_named_with_location() {
        let err = Config::parse_file("[server]\nlisten = [\"127.0.0.1:1\"]\nlistn = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `listn`"), "{err}");
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("expected one of"), "{err}");
    }

    /// The sections read by `config_section!` keep serde's errors and locations, and a key
    /// left out keeps its default.
    #[cfg(feature = "iptv")]
    #[test]
    fn sections_keep_defaults_errors_and_locations() {
        let c =
            Config::parse_file("[iptv]\nlinger_ms = 7\n[iptv.rtsp]\nmax_sessions = 3\n").unwrap();
        assert_eq!(c.iptv.linger_ms, 7);
        assert_eq!(c.iptv.rtsp.max_sessions, 3);
        let defaults = Config::default();
        assert_eq!(c.iptv.buffer_bytes, defaults.iptv.buffer_bytes);
        assert_eq!(c.iptv.rtsp.seek_params, defaults.iptv.rtsp.seek_params);
        assert_eq!(c.server.listen, defaults.server.listen);

        let err = |text: &str| Config::parse_file(text).unwrap_err().to_string();
        let nested = err("[iptv.rtsp]\nenabled = true\nbogus = 1\n");
        assert!(nested.contains("line 3, column 1"), "{nested}");
        assert!(
            nested.contains("unknown field `bogus`, expected one of `enabled`"),
            "{nested}"
        );
        let typed = err("[iptv]\nlinger_ms = \"x\"\n");
        assert!(typed.contains("line 2, column 13"), "{typed}");
        // The value itself is never quoted (it may be a secret); the key is named.
        assert!(
            typed.contains(
                "key `iptv.linger_ms`: invalid type: string (value not shown), expected u64"
            ),
            "{typed}"
        );
        assert!(!typed.contains("\"x\""), "{typed}");
        let whole = err("iptv = 3\n");
        assert!(whole.contains("expected struct IptvConfig"), "{whole}");
        let variant = err("[iptv]\nslow_subscriber = \"nope\"\n");
        assert!(variant.contains("unknown variant `nope`"), "{variant}");
    }

    #[test]
    fn busy_poll_is_bounded() {
        let load = |v: &str| {
            Config::load(
                None,
                env(&[("SLUICE_SERVER_BUSY_POLL_US", v)]),
                &Overrides::default(),
            )
        };
        for ok in ["0", "200", "1000000"] {
            load(ok).unwrap();
        }
        for bad in ["1000001", "9223372036854775807"] {
            let err = format!("{:#}", load(bad).unwrap_err());
            assert!(
                err.contains("server.busy_poll_us must be at most 1000000"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_http2_window_is_bounded() {
        let load = |v: &str| {
            Config::load(
                None,
                env(&[("SLUICE_SERVER_H2_RECV_WINDOW_BYTES", v)]),
                &Overrides::default(),
            )
        };
        for ok in ["65535", "1048576", "67108864"] {
            assert_eq!(
                load(ok).unwrap().server.h2_recv_window_bytes.to_string(),
                ok
            );
        }
        for bad in ["65534", "0", "67108865"] {
            let err = format!("{:#}", load(bad).unwrap_err());
            assert!(
                err.contains("server.h2_recv_window_bytes must be from 65535 to 67108864"),
                "{err}"
            );
        }
    }

    #[test]
    fn bad_address_is_reported() {
        let err = Config::parse_file("[server]\nlisten = [\"127.0.0.1\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid socket address"), "{err}");
    }

    #[test]
    fn public_listener_needs_password() {
        let flags = Overrides {
            listen: vec!["0.0.0.0:8888".parse().unwrap()],
            ..Overrides::default()
        };
        let err = Config::load(None, env(&[]), &flags)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no password is set"), "{err}");
        assert!(err.contains("--api-password"), "{err}");
        let flags = Overrides {
            api_password: Some("pw".into()),
            ..flags
        };
        Config::load(None, env(&[]), &flags).unwrap();
    }

    #[test]
    fn env_overrides_every_kind() {
        let c = Config::load(
            None,
            env(&[
                ("SLUICE_SERVER_LISTEN", "127.0.0.1:1,127.0.0.2:2"),
                ("SLUICE_UPSTREAM_ALLOW_PRIVATE", "true"),
                ("SLUICE_UPSTREAM_CONNECT_TIMEOUT_SECS", "3"),
                ("SLUICE_AUTH_API_PASSWORD", "12345"),
                ("OTHER", "x"),
            ]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.server.listen.len(), 2);
        assert!(c.upstream.allow_private);
        assert_eq!(c.upstream.connect_timeout_secs, 3);
        // A numeric-looking password stays a string.
        assert_eq!(c.auth.api_password, "12345");
        let err = Config::load(
            None,
            env(&[("SLUICE_SERVER_LISTN", "x")]),
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("listn"), "{err:#}");
    }

    /// A variable for a list-of-tables section (`[[tcp]]`, `[[routes]]`) has no table to go in:
    /// refused by its section, as an unknown section is, rather than accepted and never applied.
    #[cfg(all(feature = "tcp", feature = "reverse"))]
    #[test]
    fn env_for_a_list_of_tables_is_refused_by_section() {
        for (name, section) in [
            ("SLUICE_TCP_MAX_CONNECTIONS", "tcp"),
            ("SLUICE_ROUTES_UPSTREAM", "routes"),
        ] {
            let err =
                Config::load(None, env(&[(name, "1234567")]), &Overrides::default()).unwrap_err();
            let err = format!("{err:#}");
            assert!(
                err.contains(name) && err.contains(&format!("[[{section}]]")),
                "{err}"
            );
            assert!(!err.contains("1234567"), "the value is never quoted: {err}");
        }
    }

    /// The variables Kubernetes puts in a pod for a Service named `sluice` (the Helm chart's
    /// default name) or `sluice-tcp` are no config: before, the first refused the start (no
    /// section `service`), the second named `[[tcp]]`. A key of that shape is still a key.
    #[test]
    fn a_services_link_variables_are_passed_over() {
        let links = [
            ("SLUICE_SERVICE_HOST", "10.96.0.12"),
            ("SLUICE_SERVICE_PORT", "8080"),
            ("SLUICE_SERVICE_PORT_HTTP", "8080"),
            ("SLUICE_PORT", "tcp://10.96.0.12:8080"),
            ("SLUICE_PORT_8080_TCP", "tcp://10.96.0.12:8080"),
            ("SLUICE_PORT_8080_TCP_PROTO", "tcp"),
            ("SLUICE_PORT_8080_TCP_PORT", "8080"),
            ("SLUICE_PORT_8080_TCP_ADDR", "10.96.0.12"),
            ("SLUICE_TCP_SERVICE_HOST", "10.96.0.13"),
            ("SLUICE_TCP_PORT", "tcp://10.96.0.13:5432"),
            ("SLUICE_TCP_PORT_5432_TCP_ADDR", "10.96.0.13"),
            ("SLUICE_SERVER_SHUTDOWN_GRACE_SECS", "7"),
        ];
        let config = Config::load(None, env(&links), &Overrides::default()).unwrap();
        assert_eq!(config.server.shutdown_grace_secs, 7);
        for (name, value) in links {
            assert_eq!(
                service_link(name, value),
                name != "SLUICE_SERVER_SHUTDOWN_GRACE_SECS",
                "{name}"
            );
        }
        // Shapes close to a link's that are not one.
        for (name, value) in [
            ("SLUICE_SERVER_PORT", "8080"),
            ("SLUICE_PORT_X_TCP", "tcp"),
            ("SLUICE_UPSTREAM_PORT_8080", "1"),
        ] {
            assert!(!service_link(name, value), "{name}");
        }
    }

    /// A string given through the environment is taken exactly as written, never read as TOML:
    /// a quoted prefix followed by a comment must not shorten a password to the prefix.
    #[test]
    fn env_strings_are_taken_as_written() {
        let load =
            |vars: &[(&str, &str)]| Config::load(None, env(vars), &Overrides::default()).unwrap();
        for pw in [
            "'Ab3'#x9Zq7",
            "\"Ab3\" # rest",
            "\"secret\"",
            "'quoted'",
            "[1, 2]",
            "{ a = 1 }",
            "true",
            "3.5",
        ] {
            let c = load(&[("SLUICE_AUTH_API_PASSWORD", pw)]);
            assert_eq!(c.auth.api_password, pw);
        }
        // The MediaFlow name goes the same way (`dropin` sets the SLUICE_ variable from it).
        let set = crate::dropin::translate(&env(&[("API_PASSWORD", "'Ab3'#x9Zq7")])).set;
        let vars: Vec<(&str, &str)> = set.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(load(&vars).auth.api_password, "'Ab3'#x9Zq7");
        // A key with no default keeps its quotes too; numbers, booleans and lists still parse.
        let c = load(&[
            ("SLUICE_SERVER_PID_FILE", "\"/run/s.pid\""),
            ("SLUICE_SERVER_THREADS", "2"),
            ("SLUICE_UPSTREAM_ALLOW_PRIVATE", "true"),
            ("SLUICE_SERVER_LISTEN", "[\"127.0.0.1:1\"]"),
        ]);
        assert_eq!(
            c.server.pid_file.as_deref(),
            Some(std::path::Path::new("\"/run/s.pid\""))
        );
        assert_eq!(c.server.threads, 2);
        assert!(c.upstream.allow_private);
        assert_eq!(c.server.listen, vec!["127.0.0.1:1".parse().unwrap()]);
    }

    /// A thread count past what the system can start is a config error, not a panic when the
    /// runtime is built.
    #[test]
    fn threads_have_a_ceiling() {
        let load = |v: &str| {
            Config::load(
                None,
                env(&[("SLUICE_SERVER_THREADS", v)]),
                &Overrides::default(),
            )
        };
        for ok in ["0", "1", "1024"] {
            assert_eq!(load(ok).unwrap().server.threads.to_string(), ok);
        }
        for bad in ["1025", "1000000"] {
            let err = format!("{:#}", load(bad).unwrap_err());
            assert!(err.contains("server.threads must be at most 1024"), "{err}");
        }
    }

    /// A duration or connection count so large that using it panics (a deadline past what the
    /// clock can add, a semaphore past its most permits) is refused by its path, in any section.
    #[test]
    fn durations_and_connection_counts_have_a_ceiling() {
        let mut cases = vec![
            (
                "[upstream]\nconnect_timeout_secs = 9223372036854775807\n",
                "upstream.connect_timeout_secs",
            ),
            (
                "[server]\nmax_connections_per_ip = 3000000000000000000\n",
                "server.max_connections_per_ip",
            ),
        ];
        #[cfg(feature = "tcp")]
        cases.push((
            "[[upstreams]]\nname = \"db\"\nservers = [\"127.0.0.1:9\"]\n[[tcp]]\n\
             listen = \"127.0.0.1:0\"\nupstream = \"db\"\ntotal_timeout_secs = 9223372036854775807\n",
            "tcp[0].total_timeout_secs",
        ));
        #[cfg(feature = "iptv")]
        cases.push((
            "[iptv]\nlinger_ms = 9223372036854775807\n",
            "iptv.linger_ms",
        ));
        cases.push((
            "[upstream]\nmax_setups_per_host = 9000000000000000000\n",
            "upstream.max_setups_per_host",
        ));
        #[cfg(feature = "cache")]
        cases.push((
            "[cache]\ndisk_queue = 9000000000000000000\n",
            "cache.disk_queue",
        ));
        for (text, path) in cases {
            let err = Config::parse_file(text)
                .and_then(|c| c.validate().map(|()| c))
                .map(|_| ())
                .unwrap_err();
            let err = format!("{err:#}");
            assert!(
                err.contains(path) && err.contains("too large"),
                "{path}: {err}"
            );
        }
        let ten_years =
            Config::parse_file("[upstream]\nconnect_timeout_secs = 315360000\n").unwrap();
        ten_years.validate().unwrap();
    }

    /// A count that sizes a semaphore is refused at load past what a semaphore holds on a 32-bit
    /// target (536,870,911 permits), on every target: 600,000,000 passed the old 2^32 ceiling and
    /// the first fetch panicked in `Semaphore::new` on the router.
    #[test]
    fn counts_stay_under_what_a_semaphore_holds_on_every_target() {
        let mut cases = vec![(
            "[upstream]\nmax_setups_per_host = 600000000\n",
            "upstream.max_setups_per_host",
        )];
        #[cfg(feature = "cache")]
        cases.extend([
            (
                "[cache]\nmax_inflight_slices = 600000000\n",
                "cache.max_inflight_slices",
            ),
            ("[cache]\ndisk_queue = 4294967295\n", "cache.disk_queue"),
        ]);
        #[cfg(feature = "media")]
        cases.push((
            "[media.extractors]\nmax_running = 536870912\n",
            "media.extractors.max_running",
        ));
        for (text, path) in cases {
            let err = Config::parse_file(text)
                .and_then(|c| c.validate().map(|()| c))
                .map(|_| ())
                .unwrap_err();
            let err = format!("{err:#}");
            assert!(
                err.contains(path) && err.contains("too large"),
                "{path}: {err}"
            );
        }
        const { assert!(MAX_COUNT <= 536_870_911) };
        let most = format!("[upstream]\nmax_setups_per_host = {MAX_COUNT}\n");
        Config::parse_file(&most).unwrap().validate().unwrap();
    }

    #[test]
    fn flags_beat_env() {
        let flags = Overrides {
            api_password: Some("flag".into()),
            ..Overrides::default()
        };
        let c = Config::load(None, env(&[("SLUICE_AUTH_API_PASSWORD", "env")]), &flags).unwrap();
        assert_eq!(c.auth.api_password, "flag");
    }

    #[test]
    fn masked_hides_secrets() {
        let mut c = Config::default();
        c.auth.api_password = "hunter2".into();
        #[cfg(feature = "cache")]
        {
            c.cache.purge_key = "purgesecret".into();
        }
        c.upstream.routes.push(RouteConfig {
            pattern: "all".into(),
            proxy: "socks5://u:secret@127.0.0.1:1080".into(),
            verify_tls: true,
        });
        let text = c.masked();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(text.contains("********"));
    }

    #[test]
    fn example_file_parses() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sluice.example.toml");
        let mut text = std::fs::read_to_string(path).unwrap();
        if !left_out().is_empty() {
            // A smaller build parses what is left once the sections it leaves out are removed.
            let mut table: toml::Table = text.parse().unwrap();
            for (key, _) in left_out() {
                table.remove(key);
            }
            text = toml::to_string(&table).unwrap();
        }
        let c = Config::parse_file(&text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.media_caches(), cfg!(feature = "media"));
    }

    #[cfg(all(feature = "cache", feature = "media"))]
    #[test]
    fn deprecated_media_cache_bytes_maps_onto_the_cache_service() {
        let parse = |t: &str| Config::parse_file(t).unwrap();
        let plain = parse("");
        assert_eq!(plain.media_caches(), cfg!(feature = "media"));
        assert_eq!(plain.needs_cache(), cfg!(feature = "media"));
        assert_eq!(plain.cache_section().memory_bytes.0, 256 << 20);
        // 0 turned the old cache off: it turns media caching off.
        let off = parse("[media]\ncache_bytes = 0");
        assert!(!off.media_caches() && !off.needs_cache());
        let off = parse("[media]\ncache = false");
        assert!(!off.media_caches());
        // Another value is a floor for the shared memory tier, never a cut.
        let big = parse("[media]\ncache_bytes = 1073741824");
        assert_eq!(big.cache_section().memory_bytes.0, 1 << 30);
        let small = parse("[media]\ncache_bytes = 1048576\n[cache]\nmemory_bytes = \"64MiB\"");
        assert_eq!(small.cache_section().memory_bytes.0, 64 << 20);
    }

    #[test]
    fn section_of_a_left_out_front_end_names_its_feature() {
        let full = cfg!(all(
            feature = "media",
            feature = "iptv",
            feature = "reverse",
            feature = "tcp",
            feature = "acme"
        ));
        assert_eq!(left_out().is_empty(), full);
        for (key, feature) in left_out() {
            let err = Config::parse_file(&format!("[{key}]\nx = 1\n")).unwrap_err();
            let text = format!("{err:#}");
            assert!(
                text.contains(&format!("[{key}]")) && text.contains(&format!("`{feature}`")),
                "{text}"
            );
        }
    }
}
