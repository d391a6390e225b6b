#!/usr/bin/env python3
"""power.py — the GPU's power and SM clock while a command runs.

    python3 bench/power.py [--gpu I] [--every MS] [--log F] [--smi PATH] -- CMD ARGS...

Runs CMD (its output passes through), sampling nvidia-smi every MS milliseconds (default 10) on
GPU I (default 0), and prints one line after it: over the busy samples (utilization ≥ 95 %, the
training steps rather than the set-up or a compile), the board's power (median, 10th and 90th
percentiles), the share of them in which the driver held the clock down for the software power
cap (clocks_event_reasons bit 0x4), and the SM clock. In a step at the cap all along, the clock
its GEMMs get is set by the power it draws, not by the library, and a kernel's gain timed alone
need not show in the step (bench/RESULTS.md, the twenty-fourth session). --log F keeps the samples;
--smi PATH runs that nvidia-smi (default: the one on PATH). Where nvidia-smi cannot be run, the
command still runs and the line says its power was not measured (a benchmark is not lost to it).
Exits with CMD's status; 2 on bad arguments or when CMD cannot be run.
"""
import csv
import os
import subprocess
import sys
import tempfile

FIELDS = ["timestamp", "power.draw.instant", "clocks.sm", "utilization.gpu",
          "clocks_event_reasons.active", "power.limit", "clocks.max.sm"]
OLD = ["timestamp", "power.draw", "clocks.sm", "utilization.gpu",
       "clocks_throttle_reasons.active", "power.limit", "clocks.max.sm"]


def usage(msg):
    sys.stderr.write("power.py: %s\nusage: power.py [--gpu I] [--every MS] [--log F] [--smi PATH] "
                     "-- CMD...\n" % msg)
    sys.exit(2)


def num(s):
    try:
        return float(s.strip().split()[0])
    except (ValueError, IndexError):
        return None


def bits(s):
    try:
        return int(s.strip(), 16)
    except ValueError:
        return 0


def run(cmd):
    """CMD's exit status; 2, and one sentence, when it cannot be started"""
    try:
        return subprocess.call(cmd)
    except OSError as e:
        sys.stderr.write("power.py: cannot run %s (%s)\n" % (cmd[0], e))
        return 2


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv):
    gpu, every, log, smi = "0", 10, None, "nvidia-smi"
    if "--" not in argv:
        usage("the command goes after --")
    k = argv.index("--")
    opts, cmd = argv[:k], argv[k + 1:]
    if not cmd:
        usage("no command after --")
    i = 0
    while i < len(opts):
        if opts[i] in ("--gpu", "--every", "--log", "--smi") and i + 1 < len(opts):
            v = opts[i + 1]
            if opts[i] == "--gpu":
                gpu = v
            elif opts[i] == "--every":
                if not v.isdigit() or int(v) < 1:
                    usage("--every takes a whole number of milliseconds, at least 1")
                every = int(v)
            elif opts[i] == "--log":
                log = v
            else:
                smi = v
            i += 2
        else:
            usage("unknown argument %r" % opts[i])
    fields, why = FIELDS, None
    probe = [smi, "-i", gpu, "--format=csv,noheader,nounits"]
    try:
        if subprocess.run(probe + ["--query-gpu=" + ",".join(FIELDS)],
                          capture_output=True).returncode != 0:
            fields = OLD
            if subprocess.run(probe + ["--query-gpu=" + ",".join(OLD)],
                              capture_output=True).returncode != 0:
                why = "%s cannot query GPU %s" % (smi, gpu)
    except OSError as e:
        why = "%s cannot be run (%s)" % (smi, e)
    if why:  # the benchmark still runs; only its power goes unmeasured
        sys.stderr.write("power.py: %s; running the command without measuring its power\n" % why)
        print("power | not measured: %s" % why)
        return run(cmd)
    samples = log or tempfile.mkstemp(suffix=".csv")[1]
    with open(samples, "w") as f:
        sampler = subprocess.Popen(probe + ["--query-gpu=" + ",".join(fields), "-lms", str(every)],
                                   stdout=f, stderr=subprocess.DEVNULL)
        rc = run(cmd)
        sampler.terminate()
        sampler.wait()
    rows = [r for r in csv.reader(open(samples)) if len(r) == len(fields)]
    if not log:
        os.unlink(samples)
    busy = [r for r in rows if (num(r[3]) or 0) >= 95 and num(r[1]) is not None]
    if not busy:
        print("power | no busy samples (utilization ≥ 95 %%) among %d" % len(rows))
        return rc
    w = [num(r[1]) for r in busy]
    clk = [c for c in (num(r[2]) for r in busy) if c is not None]
    cap = sum(1 for r in busy if bits(r[4]) & 0x4)
    print("power | %d busy samples of %d (%d ms apart) | board %.0f W median (p10 %.0f, p90 %.0f; "
          "limit %s W) | software power cap %.0f %% of them | SM clock %.0f MHz median (%.0f-%.0f; "
          "max %s)" % (len(busy), len(rows), every, pct(w, 0.5), pct(w, 0.1), pct(w, 0.9),
                       busy[0][5].strip(), 100.0 * cap / len(busy), pct(clk, 0.5), min(clk),
                       max(clk), busy[0][6].strip()))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
