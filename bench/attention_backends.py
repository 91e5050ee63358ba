"""Attention kernel rates on one GPU: PyTorch's flash attention vs cuDNN's, as oomb calls them.

The shape is a chunk of C queries against a past of S keys (Qwen2.5-7B heads: 28 query heads,
4 KV heads, head_dim 128, bf16): the past block is non-causal, the chunk's own block causal.
FLOPs: forward 4*C*S*Hq*D (past) + 2*C*C*Hq*D (causal chunk); backward 2.5x forward (the
FlashAttention convention: 5 matmuls against 2). Also checks cuDNN against flash: outputs,
log-sum-exp, and the backward given an externally merged out/lse (what oomb's block merge does).

  python3 bench/attention_backends.py --past 131072 --chunk 4096 > attention.json
"""
import argparse
import json
import torch

from gpu_timing import add_shape_args, matmul_tflops, timed

ap = argparse.ArgumentParser()
add_shape_args(ap)
args = ap.parse_args()
dev = torch.device("cuda")
torch.manual_seed(0)


C, S, Hq, Hkv, D = args.chunk, args.past, args.hq, args.hkv, args.dim
scale = D**-0.5
q = torch.randn(1, C, Hq, D, device=dev, dtype=torch.bfloat16)  # flash layout [B, S, H, D]
k = torch.randn(1, S, Hkv, D, device=dev, dtype=torch.bfloat16)
v = torch.randn(1, S, Hkv, D, device=dev, dtype=torch.bfloat16)
kc = torch.randn(1, C, Hkv, D, device=dev, dtype=torch.bfloat16)
vc = torch.randn(1, C, Hkv, D, device=dev, dtype=torch.bfloat16)
dout = torch.randn(1, C, Hq, D, device=dev, dtype=torch.bfloat16)

ops = torch.ops.aten


def flash_fwd(k_, v_, causal):
    return ops._flash_attention_forward(q, k_, v_, None, None, C, k_.shape[1], 0.0, causal, False, scale=scale)


def flash_bwd(k_, v_, out, lse, causal, rng, unused):
    return ops._flash_attention_backward(dout, q, k_, v_, out, lse, None, None, C, k_.shape[1], 0.0, causal, rng,
                                         unused, scale=scale)


def bhsd(x):  # [B, S, H, D] -> [B, H, S, D] view (cuDNN takes strided inputs)
    return x.transpose(1, 2)


def expand(x):  # GQA: repeat each KV head for its G query heads
    return x.repeat_interleave(Hq // Hkv, dim=2)


def cudnn_fwd(k_, v_, causal):
    return ops._scaled_dot_product_cudnn_attention(bhsd(q), bhsd(k_), bhsd(v_), None, True, 0.0, causal, False,
                                                   scale=scale)


def cudnn_bwd(k_, v_, out, lse, causal, r):
    return ops._scaled_dot_product_cudnn_attention_backward(bhsd(dout), bhsd(q), bhsd(k_), bhsd(v_), out, lse, r[6],
                                                            r[7], None, r[2], r[3], C, k_.shape[1], 0.0, causal,
                                                            scale=scale)


res = {"chunk": C, "past": S, "hq": Hq, "hkv": Hkv, "dim": D, "device": torch.cuda.get_device_name(),
       "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
res["matmul_bf16_tflops"] = matmul_tflops(dev)
fl_past = 4 * C * S * Hq * D
fl_chunk = 2 * C * C * Hq * D

# Flash (GQA native).
fo = flash_fwd(k, v, False)
t = timed(lambda: flash_fwd(k, v, False), args.iters)
res["flash_fwd_past_tflops"] = fl_past / t / 1e12
tb = timed(lambda: flash_bwd(k, v, fo[0], fo[1], False, fo[2], fo[3]), args.iters)
res["flash_bwd_past_tflops"] = 2.5 * fl_past / tb / 1e12
fc = flash_fwd(kc, vc, True)
res["flash_fwd_chunk_tflops"] = fl_chunk / timed(lambda: flash_fwd(kc, vc, True), args.iters) / 1e12
res["flash_bwd_chunk_tflops"] = 2.5 * fl_chunk / timed(
    lambda: flash_bwd(kc, vc, fc[0], fc[1], True, fc[2], fc[3]), args.iters) / 1e12

# cuDNN: GQA native if it takes it, else with expanded heads (the expansion timed apart).
for name, kk, vv in (("gqa", k, v), ("expanded", None, None)):
    try:
        if kk is None:
            kk, vv = expand(k), expand(v)
            res["expand_ms"] = timed(lambda: (expand(k), expand(v)), args.iters) * 1e3
        r = cudnn_fwd(kk, vv, False)
        t = timed(lambda: cudnn_fwd(kk, vv, False), args.iters)
        res[f"cudnn_{name}_fwd_past_tflops"] = fl_past / t / 1e12
        tb = timed(lambda: cudnn_bwd(kk, vv, r[0], r[1], False, r), args.iters)
        res[f"cudnn_{name}_bwd_past_tflops"] = 2.5 * fl_past / tb / 1e12
        # Agreement with flash: output, lse, and gradients.
        res[f"cudnn_{name}_lse_shape"] = list(r[1].shape)
        res[f"cudnn_{name}_out_maxdiff"] = (bhsd(r[0]).float() - fo[0].float()).abs().max().item()
        res[f"cudnn_{name}_lse_maxdiff"] = (r[1].reshape(fo[1].shape).float() - fo[1].float()).abs().max().item()
        gf = flash_bwd(k, v, fo[0], fo[1], False, fo[2], fo[3])
        gc = cudnn_bwd(kk, vv, r[0], r[1], False, r)
        res[f"cudnn_{name}_dq_rel"] = ((bhsd(gc[0]).float() - gf[0].float()).norm() / gf[0].float().norm()).item()
        dk = bhsd(gc[1]).float()
        if name == "expanded":
            dk = dk.reshape(1, S, Hkv, Hq // Hkv, D).sum(3)
        res[f"cudnn_{name}_dk_rel"] = ((dk - gf[1].float()).norm() / gf[1].float().norm()).item()
        rc = cudnn_fwd(expand(kc) if name == "expanded" else kc, expand(vc) if name == "expanded" else vc, True)
        kcc, vcc = (expand(kc), expand(vc)) if name == "expanded" else (kc, vc)
        res[f"cudnn_{name}_fwd_chunk_tflops"] = fl_chunk / timed(lambda: cudnn_fwd(kcc, vcc, True), args.iters) / 1e12
        res[f"cudnn_{name}_bwd_chunk_tflops"] = 2.5 * fl_chunk / timed(
            lambda: cudnn_bwd(kcc, vcc, rc[0], rc[1], True, rc), args.iters) / 1e12
    except Exception as e:  # noqa: BLE001 - report what the backend refused
        res[f"cudnn_{name}_error"] = str(e)[:400]

print(json.dumps(res, indent=1))
