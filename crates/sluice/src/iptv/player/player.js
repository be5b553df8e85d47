// The /player page: channels from playlist.m3u (as HLS URLs), the guide from epg.xml, and
// playback through this gateway's HLS output with hls.js (or the browser's own HLS, on Safari).
// Every URL is relative, so the page works under a path prefix too; nothing is stored.
'use strict';

const video = document.getElementById('video');
const list = document.getElementById('channels');
const title = document.getElementById('title');
const nowLine = document.getElementById('now');
const state = document.getElementById('state');
const filter = document.getElementById('filter');

let channels = [];
let current = -1;
let hls = null;
// Programmes by guide channel id, each list sorted by start.
const guide = new Map();
// Guide channel ids by display name, for entries without tvg-id.
const guideNames = new Map();

// M3U entries: name, tvg-id/tvg-name, group, and the URL as a same-origin path.
function parsePlaylist(text) {
  const out = [];
  let info = '';
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.trim();
    if (line.startsWith('#EXTINF')) { info = line; continue; }
    if (!line || line.startsWith('#')) continue;
    const attrs = {};
    for (const m of info.matchAll(/([\w-]+)="([^"]*)"/g)) attrs[m[1].toLowerCase()] = m[2];
    // The name follows the comma after the last attribute.
    const tail = info.slice(Math.max(info.lastIndexOf('"'), 0));
    const comma = tail.indexOf(',');
    const name = (comma >= 0 ? tail.slice(comma + 1) : '').trim() || attrs['tvg-name'] || line;
    let src = null;
    try {
      const u = new URL(line, location.href);
      if (u.pathname.includes('/hls/')) src = u.pathname + u.search;
    } catch (_) { /* not a URL: not playable here */ }
    out.push({ name, id: attrs['tvg-id'] || '', tvgName: attrs['tvg-name'] || '', group: attrs['group-title'] || '', src });
    info = '';
  }
  return out;
}

// XMLTV time "20240101120000 +0800" as a Date.
function xmltvTime(s) {
  const m = /^(\d{4})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})?\s*([+-]\d{4})?/.exec(s || '');
  if (!m) return null;
  const utc = Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +(m[6] || 0));
  const tz = m[7] ? (m[7][0] === '-' ? -1 : 1) * (+m[7].slice(1, 3) * 60 + +m[7].slice(3, 5)) : 0;
  return new Date(utc - tz * 60000);
}

function loadGuide(xml) {
  const doc = new DOMParser().parseFromString(xml, 'application/xml');
  for (const ch of doc.querySelectorAll('channel')) {
    for (const dn of ch.querySelectorAll('display-name')) guideNames.set(dn.textContent.trim(), ch.getAttribute('id'));
  }
  for (const p of doc.querySelectorAll('programme')) {
    const id = p.getAttribute('channel');
    const start = xmltvTime(p.getAttribute('start'));
    const stop = xmltvTime(p.getAttribute('stop'));
    const t = p.querySelector('title');
    if (!id || !start || !t) continue;
    if (!guide.has(id)) guide.set(id, []);
    guide.get(id).push({ start, stop, title: t.textContent.trim() });
  }
  for (const progs of guide.values()) progs.sort((a, b) => a.start - b.start);
}

function hhmm(d) {
  return d ? d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' }) : '';
}

// The programme on air now on a channel's guide entry, if the guide has one.
function onAir(ch, at = new Date()) {
  const id = (ch.id && guide.has(ch.id)) ? ch.id : guideNames.get(ch.tvgName) || guideNames.get(ch.name);
  const progs = id ? guide.get(id) : null;
  if (!progs) return null;
  return progs.find((p) => p.start <= at && (!p.stop || at < p.stop)) || null;
}

function describe(p) {
  return p ? `${p.title} (${hhmm(p.start)}–${hhmm(p.stop)})` : '';
}

function render() {
  const words = filter.value.trim().toLowerCase();
  list.replaceChildren();
  channels.forEach((ch, i) => {
    if (words && !ch.name.toLowerCase().includes(words) && !ch.group.toLowerCase().includes(words)) return;
    const li = document.createElement('li');
    const b = document.createElement('button');
    b.type = 'button';
    b.dataset.index = String(i);
    b.textContent = ch.name;
    b.disabled = !ch.src;
    if (i === current) b.setAttribute('aria-current', 'true');
    const sub = document.createElement('small');
    sub.textContent = describe(onAir(ch)) || ch.group;
    b.append(sub);
    b.addEventListener('click', () => play(i));
    li.append(b);
    list.append(li);
  });
}

function showNow() {
  const ch = channels[current];
  if (!ch) return;
  title.textContent = ch.name;
  nowLine.textContent = describe(onAir(ch));
}

function play(i) {
  const ch = channels[i];
  if (!ch || !ch.src) return;
  current = i;
  state.textContent = '';
  if (hls) { hls.destroy(); hls = null; }
  if (window.Hls && window.Hls.isSupported()) {
    // Low-latency HLS is used when the gateway offers it (iptv.hls.part_target_ms); after a
    // stall, playback speeds up a little to get back to its distance from live.
    hls = new window.Hls({ lowLatencyMode: true, maxLiveSyncPlaybackRate: 1.5 });
    hls.on(window.Hls.Events.ERROR, (_, d) => {
      if (d.fatal) state.textContent = `Playback failed: ${d.details}${d.response ? ` (HTTP ${d.response.code})` : ''}`;
    });
    hls.loadSource(ch.src);
    hls.attachMedia(video);
  } else if (video.canPlayType('application/vnd.apple.mpegurl')) {
    video.src = ch.src;
  } else {
    state.textContent = 'This browser cannot play HLS.';
    return;
  }
  video.play().catch(() => { /* autoplay refused: the controls start it */ });
  history.replaceState(null, '', `#${i}`);
  render();
  showNow();
}

async function start() {
  try {
    const resp = await fetch('playlist.m3u?hls=1');
    if (!resp.ok) throw new Error(`playlist.m3u: HTTP ${resp.status}`);
    channels = parsePlaylist(await resp.text());
  } catch (e) {
    state.textContent = `No channel list: ${e.message}`;
    return;
  }
  render();
  const asked = parseInt(location.hash.slice(1), 10);
  if (Number.isInteger(asked) && channels[asked]) play(asked);
  // The guide is optional, and can be large: the list works before it arrives.
  try {
    const resp = await fetch('epg.xml');
    if (resp.ok) {
      loadGuide(await resp.text());
      render();
      showNow();
    }
  } catch (_) { /* no guide */ }
  setInterval(() => { render(); showNow(); }, 30000);
}

filter.addEventListener('input', render);
start();
