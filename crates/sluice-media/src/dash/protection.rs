//! `ContentProtection` descriptors: which DRM system, which key id, which licence URL. No I/O.
//!
//! sluice only decrypts ClearKey with caller-supplied keys; this exists so a handler can tell the
//! caller which KID a protected track needs instead of failing obscurely later.

use super::xml::Element;

/// DRM systems recognised by their scheme URI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrmSystem {
    /// `urn:mpeg:dash:mp4protection:2011`: common encryption, carries the scheme and default KID.
    Cenc,
    ClearKey,
    Widevine,
    PlayReady,
    Other,
}

/// One ContentProtection element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentProtection {
    pub system: DrmSystem,
    pub scheme_id_uri: String,
    /// For mp4protection the scheme (`cenc`, `cbcs`, ...).
    pub value: Option<String>,
    /// `cenc:default_KID` as 32 lowercase hex digits; absent when missing or malformed.
    pub default_kid: Option<String>,
    /// `clearkey:Laurl`, `dashif:Laurl` or PlayReady `ms:laurl`.
    pub license_url: Option<String>,
    /// Base64 `cenc:pssh`, as written.
    pub pssh: Option<String>,
}

const CLEARKEY_IDS: [&str; 2] = [
    "e2719d58-a985-b3c9-781a-b030af78d30e",
    "1077efec-c0b2-4d02-ace3-3c1e52e2fb4b",
];
const WIDEVINE_ID: &str = "edef8ba9-79d6-4ace-a3c8-27dcd51d21ed";
const PLAYREADY_ID: &str = "9a04f079-9840-4286-ab92-e65be0885f95";

pub(crate) fn parse_protection(el: &Element) -> ContentProtection {
    let scheme_id_uri = el.attr("schemeIdUri").unwrap_or("").trim().to_owned();
    let license_url = el
        .children
        .iter()
        .find(|c| c.name.eq_ignore_ascii_case("laurl"))
        .map(|c| c.attr("licenseUrl").unwrap_or(c.text.trim()).to_owned())
        .filter(|u| !u.is_empty());
    ContentProtection {
        system: system_of(&scheme_id_uri),
        value: el.attr("value").map(str::to_owned),
        default_kid: el.attr("default_KID").and_then(normalize_kid),
        license_url,
        pssh: el.child("pssh").map(|p| p.text.trim().to_owned()),
        scheme_id_uri,
    }
}

fn system_of(scheme: &str) -> DrmSystem {
    let lower = scheme.to_ascii_lowercase();
    let uuid = lower.strip_prefix("urn:uuid:").unwrap_or("");
    if lower == "urn:mpeg:dash:mp4protection:2011" {
        DrmSystem::Cenc
    } else if CLEARKEY_IDS.contains(&uuid) {
        DrmSystem::ClearKey
    } else if uuid == WIDEVINE_ID {
        DrmSystem::Widevine
    } else if uuid == PLAYREADY_ID {
        DrmSystem::PlayReady
    } else {
        DrmSystem::Other
    }
}

/// `9eb4050d-e44b-4802-932e-27d75083e266` → `9eb4050de44b4802932e27d75083e266`.
fn normalize_kid(text: &str) -> Option<String> {
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    (hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| hex.to_ascii_lowercase())
}
