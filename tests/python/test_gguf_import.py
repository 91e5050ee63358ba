#!/usr/bin/env python3
"""Checks scripts/gguf_to_hf.py against transformers' own GGUF loader, on tiny GGUF files written here
(no network, no test data). Plain script (no pytest): prints each check, then a PASS/FAIL line per
case, and exits non-zero if any fails.

    test_gguf_import.py [--keep DIR] [CASE ...]    DIR: keep the files written there; CASE: llama,
                                                   mistral, ..., refusals (default: all)

Each case starts from a tiny Hugging Face model (hidden 64, 2 layers (gemma3: 6), 4 heads, 2
key/value heads, a vocabulary of ~300; random weights of unit scale) and writes it with
gguf.GGUFWriter the way llama.cpp's convert_hf_to_gguf.py does for that architecture: its metadata
keys, its tensor names (gguf's own name map), q/k rows permuted for llama, gemma3's norms stored as
1 + w, phi3's fused attn_qkv / ffn_up and longrope factors as tensors, norms and vectors in F32,
matrices partly Q8_0, Q4_0 and F16, and a small tokenizer (byte-level BPE "gpt2" with merges, or
sentencepiece "llama").
Then:
  (1) scripts/gguf_to_hf.py converts it into a temporary directory;
  (2) that directory loads with AutoModelForCausalLM.from_pretrained(dir), and the GGUF loads with
      transformers' GGUF loader, from_pretrained(gguf_dir, gguf_file=name);
  (3) the two have the same class, the same config essentials (model type, sizes, head_dim,
      rms_norm_eps, rope parameters, tied embeddings, sliding window, special ids), equal state dicts
      and float32 logits within 1e-5 on a fixed token sequence, and the converted tokenizer encodes
      like the GGUF one;
  (4) the converted model also equals the source model the file was written from (its weights
      through the same quantization), so both loaders agreeing on a wrong answer would not pass.
Where transformers' GGUF loader (transformers 5.24, gguf 0.19) cannot reproduce the file, the case
prints the difference as known and relies on the source model for it: the loader ignores phi3's
longrope factors, partial rotary dimension, original context and sliding window (phi3,
phi3_longrope), maps no separate phi3 q/k/v (phi3_split_qkv), leaves MistralConfig's default window
of 4096, and cannot load the weights of a file it calls mistral (gguf-py has no architecture
"mistral"; mistral_named, a llama file it calls llama, compares them). It also ignores a Qwen3
key_length (keeping Qwen3Config's 128), so the qwen3 case uses 128 (!= hidden / heads).
The llama case also checks that the comparison catches a conversion that skips the q/k
un-permutation, and two files must be refused: an unsupported architecture ("bloom": exit code 2,
naming it) and a qwen2 file missing a q bias (naming the tensor). Exits 77 (skipped) when gguf,
numpy, torch or transformers cannot be imported.
"""

import argparse
import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import time
import traceback

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loader draws a tqdm bar
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never ask the Hugging Face hub

try:
    import numpy as np
except ImportError:  # main() says so and skips
    np = None

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "gguf_to_hf.py")
FAILURES = []
LOGIT_TOL = 1e-5


def check(ok, what):
    print(f"[{'PASS' if ok else 'FAIL'}] {what}", flush=True)
    if not ok:
        FAILURES.append(what)
    return ok


def load_converter():
    spec = importlib.util.spec_from_file_location("gguf_to_hf", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------------------------
# Tokenizers, as llama.cpp writes them into the GGUF metadata.

TEXT = "The theory then: in the north, the other three rose at noon."
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SPM_PIECES = ["▁t", "he", "▁the", "in", "on", "er", "▁a", "re", "▁n", "or", "▁o", "▁in", "▁no"]


def bpe_tokenizer(pre):
    """Byte-level BPE (tokenizer.ggml.model "gpt2"): the 256 byte symbols, merges, three CONTROL
    tokens; as LlamaModel / Qwen2Model / Phi-4-mini's _set_vocab_gpt2 write it."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = [bytes_to_unicode()[b] for b in range(256)]
    merges = bpe_merges(24)
    tokens += [a + b for a, b in merges]
    types = [1] * len(tokens) + [3] * len(SPECIALS)  # NORMAL, CONTROL
    tokens += SPECIALS
    return {
        "model": "gpt2", "pre": pre, "tokens": tokens, "types": types, "merges": [f"{a} {b}" for a, b in merges],
        "bos": tokens.index("<|im_start|>"), "eos": tokens.index("<|im_end|>"), "pad": tokens.index("<|endoftext|>"),
    }


def bpe_merges(n):
    """The first `n` merges BPE learns on TEXT's words (GPT-2 spelling: a leading space is "Ġ")."""
    words = [list(("Ġ" if i else "") + w) for i, w in enumerate(TEXT.lower().split(" "))]
    merges = []
    for _ in range(n):
        pairs = {}
        for w in words:
            for p in zip(w, w[1:], strict=False):
                pairs[p] = pairs.get(p, 0) + 1
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                i += 1
    return merges


def spm_tokenizer(specials):
    """Sentencepiece (tokenizer.ggml.model "llama"): `specials` (CONTROL, the unknown token
    UNKNOWN), the 256 byte-fallback tokens, single letters and a few merged pieces with scores."""
    tokens, types, scores = [], [], []
    for s in specials:
        tokens.append(s)
        types.append(2 if s in ("<unk>",) else 3)  # UNKNOWN, CONTROL
        scores.append(0.0)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)  # BYTE
        scores.append(0.0)
    pieces = ["▁"] + sorted(set(c for c in TEXT.lower() + TEXT.upper() if c != " "))
    for p in SPM_PIECES:
        if p not in pieces:
            pieces.append(p)
    for i, p in enumerate(pieces):
        tokens.append(p)
        types.append(1)
        scores.append(-float(i) if len(p) == 1 else -1.0 - 0.1 * i)
    return {"model": "llama", "pre": "default", "tokens": tokens, "types": types, "scores": scores}


def llama_spm():
    t = spm_tokenizer(["<unk>", "<s>", "</s>"])
    return dict(t, unk=0, bos=1, eos=2, pad=None)


def phi3_spm():
    # Phi-3's pad token is <|endoftext|> (llama.cpp records its id). Without one, transformers' GGUF
    # loader would keep Phi3Config's pad_token_id 32000, outside a tiny vocabulary.
    t = spm_tokenizer(["<unk>", "<s>", "</s>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"])
    return dict(t, unk=0, bos=1, eos=6, pad=3)


def gemma_spm():
    t = spm_tokenizer(["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"])
    return dict(t, pad=0, eos=1, bos=2, unk=3)


def write_tokenizer(w, tok):
    w.add_tokenizer_model(tok["model"])
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    if "scores" in tok:
        w.add_token_scores(tok["scores"])
    w.add_token_types(tok["types"])
    if "merges" in tok:
        w.add_token_merges(tok["merges"])
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id),
                     ("unk", w.add_unk_token_id)):
        if tok.get(key) is not None:
            add(tok[key])
    w.add_add_bos_token(tok["model"] == "llama")
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}")


# --------------------------------------------------------------------------------------------
# The cases.

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=2048, attn_implementation="eager")


def case(name, model_type, gguf_arch, tok, hf, meta, **kw):
    return dict(name=name, model_type=model_type, gguf_arch=gguf_arch, tok=tok, hf=dict(BASE, **hf), meta=meta,
                gguf_name=kw.pop("gguf_name", name),
                # Differences from transformers' GGUF loader, {config key: why}; they must equal the source.
                known=kw.pop("known", {}), theirs_logits=kw.pop("theirs_logits", True),
                theirs_loads=kw.pop("theirs_loads", True), theirs_class=kw.pop("theirs_class", None),
                # (exception type, message part, why): transformers' GGUF loader is known to fail so.
                theirs_error=kw.pop("theirs_error", None),
                split_qkv=kw.pop("split_qkv", False), long_seq=kw.pop("long_seq", False), **kw)


CASES = [
    # Llama 3 style: byte-level BPE, untied output, q/k permuted by the converter.
    case("llama", "llama", "llama", lambda: bpe_tokenizer("llama-bpe"),
         dict(rope_theta=500000.0, tie_word_embeddings=False),
         ["vocab_size", "rope_dimension_count"], mutation=True, cli=True),
    # Mistral: llama.cpp writes it as llama; transformers' GGUF loader says mistral only when
    # general.name is exactly "mistral". head_dim 32 != hidden / heads (as Mistral Nemo's 128).
    case("mistral", "mistral", "llama", llama_spm,
         dict(rope_theta=1000000.0, tie_word_embeddings=False, head_dim=32, sliding_window=None),
         ["vocab_size", "rope_dimension_count", "key_length"],
         known={"sliding_window": "transformers' GGUF loader leaves MistralConfig's default 4096; llama.cpp runs "
                                  "a llama file without a window, and the converter writes null"},
         # transformers 5.24's GGUF loader builds MistralConfig, then fails on the weights: it looks the
         # tensor names up under gguf-py architecture "mistral", which gguf 0.19 does not have.
         theirs_error=(NotImplementedError, "Unknown gguf model_type: mistral",
                       "transformers' GGUF loader cannot load the weights of a llama file it calls mistral "
                       "(gguf-py has no architecture 'mistral'); mistral_named compares them")),
    # A real Mistral GGUF's general.name: the converter still says MistralForCausalLM; transformers'
    # GGUF loader builds LlamaForCausalLM (`"mistral" in [name]`), which computes the same.
    case("mistral_named", "mistral", "llama", llama_spm,
         dict(rope_theta=1000000.0, tie_word_embeddings=False, head_dim=32, sliding_window=None),
         ["vocab_size", "rope_dimension_count", "key_length"], gguf_name="Mistral 7B Instruct v0.3",
         theirs_class="LlamaForCausalLM",
         known={"model_type": "transformers' GGUF loader: llama (it tests general.name == 'mistral')",
                "sliding_window": "LlamaConfig has none",
                "attention_bias": "LlamaConfig's (False); MistralConfig has none", "mlp_bias": "the same"}),
    # Qwen2.5 style: q/k/v biases, tied embeddings (a Q4_0 token_embd), no permutation.
    case("qwen2", "qwen2", "qwen2", lambda: bpe_tokenizer("qwen2"),
         dict(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True), [], embd_q4=True),
    # Qwen3: q/k norms, head_dim 128 from key_length (!= hidden / heads = 16).
    case("qwen3", "qwen3", "qwen3", lambda: bpe_tokenizer("qwen2"),
         dict(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, head_dim=128), ["key_length"]),
    # Phi-3-mini-4k style: sentencepiece, fused qkv / gate_up, sliding_window recorded (2047).
    case("phi3", "phi3", "phi3", phi3_spm,
         dict(rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=4096,
              original_max_position_embeddings=4096, sliding_window=2047),
         ["phi3"],
         known={"sliding_window": "transformers' GGUF loader ignores phi3.attention.sliding_window"}),
    # Phi-4-mini style: byte-level BPE, tied, partial rotary 0.75, longrope (original context 16, so
    # a 24-token sequence uses the long factors and an 8-token one the short ones).
    case("phi3_longrope", "phi3", "phi3", lambda: bpe_tokenizer("gpt-4o"),
         dict(rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=512,
              original_max_position_embeddings=16, sliding_window=262144, partial_rotary_factor=0.75,
              rope_scaling=dict(rope_type="longrope", long_factor=[1.0, 1.5, 2.5, 4.0, 7.0, 12.0],
                                short_factor=[1.0, 1.0, 1.1, 1.2, 1.5, 2.0])),
         ["phi3"], long_seq=True, theirs_logits=False,
         known={"sliding_window": "ignored by transformers' GGUF loader",
                "rope_parameters": "transformers' GGUF loader ignores rope_factors_long/short and "
                                   "phi3.rope.dimension_count (partial rotary)",
                "original_max_position_embeddings": "ignored by transformers' GGUF loader"}),
    # Phi-3 with separate attn_q / attn_k / attn_v (llama.cpp loads those too): fused by the
    # converter; transformers' GGUF loader maps only attn_qkv, so against the source model only.
    case("phi3_split_qkv", "phi3", "phi3", phi3_spm,
         dict(rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=4096,
              original_max_position_embeddings=4096, sliding_window=None),
         ["phi3"], split_qkv=True,
         theirs_loads="it maps attn_qkv only, and would leave qkv_proj at random"),
    # Gemma 3: (1 + w) norms, q/k norms, head_dim 256, 6 layers (one global), a window of 4 tokens.
    case("gemma3", "gemma3_text", "gemma3", gemma_spm,
         dict(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, head_dim=256,
              num_hidden_layers=6, sliding_window=4, query_pre_attn_scalar=256,
              rope_local_base_freq=10000.0), ["gemma3"]),
]


def source_model(c, vocab, tok):
    """The Hugging Face model a case's GGUF is written from: the config class's defaults with the
    case's sizes, weights drawn at unit scale (norms around 1, or 0 for Gemma's 1 + w)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(c["hf"])
    attn = kw.pop("attn_implementation")
    ids = {f"{k}_token_id": tok.get(k) for k in ("bos", "eos", "pad", "unk")}
    cfg = AutoConfig.for_model(c["model_type"], vocab_size=vocab, **ids, **kw)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    rng = np.random.default_rng(sum(map(ord, c["name"])))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = rng.normal(0.0 if c["gguf_arch"] == "gemma3" else 1.0, 0.1, p.shape)
            elif name.endswith(".bias"):
                v = rng.normal(0, 0.1, p.shape)
            elif name == "model.embed_tokens.weight":
                v = rng.normal(0, 1.0, p.shape)
            else:
                v = rng.normal(0, 1.0 / np.sqrt(p.shape[1]), p.shape)
            p.copy_(torch.from_numpy(v.astype(np.float32)))
    return model


def permute(w, n_head):
    """convert_hf_to_gguf's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(c, model, tok, path):
    """The file llama.cpp's convert_hf_to_gguf.py would write for `model`; returns the source state
    as the file holds it (quantized tensors through quantize -> dequantize, in Hugging Face layout)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    cfg = model.config
    arch = c["gguf_arch"]
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    w = gguf.GGUFWriter(path, arch)
    w.add_name(c["gguf_name"])
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if "vocab_size" in c["meta"]:
        w.add_vocab_size(cfg.vocab_size)
    if "rope_dimension_count" in c["meta"]:
        w.add_rope_dimension_count(head_dim)
    if "key_length" in c["meta"] or "gemma3" in c["meta"]:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if "gemma3" in c["meta"]:
        w.add_sliding_window(cfg.sliding_window)
    if "phi3" in c["meta"]:
        rot = int(rope.get("partial_rotary_factor", 1.0) * cfg.hidden_size) // n_head
        w.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
        w.add_rope_dimension_count(rot)
        w.add_sliding_window(cfg.sliding_window or 0)
        if rope.get("rope_type") == "longrope":
            scale = cfg.max_position_embeddings / cfg.original_max_position_embeddings
            w.add_rope_scaling_attn_factors(np.sqrt(1 + np.log(scale) / np.log(cfg.original_max_position_embeddings)))
            w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    write_tokenizer(w, tok)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    held = {}
    for hf, t in model.state_dict().items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        v = t.numpy()
        parts = [(hf, v)]
        if c["split_qkv"] and hf.endswith("qkv_proj.weight"):
            q, k, vv = np.split(v, [n_head * head_dim, (n_head + n_kv) * head_dim])
            parts = [(hf.replace("qkv_proj", p), x) for p, x in (("q_proj", q), ("k_proj", k), ("v_proj", vv))]
        out = []
        for hname, x in parts:
            gname = names.get_name(hname, try_suffixes=(".weight", ".bias"))
            assert gname, hname
            stored = x
            if arch == "llama" and ".attn_q." in gname:
                stored = permute(x, n_head)
            elif arch == "llama" and ".attn_k." in gname:
                stored = permute(x, n_kv)
            elif arch == "gemma3" and gname.endswith("norm.weight"):
                stored = x + np.float32(1.0)
            qtype = T.F32
            if x.ndim == 2 and not gname.endswith("norm.weight"):
                if ".ffn_down." in gname or (gname.startswith("blk.0.attn_") and "output" not in gname):
                    qtype = T.Q8_0
                elif ".ffn_up." in gname or gname == "output.weight":
                    qtype = T.F16
                elif gname == "token_embd.weight" and c.get("embd_q4"):
                    qtype = T.Q4_0
            if qtype in (T.Q8_0, T.Q4_0):
                w.add_tensor(gname, gguf.quants.quantize(stored, qtype), raw_dtype=qtype)
                # Blocks lie within rows, so quantizing the permuted rows equals permuting the
                # quantized ones: the source, as the file holds it, needs no inverse permutation here.
                x = gguf.quants.dequantize(gguf.quants.quantize(x, qtype), qtype)
            elif qtype == T.F16:
                w.add_tensor(gname, stored.astype(np.float16))
                x = x.astype(np.float16).astype(np.float32)
            else:
                w.add_tensor(gname, np.ascontiguousarray(stored, dtype=np.float32))
            out.append(x)
        held[hf] = np.concatenate(out) if len(out) > 1 else out[0]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


# --------------------------------------------------------------------------------------------
# Comparisons.


def f32(x):
    return float(np.float32(x)) if isinstance(x, float) else x


def essentials(cfg):
    """The config fields that decide what the model computes, with floats compared as float32 (GGUF
    stores float32)."""
    rope = cfg.rope_parameters or {}

    def norm(d):
        return {k: [f32(v) for v in x] if isinstance(x, list) else f32(x) for k, x in sorted(d.items())}

    rope = {k: norm(v) for k, v in rope.items()} if "full_attention" in rope else norm(rope)
    e = {
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "rms_norm_eps": f32(cfg.rms_norm_eps),
        "rope_parameters": rope,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "sliding_window": getattr(cfg, "sliding_window", None),
        "layer_types": getattr(cfg, "layer_types", None),
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "unk_token_id": getattr(cfg, "unk_token_id", None),
    }
    for key in ("attention_bias", "mlp_bias", "hidden_act", "hidden_activation", "query_pre_attn_scalar",
                "original_max_position_embeddings", "final_logit_softcapping", "attn_logit_softcapping"):
        if hasattr(cfg, key):
            e[key] = f32(getattr(cfg, key))
    return e


def compare_configs(ours, other, what, known):
    """`what`: "NAME: ... REFERENCE"; `known`: {key: why} differences that are printed, not failed."""
    a, b = essentials(ours), essentials(other)
    diff = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>") and k not in known)
    detail = ", ".join(f"{k} {a.get(k, '<absent>')!r} vs {b.get(k, '<absent>')!r}" for k in diff)
    check(not diff, f"{what}: config essentials equal" + (f"; differ: {detail}" if diff else f" ({len(a)} fields)"))
    for k in sorted(known):
        if a.get(k) != b.get(k):
            print(f"      known difference, {what}: {k} = {a.get(k)!r} here, {b.get(k)!r} there ({known[k]})")


def compare_states(ours, ref, what, exact):
    if not check(sorted(ours) == sorted(ref), f"{what}: same parameter names ({len(ours)})"):
        print(f"      only here: {sorted(set(ours) - set(ref))[:6]}; only there: {sorted(set(ref) - set(ours))[:6]}")
    worst, worst_name = 0.0, None
    for k in ours:
        if k in ref:
            d = float((ours[k].float() - ref[k].float()).abs().max()) if ours[k].shape == ref[k].shape else float("inf")
            if d > worst:
                worst, worst_name = d, k
    tol = 0.0 if exact else 1e-6
    where = f" ({worst_name})" if worst_name else ""
    check(worst <= tol, f"{what}: weights equal, max |diff| {worst:.3g}{where} <= {tol:g}")


def logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits.float()


def reported(name, fn, *args):
    """Runs one case, turning an exception into a failed check; prints its PASS/FAIL line."""
    n_failed = len(FAILURES)
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - any error fails the case, and the others still run
        traceback.print_exc()
        check(False, f"{name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    ok = len(FAILURES) == n_failed
    print(f"{'PASS' if ok else 'FAIL'} {name}", flush=True)
    return ok


def run_case(c, conv, work):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    name = c["name"]
    print(f"--- {name}: GGUF architecture {c['gguf_arch']}, general.name {c['gguf_name']!r}", flush=True)
    tok = c["tok"]()
    vocab = len(tok["tokens"])
    src = source_model(c, vocab, tok)
    gdir = os.path.join(work, name)
    os.makedirs(gdir, exist_ok=True)
    gguf_file = f"{name}.gguf"
    held = write_gguf(c, src, tok, os.path.join(gdir, gguf_file))
    out = os.path.join(work, f"{name}-hf")
    if c.get("cli"):  # the command line, as fetch_test_data.sh runs it
        r = subprocess.run([sys.executable, SCRIPT, os.path.join(gdir, gguf_file), out], capture_output=True, text=True)
        ok, log = r.returncode == 0, r.stderr
    else:  # the others in this process: no second start of Python and transformers
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                conv.convert(os.path.join(gdir, gguf_file), out, "float32")
            ok = True
        except conv.ConversionError as e:
            ok = False
            print(f"      {e}", file=err)
        log = err.getvalue()
    if not check(ok, f"{name}: gguf_to_hf.py converts it"):
        print(log)
        return

    ours = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    want_class = type(src).__name__
    check(type(ours).__name__ == want_class, f"{name}: converted config.json builds {type(ours).__name__}")

    tok_ours = AutoTokenizer.from_pretrained(out)
    tok_gguf = AutoTokenizer.from_pretrained(gdir, gguf_file=gguf_file)
    ids = tok_ours.encode(TEXT)
    check(ids == tok_gguf.encode(TEXT) and len(ids) > 8,
          f"{name}: converted tokenizer encodes like the GGUF one ({len(ids)} tokens)")
    seqs = [ids[:8]] + ([(ids * 3)[:24]] if c["long_seq"] else [ids])

    # Against the source model, through the file's quantization.
    r = src.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in held.items()}, strict=False)
    assert not r.unexpected_keys and set(r.missing_keys) <= {"lm_head.weight"}, r  # the tied head, if any
    compare_configs(ours.config, src.config, f"{name} vs the source model", {})
    compare_states(ours.state_dict(), src.state_dict(), f"{name} vs the source model (as quantized)", exact=False)
    for s in seqs:
        d = float((logits(ours, s) - logits(src, s)).abs().max())
        check(d <= LOGIT_TOL,
              f"{name}: logits vs the source model on {len(s)} tokens: max |diff| {d:.3g} <= {LOGIT_TOL:g}")

    # Against transformers' GGUF loader: its config, then (where it can load the file) its model.
    theirs_cfg = AutoConfig.from_pretrained(gdir, gguf_file=gguf_file)
    compare_configs(ours.config, theirs_cfg, f"{name} vs transformers' GGUF loader", c["known"])
    theirs = None
    if c["theirs_loads"] is not True:
        print(f"      transformers' GGUF loader's weights not compared: {c['theirs_loads']}")
    else:
        try:
            theirs = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gguf_file, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
        except Exception as e:  # noqa: BLE001 - only the known failure is let through
            known = c["theirs_error"]
            if not (known and isinstance(e, known[0]) and known[1] in str(e)):
                raise
            print(f"      transformers' GGUF loader's weights not compared: {known[2]} ({type(e).__name__}: {e})")
    if theirs is not None:
        want = c["theirs_class"] or want_class
        check(type(theirs).__name__ == want, f"{name}: transformers' GGUF loader builds {type(theirs).__name__}")
        compare_states(ours.state_dict(), theirs.state_dict(), f"{name} vs transformers' GGUF loader", exact=True)
        for s in seqs:
            d = float((logits(ours, s) - logits(theirs, s)).abs().max())
            if c["theirs_logits"]:
                check(d <= LOGIT_TOL, f"{name}: logits vs transformers' GGUF loader on {len(s)} tokens: "
                      f"max |diff| {d:.3g} <= {LOGIT_TOL:g}")
            else:
                print(f"      logits vs transformers' GGUF loader on {len(s)} tokens: max |diff| {d:.3g} "
                      f"(not compared: {c['known']['rope_parameters']})")

    if c.get("mutation"):
        # The comparison must catch a conversion that leaves q/k permuted.
        saved = conv.unpermute
        conv.unpermute = lambda w, n_head: w
        try:
            bad = os.path.join(work, f"{name}-unpermuted-hf")
            with contextlib.redirect_stderr(io.StringIO()):
                conv.convert(os.path.join(gdir, gguf_file), bad, "float32")
        finally:
            conv.unpermute = saved
        broken = AutoModelForCausalLM.from_pretrained(bad, dtype=torch.float32, attn_implementation="eager").eval()
        d = float((logits(broken, ids) - logits(src, ids)).abs().max())
        check(d > 100 * LOGIT_TOL,
              f"{name}: a conversion without the q/k un-permutation is caught (logits |diff| {d:.3g})")


def refusals(conv, work):
    """An unsupported architecture stops gguf_to_hf.py with exit code 2, naming it; a qwen2 file
    without its q bias stops it, naming the tensor."""
    import gguf

    path = os.path.join(work, "bloom.gguf")
    w = gguf.GGUFWriter(path, "bloom")
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = subprocess.run([sys.executable, SCRIPT, path, os.path.join(work, "bloom-hf")], capture_output=True, text=True)
    check(r.returncode == 2 and "'bloom'" in r.stderr and not os.path.exists(os.path.join(work, "bloom-hf")),
                f"architecture bloom refused: exit code {r.returncode}, {r.stderr.strip()!r}")

    c = next(x for x in CASES if x["name"] == "qwen2")
    tok = c["tok"]()
    src = source_model(c, len(tok["tokens"]), tok)
    with __import__("torch").no_grad():
        del src.model.layers[1].self_attn.q_proj.bias
        src.model.layers[1].self_attn.q_proj.bias = None
    path = os.path.join(work, "qwen2-nobias.gguf")
    write_gguf(c, src, tok, path)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            conv.convert(path, os.path.join(work, "qwen2-nobias-hf"), "float32")
        msg = None
    except conv.ConversionError as e:
        msg = str(e)
    check(msg is not None and "blk.1.attn_q.bias" in msg, f"qwen2 file without blk.1.attn_q.bias refused: {msg!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", help="write the files here and keep them")
    ap.add_argument("cases", nargs="*", help="only these cases (default: all)")
    a = ap.parse_args()
    try:
        import gguf  # noqa: F401
        import numpy  # noqa: F401
        import torch
        from transformers.utils import logging as hf_logging
    except ImportError as e:
        print(f"SKIP: {e} (run with the project venv's Python, which has gguf, torch and transformers)")
        return 77

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    conv = load_converter()
    t0 = time.time()
    with (contextlib.nullcontext(a.keep) if a.keep else tempfile.TemporaryDirectory()) as work:
        os.makedirs(work, exist_ok=True)
        results = {}
        for c in CASES:
            if not a.cases or c["name"] in a.cases:
                results[c["name"]] = reported(c["name"], run_case, c, conv, work)
        if not a.cases or "refusals" in a.cases:
            results["refusals"] = reported("refusals", refusals, conv, work)
    print(f"{time.time() - t0:.1f}s; " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in results.items()))
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed:", *FAILURES, sep="\n  ")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
