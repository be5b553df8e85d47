// Drives sluice's pages in headless Chromium: the home page, the URL generator and the playlist
// builder. Fills their forms, checks the generated URLs exactly (and that they work), that no
// JavaScript error, CSP violation or failed request happened, and that nothing was stored.
// Usage: node pages.mjs <sluice origin> <content origin> <api password>. Exit 1 on any failure.
import { chromium } from 'playwright-core';

const [proxy, origin, password] = process.argv.slice(2);
const failures = [];
const check = (ok, what) => {
  console.log(`${ok ? 'PASS' : 'FAIL'} ${what}`);
  if (!ok) failures.push(what);
};
const form = (pairs) => new URLSearchParams(pairs).toString();

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--no-first-run'],
});

// The pages ask for the password (HTTP Basic, any user name) when one is set.
const context = await browser.newContext({ httpCredentials: { username: 'operator', password } });

// Every console error, uncaught exception and failed request of one page.
async function open(path) {
  const page = await context.newPage();
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') problems.push(`${m.type()}: ${m.text()}`); });
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  page.on('response', (r) => { if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`); });
  const resp = await page.goto(proxy + path);
  check(resp.status() === 200, `${path} loads (${resp.status()})`);
  return { page, problems, expected: [] };
}

async function finish(path, { page, problems: all, expected }) {
  // Problems a step provoked on purpose (a refused password shows as a failed fetch).
  const problems = all.filter((p) => !expected.some((e) => p.includes(e)));
  const stored = await page.evaluate(() => ({
    local: localStorage.length, session: sessionStorage.length, cookie: document.cookie,
  }));
  check(stored.local === 0 && stored.session === 0 && stored.cookie === '',
    `${path}: nothing stored (${JSON.stringify(stored)})`);
  check(problems.length === 0, `${path}: no JavaScript error, CSP violation or failed request` +
    (problems.length ? `\n  ${problems.join('\n  ')}` : ''));
  await page.close();
}

async function fetchText(url) {
  const r = await fetch(url);
  return { status: r.status, text: await r.text() };
}

try {
  // --- home ---------------------------------------------------------------------------------
  {
    const p = await open('/');
    check(await p.page.title() === 'sluice', 'home: title');
    const links = await p.page.$$eval('nav a', (as) => as.map((a) => a.getAttribute('href')));
    check(JSON.stringify(links) === '["/url-generator","/playlist/builder"]', `home: links ${links}`);
    await p.page.click('nav a[href="/playlist/builder"]');
    await p.page.waitForURL(`${proxy}/playlist/builder`);
    check(await p.page.title() === 'Playlist builder · sluice', 'home: link to the builder works');
    await finish('/', p);
  }

  // --- URL generator --------------------------------------------------------------------------
  {
    const p = await open('/url-generator');
    const { page } = p;
    const live = `${origin}/live/index.m3u8`;
    await page.selectOption('#endpoint', '/proxy/hls/manifest.m3u8');
    await page.fill('#destination', live);
    await page.fill('#request-headers', 'Referer: https://site.example/');
    await page.fill('#password', password);
    check(await page.isChecked('#encrypt'), 'generator: encryption is the default');
    await page.click('#generate');
    await page.waitForSelector('#result:not([hidden])');
    const encrypted = await page.inputValue('#urls');
    // With this server's password the token is sluice's sealed one (`s1.`), scoped to that path.
    check(new RegExp(`^${proxy.replace(/\./g, '\\.')}/_token_s1\\.[A-Za-z0-9_-]+/proxy/hls/manifest\\.m3u8$`).test(encrypted),
      `generator: sealed URL ${encrypted}`);
    check(!encrypted.includes(password), 'generator: the encrypted URL does not hold the password');
    const played = await fetchText(encrypted);
    check(played.status === 200 && played.text.startsWith('#EXTM3U') && played.text.includes('/_token_'),
      `generator: the encrypted URL serves the rewritten playlist (${played.status})`);

    // Two destinations: /generate_urls, one URL each.
    await page.fill('#destination', `${live}\n${origin}/live/other.m3u8`);
    await page.click('#generate');
    await page.waitForSelector('#result:not([hidden])');
    const two = (await page.inputValue('#urls')).split('\n');
    check(two.length === 2 && two.every((u) => u.startsWith(`${proxy}/_token_s1.`)), `generator: two URLs ${two.length}`);

    // The MediaFlow-compatible plain form, asked for: exactly MediaFlow's URL.
    await page.fill('#destination', live);
    await page.uncheck('#encrypt');
    check(await page.isVisible('#plain-warning'), 'generator: the plain form warns about the password');
    await page.click('#generate');
    await page.waitForSelector('#result:not([hidden])');
    const plain = await page.inputValue('#urls');
    const want = `${proxy}/proxy/hls/manifest.m3u8?` +
      // MediaFlow keeps the header name's spelling.
      form([['api_password', password], ['d', live], ['h_Referer', 'https://site.example/']]);
    check(plain === want, `generator: plain URL\n  got  ${plain}\n  want ${want}`);

    // DASH with keys.
    await page.check('#encrypt');
    await page.selectOption('#endpoint', '/proxy/mpd/manifest.m3u8');
    check(await page.isVisible('#key-id'), 'generator: ClearKey fields shown for DASH');
    await page.fill('#key-id', '00112233445566778899aabbccddeeff');
    await page.fill('#key', 'ffeeddccbbaa99887766554433221100');
    await page.fill('#request-headers', '');
    await page.click('#generate');
    await page.waitForSelector('#result:not([hidden])');
    check((await page.inputValue('#urls')).endsWith('/proxy/mpd/manifest.m3u8'), 'generator: DASH URL');

    // Bad input: a message, no URL.
    await page.fill('#destination', 'ftp://nope.example/x');
    await page.click('#generate');
    const status = await page.textContent('#status');
    check(status.includes('not an http(s) URL') && await page.isHidden('#result'), `generator: bad URL refused (${status})`);
    await finish('/url-generator', p);
  }

  // --- playlist builder --------------------------------------------------------------------------
  {
    const p = await open('/playlist/builder');
    const { page } = p;
    await page.fill('#sources .row:nth-child(1) .source-url', `${origin}/a.m3u`);
    await page.click('#add');
    await page.fill('#sources .row:nth-child(2) .source-url', `${origin}/b.m3u`);
    await page.check('#sources .row:nth-child(2) .source-sort');
    await page.click('#add');
    await page.fill('#sources .row:nth-child(3) .source-url', `${origin}/c.m3u`);
    await page.check('#sources .row:nth-child(3) .source-direct');
    await page.fill('#password', password);
    await page.click('#generate');
    await page.waitForSelector('#result:not([hidden])');
    const url = await page.inputValue('#url');
    check(new RegExp(`^${proxy.replace(/\./g, '\\.')}/_token_s1\\.[A-Za-z0-9_-]+/playlist/playlist$`).test(url),
      `builder: sealed playlist URL ${url}`);
    check(!url.includes(password), 'builder: the URL does not hold the password');

    const list = await fetchText(url);
    const entry = new RegExp(`^${proxy.replace(/\./g, '\\.')}/_token_s1\\.[A-Za-z0-9_-]+/proxy/hls/manifest\\.m3u8$`);
    const shape = list.text.split('\n').map((l) => (entry.test(l) ? '<entry>' : l)).join('\n');
    const wantShape = [
      '#EXTM3U', '#EXTINF:-1,Beta', '<entry>', '#EXTINF:-1,Delta', '<entry>',
      '#EXTINF:-1 tvg-id="live",Live', '#EXTVLCOPT:http-user-agent=BrowserCheck/1.0', '<entry>',
      '#EXTINF:-1,Direct', 'http://direct.example/d.ts', '',
    ].join('\n');
    check(list.status === 200 && shape === wantShape, `builder: merged list\n${list.text}`);
    check(!list.text.includes(password), 'builder: the merged list does not hold the password');
    const liveEntry = list.text.split('\n')[7];
    const played = await fetchText(liveEntry);
    check(played.status === 200 && played.text.startsWith('#EXTM3U'), `builder: a channel plays (${played.status})`);

    // The MediaFlow-compatible form, asked for.
    await page.check('#mediaflow');
    check(await page.isVisible('#mediaflow-warning'), 'builder: the MediaFlow form warns about the password');
    await page.click('#generate');
    await page.waitForSelector('#result:not([hidden])');
    const mf = await page.inputValue('#url');
    const d = `${origin}/a.m3u;sort:${origin}/b.m3u;no_proxy:${origin}/c.m3u`;
    const wantMf = `${proxy}/playlist/playlist?${form([['d', d], ['api_password', password]])}`;
    check(mf === wantMf, `builder: MediaFlow URL\n  got  ${mf}\n  want ${wantMf}`);
    const same = await fetchText(mf);
    check(same.status === 200 &&
      same.text.split('\n').map((l) => (entry.test(l) ? '<entry>' : l)).join('\n') === wantShape,
      'builder: the MediaFlow URL serves the same list');

    // A wrong password: the server's refusal is shown, no URL.
    p.expected.push(`HTTP 403: ${proxy}/playlist/link`, 'status of 403 (Forbidden)');
    await page.uncheck('#mediaflow');
    await page.fill('#password', 'wrong');
    await page.click('#generate');
    await page.waitForFunction(() => document.getElementById('status').textContent !== '');
    const status = await page.textContent('#status');
    check(status.includes('password') && await page.isHidden('#result'), `builder: wrong password refused (${status})`);
    await finish('/playlist/builder', p);
  }
} finally {
  await browser.close();
}
if (failures.length) console.log(`${failures.length} check(s) failed`);
process.exit(failures.length ? 1 : 0);
