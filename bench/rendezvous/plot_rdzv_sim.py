#!/usr/bin/env python3
"""Plots rdzv_sim's per-N lines (before and after) as one SVG, log-log, by hand (no plotting
library is installed on the build hosts).

    plot_rdzv_sim.py before.txt after.txt > docs/rdzv_sim.svg
    plot_rdzv_sim.py --etcd before.txt after.txt > docs/rdzv_sim_etcd.svg

Each input holds rdzv_sim's table lines ("N rank_s store_cpu_s store_rss_mib store_mb
requests ka_req_per_s reform_s"; with --backend etcd "N rank_s etcd_cpu_s etcd_rss_mib calls
watch_events ka_calls_per_s reform_s"); other lines are skipped. Three panels: store-host CPU
seconds per round, store-host bytes per round (etcd: watch events per round), time from the
first join to every rank; the dashed lines extend the after fit to 100,000 nodes.
"""
import math
import sys


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 8 and parts[0].isdigit():
                rows.append([float(x) for x in parts])
    return rows


def fit(xs, ys):
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y > 0]
    n = len(pts)
    sx = sum(p[0] for p in pts)
    sy = sum(p[1] for p in pts)
    sxx = sum(p[0] ** 2 for p in pts)
    sxy = sum(p[0] * p[1] for p in pts)
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    a = (sy - b * sx) / n
    return a, b


def panel(x0, title, unit, series, xmax=1e5):
    w, h, pad = 300, 220, 40
    allx = [x for _, xs, _, _ in series for x in xs] + [xmax]
    ally = [y for _, _, ys, _ in series for y in ys if y > 0]
    lx0, lx1 = math.log10(min(allx)), math.log10(xmax)
    ly0, ly1 = math.floor(math.log10(min(ally))), math.ceil(math.log10(max(ally) * 10))

    def px(x):
        return x0 + pad + (math.log10(x) - lx0) / (lx1 - lx0) * (w - pad)

    def py(y):
        return 20 + h - (math.log10(y) - ly0) / (ly1 - ly0) * h

    out = [f'<text x="{x0 + pad}" y="14" font-size="12">{title} ({unit})</text>',
           f'<rect x="{x0 + pad}" y="20" width="{w - pad}" height="{h}" fill="none" stroke="#999"/>']
    for e in range(int(ly0), int(ly1) + 1):
        y = py(10 ** e)
        out.append(f'<text x="{x0 + 2}" y="{y + 4:.1f}" font-size="9">1e{e}</text>')
        out.append(f'<line x1="{x0 + pad}" x2="{x0 + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
    for x in (1e3, 1e4, 1e5):
        if x >= min(allx):
            out.append(f'<text x="{px(x) - 10:.1f}" y="{20 + h + 14}" font-size="9">{int(x):,}</text>')
    for name, xs, ys, color in series:
        pts = [(px(x), py(y)) for x, y in zip(xs, ys) if y > 0]
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' %
                   (color, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
        for a, b in pts:
            out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>')
        if name == "after" and len(pts) >= 2:
            a, b = fit(xs, ys)
            y_end = math.exp(a + b * math.log(xmax))
            out.append(f'<line x1="{pts[-1][0]:.1f}" y1="{pts[-1][1]:.1f}" x2="{px(xmax):.1f}" '
                       f'y2="{py(y_end):.1f}" stroke="{color}" stroke-dasharray="4,3"/>')
            out.append(f'<text x="{px(xmax) - 80:.1f}" y="{py(y_end) - 6:.1f}" font-size="9" '
                       f'fill="{color}">N^{b:.2f}: {y_end:.3g} at 100K</text>')
    return out


def main():
    args = sys.argv[1:]
    etcd = args[:1] == ["--etcd"]
    if etcd:
        args = args[1:]
    before, after = read(args[0]), read(args[1])
    cols = [(2, "store host CPU per round", "s"), (4, "bytes through the store", "MB"),
            (1, "first join to every rank", "s")]
    if etcd:
        cols = [(2, "etcd CPU per round", "s"), (5, "watch events per round", "events"),
                (1, "first join to every rank", "s")]
    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="960" height="290" '
           'font-family="sans-serif">']
    for i, (c, title, unit) in enumerate(cols):
        series = [("before", [r[0] for r in before], [r[c] for r in before], "#c33"),
                  ("after", [r[0] for r in after], [r[c] for r in after], "#36c")]
        svg += panel(i * 320, title, unit, series)
    what = "rdzv_sim --backend etcd" if etcd else "rdzv_sim"
    svg.append(f'<text x="40" y="284" font-size="10">{what}, N agents (x, log), '
               '<tspan fill="#c33">before</tspan> / <tspan fill="#36c">after</tspan> issue 16; '
               'dashed: the fitted power law extended to 100,000 nodes</text>')
    svg.append("</svg>")
    print("\n".join(svg))


if __name__ == "__main__":
    main()
