//! A small, bounded element tree built from quick-xml events. No I/O.
//!
//! MPD parsing walks this tree instead of the event stream because inheritance (BaseURL, segment
//! templates, content protection) needs parents and children at the same time. The builder caps depth
//! and element count so hostile input costs bounded memory, and it never expands DTD entities:
//! a DOCTYPE is skipped and a reference to an entity it declares is a parse error.

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use super::DashError;

/// Deepest element nesting accepted; real MPDs stay below 10.
pub(crate) const MAX_DEPTH: usize = 64;
/// Most elements accepted in one document.
pub(crate) const MAX_ELEMENTS: usize = 200_000;
/// Most attributes accepted on one element; real MPD elements carry under 30.
pub(crate) const MAX_ATTRIBUTES: usize = 256;

/// One element: local name (namespace prefix dropped), attributes by local name, children, text.
#[derive(Debug, Default)]
pub(crate) struct Element {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub children: Vec<Element>,
    pub text: String,
}

impl Element {
    /// Attribute by local name (`cenc:default_KID` is found as `default_KID`).
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Children with this local name, in document order.
    pub fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// First child with this local name.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }
}

/// Parses a whole document into its root element.
pub(crate) fn parse_tree(xml: &str) -> Result<Element, DashError> {
    let mut reader = Reader::from_str(xml);
    reader.config_mut().trim_text(true);
    // Open elements; the last one receives children and text.
    let mut stack: Vec<Element> = Vec::new();
    let mut count = 0usize;
    loop {
        let event = reader.read_event().map_err(xml_error)?;
        match event {
            Event::Start(start) => {
                count = bump(count)?;
                if stack.len() >= MAX_DEPTH {
                    return Err(DashError::TooDeep(MAX_DEPTH));
                }
                stack.push(element(&start)?);
            }
            Event::Empty(start) => {
                count = bump(count)?;
                let el = element(&start)?;
                if let Some(done) = attach(&mut stack, el) {
                    return Ok(done);
                }
            }
            Event::End(_) => {
                let el = stack.pop().ok_or_else(|| xml_msg("unbalanced end tag"))?;
                if let Some(done) = attach(&mut stack, el) {
                    return Ok(done);
                }
            }
            Event::Text(text) => {
                let text = text.unescape().map_err(xml_error)?;
                push_text(&mut stack, &text);
            }
            Event::CData(data) => {
                let text = std::str::from_utf8(&data).map_err(|_| xml_msg("CDATA is not UTF-8"))?;
                push_text(&mut stack, text);
            }
            // DTDs are skipped whole: no entity is ever defined, so none can be expanded.
            Event::DocType(_) | Event::Decl(_) | Event::PI(_) | Event::Comment(_) => {}
            Event::Eof => return Err(xml_msg("document ended before the root element closed")),
        }
    }
}

/// Adds a finished element to its parent, or returns it when it was the root.
fn attach(stack: &mut [Element], el: Element) -> Option<Element> {
    match stack.last_mut() {
        Some(parent) => {
            parent.children.push(el);
            None
        }
        None => Some(el),
    }
}

fn push_text(stack: &mut [Element], text: &str) {
    if let Some(open) = stack.last_mut() {
        open.text.push_str(text);
    }
}

fn bump(count: usize) -> Result<usize, DashError> {
    if count >= MAX_ELEMENTS {
        return Err(DashError::TooManyElements(MAX_ELEMENTS));
    }
    Ok(count + 1)
}

fn element(start: &BytesStart<'_>) -> Result<Element, DashError> {
    let name = utf8(start.local_name().as_ref())?;
    let mut attrs = Vec::new();
    for attr in start.attributes() {
        // quick-xml checks each attribute against all before it for duplicates, and lookups
        // here scan the list: both linear per attribute, so the count is capped.
        if attrs.len() == MAX_ATTRIBUTES {
            return Err(DashError::TooManyAttributes(MAX_ATTRIBUTES));
        }
        let attr = attr.map_err(|e| xml_msg(&e.to_string()))?;
        let key = utf8(attr.key.local_name().as_ref())?;
        let value = attr.unescape_value().map_err(xml_error)?.into_owned();
        attrs.push((key, value));
    }
    Ok(Element {
        name,
        attrs,
        ..Element::default()
    })
}

fn utf8(bytes: &[u8]) -> Result<String, DashError> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| xml_msg("name is not UTF-8"))
}

fn xml_error(e: quick_xml::Error) -> DashError {
    DashError::Xml(e.to_string())
}

fn xml_msg(msg: &str) -> DashError {
    DashError::Xml(msg.to_owned())
}
