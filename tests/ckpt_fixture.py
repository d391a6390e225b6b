"""ckpt_fixture.py OUT — files written by Python's `safetensors` package for tests/test_ckpt.c --py:
  OUT/fixture.safetensors   F32, F16 (values k*0.25 - 3) and I32 (k - 5) tensors of 0..3 dims
  OUT/hf/                   a tiny Hugging Face Llama directory: config.json (GQA: 4 heads, 2 kv heads),
                            two shards model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json,
                            some tensors F16, the rest F32, and an extra tensor (rotary inv_freq) to ignore
  OUT/hf_raw/<name>.f32     each weight as float32, what the reader must produce"""
import json, os, sys
import numpy as np
from safetensors.numpy import save_file

out = sys.argv[1]
os.makedirs(os.path.join(out, "hf"), exist_ok=True)
os.makedirs(os.path.join(out, "hf_raw"), exist_ok=True)

def ramp(shape, dt):
    n = int(np.prod(shape)) if len(shape) else 1
    return (np.arange(n, dtype=np.float64) * 0.25 - 3).astype(dt).reshape(shape)

save_file({
    "scalar": ramp((), np.float32),
    "vec_f32": ramp((7,), np.float32),
    "mat_f16": ramp((3, 5), np.float16),
    "cube_f32": ramp((2, 3, 4), np.float32),
    "ints": (np.arange(6, dtype=np.int32) - 5).reshape(2, 3),
    "empty": np.zeros((0, 4), np.float32),
}, os.path.join(out, "fixture.safetensors"), metadata={"format": "pt"})

L, C, NH, NKV, F, V = 2, 32, 4, 2, 64, 64
HS = C // NH
rng = np.random.default_rng(0)
w = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,), "lm_head.weight": (V, C)}
for l in range(L):
    p = "model.layers.%d." % l
    w.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
              p + "self_attn.q_proj.weight": (NH * HS, C), p + "self_attn.k_proj.weight": (NKV * HS, C),
              p + "self_attn.v_proj.weight": (NKV * HS, C), p + "self_attn.o_proj.weight": (C, NH * HS),
              p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C), p + "mlp.down_proj.weight": (C, F)})
shards = [{}, {}]
for i, (name, shape) in enumerate(sorted(w.items())):
    x = (rng.standard_normal(shape) * 0.05).astype(np.float16 if i % 2 else np.float32)
    shards[i % 2][name] = x
    x.astype(np.float32).tofile(os.path.join(out, "hf_raw", name + ".f32"))
shards[0]["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(HS // 2, np.float32)
wm = {}
for k, s in enumerate(shards):
    fn = "model-%05d-of-00002.safetensors" % (k + 1)
    save_file(s, os.path.join(out, "hf", fn), metadata={"format": "pt"})
    wm.update({n: fn for n in s})
json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, open(os.path.join(out, "hf", "model.safetensors.index.json"), "w"), indent=2)
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C, "intermediate_size": F,
           "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV, "vocab_size": V,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16",
           "hidden_act": "silu", "max_position_embeddings": 128, "rope_scaling": None},
          open(os.path.join(out, "hf", "config.json"), "w"), indent=2)
print("ckpt_fixture: wrote", out)
