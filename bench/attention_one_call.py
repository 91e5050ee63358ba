"""A chunk's attention in one fused call or in two merged ones, on one GPU.

A chunk of C queries at position S sees the S keys before it and its own C keys causally. oomb's
fused path (kernels/torch/paged_attention.cc) runs the past as one non-causal block and the chunk
as one causal block, then merges the two by log-sum-exp in float32 (and in backward adds the two
blocks' dq). One call over the S + C keys needs the causal mask aligned at the bottom right (query
i sees keys j <= S + i). This checks, for cuDNN and flash as oomb calls them, which alignment
`is_causal` gives when there are more keys than queries (against a float64 reference), and
times both ways, forward and backward, at the given shape (Qwen3-30B-A3B's heads by default).

  python3 bench/attention_one_call.py --past 24576 --chunk 8192 --hq 32 --hkv 4
"""
import argparse
import json
import torch

from gpu_timing import add_shape_args, timed

ap = argparse.ArgumentParser()
add_shape_args(ap)
args = ap.parse_args()
dev = torch.device("cuda")
torch.manual_seed(0)
ops = torch.ops.aten


def bhsd(x):  # [B, S, H, D] -> [B, H, S, D] view
    return x.transpose(1, 2)


def cudnn_fwd(q, k, v, causal, scale):
    return ops._scaled_dot_product_cudnn_attention(bhsd(q), bhsd(k), bhsd(v), None, True, 0.0, causal, False,
                                                   scale=scale)


def cudnn_bwd(dout, q, k, v, r, causal, scale):
    return ops._scaled_dot_product_cudnn_attention_backward(bhsd(dout), bhsd(q), bhsd(k), bhsd(v), r[0], r[1], r[6],
                                                            r[7], None, r[2], r[3], q.shape[1], k.shape[1], 0.0,
                                                            causal, scale=scale)


def flash_fwd(q, k, v, causal, scale):
    return ops._flash_attention_forward(q, k, v, None, None, q.shape[1], k.shape[1], 0.0, causal, False, scale=scale)


def reference(q, k, v, scale, bottom_right):
    """float64 attention, causal aligned at the bottom right or the top left; [B, C, Hq, D]."""
    C, n, G = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]
    qd, kd, vd = (bhsd(x).double() for x in (q, k, v))
    kd, vd = kd.repeat_interleave(G, 1), vd.repeat_interleave(G, 1)
    i = torch.arange(C, device=q.device).unsqueeze(1) + (n - C if bottom_right else 0)
    blocked = torch.arange(n, device=q.device).unsqueeze(0) > i
    s = (qd @ kd.transpose(-1, -2) * scale).masked_fill(blocked, float("-inf"))
    return bhsd(torch.softmax(s, -1) @ vd)


def alignment(fwd, out_of):
    """Which alignment `is_causal` gives with 2x as many keys as queries: the smaller error."""
    q = torch.randn(1, 256, args.hq, args.dim, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 512, args.hkv, args.dim, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    try:
        o = out_of(fwd(q, k, v, True, args.dim**-0.5)).double()
    except Exception as e:  # noqa: BLE001 - report what the backend refused
        return {"error": str(e)[:300]}
    err = {a: (o - reference(q, k, v, args.dim**-0.5, a == "bottom_right")).abs().max().item()
           for a in ("bottom_right", "top_left")}
    return {"max_abs_err": err, "alignment": min(err, key=err.get)}


C, S, Hq, Hkv, D = args.chunk, args.past, args.hq, args.hkv, args.dim
scale = D**-0.5
res = {"chunk": C, "past": S, "hq": Hq, "hkv": Hkv, "dim": D, "device": torch.cuda.get_device_name(),
       "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
       "cudnn_causal": alignment(cudnn_fwd, lambda r: bhsd(r[0])),
       "flash_causal": alignment(flash_fwd, lambda r: r[0])}

q = torch.randn(1, C, Hq, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(1, S + C, Hkv, D, device=dev, dtype=torch.bfloat16)
v = torch.randn_like(k)
dout = torch.randn_like(q)
kp, vp, kc, vc = k[:, :S], v[:, :S], k[:, S:], v[:, S:]


def merged_fwd():
    """oomb's two blocks: the past non-causal, the chunk causal, merged in float32."""
    a, b = cudnn_fwd(q, kp, vp, False, scale), cudnn_fwd(q, kc, vc, True, scale)
    la, lb = a[1].reshape(1, Hq, C), b[1].reshape(1, Hq, C)
    lse = torch.logaddexp(la, lb)
    wa = torch.exp(la - lse).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lb - lse).transpose(1, 2).unsqueeze(-1)
    out = bhsd(a[0]).float() * wa + bhsd(b[0]).float() * wb
    return out.to(torch.bfloat16), lse, a, b


def merged_bwd(out, lse, a, b):
    """Each block's backward against the merged out and lse; the two dq summed in float32."""
    o4, l4 = bhsd(out), lse.unsqueeze(-1)
    ra = (o4, l4, None, None, a[6], a[7], a[6], a[7])
    ga = cudnn_bwd(dout, q, kp, vp, ra, False, scale)
    gb = cudnn_bwd(dout, q, kc, vc, ra, True, scale)
    return ga[0].float() + gb[0].float(), ga[1], gb[1]


fl = 4 * C * S * Hq * D + 2 * C * C * Hq * D  # forward FLOPs; backward 2.5x
m = merged_fwd()
t = timed(merged_fwd, args.iters)
res["merged_fwd_ms"], res["merged_fwd_tflops"] = t * 1e3, fl / t / 1e12
t = timed(lambda: merged_bwd(m[0], m[1], m[2], m[3]), args.iters)
res["merged_bwd_ms"], res["merged_bwd_tflops"] = t * 1e3, 2.5 * fl / t / 1e12
if res["cudnn_causal"].get("alignment") == "bottom_right":
    r = cudnn_fwd(q, k, v, True, scale)
    t = timed(lambda: cudnn_fwd(q, k, v, True, scale), args.iters)
    res["one_call_fwd_ms"], res["one_call_fwd_tflops"] = t * 1e3, fl / t / 1e12
    t = timed(lambda: cudnn_bwd(dout, q, k, v, r, True, scale), args.iters)
    res["one_call_bwd_ms"], res["one_call_bwd_tflops"] = t * 1e3, 2.5 * fl / t / 1e12
    res["one_call_vs_merged_out_max_abs"] = (bhsd(r[0]).float() - m[0].float()).abs().max().item()
print(json.dumps(res, indent=1))
