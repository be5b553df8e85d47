//! `/rtsp/host[:port]/path?query` (rtp2httpd's form) turned into what the RTSP client needs:
//! the upstream URL, credentials, transport, and the `Range` of the PLAY request, with the
//! catch-up parameters (`playseek`, `tvdr`, `r2h-seek-*`, `r2h-start`) taken out of the
//! query and everything else passed to the server untouched.

use sluice_media::rtsp::catchup;

use super::{RtspConfig, SeekMode, TransportMode};

/// Query parameters that belong to this gateway (or its auth) and never reach the server.
const OWN_PARAMS: [&str; 7] = [
    "r2h-seek-name",
    "r2h-seek-offset",
    "r2h-seek-mode",
    "r2h-start",
    "r2h-rtsp-transport",
    "r2h-token",
    "api_password",
];

/// A parsed `/rtsp/` request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// `rtsp://host:port/path?query`, without credentials.
    pub url: String,
    pub host: String,
    pub port: u16,
    /// From `user:password@` in the path, percent-decoded.
    pub credentials: Option<(String, String)>,
    pub transport: TransportMode,
    /// `Range` header of the PLAY request.
    pub range: String,
    /// A catch-up or start-offset request: its own session, never shared.
    pub seek: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("path must be /rtsp/host[:port]/path")]
    Path,
    #[error("the user name or password in the path holds a control character")]
    Credentials,
    #[error("{0:?} is not a valid RTSP server address")]
    Host(String),
    #[error("{0:?} is not a port number (1-65535)")]
    Port(String),
    #[error("r2h-seek-offset={0:?} must be a whole number of seconds")]
    Offset(String),
    #[error("r2h-seek-mode={0:?} must be range or passthrough")]
    SeekMode(String),
    #[error("r2h-start={0:?} must be seconds (a decimal number)")]
    Start(String),
    #[error("r2h-rtsp-transport={0:?} must be tcp or udp")]
    Transport(String),
    #[error("{name}: {source}")]
    Seek {
        name: String,
        source: catchup::CatchupError,
    },
}

/// Parses the request; `user_agent` supplies the client's zone (`TZ/UTC+8`) for catch-up
/// times written without one.
pub fn parse(
    path: &str,
    query: Option<&str>,
    user_agent: Option<&str>,
    config: &RtspConfig,
) -> Result<Target, RequestError> {
    let rest = path.strip_prefix("/rtsp/").ok_or(RequestError::Path)?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if hostport.is_empty() {
        return Err(RequestError::Path);
    }
    let (host, port) = host_port(hostport)?;
    let credentials = userinfo.map(|u| {
        let (user, pass) = u.split_once(':').unwrap_or((u, ""));
        (decode(user), decode(pass))
    });
    // The user name goes into the Digest `Authorization` header as written: a CR or LF
    // (`a%0D%0AX-Evil:%201`) would end that header line and start one of the client's
    // choosing in every request after the challenge. Neither name nor password (RFC 7617
    // allows no controls in either) may hold any control character.
    if credentials
        .as_ref()
        .is_some_and(|(user, pass)| user.chars().chain(pass.chars()).any(char::is_control))
    {
        return Err(RequestError::Credentials);
    }
    let pairs: Vec<(&str, &str)> = query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    // The keys written with `=` (to keep `a=` apart from `a`), gathered once: asked per param
    // of the raw query, `a&a&a...` over 64 KiB was a billion steps.
    let with_eq: std::collections::HashSet<&str> = query
        .unwrap_or("")
        .split('&')
        .filter_map(|p| p.split_once('=').map(|(k, _)| k))
        .collect();
    let get = |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    let transport = match get("r2h-rtsp-transport") {
        None => config.transport,
        Some("tcp") => TransportMode::Tcp,
        Some("udp") => TransportMode::Udp,
        Some(v) => return Err(RequestError::Transport(clip(v))),
    };
    let offset: i64 = match get("r2h-seek-offset") {
        None => 0,
        Some(v) => v
            .parse()
            .ok()
            .filter(|o: &i64| o.abs() <= 10 * 365 * 86_400)
            .ok_or_else(|| RequestError::Offset(clip(v)))?,
    };
    let mode = match get("r2h-seek-mode") {
        None => config.seek_mode,
        Some("range") => SeekMode::Range,
        Some("passthrough") => SeekMode::Passthrough,
        Some(v) => return Err(RequestError::SeekMode(clip(v))),
    };
    // The seek parameter: r2h-seek-name first, then the configured names in order.
    let custom = get("r2h-seek-name");
    let seek_name = custom
        .into_iter()
        .chain(config.seek_params.iter().map(String::as_str))
        .find(|name| get(name).is_some_and(|v| !v.is_empty()));
    let zone = user_agent.and_then(catchup::user_agent_zone).unwrap_or(0);
    let mut range = "npt=0.000-".to_string();
    let mut seek = false;
    let mut rewritten: Option<(String, String)> = None;
    if let Some(name) = seek_name {
        let raw = decode(get(name).unwrap_or(""));
        let parsed = catchup::parse_seek(&raw, zone).map_err(|source| RequestError::Seek {
            name: name.to_string(),
            source,
        })?;
        seek = true;
        match mode {
            SeekMode::Range => range = catchup::clock_range(&parsed, offset),
            SeekMode::Passthrough => {
                rewritten = Some((name.to_string(), catchup::rewrite(&parsed, offset)))
            }
        }
    }
    if let Some(start) = get("r2h-start") {
        let secs: f64 = start
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s >= 0.0)
            .ok_or_else(|| RequestError::Start(clip(start)))?;
        // A clock range from catch-up wins: it already says where to start.
        if !range.starts_with("clock=") {
            range = format!("npt={secs:.3}-");
            seek = true;
        }
    }
    let mut upstream_query: Vec<String> = Vec::new();
    for (k, v) in &pairs {
        // Compared decoded, as auth reads names: `api%5Fpassword` is the password too, and
        // would otherwise go to the server in every request line.
        if OWN_PARAMS.contains(&decode_name(k).as_ref()) {
            continue;
        }
        if Some(*k) == seek_name {
            // In range mode the time goes in the Range header, not the URL.
            if let Some((_, value)) = &rewritten {
                upstream_query.push(format!("{k}={value}"));
            }
            continue;
        }
        upstream_query.push(if v.is_empty() && !with_eq.contains(k) {
            k.to_string()
        } else {
            format!("{k}={v}")
        });
    }
    let host_in_url = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    let mut url = format!("rtsp://{host_in_url}:{port}{path}");
    if !upstream_query.is_empty() {
        url.push('?');
        url.push_str(&upstream_query.join("&"));
    }
    Ok(Target {
        url,
        host,
        port,
        credentials,
        transport,
        range,
        seek,
    })
}

fn host_port(s: &str) -> Result<(String, u16), RequestError> {
    let (host, port) = if let Some(inner) = s.strip_prefix('[') {
        let (h, after) = inner
            .split_once(']')
            .ok_or_else(|| RequestError::Host(clip(s)))?;
        h.parse::<std::net::Ipv6Addr>()
            .map_err(|_| RequestError::Host(clip(s)))?;
        (h.to_string(), after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    let valid = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'));
    if !valid {
        return Err(RequestError::Host(clip(s)));
    }
    let port = match port {
        None => 554,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(RequestError::Port(clip(p))),
        },
    };
    Ok((host.to_ascii_lowercase(), port))
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// A query name as form decoding reads it (`+` is a space, `%XX` a byte).
fn decode_name(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.contains(['%', '+']) {
        return name.into();
    }
    decode(&name.replace('+', " ")).into()
}

fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
#[path = "request/tests.rs"]
mod tests;
