//! MediaFlow Proxy's environment variables read as sluice's own, so sluice's container image is a
//! drop-in for MediaFlow's (and MediaFlow Proxy Light's): a compose file keeps its `environment:`
//! block and changes only the image name.
//!
//! On only when `SLUICE_ENV_COMPAT=mediaflow` (the image sets it). Each MediaFlow variable becomes
//! the `SLUICE_*` variable (or `RUST_LOG`) that means the same, unless that one is set already:
//!
//! | MediaFlow (Light)                                   | sluice                                  |
//! |-----------------------------------------------------|-----------------------------------------|
//! | `API_PASSWORD` (`APP__AUTH__API_PASSWORD`)          | `SLUICE_AUTH_API_PASSWORD`              |
//! | `PORT`, `HOST` (`APP__SERVER__PORT`, `..._HOST`)    | `SLUICE_SERVER_LISTEN` = `HOST:PORT`    |
//! | `LOG_LEVEL` (`APP__LOG_LEVEL`)                      | `RUST_LOG`                              |
//! | `PROXY_URL`, `ALL_PROXY`, `TRANSPORT_ROUTES`        | `SLUICE_UPSTREAM_PROXY_URL`, `..._ALL_PROXY`, `..._TRANSPORT_ROUTES` |
//! | `DISABLE_SSL_VERIFICATION_GLOBALLY` (`APP__PROXY__*`)| `SLUICE_UPSTREAM_INSECURE_HOSTS=all`  |
//! | `HLS_PREBUFFER_SEGMENTS`, `ENABLE_HLS_PREBUFFER`    | `SLUICE_MEDIA_PREBUFFER_SEGMENTS`       |
//! | (`APP__HLS__PREBUFFER_SEGMENTS`)                    |                                         |
//!
//! No I/O in [`translate`]; [`apply`] reads and writes the process environment.

use std::collections::BTreeMap;

/// The switch, and its one value.
pub const SWITCH: &str = "SLUICE_ENV_COMPAT";

/// What the translation sets, and what it has to say about the input.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// Variables to set (none of them set before).
    pub set: Vec<(String, String)>,
    /// Warnings for the log: values that could not be read, and their consequences.
    pub notes: Vec<String>,
}

/// The sluice variables MediaFlow's variables in `env` stand for.
pub fn translate(env: &[(String, String)]) -> Translation {
    let vars: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // The Python image's name first, then Light's.
    let get = |python: &str, light: &str| -> Option<&str> {
        vars.get(python)
            .or_else(|| vars.get(light))
            .copied()
            .filter(|v| !v.trim().is_empty())
    };
    let mut out = Translation::default();
    let set = |key: &str, value: String, out: &mut Translation| {
        if !vars.contains_key(key) {
            out.set.push((key.to_string(), value));
        }
    };
    if let Some(pw) = get("API_PASSWORD", "APP__AUTH__API_PASSWORD") {
        set("SLUICE_AUTH_API_PASSWORD", pw.to_string(), &mut out);
    }
    let port = get("PORT", "APP__SERVER__PORT");
    let host = get("HOST", "APP__SERVER__HOST");
    if port.is_some() || host.is_some() {
        let port = port.unwrap_or("8888").trim();
        let host = host.unwrap_or("0.0.0.0").trim();
        match port.parse::<u16>() {
            Ok(port) => {
                let listen = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                set("SLUICE_SERVER_LISTEN", listen, &mut out);
            }
            Err(_) => out
                .notes
                .push(format!("PORT {port:?} is not a port number; ignored")),
        }
    }
    if let Some(level) = get("LOG_LEVEL", "APP__LOG_LEVEL") {
        match log_level(level) {
            Some(l) => set("RUST_LOG", l.to_string(), &mut out),
            None => out
                .notes
                .push(format!("LOG_LEVEL {level:?} is not a level; ignored")),
        }
    }
    // The HLS prebuffer: how many segments, or off.
    let prebuffer = get("HLS_PREBUFFER_SEGMENTS", "APP__HLS__PREBUFFER_SEGMENTS");
    let enabled = get("ENABLE_HLS_PREBUFFER", "APP__HLS__ENABLE_PREBUFFER");
    if enabled.is_some_and(|v| !truthy(Some(v))) {
        set("SLUICE_MEDIA_PREBUFFER_SEGMENTS", "0".to_string(), &mut out);
    } else if let Some(n) = prebuffer {
        match n.trim().parse::<usize>() {
            Ok(n) => set("SLUICE_MEDIA_PREBUFFER_SEGMENTS", n.to_string(), &mut out),
            Err(_) => out.notes.push(format!(
                "HLS_PREBUFFER_SEGMENTS {n:?} is not a number; ignored"
            )),
        }
    }
    for (key, value) in routes(&get) {
        set(key, value, &mut out);
    }
    out
}

/// MediaFlow's (Python logging) level names as `RUST_LOG` levels.
fn log_level(level: &str) -> Option<&'static str> {
    Some(match level.trim().to_ascii_lowercase().as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warning" | "warn" => "warn",
        "error" | "critical" | "fatal" => "error",
        _ => return None,
    })
}

fn truthy(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// MediaFlow's outgoing proxy variables as `[upstream]`'s keys of the same names
/// (`upstream::transport_routes` reads them into the route table; a `TRANSPORT_ROUTES` that is
/// not a JSON object stops the start with a clear error rather than sending its hosts direct).
/// `DISABLE_SSL_VERIFICATION_GLOBALLY` is `insecure_hosts = ["all"]`.
fn routes<'a>(get: &impl Fn(&str, &str) -> Option<&'a str>) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(url) = get("PROXY_URL", "APP__PROXY__PROXY_URL") {
        out.push(("SLUICE_UPSTREAM_PROXY_URL", url.trim().to_string()));
    }
    if let Some(all) = get("ALL_PROXY", "APP__PROXY__ALL_PROXY") {
        out.push(("SLUICE_UPSTREAM_ALL_PROXY", truthy(Some(all)).to_string()));
    }
    if let Some(json) = get("TRANSPORT_ROUTES", "APP__PROXY__TRANSPORT_ROUTES") {
        out.push(("SLUICE_UPSTREAM_TRANSPORT_ROUTES", json.to_string()));
    }
    let no_verify = get(
        "DISABLE_SSL_VERIFICATION_GLOBALLY",
        "APP__PROXY__DISABLE_SSL_VERIFICATION_GLOBALLY",
    );
    if truthy(no_verify) {
        out.push(("SLUICE_UPSTREAM_INSECURE_HOSTS", "all".to_string()));
    }
    out
}

/// With the switch on, sets the translated variables in this process's environment (so a live
/// reload, which reads the environment again, sees them too) and removes the switch. Call from
/// `main` before any thread starts; returns the notes to log once logging is up.
pub fn apply() -> Vec<String> {
    let Some(switch) = std::env::var_os(SWITCH) else {
        return Vec::new();
    };
    std::env::remove_var(SWITCH);
    if switch != "mediaflow" {
        return vec![format!(
            "{SWITCH}={}: the only value is \"mediaflow\"; ignored",
            switch.to_string_lossy()
        )];
    }
    let env: Vec<(String, String)> = std::env::vars().collect();
    let t = translate(&env);
    for (k, v) in &t.set {
        std::env::set_var(k, v);
    }
    t.notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn set(t: &Translation, key: &str) -> Option<String> {
        t.set.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_python_images_variables() {
        let t = translate(&env(&[
            ("API_PASSWORD", "secret"),
            ("PORT", "9000"),
            ("LOG_LEVEL", "WARNING"),
            ("PROXY_URL", "socks5://tor:9050"),
            ("ALL_PROXY", "true"),
        ]));
        assert_eq!(set(&t, "SLUICE_AUTH_API_PASSWORD").unwrap(), "secret");
        assert_eq!(set(&t, "SLUICE_SERVER_LISTEN").unwrap(), "0.0.0.0:9000");
        assert_eq!(set(&t, "RUST_LOG").unwrap(), "warn");
        assert_eq!(
            set(&t, "SLUICE_UPSTREAM_PROXY_URL").unwrap(),
            "socks5://tor:9050"
        );
        assert_eq!(set(&t, "SLUICE_UPSTREAM_ALL_PROXY").unwrap(), "true");
        assert!(t.notes.is_empty());
    }

    #[test]
    fn lights_spellings_and_sluices_own_win() {
        let t = translate(&env(&[
            ("APP__AUTH__API_PASSWORD", "light"),
            ("APP__SERVER__HOST", "::"),
            ("APP__SERVER__PORT", "8080"),
            ("SLUICE_AUTH_API_PASSWORD", "own"),
        ]));
        assert_eq!(set(&t, "SLUICE_AUTH_API_PASSWORD"), None);
        assert_eq!(set(&t, "SLUICE_SERVER_LISTEN").unwrap(), "[::]:8080");
    }

    #[test]
    fn transport_routes_go_to_upstream_as_written() {
        let json = r#"{"all://*.streaming.com": {"proxy": true}}"#;
        let t = translate(&env(&[
            ("APP__PROXY__PROXY_URL", " http://corp:3128 "),
            ("APP__PROXY__ALL_PROXY", "yes"),
            ("APP__PROXY__TRANSPORT_ROUTES", json),
            ("DISABLE_SSL_VERIFICATION_GLOBALLY", "1"),
        ]));
        assert_eq!(
            t.set,
            vec![
                (
                    "SLUICE_UPSTREAM_PROXY_URL".into(),
                    "http://corp:3128".into()
                ),
                ("SLUICE_UPSTREAM_ALL_PROXY".into(), "true".into()),
                ("SLUICE_UPSTREAM_TRANSPORT_ROUTES".into(), json.into()),
                ("SLUICE_UPSTREAM_INSECURE_HOSTS".into(), "all".into()),
            ]
        );
    }

    #[test]
    fn prebuffer() {
        let t = translate(&env(&[("APP__HLS__PREBUFFER_SEGMENTS", "5")]));
        assert_eq!(set(&t, "SLUICE_MEDIA_PREBUFFER_SEGMENTS").unwrap(), "5");
        let t = translate(&env(&[
            ("HLS_PREBUFFER_SEGMENTS", "5"),
            ("ENABLE_HLS_PREBUFFER", "false"),
        ]));
        assert_eq!(set(&t, "SLUICE_MEDIA_PREBUFFER_SEGMENTS").unwrap(), "0");
    }

    #[test]
    fn bad_values_are_noted_not_applied() {
        let t = translate(&env(&[("PORT", "eighty"), ("LOG_LEVEL", "loud")]));
        assert!(t.set.is_empty());
        assert_eq!(t.notes.len(), 2, "{:?}", t.notes);
    }

    #[test]
    fn nothing_set_nothing_translated() {
        assert_eq!(
            translate(&env(&[("HOME", "/root")])),
            Translation::default()
        );
    }
}
