"""Small self-made SVG line charts (categorical x axis; linear y from zero, or log y) for the report."""

import math
from xml.sax.saxutils import escape

COLORS = ["#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2"]


def _nice_max(v):
    if v <= 0:
        return 1.0
    mag = 10 ** len(str(int(v))) / 10
    for step in (1, 2, 2.5, 5, 10):
        if step * mag >= v:
            return step * mag
    return 10 * mag


def line_chart(title, x_label, y_label, xs, series, width=640, height=360, log=False):
    """series: list of (name, [y or None per x]). With `log`, y is on a base-10 log scale (for
    values that span decades). Returns the SVG document as a string."""
    left, right, top, bottom = 70, 150, 40, 50
    pw, ph = width - left - right, height - top - bottom
    ys = [y for _, vals in series for y in vals if y is not None and (y > 0 or not log)]
    n = max(len(xs), 1)
    if log:
        lo = 10 ** math.floor(math.log10(min(ys))) if ys else 1.0
        hi = 10 ** math.ceil(math.log10(max(ys))) if ys else 10.0
        hi = hi if hi > lo else lo * 10
        ticks = []
        t = lo
        while t <= hi * 1.0001:
            ticks.append(t)
            t *= 10
        series = [(name, [v if v is not None and v > 0 else None for v in vals]) for name, vals in series]
    else:
        ymax = _nice_max(max(ys) if ys else 1.0)
        ticks = [ymax * k / 5 for k in range(6)]

    def px(i):
        return left + (pw * (i + 0.5) / n)

    def py(y):
        if log:
            return top + ph - ph * (math.log10(y) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        return top + ph - ph * y / ymax

    out = ["<!-- chart drawn by bench/suite/svg.py -->",
           f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>']
    for v in ticks:
        y = py(v)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
    for i, x in enumerate(xs):
        out.append(f'<text x="{px(i):.1f}" y="{top + ph + 18}" text-anchor="middle">{escape(str(x))}</text>')
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#333"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#333"/>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 10}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text transform="translate(16,{top + ph / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    for s, (name, vals) in enumerate(series):
        color = COLORS[s % len(COLORS)]
        pts = [(px(i), py(v)) for i, v in enumerate(vals) if v is not None]
        if len(pts) > 1:
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"/>')
        ly = top + 10 + 20 * s
        out.append(f'<rect x="{left + pw + 14}" y="{ly - 9}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{left + pw + 32}" y="{ly + 2}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
