//! Player options read from `#EXTVLCOPT`, `#EXTHTTP` and `#KODIPROP` lines, gathered for the next
//! entry URL: request headers, ClearKey keys, the manifest type. No I/O.

use crate::keys::KeyRing;
use crate::query::is_forbidden_header;

/// Options gathered for the next entry URL.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Options {
    /// Request headers, lower-case names, in order of appearance, one value each.
    pub(super) headers: Vec<(String, String)>,
    license_type: Option<String>,
    license_key: Option<String>,
    pub(super) manifest_type: Option<String>,
}

/// Most request headers one entry carries; names past it are ignored. A real entry has a handful
/// (a user agent, a referer, a cookie); each name is looked up among those kept, so without a
/// bound one 8 MiB `stream_headers=a&b&...` line would cost about 10^12 comparisons.
pub(super) const MAX_HEADERS: usize = 64;

/// Longest option (after its `#EXTVLCOPT:`, `#EXTHTTP:` or `#KODIPROP:`) that is applied; a longer
/// one is skipped. Real ones are a header or a few ClearKey pairs; each option becomes part of an
/// entry's proxy link.
pub(super) const MAX_OPTION_LINE: usize = 8 * 1024;

/// The `#KODIPROP` properties sluice turns into parameters.
const KODI_PARAMETERS: &[&str] = &[
    "inputstream.adaptive.license_key",
    "inputstream.adaptive.license_type",
    "inputstream.adaptive.manifest_type",
    "inputstream.adaptive.stream_headers",
    "inputstream.adaptive.manifest_headers",
];

/// VLC `http-*` options that are behaviour switches or credentials, not request headers.
const VLC_NOT_HEADERS: &[&str] = &[
    "reconnect",
    "continuous",
    "forward-cookies",
    "proxy",
    "proxy-pwd",
    "user",
    "password",
];

impl Options {
    fn set_header(&mut self, name: &str, value: &str) {
        let name = name.trim().to_ascii_lowercase();
        let name = if name == "referrer" {
            "referer".to_string()
        } else {
            name
        };
        let value = value.trim();
        let valid_name = !name.is_empty() && name.bytes().all(is_tchar);
        let valid_value = value.chars().all(|c| c == '\t' || !c.is_control());
        if !valid_name || !valid_value || is_forbidden_header(&name) {
            return;
        }
        let full = self.headers.len() >= MAX_HEADERS;
        match self.headers.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = value.to_string(),
            None if !full => self.headers.push((name, value.to_string())),
            None => {}
        }
    }

    /// `#EXTVLCOPT:http-user-agent=...`, `http-referrer=...`, `http-header=Name: value`.
    pub(super) fn vlc(&mut self, opt: &str) {
        if opt.len() > MAX_OPTION_LINE {
            return;
        }
        let Some((key, value)) = opt.split_once('=') else {
            return;
        };
        let key = key.trim().to_ascii_lowercase();
        if key == "http-header" {
            if let Some((name, value)) = value.split_once(':') {
                self.set_header(name, value);
            }
        } else if let Some(name) = key.strip_prefix("http-") {
            if !VLC_NOT_HEADERS.contains(&name) {
                self.set_header(name, value);
            }
        }
    }

    /// `#EXTHTTP:{"User-Agent": "..."}` replaces the headers gathered so far, as in MediaFlow.
    pub(super) fn http_json(&mut self, json: &str) {
        if json.len() > MAX_OPTION_LINE {
            return;
        }
        self.headers.clear();
        let Ok(serde_json::Value::Object(map)) = serde_json::from_str(json.trim()) else {
            return;
        };
        for (name, value) in map {
            match value {
                serde_json::Value::String(s) => self.set_header(&name, &s),
                serde_json::Value::Number(n) => self.set_header(&name, &n.to_string()),
                serde_json::Value::Bool(b) => self.set_header(&name, &b.to_string()),
                _ => {}
            }
        }
    }

    /// `#KODIPROP:inputstream.adaptive.*`. Returns whether the property is one sluice turns into
    /// parameters (so a proxied entry leaves it out: the player must not apply it a second time).
    /// One over [`MAX_OPTION_LINE`] is still left out, but not applied.
    pub(super) fn kodi(&mut self, prop: &str) -> bool {
        let Some((key, value)) = prop.split_once('=') else {
            return false;
        };
        let key = key.trim().to_ascii_lowercase();
        if !KODI_PARAMETERS.contains(&key.as_str()) {
            return false;
        }
        if prop.len() > MAX_OPTION_LINE {
            return true;
        }
        let value = value.trim();
        match key.as_str() {
            "inputstream.adaptive.license_key" => self.license_key = Some(value.to_string()),
            "inputstream.adaptive.license_type" => {
                self.license_type = Some(value.to_ascii_lowercase())
            }
            "inputstream.adaptive.manifest_type" => {
                self.manifest_type = Some(value.to_ascii_lowercase())
            }
            "inputstream.adaptive.stream_headers" | "inputstream.adaptive.manifest_headers" => {
                for (name, value) in url::form_urlencoded::parse(value.as_bytes()) {
                    self.set_header(&name, &value);
                }
            }
            _ => return false,
        }
        true
    }

    /// ClearKey pairs from `license_key=kid:key[,kid:key]`, when the licence is ClearKey.
    pub(super) fn clearkey(&self) -> Option<(String, String)> {
        let clear = match self.license_type.as_deref() {
            None => true,
            Some(t) => t == "clearkey" || t == "org.w3.clearkey",
        };
        let key = self.license_key.as_deref().filter(|_| clear)?;
        KeyRing::parse(None, key).ok()?;
        let (ids, keys): (Vec<&str>, Vec<&str>) = key
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.split_once(':'))
            .unzip();
        Some((ids.join(","), keys.join(",")))
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
