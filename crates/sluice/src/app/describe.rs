//! What `sluice check-config` prints after the settings, beside the route table: how each route
//! caches, the cache service's tiers and the `[[tcp]]` listeners.

use crate::config::Config;

/// `1 MiB`, `256 MiB`, `10 GiB`, `1536 B`.
#[cfg(feature = "cache")]
pub(super) fn size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} B")
}

/// The note after a route's target when it caches: its effective freshness settings (the route's
/// own keys over `[cache]`'s). The table is described from a copy built with caching off, so the
/// route is found again in `config` by where it listens and what it matches.
#[cfg(feature = "reverse")]
pub fn route_cache(config: &Config, shown: &crate::reverse::RouteConfig) -> String {
    let Some(route) = config.routes.iter().find(|r| {
        r.cache && r.host == shown.host && r.path == shown.path && r.listener == shown.listener
    }) else {
        return String::new();
    };
    let c = &config.cache;
    let directives = route
        .cache_request_directives
        .unwrap_or(c.request_directives);
    let mut note = format!(
        " (cache: default ttl {} s, grace {} s, client Cache-Control {}, {}",
        route.cache_default_ttl_secs.unwrap_or(c.default_ttl_secs),
        route.cache_grace_secs.unwrap_or(c.grace_secs),
        format!("{directives:?}").to_ascii_lowercase(),
        if route.cache_cookies {
            "requests with Cookie stored"
        } else {
            "requests with Cookie passed"
        },
    );
    if route.cache_peer_copy {
        note.push_str(", peer copy");
    }
    note.push(')');
    note
}

/// The cache service and the TCP listeners, each under its own heading (nothing when unused).
#[cfg_attr(
    not(any(feature = "reverse", feature = "tcp")),
    allow(unused_variables, unused_mut)
)]
pub fn others(config: &Config) -> String {
    let mut out = String::new();
    // The tiers behind the routes marked above (the media front end's use alone shows in the
    // settings' `[cache]` and `[media] cache`).
    #[cfg(feature = "reverse")]
    if config.routes.iter().any(|r| r.cache) {
        let c = config.cache_section();
        let media = if config.media_caches() {
            " and the media front end's manifests and segments"
        } else {
            ""
        };
        out.push_str(&format!(
            "\n# cache, used by routes marked (cache: ...) above{media}\n\
             memory {}, disk {}, slices of {}\n",
            size(c.memory_bytes.0),
            match &c.disk_path {
                Some(path) => format!("{} at {}", size(c.disk_bytes.0), path.display()),
                None => "off (cache.disk_path unset)".to_string(),
            },
            size(c.slice_bytes.0),
        ));
    }
    #[cfg(feature = "tcp")]
    if !config.tcp.is_empty() {
        out.push_str("\n# tcp listeners\n");
        for t in &config.tcp {
            out.push_str(&tcp_line(t));
        }
    }
    out
}

/// One `[[tcp]]` listener: where it listens and where its connections go.
#[cfg(feature = "tcp")]
fn tcp_line(t: &crate::tcp::TcpConfig) -> String {
    format!("{:<35} -> {}\n", t.listen.to_string(), tcp_target(t))
}

/// Where a `[[tcp]]` listener's connections go, and how.
#[cfg(feature = "tcp")]
pub(super) fn tcp_target(t: &crate::tcp::TcpConfig) -> String {
    let mut targets: Vec<String> = t
        .sni
        .iter()
        .map(|r| format!("sni {} -> {:?}", r.server_name, r.upstream))
        .collect();
    match &t.upstream {
        Some(u) if t.sni.is_empty() => targets.push(format!("upstream {u:?}")),
        Some(u) => targets.push(format!("other names -> {u:?}")),
        None => {}
    }
    let mut notes = Vec::new();
    if let Some(name) = &t.name {
        notes.push(format!("name {name:?}"));
    }
    if t.tls_cert.is_some() {
        notes.push("TLS terminated".to_string());
    }
    if t.accept_proxy {
        notes.push("accepts PROXY".to_string());
    }
    if let Some(v) = t.send_proxy {
        notes.push(format!(
            "sends PROXY {}",
            format!("{v:?}").to_ascii_lowercase()
        ));
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    format!("{}{notes}", targets.join(", "))
}
