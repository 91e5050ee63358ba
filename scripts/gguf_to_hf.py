#!/usr/bin/env python3
"""Converts a llama- or gemma3-architecture GGUF file into a Hugging Face model directory.

    gguf_to_hf.py [--dtype float32|bfloat16|float16] GGUF OUTDIR

Writes OUTDIR/model.safetensors, config.json (LlamaForCausalLM or Gemma3ForCausalLM),
generation_config.json, tokenizer.json and tokenizer_config.json (with the GGUF's chat template).
The result loads with `transformers.AutoModelForCausalLM.from_pretrained(OUTDIR)` /
`AutoTokenizer.from_pretrained(OUTDIR)` and with oomb's own loader.

Weights are dequantized by the gguf package (`gguf.quants.dequantize`: F32, F16, BF16, the
Q4_0 ... Q8_0 and K-quant blocks of ggml-quants.c); a type it does not know stops the
conversion with exit code 2. llama: llama.cpp's convert_hf_to_gguf.py permutes the rows of
q_proj / k_proj (interleaved -> half-split RoPE layout); that is undone here. gemma3: llama.cpp
stores every RMSNorm weight as 1 + w (ggml's norm multiplies by the weight); 1 is subtracted
here. What a gemma3 GGUF does not record is written as llama.cpp assumes it: local layers'
RoPE base 10000, every sixth layer global, query_pre_attn_scalar = head_dim (true of Gemma 3
270M to 12B; 27B differs). The tokenizer is rebuilt with transformers' own GGUF tokenizer
conversion (the code `from_pretrained(..., gguf_file=...)` runs), see `write_tokenizer`.

Needs: numpy, gguf (PyPI), safetensors, transformers (tokenizer only), torch (only for bfloat16).
"""

import argparse
import json
import os
import re
import sys

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never ask the Hugging Face hub


def log(msg):
    print(f"[gguf_to_hf] {msg}", file=sys.stderr, flush=True)


class ConversionError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Dequantization.


def dequantize_tensor(t):
    """float32 numpy array in PyTorch layout ([out, in] for a matrix) for a GGUFReader tensor."""
    from gguf import quants

    shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dimensions innermost first
    try:
        w = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    except NotImplementedError as e:
        raise ConversionError(f"tensor {t.name}: quantisation type {t.tensor_type.name} is not supported ({e})")
    if w.size != int(np.prod(shape)):
        raise ConversionError(f"tensor {t.name}: {w.size} values for shape {shape}")
    return w.reshape(shape)


# --------------------------------------------------------------------------------------------
# Names and the Q/K permutation.

_LLAMA_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_NAMES = {
    "llama": _LLAMA_LAYER_NAMES,
    "gemma3": dict(
        _LLAMA_LAYER_NAMES,
        ffn_norm="pre_feedforward_layernorm",
        post_attention_norm="post_attention_layernorm",
        post_ffw_norm="post_feedforward_layernorm",
        attn_q_norm="self_attn.q_norm",
        attn_k_norm="self_attn.k_norm",
    ),
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_SKIPPED = {"rope_freqs.weight"}  # llama3 rope factors: recomputed from config by transformers


def hf_name(gguf_name, arch):
    names = _LAYER_NAMES[arch]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m and m.group(2) in names:
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
    m = re.fullmatch(r"(\w+)\.(weight|bias)", gguf_name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    raise ConversionError(f"tensor {gguf_name}: no Hugging Face name for it (not a {arch} tensor)")


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf's LlamaModel.permute:
    w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --------------------------------------------------------------------------------------------
# Metadata.


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


_REQUIRED = object()


def build_config(reader, arch, tensors, dtype):
    def g(key, default=_REQUIRED):
        v = field(reader, f"{arch}.{key}", None if default is _REQUIRED else default)
        if v is None and default is _REQUIRED:
            raise ConversionError(f"metadata key {arch}.{key} missing")
        return v

    hidden = int(g("embedding_length"))
    n_head = int(g("attention.head_count"))
    n_kv = int(g("attention.head_count_kv", n_head))
    head_dim = int(g("attention.key_length", g("rope.dimension_count", hidden // n_head)))
    vocab = int(g("vocab_size", len(field(reader, "tokenizer.ggml.tokens") or [])))
    tied = "output.weight" not in tensors
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        # GGUF stores float32: 1e-5 reads back as 9.9999997e-06; write the shortest float32 spelling.
        "rms_norm_eps": float(str(np.float32(g("attention.layer_norm_rms_epsilon", 1e-5)))),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(g("context_length", 2048)),
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": field(reader, "tokenizer.ggml.padding_token_id"),
        # Both spellings: transformers >= 5 reads "dtype", older readers "torch_dtype".
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    scaling = g("rope.scaling.type", None)
    if scaling and scaling != "none":
        rs = {"rope_type": scaling, "factor": float(g("rope.scaling.factor", 1.0))}
        orig = g("rope.scaling.original_context_length", None)
        if orig:
            rs["original_max_position_embeddings"] = int(orig)
        cfg["rope_scaling"] = rs
    if arch == "gemma3":
        for key in ("hidden_act", "attention_bias", "mlp_bias"):
            cfg.pop(key)
        cfg.update(
            {
                "architectures": ["Gemma3ForCausalLM"],
                "model_type": "gemma3_text",
                "hidden_activation": "gelu_pytorch_tanh",
                "query_pre_attn_scalar": head_dim,
                "rope_local_base_freq": 10000.0,
                "sliding_window": int(g("attention.sliding_window")),
                "sliding_window_pattern": 6,
                "final_logit_softcapping": None,
                "attn_logit_softcapping": None,
            }
        )
    return cfg


def write_tokenizer(gguf_path, outdir, reader, max_len):
    """tokenizer.json / tokenizer_config.json, built by transformers' GGUF tokenizer conversion
    (`AutoTokenizer.from_pretrained(dir, gguf_file=name)`: byte-level BPE from tokenizer.ggml.tokens /
    merges, GPT-2 ByteLevel pre-tokenizer and decoder, CONTROL tokens added as special tokens).

    One correction: for `tokenizer.ggml.pre == "smollm"` llama.cpp (and the original SmolLM2
    tokenizer.json) split every digit on its own before the GPT-2 split, which transformers' GGUF
    path leaves out; it is added here, as a `Digits(individual_digits=True)` pre-tokenizer.
    """
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        os.path.dirname(os.path.abspath(gguf_path)), gguf_file=os.path.basename(gguf_path)
    )
    pre = field(reader, "tokenizer.ggml.pre")
    if pre == "smollm":
        backend = tok.backend_tokenizer
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
        )
        log("tokenizer: pre-tokenizer 'smollm': digits split individually (as llama.cpp does)")
    tok.save_pretrained(outdir)

    tokens = field(reader, "tokenizer.ggml.tokens")
    tid = lambda key: field(reader, f"tokenizer.ggml.{key}")  # noqa: E731
    name = lambda i: tokens[i] if i is not None else None  # noqa: E731
    cfg_path = os.path.join(outdir, "tokenizer_config.json")
    with open(cfg_path) as f:
        tcfg = json.load(f)
    for k in ("is_local", "local_files_only", "name_or_path"):  # artefacts of loading from a path
        tcfg.pop(k, None)
    tcfg.update(
        {
            # The generic fast tokenizer class: everything lives in tokenizer.json.
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": name(tid("bos_token_id")),
            "eos_token": name(tid("eos_token_id")),
            "pad_token": name(tid("padding_token_id")),
            "unk_token": name(tid("unknown_token_id")),
            "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
            "add_eos_token": bool(field(reader, "tokenizer.ggml.add_eos_token", False)),
            "model_max_length": max_len,
            "clean_up_tokenization_spaces": False,
        }
    )
    template = field(reader, "tokenizer.chat_template")
    if template:
        tcfg["chat_template"] = template
        # One copy of the template: in tokenizer_config.json, where oomb and older transformers look.
        jinja = os.path.join(outdir, "chat_template.jinja")
        if os.path.exists(jinja):
            os.remove(jinja)
    with open(cfg_path, "w") as f:
        json.dump(tcfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


def convert(gguf_path, outdir, dtype):
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path)
    arch = field(reader, "general.architecture")
    if arch not in _LAYER_NAMES:
        raise ConversionError(f"{gguf_path}: architecture {arch!r}; supported: {', '.join(_LAYER_NAMES)}")
    tensors = {t.name: t for t in reader.tensors}
    # Check every name first, so an unsupported file fails before anything is written (types
    # fail while dequantizing, also before anything is written).
    for t in reader.tensors:
        if t.name not in _SKIPPED:
            hf_name(t.name, arch)
    cfg = build_config(reader, arch, tensors, dtype)
    log(
        f"{os.path.basename(gguf_path)}: {arch}, {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
        f"heads {cfg['num_attention_heads']}/{cfg['num_key_value_heads']}, vocab {cfg['vocab_size']}, "
        f"{len(tensors)} tensors, tied={cfg['tie_word_embeddings']}"
    )

    state = {}
    counts = {}
    for t in reader.tensors:
        if t.name in _SKIPPED:
            log(f"skipping {t.name}")
            continue
        w = dequantize_tensor(t)
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        if arch == "llama" and re.fullmatch(r"blk\.\d+\.attn_q\.(weight|bias)", t.name):
            w = unpermute(w, cfg["num_attention_heads"])
        elif arch == "llama" and re.fullmatch(r"blk\.\d+\.attn_k\.(weight|bias)", t.name):
            w = unpermute(w, cfg["num_key_value_heads"])
        elif arch == "gemma3" and t.name.endswith("norm.weight"):
            w = w - 1.0
        state[hf_name(t.name, arch)] = np.ascontiguousarray(w)
    log("dequantized " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))

    os.makedirs(outdir, exist_ok=True)
    st_path = os.path.join(outdir, "model.safetensors")
    tmp = st_path + ".tmp"
    meta = {"format": "pt"}  # one key: safetensors writes several in random order
    if dtype == "bfloat16":
        import torch
        from safetensors.torch import save_file

        save_file({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in state.items()}, tmp, metadata=meta)
    else:
        from safetensors.numpy import save_file

        npdt = {"float32": np.float32, "float16": np.float16}[dtype]
        save_file({k: v.astype(npdt) for k, v in state.items()}, tmp, metadata=meta)
    os.chmod(tmp, 0o644)
    os.replace(tmp, st_path)
    log(f"wrote {st_path} ({os.path.getsize(st_path) / 1e6:.1f} MB, {dtype})")

    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if cfg[k] is not None}
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    write_tokenizer(gguf_path, outdir, reader, cfg["max_position_embeddings"])
    log(f"wrote config.json, generation_config.json, tokenizer.json, tokenizer_config.json in {outdir}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("outdir")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    a = ap.parse_args()
    try:
        convert(a.gguf, a.outdir, a.dtype)
    except ConversionError as e:
        log(f"error: {e}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
