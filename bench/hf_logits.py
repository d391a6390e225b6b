"""hf_logits.py DIR TOKENS.i32 B T OURS.f32 — the reference logits of checkpoint DIR by Hugging Face's
Llama, compared with ours (examples/hf_logits.c). Uses, in this order of preference:
  transformers  LlamaForCausalLM.from_pretrained(DIR), fp32
  torch         a self-contained re-implementation of HF Llama's forward (rotate_half RoPE,
                RMSNorm, GQA by repeat_kv, SwiGLU), weights read with json + struct from the files
  numpy         the same forward in numpy (float64) when torch is missing
Prints the engine and the max |ours − reference| over B x V last-position logits."""
import json, os, struct, sys

d, tokf, B, T, oursf = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
cfg = json.load(open(os.path.join(d, "config.json")))
toks = list(struct.unpack("<%di" % (B * T), open(tokf, "rb").read()))
V = cfg["vocab_size"]
ours = struct.unpack("<%df" % (B * V), open(oursf, "rb").read())

def read_safetensors(d):
    """name -> (dtype, shape, bytes) from model.safetensors or the shards of an index"""
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    out = {}
    for fn in files:
        raw = open(os.path.join(d, fn), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8:8 + n])
        for k, v in hdr.items():
            if k == "__metadata__": continue
            a, b = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], raw[8 + n + a: 8 + n + b])
    return out

engine = None
ref = None
try:
    import torch
    torch.set_grad_enabled(False)
    try:
        from transformers import LlamaForCausalLM
        model = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
        x = torch.tensor(toks, dtype=torch.long).view(B, T)
        ref = model(x).logits[:, -1, :].double().flatten().tolist()
        engine = "transformers LlamaForCausalLM"
    except ImportError:
        pass
except ImportError:
    torch = None

if ref is None:
    W = read_safetensors(d)
    C, L, NH = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads", NH); HS = C // NH
    rp = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}   # transformers 4.x / 5.x
    eps, theta = cfg.get("rms_norm_eps", 1e-6), rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    def inv_freqs(ar):   # transformers' default RoPE, and its llama3 rule (_compute_llama3_parameters)
        inv = 1.0 / theta ** (ar / HS)
        if rp.get("rope_type", rp.get("type", "default")) == "llama3":
            f, lo, hi, L = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"], rp["original_max_position_embeddings"]
            for j in range(len(inv)):
                wl = 2 * 3.141592653589793 / float(inv[j])
                s = (L / wl - lo) / (hi - lo)
                inv[j] = inv[j] / f if wl > L / lo else inv[j] if wl < L / hi else (1 - s) * inv[j] / f + s * inv[j]
        return inv
    if torch is not None:
        def t(name):
            dt, shape, raw = W[name]
            if dt == "BF16":
                return (torch.frombuffer(bytearray(raw), dtype=torch.int16).to(torch.int32) << 16).view(torch.float32).view(shape).double()
            return torch.frombuffer(bytearray(raw), dtype={"F32": torch.float32, "F16": torch.float16}[dt]).view(shape).double()
        def rms(x, w): return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w
        def rot(x): h = x.shape[-1] // 2; return torch.cat((-x[..., h:], x[..., :h]), -1)   # HF rotate_half
        inv = inv_freqs(torch.arange(0, HS, 2, dtype=torch.float64))
        ang = torch.outer(torch.arange(T, dtype=torch.float64), inv); ang = torch.cat((ang, ang), -1)
        cos, sin = ang.cos(), ang.sin()
        x = t("model.embed_tokens.weight")[torch.tensor(toks).view(B, T)]
        mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
        for l in range(L):
            p = "model.layers.%d." % l
            h = rms(x, t(p + "input_layernorm.weight"))
            q = (h @ t(p + "self_attn.q_proj.weight").T).view(B, T, NH, HS).transpose(1, 2)
            k = (h @ t(p + "self_attn.k_proj.weight").T).view(B, T, NKV, HS).transpose(1, 2)
            v = (h @ t(p + "self_attn.v_proj.weight").T).view(B, T, NKV, HS).transpose(1, 2)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            k, v = k.repeat_interleave(NH // NKV, 1), v.repeat_interleave(NH // NKV, 1)   # HF repeat_kv
            a = torch.softmax(q @ k.transpose(-1, -2) / HS ** 0.5 + mask, -1) @ v
            x = x + a.transpose(1, 2).reshape(B, T, C) @ t(p + "self_attn.o_proj.weight").T
            h = rms(x, t(p + "post_attention_layernorm.weight"))
            g, u = h @ t(p + "mlp.gate_proj.weight").T, h @ t(p + "mlp.up_proj.weight").T
            x = x + (torch.nn.functional.silu(g) * u) @ t(p + "mlp.down_proj.weight").T
        x = rms(x, t("model.norm.weight"))
        head = t("lm_head.weight") if "lm_head.weight" in W else t("model.embed_tokens.weight")
        ref = (x[:, -1, :] @ head.T).flatten().tolist()
        engine = "torch %s re-implementation of HF Llama (float64)" % torch.__version__
    else:
        import numpy as np
        def t(name):
            dt, shape, raw = W[name]
            if dt == "BF16":
                return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape).astype(np.float64)
            return np.frombuffer(raw, {"F32": np.float32, "F16": np.float16}[dt]).reshape(shape).astype(np.float64)
        def rms(x, w): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
        def rot(x): h = x.shape[-1] // 2; return np.concatenate((-x[..., h:], x[..., :h]), -1)
        inv = inv_freqs(np.arange(0, HS, 2, dtype=np.float64))
        ang = np.outer(np.arange(T, dtype=np.float64), inv); ang = np.concatenate((ang, ang), -1)
        cos, sin = np.cos(ang), np.sin(ang)
        x = t("model.embed_tokens.weight")[np.array(toks).reshape(B, T)]
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for l in range(L):
            p = "model.layers.%d." % l
            h = rms(x, t(p + "input_layernorm.weight"))
            q = (h @ t(p + "self_attn.q_proj.weight").T).reshape(B, T, NH, HS).transpose(0, 2, 1, 3)
            k = (h @ t(p + "self_attn.k_proj.weight").T).reshape(B, T, NKV, HS).transpose(0, 2, 1, 3)
            v = (h @ t(p + "self_attn.v_proj.weight").T).reshape(B, T, NKV, HS).transpose(0, 2, 1, 3)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            k, v = np.repeat(k, NH // NKV, 1), np.repeat(v, NH // NKV, 1)
            s = q @ k.transpose(0, 1, 3, 2) / HS ** 0.5 + mask
            s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
            x = x + (s @ v).transpose(0, 2, 1, 3).reshape(B, T, C) @ t(p + "self_attn.o_proj.weight").T
            h = rms(x, t(p + "post_attention_layernorm.weight"))
            g, u = h @ t(p + "mlp.gate_proj.weight").T, h @ t(p + "mlp.up_proj.weight").T
            x = x + (g / (1 + np.exp(-g)) * u) @ t(p + "mlp.down_proj.weight").T
        x = rms(x, t("model.norm.weight"))
        head = t("lm_head.weight") if "lm_head.weight" in W else t("model.embed_tokens.weight")
        ref = (x[:, -1, :] @ head.T).flatten().tolist()
        engine = "numpy re-implementation of HF Llama (float64)"

diff = max(abs(a - b) for a, b in zip(ours, ref))
scale = max(abs(b) for b in ref)
print("hf_logits: reference = %s" % engine)
print("hf_logits: %d x %d logits, max |ours - reference| = %.3e (max |logit| %.3f)" % (B, V, diff, scale))
tol = 1e-4 * max(1.0, scale)
print("hf_logits: %s (tolerance %.1e: fp32 vs the reference's own rounding)" % ("PASS" if diff <= tol else "FAIL", tol))
sys.exit(0 if diff <= tol else 1)
