//! HLS master playlist from an MPD: one audio rendition per language, one variant per video height.
//! No I/O; the caller decides what the playlist URLs look like.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use super::mpd::{ContentKind, Mpd, Representation};
use super::DashError;

/// Most audio languages listed; players probe every rendition, so more only slows start-up.
pub const MAX_AUDIO_LANGUAGES: usize = 4;
/// Most video variants listed, for the same reason.
pub const MAX_VIDEO_VARIANTS: usize = 5;

/// Variant selection (`resolution` and `max_res` query parameters).
#[derive(Debug, Clone, Default)]
pub struct MasterOptions {
    /// Keep one height: the highest at or below this, else the lowest available.
    pub resolution: Option<u32>,
    /// Keep only the highest height.
    pub max_res: bool,
}

/// Builds the master playlist. `playlist_url` maps a Representation (its `profile_id`) to the URL
/// of its media playlist.
pub fn to_hls_master(
    mpd: &Mpd,
    options: &MasterOptions,
    mut playlist_url: impl FnMut(&Representation) -> String,
) -> Result<String, DashError> {
    let tracks = unique_tracks(mpd);
    let audio = pick_audio(&tracks);
    let video = pick_video(&tracks, options);
    if audio.is_empty() && video.is_empty() {
        return Err(DashError::NoTracks);
    }
    let mut out = String::from("#EXTM3U\n#EXT-X-VERSION:6\n#EXT-X-INDEPENDENT-SEGMENTS\n");
    let default_audio = default_audio(&audio);
    if !video.is_empty() {
        for (i, rep) in audio.iter().enumerate() {
            out.push_str(&media_line(rep, i == default_audio, &playlist_url(rep)));
        }
    }
    let audio_codecs = distinct_codecs(&audio);
    let audio_bandwidth = audio.iter().map(|r| r.bandwidth).max().unwrap_or(0);
    for rep in &video {
        let mut codecs: Vec<&str> = rep.codecs.as_deref().into_iter().collect();
        codecs.extend(audio_codecs.iter().copied());
        let mut line = format!(
            "#EXT-X-STREAM-INF:BANDWIDTH={}",
            rep.bandwidth.saturating_add(audio_bandwidth)
        );
        if let (Some(w), Some(h)) = (rep.width, rep.height) {
            line.push_str(&format!(",RESOLUTION={w}x{h}"));
        }
        if let Some(fps) = rep.frame_rate {
            line.push_str(&format!(",FRAME-RATE={fps:.3}"));
        }
        push_codecs(&mut line, &codecs);
        if !audio.is_empty() {
            line.push_str(",AUDIO=\"audio\"");
        }
        out.push_str(&format!("{line}\n{}\n", clean(&playlist_url(rep))));
    }
    if video.is_empty() {
        // Audio-only presentation: each language is a variant of its own.
        for rep in &audio {
            let mut line = format!("#EXT-X-STREAM-INF:BANDWIDTH={}", rep.bandwidth);
            push_codecs(
                &mut line,
                &rep.codecs.as_deref().into_iter().collect::<Vec<_>>(),
            );
            out.push_str(&format!("{line}\n{}\n", clean(&playlist_url(rep))));
        }
    }
    Ok(out)
}

/// Representations across all Periods, first occurrence of each profile id.
fn unique_tracks(mpd: &Mpd) -> Vec<&Representation> {
    first_of_each(mpd.representations().map(|(_, _, r)| r), |r| {
        r.profile_id.as_str()
    })
}

/// Highest-bandwidth audio per language, in order of first appearance.
fn pick_audio<'a>(tracks: &[&'a Representation]) -> Vec<&'a Representation> {
    let audio = tracks.iter().filter(|r| r.kind == ContentKind::Audio);
    let mut picked = best_of_each(audio.copied(), |r| r.lang.as_deref());
    picked.truncate(MAX_AUDIO_LANGUAGES);
    picked
}

/// The first item of each key, in order. One hash lookup per item: a hostile MPD can list tens
/// of thousands of Representations, and a scan of the kept ones per item was quadratic.
pub(super) fn first_of_each<T, K: Hash + Eq>(
    items: impl IntoIterator<Item = T>,
    key: impl Fn(&T) -> K,
) -> Vec<T> {
    let mut seen = HashSet::new();
    items
        .into_iter()
        .filter(|item| seen.insert(key(item)))
        .collect()
}

/// The highest-bandwidth Representation of each key (the first of equals), in order of the
/// key's first appearance; one hash lookup per Representation, as in [`first_of_each`].
pub(super) fn best_of_each<'a, K: Hash + Eq>(
    reps: impl IntoIterator<Item = &'a Representation>,
    key: impl Fn(&'a Representation) -> K,
) -> Vec<&'a Representation> {
    let mut at: HashMap<K, usize> = HashMap::new();
    let mut picked: Vec<&Representation> = Vec::new();
    for rep in reps {
        match at.entry(key(rep)) {
            Entry::Occupied(i) => {
                let p = &mut picked[*i.get()];
                if rep.bandwidth > p.bandwidth {
                    *p = rep;
                }
            }
            Entry::Vacant(slot) => {
                slot.insert(picked.len());
                picked.push(rep);
            }
        }
    }
    picked
}

/// English if present, else the highest bandwidth.
pub(super) fn default_audio(audio: &[&Representation]) -> usize {
    let english = audio.iter().position(|r| {
        let lang = r.lang.as_deref().unwrap_or("").to_ascii_lowercase();
        lang == "en" || lang == "eng" || lang.starts_with("en-")
    });
    english.unwrap_or_else(|| {
        (0..audio.len())
            .max_by_key(|&i| (audio[i].bandwidth, std::cmp::Reverse(i)))
            .unwrap_or(0)
    })
}

/// Highest-bandwidth video per height, highest bandwidth first, narrowed by the options.
fn pick_video<'a>(
    tracks: &[&'a Representation],
    options: &MasterOptions,
) -> Vec<&'a Representation> {
    let video = tracks.iter().filter(|r| r.kind == ContentKind::Video);
    let mut picked = best_of_each(video.copied(), |r| r.height);
    picked.sort_by_key(|r| std::cmp::Reverse(r.bandwidth));
    let by_height = |a: &&&Representation, b: &&&Representation| a.height.cmp(&b.height);
    let chosen = if options.max_res {
        picked.iter().max_by(by_height).copied()
    } else if let Some(target) = options.resolution {
        picked
            .iter()
            .filter(|r| r.height.is_some_and(|h| h <= target))
            .max_by(by_height)
            .or_else(|| picked.iter().min_by(by_height))
            .copied()
    } else {
        picked.truncate(MAX_VIDEO_VARIANTS);
        return picked;
    };
    chosen.into_iter().collect()
}

fn media_line(rep: &Representation, default: bool, uri: &str) -> String {
    let yes_no = if default { "YES" } else { "NO" };
    let mut line = String::from("#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"audio\"");
    match rep.lang.as_deref().map(clean).filter(|l| !l.is_empty()) {
        Some(lang) => line.push_str(&format!(",NAME=\"{lang}\",LANGUAGE=\"{lang}\"")),
        None => line.push_str(&format!(",NAME=\"{}\"", clean(&rep.id))),
    }
    line.push_str(&format!(",DEFAULT={yes_no},AUTOSELECT=YES"));
    if let Some(channels) = rep.audio_channels {
        line.push_str(&format!(",CHANNELS=\"{channels}\""));
    }
    line.push_str(&format!(",URI=\"{}\"\n", clean(uri)));
    line
}

fn distinct_codecs<'a>(reps: &[&'a Representation]) -> Vec<&'a str> {
    let mut codecs: Vec<&str> = Vec::new();
    for codec in reps.iter().filter_map(|r| r.codecs.as_deref()) {
        if !codecs.contains(&codec) {
            codecs.push(codec);
        }
    }
    codecs
}

fn push_codecs(line: &mut String, codecs: &[&str]) {
    if !codecs.is_empty() {
        line.push_str(&format!(",CODECS=\"{}\"", clean(&codecs.join(","))));
    }
}

/// Quoted-string attribute values and URI lines may not hold quotes or line breaks; MPD text can.
pub(crate) fn clean(text: &str) -> String {
    text.chars()
        .filter(|c| !matches!(c, '"' | '\r' | '\n'))
        .collect()
}
