// Drives sluice's /player page in headless Chromium: the channel list and guide load, a click
// plays the live channel through /hls/ with the embedded hls.js, the video advances, and the
// programme on air is the guide's. No JavaScript error, CSP violation or failed request.
// With --low-latency: hls.js follows partial segments with blocking reloads, and plays less than
// 4.5 s behind the wall clock of the picture's arrival (#EXT-X-PROGRAM-DATE-TIME).
// With --timeshift: the channel's window (recorded to disk) is seekable, a seek 10 s back lands
// there, fetches a segment older than any fetched before it, and playback goes on from it.
// Usage: node player.mjs <sluice origin> [screenshot path] [--low-latency|--timeshift].
// Exit 1 on any failure.
import { chromium } from 'playwright-core';

const [proxy, shot, mode] = process.argv.slice(2);
const lowLatency = mode === '--low-latency';
const timeshift = mode === '--timeshift';
const failures = [];
const check = (ok, what) => {
  console.log(`${ok ? 'PASS' : 'FAIL'} ${what}`);
  if (!ok) failures.push(what);
};

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--no-first-run', '--autoplay-policy=no-user-gesture-required'],
});
try {
  const page = await browser.newPage();
  const problems = [];
  const requests = [];
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console: ${m.text()} ${m.location()?.url || ''}`);
  });
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('requestfailed', (r) => {
    // hls.js cancels a playlist reload it no longer needs once it follows parts with blocking
    // reloads; that is not a failure.
    const replaced = lowLatency && r.failure()?.errorText === 'net::ERR_ABORTED' && r.url().includes('/index.m3u8');
    if (!replaced) problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`);
  });
  page.on('response', (r) => {
    requests.push(r.url());
    if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`);
  });
  const resp = await page.goto(`${proxy}/player`);
  check(resp.status() === 200, `/player loads (${resp.status()})`);
  await page.waitForSelector('#channels button:not([disabled])', { timeout: 15000 });
  const names = await page.$$eval('#channels button', (bs) => bs.map((b) => b.firstChild.textContent));
  check(JSON.stringify(names) === '["Check One"]', `channel list from /playlist.m3u: ${JSON.stringify(names)}`);
  // The guide arrives after the list; the entry then shows the programme on air.
  await page.waitForFunction(() => document.querySelector('#channels small')?.textContent.includes('Browser check live'),
    null, { timeout: 15000 }).catch(() => {});
  const sub = await page.$eval('#channels small', (s) => s.textContent);
  check(sub.startsWith('Browser check live ('), `programme on air in the list: ${sub}`);
  await page.click('#channels button');
  const played = await page.waitForFunction(() => {
    const v = document.getElementById('video');
    return v.readyState >= 3 && v.currentTime > 3 && !v.paused;
  }, null, { timeout: 40000 }).then(() => true, () => false);
  const v = await page.$eval('#video', (v) => ({ t: v.currentTime, w: v.videoWidth, h: v.videoHeight, rs: v.readyState, err: v.error?.message }));
  check(played, `the live channel plays: ${JSON.stringify(v)}`);
  check(v.w === 320 && v.h === 240, `decoded picture is the source's 320x240: ${v.w}x${v.h}`);
  const now = await page.$eval('#now', (s) => s.textContent);
  check(now.startsWith('Browser check live ('), `current programme shown: ${now}`);
  const state = await page.$eval('#state', (s) => s.textContent);
  check(state === '', `no playback error shown: ${state}`);
  const hlsRequests = requests.filter((u) => u.includes('/hls/rtp/'));
  check(hlsRequests.some((u) => u.includes('/index.m3u8')) && hlsRequests.some((u) => /\/\d+(\.\d+)?\.ts/.test(u)),
    `playlist and segments fetched from /hls/ (${hlsRequests.length} requests)`);
  if (lowLatency) {
    // Settled playback: hls.js catches up to its target after the start-up (20 s at most,
    // playing a little faster); then the latency is sampled a few times.
    await page.waitForFunction(() => hls && hls.latency > 0 && hls.latency < 3, null,
      { timeout: 20000, polling: 500 }).catch(() => {});
    const samples = [];
    for (let i = 0; i < 5; i++) {
      samples.push(await page.evaluate(() => ({
        behind: hls.playingDate ? (Date.now() - hls.playingDate.getTime()) / 1000 : null,
        estimate: hls.latency,
        target: hls.targetLatency,
      })));
      await page.waitForTimeout(500);
    }
    const worst = Math.max(...samples.map((s) => s.behind ?? Infinity));
    check(worst < 4.5, `low latency: ${worst.toFixed(2)} s behind the gateway's clock at worst ` +
      `(hls.js estimate ${samples.map((s) => s.estimate?.toFixed(2)).join(' ')}, target ${samples[0].target})`);
    check(hlsRequests.some((u) => /\/\d+\.\d+\.ts/.test(u)), 'partial segments fetched');
    check(hlsRequests.some((u) => u.includes('_HLS_msn=')), 'blocking playlist reloads (_HLS_msn)');
  }
  if (timeshift) {
    // Segment names are their sequence numbers; the seek must fetch one older than all before it.
    const seq = (u) => Number((u.match(/\/(\d+)\.ts/) || [])[1]);
    const before = requests.filter((u) => u.includes('/hls/rtp/') && /\/\d+\.ts/.test(u)).map(seq);
    const oldest = Math.min(...before);
    const range = await page.$eval('#video', (v) => ({
      start: v.seekable.length ? v.seekable.start(0) : NaN,
      end: v.seekable.length ? v.seekable.end(v.seekable.length - 1) : NaN,
      now: v.currentTime,
    }));
    // sluice recorded for 16 s before the page opened: the whole of it is seekable, not just the
    // live playlist's last 6 segments.
    check(range.end - range.start >= 14, `seekable window covers the recording: ` +
      `${range.start.toFixed(1)}–${range.end.toFixed(1)} s (now ${range.now.toFixed(1)})`);
    const target = Math.max(range.start + 1, range.now - 10);
    await page.evaluate((t) => new Promise((resolve) => {
      const v = document.getElementById('video');
      v.addEventListener('seeked', resolve, { once: true });
      v.currentTime = t;
    }), target);
    const resumed = await page.waitForFunction((t) => {
      const v = document.getElementById('video');
      return !v.paused && v.readyState >= 3 && v.currentTime > t + 2 && v.currentTime < t + 8;
    }, target, { timeout: 20000 }).then(() => true, () => false);
    const after = await page.$eval('#video', (v) => v.currentTime);
    check(resumed, `seek back 10 s: playback goes on from ${target.toFixed(1)} s (now ${after.toFixed(1)} s)`);
    const older = requests.filter((u) => u.includes('/hls/rtp/') && /\/\d+\.ts/.test(u)).map(seq)
      .slice(before.length).filter((n) => n < oldest);
    check(older.length > 0, `the seek fetched recorded segments older than any played live ` +
      `(${older.slice(0, 5).join(', ')} < ${oldest})`);
  }
  const elsewhere = requests.filter((u) => !u.startsWith(proxy) && !u.startsWith('blob:'));
  check(elsewhere.length === 0, `nothing fetched from another origin ${elsewhere.join(' ')}`);
  check(problems.length === 0, 'no JavaScript error, CSP violation or failed request' +
    (problems.length ? `\n  ${problems.join('\n  ')}` : ''));
  if (shot) await page.screenshot({ path: shot });
} catch (e) {
  check(false, `player check: ${e.message}`);
} finally {
  await browser.close();
}
process.exit(failures.length ? 1 : 0);
