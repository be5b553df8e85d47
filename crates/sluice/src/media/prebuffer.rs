//! HLS prebuffer (MediaFlow Light's warm-up): when a media playlist is served, the segments the
//! player will ask for first are fetched into the cache at once, so its first requests are hits.
//!
//! Which ones: the first `media.prebuffer_segments` of a VOD playlist (playback starts at the
//! top), the last ones of a live playlist (players start near the live edge). They go through the
//! prefetcher, so the fetch is the cache's: one upstream request per segment however many viewers
//! ask at the same moment, with the upstream headers the segment requests will carry.

use sluice_media::dash::proxy::Part;

use super::links::Reach;
use super::Media;
use crate::request::RequestContext;

/// The segments to warm from `parts` (playback order).
pub fn pick(parts: &[Part], vod: bool, n: usize) -> Vec<Part> {
    let n = n.min(parts.len());
    match vod {
        true => parts[..n].to_vec(),
        false => parts[parts.len() - n..].to_vec(),
    }
}

/// Starts warming `parts` for the playlist request `ctx`; a paced host (`ratelimit`) is left
/// alone, as prefetch leaves it.
pub fn warm(media: &Media, ctx: &RequestContext, parts: Vec<Part>) {
    // Without prefetch, segment requests bypass the cache, so warming it would be wasted; without
    // the cache the bytes would have nowhere to go.
    if parts.is_empty() || media.settings.prefetch_segments == 0 || !media.prefetcher.caches() {
        return;
    }
    let Ok(params) = super::stream::parse_params(ctx) else {
        return;
    };
    if media.pacer.paces(ctx, &params) {
        return;
    }
    let Ok(request) = super::stream::fetch_request(&params) else {
        return;
    };
    // Credentials go only where the segment links carry them (`hls::RewriteJob`): the origin of
    // the `d` they came with, and without `h_host` to a `media.credential_hosts` host.
    let scope = super::hls::credential_scope(media, &params.destination);
    let mut by_reach: [Vec<Part>; 3] = Default::default();
    for part in parts {
        let at = match scope.reach(&part.url) {
            Reach::All => 0,
            Reach::Credentials => 1,
            Reach::Nothing => 2,
        };
        by_reach[at].push(part);
    }
    for (parts, reach) in by_reach
        .into_iter()
        .zip([Reach::All, Reach::Credentials, Reach::Nothing])
    {
        if !parts.is_empty() {
            let headers = super::links::scoped_headers(&request.headers, reach);
            media.prefetcher.warm(parts, &headers);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vod_from_the_top_live_at_the_edge() {
        let parts: Vec<Part> = (0..5)
            .map(|i| Part {
                url: url::Url::parse(&format!("http://o/{i}.ts")).unwrap(),
                range: None,
            })
            .collect();
        let names = |v: Vec<Part>| {
            v.iter()
                .map(|p| p.url.path().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(pick(&parts, true, 2)), ["/0.ts", "/1.ts"]);
        assert_eq!(names(pick(&parts, false, 2)), ["/3.ts", "/4.ts"]);
        assert_eq!(pick(&parts, true, 9).len(), 5);
        assert!(pick(&parts, false, 0).is_empty());
    }
}
