//! Bounds on what one rewrite may cost: the URIs counted before it, each URL's length and the
//! size of the output. No I/O.
//!
//! Every URI the rewriter touches becomes a proxy URL that repeats the upstream directory (and
//! the request's carried parameters) inside a token, so a rewrite can be far larger than its
//! input: two bytes of `a\n` become a few hundred. The caller refuses a playlist with more than
//! its limit of [`count_entries`] before rewriting; the rewriter itself stops at a URL over
//! [`MAX_URL_LEN`] and at output over [`max_output_len`].

use super::lines::{lines, LineKind};
use super::rewrite::uri_tag;
use super::HlsError;

/// Longest upstream URL (absolute, after resolving against the playlist's URL) a rewrite accepts.
/// Real segment URLs, signed CDN ones included, stay within 2 KiB; the common request-line limit
/// of servers and CDNs (nginx's `large_client_header_buffers`) is 8 KiB, so a longer child URL
/// could not be fetched anyway, and it would be repeated into every child of the playlist.
pub const MAX_URL_LEN: usize = 8 * 1024;

/// The rewritten playlist may be this many times its input...
pub const OUTPUT_GROWTH: usize = 4;

/// ...plus this much. Each child URL carries the absolute upstream URL and the request's carried
/// parameters (headers), sealed, which the input does not: a 24-hour event playlist of 2-second
/// segments (43,200 entries) with 1 KB child URLs is some 44 MB. The allowance covers that with
/// room; the growth factor covers playlists of long absolute URLs.
pub const OUTPUT_ALLOWANCE: usize = 64 * 1024 * 1024;

/// The most bytes the rewrite of a playlist of `input_len` bytes may produce.
pub fn max_output_len(input_len: usize) -> usize {
    input_len
        .saturating_mul(OUTPUT_GROWTH)
        .saturating_add(OUTPUT_ALLOWANCE)
}

/// The URIs a rewrite would route (its entries): URI lines (segments, variants, bare lines
/// without `#EXTINF`) and the `URI` attributes of `EXT-X-PART`, `EXT-X-MAP`, `EXT-X-KEY`,
/// `EXT-X-SESSION-KEY`, `EXT-X-MEDIA`, `EXT-X-I-FRAME-STREAM-INF`, `EXT-X-PRELOAD-HINT`,
/// `EXT-X-RENDITION-REPORT` and `EXT-X-SESSION-DATA`. Counted without parsing attributes: every
/// such tag counts, with a URI or without (`URI ="x"`, which the attribute parser reads as a URI,
/// must not slip past a text match), so a caller can refuse an oversized playlist before any
/// rewriting work.
pub fn count_entries(text: &str) -> usize {
    lines(text)
        .filter(|line| match line.kind() {
            LineKind::Uri(_) => true,
            LineKind::Tag { name, value } => uri_tag(name, value),
            LineKind::Other => false,
        })
        .count()
}

/// `Err` when the upstream URL on `line` is over [`MAX_URL_LEN`].
pub(crate) fn check_url(url: &str, line: usize) -> Result<(), HlsError> {
    if url.len() > MAX_URL_LEN {
        return Err(HlsError::UrlTooLong {
            line,
            max: MAX_URL_LEN,
        });
    }
    Ok(())
}

/// `Err` when `adding` more bytes to `written` would pass `max`.
pub(crate) fn check_output(written: usize, adding: usize, max: usize) -> Result<(), HlsError> {
    if written.saturating_add(adding) > max {
        return Err(HlsError::OutputTooLarge { max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_uri_the_rewriter_routes() {
        let text = "#EXTM3U\n#EXT-X-TARGETDURATION:4\n#EXTINF:4,\na.ts\r\n#EXTINF:4,\nb.ts\n\
                    #EXT-X-ENDLIST\n";
        assert_eq!(count_entries(text), 2);
        assert_eq!(count_entries("#EXTM3U\n"), 0);
        // Bare URI lines count without an #EXTINF; blank lines and comments do not.
        assert_eq!(count_entries("#EXTM3U\na\n  \n# note\nb\r\na"), 3);
        let ll = "#EXTM3U\n#EXT-X-PART-INF:PART-TARGET=1\n#EXT-X-MAP:URI=\"i.mp4\"\n\
                  #EXT-X-KEY:METHOD=AES-128,URI=\"k\"\n#EXT-X-KEY:METHOD=NONE\n\
                  #EXT-X-PART:DURATION=1,URI=\"p1.m4s\"\n#EXTINF:4,\ns.m4s\n\
                  #EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"p2.m4s\"\n\
                  #EXT-X-RENDITION-REPORT:URI=\"../b/l.m3u8\",LAST-MSN=1\n\
                  #EXT-X-SKIP:SKIPPED-SEGMENTS=3\n#X-VENDOR:URI=\"x\"\n";
        // Every URI-capable tag counts, `URI ` spelt with a space too (the key without a URI).
        assert_eq!(count_entries(ll), 7);
        assert_eq!(
            count_entries("#EXTM3U\n#EXT-X-PART:DURATION=1,URI =\"a\"\n"),
            1
        );
        let master = "#EXTM3U\n#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"a\",NAME=\"e\",URI=\"a.m3u8\"\n\
                      #EXT-X-MEDIA:TYPE=CLOSED-CAPTIONS,GROUP-ID=\"c\",NAME=\"c\",INSTREAM-ID=\"CC1\"\n\
                      #EXT-X-STREAM-INF:BANDWIDTH=1\nv.m3u8\n\
                      #EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=1,URI=\"i.m3u8\"\n\
                      #EXT-X-SESSION-KEY:METHOD=AES-128,URI=\"k\"\n\
                      #EXT-X-SESSION-DATA:DATA-ID=\"x\",URI=\"d.json\"\n";
        assert_eq!(count_entries(master), 6);
    }

    #[test]
    fn a_date_range_counts_only_with_an_asset() {
        // A live playlist with an SCTE-35 date range per segment: the segments alone count.
        let mut live = String::from("#EXTM3U\n#EXT-X-TARGETDURATION:4\n");
        for i in 0..100 {
            live.push_str(&format!(
                "#EXT-X-DATERANGE:ID=\"s{i}\",START-DATE=\"2026-01-01T00:00:00Z\",\
                 SCTE35-OUT=0xFC30\n#EXTINF:4,\ns{i}.ts\n"
            ));
        }
        assert_eq!(count_entries(&live), 100);
        // An interstitial's asset (URI or list, its name spelt with a space too) counts.
        let ads = "#EXTM3U\n#EXT-X-DATERANGE:ID=\"a\",X-ASSET-URI=\"a.m3u8\"\n\
                   #EXT-X-DATERANGE:ID=\"b\",X-ASSET-LIST=\"l.json\"\n\
                   #EXT-X-DATERANGE:ID=\"c\",X-ASSET-URI =\"c.m3u8\"\n\
                   #EXT-X-DATERANGE:ID=\"d\",SCTE35-IN=0xFC30\n";
        assert_eq!(count_entries(ads), 3);
    }

    #[test]
    fn rewrites_stop_at_a_long_url_and_at_big_output() {
        use crate::hls::{rewrite_playlist, RewriteOptions};
        use url::Url;
        let opts = RewriteOptions::default();
        let long = format!("http://o.example/{}/p.m3u8", "d".repeat(MAX_URL_LEN));
        let mut minted = 0;
        let got = rewrite_playlist(
            "#EXTM3U\n#EXTINF:1,\na.ts\n",
            &Url::parse(&long).unwrap(),
            &opts,
            &mut |_, u| {
                minted += 1;
                u.to_string()
            },
        );
        let max = MAX_URL_LEN;
        assert_eq!(got, Err(HlsError::UrlTooLong { line: 3, max }));
        assert_eq!(minted, 0, "refused before a proxy URL is made");
        // Bare lines whose children are 2000 bytes each: stopped once past the bound.
        let base = Url::parse("http://o.example/p.m3u8").unwrap();
        let text = format!("#EXTM3U\n{}", "a\n".repeat(40_000));
        let mut minted = 0;
        let got = rewrite_playlist(&text, &base, &opts, &mut |_, _| {
            minted += 1;
            "x".repeat(2000)
        });
        let max = max_output_len(text.len());
        assert_eq!(got, Err(HlsError::OutputTooLarge { max }));
        assert_eq!(minted, max / 2001 + 1);
        // The same playlist with 100-byte children fits.
        let out = rewrite_playlist(&text, &base, &opts, &mut |_, _| "x".repeat(100)).unwrap();
        assert_eq!(out.len(), 8 + 40_000 * 101);
    }

    #[test]
    fn output_grows_with_the_input() {
        assert_eq!(max_output_len(0), OUTPUT_ALLOWANCE);
        assert_eq!(max_output_len(1000), 4000 + OUTPUT_ALLOWANCE);
        assert_eq!(max_output_len(usize::MAX), usize::MAX);
        assert!(check_output(10, 5, 15).is_ok());
        assert_eq!(
            check_output(10, 6, 15),
            Err(HlsError::OutputTooLarge { max: 15 })
        );
        assert!(check_url(&"a".repeat(MAX_URL_LEN), 1).is_ok());
        assert_eq!(
            check_url(&"a".repeat(MAX_URL_LEN + 1), 7),
            Err(HlsError::UrlTooLong {
                line: 7,
                max: MAX_URL_LEN
            })
        );
    }
}
