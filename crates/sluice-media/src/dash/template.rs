//! SegmentTemplate URL templates: `$Number$`, `$Time$`, `$RepresentationID$`, `$Bandwidth$`, `$$`
//! and printf-style widths such as `$Number%05d$`. No I/O.

use super::{shorten, DashError};

/// Widest `%0Nd` accepted; anything wider is a hostile template, not a real one.
const MAX_WIDTH: usize = 32;

/// Values substituted into a template for one segment.
#[derive(Debug, Clone, Copy)]
pub struct TemplateVars<'a> {
    pub representation_id: &'a str,
    pub bandwidth: u64,
    pub number: u64,
    pub time: u64,
}

/// A template split once into literal text and identifiers, so each segment URL is one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    RepresentationId,
    Number(Format),
    Bandwidth(Format),
    Time(Format),
    SubNumber(Format),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Format {
    width: usize,
    radix: Radix,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Radix {
    #[default]
    Decimal,
    Octal,
    LowerHex,
    UpperHex,
}

impl Template {
    /// Splits a template; unknown identifiers, bad formats and an unpaired `$` are errors.
    pub fn parse(text: &str) -> Result<Self, DashError> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(open) = rest.find('$') {
            literal.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let close = after.find('$').ok_or_else(|| bad(text, "unpaired '$'"))?;
            let ident = &after[..close];
            rest = &after[close + 1..];
            if ident.is_empty() {
                literal.push('$'); // `$$` is an escaped dollar
                continue;
            }
            if !literal.is_empty() {
                pieces.push(Piece::Literal(std::mem::take(&mut literal)));
            }
            pieces.push(parse_identifier(text, ident)?);
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        Ok(Template { pieces })
    }

    /// Whether `$Number$` appears, which decides how a timeline numbers its segments.
    pub fn uses_number(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::Number(_)))
    }

    pub fn render(&self, vars: &TemplateVars<'_>) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Literal(text) => out.push_str(text),
                Piece::RepresentationId => out.push_str(vars.representation_id),
                Piece::Number(f) => f.write(&mut out, vars.number),
                Piece::Bandwidth(f) => f.write(&mut out, vars.bandwidth),
                Piece::Time(f) => f.write(&mut out, vars.time),
                // Sub-segments are not addressed separately; the first one stands for the segment.
                Piece::SubNumber(f) => f.write(&mut out, 1),
            }
        }
        out
    }
}

fn parse_identifier(template: &str, ident: &str) -> Result<Piece, DashError> {
    let (name, format) = match ident.split_once('%') {
        Some((name, spec)) => (name, Some(parse_format(template, spec)?)),
        None => (ident, None),
    };
    let format = format.unwrap_or_default();
    Ok(match name {
        "RepresentationID" if format == Format::default() => Piece::RepresentationId,
        "Number" => Piece::Number(format),
        "Bandwidth" => Piece::Bandwidth(format),
        "Time" => Piece::Time(format),
        "SubNumber" => Piece::SubNumber(format),
        _ => return Err(bad(template, "unknown identifier")),
    })
}

/// `05d` → width 5, decimal. The leading `0` is optional in practice (`%5d` pads with zeros too,
/// which is what packagers that write it expect).
fn parse_format(template: &str, spec: &str) -> Result<Format, DashError> {
    // The conversion is the last character, not the last byte: a spec ending in `é` would be
    // split inside it.
    let last = spec.char_indices().last().map_or(0, |(at, _)| at);
    let (digits, conversion) = spec.split_at(last);
    let radix = match conversion {
        "d" | "i" | "u" => Radix::Decimal,
        "o" => Radix::Octal,
        "x" => Radix::LowerHex,
        "X" => Radix::UpperHex,
        _ => return Err(bad(template, "unsupported format")),
    };
    let width = if digits.is_empty() {
        0
    } else {
        digits
            .parse::<usize>()
            .ok()
            .filter(|w| digits.bytes().all(|b| b.is_ascii_digit()) && *w <= MAX_WIDTH)
            .ok_or_else(|| bad(template, "bad width"))?
    };
    Ok(Format { width, radix })
}

impl Format {
    fn write(&self, out: &mut String, value: u64) {
        let w = self.width;
        let text = match self.radix {
            Radix::Decimal => format!("{value:0w$}"),
            Radix::Octal => format!("{value:0w$o}"),
            Radix::LowerHex => format!("{value:0w$x}"),
            Radix::UpperHex => format!("{value:0w$X}"),
        };
        out.push_str(&text);
    }
}

fn bad(template: &str, why: &'static str) -> DashError {
    DashError::Template {
        template: shorten(template),
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(text: &str) -> Result<String, DashError> {
        let vars = TemplateVars {
            representation_id: "v1",
            bandwidth: 800_000,
            number: 42,
            time: 90_000,
        };
        Template::parse(text).map(|t| t.render(&vars))
    }

    #[test]
    fn identifiers_and_widths() {
        assert_eq!(
            render("$RepresentationID$/seg-$Number%05d$.m4s").unwrap(),
            "v1/seg-00042.m4s"
        );
        assert_eq!(
            render("t$Time$_b$Bandwidth$.m4s").unwrap(),
            "t90000_b800000.m4s"
        );
        assert_eq!(render("a$$b$Number$").unwrap(), "a$b42");
        assert_eq!(render("$Number%3d$").unwrap(), "042");
        assert_eq!(render("$Number%x$").unwrap(), "2a");
        assert_eq!(render("$Number%012d$").unwrap(), "000000000042");
        assert_eq!(render("plain.mp4").unwrap(), "plain.mp4");
    }

    #[test]
    fn bad_templates() {
        for bad in [
            "$Number",
            "$Foo$",
            "$Number%05s$",
            "$Number%999999d$",
            "$RepresentationID%05d$",
            "$Number%-5d$",
        ] {
            assert!(render(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_format_ending_in_a_wide_character_is_unsupported() {
        for text in [
            "s$Number%5é$.m4s",
            "$Time%é$",
            "$Number%é5d$",
            "$Number%05d€$",
        ] {
            match Template::parse(text) {
                Err(DashError::Template { why, .. }) => {
                    assert!(
                        why == "unsupported format" || why == "bad width",
                        "{text}: {why}"
                    )
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(
            Template::parse("s$Number%5é$.m4s"),
            Err(DashError::Template {
                why: "unsupported format",
                ..
            })
        ));
        // Wide characters outside the format stay literal text.
        assert_eq!(render("é/$Number%03d$-ü.m4s").unwrap(), "é/042-ü.m4s");
    }
}
