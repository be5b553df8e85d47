//! The HLS query parameters: parsed into `RewriteOptions` (bad values are a 400 naming the
//! parameter), and the parameter sets child playlists and segments inherit.

use http::StatusCode;
use sluice_media::hls::{self, RewriteOptions};
use sluice_media::query::Query;
use url::Url;

use crate::error::ProxyError;
use crate::media::links;

/// What one manifest request asks for.
#[derive(Debug, Clone)]
pub struct HlsOptions {
    pub rewrite: RewriteOptions,
    /// `force_playlist_proxy`: rewrite even when neither URL nor Content-Type says playlist.
    pub force_playlist: bool,
    /// The request came to `/proxy/hls/key_proxy/...`, which forces `key_only_proxy`.
    pub key_proxy: bool,
}

/// Parses the HLS parameters of `query`. `live_start_offset` is the configured default for live
/// media playlists (0 = none).
pub fn parse(
    query: &Query,
    key_proxy: bool,
    live_start_offset: f64,
) -> Result<HlsOptions, ProxyError> {
    let key_url = match non_empty(query, "key_url") {
        Some(raw) => Some(parse_key_url(raw)?),
        None => None,
    };
    let start_offset = match non_empty(query, "start_offset") {
        Some(raw) => Some(
            raw.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| bad("start_offset", "must be a number of seconds, such as -18"))?,
        ),
        None => None,
    };
    let skip = match non_empty(query, "skip") {
        Some(raw) => hls::parse_skip(raw).map_err(|e| bad("skip", e))?,
        None => Vec::new(),
    };
    let resolution = match non_empty(query, "resolution") {
        Some(raw) => Some(hls::parse_resolution(raw).map_err(|e| bad("resolution", e))?),
        None => None,
    };
    let rewrite = RewriteOptions {
        key_url,
        key_only_proxy: key_proxy || flag(query, "key_only_proxy")?,
        no_proxy: flag(query, "no_proxy")?,
        start_offset,
        default_live_start_offset: (live_start_offset != 0.0).then_some(live_start_offset),
        skip,
        max_res: flag(query, "max_res")?,
        resolution,
    };
    Ok(HlsOptions {
        rewrite,
        force_playlist: flag(query, "force_playlist_proxy")?,
        key_proxy,
    })
}

/// The kinds of child URL a playlist links to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Child {
    Playlist,
    /// Segments, keys and init sections: all served by the segment endpoint.
    Segment,
}

/// The parent's parameters a child inherits (MediaFlow's rules): everything but `r_*` (this
/// response only) and `force_playlist_proxy`; segments also lose `start_offset` and `h_range`
/// (a playlist's byte range is not a segment's). A child playlist of the key-proxy endpoint
/// carries `key_only_proxy=true`, since it is served by the plain manifest endpoint.
pub fn carried(query: &Query, child: Child, key_proxy: bool) -> Vec<(String, String)> {
    let mut out = links::carried(query, |k| {
        k.starts_with("r_")
            || k == "force_playlist_proxy"
            || (child == Child::Segment && matches!(k, "start_offset" | "h_range"))
            || (child == Child::Playlist && key_proxy && k == "key_only_proxy")
    });
    if child == Child::Playlist && key_proxy {
        out.push(("key_only_proxy".to_string(), "true".to_string()));
    }
    out
}

fn non_empty<'q>(query: &'q Query, name: &str) -> Option<&'q str> {
    query.get(name).filter(|v| !v.trim().is_empty())
}

/// MediaFlow's boolean spellings; anything else is refused rather than read as false.
fn flag(query: &Query, name: &str) -> Result<bool, ProxyError> {
    match query.get(name).map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(false),
        Some(v) => match v.as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "" | "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(bad(name, "must be true or false")),
        },
    }
}

fn parse_key_url(raw: &str) -> Result<Url, ProxyError> {
    Url::parse(raw.trim())
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        .ok_or_else(|| {
            bad(
                "key_url",
                "must be an http(s) URL such as https://keys.example.com",
            )
        })
}

fn bad(param: &str, why: impl std::fmt::Display) -> ProxyError {
    ProxyError::downstream(
        StatusCode::BAD_REQUEST,
        "bad_request",
        format!("parameter `{param}` {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(raw: &str) -> Query {
        Query::parse(raw)
    }

    #[test]
    fn defaults_and_key_proxy() {
        let o = parse(&q("d=x"), false, -18.0).unwrap();
        assert_eq!(o.rewrite.default_live_start_offset, Some(-18.0));
        assert!(!o.rewrite.key_only_proxy && !o.force_playlist);
        let o = parse(&q("d=x&key_only_proxy=0"), true, 0.0).unwrap();
        assert!(o.rewrite.key_only_proxy);
        assert_eq!(o.rewrite.default_live_start_offset, None);
    }

    #[test]
    fn bad_values_name_the_parameter() {
        for (query, name) in [
            ("start_offset=abc", "start_offset"),
            ("start_offset=inf", "start_offset"),
            ("skip=10-5", "skip"),
            ("resolution=big", "resolution"),
            ("key_url=ftp://k", "key_url"),
            ("no_proxy=perhaps", "no_proxy"),
        ] {
            let e = parse(&q(query), false, -18.0).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{query}");
            assert!(e.message.contains(&format!("`{name}`")), "{}", e.message);
        }
    }

    #[test]
    fn children_inherit_by_kind() {
        let query = q(
            "d=u&api_password=pw&h_referer=r&h_range=bytes%3D0-1&r_x=1&rp_y=2\
             &start_offset=-6&force_playlist_proxy=1&skip=0-10&key_only_proxy=1",
        );
        let names = |v: Vec<(String, String)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(
            names(carried(&query, Child::Playlist, false)),
            [
                "h_referer",
                "h_range",
                "rp_y",
                "start_offset",
                "skip",
                "key_only_proxy"
            ]
        );
        assert_eq!(
            names(carried(&query, Child::Segment, false)),
            ["h_referer", "rp_y", "skip", "key_only_proxy"]
        );
        let forced = carried(&q("d=u&key_only_proxy=no"), Child::Playlist, true);
        assert_eq!(forced, [("key_only_proxy".into(), "true".into())]);
    }
}
