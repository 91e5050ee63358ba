#!/usr/bin/env python3
"""Makes the tiny random-weight Hugging Face models that oomb's parity tests load, with reference
outputs from transformers.

    make_tiny_models.py --out DIR [--force]

For each model NAME: DIR/NAME/ (config.json, generation_config.json, model.safetensors or
model.safetensors.index.json + shards) and DIR/NAME/reference.safetensors with
  input_ids  int64   [1, 96]        seeded random tokens
  logits     float32 [1, 96, vocab] transformers' forward in float32, eager attention, one pass
                                    over all 96 positions (position ids 0..95), no attention mask
  loss       float32 []             mean next-token cross-entropy with labels = input_ids
  router_aux_loss float32 []        a mixture of experts with output_router_logits: the router's
                                    auxiliary loss (transformers' aux_loss; its loss is then
                                    loss + router_aux_loss_coef * router_aux_loss)
and DIR/NAME/lora/: a PEFT LoRA adapter (r 4, alpha 8, target_modules every linear layer's name
of the language model and, of a mixture of experts, target_parameters its expert banks; A and B
drawn at random so that every gradient is non-zero) as PEFT saves it, with
DIR/NAME/lora/reference.safetensors holding transformers + PEFT's
  loss        float32 []              the same loss with the adapter (transformers': with
                                      router_aux_loss_coef * router_aux_loss where it has one)
  router_aux_loss float32 []          output_router_logits: the router's auxiliary loss
  input_grad  float32 [1, 96, hidden] its gradient with respect to the input embeddings
                                      (the embedding layer's output, Gemma's scaling included)
  NAME        float32                 its gradient with respect to each LoRA weight, under the
                                      adapter file's tensor names
and DIR/manifest.json with the models' key config facts and the reference loss. Which layers
the adapter has is PEFT's reading of those names: on a Qwen3-MoE with a dense layer
(mlp_only_layers) PEFT 0.22 adapts that layer's MLP as well as the banks, 0.21 the banks only
(its adapter_config.json says which; the manifest names the PEFT release). A model whose
name ends in -mxfp4 keeps its expert banks as MXFP4 (<bank>_blocks, <bank>_scales and
quantization_config, as gpt-oss's published checkpoints): its references are of the dequantized
weights, which transformers reloads from those files bit for bit.

Everything is seeded: the same transformers / PEFT / torch versions give the same files. A second
run with DIR/manifest.json present, of the same GENERATOR_VERSION and made with the transformers
and PEFT installed now, does nothing (use --force).

RoPE config key: transformers >= 5 writes RoPE settings as `rope_parameters` (a dict holding
`rope_type`, `rope_theta` and the type's fields such as `factor`); transformers 4.x wrote
`rope_scaling` (the same dict without `rope_theta`, which was the top-level `rope_theta`).
The configs here are whatever this transformers version writes; a loader should accept both.

Note on `llama-rope-dynamic`: dynamic NTK changes the RoPE base with the current sequence length
once it exceeds max_position_embeddings (64 here, so the 96-token reference uses the scaled base
for seq_len = 96: base' = base * (factor * 96 / 64 - (factor - 1)) ** (head_dim / (head_dim - 2))).
"""

import argparse
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never ask the Hugging Face hub

GENERATOR_VERSION = 9
SEQ_LEN = 96
INIT_STD = 0.2


def log(msg):
    print(f"[make_tiny_models] {msg}", file=sys.stderr, flush=True)


def model_specs():
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        initializer_range=INIT_STD,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    theta = 10000.0
    specs = [
        (
            "qwen2-bias-gqa-untied",
            "qwen2",
            dict(common, vocab_size=384, num_hidden_layers=3, max_position_embeddings=256,
                 tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        ),
        (
            "qwen2-tied",
            "qwen2",
            dict(common, vocab_size=320, num_hidden_layers=2, max_position_embeddings=256,
                 tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        ),
        (
            "llama-gqa",
            "llama",
            dict(common, vocab_size=256, num_hidden_layers=2, max_position_embeddings=256,
                 tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": theta}),
        ),
        (
            "llama-rope-linear",
            "llama",
            dict(common, vocab_size=256, num_hidden_layers=2, max_position_embeddings=256,
                 rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": theta}),
        ),
        (
            # max_position_embeddings < SEQ_LEN, so the dynamic scaling is active in the reference.
            "llama-rope-dynamic",
            "llama",
            dict(common, vocab_size=256, num_hidden_layers=2, max_position_embeddings=64,
                 rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": theta}),
        ),
        (
            "llama-rope-yarn",
            "llama",
            dict(common, vocab_size=256, num_hidden_layers=2, max_position_embeddings=1024,
                 rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": theta,
                                  "original_max_position_embeddings": 256,
                                  "beta_fast": 32.0, "beta_slow": 1.0}),
        ),
        (
            # With head_dim 16 and theta 1e4 the wavelengths are 6.3 ... 19869: below
            # 256/4 = 64 unchanged, above 256 divided by the factor, 199 smoothly interpolated.
            "llama-rope-llama3",
            "llama",
            dict(common, vocab_size=256, num_hidden_layers=2, max_position_embeddings=1024,
                 rope_parameters={"rope_type": "llama3", "factor": 4.0, "rope_theta": theta,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 256}),
        ),
        (
            # Qwen3: q/k norms, no biases, head_dim (16) independent of hidden / heads (64 / 8).
            "qwen3-qknorm",
            "qwen3",
            dict(common, num_attention_heads=8, num_key_value_heads=2, vocab_size=320, num_hidden_layers=2,
                 max_position_embeddings=256, tie_word_embeddings=True, attention_bias=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        ),
        (
            # Mistral: a sliding window (32) shorter than the reference's 96 tokens and not a
            # multiple of the tests' page sizes; head_dim set explicitly, no biases.
            "mistral-window",
            "mistral",
            dict(common, vocab_size=288, num_hidden_layers=2, max_position_embeddings=256, sliding_window=32,
                 tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        ),
        (
            # Gemma 3 text: local (window 20) and global layers with their own RoPE (the global
            # one linearly scaled), query_pre_attn_scalar (24) unlike head_dim (16), q/k norms,
            # (1 + w) norms around attention and MLP, GELU-tanh, embeddings scaled, tied.
            "gemma3-window",
            "gemma3",
            dict(common, vocab_size=320, num_hidden_layers=3, max_position_embeddings=256, sliding_window=20,
                 query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                 rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                  "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}),
        ),
        (
            # Qwen3-MoE: 4 experts, 2 per token, not renormalised (norm_topk_prob false), layer 1
            # dense (mlp_only_layers) beside two sparse ones; Qwen3's q/k norms.
            "qwen3-moe",
            "qwen3_moe",
            dict(common, vocab_size=320, num_hidden_layers=3, max_position_embeddings=256, num_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=False, mlp_only_layers=[1],
                 decoder_sparse_step=1, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        ),
        (
            # Mixtral: every layer sparse, 4 experts, 2 per token (renormalised, weights applied in
            # float32), a sliding window (40) shorter than the sequence; block_sparse_moe w1/w2/w3.
            "mixtral-window",
            "mixtral",
            dict(common, vocab_size=288, num_hidden_layers=2, max_position_embeddings=256, num_local_experts=4,
                 num_experts_per_tok=2, sliding_window=40, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        ),
        (
            "llama-sharded",
            "llama",
            dict(common, vocab_size=512, num_hidden_layers=3, max_position_embeddings=256,
                 tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": theta}),
        ),
        (
            # Phi-4-mini's shape: fused qkv_proj and gate_up_proj, RoPE over 3/4 of each head
            # (partial_rotary_factor), longrope past the original window of 64 (the reference's
            # 96 tokens use the long factors; attention factor from 256 / 64), tied.
            "phi3-longrope-partial",
            "phi3",
            dict(common, vocab_size=320, num_hidden_layers=2, max_position_embeddings=256,
                 original_max_position_embeddings=64, tie_word_embeddings=True,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                  "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                                  "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0]}),
        ),
        (
            # Phi-3-mini's shape: longrope within its original window (short factors), a sliding
            # window (40) shorter than the sequence, untied.
            "phi3-window",
            "phi3",
            dict(common, vocab_size=288, num_hidden_layers=2, max_position_embeddings=512,
                 original_max_position_embeddings=128, sliding_window=40, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                  "short_factor": [1.0, 1.05, 1.1, 1.2, 1.4, 1.7, 2.1, 2.6],
                                  "long_factor": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]}),
        ),
        (
            # The text part of a Gemma 3 vision-language checkpoint (Gemma3ForConditionalGeneration,
            # a two-layer vision tower beside it); token ids 300 and up are its image tokens.
            "gemma3-multimodal",
            "gemma3cg",
            dict(text_config=dict(common, vocab_size=320, num_hidden_layers=2, max_position_embeddings=256,
                                  sliding_window=24, query_pre_attn_scalar=16,
                                  layer_types=["sliding_attention", "full_attention"]),
                 vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=2, image_size=28, patch_size=14),
                 mm_tokens_per_image=4, image_token_index=300, boi_token_index=301, eoi_token_index=302),
        ),
        (
            # Qwen3-MoE trained with the router's auxiliary loss (output_router_logits, a coefficient
            # large enough to show in the gradients), renormalised (norm_topk_prob), layer 0 dense.
            "qwen3-moe-aux",
            "qwen3_moe",
            dict(common, vocab_size=320, num_hidden_layers=3, max_position_embeddings=256, num_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[0],
                 decoder_sparse_step=1, tie_word_embeddings=False, output_router_logits=True,
                 router_aux_loss_coef=0.25, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        ),
        (
            # gpt-oss: attention sinks, q/k/v/o biases, layers alternating a window of 20 (not a
            # page multiple) with global attention, YaRN (factor 4 over 64 positions, not
            # truncated), 4 experts with biases, 2 per token (a softmax over their logits), the
            # clamped SwiGLU with a limit low enough to clamp, the router's auxiliary loss.
            "gpt-oss",
            "gpt_oss",
            dict(GPT_OSS, output_router_logits=True, router_aux_loss_coef=0.25),
        ),
        (
            # The same shape with its expert banks in MXFP4 (gate_up_proj_blocks / _scales), as the
            # published gpt-oss checkpoints keep them: the reference is transformers on the
            # dequantized weights (convert_moe_packed_tensors).
            "gpt-oss-mxfp4",
            "gpt_oss",
            dict(GPT_OSS, num_hidden_layers=2),
        ),
    ]
    return specs


# The tiny gpt-oss's shape (model_specs).
GPT_OSS = dict(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               rms_norm_eps=1e-5, initializer_range=INIT_STD, bos_token_id=1, eos_token_id=2, pad_token_id=0,
               vocab_size=288, num_hidden_layers=3, max_position_embeddings=256, num_local_experts=4,
               num_experts_per_tok=2, sliding_window=20, swiglu_limit=1.5, tie_word_embeddings=False,
               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})

# MXFP4's E2M1 values by 4-bit code (transformers' FP4_VALUES).
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def quantize_mxfp4(w):
    """A bank [E, in, out] (transformers' gpt-oss layout) as MXFP4: blocks uint8 [E, out, in / 32, 16]
    (two codes a byte, the even element in the low nibble) and scales uint8 [E, out, in / 32]
    (2^(s - 127) per 32 values), each value the nearest E2M1 value of its block's scale."""
    import torch

    rows = w.transpose(1, 2).contiguous()  # [E, out, in]
    E, O, I = rows.shape  # noqa: E741 (experts, out, in: the shapes' names)
    groups = rows.reshape(E, O, I // 32, 32)
    amax = groups.abs().amax(-1).clamp_min(1e-30)
    exponent = torch.ceil(torch.log2(amax / 6.0)).to(torch.int32)
    scaled = groups / torch.ldexp(torch.ones_like(amax), exponent).unsqueeze(-1)
    values = torch.tensor(E2M1)
    codes = (scaled.unsqueeze(-1) - values).abs().argmin(-1).to(torch.uint8)  # [E, O, G, 32]
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), (exponent + 127).to(torch.uint8).contiguous()


def to_mxfp4_checkpoint(model):
    """Rounds `model`'s expert banks to MXFP4 in place (their dequantized values, as transformers'
    convert_moe_packed_tensors gives them) and returns the checkpoint tensors that replace the
    banks in `out`'s model.safetensors."""
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    packed = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                blocks, scales = quantize_mxfp4(p.detach())
                p.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
                packed[name + "_blocks"] = blocks
                packed[name + "_scales"] = scales
    return packed


def write_mxfp4_checkpoint(model, out, packed):
    """`out`'s model.safetensors with the banks as `packed`, and quantization_config in its
    config.json, as gpt-oss's published checkpoints."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(out, "model.safetensors")
    tensors = {n: t for n, t in load_file(path).items()
               if not n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    tensors.update(packed)
    save_file(tensors, path, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def init_weights(model, seed):
    """Normal(0, INIT_STD) weights and biases (not the 0.02 default, so logits differ clearly),
    RMSNorm weights 1 + Normal(0, 0.1); in name order from one seeded generator."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(INIT_STD * noise)
    if model.config.get_text_config().tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def make_one(out_root, index, name, family, cfg_kwargs):
    import torch
    from safetensors.torch import save_file
    from transformers import (
        Gemma3Config,
        Gemma3ForCausalLM,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        GptOssConfig,
        GptOssForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
        Phi3Config,
        Phi3ForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    seed = 1000 + index
    cfg_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
        "mixtral": (MixtralConfig, MixtralForCausalLM),
        "gpt_oss": (GptOssConfig, GptOssForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM),
        "gemma3cg": (Gemma3Config, Gemma3ForConditionalGeneration),
        "phi3": (Phi3Config, Phi3ForCausalLM),
    }[family]
    config = cfg_cls(**cfg_kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    init_weights(model, seed)
    mxfp4 = to_mxfp4_checkpoint(model) if name.endswith("-mxfp4") else None

    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    save_kwargs = {"safe_serialization": True}
    if name == "llama-sharded":
        save_kwargs["max_shard_size"] = "150KB"
    model.save_pretrained(out, **save_kwargs)

    # Reference from a fresh load of what was saved, so the files are what the reference describes.
    loaded = model_cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(seed + 7)
    text = config.get_text_config()
    top_id = 300 if family == "gemma3cg" else text.vocab_size  # no image tokens
    input_ids = torch.randint(0, top_id, (1, SEQ_LEN), generator=g, dtype=torch.int64)
    with torch.no_grad():
        res = loaded(input_ids=input_ids, labels=input_ids)
    logits = res.logits.float().contiguous()
    loss = res.loss.float().reshape(())
    # The loss must be the plain shifted mean CE of these logits (and the router's auxiliary loss).
    ce = torch.nn.functional.cross_entropy(logits[0, :-1], input_ids[0, 1:])
    tensors = {"input_ids": input_ids.contiguous(), "logits": logits}
    text = config.get_text_config()
    if getattr(text, "output_router_logits", False):
        aux = res.aux_loss.float().reshape(())
        assert torch.allclose(ce + text.router_aux_loss_coef * aux, loss, atol=1e-5), (ce, aux, loss)
        tensors["router_aux_loss"] = aux.contiguous()
        loss = ce
    assert torch.allclose(ce, loss, atol=1e-5), (ce, loss)
    tensors["loss"] = loss.contiguous()
    save_file(
        tensors,
        os.path.join(out, "reference.safetensors"),
        metadata={"format": "pt"},  # one key: safetensors writes several in random order
    )

    make_lora_reference(loaded, os.path.join(out, "lora"), family, seed, input_ids)
    if mxfp4 is not None:  # the reference is of these weights: now stored as MXFP4
        write_mxfp4_checkpoint(model, out, mxfp4)

    files = sorted(os.listdir(out))
    size = sum(os.path.getsize(os.path.join(out, f)) for f in files if os.path.isfile(os.path.join(out, f)))
    c = loaded.config.get_text_config()
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None)
    facts = {
        "name": name,
        "architecture": type(loaded).__name__,
        "model_type": c.model_type,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": bool(c.tie_word_embeddings),
        "qkv_bias": family == "qwen2" or bool(getattr(c, "attention_bias", False)),
        "partial_rotary_factor": (rope or {}).get("partial_rotary_factor", 1.0) if isinstance(rope, dict) else 1.0,
        "rope_parameters": dict(rope) if rope else None,
        "sliding_window": getattr(c, "sliding_window", None),
        "sharded": os.path.exists(os.path.join(out, "model.safetensors.index.json")),
        "files": files,
        "bytes": size,
        "seed": seed,
        "reference": {"seq_len": SEQ_LEN, "loss": round(float(loss), 6),
                      "logits_std": round(float(logits.std()), 4)},
    }
    log(f"{name}: {facts['architecture']}, {c.num_hidden_layers} layers, vocab {c.vocab_size}, "
        f"rope {facts['rope_parameters']}, {len(files)} files, {size / 1e3:.0f} kB, "
        f"reference loss {float(loss):.4f}")
    return facts


def installed_versions():
    """The transformers and PEFT releases the references are made with (without importing them)."""
    from importlib.metadata import version
    return {"transformers": version("transformers"), "peft": version("peft")}


def make_lora_reference(model, out, family, seed, input_ids):
    """The PEFT adapter of DIR/NAME/lora/ and its gradients (see the module's docstring)."""
    import peft
    import torch
    from safetensors.torch import save_file

    linears = (["qkv_proj", "o_proj", "gate_up_proj", "down_proj"] if family == "phi3" else
               ["q_proj", "k_proj", "v_proj", "o_proj"] if family == "gpt_oss" else
               ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    # A vision-language model: the language model's layers only (its vision tower has q_proj too).
    targets = (r".*language_model.*\.(" + "|".join(linears) + ")$") if family == "gemma3cg" else linears
    # A mixture of experts: its expert banks too (PEFT 0.22 also reads the MLP's names as the banks,
    # and as the dense layers' MLP beside them; 0.21 as the banks alone).
    banks = (["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
             if family in ("qwen3_moe", "mixtral", "gpt_oss") else None)
    tuned = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0,
                                                       target_parameters=banks))
    g = torch.Generator().manual_seed(seed + 11)
    with torch.no_grad():
        for name, p in sorted(tuned.named_parameters()):
            if "lora_" in name:
                p.copy_(INIT_STD * torch.randn(p.shape, generator=g, dtype=torch.float32))
    tuned.save_pretrained(out)
    embeds = model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
    res = tuned(inputs_embeds=embeds, labels=input_ids)
    res.loss.backward()
    grads = {"loss": res.loss.detach().float().reshape(()).contiguous(),
             "input_grad": embeds.grad.float().contiguous()}
    if getattr(res, "aux_loss", None) is not None:
        grads["router_aux_loss"] = res.aux_loss.detach().float().reshape(()).contiguous()
    for name, p in tuned.named_parameters():
        if "lora_" in name:
            grads[name.replace(".default", "")] = p.grad.float().contiguous()
    save_file(grads, os.path.join(out, "reference.safetensors"), metadata={"format": "pt"})
    model.zero_grad(set_to_none=True)
    tuned.unload()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--force", action="store_true", help="remake even if DIR/manifest.json is current")
    a = ap.parse_args()

    manifest_path = os.path.join(a.out, "manifest.json")
    names = [s[0] for s in model_specs()]
    if not a.force and os.path.exists(manifest_path):
        try:
            with open(manifest_path) as f:
                m = json.load(f)
            made_with = {k: m.get(f"{k}_version") for k in ("transformers", "peft")}
            if m.get("generator_version") == GENERATOR_VERSION and made_with == installed_versions() and all(
                os.path.exists(os.path.join(a.out, n, "lora", "reference.safetensors")) for n in names
            ):
                log(f"{a.out}: present (manifest generator_version {GENERATOR_VERSION}, {made_with}), nothing to do")
                return 0
        except (OSError, ValueError):
            pass

    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # summation order independent of the machine's core count
    os.makedirs(a.out, exist_ok=True)
    models = [make_one(a.out, i, *spec) for i, spec in enumerate(model_specs())]
    manifest = {
        "generator_version": GENERATOR_VERSION,
        "generator": "tests/python/make_tiny_models.py",
        "transformers_version": transformers.__version__,
        "peft_version": installed_versions()["peft"],
        "torch_version": torch.__version__,
        "init_std": INIT_STD,
        "reference": {
            "file": "reference.safetensors",
            "tensors": {"input_ids": "int64 [1, seq_len]", "logits": "float32 [1, seq_len, vocab]",
                        "loss": "float32 [] mean next-token CE, labels = input_ids"},
            "attn_implementation": "eager",
            "dtype": "float32",
        },
        "rope_config_key": "rope_parameters (transformers >= 5); rope_scaling + rope_theta in 4.x",
        "models": models,
    }
    tmp = manifest_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    os.replace(tmp, manifest_path)
    total = sum(m["bytes"] for m in models)
    log(f"wrote {len(models)} models and {manifest_path}; total {total / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
