//! Errors in `SLUICE_<SECTION>_<KEY>` variables, named by the variable instead of by a line of the
//! merged document the user never sees.

use super::Config;

/// One variable as [`super::apply_env`] applied it.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The variable's name (`SLUICE_SERVER_MAX_CONNECTIONS`).
    pub name: String,
    pub section: String,
    pub key: String,
    pub value: toml::Value,
}

/// The first variable that on its own makes the settings unreadable, with what is wrong, when
/// one does: each is laid over `base` (defaults and file) alone and read back. Only runs once
/// the merged settings failed, so its cost is no one's hot path.
pub fn blame(base: &toml::Table, applied: &[Applied]) -> Option<String> {
    applied.iter().find_map(|var| {
        let mut table = base.clone();
        if let Some(toml::Value::Table(section)) = table.get_mut(&var.section) {
            section.insert(var.key.clone(), var.value.clone());
        }
        let text = toml::to_string(&table).ok()?;
        let e = toml::from_str::<Config>(&text).err()?;
        Some(format!(
            "environment variable {} (sets {}.{}): {}",
            var.name,
            var.section,
            var.key,
            plain(&super::redact_values(e.message().trim()))
        ))
    })
}

/// A deserializer's complaint in words a user reads (`invalid type: string (value not shown),
/// expected usize` becomes `not a valid value: expected a whole number`).
fn plain(message: &str) -> String {
    let mut out = match message.split_once("(value not shown), ") {
        Some((_, expected)) => format!("not a valid value: {expected}"),
        None => message.to_string(),
    };
    for (rust, words) in [
        ("usize", "a whole number"),
        ("u64", "a whole number"),
        ("u32", "a whole number"),
        ("u16", "a whole number"),
        ("u8", "a whole number"),
        ("i64", "a whole number"),
        ("i32", "a whole number"),
        ("f64", "a number"),
        ("f32", "a number"),
    ] {
        out = out.replace(&format!("expected {rust}"), &format!("expected {words}"));
    }
    out
}
