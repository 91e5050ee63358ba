"""What the attention micro-benchmarks share (attention_backends.py, sparse_attention_parts.py):
the attention shape's arguments (Qwen2.5-7B's heads by default), the median time of a GPU call,
and the bf16 matmul rate their TFLOP/s are read against."""
import torch


def add_shape_args(ap):
    ap.add_argument("--past", type=int, default=131072)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--hq", type=int, default=28)
    ap.add_argument("--hkv", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=10)


def timed(fn, iters):
    """Median seconds of fn() on the GPU over `iters` runs, after two warm-up runs."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def matmul_tflops(dev):
    """The rate of an 8192^3 bf16 matrix product on `dev`."""
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    return 2 * 8192**3 / timed(lambda: a @ b, 20) / 1e12
