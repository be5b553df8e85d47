//! LL-HLS delivery directives: the `_HLS_msn`, `_HLS_part` and `_HLS_skip` a player adds to a
//! playlist URL for a blocking reload or a delta update, checked and carried to the upstream URL.
//! No I/O.
//!
//! The rules are the HLS specification's (RFC 8216bis, "Delivery Directives Interface"):
//! `_HLS_msn` is a media sequence number, `_HLS_part` a part index that needs `_HLS_msn`,
//! `_HLS_skip` is `YES` or `v2`. Anything else is refused, so a request that cannot be what a
//! player sends never reaches the origin.

use url::Url;

use crate::query::Query;

/// The directive names, in the order they go on the upstream URL.
pub const DIRECTIVES: [&str; 3] = ["_HLS_msn", "_HLS_part", "_HLS_skip"];

/// What a playlist request asks of the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Directives {
    pub msn: Option<u64>,
    pub part: Option<u64>,
    pub skip: Option<Skip>,
}

/// `_HLS_skip`: skip old segments (`YES`), and old date ranges too (`v2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Skip {
    Yes,
    V2,
}

/// Why the directives were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectiveError {
    #[error("{0} must be a decimal number")]
    NotANumber(&'static str),
    #[error("_HLS_part needs _HLS_msn")]
    PartWithoutMsn,
    #[error("_HLS_skip must be YES or v2")]
    BadSkip,
    #[error("{0} is given twice")]
    Repeated(&'static str),
}

impl Directives {
    /// Whether the origin holds the answer until the named segment or part exists.
    pub fn blocks(&self) -> bool {
        self.msn.is_some()
    }
}

/// The directives of a request; `None` when it has none.
pub fn parse_directives(query: &Query) -> Result<Option<Directives>, DirectiveError> {
    let one = |name: &'static str| -> Result<Option<&str>, DirectiveError> {
        let mut values = query.pairs().iter().filter(|(k, _)| k == name);
        let first = values.next().map(|(_, v)| v.as_str());
        match values.next() {
            Some(_) => Err(DirectiveError::Repeated(name)),
            None => Ok(first),
        }
    };
    let number = |name: &'static str| -> Result<Option<u64>, DirectiveError> {
        one(name)?
            .map(|v| {
                // u64::from_str takes a leading '+'; the specification's decimal-integer does not.
                if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(DirectiveError::NotANumber(name));
                }
                v.parse().map_err(|_| DirectiveError::NotANumber(name))
            })
            .transpose()
    };
    let msn = number("_HLS_msn")?;
    let part = number("_HLS_part")?;
    let skip = match one("_HLS_skip")? {
        None => None,
        Some("YES") => Some(Skip::Yes),
        Some("v2") => Some(Skip::V2),
        Some(_) => return Err(DirectiveError::BadSkip),
    };
    if part.is_some() && msn.is_none() {
        return Err(DirectiveError::PartWithoutMsn);
    }
    Ok((msn.is_some() || skip.is_some()).then_some(Directives { msn, part, skip }))
}

/// `url` with `directives` as the last query parameters, replacing any it already had.
pub fn upstream_url(url: &Url, directives: &Directives) -> Url {
    let mut out = url.clone();
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| !DIRECTIVES.contains(&k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    // Keep the origin's own query text untouched when it had no directives.
    let original = url
        .query()
        .filter(|_| kept.len() == url.query_pairs().count());
    let mut query = match original {
        Some(q) if !q.is_empty() => q.to_owned(),
        _ => {
            let mut s = url::form_urlencoded::Serializer::new(String::new());
            for (k, v) in &kept {
                s.append_pair(k, v);
            }
            s.finish()
        }
    };
    let mut push = |name: &str, value: &str| {
        if !query.is_empty() {
            query.push('&');
        }
        query.push_str(name);
        query.push('=');
        query.push_str(value);
    };
    if let Some(msn) = directives.msn {
        push("_HLS_msn", &msn.to_string());
    }
    if let Some(part) = directives.part {
        push("_HLS_part", &part.to_string());
    }
    match directives.skip {
        Some(Skip::Yes) => push("_HLS_skip", "YES"),
        Some(Skip::V2) => push("_HLS_skip", "v2"),
        None => {}
    }
    out.set_query(Some(&query));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(q: &str) -> Result<Option<Directives>, DirectiveError> {
        parse_directives(&Query::parse(q))
    }

    #[test]
    fn directives_are_checked() {
        assert_eq!(parse("d=x").unwrap(), None);
        let d = parse("d=x&_HLS_msn=12&_HLS_part=3&_HLS_skip=YES")
            .unwrap()
            .unwrap();
        assert_eq!(
            d,
            Directives {
                msn: Some(12),
                part: Some(3),
                skip: Some(Skip::Yes)
            }
        );
        assert!(d.blocks());
        let skip_only = parse("_HLS_skip=v2").unwrap().unwrap();
        assert!(!skip_only.blocks());
        for bad in [
            "_HLS_msn=",
            "_HLS_msn=+1",
            "_HLS_msn=-1",
            "_HLS_msn=1e3",
            "_HLS_msn=99999999999999999999999",
            "_HLS_part=1",
            "_HLS_msn=1&_HLS_part=x",
            "_HLS_skip=yes",
            "_HLS_msn=1&_HLS_msn=2",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn low_latency_playlists_get_no_default_start_offset() {
        let base = Url::parse("https://o.example/live.m3u8").unwrap();
        let opts = crate::hls::RewriteOptions {
            default_live_start_offset: Some(-18.0),
            ..Default::default()
        };
        let rewrite = |text: &str| {
            crate::hls::rewrite_playlist(text, &base, &opts, &mut |_, u: &Url| u.to_string())
                .unwrap()
        };
        let ll = "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXT-X-PART-INF:PART-TARGET=0.25\n\
                  #EXT-X-PART:DURATION=0.25,URI=\"p.m4s\"\n";
        assert!(!rewrite(ll).contains("EXT-X-START"));
        let classic = "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\ns.ts\n";
        assert!(rewrite(classic).contains("#EXT-X-START:TIME-OFFSET=-18.0,PRECISE=YES"));
    }

    #[test]
    fn upstream_url_carries_them_last() {
        let d = Directives {
            msn: Some(7),
            part: Some(0),
            skip: Some(Skip::V2),
        };
        let url = |s: &str| Url::parse(s).unwrap();
        assert_eq!(
            upstream_url(&url("https://o.example/live.m3u8"), &d).as_str(),
            "https://o.example/live.m3u8?_HLS_msn=7&_HLS_part=0&_HLS_skip=v2"
        );
        assert_eq!(
            upstream_url(&url("https://o.example/live.m3u8?tok=a%2Fb&x"), &d).as_str(),
            "https://o.example/live.m3u8?tok=a%2Fb&x&_HLS_msn=7&_HLS_part=0&_HLS_skip=v2"
        );
        let only_msn = Directives {
            msn: Some(9),
            part: None,
            skip: None,
        };
        assert_eq!(
            upstream_url(&url("https://o.example/l.m3u8?_HLS_msn=1&a=b"), &only_msn).as_str(),
            "https://o.example/l.m3u8?a=b&_HLS_msn=9"
        );
    }
}
