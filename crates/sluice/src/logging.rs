//! Log filter from `RUST_LOG`: `level` and `target=level` directives, comma-separated.

use tracing_subscriber::filter::Targets;

/// The level used when `RUST_LOG` is unset, empty or invalid.
pub const DEFAULT: &str = "info";

const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Parses a `RUST_LOG` value such as `info` or `warn,sluice::upstream=debug`. Spaces around
/// directives are ignored; an empty value means the default. A directive without `=` must be a
/// level: a bare word would otherwise be read as a target name and silence everything else (so
/// `warning` is an error, not a filter that prints nothing).
pub fn parse_filter(spec: &str) -> Result<Targets, String> {
    let directives: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Ok(default_filter());
    }
    if let Some(bad) = directives
        .iter()
        .find(|d| !d.contains('=') && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(d)))
    {
        return Err(format!(
            "invalid RUST_LOG {spec:?}: {bad:?} is not a level (one of {})",
            LEVELS.join(", ")
        ));
    }
    directives
        .join(",")
        .parse()
        .map_err(|e| format!("invalid RUST_LOG {spec:?}: {e}"))
}

/// The filter for `RUST_LOG` (`None` when unset), or the default and a warning to log.
pub fn filter_from(value: Option<&str>) -> (Targets, Option<String>) {
    match value.map(parse_filter) {
        None => (default_filter(), None),
        Some(Ok(filter)) => (filter, None),
        Some(Err(msg)) => (
            default_filter(),
            Some(format!("{msg}; using \"{DEFAULT}\"")),
        ),
    }
}

fn default_filter() -> Targets {
    DEFAULT.parse().expect("default filter parses")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn bare_level_sets_the_default() {
        let f = parse_filter("debug").unwrap();
        assert!(f.would_enable("anything", &Level::DEBUG));
        assert!(!f.would_enable("anything", &Level::TRACE));
    }

    #[test]
    fn target_directives_override_the_default() {
        let f = parse_filter(" warn , sluice::upstream=trace ").unwrap();
        assert!(f.would_enable("sluice::upstream::connector", &Level::TRACE));
        assert!(!f.would_enable("sluice::server", &Level::INFO));
        assert!(f.would_enable("hyper", &Level::WARN));
    }

    #[test]
    fn empty_or_unset_means_info() {
        for value in [None, Some(""), Some(" , ")] {
            let (f, warning) = filter_from(value);
            assert!(warning.is_none());
            assert!(f.would_enable("sluice", &Level::INFO));
            assert!(!f.would_enable("sluice", &Level::DEBUG));
        }
    }

    #[test]
    fn invalid_value_warns_and_falls_back() {
        let (f, warning) = filter_from(Some("sluice=loud"));
        let warning = warning.unwrap();
        assert!(warning.contains("sluice=loud"), "{warning}");
        assert!(warning.contains("using \"info\""), "{warning}");
        assert!(f.would_enable("sluice", &Level::INFO));
    }

    #[test]
    fn unknown_bare_level_warns_and_keeps_info() {
        for value in ["warning", "verbose", "info,loud"] {
            let (f, warning) = filter_from(Some(value));
            let warning = warning.unwrap();
            assert!(warning.contains("is not a level"), "{warning}");
            assert!(f.would_enable("sluice::server", &Level::INFO), "{value}");
            assert!(f.would_enable("hyper", &Level::WARN), "{value}");
        }
        assert!(filter_from(Some("WARN")).1.is_none());
    }
}
