//! M3U channel lists merged into one, as MediaFlow's `/playlist/playlist` does: source
//! definitions, channel entries, player options (`#EXTVLCOPT`, `#EXTHTTP`, `#KODIPROP`) carried
//! into proxy parameters. No I/O: the caller fetches the sources and builds the proxy URLs.
//!
//! The `d` parameter lists sources separated by `;`. Each may start with `sort:` (its channels are
//! merged with every other sorted source's and ordered by name, ahead of the unsorted sources) and
//! `no_proxy:` (its URLs are left as they are). MediaFlow's legacy `<base>:<password>&<url>` form
//! is accepted; its base and password are ignored, since entries always point back at this server
//! and never carry a password.
//!
//! An entry URL (a line that is not a tag and starts with `http://` or `https://`) is sent to
//! `/proxy/mpd/manifest.m3u8` when it is DASH (the path ends in `.mpd`, or a `#KODIPROP` says
//! `manifest_type=mpd`), else to `/proxy/hls/manifest.m3u8`, which streams non-playlists through.
//! The options before it become its parameters: request headers as `h_<name>`, ClearKey keys as
//! `key_id`/`key`.
//!
//! Each proxied entry grows from a short line into a proxy URL (a sealed token, when the caller
//! has a password), so the merge is bounded by [`Limits`]: entry URLs over all sources, counted as
//! they are parsed, and output bytes, checked as each line is written. Every other line costs a
//! parsed item too, so lines over all sources are bounded as well ([`LINES_PER_ENTRY`] per entry
//! allowed), counted before each line is looked at.
//!
//! A source that could not be fetched becomes a comment naming it by its position in `d` only:
//! the merged list goes to players that may never have been shown the source URLs (a sealed
//! `/playlist/link` token), and a URL may carry credentials.

mod options;

use url::Url;

use options::Options;

/// Most sources one request may merge.
pub const MAX_SOURCES: usize = 16;

/// Non-blank lines allowed per entry of [`Limits::max_entries`], over all sources together. A
/// real channel has a handful (`#EXTINF`, a group, a few options, its URL); without this bound a
/// source of bare `#` lines would cost a parsed item (32 bytes) per 2 input bytes without ever
/// reaching the entry bound.
pub const LINES_PER_ENTRY: usize = 16;

/// One source of the merged list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub url: Url,
    /// Its channels join the sorted block.
    pub sort: bool,
    /// Its URLs are rewritten to go through the proxy.
    pub proxy: bool,
}

/// Why `d` names no usable source list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum M3uError {
    #[error("`d` names no playlist: give one or more playlist URLs separated by `;`")]
    Empty,
    #[error("`d` names {0} playlists, over the limit of {MAX_SOURCES}")]
    TooMany(usize),
    #[error("playlist {index} in `d` is not an http(s) URL")]
    BadUrl { index: usize },
}

/// Parses the `d` parameter of `/playlist/playlist` (already percent-decoded).
pub fn parse_sources(d: &str) -> Result<Vec<Source>, M3uError> {
    let defs: Vec<&str> = d
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if defs.is_empty() {
        return Err(M3uError::Empty);
    }
    if defs.len() > MAX_SOURCES {
        return Err(M3uError::TooMany(defs.len()));
    }
    defs.iter()
        .enumerate()
        .map(|(i, def)| parse_source(def).ok_or(M3uError::BadUrl { index: i + 1 }))
        .collect()
}

fn parse_source(def: &str) -> Option<Source> {
    let (mut sort, mut proxy, mut rest) = (false, true, def);
    // MediaFlow reads `sort:` first, then `no_proxy:`; either order is accepted here.
    loop {
        if let Some(r) = strip_prefix_ci(rest, "sort:") {
            sort = true;
            rest = r;
        } else if let Some(r) = strip_prefix_ci(rest, "no_proxy:") {
            proxy = false;
            rest = r;
        } else {
            break;
        }
    }
    let rest = rest.trim();
    // Legacy `<base>:<password>&<url>`: the URL follows the first `&`, and what precedes it has no
    // query (a `&` inside a real URL's query always comes after a `?`).
    let legacy = rest
        .split_once('&')
        .filter(|(head, tail)| !head.contains('?') && is_http(tail.trim()))
        .map(|(_, tail)| tail.trim());
    let url_text = match legacy {
        Some(url) => url,
        None if is_http(rest) => rest,
        None => return None,
    };
    let url = Url::parse(url_text).ok()?;
    (matches!(url.scheme(), "http" | "https") && url.host_str().is_some()).then_some(Source {
        url,
        sort,
        proxy,
    })
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

fn is_http(s: &str) -> bool {
    strip_prefix_ci(s, "http://").is_some() || strip_prefix_ci(s, "https://").is_some()
}

/// The proxy endpoint an entry is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Hls,
    Mpd,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Hls => "/proxy/hls/manifest.m3u8",
            Endpoint::Mpd => "/proxy/mpd/manifest.m3u8",
        }
    }
}

/// What a proxied entry URL becomes: an endpoint and its parameters, in order (`d`, `key_id`,
/// `key`, then `h_*`). The caller turns it into a URL (plain query or sealed token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyTarget {
    pub endpoint: Endpoint,
    pub params: Vec<(String, String)>,
}

/// One source as fetched: its text, or why it could not be had (shown as a comment). The reason
/// should not name the source; its URL and host are taken out of it anyway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    Text(String),
    Failed(String),
}

/// What one merge may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most entry URLs (`http(s)://` lines) over all sources together, proxied or not.
    pub max_entries: usize,
    /// Most bytes of merged output.
    pub max_output: usize,
}

impl Limits {
    /// `max_entries`, and the output bound of an HLS rewrite (4 × the input plus 64 MiB,
    /// [`crate::hls::max_output_len`]) over the fetched sources' total size.
    pub fn new(max_entries: usize, fetched: &[Fetched]) -> Self {
        let input = fetched.iter().map(fetched_len).sum::<usize>();
        Limits {
            max_entries,
            max_output: crate::hls::max_output_len(input),
        }
    }
}

/// Why the sources cannot be merged within [`Limits`]: the sources are at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    #[error("the playlists list more than {max} entries together")]
    TooManyEntries { max: usize },
    #[error("the playlists hold more than {max} lines together")]
    TooManyLines { max: usize },
    #[error("the merged playlist would be over {max} bytes")]
    OutputTooLarge { max: usize },
}

/// Merges the fetched sources (in the order of `sources`) into one M3U list. `link` turns a
/// proxied entry into the URL written in its place. Stops at the first bound of `limits` passed:
/// parsing once the sources hold more entries, or more lines, than allowed (before any `link`),
/// writing once the output would grow past its bound.
pub fn merge(
    sources: &[Source],
    fetched: &[Fetched],
    limits: Limits,
    link: &mut dyn FnMut(&ProxyTarget) -> String,
) -> Result<String, MergeError> {
    let mut budget = Budget::new(limits.max_entries);
    let parsed: Vec<Option<Parsed<'_>>> = fetched
        .iter()
        .map(|f| match f {
            Fetched::Text(text) => parse(text, &mut budget).map(Some),
            Fetched::Failed(_) => Ok(None),
        })
        .collect::<Result<_, _>>()?;
    let header = sources
        .iter()
        .zip(&parsed)
        .filter_map(|(_, p)| p.as_ref().and_then(|p| p.header))
        .next()
        .unwrap_or("#EXTM3U");
    let capacity = fetched.iter().map(fetched_len).sum::<usize>() + 64;
    let mut out = Out {
        text: String::with_capacity(capacity.min(limits.max_output)),
        max: limits.max_output,
    };
    // The tag is matched in any case (`#extm3u`) but written as players expect it; its
    // attributes (`url-tvg`, ...) are kept as they are.
    out.push_line(&format!("#EXTM3U{}", &header["#EXTM3U".len()..]))?;

    // The sorted block first, as in MediaFlow: every `sort:` source's entries, ordered by name.
    let mut sorted: Vec<(String, Entry<'_>, bool)> = Vec::new();
    for (source, p) in sources.iter().zip(&parsed) {
        if let (true, Some(p)) = (source.sort, p) {
            for entry in p.entries() {
                sorted.push((entry.name().to_lowercase(), entry, source.proxy));
            }
        }
    }
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, entry, proxy) in sorted {
        entry.render(proxy, &mut out, link)?;
    }

    for (i, (source, f)) in sources.iter().zip(fetched).enumerate() {
        match (f, &parsed[i]) {
            (Fetched::Failed(why), _) => {
                let why = one_line(&unnamed(why, &source.url));
                out.push_line(&format!("# ERROR playlist {}: {why}", i + 1))?;
            }
            (Fetched::Text(_), Some(p)) if !source.sort => {
                for item in &p.items {
                    item.render(source.proxy, &mut out, link)?;
                }
            }
            _ => {}
        }
    }
    Ok(out.text)
}

/// The merged list as it is written, refusing to grow past `max` bytes.
struct Out {
    text: String,
    max: usize,
}

impl Out {
    fn push_line(&mut self, line: &str) -> Result<(), MergeError> {
        if self.text.len().saturating_add(line.len() + 1) > self.max {
            return Err(MergeError::OutputTooLarge { max: self.max });
        }
        self.text.push_str(line);
        self.text.push('\n');
        Ok(())
    }
}

fn fetched_len(f: &Fetched) -> usize {
    match f {
        Fetched::Text(t) => t.len(),
        Fetched::Failed(w) => w.len(),
    }
}

/// `why` with the source's URL (with and without credentials), credentials and host taken out,
/// in case the caller's reason names them. The host only where it stands alone as a name (`p` in
/// `upstream` is not the host `p`).
fn unnamed(why: &str, url: &Url) -> String {
    const NAMED: &str = "(the source)";
    let mut bare = url.clone();
    let _ = bare.set_username("");
    let _ = bare.set_password(None);
    let user = url.username();
    let credentials = [
        url.password().map(|p| format!("{user}:{p}@")),
        (!user.is_empty()).then(|| format!("{user}@")),
    ];
    let mut out = why
        .replace(url.as_str(), NAMED)
        .replace(bare.as_str(), NAMED);
    for c in credentials.iter().flatten() {
        out = out.replace(c.as_str(), "");
    }
    let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
        return out;
    };
    let in_name =
        |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
    let mut from = 0;
    while let Some(at) = out[from..].find(host).map(|i| i + from) {
        let end = at + host.len();
        if in_name(out[..at].chars().next_back()) || in_name(out[end..].chars().next()) {
            from = end;
            continue;
        }
        out.replace_range(at..end, NAMED);
        from = at + NAMED.len();
    }
    out
}

fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect()
}

/// One source's lines: its `#EXTM3U` header and everything else in order.
struct Parsed<'a> {
    header: Option<&'a str>,
    items: Vec<Item<'a>>,
}

enum Item<'a> {
    /// A tag, comment or line kept as it is.
    Line(&'a str),
    /// A player option that only matters to a direct URL; left out when the entry is proxied.
    DirectOnly(&'a str),
    /// An entry URL and the options that preceded it (boxed: every line of a source is an item,
    /// and most are not URLs: 32 bytes each instead of 112).
    Url {
        line: &'a str,
        options: Box<Options>,
    },
}

impl Item<'_> {
    fn render(
        &self,
        proxy: bool,
        out: &mut Out,
        link: &mut dyn FnMut(&ProxyTarget) -> String,
    ) -> Result<(), MergeError> {
        match self {
            Item::Line(l) => out.push_line(l),
            Item::DirectOnly(l) if !proxy => out.push_line(l),
            Item::DirectOnly(_) => Ok(()),
            Item::Url { line, options } => match target(line, options).filter(|_| proxy) {
                Some(t) => out.push_line(&link(&t)),
                None => out.push_line(line),
            },
        }
    }
}

/// One channel: from its `#EXTINF` to its URL.
struct Entry<'a> {
    items: &'a [Item<'a>],
}

impl Entry<'_> {
    /// The display name: what follows the first comma outside quotes of the `#EXTINF` line.
    fn name(&self) -> &str {
        let Some(Item::Line(extinf)) = self.items.first() else {
            return "";
        };
        let mut quoted = false;
        for (i, c) in extinf.char_indices() {
            match c {
                '"' => quoted = !quoted,
                ',' if !quoted => return extinf[i + 1..].trim(),
                _ => {}
            }
        }
        ""
    }

    fn render(
        &self,
        proxy: bool,
        out: &mut Out,
        link: &mut dyn FnMut(&ProxyTarget) -> String,
    ) -> Result<(), MergeError> {
        self.items
            .iter()
            .try_for_each(|item| item.render(proxy, out, link))
    }
}

impl<'a> Parsed<'a> {
    /// The channel entries; lines outside any entry are not part of one.
    fn entries(&'a self) -> Vec<Entry<'a>> {
        let mut entries = Vec::new();
        let mut start = None;
        for (i, item) in self.items.iter().enumerate() {
            match item {
                Item::Line(l) if is_tag(l, "#EXTINF:") => start = Some(i),
                Item::Url { .. } => {
                    if let Some(s) = start.take() {
                        entries.push(Entry {
                            items: &self.items[s..=i],
                        });
                    }
                }
                _ => {}
            }
        }
        entries
    }
}

fn is_tag(line: &str, tag: &str) -> bool {
    strip_prefix_ci(line, tag).is_some()
}

/// What is left of a merge's entry and line bounds, over every source parsed so far.
struct Budget {
    entries: usize,
    max_entries: usize,
    lines: usize,
    max_lines: usize,
}

impl Budget {
    fn new(max_entries: usize) -> Self {
        Budget {
            entries: 0,
            max_entries,
            lines: 0,
            max_lines: max_entries.saturating_mul(LINES_PER_ENTRY),
        }
    }

    fn line(&mut self) -> Result<(), MergeError> {
        self.lines += 1;
        match self.lines > self.max_lines {
            true => Err(MergeError::TooManyLines {
                max: self.max_lines,
            }),
            false => Ok(()),
        }
    }

    fn entry(&mut self) -> Result<(), MergeError> {
        self.entries += 1;
        match self.entries > self.max_entries {
            true => Err(MergeError::TooManyEntries {
                max: self.max_entries,
            }),
            false => Ok(()),
        }
    }
}

/// Parses one source; `budget` counts the lines and entry URLs of every source so far, and
/// passing either bound stops the parse there, before the line costs anything.
fn parse<'a>(text: &'a str, budget: &mut Budget) -> Result<Parsed<'a>, MergeError> {
    let mut header = None;
    let mut items = Vec::new();
    let mut options = Options::default();
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        budget.line()?;
        if is_tag(line, "#EXTM3U") {
            header.get_or_insert(line);
            continue;
        }
        if let Some(opt) = strip_prefix_ci(line, "#EXTVLCOPT:") {
            options.vlc(opt);
            items.push(Item::Line(line));
        } else if let Some(json) = strip_prefix_ci(line, "#EXTHTTP:") {
            options.http_json(json);
            items.push(Item::Line(line));
        } else if let Some(prop) = strip_prefix_ci(line, "#KODIPROP:") {
            if options.kodi(prop) {
                items.push(Item::DirectOnly(line));
            } else {
                items.push(Item::Line(line));
            }
        } else if !line.starts_with('#') && is_http(line) {
            budget.entry()?;
            items.push(Item::Url {
                line,
                options: Box::new(std::mem::take(&mut options)),
            });
        } else {
            items.push(Item::Line(line));
        }
    }
    Ok(Parsed { header, items })
}

/// Where an entry URL goes through the proxy, or `None` when it is not a URL sluice can fetch.
fn target(line: &str, options: &Options) -> Option<ProxyTarget> {
    let url = Url::parse(line).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return None;
    }
    let is_mpd = match options.manifest_type.as_deref() {
        Some("mpd") => true,
        Some(_) => false,
        None => url.path().to_ascii_lowercase().ends_with(".mpd"),
    };
    let mut params = Vec::new();
    if is_mpd {
        // Keys in the MPD's own query (MediaFlow's convention) become proxy parameters.
        let mut key_id = None;
        let mut key = None;
        let kept: Vec<(String, String)> = url
            .query_pairs()
            .filter_map(|(k, v)| match k.as_ref() {
                "key_id" => {
                    key_id = Some(v.into_owned());
                    None
                }
                "key" => {
                    key = Some(v.into_owned());
                    None
                }
                _ => Some((k.into_owned(), v.into_owned())),
            })
            .collect();
        let mut clean = url.clone();
        clean.set_fragment(None);
        if key_id.is_some() || key.is_some() {
            if kept.is_empty() {
                clean.set_query(None);
            } else {
                clean.query_pairs_mut().clear().extend_pairs(kept);
            }
        }
        params.push(("d".to_string(), clean.to_string()));
        let keys = match (key_id, key) {
            (Some(id), Some(k)) => Some((id, k)),
            _ => options.clearkey(),
        };
        if let Some((id, k)) = keys {
            params.push(("key_id".to_string(), id));
            params.push(("key".to_string(), k));
        }
    } else {
        params.push(("d".to_string(), line.to_string()));
    }
    for (name, value) in &options.headers {
        params.push((format!("h_{name}"), value.clone()));
    }
    Some(ProxyTarget {
        endpoint: if is_mpd { Endpoint::Mpd } else { Endpoint::Hls },
        params,
    })
}

#[cfg(test)]
mod tests;
