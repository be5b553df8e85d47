//! Splits playlist text into lines (keeping each line's own terminator) and classifies them.

/// One line of a playlist: its text without terminator, and the terminator itself
/// (`"\n"`, `"\r\n"` or `""` for a last line without one), so output can reuse it unchanged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Line<'a> {
    /// 1-based, for error messages.
    pub number: usize,
    pub text: &'a str,
    pub eol: &'a str,
    /// Classified once here: the skip path looks at a buffered line's kind several times.
    kind: LineKind<'a>,
}

/// What a line is, as far as HLS cares.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LineKind<'a> {
    /// `#EXT...` tag: name without `#`, and the part after the first `:` (empty if none).
    Tag { name: &'a str, value: &'a str },
    /// A URI line, surrounding whitespace trimmed.
    Uri(&'a str),
    /// Comment (`#` not followed by `EXT`) or blank line: passed through untouched.
    Other,
}

/// Iterator over the lines of `text`; linear, never allocates.
pub(crate) struct Lines<'a> {
    rest: &'a str,
    number: usize,
}

pub(crate) fn lines(text: &str) -> Lines<'_> {
    Lines {
        rest: text,
        number: 0,
    }
}

impl<'a> Iterator for Lines<'a> {
    type Item = Line<'a>;

    fn next(&mut self) -> Option<Line<'a>> {
        if self.rest.is_empty() {
            return None;
        }
        self.number += 1;
        let (with_eol, rest) = match memchr::memchr(b'\n', self.rest.as_bytes()) {
            Some(i) => self.rest.split_at(i + 1),
            None => (self.rest, ""),
        };
        self.rest = rest;
        let body_len = if with_eol.ends_with("\r\n") {
            with_eol.len() - 2
        } else if with_eol.ends_with('\n') {
            with_eol.len() - 1
        } else {
            with_eol.len()
        };
        let (text, eol) = with_eol.split_at(body_len);
        Some(Line {
            number: self.number,
            text,
            eol,
            kind: classify(text),
        })
    }
}

impl<'a> Line<'a> {
    pub fn kind(&self) -> LineKind<'a> {
        self.kind
    }
}

pub(crate) fn classify(text: &str) -> LineKind<'_> {
    if let Some(tag) = text.strip_prefix('#') {
        if !tag.starts_with("EXT") {
            return LineKind::Other;
        }
        let (name, value) = tag.split_once(':').unwrap_or((tag, ""));
        return LineKind::Tag {
            name: name.trim_end(),
            value,
        };
    }
    let uri = text.trim();
    if uri.is_empty() {
        LineKind::Other
    } else {
        LineKind::Uri(uri)
    }
}
