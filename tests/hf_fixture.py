"""hf_fixture.py — Hugging Face Llama fixtures for `test_ckpt --hf` (tests/test_hf.sh): what
transformers computes for a small model, kept in tests/hf/NAME/ so that make test checks our
loader, RoPE, forward and backward against it without transformers installed.

  python3 tests/hf_fixture.py weights tests/hf/NAME OUT   (numpy + safetensors only)
      OUT/config.json and OUT/model.safetensors: the fixture's weights, made again from its seed
      bit for bit as transformers saved them (too large to keep: 128256 vocabulary rows)
  python3 tests/hf_fixture.py make [NAME ...]             (torch + transformers)
      builds each fixture with transformers: LlamaForCausalLM with the weights above,
      save_pretrained (checked equal to what `weights` writes), then in fp32 (eager attention)
      the logits, loss and gradients of a fixed token batch into tests/hf/NAME/expected.safetensors
  python3 tests/hf_fixture.py ours tests/hf/NAME DIR      (torch + transformers)
      transformers loads DIR, a checkpoint this library saved from the fixture (test_ckpt --hf
      ... SAVE): the same RoPE, and the expected logits and loss within 1e-5 of their scale

The fixtures:
  llama32   Llama-3.2-1B's shape made small: tied embeddings, vocabulary 128256, GQA 4:1, head
            size 16, 2 layers, bf16 weights, rope_theta 500000 with llama3 scaling (factor 32,
            low 1, high 4) in transformers 4.x's layout (rope_theta + rope_scaling, as the Hub's
            config.json has it); the original context is 64 rather than 8192 so that the scaling
            acts within the test's 24 positions
  t5base    transformers 5.x's own layout (rope_parameters, no top-level rope_theta) with a
            base that is not the default (50000), untied, fp32 weights
expected.safetensors holds: tokens, targets I32 [B, T]; inv_freq F32 [HS/2] (transformers'
rotary_emb.inv_freq); loss F32 [1] (mean cross-entropy over B·T); cols I32 [K] and logits F32
[B, T, K] (every position's logits at K columns: a stride, and the targets); lse F32 [B, T] (the
log-sum-exp over the whole vocabulary); grad.NAME F32 for every weight, the embedding's at rows
I32 [R] (the batch's tokens and a stride) when the vocabulary is large."""
import json, os, shutil, struct, sys, tempfile, zlib
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = {
    "llama32": dict(
        config={"vocab_size": 128256, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "rms_norm_eps": 1e-5,
                "tie_word_embeddings": True, "max_position_embeddings": 2048, "rope_theta": 500000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                "bos_token_id": 128000, "eos_token_id": 128001},
        layout4=True, dtype="bfloat16", seed=32, B=2, T=24, col_stride=509, row_stride=997),
    "t5base": dict(
        config={"vocab_size": 256, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "rms_norm_eps": 1e-6,
                "tie_word_embeddings": False, "max_position_embeddings": 256,
                "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}},
        layout4=False, dtype="float32", seed=5, B=2, T=20, col_stride=1, row_stride=1),
}


def names_shapes(c):
    """every weight transformers saves: name -> shape (a tied head is not saved)"""
    C, F, V, HS = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    NH, NKV = c["num_attention_heads"], c["num_key_value_heads"]
    w = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = (V, C)
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        w.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                  p + "self_attn.q_proj.weight": (NH * HS, C), p + "self_attn.k_proj.weight": (NKV * HS, C),
                  p + "self_attn.v_proj.weight": (NKV * HS, C), p + "self_attn.o_proj.weight": (C, NH * HS),
                  p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                  p + "mlp.down_proj.weight": (C, F)})
    return w


def levels(seed, name, n):
    """n integers in [-128, 128) from splitmix64 of (seed, crc32(name), index): the same on every
    machine and numpy version"""
    M = np.uint64(0xFFFFFFFFFFFFFFFF)
    key = np.uint64(((seed << 32) ^ zlib.crc32(name.encode())) & 0xFFFFFFFFFFFFFFFF)
    z = (np.arange(n, dtype=np.uint64) + key) * np.uint64(0x9E3779B97F4A7C15) & M
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9) & M
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB) & M
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(56)).astype(np.int64) - 128


def weights(fx):
    """name -> float32 array; every value k/128 times a power of two, exact in bf16"""
    out = {}
    for name, shape in names_shapes(fx["config"]).items():
        k = levels(fx["seed"], name, int(np.prod(shape)))
        u = k.astype(np.float64) / 128.0
        if name.endswith("norm.weight"):
            v = 1.0 + (k // 4) / 128.0  # RMSNorm gains around 1, on bf16's grid there
        elif "embed_tokens" in name or name == "lm_head.weight":
            v = u / 8
        else:
            v = u / 8
        out[name] = v.astype(np.float32).reshape(shape)
    return out


def save_safetensors(path, tensors, dtype):
    """safetensors as transformers writes it (metadata format pt), F32 or BF16 (numpy has no bf16:
    the top halves of the fp32 bits, exact for these values)"""
    hdr, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dtype == "bfloat16":
            b = (a.view(np.uint32) >> np.uint32(16)).astype("<u2").tobytes()
        else:
            b = a.astype("<f4").tobytes()
        hdr[name] = {"dtype": "BF16" if dtype == "bfloat16" else "F32", "shape": list(a.shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def fixture_of(d):
    name = os.path.basename(os.path.normpath(d))
    if name not in FIX:
        sys.exit("hf_fixture: %s is not one of the fixtures (%s)" % (d, ", ".join(FIX)))
    return name, FIX[name]


def cmd_weights(d, out):
    _, fx = fixture_of(d)
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(d, "config.json"), os.path.join(out, "config.json"))
    save_safetensors(os.path.join(out, "model.safetensors"), weights(fx), fx["dtype"])
    print("hf_fixture: wrote %s (config.json, model.safetensors)" % out)


def batch(fx):
    V, B, T = fx["config"]["vocab_size"], fx["B"], fx["T"]
    toks = (levels(fx["seed"] + 1, "tokens", B * (T + 1)) + 128) * 1000003 % V
    toks = toks.reshape(B, T + 1).astype(np.int32)
    return toks[:, :T].copy(), toks[:, 1:].copy()


def hf_outputs(model, fx, toks, tgts):
    """transformers' fp32 logits, loss and gradients for the batch, as expected.safetensors holds them"""
    import torch
    c, V = fx["config"], fx["config"]["vocab_size"]
    model.zero_grad()
    logits = model(torch.from_numpy(toks).long()).logits.float()                    # [B, T, V]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.from_numpy(tgts).long().reshape(-1))
    loss.backward()
    cols = sorted(set(range(0, V, fx["col_stride"])) | set(tgts.reshape(-1).tolist()))
    rows = sorted(set(range(0, V, fx["row_stride"])) | set(toks.reshape(-1).tolist()) | set(tgts.reshape(-1).tolist()))
    lg = logits.detach()
    ex = {"tokens": toks, "targets": tgts, "loss": np.array([loss.item()], np.float32),
          "cols": np.array(cols, np.int32), "logits": lg[:, :, cols].numpy().astype(np.float32),
          "lse": torch.logsumexp(lg.double(), -1).float().numpy(),
          "inv_freq": model.model.rotary_emb.inv_freq.float().numpy().copy()}
    if fx["row_stride"] > 1:
        ex["rows"] = np.array(rows, np.int32)
    params = dict(model.named_parameters())
    for name in names_shapes(c):
        g = params[name].grad.float().numpy()
        if name == "model.embed_tokens.weight" and fx["row_stride"] > 1:
            g = g[rows]
        ex["grad." + name] = np.ascontiguousarray(g, np.float32)
    return ex


def to_layout4(cfg):
    """transformers 5's config.json in 4.x's layout: rope_theta at the top, rope_scaling"""
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    cfg["rope_scaling"] = rp if rp.get("rope_type", "default") != "default" else None
    return cfg


def cmd_make(names):
    import torch
    from safetensors import safe_open
    from safetensors.numpy import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    for name in names:
        fx, d = FIX[name], os.path.join(HERE, "hf", name)
        os.makedirs(d, exist_ok=True)
        w = weights(fx)
        model = LlamaForCausalLM(LlamaConfig(**fx["config"])).float()
        sd = {k: torch.from_numpy(v) for k, v in w.items()}
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        with tempfile.TemporaryDirectory() as tmp:
            model.to(getattr(torch, fx["dtype"])).save_pretrained(tmp)
            cfg = json.load(open(os.path.join(tmp, "config.json")))
            if fx["layout4"]:
                cfg = to_layout4(cfg)
            json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2, sort_keys=True)
            ours = os.path.join(tmp, "numpy")
            cmd_weights(d, ours)                      # the file make test will use, against transformers'
            with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as a, \
                 safe_open(os.path.join(ours, "model.safetensors"), "pt") as b:
                assert set(a.keys()) == set(b.keys()) == set(w), (sorted(a.keys()), sorted(w))
                for k in a.keys():
                    x, y = a.get_tensor(k), b.get_tensor(k)
                    assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), k
            ref = LlamaForCausalLM.from_pretrained(ours, dtype=torch.float32, attn_implementation="eager")
        toks, tgts = batch(fx)
        ex = hf_outputs(ref, fx, toks, tgts)
        save_file(ex, os.path.join(d, "expected.safetensors"), metadata={"transformers": __import__("transformers").__version__,
                                                                          "torch": torch.__version__})
        print("hf_fixture: %s: loss %.6f, rope %s, %d bytes of expected values" % (
            name, ex["loss"][0], ref.config.rope_parameters, os.path.getsize(os.path.join(d, "expected.safetensors"))))


def cmd_ours(d, saved):
    """transformers reloads the checkpoint we saved: the fixture's RoPE, logits and loss"""
    import torch
    from safetensors.numpy import load_file
    from transformers import LlamaForCausalLM
    name, fx = fixture_of(d)
    ex = load_file(os.path.join(d, "expected.safetensors"))
    m = LlamaForCausalLM.from_pretrained(saved, dtype=torch.float32, attn_implementation="eager")
    fails = 0
    e = np.abs(m.model.rotary_emb.inv_freq.float().numpy() - ex["inv_freq"]).max() / np.abs(ex["inv_freq"]).max()
    ok = e <= 1e-6
    print("  %s  transformers reads our config.json of %s as the same RoPE (%s): inv_freq rel err %.2e"
          % ("ok  " if ok else "FAIL", name, m.config.rope_parameters, e))
    fails += not ok
    V = fx["config"]["vocab_size"]
    with torch.no_grad():
        lg = m(torch.from_numpy(ex["tokens"]).long()).logits.float()
    loss = torch.nn.functional.cross_entropy(lg.reshape(-1, V), torch.from_numpy(ex["targets"]).long().reshape(-1)).item()
    got = lg[:, :, torch.from_numpy(ex["cols"]).long()].numpy()
    e = np.abs(got - ex["logits"]).max() / np.abs(ex["logits"]).max()
    el = abs(loss - ex["loss"][0]) / abs(ex["loss"][0])
    ok = e <= 1e-5 and el <= 1e-5
    print("  %s  transformers on our saved %s: logits rel err %.2e, loss rel err %.2e" % ("ok  " if ok else "FAIL", name, e, el))
    fails += not ok
    print("test_hf_ours: %d passed, %d failed" % (2 - fails, fails))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) == 3 and a[0] == "weights":
        cmd_weights(a[1], a[2])
    elif a and a[0] == "make" and all(n in FIX for n in a[1:]):
        cmd_make(a[1:] or sorted(FIX))
    elif len(a) == 3 and a[0] == "ours":
        cmd_ours(a[1], a[2])
    else:
        sys.exit(__doc__)
