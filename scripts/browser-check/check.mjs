// Opens the check page in headless Chromium, waits until every player has played past a threshold,
// takes a screenshot and prints one PASS/FAIL line per stream. Exit status 1 if any stream failed.
import { chromium } from 'playwright-core';

const [pageUrl, screenshot] = process.argv.slice(2);
const THRESHOLD = Number(process.env.CHECK_THRESHOLD || 1.5); // seconds of media time
const TIMEOUT_MS = Number(process.env.CHECK_TIMEOUT_MS || 30000);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--no-first-run', '--autoplay-policy=no-user-gesture-required',
  ],
});
let failed = false;
try {
  const page = await browser.newPage({ viewport: { width: 1060, height: 520 } });
  const consoleLines = [];
  page.on('console', m => consoleLines.push(`${m.type()}: ${m.text()}`));
  page.on('pageerror', e => consoleLines.push(`pageerror: ${e.message}`));
  await page.goto(pageUrl);
  const start = Date.now();
  let state;
  for (;;) {
    state = await page.evaluate(() => JSON.parse(JSON.stringify(window.checkState)));
    const players = Object.values(state.players);
    const done = players.length > 0 && players.every(p => p.currentTime > THRESHOLD || p.ended);
    const fatal = players.some(p => p.errors.some(e => e.startsWith('FATAL') || e.startsWith('video element')));
    if (done || fatal || Date.now() - start > TIMEOUT_MS) break;
    await new Promise(r => setTimeout(r, 200));
  }
  await new Promise(r => setTimeout(r, 300)); // let the page repaint its status lines
  state = await page.evaluate(() => JSON.parse(JSON.stringify(window.checkState)));
  await page.screenshot({ path: screenshot });

  console.log(`browser: Chromium ${browser.version()} (headless), hls.js ${state.hlsVersion}, ` +
    `MSE codecs: ${Object.entries(state.codecs).map(([c, ok]) => `${c.match(/codecs="(.*)"/)[1]}=${ok}`).join(' ')}`);
  for (const [name, p] of Object.entries(state.players)) {
    const ok = p.currentTime > THRESHOLD && p.frames > 0;
    if (!ok) failed = true;
    const label = name === 'dash' ? (process.env.CHECK_DASH_LABEL || 'DASH-ClearKey') : 'HLS';
    console.log(`${ok ? 'PASS' : 'FAIL'} ${label}: currentTime=${p.currentTime.toFixed(3)}s frames=${p.frames} ` +
      `dropped=${p.dropped} size=${p.size} errors=${p.errors.length ? JSON.stringify(p.errors) : 'none'}`);
    if (!ok) console.log(`  events: ${p.events.join(' ')}`);
  }
  if (!state.codecs['video/mp4; codecs="avc1.64001e"']) {
    console.log('note: this Chromium reports no H.264 support in MSE (MediaSource.isTypeSupported avc1 = false)');
  }
  if (failed && consoleLines.length) console.log('page console:\n  ' + consoleLines.slice(-20).join('\n  '));
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
