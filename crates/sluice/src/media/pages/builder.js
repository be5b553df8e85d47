// The playlist builder: turns the form into a /playlist/playlist URL. The password goes only into
// the api_password header of one POST /playlist/link request (or, when asked for, into the
// MediaFlow-compatible URL); it is never stored.
'use strict';

const $ = (id) => document.getElementById(id);

function addRow(url) {
  const row = $('source-row').content.firstElementChild.cloneNode(true);
  row.querySelector('.source-url').value = url || '';
  row.querySelector('.source-remove').addEventListener('click', () => {
    if ($('sources').children.length > 1) row.remove();
  });
  $('sources').appendChild(row);
  return row;
}

// `d` as /playlist/playlist reads it: `[sort:][no_proxy:]<url>` joined by `;`.
function definitions() {
  const defs = [];
  for (const row of $('sources').children) {
    const url = row.querySelector('.source-url').value.trim();
    if (!url) continue;
    if (!/^https?:\/\//i.test(url)) throw new Error(`not an http(s) URL: ${url}`);
    if (url.includes(';')) throw new Error(`a playlist URL may not contain ";": ${url}`);
    let def = '';
    if (row.querySelector('.source-sort').checked) def += 'sort:';
    if (row.querySelector('.source-direct').checked) def += 'no_proxy:';
    defs.push(def + url);
  }
  if (!defs.length) throw new Error('add at least one playlist URL');
  return defs.join(';');
}

async function generate(event) {
  event.preventDefault();
  $('status').textContent = '';
  $('result').hidden = true;
  try {
    const d = definitions();
    const password = $('password').value;
    let url;
    if ($('mediaflow').checked) {
      const q = new URLSearchParams({ d });
      if (password) q.set('api_password', password);
      url = `${location.origin}/playlist/playlist?${q}`;
    } else {
      const hours = Number($('expiration').value || 0);
      const headers = { 'Content-Type': 'application/json' };
      if (password) headers.api_password = password;
      const resp = await fetch('/playlist/link', {
        method: 'POST',
        headers,
        body: JSON.stringify({ d, expiration: Math.max(0, Math.round(hours * 3600)) }),
        credentials: 'omit',
        cache: 'no-store',
      });
      const body = await resp.json().catch(() => ({}));
      if (!resp.ok) throw new Error(body.error || body.detail || `the server answered ${resp.status}`);
      url = body.url;
    }
    $('url').value = url;
    $('result').hidden = false;
  } catch (e) {
    $('status').textContent = e.message;
  }
}

document.addEventListener('DOMContentLoaded', () => {
  addRow();
  $('add').addEventListener('click', () => addRow().querySelector('.source-url').focus());
  $('builder').addEventListener('submit', generate);
  $('mediaflow').addEventListener('change', () => {
    $('mediaflow-warning').hidden = !$('mediaflow').checked;
  });
  $('copy').addEventListener('click', () => navigator.clipboard?.writeText($('url').value));
});
