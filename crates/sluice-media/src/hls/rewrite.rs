//! The second pass of `rewrite_playlist`: walks lines, rewrites URIs, drops variants and cut segments.

use url::{Position, Url};

use super::attr;
use super::budget;
use super::lines::{Line, LineKind};
use super::scan::Summary;
use super::skip::{Cutter, Decision};
use super::{is_playlist_url, HlsError, RewriteOptions, SegmentExt, Target};

/// What a URI stands for, before its extension is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Playlist,
    Segment,
    Key,
    Map,
    /// Resolved to an absolute URL but never proxied (e.g. `EXT-X-SESSION-DATA` JSON).
    Direct,
}

/// How the next URI line is to be treated in a master playlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextUri {
    Plain,
    Variant,
    DroppedVariant,
}

pub(crate) struct Writer<'a, 'f> {
    base: &'a Url,
    opts: &'a RewriteOptions,
    make_url: &'f mut dyn FnMut(Target, &Url) -> String,
    out: String,
    /// Where the output stops growing: see `budget`.
    max_out: usize,
    eol: &'a str,
    keep_height: Option<u32>,
    next_uri: NextUri,
    /// Present only for media playlists with `skip` ranges; lines then wait in `pending`
    /// until their segment's URI decides whether the segment survives.
    cutter: Option<Cutter>,
    pending: Vec<Line<'a>>,
}

impl<'a, 'f> Writer<'a, 'f> {
    pub fn new(
        base: &'a Url,
        opts: &'a RewriteOptions,
        make_url: &'f mut dyn FnMut(Target, &Url) -> String,
        summary: &Summary,
        eol: &'a str,
        input_len: usize,
    ) -> Self {
        let media_with_skip = !summary.is_master && !opts.skip.is_empty();
        Writer {
            base,
            opts,
            make_url,
            // Proxy URLs are longer than the relative URIs they replace.
            out: String::with_capacity(input_len * 2),
            max_out: budget::max_output_len(input_len),
            eol,
            keep_height: summary.keep_height,
            next_uri: NextUri::Plain,
            cutter: media_with_skip.then(|| Cutter::new(&opts.skip)),
            pending: Vec::new(),
        }
    }

    pub fn push_str(&mut self, s: &str) {
        self.out.push_str(s);
    }

    pub fn line(&mut self, line: Line<'a>) -> Result<(), HlsError> {
        if self.cutter.is_none() {
            return self.emit(line);
        }
        self.pending.push(line);
        if matches!(line.kind(), LineKind::Uri(_)) {
            self.flush_segment()?;
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<String, HlsError> {
        // Lines after the last segment (ENDLIST, trailing LL-HLS parts, hints) are kept.
        for line in std::mem::take(&mut self.pending) {
            self.emit(line)?;
        }
        Ok(self.out)
    }

    // === segment cutting ===

    fn flush_segment(&mut self) -> Result<(), HlsError> {
        let block = std::mem::take(&mut self.pending);
        let duration = segment_duration(&block)?;
        let cutter = self.cutter.as_mut().expect("only called with a cutter");
        let decision = cutter.decide(duration);
        let has_byterange = block.iter().any(|l| tag_is(l, "EXT-X-BYTERANGE"));
        if !has_byterange {
            cutter.no_byterange();
        }
        match decision {
            Decision::Drop => self.emit_dropped(&block)?,
            Decision::Keep {
                discontinuity,
                explicit_offset,
            } => {
                let already = block.iter().any(|l| tag_is(l, "EXT-X-DISCONTINUITY"));
                self.emit_kept(&block, discontinuity && !already, explicit_offset)?;
            }
        }
        self.pending = block;
        self.pending.clear();
        Ok(())
    }

    fn emit_dropped(&mut self, block: &[Line<'a>]) -> Result<(), HlsError> {
        for &line in block {
            if tag_is(&line, "EXT-X-BYTERANGE") {
                self.account_byterange(line);
            }
            if !is_segment_scoped(&line) && !matches!(line.kind(), LineKind::Uri(_)) {
                self.emit(line)?;
            }
        }
        Ok(())
    }

    fn emit_kept(
        &mut self,
        block: &[Line<'a>],
        mut discontinuity: bool,
        explicit_offset: bool,
    ) -> Result<(), HlsError> {
        for &line in block {
            let starts_segment =
                is_segment_scoped(&line) || matches!(line.kind(), LineKind::Uri(_));
            if discontinuity && starts_segment {
                self.out.push_str("#EXT-X-DISCONTINUITY");
                self.out.push_str(self.eol);
                discontinuity = false;
            }
            if let LineKind::Tag {
                name: "EXT-X-BYTERANGE",
                value,
            } = line.kind()
            {
                let range = self.account_byterange(line);
                if let (true, false, Some((len, offset))) =
                    (explicit_offset, value.contains('@'), range)
                {
                    // The segment this offset was relative to is gone: spell it out.
                    self.out
                        .push_str(&format!("#EXT-X-BYTERANGE:{len}@{offset}{}", line.eol));
                    continue;
                }
            }
            self.emit(line)?;
        }
        Ok(())
    }

    fn account_byterange(&mut self, line: Line<'_>) -> Option<(u64, u64)> {
        let LineKind::Tag { value, .. } = line.kind() else {
            return None;
        };
        self.cutter.as_mut()?.byterange(value)
    }

    // === one line ===

    fn emit(&mut self, line: Line<'a>) -> Result<(), HlsError> {
        match line.kind() {
            LineKind::Tag { name, value } => self.emit_tag(line, name, value),
            LineKind::Uri(uri) => self.emit_uri(line, uri),
            LineKind::Other => {
                self.verbatim(line);
                Ok(())
            }
        }
    }

    fn verbatim(&mut self, line: Line<'_>) {
        self.out.push_str(line.text);
        self.out.push_str(line.eol);
    }

    fn emit_tag(&mut self, line: Line<'a>, name: &str, value: &str) -> Result<(), HlsError> {
        let kind = match name {
            "EXT-X-STREAM-INF" => {
                self.next_uri = if self.keeps_variant(value) {
                    NextUri::Variant
                } else {
                    NextUri::DroppedVariant
                };
                if self.next_uri == NextUri::DroppedVariant {
                    return Ok(());
                }
                None
            }
            _ => tag_uri_kind(name, value),
        };
        match kind {
            Some(kind) => self.emit_uri_attr(line, value, kind),
            None => {
                self.verbatim(line);
                Ok(())
            }
        }
    }

    fn keeps_variant(&self, attrs: &str) -> bool {
        let Some(want) = self.keep_height else {
            return true;
        };
        variant_height(attrs) == Some(want)
    }

    /// Replaces the quoted `URI` attribute of a tag, keeping every other byte of the line.
    /// A broken attribute list or an unresolvable URI leaves the line as it was.
    fn emit_uri_attr(&mut self, line: Line<'a>, attrs: &str, kind: Kind) -> Result<(), HlsError> {
        let uri = match attr::find(attrs, "URI") {
            Ok(Some(uri)) if uri.quoted && !uri.value.is_empty() => uri,
            _ => {
                self.verbatim(line);
                return Ok(());
            }
        };
        let Some(url) = self.resolve(uri.value) else {
            self.verbatim(line);
            return Ok(());
        };
        let new = self.route(kind, url, line.number)?;
        let at = line.text.len() - attrs.len() + uri.value_at;
        self.out.push_str(&line.text[..at]);
        self.out.push_str(&new);
        self.out.push_str(&line.text[at + uri.value.len()..]);
        self.out.push_str(line.eol);
        Ok(())
    }

    fn emit_uri(&mut self, line: Line<'a>, uri: &str) -> Result<(), HlsError> {
        let next = std::mem::replace(&mut self.next_uri, NextUri::Plain);
        if next == NextUri::DroppedVariant {
            return Ok(());
        }
        let Some(url) = self.resolve(uri) else {
            self.verbatim(line);
            return Ok(());
        };
        let kind = if next == NextUri::Variant || is_playlist_url(&url) {
            Kind::Playlist
        } else {
            Kind::Segment
        };
        let new = self.route(kind, url, line.number)?;
        self.out.push_str(&new);
        self.out.push_str(line.eol);
        Ok(())
    }

    // === URLs ===

    /// Absolute http(s) URL for `uri`, or `None` to keep it untouched: unparsable, or another
    /// scheme (`skd://`, `data:`) that a proxy could not fetch anyway.
    fn resolve(&self, uri: &str) -> Option<Url> {
        let url = self.base.join(uri).ok()?;
        matches!(url.scheme(), "http" | "https").then_some(url)
    }

    fn route(&mut self, kind: Kind, url: Url, line: usize) -> Result<String, HlsError> {
        let url = match (&self.opts.key_url, kind) {
            (Some(origin), Kind::Key) => swap_origin(&url, origin).unwrap_or(url),
            _ => url,
        };
        budget::check_url(url.as_str(), line)?;
        let target = match kind {
            Kind::Playlist => Target::Playlist,
            Kind::Key => Target::Key,
            Kind::Segment => Target::Segment {
                ext: SegmentExt::from_url(&url).unwrap_or(SegmentExt::Ts),
            },
            Kind::Map => Target::Map {
                ext: SegmentExt::from_url(&url).unwrap_or(SegmentExt::Mp4),
            },
            Kind::Direct => return self.within_budget(url.into()),
        };
        let direct = self.opts.no_proxy
            || (self.opts.key_only_proxy
                && matches!(target, Target::Segment { .. } | Target::Map { .. }));
        if direct {
            return self.within_budget(url.into());
        }
        let proxied = (self.make_url)(target, &url);
        // The URL goes inside quotes or onto its own line: these would break the playlist.
        if memchr::memchr3(b'"', b'\r', b'\n', proxied.as_bytes()).is_some() {
            return Err(HlsError::InvalidProxyUrl { line });
        }
        self.within_budget(proxied)
    }

    /// `written`, unless writing it would take the output past its bound. Only routed URIs grow
    /// the output beyond the input, so only they are checked.
    fn within_budget(&self, written: String) -> Result<String, HlsError> {
        budget::check_output(self.out.len(), written.len(), self.max_out)?;
        Ok(written)
    }
}

/// `url` with the scheme and authority (host, port, userinfo) of `origin`.
fn swap_origin(url: &Url, origin: &Url) -> Option<Url> {
    let joined = format!(
        "{}{}",
        &origin[..Position::BeforePath],
        &url[Position::BeforePath..]
    );
    Url::parse(&joined).ok()
}

pub(crate) fn variant_height(attrs: &str) -> Option<u32> {
    let res = attr::find(attrs, "RESOLUTION").ok()??;
    super::select::parse_dimensions(res.value)
}

/// What the `URI` attribute of tag `name` stands for, if the rewriter routes it.
fn tag_uri_kind(name: &str, attrs: &str) -> Option<Kind> {
    Some(match name {
        "EXT-X-MEDIA" | "EXT-X-I-FRAME-STREAM-INF" | "EXT-X-RENDITION-REPORT" => Kind::Playlist,
        "EXT-X-KEY" | "EXT-X-SESSION-KEY" => Kind::Key,
        "EXT-X-MAP" => Kind::Map,
        "EXT-X-PART" => Kind::Segment,
        "EXT-X-PRELOAD-HINT" => preload_hint_kind(attrs),
        "EXT-X-SESSION-DATA" => Kind::Direct,
        _ => return None,
    })
}

/// Whether the rewriter routes the `URI` attribute of tag `name` (for [`super::count_entries`]).
pub(crate) fn uri_tag(name: &str) -> bool {
    tag_uri_kind(name, "").is_some()
}

fn preload_hint_kind(attrs: &str) -> Kind {
    match attr::find(attrs, "TYPE") {
        Ok(Some(t)) if t.value == "MAP" => Kind::Map,
        _ => Kind::Segment,
    }
}

fn tag_is(line: &Line<'_>, tag: &str) -> bool {
    matches!(line.kind(), LineKind::Tag { name, .. } if name == tag)
}

/// Tags that describe only the segment they precede, and so leave with it when it is cut.
/// Everything else (keys, maps, date ranges, unknown tags, comments) stays: later segments
/// may depend on it.
fn is_segment_scoped(line: &Line<'_>) -> bool {
    matches!(
        line.kind(),
        LineKind::Tag {
            name: "EXTINF"
                | "EXT-X-BYTERANGE"
                | "EXT-X-PROGRAM-DATE-TIME"
                | "EXT-X-DISCONTINUITY"
                | "EXT-X-GAP"
                | "EXT-X-PART",
            ..
        }
    )
}

/// Duration from the block's `#EXTINF:<seconds>,<title>`; a segment without one lasts 0 s.
fn segment_duration(block: &[Line<'_>]) -> Result<f64, HlsError> {
    let Some((line, value)) = block.iter().find_map(|l| match l.kind() {
        LineKind::Tag {
            name: "EXTINF",
            value,
        } => Some((l.number, value)),
        _ => None,
    }) else {
        return Ok(0.0);
    };
    let number = value.split([',', ' ']).next().unwrap_or("").trim();
    number
        .parse::<f64>()
        .ok()
        .filter(|d| d.is_finite() && *d >= 0.0)
        .ok_or(HlsError::InvalidDuration { line })
}
