//! The second pass of `rewrite_playlist`: walks lines, rewrites URIs, drops variants and cut segments.

use url::{Position, Url};

use super::attr;
use super::budget;
use super::lines::{lines, Line, LineKind};
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

/// What `Writer::emit_attrs` does with one attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edit {
    /// Replace the quoted value by the routed URL.
    Route(Kind),
    /// Cut the attribute out with one of the commas around it.
    Remove,
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
    /// The waiting lines, as their own bytes (terminators included), re-split when the block is
    /// flushed. Held as text, not as a `Vec<Line>` (over 70 bytes a line), so a block of millions of
    /// blank lines costs what its input costs, not 80 times that.
    pending: String,
    /// Number of the first line in `pending`, so re-split lines keep their numbers for errors.
    pending_from: usize,
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
            pending: String::new(),
            pending_from: 0,
        }
    }

    pub fn push_str(&mut self, s: &str) {
        self.out.push_str(s);
    }

    pub fn line(&mut self, line: Line<'a>) -> Result<(), HlsError> {
        if self.cutter.is_none() {
            return self.emit(line);
        }
        if self.pending.is_empty() {
            self.pending_from = line.number;
        }
        self.pending.push_str(line.text);
        self.pending.push_str(line.eol);
        if matches!(line.kind(), LineKind::Uri(_)) {
            self.flush_segment()?;
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<String, HlsError> {
        // Lines after the last segment (ENDLIST, trailing LL-HLS parts, hints) are kept.
        let text = std::mem::take(&mut self.pending);
        for line in numbered(&text, self.pending_from) {
            self.emit(line)?;
        }
        Ok(self.out)
    }

    #[cfg(test)]
    pub(crate) fn pending_capacity(&self) -> usize {
        self.pending.capacity()
    }

    // === segment cutting ===

    fn flush_segment(&mut self) -> Result<(), HlsError> {
        let text = std::mem::take(&mut self.pending);
        let from = self.pending_from;
        let block = || numbered(&text, from);
        let duration = segment_duration(block())?;
        let cutter = self.cutter.as_mut().expect("only called with a cutter");
        let decision = cutter.decide(duration);
        let has_byterange = block().any(|l| tag_is(&l, "EXT-X-BYTERANGE"));
        if !has_byterange {
            cutter.no_byterange();
        }
        match decision {
            Decision::Drop => self.emit_dropped(block())?,
            Decision::Keep {
                discontinuity,
                explicit_offset,
            } => {
                let already = block().any(|l| tag_is(&l, "EXT-X-DISCONTINUITY"));
                self.emit_kept(block(), discontinuity && !already, explicit_offset)?;
            }
        }
        // Reused, so a playlist of many small blocks allocates once.
        self.pending = text;
        self.pending.clear();
        Ok(())
    }

    fn emit_dropped<'t>(&mut self, block: impl Iterator<Item = Line<'t>>) -> Result<(), HlsError> {
        for line in block {
            if tag_is(&line, "EXT-X-BYTERANGE") {
                self.account_byterange(line);
            }
            if !is_segment_scoped(&line) && !matches!(line.kind(), LineKind::Uri(_)) {
                self.emit(line)?;
            }
        }
        Ok(())
    }

    fn emit_kept<'t>(
        &mut self,
        block: impl Iterator<Item = Line<'t>>,
        mut discontinuity: bool,
        explicit_offset: bool,
    ) -> Result<(), HlsError> {
        for line in block {
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

    fn emit(&mut self, line: Line<'_>) -> Result<(), HlsError> {
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

    fn emit_tag(&mut self, line: Line<'_>, name: &str, value: &str) -> Result<(), HlsError> {
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
            "EXT-X-CONTENT-STEERING" => return self.emit_steering(line, value),
            "EXT-X-DATERANGE" => return self.emit_daterange(line, value),
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
    fn emit_uri_attr(&mut self, line: Line<'_>, attrs: &str, kind: Kind) -> Result<(), HlsError> {
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

    /// `#EXT-X-CONTENT-STEERING` is dropped when anything is proxied: every pathway it could
    /// pick between is the proxy, and its server, fetched by the player straight from the
    /// origin's side, could answer with pathways that lead the player away from the proxy. With
    /// `no_proxy` its `SERVER-URI` is only made absolute, like every other URI.
    fn emit_steering(&mut self, line: Line<'_>, attrs: &str) -> Result<(), HlsError> {
        if !self.opts.no_proxy {
            return Ok(());
        }
        self.emit_attrs(line, attrs, &[("SERVER-URI", Edit::Route(Kind::Direct))])
    }

    /// Interstitials (`#EXT-X-DATERANGE` with `X-ASSET-URI` or `X-ASSET-LIST`): the asset is a
    /// playlist and goes through the proxy like any other. The asset list is JSON naming asset
    /// URIs that this rewriter never sees, so proxying it would still send the player to the
    /// origin: the attribute is removed (made absolute with `no_proxy`). The rest of the date
    /// range (ids, times, SCTE-35 data) is kept byte for byte.
    fn emit_daterange(&mut self, line: Line<'_>, attrs: &str) -> Result<(), HlsError> {
        let list = if self.opts.no_proxy {
            Edit::Route(Kind::Direct)
        } else {
            Edit::Remove
        };
        let edits = [
            ("X-ASSET-URI", Edit::Route(Kind::Playlist)),
            ("X-ASSET-LIST", list),
        ];
        self.emit_attrs(line, attrs, &edits)
    }

    /// Writes `line` with the attributes named in `edits` routed or removed, every other byte
    /// kept. Only the first of a repeated routed name is routed (RFC 8216 forbids repeats);
    /// later ones are removed, as is an unquoted one, so no upstream URL is left for the player
    /// to fetch directly. A malformed attribute list is kept as it was, like other tags.
    fn emit_attrs(
        &mut self,
        line: Line<'_>,
        attrs: &str,
        edits: &[(&str, Edit)],
    ) -> Result<(), HlsError> {
        if attr::attrs(attrs).any(|a| a.is_err()) {
            self.verbatim(line);
            return Ok(());
        }
        let list_at = line.text.len() - attrs.len();
        self.out.push_str(&line.text[..list_at]);
        let mut copied = 0; // bytes of `attrs` written (or cut) so far
        let mut routed = [false; 2];
        for a in attr::attrs(attrs).flatten() {
            let Some(i) = edits.iter().position(|(name, _)| *name == a.name) else {
                continue;
            };
            let edit = match edits[i].1 {
                Edit::Route(_) if routed.get(i).copied().unwrap_or(true) || !a.quoted => {
                    Edit::Remove
                }
                other => other,
            };
            match edit {
                Edit::Route(kind) => {
                    if let Some(r) = routed.get_mut(i) {
                        *r = true;
                    }
                    let url = (!a.value.is_empty())
                        .then(|| self.resolve(a.value))
                        .flatten();
                    let Some(url) = url else { continue };
                    let new = self.route(kind, url, line.number)?;
                    self.out.push_str(&attrs[copied..a.value_at]);
                    self.out.push_str(&new);
                    copied = a.value_at + a.value.len();
                }
                Edit::Remove => {
                    let (cut_from, cut_to) = attr_span(attrs, &a);
                    self.out.push_str(&attrs[copied..cut_from.max(copied)]);
                    copied = cut_to.max(copied);
                }
            }
        }
        self.out.push_str(&attrs[copied..]);
        self.out.push_str(line.eol);
        Ok(())
    }

    fn emit_uri(&mut self, line: Line<'_>, uri: &str) -> Result<(), HlsError> {
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

/// The lines of `text` (a taken `pending`), numbered as in the playlist: the first is `from`.
fn numbered(text: &str, from: usize) -> impl Iterator<Item = Line<'_>> {
    let before = from.saturating_sub(1);
    lines(text).map(move |mut line| {
        line.number += before;
        line
    })
}

/// The bytes of `attrs` to cut to remove attribute `a`: from the comma before it to its end, or,
/// for the first attribute, from its name up to the next attribute's name.
fn attr_span(attrs: &str, a: &attr::Attr<'_>) -> (usize, usize) {
    let name_at = a.name.as_ptr() as usize - attrs.as_ptr() as usize;
    let end = a.value_at + a.value.len() + usize::from(a.quoted);
    if let Some(comma) = attrs[..name_at].rfind(',') {
        return (comma, end);
    }
    let rest = &attrs[end..];
    let next = rest.len() - rest.trim_start_matches([' ', ',']).len();
    (name_at, end + next)
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

/// Whether the rewriter may route a URI of tag `name` with attribute list `attrs` (for
/// [`super::count_entries`]): its `URI` attribute, or (with `no_proxy`) the `SERVER-URI` of
/// `EXT-X-CONTENT-STEERING`, or the interstitial asset of an `EXT-X-DATERANGE`. A date range
/// counts only when its text holds `X-ASSET-` (a text match, like the rest of the count): live
/// playlists often carry one per segment for SCTE-35 ad markers, which make no URL.
pub(crate) fn uri_tag(name: &str, attrs: &str) -> bool {
    match name {
        "EXT-X-DATERANGE" => attrs.contains("X-ASSET-"),
        "EXT-X-CONTENT-STEERING" => true,
        _ => tag_uri_kind(name, "").is_some(),
    }
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
fn segment_duration<'t>(mut block: impl Iterator<Item = Line<'t>>) -> Result<f64, HlsError> {
    let Some((line, value)) = block.find_map(|l| match l.kind() {
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
