"""bench_tok.py [TEXT] — the tokenizer's encoding speed against Hugging Face tokenizers, one
thread each, on TEXT (default tinyshakespeare), with the fixture tokenizers of tests/tok; also
checks that both give the same ids (an FNV hash of them). Needs build/bench_tok (make
build/bench_tok) and `pip install tokenizers`."""
import os, subprocess, sys, time
os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its pool
from tokenizers import Tokenizer

text_path = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data/tinyshakespeare.txt"
text = open(text_path, encoding="utf-8", newline="").read()
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
for name in ("gpt2", "llama3"):
    path = os.path.join(root, "tests", "tok", name + ".json")
    tok = Tokenizer.from_file(path)
    best = 1e30
    for _ in range(5):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        best = min(best, time.perf_counter() - t0)
    lines = text.splitlines(keepends=True)  # how a corpus is often fed: many short texts
    bl = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        tok.encode_batch(lines, add_special_tokens=False)
        bl = min(bl, time.perf_counter() - t0)
    h = 1469598103934665603
    for i in ids:
        h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    out = subprocess.run([os.path.join(root, "build", "bench_tok"), path, text_path],
                         capture_output=True, text=True, check=True).stdout.split()
    c = dict(zip(out[::2], out[1::2]))
    nbytes = len(text.encode("utf-8"))
    print("%-7s %7d tokens  tokenizers %5.2f MB/s (line by line: %5.2f)  ultrascale %5.2f MB/s"
          "  ids %s" % (name, len(ids), nbytes / best / 1e6, nbytes / bl / 1e6, float(c["MB_s"]),
                        "equal" if c["fnv"] == "%016x" % h and int(c["tokens"]) == len(ids) else
                        "DIFFER"))
