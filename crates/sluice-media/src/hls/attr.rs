//! HLS attribute lists (`NAME=value,NAME="quoted, with commas"`), parsed in place without allocating.

/// One `NAME=value` pair. `value` excludes the quotes of a quoted string; `value_at` is the
/// byte offset of `value` inside the attribute list, so a caller can splice a new value in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Attr<'a> {
    pub name: &'a str,
    pub value: &'a str,
    pub value_at: usize,
    pub quoted: bool,
}

/// The attribute list is broken (no `=`, empty name, unterminated quote, junk after a quote).
/// Callers keep such a line as it is rather than guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed;

pub(crate) struct Attrs<'a> {
    list: &'a str,
    pos: usize,
    failed: bool,
}

pub(crate) fn attrs(list: &str) -> Attrs<'_> {
    Attrs {
        list,
        pos: 0,
        failed: false,
    }
}

/// First attribute called `name` (names are case-sensitive per RFC 8216).
pub(crate) fn find<'a>(list: &'a str, name: &str) -> Result<Option<Attr<'a>>, Malformed> {
    for attr in attrs(list) {
        let attr = attr?;
        if attr.name == name {
            return Ok(Some(attr));
        }
    }
    Ok(None)
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let bytes = self.list.as_bytes();
        // Tolerate stray whitespace and empty items (",,") that some packagers emit.
        while self.pos < bytes.len() && (bytes[self.pos] == b',' || bytes[self.pos] == b' ') {
            self.pos += 1;
        }
        if self.pos >= bytes.len() {
            return None;
        }
        let item = self.parse_one();
        if item.is_err() {
            self.failed = true;
        }
        Some(item)
    }
}

impl<'a> Attrs<'a> {
    fn parse_one(&mut self) -> Result<Attr<'a>, Malformed> {
        let list = self.list;
        let bytes = list.as_bytes();
        let start = self.pos;
        let eq = start
            + memchr::memchr2(b'=', b',', &bytes[start..])
                .filter(|&i| bytes[start + i] == b'=')
                .ok_or(Malformed)?;
        let name = list[start..eq].trim();
        if name.is_empty() || name.contains('"') {
            return Err(Malformed);
        }
        let value_start = eq + 1;
        if bytes.get(value_start) == Some(&b'"') {
            let open = value_start + 1;
            let close = open + memchr::memchr(b'"', &bytes[open..]).ok_or(Malformed)?;
            let mut after = close + 1;
            while after < bytes.len() && bytes[after] == b' ' {
                after += 1;
            }
            if after < bytes.len() && bytes[after] != b',' {
                return Err(Malformed);
            }
            self.pos = after;
            return Ok(Attr {
                name,
                value: &list[open..close],
                value_at: open,
                quoted: true,
            });
        }
        let end = value_start
            + memchr::memchr(b',', &bytes[value_start..]).unwrap_or(bytes.len() - value_start);
        let raw = &list[value_start..end];
        if raw.contains('"') {
            return Err(Malformed);
        }
        self.pos = end;
        Ok(Attr {
            name,
            value: raw.trim_end(),
            value_at: value_start,
            quoted: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(list: &str) -> Result<Vec<(&str, &str, bool)>, Malformed> {
        attrs(list)
            .map(|a| a.map(|a| (a.name, a.value, a.quoted)))
            .collect()
    }

    #[test]
    fn quoted_values_may_hold_commas() {
        let got = all(r#"BANDWIDTH=1280000,CODECS="avc1.4d401f,mp4a.40.2",RESOLUTION=1280x720"#);
        assert_eq!(
            got.unwrap(),
            vec![
                ("BANDWIDTH", "1280000", false),
                ("CODECS", "avc1.4d401f,mp4a.40.2", true),
                ("RESOLUTION", "1280x720", false),
            ]
        );
    }

    #[test]
    fn value_at_points_inside_the_quotes() {
        let list = r#"METHOD=AES-128,URI="k.bin",IV=0x1"#;
        let uri = find(list, "URI").unwrap().unwrap();
        assert_eq!(&list[uri.value_at..uri.value_at + uri.value.len()], "k.bin");
    }

    #[test]
    fn broken_lists_are_malformed() {
        assert_eq!(all(r#"URI="never closed"#), Err(Malformed));
        assert_eq!(all(r#"URI="a"junk"#), Err(Malformed));
        assert_eq!(all("NOEQUALS"), Err(Malformed));
        assert_eq!(all("=x"), Err(Malformed));
        assert_eq!(all("A,B=1"), Err(Malformed));
    }

    #[test]
    fn empty_and_sloppy_lists() {
        assert_eq!(all("").unwrap(), vec![]);
        assert_eq!(
            all("A=1,,B=2, ").unwrap(),
            vec![("A", "1", false), ("B", "2", false)]
        );
        assert_eq!(all("A=").unwrap(), vec![("A", "", false)]);
    }
}
