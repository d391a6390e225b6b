"""Summarises Nsight Compute's source page (ncu -i R --page source --csv --print-source sass) of
one kernel: warp-stall samples and executed instructions in all, the stall reasons, executed
instructions by opcode, and the SASS lines with the most samples. Usage: ncu_src.py FILE.csv [N]"""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
hdr, data = rows[1], rows[2:]
ix = {h: i for i, h in enumerate(hdr)}


def num(r, c):
    try:
        return float(r[ix[c]].replace(",", ""))
    except (KeyError, ValueError):
        return 0.0


S = "Warp Stall Sampling (All Samples)"
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = collections.Counter()
ops = collections.Counter()
for r in data:
    for s in stalls:
        tot[s] += num(r, s)
    w = r[ix["Source"]].split()
    o = (w[1] if w and w[0].startswith("@") and len(w) > 1 else w[0] if w else "").split(".")[0]
    ops[o] += num(r, "Instructions Executed")
samples = sum(num(r, S) for r in data)
print(rows[0][1][:120])
print("SASS lines %d, instructions executed %.3e, stall samples %d" %
      (len(data), sum(num(r, "Instructions Executed") for r in data), samples))
print("stalls: " + ", ".join("%s %.1f%%" % (s[6:], 100 * v / max(samples, 1))
                             for s, v in tot.most_common(10)))
print("opcodes: " + ", ".join("%s %.2e" % (o, v) for o, v in ops.most_common(20)))
for i, r in sorted(enumerate(data), key=lambda x: -num(x[1], S))[:top]:
    st = sorted(((num(r, s), s[6:]) for s in stalls), reverse=True)[:3]
    print("%5d %-58s %6d ex %9d  %s" % (i, r[ix["Source"]][:58], num(r, S),
                                        num(r, "Instructions Executed"),
                                        " ".join("%s:%d" % (b, a) for a, b in st if a)))
