"""The parts of one chunk's sparse attention in one layer, timed apart on one GPU.

Mirrors what `kernels/torch/sparse_attention.cc` and `SequenceKvCache` (worker/kv/page_pool.cc)
do per chunk and layer when every page is on the GPU, with the same ATen calls:
  - gather: the selected pages' K and V from the pool arena, index_select + masked_fill;
  - past fwd / bwd: cuDNN's fused kernel over the batch of query tiles, each tile of T rows
    against its own n_sel pages (GQA in the kernel);
  - chunk fwd / bwd: the chunk against itself, causal;
  - merge: the log-sum-exp merge of the two blocks;
  - grad (bf16 pages): the union of selected gradient pages read into float32 images, the
    tiles' dK / dV index_add_-ed in, stored back in bf16 (the path of --kv-grad-dtype bfloat16);
  - grad (f32 pages): the same added straight into a float32 arena.
"stacked": the past with each KV head's G query heads stacked as G * T rows of one head, as
sparse_attention.cc runs it. Also "ideal past": the same FLOPs as one query block against one shared key block (what the
kernel does when nothing is tiled). FLOPs as in attention_backends.py: forward 4*C*K*Hq*D,
backward 2.5x. Tile rows T other than the page size show what coarser selection would buy.

  python3 bench/sparse_attention_parts.py --past 131072 --tiles 128 256 512 > parts.json
"""
import argparse
import json
import torch

from gpu_timing import add_shape_args, matmul_tflops, timed

ap = argparse.ArgumentParser()
add_shape_args(ap)
ap.add_argument("--page", type=int, default=128)
ap.add_argument("--budget", type=int, default=64)
ap.add_argument("--tiles", type=int, nargs="+", default=[128, 256, 512])
args = ap.parse_args()
dev = torch.device("cuda")
torch.manual_seed(0)
ops = torch.ops.aten
bf16 = torch.bfloat16


def timed_ms(fn):
    return timed(fn, args.iters) * 1e3


C, S, P, Hq, Hkv, D, n_sel = args.chunk, args.past, args.page, args.hq, args.hkv, args.dim, args.budget
scale = D**-0.5
n_pages = S // P
keys_past = n_sel * P
res = {"chunk": C, "past": S, "page": P, "budget": n_sel, "hq": Hq, "hkv": Hkv, "dim": D,
       "device": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
       "matmul_bf16_tflops": matmul_tflops(dev)}


def cudnn_fwd(q, k, v, causal):  # q [B, T, H, D], k/v [B, Hkv, n, D], as FusedBlockForward
    return ops._scaled_dot_product_cudnn_attention(q.transpose(1, 2), k, v, None, True, 0.0, causal, False,
                                                   scale=scale)


def cudnn_bwd(dout, q, k, v, r, causal):
    return ops._scaled_dot_product_cudnn_attention_backward(dout.transpose(1, 2), q.transpose(1, 2), k, v, r[0],
                                                            r[1], r[6], r[7], None, None, None, q.shape[1],
                                                            k.shape[2], 0.0, causal, scale=scale)


def fwd_bwd(q, k, v, causal, flops, key):
    dout = torch.randn_like(q)
    r = cudnn_fwd(q, k, v, causal)
    tf = timed_ms(lambda: cudnn_fwd(q, k, v, causal))
    tb = timed_ms(lambda: cudnn_bwd(dout, q, k, v, r, causal))
    res[key] = {"fwd_ms": tf, "bwd_ms": tb, "fwd_tflops": flops / tf / 1e9, "bwd_tflops": 2.5 * flops / tb / 1e9}


# The pool: this layer's pages in an arena [slots, 2, Hkv, P, D] (the pages scattered over the slots).
arena = torch.randn(n_pages * 2, 2, Hkv, P, D, device=dev, dtype=bf16)
slots = torch.randperm(n_pages * 2, device=dev)[:n_pages]
grad_arena_bf16 = torch.zeros(n_pages * 2, 2, Hkv, P, D, device=dev, dtype=bf16)
grad_arena_f32 = torch.zeros(n_pages * 2, 2, Hkv, P, D, device=dev, dtype=torch.float32)

q = torch.randn(C, Hq, D, device=dev, dtype=bf16)
kc = torch.randn(1, Hkv, C, D, device=dev, dtype=bf16)
vc = torch.randn(1, Hkv, C, D, device=dev, dtype=bf16)
fwd_bwd(q.unsqueeze(0), kc, vc, True, 2 * C * C * Hq * D, "chunk_causal")
kk = torch.randn(1, Hkv, keys_past, D, device=dev, dtype=bf16)
fwd_bwd(q.unsqueeze(0), kk, kk.clone(), False, 4 * C * keys_past * Hq * D, "ideal_past")
del kk

for T in args.tiles:
    n_tiles = C // T
    # A selection like SelectPages': sink, local, the rest random; sorted, distinct per (tile, head).
    sel = torch.stack([torch.randperm(n_pages - 5, device=dev)[:n_sel - 5] + 1 for _ in range(n_tiles * Hkv)])
    sel = torch.cat([torch.zeros(n_tiles * Hkv, 1, device=dev, dtype=torch.long), sel,
                     torch.arange(n_pages - 4, n_pages, device=dev).expand(n_tiles * Hkv, 4)], 1)
    sel = sel.sort(1).values.view(n_tiles, Hkv, n_sel)
    rows = arena.view(-1, P, D)

    def arena_rows(values, slots_=slots, sel_=sel):
        slot = slots_.index_select(0, sel_.clamp_min(0).flatten()).view(sel_.shape)
        return slot * (2 * Hkv) + (Hkv if values else 0) + torch.arange(Hkv, device=dev).view(1, -1, 1)

    none = (sel < 0).view(n_tiles, Hkv, n_sel, 1, 1)

    def gather():
        return [rows.index_select(0, arena_rows(vals).flatten()).view(n_tiles, Hkv, n_sel, P, D)
                .masked_fill_(none, 0).view(n_tiles, Hkv, keys_past, D) for vals in (False, True)]

    part = {"gather_ms": timed_ms(gather)}
    kp, vp = gather()
    qt = q.view(n_tiles, T, Hq, D)
    fwd_bwd(qt, kp, vp, False, 4 * C * keys_past * Hq * D, f"past_T{T}")
    part.update(res.pop(f"past_T{T}"))
    # The G query heads of each KV head stacked as G * T rows (sparse_attention.cc, StackGroups).
    G = Hq // Hkv
    qs = qt.view(n_tiles, T, Hkv, G, D).permute(0, 3, 1, 2, 4).reshape(n_tiles, G * T, Hkv, D)
    fwd_bwd(qs, kp, vp, False, 4 * C * keys_past * Hq * D, f"past_T{T}_stacked")
    part["stacked"] = res.pop(f"past_T{T}_stacked")
    lse_a = torch.randn(1, Hq, C, device=dev)
    out_a = torch.randn(1, C, Hq, D, device=dev, dtype=bf16)

    def merge():
        merged = torch.logaddexp(lse_a, lse_a)
        w = torch.exp(lse_a - merged).transpose(1, 2).unsqueeze(-1)
        return out_a.float() * w + out_a.float() * w, merged

    part["merge_ms"] = timed_ms(merge)
    dkp = torch.randn(n_tiles, Hkv, keys_past, D, device=dev, dtype=bf16)
    keep = (sel >= 0).flatten().nonzero().squeeze(1)
    union = sel.flatten().unique()
    part["union_pages"] = union.numel()

    def grad_bf16():
        index = torch.zeros(n_pages, dtype=torch.long, device=dev)
        index[union] = torch.arange(union.numel(), device=dev)
        images = grad_arena_bf16.index_select(0, slots[union]).float()
        img_rows = images.view(-1, P, D)
        for vals in (False, True):
            img_rows.index_add_(0, arena_rows(vals, index).flatten().index_select(0, keep),
                                dkp.reshape(-1, P, D).index_select(0, keep).float())
        grad_arena_bf16.index_copy_(0, slots[union], images.to(bf16))

    def grad_f32():
        g_rows = grad_arena_f32.view(-1, P, D)
        for vals in (False, True):
            g_rows.index_add_(0, arena_rows(vals).flatten().index_select(0, keep),
                              dkp.reshape(-1, P, D).index_select(0, keep).float())

    part["grad_bf16_pages_ms"] = timed_ms(grad_bf16)
    part["grad_f32_pages_ms"] = timed_ms(grad_f32)
    res[f"tile_{T}"] = part
    del kp, vp, dkp

print(json.dumps(res, indent=1))
