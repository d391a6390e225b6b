#!/usr/bin/env python3
"""Two training curves (JSONL logs of build/train*, one {"step", "loss", ...} object a line) as one
SVG, and the relative gap of their final losses (mean of the last 5% of the steps both runs reached);
where the logs have eval_loss (train --val-frac: the held-out tail of the data), also those points
(dashed) and the gaps at the end and at each run's lowest held-out loss.
Usage: fp8_curves.py REF.jsonl OTHER.jsonl OUT.svg  (REF is the baseline, e.g. bf16)"""
import json, sys

def load(path, key="loss"):
    pts = []
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                try: d = json.loads(line)
                except ValueError: continue   # a line cut by the time limit
                if "step" in d and key in d: pts.append((d["step"], d[key]))
    except OSError as e:
        sys.exit("fp8_curves.py: %s" % e)
    return pts

def smooth(pts, w):
    out, acc = [], []
    for s, l in pts:
        acc.append(l)
        if len(acc) > w: acc.pop(0)
        out.append((s, sum(acc) / len(acc)))
    return out

def main():
    if len(sys.argv) != 4: sys.exit(__doc__)
    a, b = load(sys.argv[1]), load(sys.argv[2])
    ea, eb = load(sys.argv[1], "eval_loss"), load(sys.argv[2], "eval_loss")
    if not a or not b: sys.exit("fp8_curves.py: a log has no steps (%d, %d)" % (len(a), len(b)))
    last = min(a[-1][0], b[-1][0])
    win = max(1, last // 20)
    fa = [l for s, l in a if last - win < s <= last]
    fb = [l for s, l in b if last - win < s <= last]
    la, lb = sum(fa) / len(fa), sum(fb) / len(fb)
    names = [n.rsplit("/", 1)[-1].replace(".jsonl", "") for n in sys.argv[1:3]]
    W, H, L, T, R, Bm = 800, 480, 60, 30, 20, 50
    sa, sb = smooth(a, 20), smooth(b, 20)
    xmax = max(a[-1][0], b[-1][0])
    ys = [l for _, l in sa + sb]
    ev = [l for _, l in ea + eb]
    ymin, ymax = min(ys + ev), min(max(ys + ev), max([2 * sorted(ys)[len(ys) // 2] + 0.5] + ev))
    X = lambda s: L + (W - L - R) * s / xmax
    Y = lambda l: T + (H - T - Bm) * (1 - (min(l, ymax) - ymin) / ((ymax - ymin) or 1))
    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18">training loss (20-step mean)%s: %s vs %s</text>' % (L, ", held-out loss dashed" if ea and eb else "", names[0], names[1])]
    for i in range(6):
        v = ymin + (ymax - ymin) * i / 5
        svg.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="5" y="%.1f">%.2f</text>' % (L, W - R, Y(v), Y(v), Y(v) + 4, v))
        s = xmax * i / 5
        svg.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (X(s), H - Bm + 18, s))
    svg.append('<text x="%d" y="%d" text-anchor="middle">step</text>' % ((W + L) // 2, H - 10))
    LX, LY = L + (W - L - R) * 0.55, T + (H - T - Bm) * 0.45   # the legend: right of the middle, between the curves
    for pts, col, name, k in ((sa, "#1f77b4", names[0], 0), (sb, "#d62728", names[1], 1)):
        svg.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' % (col, " ".join("%.1f,%.1f" % (X(s), Y(l)) for s, l in pts)))
        svg.append('<text x="%d" y="%d" fill="%s">%s</text>' % (LX, LY + 16 * k, col, name))
    for pts, col, k in ((ea, "#1f77b4", 0), (eb, "#d62728", 1)):
        if pts:
            svg.append('<polyline fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="5,3" points="%s"/>' % (col, " ".join("%.1f,%.1f" % (X(s), Y(l)) for s, l in pts)))
            svg.append('<text x="%d" y="%d" fill="%s">%s held-out (dashed)</text>' % (LX, LY + 32 + 16 * k, col, names[k]))
    svg.append("</svg>")
    open(sys.argv[3], "w").write("\n".join(svg) + "\n")
    print("wrote %s" % sys.argv[3])
    print("final loss (mean of steps %d-%d): %s %.4f, %s %.4f, relative gap %+.2f%%" % (last - win + 1, last, names[0], la, names[1], lb, 100 * (lb - la) / la))
    if ea and eb:
        common = sorted(set(s for s, _ in ea) & set(s for s, _ in eb))
        da, db = dict(ea), dict(eb)
        if common:
            s = common[-1]
            print("held-out loss at step %d: %s %.4f, %s %.4f, relative gap %+.2f%%" % (s, names[0], da[s], names[1], db[s], 100 * (db[s] - da[s]) / da[s]))
            ma, mb = min(ea, key=lambda p: p[1]), min(eb, key=lambda p: p[1])
            print("lowest held-out loss: %s %.4f (step %d), %s %.4f (step %d), relative gap %+.2f%%" % (names[0], ma[1], ma[0], names[1], mb[1], mb[0], 100 * (mb[1] - ma[1]) / ma[1]))
            print("held-out gap over the evaluations: " + ", ".join("%d %+.2f%%" % (s, 100 * (db[s] - da[s]) / da[s]) for s in common))

main()
