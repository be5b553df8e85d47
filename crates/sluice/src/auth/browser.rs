//! What a web page in the user's browser may do with sluice: which `Host` a password-free server
//! answers (no DNS rebinding), which paths are the operator's pages (password, with HTTP Basic
//! for a browser), and which answers other origins may read (CORS, for players only).

/// Whether `host` (a `Host` value or URI authority, port optional) names this machine by a
/// loopback address or a `localhost` name: what a password-free server answers to. A page on
/// another site (or a rebound DNS name) reaches it only under its own name.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim();
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((inner, after)) if after.is_empty() || port_ok(after) => inner,
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if port_ok(&format!(":{port}")) => name,
            Some(_) => return false,
            None => host,
        },
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    match name.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(v4)) => v4.is_loopback(),
        Ok(std::net::IpAddr::V6(v6)) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
}

fn port_ok(after: &str) -> bool {
    after
        .strip_prefix(':')
        .is_some_and(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The operator's pages: the home page, status, player, playlist builder and URL generator (and
/// their assets). With a password they need it, from every client.
pub fn is_page(path: &str) -> bool {
    let under = |prefix: &str| {
        path == prefix
            || path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/') || rest.starts_with('.'))
    };
    path == "/"
        || under("/status")
        || under("/player")
        || under("/pages")
        || matches!(
            path,
            "/playlist/builder"
                | "/playlist_builder.html"
                | "/url-generator"
                | "/url_generator.html"
        )
}

/// The answers a browser player on another origin fetches (manifests, segments, streams,
/// channels): the only ones that carry CORS, and only when a password guards them.
pub fn is_player_path(path: &str) -> bool {
    ["/proxy/", "/rtp/", "/udp/", "/rtsp/", "/hls/"]
        .iter()
        .any(|p| path.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for ok in [
            "127.0.0.1",
            "127.0.0.1:8888",
            "127.9.9.9:1",
            "localhost",
            "LOCALHOST:80",
            "localhost.",
            "a.localhost:8080",
            "[::1]",
            "[::1]:8888",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8888",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "10.0.0.1",
            "[::2]",
            "[::1]x",
            "127.0.0.1:",
            "127.0.0.1:80:80",
            "",
            "0.0.0.0",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn pages_and_player_paths() {
        for p in [
            "/",
            "/status",
            "/status.json",
            "/status/events",
            "/player",
            "/player/x",
        ] {
            assert!(is_page(p), "{p}");
        }
        for p in ["/playlist/builder", "/url-generator", "/pages/pages.css"] {
            assert!(is_page(p), "{p}");
        }
        for p in [
            "/statusx",
            "/proxy/stream",
            "/playlist.m3u",
            "/health",
            "/players",
        ] {
            assert!(!is_page(p), "{p}");
        }
        assert!(is_player_path("/proxy/hls/manifest.m3u8"));
        assert!(is_player_path("/udp/239.1.1.1:1234"));
        assert!(!is_player_path("/status.json"));
        assert!(!is_player_path("/playlist.m3u"));
        assert!(!is_player_path("/metrics"));
    }
}
