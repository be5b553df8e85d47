//! Records the git commit the binary is built from, for `sluice --version`.
//!
//! `SLUICE_GIT_COMMIT` wins (`scripts/dist` sets it; so can a build from a source tarball or inside
//! a container, where there is no `.git`); otherwise `git rev-parse` when the build script runs;
//! otherwise "unknown". A dev build says "dev". HEAD is not watched: that would rebuild the crate
//! on every commit in every profile.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=BUILT_TARGET={target}");
    let commit = match std::env::var("SLUICE_GIT_COMMIT") {
        Ok(c) if !c.is_empty() => c,
        _ if std::env::var("PROFILE").as_deref() == Ok("debug") => "dev".to_string(),
        _ => git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=BUILT_COMMIT={commit}");
}
