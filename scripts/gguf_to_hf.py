#!/usr/bin/env python3
"""Converts a GGUF file (llama.cpp's architectures llama, qwen2, qwen3, phi3 and gemma3) into a
Hugging Face model directory.

    gguf_to_hf.py [--dtype float32|bfloat16|float16] GGUF OUTDIR

Writes OUTDIR/model.safetensors, config.json, generation_config.json, tokenizer.json and
tokenizer_config.json (with the GGUF's chat template). config.json's class, by GGUF architecture:
llama -> LlamaForCausalLM, or MistralForCausalLM when general.name says Mistral (llama.cpp has no
architecture of its own for Mistral 7B / Nemo: it writes them as llama); qwen2 -> Qwen2ForCausalLM;
qwen3 -> Qwen3ForCausalLM; phi3 -> Phi3ForCausalLM (Phi-3, Phi-4-mini); gemma3 -> Gemma3ForCausalLM.
Any other architecture (mistral3, bloom, ...) stops the conversion with exit code 2, naming it.
The result loads with `transformers.AutoModelForCausalLM.from_pretrained(OUTDIR)` /
`AutoTokenizer.from_pretrained(OUTDIR)` and with oomb's own loader; weights and config equal what
transformers' GGUF loader (`from_pretrained(dir, gguf_file=...)`) builds, except where that loader
leaves out what the file records (see below). tests/python/test_gguf_import.py checks this on tiny
files of every architecture.

Weights are dequantized by the gguf package (`gguf.quants.dequantize`: F32, F16, BF16, the
Q4_0 ... Q8_0 and K-quant blocks of ggml-quants.c); a type it does not know stops the
conversion with exit code 2. A tensor the architecture does not have, or one its Hugging Face
class needs and the file lacks (Qwen2's q/k/v biases, Qwen3's q/k norms, ...), stops it too.
llama (and Mistral): llama.cpp's convert_hf_to_gguf.py permutes the rows of q_proj / k_proj
(interleaved -> half-split RoPE layout); that is undone here. qwen2, qwen3, phi3 and gemma3 are
stored unpermuted. qwen3: head_dim is attention.key_length (transformers' GGUF loader ignores it and
keeps Qwen3Config's 128, true of every released Qwen3). phi3: q, k, v are one matrix (attn_qkv ->
qkv_proj; separate attn_q / attn_k / attn_v are fused) and ffn_up is gate and up fused (->
gate_up_proj); rope.dimension_count < head_dim gives partial_rotary_factor (Phi-4-mini: 0.75);
rope.scaling.original_context_length gives original_max_position_embeddings; the tensors
rope_factors_long / rope_factors_short give rope_scaling {"rope_type": "longrope", long_factor,
short_factor}; attention.sliding_window > 0 gives sliding_window (llama.cpp itself runs Phi-3
without it; transformers' GGUF loader reads none of these four). gemma3: llama.cpp stores every
RMSNorm weight as 1 + w (ggml's norm multiplies by the weight); 1 is subtracted here. What a
gemma3 GGUF does not record is written as llama.cpp assumes it: local layers' RoPE base 10000,
every sixth layer global, query_pre_attn_scalar = head_dim (true of Gemma 3 270M to 12B; 27B
differs). A sliding window is written only where the file records one (Mistral: none otherwise,
where MistralConfig would default to 4096; Qwen2 / Qwen3: none, as llama.cpp runs them). The
tokenizer is rebuilt with transformers' own GGUF tokenizer conversion (the code
`from_pretrained(..., gguf_file=...)` runs), see `write_tokenizer`.

Needs: numpy, gguf (PyPI), safetensors, transformers (tokenizer only), torch (only for bfloat16).
"""

import argparse
import json
import math
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
        raise ConversionError(f"tensor {t.name}: quantisation type {t.tensor_type.name} is not supported ({e})") from e
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
_QK_NORM_NAMES = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_LAYER_NAMES = {
    "llama": _LLAMA_LAYER_NAMES,
    "qwen2": _LLAMA_LAYER_NAMES,
    "qwen3": dict(_LLAMA_LAYER_NAMES, **_QK_NORM_NAMES),
    # Phi-3: q, k, v fused in one matrix (rows q, k, v), and ffn_up is gate and up fused (gate's
    # rows first), as Phi3ForCausalLM has them. A file with separate attn_q / attn_k / attn_v
    # (llama.cpp loads those too) gets them fused here, see `fuse_phi3_qkv`.
    "phi3": dict(
        {k: v for k, v in _LLAMA_LAYER_NAMES.items() if k != "ffn_gate"},
        attn_qkv="self_attn.qkv_proj",
        ffn_up="mlp.gate_up_proj",
    ),
    "gemma3": dict(
        _LLAMA_LAYER_NAMES,
        ffn_norm="pre_feedforward_layernorm",
        post_attention_norm="post_attention_layernorm",
        post_ffw_norm="post_feedforward_layernorm",
        **_QK_NORM_NAMES,
    ),
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Tensors that are not weights: llama3's rope_freqs (transformers recomputes them from the config's
# rope_scaling), Phi-3's longrope factors (written into the config's rope_scaling, see build_config).
_SKIPPED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
# What llama.cpp writes under an architecture name of its own that is not converted here.
_NOT_CONVERTED = {
    "mistral3": "Mistral 3 (Ministral 3, Mistral Small 3.x); Mistral 7B / Nemo GGUFs are written as llama",
}


def hf_name(gguf_name, arch):
    names = _LAYER_NAMES[arch]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m and m.group(2) in names:
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
    m = re.fullmatch(r"(\w+)\.(weight|bias)", gguf_name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    raise ConversionError(f"tensor {gguf_name}: no Hugging Face name for it (not a {arch} tensor)")


def gguf_name(hf, arch):
    """The GGUF name of Hugging Face parameter `hf` (for messages; fused names as llama.cpp writes them)."""
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf)
    if m:
        back = {v: k for k, v in _LAYER_NAMES[arch].items()}
        return f"blk.{m.group(1)}.{back.get(m.group(2), m.group(2))}.{m.group(3)}"
    back = {v: k for k, v in _GLOBAL_NAMES.items()}
    base, _, suffix = hf.rpartition(".")
    return f"{back.get(base, base)}.{suffix}"


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


def f32_spelling(x):
    """GGUF stores float32: 1e-5 reads back as 9.9999997e-06; the shortest spelling of that float32."""
    return float(str(np.float32(x)))


def family_of(reader, arch, tensors):
    """The Hugging Face family for a GGUF architecture: the architecture itself, except "mistral" for
    a llama file whose general.name says Mistral. llama.cpp writes Mistral 7B / Nemo under "llama"
    (q/k permuted like Llama's); transformers' GGUF loader calls such a file mistral when
    general.name == "mistral" (it tests `"mistral" in [name]`, a list), and then cannot load its
    weights (transformers 5.24 with gguf 0.19: it looks the tensor names up under gguf-py architecture
    "mistral", which does not exist); here the family is mistral when the name contains "mistral" in
    any case. The two classes compute the same thing unless a sliding window is set;
    MistralForCausalLM has no biases, so a file with any stays llama."""
    name = str(field(reader, "general.name") or "")
    biased = any(re.fullmatch(r"blk\.\d+\.\w+\.bias", n) for n in tensors)
    if arch == "llama" and "mistral" in name.lower() and not biased:
        return "mistral"
    return arch


def build_config(reader, arch, family, tensors, dtype):
    """config.json for `family` from the GGUF's `arch.*` keys: what transformers' GGUF loader sets
    (its GGUF_CONFIG_MAPPING: sizes, rope_theta, rms_norm_eps, vocab_size, tie_word_embeddings when
    there is no output.weight, the special token ids), plus what it leaves at the config class's
    defaults where those are not what llama.cpp computes (Qwen3's head_dim from key_length, Phi-3's
    partial rotary, longrope factors, original context and sliding window)."""

    def g(key, default=_REQUIRED):
        v = field(reader, f"{arch}.{key}", None if default is _REQUIRED else default)
        if v is None and default is _REQUIRED:
            raise ConversionError(f"metadata key {arch}.{key} missing")
        return v

    hidden = int(g("embedding_length"))
    n_head = int(g("attention.head_count"))
    n_kv = int(g("attention.head_count_kv", n_head))
    if family == "phi3":
        # Phi-3 records no key_length; rope.dimension_count is the rotary part of the head only
        # (Phi-4-mini: 3/4 of it).
        head_dim = hidden // n_head
    else:
        head_dim = int(g("attention.key_length", g("rope.dimension_count", hidden // n_head)))
    vocab = int(g("vocab_size", len(field(reader, "tokenizer.ggml.tokens") or [])))
    tied = "output.weight" not in tensors
    cfg = {
        "architectures": [_HF_CLASSES[family]],
        "model_type": family,
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": f32_spelling(g("attention.layer_norm_rms_epsilon", 1e-5)),
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
    unk = field(reader, "tokenizer.ggml.unknown_token_id")
    if unk is not None:  # transformers' GGUF loader sets it too
        cfg["unk_token_id"] = unk
    scaling = g("rope.scaling.type", None)
    if scaling and scaling != "none":
        rs = {"rope_type": scaling, "factor": float(g("rope.scaling.factor", 1.0))}
        orig = g("rope.scaling.original_context_length", None)
        if orig:
            rs["original_max_position_embeddings"] = int(orig)
        cfg["rope_scaling"] = rs
    window = g("attention.sliding_window", None)
    if family == "mistral":
        # llama.cpp runs a llama-architecture file without a window; MistralConfig's default (4096)
        # would add one, so null unless the file records one.
        for key in ("attention_bias", "mlp_bias"):
            cfg.pop(key)
        cfg["sliding_window"] = int(window) if window else None
    elif family in ("qwen2", "qwen3"):
        # Qwen2 always has q/k/v biases (convert() requires them); Qwen3 has them if attention_bias.
        cfg.pop("mlp_bias")
        if family == "qwen2":
            cfg.pop("attention_bias")
        # llama.cpp gives every layer full attention (and records no window for these families).
        cfg.update({"use_sliding_window": False, "sliding_window": None})
    elif family == "phi3":
        build_phi3_config(cfg, g, tensors, head_dim, window)
    elif family == "gemma3":
        for key in ("hidden_act", "attention_bias", "mlp_bias"):
            cfg.pop(key)
        cfg.update(
            {
                "hidden_activation": "gelu_pytorch_tanh",
                "query_pre_attn_scalar": head_dim,
                "rope_local_base_freq": 10000.0,
                "sliding_window": int(g("attention.sliding_window")),
                "sliding_window_pattern": 6,
                "final_logit_softcapping": None,
                "attn_logit_softcapping": None,
            }
        )
        cfg["model_type"] = "gemma3_text"
    return cfg


def build_phi3_config(cfg, g, tensors, head_dim, window):
    """Phi-3 / Phi-4-mini, as llama.cpp's Phi3MiniModel recorded the original config.json:
    rope.dimension_count = partial_rotary_factor x head_dim; rope.scaling.original_context_length =
    original_max_position_embeddings; attention.sliding_window = sliding_window, 0 for none; longrope's
    long_factor / short_factor as the tensors rope_factors_long / rope_factors_short, and its attention
    factor as rope.scaling.attn_factor (written only if it differs from the one transformers derives
    from max_position_embeddings / original_max_position_embeddings)."""
    for key in ("head_dim", "attention_bias", "mlp_bias"):  # Phi3Config has none of these
        cfg.pop(key)
    rot = int(g("rope.dimension_count", head_dim))
    if rot != head_dim:
        if rot <= 0 or rot % 2 or rot > head_dim:
            raise ConversionError(f"metadata key phi3.rope.dimension_count: {rot} for head_dim {head_dim}")
        cfg["partial_rotary_factor"] = rot / head_dim
        if int(head_dim * cfg["partial_rotary_factor"]) != rot:  # transformers truncates the product
            raise ConversionError(
                f"metadata key phi3.rope.dimension_count: {rot} is no fraction of head_dim {head_dim}"
            )
    orig = int(g("rope.scaling.original_context_length", cfg["max_position_embeddings"]))
    cfg["original_max_position_embeddings"] = orig
    cfg["sliding_window"] = int(window) if window else None
    long_t, short_t = tensors.get("rope_factors_long.weight"), tensors.get("rope_factors_short.weight")
    if (long_t is None) != (short_t is None):
        have, miss = ("long", "short") if short_t is None else ("short", "long")
        raise ConversionError(f"tensor rope_factors_{have}.weight without rope_factors_{miss}.weight")
    if long_t is None:
        return
    factors = {}
    for key, t in (("long_factor", long_t), ("short_factor", short_t)):
        w = dequantize_tensor(t).reshape(-1)
        if w.size != rot // 2:
            raise ConversionError(f"tensor {t.name}: {w.size} factors, expected rotary dimension / 2 = {rot // 2}")
        factors[key] = [f32_spelling(x) for x in w]
    rs = {"rope_type": "longrope", **factors}
    attn = g("rope.scaling.attn_factor", None)
    scale = cfg["max_position_embeddings"] / orig
    derived = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0
    if attn is not None and abs(float(attn) - derived) > 1e-6 * derived:
        rs["attention_factor"] = f32_spelling(attn)
    cfg["rope_scaling"] = rs


_HF_CLASSES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}


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


def expected_names(family, cfg):
    """The parameter names of the Hugging Face model `cfg` describes (transformers would initialise a
    missing one at random, and drop an unexpected one)."""
    attn = ["q_proj", "k_proj", "v_proj", "o_proj"]
    mlp = ["gate_proj", "up_proj", "down_proj"]
    norms = ["input_layernorm", "post_attention_layernorm"]
    biases = []
    if family == "phi3":
        attn, mlp = ["qkv_proj", "o_proj"], ["gate_up_proj", "down_proj"]
    elif family == "gemma3":
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    if family == "qwen2":  # always q/k/v biases, never o_proj's
        biases = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
    elif family in ("llama", "qwen3"):  # attention_bias: q/k/v and o_proj; Llama's mlp_bias: the MLP's
        biases = [f"self_attn.{p}" for p in attn if cfg["attention_bias"]]
        biases += [f"mlp.{p}" for p in mlp if cfg.get("mlp_bias")]
    layer = [f"self_attn.{p}.weight" for p in attn] + [f"mlp.{p}.weight" for p in mlp] + [f"{n}.weight" for n in norms]
    layer += [f"{b}.bias" for b in biases]
    if family in ("qwen3", "gemma3"):
        layer += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    names = {f"model.layers.{i}.{n}" for i in range(cfg["num_hidden_layers"]) for n in layer}
    names |= {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg["tie_word_embeddings"]:
        names.add("lm_head.weight")
    return names


def fuse_phi3_qkv(state, n_layers):
    """Separate Phi-3 q / k / v matrices (llama.cpp loads these as well as the fused attn_qkv) into
    Phi3ForCausalLM's qkv_proj: rows q, then k, then v."""
    for i in range(n_layers):
        parts = [state.pop(f"model.layers.{i}.self_attn.{p}.weight", None) for p in ("q_proj", "k_proj", "v_proj")]
        if all(p is None for p in parts):
            continue
        fused = f"model.layers.{i}.self_attn.qkv_proj.weight"
        if any(p is None for p in parts) or fused in state:
            raise ConversionError(f"layer {i}: phi3 needs blk.{i}.attn_qkv or all of attn_q, attn_k, attn_v, not both")
        state[fused] = np.concatenate(parts, axis=0)


def convert(gguf_path, outdir, dtype):
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path)
    arch = field(reader, "general.architecture")
    if arch not in _LAYER_NAMES:
        hint = f" ({_NOT_CONVERTED[arch]})" if arch in _NOT_CONVERTED else ""
        raise ConversionError(
            f"{gguf_path}: architecture {arch!r} is not supported{hint}; supported: {', '.join(_LAYER_NAMES)}"
        )
    tensors = {t.name: t for t in reader.tensors}
    # Check every name first, so an unsupported file fails before anything is written (types
    # fail while dequantizing, also before anything is written).
    for t in reader.tensors:
        if t.name not in _SKIPPED:
            hf_name(t.name, arch)
    family = family_of(reader, arch, tensors)
    cfg = build_config(reader, arch, family, tensors, dtype)
    log(
        f"{os.path.basename(gguf_path)}: {arch} -> {cfg['architectures'][0]}, {cfg['num_hidden_layers']} layers, "
        f"hidden {cfg['hidden_size']}, heads {cfg['num_attention_heads']}/{cfg['num_key_value_heads']}, "
        f"vocab {cfg['vocab_size']}, {len(tensors)} tensors, tied={cfg['tie_word_embeddings']}"
    )

    # Only llama.cpp's llama architecture (Llama, Mistral) has q/k rows permuted (its RoPE kernel
    # rotates adjacent pairs there); qwen2, qwen3, phi3 and gemma3 use the NeoX rotation of halves,
    # as transformers does, and are stored as they are (transformers' GGUF loader undoes the
    # permutation for "llama" only: LlamaTensorProcessor).
    permuted = arch == "llama"
    state = {}
    counts = {}
    for t in reader.tensors:
        if t.name in _SKIPPED:
            log(f"{t.name}: {'in config.json rope_scaling' if t.name.startswith('rope_factors') else 'skipped'}")
            continue
        w = dequantize_tensor(t)
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        if permuted and re.fullmatch(r"blk\.\d+\.attn_q\.(weight|bias)", t.name):
            w = unpermute(w, cfg["num_attention_heads"])
        elif permuted and re.fullmatch(r"blk\.\d+\.attn_k\.(weight|bias)", t.name):
            w = unpermute(w, cfg["num_key_value_heads"])
        elif arch == "gemma3" and t.name.endswith("norm.weight"):
            w = w - 1.0
        state[hf_name(t.name, arch)] = np.ascontiguousarray(w)
    log("dequantized " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if family == "phi3":
        fuse_phi3_qkv(state, cfg["num_hidden_layers"])
    want = expected_names(family, cfg)
    gguf_of = {hf_name(t.name, arch): t.name for t in reader.tensors if t.name not in _SKIPPED}
    extra = sorted(gguf_of.get(n, n) for n in set(state) - want)
    if extra:
        raise ConversionError(f"tensor {extra[0]}: {cfg['architectures'][0]} has no such parameter ({len(extra)} such)")
    missing = sorted(want - set(state))
    if missing:
        raise ConversionError(
            f"tensor {gguf_name(missing[0], arch)} missing ({cfg['architectures'][0]} needs {missing[0]}; "
            f"{len(missing)} missing)"
        )

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
