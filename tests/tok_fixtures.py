"""tok_fixtures.py [TINYSHAKESPEARE] — the byte-level BPE fixtures of tests/test_tok.c, made with
Hugging Face's `tokenizers` (pip install tokenizers), which make test does not need:

  tests/tok/gpt2.json     a BPE of 1000 tokens trained on tinyshakespeare, GPT-2's pre-tokeniser
                          (ByteLevel with its regex), a special token and added tokens (special,
                          lstrip, rstrip, not normalized, holding a space)
  tests/tok/gpt2p.json    the same with add_prefix_space (a space before every segment)
  tests/tok/llama3.json   a BPE of 1200 tokens, Llama-3's pre-tokeniser (its Split regex, then
                          ByteLevel without one), ignore_merges, special tokens, TemplateProcessing
  tests/tok/*.txt         the texts: a slice of tinyshakespeare (shakes), mixed scripts, digits,
                          emoji and runs of whitespace (mixed), random characters from every class
                          (random), the edges of every range of the Unicode table (edges), added
                          tokens that take the white space beside them (strip)
  tests/tok/NAME.TEXT.ids tokenizers' encode(text, add_special_tokens=False).ids, one per line
                          (all texts but edges)
  tests/tok/PAT.TEXT.cuts the pre-tokeniser's pieces (gpt2 and llama3 patterns) as byte lengths
  tests/tok/NAME.dec.*    random id sequences and tokenizers' decode of them (skip_special_tokens
                          False and True; invalid UTF-8 becomes U+FFFD)

It also rewrites the Unicode table in ultrascale.h (// >>tokenizer, between the tok-table
markers): the letters (\\p{L}) and numbers (\\p{N}) as the regex engine of `tokenizers`
(Oniguruma) sees them, found by asking that engine about every code point (Python's unicodedata
is an older Unicode: it misses thousands of letters the engine knows). White space is fixed in
the C code: the 25 code points of Unicode's White_Space, which the script checks."""
import os, random, shutil, subprocess, sys
from tokenizers import Tokenizer, Regex, AddedToken, models, pre_tokenizers, decoders, trainers
from tokenizers import processors

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tok")
SRC = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data/tinyshakespeare.txt"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
WHITE_SPACE = [0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680] + list(range(0x2000, 0x200B)) + \
              [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
os.makedirs(OUT, exist_ok=True)
text = open(SRC, encoding="utf-8").read()


def unicode_classes():
    """The code points the engine puts in \\p{L}, \\p{N} and \\s: Split removes the matches."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    every = "".join(chr(c) for c in cps)

    def members(pat):
        split = pre_tokenizers.Split(Regex(pat), behavior="removed")
        rest = set("".join(p for p, _ in split.pre_tokenize_str(every)))
        return set(c for c in cps if chr(c) not in rest)

    return members(r"\p{L}"), members(r"\p{N}"), members(r"\s")


def ranges(s, cls):
    out = []
    for c in sorted(s):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c, cls])
    return out


def write_table(L, N):
    table = sorted(ranges(L, 0) + ranges(N, 1))
    cells = ["{0x%x, 0x%x, %d}," % tuple(r) for r in table]
    lines, line = [], "   "
    for c in cells:
        if len(line) + 1 + len(c) > 100:
            lines.append(line)
            line = "   "
        line += " " + c
    lines.append(line)
    path = os.path.join(HERE, "..", "ultrascale.h")
    src = open(path, encoding="utf-8").read()
    begin, end = "/* tok-table begin */\n", "    /* tok-table end */"
    a, b = src.index(begin) + len(begin), src.index(end)
    open(path, "w", encoding="utf-8").write(src[:a] + "\n".join(lines) + "\n" + src[b:])
    if shutil.which("clang-format-14"):  # the layout make test checks
        subprocess.run(["clang-format-14", "-i", path], check=True)
    return table


def train(vocab, pre, specials, ignore_merges):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([text[i:i + 4096] for i in range(0, len(text), 4096)], trainer)
    return tok


def mixed_text():
    return ("First Citizen:\nBefore we proceed any further, hear me speak.\r\n\r\n"
            "It's, IT'S, they'll THEY'LL we'Re you've I'm he'd 'ſtuff' rock'n'roll '' '\n"
            "Ünïcödé naïve café — Straße ĳssel; Ελληνικά κείμενο; Русский текст; "
            "עברית ועוד; العربية ٣٤٥; हिन्दी पाठ; 中文文本，日本語のテキスト。한국어 텍스트; "
            "ภาษาไทย; ქართული; Ⅻ Ⅷ ½ ² ³ ⑩ １２３ ٠١٢ ߁߂ 𝟘𝟙𝟚\n"
            "digits 0 12 345 6789 1234567890 3.14159 1,000,000 2024-05-20 x86_64 ab12cd345\n"
            "emoji 😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ☃ 🦀rust 🎉!!! ok👌ok\n"
            "runs:  two   three    four\t\ttabs \t mixed\n\n\nthree newlines\r\n\r\ncrlf\n"
            "\u00a0nbsp\u00a0\u00a0two\u3000ideographic\u2028line sep\u2029para\u2003em "
            "\u200bzero width\u00adsoft\u0085nel\x0bvt\x0cff\x1cfs\x1fus\n"
            "  leading spaces and trailing spaces   \n"
            "punct!!! ??? ... --- *** ((x)) [y] {z} <a href=\"q\">§¶†‡•…‰′″</a> #1 @me $5 %d ^_^\n"
            "specials <|endoftext|> and <|im_start|>user hi<|im_end|> x<|eot_id|>"
            "<|begin_of_text|>  thou art and MASK here and [SEP]next\n"
            "control \x01\x02\x7f del, combining e\u0301 a\u0308 n\u0303, "
            "zwj a\u200db, bom \ufeff, private \ue000, last \U0010fffd end   ")


def random_text(rng, n):
    pools = ["abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789",
             "     ", "\n\n\r\t", "'''", "sStTrReEvVmMlLdDſ", ".,;:!?-_()[]{}<>\"/\\|@#$%^&*+=~`",
             "éüßñøåçÆŒ", "αβγδΑΒΓΔ", "абвгдАБВГД", "中文字日本語한국어", "٠١٢٣४५६", "Ⅻ½²³⑩",
             "😀👍🏽🇫🇷❤️☃", "\u00a0\u3000\u2028\u2003\u0085\x0b", "\u0301\u0308\u200d\u200b",
             "\x00\x01\x1c\x7f"]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def edges_text(table):
    """Each range's first and last code point and their neighbours, between letters, digits and
    spaces, so that a wrong class changes where a piece ends."""
    cps = set()
    for lo, hi, _ in table:
        cps.update(c for c in (lo - 1, lo, hi, hi + 1) if 0 < c < 0x110000 and not 0xD800 <= c < 0xE000)
    cps.update(WHITE_SPACE)
    glue = ["a", "1", " ", "' ", "x1", " !", "\n"]
    return "".join(chr(c) + glue[i % len(glue)] for i, c in enumerate(sorted(cps)))


def write_ids(path, ids):
    open(path, "w").write("".join("%d\n" % i for i in ids))


def main():
    L, N, S = unicode_classes()
    assert sorted(S) == WHITE_SPACE, "the engine's \\s is not White_Space"
    assert not (L & N)
    table = write_table(L, N)
    print("unicode table: %d letters, %d numbers, %d ranges" % (len(L), len(N), len(table)))

    gpt2 = train(1000, pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"], False)
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
    gpt2.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    gpt2.add_tokens([AddedToken(" MASK", lstrip=True, rstrip=False, normalized=True),
                     AddedToken("[SEP]", rstrip=True, normalized=False),
                     AddedToken("thou art", normalized=True)])
    gpt2p = Tokenizer.from_str(gpt2.to_str())
    gpt2p.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)

    llama = train(1200, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        ["<|begin_of_text|>", "<|end_of_text|>"], True)
    llama.add_special_tokens(["<|eot_id|>"])
    llama.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])

    rng = random.Random(20240520)
    start = len(text) // 2
    texts = {"shakes": text[start:start + 12000], "mixed": mixed_text(),
             "random": random_text(rng, 6000), "edges": edges_text(table),
             "strip": "a [SEP]   b  [SEP]\t\n c   MASK d\n\n MASK  [SEP] MASK thou art thou  art"}
    for name, t in texts.items():
        open(os.path.join(OUT, name + ".txt"), "w", encoding="utf-8", newline="").write(t)

    toks = {"gpt2": gpt2, "gpt2p": gpt2p, "llama3": llama}
    for name, tok in toks.items():
        tok.save(os.path.join(OUT, name + ".json"))
        for tname, t in texts.items():
            if tname == "edges" or (name == "gpt2p" and tname == "random"):
                continue  # the edges text checks the pre-tokenisers' cuts (the table) only
            ids = tok.encode(t, add_special_tokens=False).ids
            # lstrip / rstrip drop the white space they take, add_prefix_space adds some: those
            # do not come back
            back = tok.decode(ids, skip_special_tokens=False) == t
            assert back or name == "gpt2p" or tname == "strip", (name, tname)
            write_ids(os.path.join(OUT, "%s.%s.ids" % (name, tname)), ids)
        if name == "gpt2p":
            continue
        n = tok.get_vocab_size(with_added_tokens=True)
        seqs = [[rng.randrange(n) for _ in range(rng.randrange(1, 12))] for _ in range(300)]
        for skip in (0, 1):
            lines = [" ".join(map(str, s)) + "\t" +
                     tok.decode(s, skip_special_tokens=bool(skip)).encode("utf-8").hex() for s in seqs]
            open(os.path.join(OUT, "%s.dec%d" % (name, skip)), "w").write("\n".join(lines) + "\n")

    for pname, pat in (("gpt2", GPT2), ("llama3", LLAMA3)):
        split = pre_tokenizers.Split(Regex(pat), behavior="isolated")
        for tname in ("mixed", "random", "edges"):
            pieces = split.pre_tokenize_str(texts[tname])
            write_ids(os.path.join(OUT, "%s.%s.cuts" % (pname, tname)),
                      [len(p.encode("utf-8")) for p, _ in pieces])
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print("wrote %d files, %d bytes, into %s" % (len(os.listdir(OUT)), total, OUT))


main()
