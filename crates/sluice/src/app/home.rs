//! The home page's account of the jobs this sluice does besides the media proxy, from the config:
//! reverse routes, the slice cache, TCP listeners, the IPTV gateway (the media front end renders
//! the page and knows none of them).

use crate::config::Config;
use crate::media::pages::{Home, Job};

/// What `config` sets up, job by job, then the jobs it leaves out and the keys that add them.
pub fn describe(config: &Config) -> Home {
    let mut jobs = Vec::new();
    #[cfg_attr(
        not(any(feature = "reverse", feature = "tcp", feature = "iptv")),
        allow(unused_mut)
    )]
    let mut missing: Vec<&str> = Vec::new();
    #[cfg(feature = "reverse")]
    match reverse(config) {
        Some(job) => jobs.push(job),
        None => missing.push("reverse proxy ([[upstreams]] and [[routes]])"),
    }
    #[cfg(feature = "cache")]
    if let Some(job) = cache(config) {
        jobs.push(job);
    }
    #[cfg(feature = "tcp")]
    match tcp(config) {
        Some(job) => jobs.push(job),
        None => missing.push("TCP proxy ([[upstreams]] and [[tcp]])"),
    }
    #[cfg(feature = "iptv")]
    match iptv(config) {
        Some(job) => jobs.push(job),
        None => missing.push("IPTV gateway (endpoints.iptv)"),
    }
    if !missing.is_empty() {
        jobs.push(Job {
            title: "Not set up here".to_string(),
            summary: format!(
                "{}. sluice.example.toml documents every key.",
                missing.join("; ")
            ),
            ..Job::default()
        });
    }
    Home { jobs }
}

#[cfg(feature = "reverse")]
fn reverse(config: &Config) -> Option<Job> {
    if config.routes.is_empty() {
        return None;
    }
    let rows = config
        .routes
        .iter()
        .map(|r| {
            let servers = config
                .upstreams
                .iter()
                .find(|g| g.name == r.upstream)
                .map(|g| {
                    g.servers
                        .iter()
                        .map(|s| s.addr())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            vec![
                r.host.clone().unwrap_or_else(|| "any".to_string()),
                r.path.clone(),
                format!("{} ({servers})", r.upstream),
                if r.cache { "yes" } else { "no" }.to_string(),
            ]
        })
        .collect();
    Some(Job {
        title: "Reverse proxy".to_string(),
        summary: format!(
            "{} route{} to upstream groups; the longest matching path wins (sluice check-config \
             prints the whole table, built-in endpoints included).",
            config.routes.len(),
            if config.routes.len() == 1 { "" } else { "s" },
        ),
        columns: vec!["host", "path", "upstream group (servers)", "cached"],
        rows,
    })
}

#[cfg(feature = "cache")]
fn cache(config: &Config) -> Option<Job> {
    if !config.needs_cache() {
        return None;
    }
    let c = config.cache_section();
    let mut users = Vec::new();
    #[cfg(feature = "reverse")]
    {
        let n = config.routes.iter().filter(|r| r.cache).count();
        if n > 0 {
            users.push(format!("{n} route{}", if n == 1 { "" } else { "s" }));
        }
    }
    if config.media_caches() {
        users.push("the media proxy's manifests and segments".to_string());
    }
    Some(Job {
        title: "Slice cache".to_string(),
        summary: format!(
            "Used by {}. Memory {}, disk {}, slices of {}.",
            users.join(" and "),
            super::describe::size(c.memory_bytes.0),
            match c.disk_path {
                Some(_) => super::describe::size(c.disk_bytes.0),
                None => "off".to_string(),
            },
            super::describe::size(c.slice_bytes.0),
        ),
        ..Job::default()
    })
}

#[cfg(feature = "tcp")]
fn tcp(config: &Config) -> Option<Job> {
    if config.tcp.is_empty() {
        return None;
    }
    Some(Job {
        title: "TCP proxy".to_string(),
        summary: "Every connection to one of these listeners is relayed to a server of its group."
            .to_string(),
        columns: vec!["listens on", "goes to"],
        rows: config
            .tcp
            .iter()
            .map(|t| vec![t.listen.to_string(), super::describe::tcp_target(t)])
            .collect(),
    })
}

#[cfg(feature = "iptv")]
fn iptv(config: &Config) -> Option<Job> {
    if !config.endpoints.iptv {
        return None;
    }
    let i = &config.iptv;
    let interface = match &i.interface {
        Some(name) => format!("Multicast joins use interface {name}."),
        None => "Multicast joins use the system's default interface (set iptv.interface or \
                 --multicast-interface)."
            .to_string(),
    };
    let playlist = if i.playlist.is_some() {
        "The configured channel list is at /playlist.m3u."
    } else {
        "No channel list is configured (iptv.playlist)."
    };
    let rtsp = if i.rtsp.enabled {
        " and /rtsp/<host>:<port>/<path>"
    } else {
        ""
    };
    let hls = if i.hls.enabled {
        " Every channel also plays as HLS at /hls/<channel path>/index.m3u8, and /player plays \
         them in a browser."
    } else {
        ""
    };
    Some(Job {
        title: "IPTV gateway".to_string(),
        summary: format!(
            "Channels play at /rtp/<group>:<port>, /udp/<group>:<port>{rtsp}.{hls} {interface} \
             {playlist} /status shows channels, viewers and loss live."
        ),
        ..Job::default()
    })
}
