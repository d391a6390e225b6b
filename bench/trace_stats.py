#!/usr/bin/env python3
"""Where a traced step's time goes (issue 9): reads a trace written by `train --trace`, keeps the
steps after the first two (the window runs from the end of the second "optimizer step" region to
the end of the last), and prints per rank:

  step      window length per step (ms)
  compute   the union of the compute row's regions (GPU times on a GPU), % of the window
  comm      the union of the communication row's collectives, ms per step, and by kind
  hidden    the share of that communication time during which a compute region was running
  exposed   communication with no compute region running, ms per step
  idle      neither row busy, % of the window
  fwd/bwd   mean forward / backward layer region (ms), the optimizer step region (ms)

A region is a whole layer: a collective issued inside a layer and waited for there (tensor,
sequence, context and expert parallelism) counts as hidden even where the compute stream waits
for it. Those strategies' cost shows instead as longer layer regions than one GPU's with the same
work per rank, which is why fwd/bwd are printed: compare them across runs.

    python3 bench/trace_stats.py run.json[.gz] [--label NAME] [--json]"""
import collections, gzip, json, sys


def union(iv):
    iv = sorted(iv)
    out = []
    for a, b in iv:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(iv):
    return sum(b - a for a, b in iv)


def intersect_len(a_iv, b_union):
    """total length of the intervals a_iv (not merged) inside the merged intervals b_union"""
    tot, j = 0.0, 0
    for a, b in sorted(a_iv):
        while j < len(b_union) and b_union[j][1] <= a:
            j += 1
        k = j
        while k < len(b_union) and b_union[k][0] < b:
            tot += max(0.0, min(b, b_union[k][1]) - max(a, b_union[k][0]))
            k += 1
    return tot


def clip(iv, lo, hi):
    return [(max(a, lo), min(b, hi)) for a, b in iv if b > lo and a < hi]


def stats(path):
    ev = json.load(gzip.open(path, "rt") if path.endswith(".gz") else open(path))["traceEvents"]
    ranks = collections.defaultdict(lambda: collections.defaultdict(list))
    for e in ev:
        if e.get("ph") == "X":
            ranks[e["pid"]][e["tid"]].append(e)
    out = {}
    for r in sorted(ranks):
        comp = [e for e in ranks[r][0] if e.get("cat") == "compute"]   # on the CPU the host waits share the row
        comm = ranks[r][1]
        opt = sorted((e for e in comp if e["name"] == "optimizer step"), key=lambda e: e["ts"])
        if len(opt) < 3:
            continue
        lo, hi = opt[1]["ts"] + opt[1]["dur"], opt[-1]["ts"] + opt[-1]["dur"]
        nsteps = len(opt) - 2
        cu = union(clip([(e["ts"], e["ts"] + e["dur"]) for e in comp], lo, hi))
        civ = clip([(e["ts"], e["ts"] + e["dur"]) for e in comm], lo, hi)
        cmu = union(civ)
        busy = union(cu + cmu)
        kinds = collections.defaultdict(lambda: [0.0, 0.0])
        for e in comm:
            iv = clip([(e["ts"], e["ts"] + e["dur"])], lo, hi)
            if not iv:
                continue
            k = e["name"].split(" ")[0]
            kinds[k][0] += length(iv)
            kinds[k][1] += intersect_len(iv, cu)
        comm_len = length(cmu)
        hidden = intersect_len([tuple(x) for x in cmu], cu)
        W = hi - lo

        def mean(name):
            d = [e["dur"] for e in comp if e["name"].startswith(name) and lo <= e["ts"] < hi]
            return sum(d) / len(d) / 1e3 if d else 0.0
        out[r] = dict(steps=nsteps, step_ms=W / nsteps / 1e3, compute_pct=100 * length(cu) / W,
                      comm_ms=comm_len / nsteps / 1e3, hidden_pct=100 * hidden / comm_len if comm_len else 0.0,
                      exposed_ms=(comm_len - hidden) / nsteps / 1e3, idle_pct=100 * (W - length(busy)) / W,
                      fwd_ms=mean("forward layer"), bwd_ms=mean("backward layer"), opt_ms=mean("optimizer step"),
                      kinds={k: dict(ms=v[0] / nsteps / 1e3, hidden_pct=100 * v[1] / v[0] if v[0] else 0.0) for k, v in kinds.items()})
    return out


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    label = args[args.index("--label") + 1] if "--label" in args else args[0]
    s = stats(args[0])
    if "--json" in args:
        print(json.dumps(s))
        return
    if not s:
        print("%-14s | no window: fewer than 3 optimizer steps traced" % label)
    for r, x in s.items():
        kinds = ", ".join("%s %.1f ms %.0f%% hidden" % (k, v["ms"], v["hidden_pct"]) for k, v in sorted(x["kinds"].items()))
        print("%-14s r%d | step %7.1f ms | compute %5.1f%% | comm %6.1f ms, %5.1f%% hidden, exposed %6.1f ms | idle %5.1f%% | "
              "fwd %.2f bwd %.2f opt %.2f ms | %s" % (label, r, x["step_ms"], x["compute_pct"], x["comm_ms"], x["hidden_pct"],
                                                      x["exposed_ms"], x["idle_pct"], x["fwd_ms"], x["bwd_ms"], x["opt_ms"], kinds or "no comm"))


if __name__ == "__main__":
    main()
