#!/usr/bin/env python3
"""Side-by-side peers: the strongest Hugging-Face-based LoRA training stacks a user could assemble.

One stack per process (--stack), on a Qwen2.5-7B-shaped model with random weights (speed and
memory do not depend on weight values), bf16, LoRA r=16 alpha=32 on q,k,v,o,gate,up,down,
batch 1, one step = forward + backward + zero_grad (no optimizer step), as in
the HF baseline (bench/peers/hf_baseline.py):

  hf             transformers + PEFT + non-reentrant gradient checkpointing + SDPA attention
                 (exactly the baseline's setup)
  liger          hf + Liger kernels (RoPE, RMSNorm, SwiGLU, fused linear cross entropy), patched in
                 with apply_liger_kernel_to_qwen2 before the model is built
  liger-offload  liger + every tensor autograd saves (with gradient checkpointing on, mostly the
                 per-layer checkpoints) offloaded to pinned host memory by
                 torch.autograd.graph.save_on_cpu(pin_memory=True) around forward + backward
  hf-offload     hf + the same offloading, without Liger: the stack for the mixture-of-experts
                 presets (qwen3-30b-a3b, tiny-moe), where LoRA adapts attention (target_modules
                 q,k,v,o) and every expert bank (PEFT's target_parameters, mlp.experts.gate_up_proj
                 and down_proj) and transformers computes the experts with grouped GEMMs
                 (experts_implementation="grouped_mm")
  unsloth        Unsloth FastLanguageModel, bf16 LoRA (load_in_4bit=False), Unsloth's offloaded
                 gradient checkpointing (use_gradient_checkpointing="unsloth"). Unsloth loads from a
                 directory, so the random-weight model (config, safetensors, a small stand-in
                 tokenizer) is first written to --model-dir by a child process that never imports
                 unsloth (unsloth must be imported before transformers / peft / trl).

Output, one JSON object per line on stdout (logs go to stderr):
  {"meta": true, "stack", versions..., "device", ...}                      first line
  {"stack", "S", "s_per_step", "tok_s", "peak_bytes", "reserved_bytes"}    one per length
  {"stack", "S", "oom": true}                                              when it does not fit
  {"stack", "S", "probe": true, "fits": bool, "s_per_step", ...}           --longest probes
  {"stack", "longest": S, "oom_at": S2 or null, "resolution": step}       --longest result
  {"stack", "error": "..."}                                                stack unusable here

Per length: empty_cache, reset peak stats, one warm-up step at that length (--warmup each, the
default), then one timed step (torch.cuda.synchronize before and after).

CPU check of the plumbing:  python3 peers.py --stack hf --model tiny --device cpu --lengths 64 128
"""
import argparse
import gc
import importlib.metadata as md
import json
import os
import subprocess
import sys
import time
import traceback

# No network on the GPU machine: keep the hub and Unsloth's usage statistics quiet and offline.
for _k, _v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"),
               ("UNSLOTH_DISABLE_STATISTICS", "1"), ("TOKENIZERS_PARALLELISM", "false"),
               ("PYTHONUNBUFFERED", "1")):
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402  (transformers / peft / unsloth are imported per stack, in the right order)

PRESETS = {
    # Qwen2.5-7B architecture (as hf_baseline.py).
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # Qwen2.5-0.5B architecture, for quick checks.
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # Qwen3-30B-A3B architecture (a mixture of experts: 128 experts, 8 per token).
    "qwen3-30b-a3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
                          rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # A tiny mixture of experts: checks the MoE plumbing on a CPU.
    "tiny-moe": dict(vocab_size=1000, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                     rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # A few hundred thousand parameters: checks the plumbing on a CPU.
    "tiny": dict(vocab_size=1000, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),
}
MAX_POSITIONS = 1 << 23  # as hf_baseline.py: no length we try is refused or RoPE-scaled
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# A mixture of experts: attention by name, the experts' banks as parameters (what oomb's default
# targets amount to there).
MOE_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
MOE_LORA_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
LORA_R, LORA_ALPHA = 16, 32
STACKS = ["hf", "liger", "liger-offload", "hf-offload", "unsloth"]


def is_moe(preset):
    return "num_experts" in PRESETS[preset]


# JSON lines go to the original stdout; everything else written to stdout (Unsloth's banners,
# library prints, even C-level writes to fd 1) is sent to stderr, so stdout stays parseable.
_json_out = None


def _split_stdout():
    global _json_out
    if _json_out is None:
        sys.stdout.flush()
        _json_out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr


def emit(obj):
    _split_stdout()
    _json_out.write(json.dumps(obj) + "\n")
    _json_out.flush()


def log(msg):
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def version_of(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def qwen2_config(transformers, preset):
    if is_moe(preset):
        return transformers.Qwen3MoeConfig(max_position_embeddings=MAX_POSITIONS, attn_implementation="sdpa",
                                           experts_implementation="grouped_mm", **PRESETS[preset])
    return transformers.Qwen2Config(max_position_embeddings=MAX_POSITIONS, attn_implementation="sdpa",
                                    **PRESETS[preset])


def is_cuda(args):
    return args.device.startswith("cuda")


def sync(args):
    if is_cuda(args):
        torch.cuda.synchronize()


def is_oom(exc):
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # Allocation failures that surface as plain RuntimeErrors (cuBLAS workspace, pinned host memory).
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "alloc_failed" in msg)


# ----------------------------------------------------------------------------------------------
# Stacks. Each builder returns (model, step_context_factory); the model is in train mode.

def build_hf_like(args, liger):
    if liger:
        # Patch the Qwen2 classes before the model exists (the documented way).
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2
        apply_liger_kernel_to_qwen2(rope=True, rms_norm=True, swiglu=True,
                                    fused_linear_cross_entropy=True)
    import transformers
    import peft
    cfg = qwen2_config(transformers, args.model)
    with torch.device(args.device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    if is_moe(args.model):
        lora = peft.LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, target_modules=MOE_LORA_TARGETS,
                               target_parameters=MOE_LORA_PARAMETERS)
    else:
        lora = peft.LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, target_modules=LORA_TARGETS)
    model = peft.get_peft_model(model, lora)
    model.train()
    return model


def save_random_model(args):
    """Child-process entry (--save-model DIR): write a random-weight model Unsloth can load."""
    import shutil
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    torch.manual_seed(args.seed)
    out = args.save_model
    tmp = out.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    t = time.perf_counter()
    cfg = qwen2_config(transformers, args.model)
    with torch.device(args.device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(tmp)
    # A stand-in tokenizer (a few words): the benchmark feeds random token ids, but Unsloth's
    # loader always loads a tokenizer from the model directory.
    vocab = {"<|endoftext|>": 0, "<unk>": 1}
    vocab.update({chr(ord("a") + i): 2 + i for i in range(26)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                pad_token="<|endoftext|>", unk_token="<unk>")
    fast.save_pretrained(tmp)
    with open(os.path.join(tmp, "peers_model.json"), "w") as f:
        json.dump({"preset": args.model, "seed": args.seed}, f)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    log(f"saved random {args.model} to {out} in {time.perf_counter() - t:.1f} s")


def ensure_model_dir(args):
    marker = os.path.join(args.model_dir, "peers_model.json")
    try:
        with open(marker) as f:
            if json.load(f).get("preset") == args.model:
                log(f"reusing {args.model_dir}")
                return
    except (OSError, ValueError):
        pass
    log(f"writing a random-weight {args.model} to {args.model_dir} (child process)")
    cmd = [sys.executable, os.path.abspath(__file__), "--save-model", args.model_dir,
           "--model", args.model, "--device", args.device, "--seed", str(args.seed)]
    subprocess.run(cmd, check=True, stdout=sys.stderr)


def set_unsloth_max_seq(model, S):
    # Unsloth truncates input_ids longer than model.max_seq_length (with a warning) and builds RoPE
    # rows up to max(S, max_seq_length): a user training at S loads with max_seq_length = S. Set it
    # on every module, as FastLlamaModel.from_pretrained / get_peft_model do.
    if getattr(model, "max_seq_length", None) == S:
        return
    for m in model.modules():
        m.max_seq_length = S


def build_unsloth(args, max_seq):
    ensure_model_dir(args)
    import unsloth  # noqa: F401  (first: it patches transformers / peft / trl on import)
    from unsloth import FastLanguageModel
    model, _tok = FastLanguageModel.from_pretrained(
        model_name=args.model_dir, max_seq_length=max_seq, dtype=torch.bfloat16,
        load_in_4bit=False, load_in_8bit=False, load_in_16bit=True, full_finetuning=False,
        use_gradient_checkpointing="unsloth", fix_tokenizer=False, local_files_only=True,
        **({"unsloth_tiled_mlp": True} if args.unsloth_tiled_mlp else {}))
    model = FastLanguageModel.get_peft_model(
        model, r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, bias="none",
        target_modules=LORA_TARGETS, use_gradient_checkpointing="unsloth",
        random_state=args.seed, max_seq_length=max_seq)
    model.train()  # what a Trainer does; FastLanguageModel.for_training is not needed for this
    return model


# ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", choices=STACKS)
    ap.add_argument("--model", default="qwen2.5-7b", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (plumbing checks only)")
    ap.add_argument("--lengths", type=int, nargs="*", default=[16384, 65536, 131072])
    ap.add_argument("--warmup", choices=["each", "first"], default="each",
                    help="each: a warm-up step at every length before its timed step (default); "
                         "first: only the one warm-up step at the first length")
    ap.add_argument("--longest", action="store_true",
                    help="after --lengths, search the longest context that fits")
    ap.add_argument("--longest-step", type=int, default=16384, help="search resolution (tokens)")
    ap.add_argument("--longest-tries", type=int, default=4, help="most probe steps of the search")
    ap.add_argument("--longest-grow", type=float, default=1.5, help="growth factor while all fit")
    ap.add_argument("--host-guard", type=float, default=0.0,
                    help="offloading stacks: do not probe a length whose per-layer checkpoints "
                         "(S*hidden*2 B*layers) exceed this fraction of available host memory "
                         "(0, the default, disables it); such a length is reported as not fitting, "
                         "with a reason. Off by default: 'available' counts the pinned buffers "
                         "LibTorch caches after a step as used, so the guard skipped lengths that "
                         "would have fitted (the swap-peers run in bench/results, call 8)")
    ap.add_argument("--model-dir", default=None,
                    help="unsloth: where the random-weight model is written / reused "
                         "(default /tmp/peers-model-<preset>)")
    ap.add_argument("--max-seq-length", type=int, default=None,
                    help="unsloth: max_seq_length given to from_pretrained (default: the largest "
                         "of --lengths); each step then sets the model's max_seq_length to its S")
    ap.add_argument("--unsloth-tiled-mlp", action="store_true",
                    help="unsloth: also pass unsloth_tiled_mlp=True (not part of the default stack)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-model", metavar="DIR", help=argparse.SUPPRESS)
    # Test hook: raise torch.OutOfMemoryError for any step longer than N tokens (CPU checks of the
    # OOM handling and of the --longest search).
    ap.add_argument("--fake-oom-above", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.save_model:
        save_random_model(args)
        return 0
    _split_stdout()
    if not args.stack:
        ap.error("--stack is required")
    if args.model_dir is None:
        args.model_dir = f"/tmp/peers-model-{args.model}"
    stack = args.stack
    cfg_d = PRESETS[args.model]
    lengths = list(args.lengths)
    if not lengths and not args.longest:
        ap.error("nothing to do: give --lengths and/or --longest")
    torch.manual_seed(args.seed)

    meta = {"meta": True, "stack": stack, "model": args.model, "method": "lora",
            "lora": ({"r": LORA_R, "alpha": LORA_ALPHA, "targets": MOE_LORA_TARGETS,
                      "target_parameters": MOE_LORA_PARAMETERS} if is_moe(args.model) else
                     {"r": LORA_R, "alpha": LORA_ALPHA, "targets": LORA_TARGETS}),
            "batch": 1, "dtype": "bfloat16", "warmup": args.warmup,
            "torch": torch.__version__, "transformers": version_of("transformers"),
            "peft": version_of("peft"), "accelerate": version_of("accelerate"),
            "triton": version_of("triton"), "liger_kernel": version_of("liger-kernel"),
            "unsloth": version_of("unsloth"), "unsloth_zoo": version_of("unsloth_zoo"),
            "trl": version_of("trl"), "datasets": version_of("datasets"),
            "device": torch.cuda.get_device_name() if is_cuda(args) else args.device,
            "device_mem_bytes": (torch.cuda.get_device_properties(0).total_memory
                                 if is_cuda(args) else None),
            "python": sys.version.split()[0], "lengths": lengths, "longest": bool(args.longest)}
    max_seq = args.max_seq_length or max(lengths or [args.longest_step])
    if stack == "unsloth":
        meta["unsloth_tiled_mlp"] = bool(args.unsloth_tiled_mlp)
        meta["max_seq_length_at_load"] = max_seq
    emit(meta)

    try:
        if is_moe(args.model) and stack not in ("hf", "hf-offload"):
            raise ValueError(f"--model {args.model} (a mixture of experts) runs with --stack hf or hf-offload")
        if stack in ("hf", "liger", "liger-offload", "hf-offload"):
            model = build_hf_like(args, liger=stack in ("liger", "liger-offload"))
        else:
            model = build_unsloth(args, max_seq)
    except Exception as e:  # a stack that cannot be built here must not look like a crash
        traceback.print_exc()
        what = "import" if isinstance(e, ImportError) else "build"
        emit({"stack": stack, "error": f"{what} failed: {type(e).__name__}: {e}"[:2000]})
        return 3
    if stack == "unsloth":
        log(f"unsloth attention/kernels: see the Unsloth banner above; max_seq_length={max_seq}")

    if hasattr(model, "config"):
        log(f"experts implementation: {getattr(model.config, '_experts_implementation', None)}")
    offload = stack in ("liger-offload", "hf-offload")
    vocab = cfg_d["vocab_size"]

    def step(S):
        if args.fake_oom_above is not None and S > args.fake_oom_above:
            raise torch.OutOfMemoryError(f"fake OOM at S={S} (--fake-oom-above)")
        if stack == "unsloth":
            set_unsloth_max_seq(model, S)
        ids = torch.randint(0, vocab - 1, (1, S), device=args.device)
        if offload:
            with torch.autograd.graph.save_on_cpu(pin_memory=is_cuda(args)):
                out = model(input_ids=ids, labels=ids)
                out.loss.backward()
        else:
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
        loss = float(out.loss.detach())
        del out, ids
        model.zero_grad(set_to_none=True)
        return loss

    def cleanup():
        model.zero_grad(set_to_none=True)
        gc.collect()
        if is_cuda(args):
            torch.cuda.empty_cache()

    def fresh():
        gc.collect()
        if is_cuda(args):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def mem():
        if not is_cuda(args):
            return {}
        return {"peak_bytes": torch.cuda.max_memory_allocated(),
                "reserved_bytes": torch.cuda.max_memory_reserved()}

    def run(S, warm):
        """(status, seconds, loss): status 'ok' | 'oom' | 'error:...'"""
        status, dt, loss = "ok", None, None
        try:
            if warm:
                step(S)
            sync(args)
            t = time.perf_counter()
            loss = step(S)
            sync(args)
            dt = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001
            if is_oom(e):
                status = "oom"
                log(f"S={S}: out of memory: {str(e).splitlines()[0][:300]}")
            else:
                traceback.print_exc()
                status = f"error: {type(e).__name__}: {e}"[:2000]
        if status != "ok":
            cleanup()  # after the except block: the traceback no longer pins the step's tensors
        return status, dt, loss

    fitted, oom_at, broken = [], [], False
    if lengths:
        fresh()
        status, _, _ = run(lengths[0], warm=False)  # the one warm-up: kernels, compiles, allocator
        if status.startswith("error"):
            emit({"stack": stack, "S": lengths[0], "error": status[len("error: "):]})
            return 4
        log(f"first warm-up at S={lengths[0]}: {status}")
    for S in lengths:
        fresh()
        status, dt, loss = run(S, warm=args.warmup == "each")
        if status == "ok":
            fitted.append(S)
            emit({"stack": stack, "S": S, "s_per_step": round(dt, 3), "tok_s": round(S / dt, 1),
                  **mem(), "loss": round(loss, 4)})
        elif status == "oom":
            oom_at.append(S)
            emit({"stack": stack, "S": S, "oom": True})
        else:
            emit({"stack": stack, "S": S, "error": status[len("error: "):]})
            broken = True
            break

    if args.longest and not broken:
        longest_search(args, stack, run, fresh, mem, fitted, oom_at, cfg_d)
    return 0 if not broken else 4


def host_guard_reason(args, stack, S, cfg_d):
    """Why an offloading stack should not even try S (host memory), or None."""
    if args.host_guard <= 0 or stack not in ("liger-offload", "unsloth") or not is_cuda(args):
        return None
    try:
        import psutil
        avail = psutil.virtual_memory().available
    except Exception:  # noqa: BLE001
        return None
    need = S * cfg_d["hidden_size"] * 2 * cfg_d["num_hidden_layers"]
    if need > args.host_guard * avail:
        return (f"host memory: {need / 2**30:.1f} GiB of offloaded checkpoints > "
                f"{args.host_guard:.2f} x {avail / 2**30:.1f} GiB available")
    return None


def longest_search(args, stack, run, fresh, mem, fitted, oom_at, cfg_d):
    step_tok = max(1, args.longest_step)
    lo = max(fitted) if fitted else 0
    higher = [s for s in oom_at if s > lo]
    hi = min(higher) if higher else None
    tries = 0
    while tries < args.longest_tries:
        if hi is None:
            base = lo if lo > 0 else step_tok
            cand = -(-int(base * args.longest_grow) // 8192) * 8192  # round up to 8192
            if cand <= lo:
                cand = lo + 8192
        else:
            if hi - lo <= step_tok:
                break
            cand = ((lo + hi) // 2 // step_tok) * step_tok
            if cand <= lo:
                cand = lo + step_tok
            if cand >= hi:
                break
        tries += 1
        reason = host_guard_reason(args, stack, cand, cfg_d)
        if reason:
            log(f"probe S={cand}: skipped, {reason}")
            emit({"stack": stack, "S": cand, "probe": True, "fits": False, "s_per_step": None,
                  "skipped": reason})
            hi = cand
            continue
        fresh()
        status, dt, _ = run(cand, warm=False)
        if status == "ok":
            emit({"stack": stack, "S": cand, "probe": True, "fits": True,
                  "s_per_step": round(dt, 3), **mem()})
            lo = cand
        elif status == "oom":
            emit({"stack": stack, "S": cand, "probe": True, "fits": False, "s_per_step": None})
            hi = cand
        else:
            emit({"stack": stack, "S": cand, "probe": True, "error": status[len("error: "):]})
            break
    emit({"stack": stack, "longest": lo, "oom_at": hi, "resolution": step_tok, "probes": tries})


if __name__ == "__main__":
    sys.exit(main())
