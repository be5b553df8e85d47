//! Unit and property tests of the M3U merger.

use super::*;
use crate::query::Query;
use proptest::prelude::*;

/// Plain query links, as sluice writes them without a password.
fn plain(t: &ProxyTarget) -> String {
    format!(
        "http://sluice:8888{}?{}",
        t.endpoint.path(),
        Query::from_pairs(t.params.clone()).encode()
    )
}

fn merged(d: &str, texts: &[&str]) -> String {
    let sources = parse_sources(d).unwrap();
    let fetched: Vec<Fetched> = texts.iter().map(|t| Fetched::Text(t.to_string())).collect();
    merge(&sources, &fetched, Limits::new(1000, &fetched), &mut plain).unwrap()
}

#[test]
fn sources_and_prefixes() {
    let s = parse_sources(
        " http://a/1.m3u ; sort:https://b/2.m3u;no_proxy:http://c/3;SORT:no_proxy:http://d/4;",
    )
    .unwrap();
    let flags: Vec<(&str, bool, bool)> = s
        .iter()
        .map(|s| (s.url.as_str(), s.sort, s.proxy))
        .collect();
    assert_eq!(
        flags,
        vec![
            ("http://a/1.m3u", false, true),
            ("https://b/2.m3u", true, true),
            ("http://c/3", false, false),
            ("http://d/4", true, false),
        ]
    );
    // MediaFlow's legacy form: the base and password before `&` are ignored.
    let legacy = parse_sources("https://mfp.example:secret&http://p/list.m3u").unwrap();
    assert_eq!(legacy[0].url.as_str(), "http://p/list.m3u");
    // A URL whose query has `&` stays whole.
    let q = parse_sources("http://p/get.php?username=u&password=p&type=m3u_plus").unwrap();
    assert_eq!(
        q[0].url.as_str(),
        "http://p/get.php?username=u&password=p&type=m3u_plus"
    );
}

#[test]
fn bad_source_lists() {
    assert_eq!(parse_sources(" ; ;"), Err(M3uError::Empty));
    assert_eq!(
        parse_sources("http://a/1;ftp://b/2"),
        Err(M3uError::BadUrl { index: 2 })
    );
    assert_eq!(
        parse_sources("sort:file:///etc/passwd"),
        Err(M3uError::BadUrl { index: 1 })
    );
    let many = vec!["http://a/x"; MAX_SOURCES + 1].join(";");
    assert_eq!(
        parse_sources(&many),
        Err(M3uError::TooMany(MAX_SOURCES + 1))
    );
}

#[test]
fn options_become_parameters() {
    let list = "#EXTM3U url-tvg=\"http://epg/guide.xml\"\r\n\
#EXTINF:-1 tvg-id=\"one\" group-title=\"News, World\",One\r\n\
#EXTVLCOPT:http-user-agent=Mozilla/5.0 (X11)\r\n\
#EXTVLCOPT:http-referrer=https://site.example/\r\n\
#EXTVLCOPT:http-reconnect=true\r\n\
http://cdn.example/one/index.m3u8\r\n\
#EXTINF:-1,Two\n\
#EXTHTTP:{\"Origin\":\"https://o.example\",\"Content-Length\":\"5\",\"bad name\":\"x\"}\n\
http://cdn.example/two.ts\n\
#EXTINF:-1,Three\n\
#KODIPROP:inputstream.adaptive.license_type=clearkey\n\
#KODIPROP:inputstream.adaptive.license_key=00112233445566778899aabbccddeeff:ffeeddccbbaa99887766554433221100\n\
#KODIPROP:inputstream.adaptive.stream_headers=User-Agent=Kodi%2F21&Cookie=a%3Db\n\
#KODIPROP:inputstream=inputstream.adaptive\n\
https://dash.example/live/manifest.mpd?token=t#frag\n\
#EXTINF:-1,Four\n\
https://dash.example/vod.mpd?key_id=aa&key=bb&x=1\n\
#EXTINF:-1,Five\n\
rtmp://live.example/app/stream\n";
    let out = merged("http://p/list.m3u", &[list]);
    assert_eq!(
        out,
        "#EXTM3U url-tvg=\"http://epg/guide.xml\"\n\
#EXTINF:-1 tvg-id=\"one\" group-title=\"News, World\",One\n\
#EXTVLCOPT:http-user-agent=Mozilla/5.0 (X11)\n\
#EXTVLCOPT:http-referrer=https://site.example/\n\
#EXTVLCOPT:http-reconnect=true\n\
http://sluice:8888/proxy/hls/manifest.m3u8?d=http%3A%2F%2Fcdn.example%2Fone%2Findex.m3u8&h_user-agent=Mozilla%2F5.0+%28X11%29&h_referer=https%3A%2F%2Fsite.example%2F\n\
#EXTINF:-1,Two\n\
#EXTHTTP:{\"Origin\":\"https://o.example\",\"Content-Length\":\"5\",\"bad name\":\"x\"}\n\
http://sluice:8888/proxy/hls/manifest.m3u8?d=http%3A%2F%2Fcdn.example%2Ftwo.ts&h_origin=https%3A%2F%2Fo.example\n\
#EXTINF:-1,Three\n\
#KODIPROP:inputstream=inputstream.adaptive\n\
http://sluice:8888/proxy/mpd/manifest.m3u8?d=https%3A%2F%2Fdash.example%2Flive%2Fmanifest.mpd%3Ftoken%3Dt&key_id=00112233445566778899aabbccddeeff&key=ffeeddccbbaa99887766554433221100&h_user-agent=Kodi%2F21&h_cookie=a%3Db\n\
#EXTINF:-1,Four\n\
http://sluice:8888/proxy/mpd/manifest.m3u8?d=https%3A%2F%2Fdash.example%2Fvod.mpd%3Fx%3D1&key_id=aa&key=bb\n\
#EXTINF:-1,Five\n\
rtmp://live.example/app/stream\n"
    );
}

#[test]
fn a_widevine_licence_is_not_taken_for_keys() {
    let list = "#EXTINF:-1,W\n\
#KODIPROP:inputstream.adaptive.license_type=com.widevine.alpha\n\
#KODIPROP:inputstream.adaptive.license_key=https://lic.example/wv\n\
https://d.example/m.mpd\n";
    let out = merged("http://p/l.m3u", &[list]);
    assert_eq!(
        out,
        "#EXTM3U\n#EXTINF:-1,W\n\
http://sluice:8888/proxy/mpd/manifest.m3u8?d=https%3A%2F%2Fd.example%2Fm.mpd\n"
    );
}

#[test]
fn sorted_block_first_then_the_rest_in_order() {
    let a = "#EXTM3U x-tvg-url=\"a\"\n#EXTINF:-1,zulu\nhttp://a/z.m3u8\n#EXTINF:-1,Alpha\nhttp://a/a.m3u8\n";
    let b = "#EXTM3U\n#EXTINF:-1,mike\n#EXTVLCOPT:http-user-agent=UA\nhttp://b/m.m3u8\n";
    let c = "#EXTM3U x-tvg-url=\"c\"\n# a comment\n#EXTINF:-1,Charlie\nhttp://c/c.m3u8\n";
    let out = merged(
        "sort:http://p/a.m3u;sort:no_proxy:http://p/b.m3u;http://p/c.m3u",
        &[a, b, c],
    );
    assert_eq!(
        out,
        "#EXTM3U x-tvg-url=\"a\"\n\
#EXTINF:-1,Alpha\n\
http://sluice:8888/proxy/hls/manifest.m3u8?d=http%3A%2F%2Fa%2Fa.m3u8\n\
#EXTINF:-1,mike\n\
#EXTVLCOPT:http-user-agent=UA\n\
http://b/m.m3u8\n\
#EXTINF:-1,zulu\n\
http://sluice:8888/proxy/hls/manifest.m3u8?d=http%3A%2F%2Fa%2Fz.m3u8\n\
# a comment\n\
#EXTINF:-1,Charlie\n\
http://sluice:8888/proxy/hls/manifest.m3u8?d=http%3A%2F%2Fc%2Fc.m3u8\n"
    );
}

#[test]
fn failed_sources_become_comments() {
    let sources = parse_sources("http://p/a.m3u;http://p/b.m3u").unwrap();
    let fetched = vec![
        Fetched::Failed("upstream answered 404\nNot Found".into()),
        Fetched::Text("#EXTM3U\n#EXTINF:-1,B\nhttp://b/b.m3u8\n".into()),
    ];
    assert_eq!(
        merge(&sources, &fetched, Limits::new(1000, &fetched), &mut plain).unwrap(),
        "#EXTM3U\n# ERROR playlist 1: upstream answered 404 Not Found\n#EXTINF:-1,B\n\
http://sluice:8888/proxy/hls/manifest.m3u8?d=http%3A%2F%2Fb%2Fb.m3u8\n"
    );
}

#[test]
fn a_failed_source_is_named_by_its_position_only() {
    let url = "http://merge-user:hunter2-secret@tv.example.net:8080/get.php?type=m3u";
    let sources = parse_sources(&format!("http://p/a.m3u;{url}")).unwrap();
    // A careless reason that names the URL, the credentials and the host.
    let why = format!(
        "cannot connect to tv.example.net:8080 (merge-user:hunter2-secret@tv.example.net), \
         fetching {url}; upstream answered 404"
    );
    let fetched = vec![
        Fetched::Text("#EXTM3U\n#EXTINF:-1,A\nhttp://a/a.m3u8\n".into()),
        Fetched::Failed(why),
    ];
    let out = merge(&sources, &fetched, Limits::new(1000, &fetched), &mut plain).unwrap();
    for secret in ["tv.example.net", "hunter2-secret", "merge-user", "get.php"] {
        assert!(!out.contains(secret), "{secret} in {out}");
    }
    assert!(
        out.ends_with(
            "# ERROR playlist 2: cannot connect to (the source):8080 ((the source)), fetching \
             (the source); upstream answered 404\n"
        ),
        "{out}"
    );
    // A host that is part of another word is left alone: host `p` against `upstream`.
    assert_eq!(
        unnamed(
            "upstream p answered 404 for http://p/a.m3u",
            &sources[0].url
        ),
        "upstream (the source) answered 404 for (the source)"
    );
}

#[test]
fn lines_are_bounded_before_they_are_parsed() {
    let sources = parse_sources("http://p/a;http://p/b").unwrap();
    let max = 10 * LINES_PER_ENTRY;
    // Ten channels and comment lines up to the bound over both sources: merged.
    let comments = |n: usize| "#\n".repeat(n);
    let fetched = vec![
        Fetched::Text(format!("#EXTM3U\n{}", channels(0, 10))),
        Fetched::Text(comments(max - 21)),
    ];
    let out = merge(&sources, &fetched, Limits::new(10, &fetched), &mut plain).unwrap();
    assert_eq!(out.lines().filter(|l| *l == "#").count(), max - 21);
    // One line more, and a hostile source of bare `#` lines far over it: refused, though neither
    // passes the entry bound.
    for n in [max - 20, 1_000_000] {
        let fetched = vec![
            Fetched::Text(format!("#EXTM3U\n{}", channels(0, 10))),
            Fetched::Text(comments(n)),
        ];
        let got = merge(&sources, &fetched, Limits::new(10, &fetched), &mut plain);
        assert_eq!(
            got.map(|out| out.len()),
            Err(MergeError::TooManyLines { max }),
            "{n}"
        );
    }
}

#[test]
fn a_lower_case_header_is_written_as_players_expect() {
    // Found by the m3u_merge fuzz target.
    let out = merged(
        "http://p/l.m3u",
        &["#extm3u x-tvg-url=\"g\"\n#EXTINF:-1,A\nrtmp://a/b\n"],
    );
    assert_eq!(out, "#EXTM3U x-tvg-url=\"g\"\n#EXTINF:-1,A\nrtmp://a/b\n");
}

#[test]
fn an_entry_keeps_at_most_64_headers_and_skips_long_options() {
    // 10,000 distinct names over lines short enough to be applied.
    let names: Vec<String> = (0..10_000).map(|i| format!("x-h{i}")).collect();
    let lines: Vec<String> = names
        .chunks(500)
        .map(|chunk| {
            let pairs: Vec<String> = chunk.iter().map(|n| format!("{n}=v")).collect();
            format!("inputstream.adaptive.stream_headers={}", pairs.join("&"))
        })
        .collect();
    let mut options = Options::default();
    for line in &lines {
        assert!(line.len() <= options::MAX_OPTION_LINE, "{}", line.len());
        assert!(options.kodi(line));
    }
    assert_eq!(options.headers.len(), options::MAX_HEADERS);
    let kept: Vec<&str> = options.headers.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kept, names[..options::MAX_HEADERS]);
    // A name already kept still takes its last value.
    options.vlc("http-x-h0=new");
    assert_eq!(options.headers[0], ("x-h0".to_string(), "new".to_string()));
    assert_eq!(options.headers.len(), options::MAX_HEADERS);

    // Through a merge: the entry's link carries the 64.
    let text = format!(
        "#EXTM3U\n#KODIPROP:{}\nhttp://o/a.m3u8\n",
        lines.join("\n#KODIPROP:")
    );
    let out = merged("http://a/1.m3u", &[&text]);
    assert_eq!(out.matches("h_x-h").count(), options::MAX_HEADERS);

    // An option longer than the bound is skipped whole; a parameter property is still left out.
    let long = "a".repeat(options::MAX_OPTION_LINE);
    let mut fresh = Options::default();
    fresh.vlc(&format!("http-user-agent={long}"));
    fresh.http_json(&format!("{{\"User-Agent\": \"{long}\"}}"));
    assert!(fresh.kodi(&format!("inputstream.adaptive.stream_headers=a={long}")));
    assert!(fresh.kodi(&format!("inputstream.adaptive.license_key={long}")));
    assert_eq!(fresh, Options::default());
}

#[test]
fn options_apply_to_one_entry_only() {
    let list = "#EXTINF:-1,A\n#EXTVLCOPT:http-user-agent=UA\nhttp://a/a.m3u8\n#EXTINF:-1,B\nhttp://a/b.m3u8\n";
    let out = merged("http://p/l.m3u", &[list]);
    assert!(out.contains("d=http%3A%2F%2Fa%2Fa.m3u8&h_user-agent=UA\n"));
    assert!(out.contains("d=http%3A%2F%2Fa%2Fb.m3u8\n"));
}

/// `n` channels `first..first + n`, each an `#EXTINF` and a short URL.
fn channels(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("#EXTINF:-1,ch{i}\nhttp://a/{i}\n"))
        .collect()
}

#[test]
fn entries_are_bounded_over_all_sources_before_any_link() {
    let sources = parse_sources("http://p/a;sort:http://p/b;no_proxy:http://p/c").unwrap();
    let lists = |n: [usize; 3]| -> Vec<Fetched> {
        n.iter()
            .enumerate()
            .map(|(i, &n)| Fetched::Text(channels(i * 1000, n)))
            .collect()
    };
    // 100 together, at the bound: every entry is there, the proxied ones linked.
    let fetched = lists([40, 40, 20]);
    let mut links = 0;
    let out = merge(&sources, &fetched, Limits::new(100, &fetched), &mut |t| {
        links += 1;
        plain(t)
    })
    .unwrap();
    assert_eq!(links, 80);
    assert_eq!(out.matches("/proxy/hls/manifest.m3u8?d=").count(), 80);
    assert_eq!(
        out.lines().filter(|l| l.starts_with("http://a/")).count(),
        20
    );
    // One more in any source, even the unproxied one, passes it: refused before a single link.
    for n in [[41, 40, 20], [40, 41, 20], [40, 40, 21]] {
        let fetched = lists(n);
        let mut links = 0;
        let got = merge(&sources, &fetched, Limits::new(100, &fetched), &mut |t| {
            links += 1;
            plain(t)
        });
        assert_eq!(
            got.map(|out| out.len()),
            Err(MergeError::TooManyEntries { max: 100 }),
            "{n:?}"
        );
        assert_eq!(links, 0, "{n:?}");
    }
}

#[test]
fn output_is_bounded_as_it_is_written() {
    let sources = parse_sources("http://p/a;http://p/b").unwrap();
    let fetched = vec![
        Fetched::Text(channels(0, 1000)),
        Fetched::Text(channels(1000, 1000)),
    ];
    // Each 10-byte URL becomes a 4,000-byte link: the first 250 links pass 1 MB.
    let mut big = |t: &ProxyTarget| format!("{}#{}", plain(t), "x".repeat(4000));
    let limits = Limits {
        max_entries: 2000,
        max_output: 1_000_000,
    };
    let mut links = 0;
    let got = merge(&sources, &fetched, limits, &mut |t| {
        links += 1;
        big(t)
    });
    assert_eq!(
        got.map(|out| out.len()),
        Err(MergeError::OutputTooLarge { max: 1_000_000 })
    );
    assert!((240..=251).contains(&links), "{links} links made");
    // The default bound (4 × the input plus 64 MiB) leaves real lists their room.
    let fetched = vec![Fetched::Text(channels(0, 1000))];
    let out = merge(
        &sources[..1],
        &fetched,
        Limits::new(2000, &fetched),
        &mut big,
    )
    .unwrap();
    assert_eq!(out.matches(&"x".repeat(4000)).count(), 1000);
}

proptest! {
    #[test]
    fn never_panics_and_keeps_one_header(text in "(#EXTM3U|#EXTINF:-1,x|#EXTVLCOPT:[a-z-]{0,12}=.{0,8}|#EXTHTTP:.{0,20}|#KODIPROP:.{0,40}|https?://[a-z]{1,5}/[a-z.?=&]{0,12}|.{0,20}|\r|\n){0,40}",
                                          d in ".{0,60}") {
        let _ = parse_sources(&d);
        let sources = parse_sources("http://p/a;sort:http://p/b").unwrap();
        let fetched = vec![Fetched::Text(text.clone()), Fetched::Text(text)];
        let out = merge(&sources, &fetched, Limits::new(1000, &fetched), &mut plain).unwrap();
        prop_assert!(out.starts_with("#EXTM3U"));
        prop_assert_eq!(out.lines().filter(|l| l.starts_with("#EXTM3U")).count(), 1);
    }
}
