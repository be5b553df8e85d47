//! Records the git commit the binary is built from, for `sluice --version`.
//!
//! `SLUICE_GIT_COMMIT` wins (`scripts/dist` sets it; so can a build from a source tarball or inside
//! a container, where there is no `.git`); otherwise `git rev-parse` when the build script runs;
//! otherwise "unknown". A dev build says "dev" and does not watch HEAD (that would rebuild the
//! crate and every test on each commit); an optimised build watches HEAD and the branch it names,
//! so its stamp follows new commits and merges.

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
        _ => {
            watch_head();
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
        }
    };
    println!("cargo:rustc-env=BUILT_COMMIT={commit}");
}

/// Reruns this script when HEAD moves: HEAD itself (a checkout), the branch's ref (a commit or a
/// merge) and `packed-refs` (a ref packed by `git gc`). Nothing when there is no repository.
fn watch_head() {
    let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) else {
        return;
    };
    let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
        .unwrap_or_else(|| git_dir.clone());
    let mut files = vec![format!("{git_dir}/HEAD"), format!("{common}/packed-refs")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        files.push(format!("{common}/{branch}"));
    }
    // Only files that exist: cargo reruns a script on every build while a watched path is missing.
    for file in files.iter().filter(|f| std::path::Path::new(f).exists()) {
        println!("cargo:rerun-if-changed={file}");
    }
}
