// The URL generator: builds a MediaFlow /generate_url(s) request from the form and shows the
// answer. The password travels in that one POST body only; it is never stored.
'use strict';

const $ = (id) => document.getElementById(id);

// `Name: value` lines into an object; a line without a colon is an error the user should see.
function headerLines(text, what) {
  const out = {};
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line) continue;
    const at = line.indexOf(':');
    if (at <= 0) throw new Error(`${what}: "${line}" is not "Name: value"`);
    out[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return out;
}

function request() {
  const destinations = $('destination').value.split('\n').map((s) => s.trim()).filter(Boolean);
  if (!destinations.length) throw new Error('give a destination URL');
  for (const d of destinations) {
    if (!/^https?:\/\//i.test(d)) throw new Error(`not an http(s) URL: ${d}`);
  }
  const endpoint = $('endpoint').value;
  const item = {
    endpoint,
    request_headers: headerLines($('request-headers').value, 'request headers'),
    response_headers: headerLines($('response-headers').value, 'response headers'),
    query_params: {},
  };
  if (endpoint.startsWith('/proxy/mpd/')) {
    const keyId = $('key-id').value.trim();
    const key = $('key').value.trim();
    if (keyId) item.query_params.key_id = keyId;
    if (key) item.query_params.key = key;
  }
  const filename = $('filename').value.trim();
  if (filename && endpoint === '/proxy/stream') item.filename = filename;

  const shared = { mediaflow_proxy_url: location.origin };
  const password = $('password').value;
  if ($('encrypt').checked) {
    if (!password) throw new Error('encryption needs the API password');
    shared.api_password = password;
    const seconds = Number($('expiration').value || 0);
    if (seconds > 0) shared.expiration = Math.round(seconds);
    const ip = $('ip').value.trim();
    if (ip) shared.ip = ip;
  } else if (password) {
    // MediaFlow's plain form, asked for explicitly: the password rides in the query.
    item.query_params.api_password = password;
  }
  if (destinations.length === 1) {
    return { path: '/generate_url', body: { ...shared, ...item, destination_url: destinations[0] } };
  }
  return {
    path: '/generate_urls',
    body: { ...shared, urls: destinations.map((d) => ({ ...item, destination_url: d })) },
  };
}

async function generate(event) {
  event.preventDefault();
  $('status').textContent = '';
  $('result').hidden = true;
  try {
    const { path, body } = request();
    const resp = await fetch(path, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
      credentials: 'omit',
      cache: 'no-store',
    });
    const answer = await resp.json().catch(() => ({}));
    if (!resp.ok) throw new Error(answer.error || answer.detail || `the server answered ${resp.status}`);
    $('urls').value = answer.url ? answer.url : answer.urls.join('\n');
    $('result').hidden = false;
  } catch (e) {
    $('status').textContent = e.message;
  }
}

document.addEventListener('DOMContentLoaded', () => {
  const sync = () => {
    $('drm').hidden = !$('endpoint').value.startsWith('/proxy/mpd/');
    $('plain-warning').hidden = $('encrypt').checked;
  };
  $('endpoint').addEventListener('change', sync);
  $('encrypt').addEventListener('change', sync);
  sync();
  $('generator').addEventListener('submit', generate);
  $('copy').addEventListener('click', () => navigator.clipboard?.writeText($('urls').value));
});
