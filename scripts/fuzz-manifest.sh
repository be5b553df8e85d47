#!/usr/bin/env bash
# Regenerates crates/<crate>/fuzz/Cargo.toml with one [[bin]] per file in fuzz_targets/.
# Usage: scripts/fuzz-manifest.sh [sluice-media|sluice-http]   (default sluice-media)
set -euo pipefail
crate=${1:-sluice-media}
case "$crate" in
  sluice-media) deps=$'url = "2"\nbytes = "1"\nhttp = "1"' ;;
  sluice-http) deps='http = "1"' ;;
  *) echo "usage: $0 [sluice-media|sluice-http]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../crates/$crate/fuzz"
{
  cat <<HEAD
[package]
name = "$crate-fuzz"
version = "0.0.0"
publish = false
edition = "2021"

[package.metadata]
cargo-fuzz = true

[dependencies]
libfuzzer-sys = "0.4"
$deps
$crate = { path = ".." }

# Its own workspace, so the main workspace build never compiles the fuzz crate (cargo fuzz builds it).
[workspace]
HEAD
  for f in fuzz_targets/*.rs; do
    name=$(basename "$f" .rs)
    printf '\n[[bin]]\nname = "%s"\npath = "%s"\ntest = false\ndoc = false\nbench = false\n' "$name" "$f"
  done
} > Cargo.toml
