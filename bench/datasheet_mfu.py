#!/usr/bin/env python3
"""Restates bench_train's results as MFU over the device's datasheet peak.

bench_train prints one JSON object a line: first a line describing the run (with
"matmul_bf16_tflops", the bf16 matmul rate the process measured at its start), then one line per
length with "S" (tokens), "s_per_step" and "model_tflops" (the model FLOPs of the step over its
seconds, for the whole tensor-parallel group: 6 N T + 12 d P, N the active parameters, d the
query width, P the causal query-key pairs attended, summed over layers; see docs/PERFORMANCE.md,
"Common setup"). For each length line this prints S, s_per_step, model_tflops and

    datasheet MFU = model_tflops / (peak TFLOP/s x GPUs)

the definition the daemon's /metrics and docs/PERFORMANCE.md use (the datasheet dense bf16 peak:
989.4 TFLOP/s for H100 SXM and H200, worker/metrics/flops.cc). Beside it, where the lines have
them, the "mfu" the line itself carries (older runs divided by the measured matmul rate instead,
and so read higher) and the matmul rate of the run's first line, labelled as what they are.

Lines that are not JSON objects, or carry no "S" and "model_tflops", are skipped, so a whole
log (bench.log with its test output) can be given. Reads the FILEs in order, or standard input.
A run with tensor parallelism (its first line has "tensor": t) needs --gpus t, and a device other
than an H100 SXM or H200 its own --peak-tflops; a note on standard error says so when the first
line ("tensor", "peak_bf16_tflops" in newer runs) differs from the arguments.

Usage: bench/datasheet_mfu.py [--peak-tflops 989.4] [--gpus 1] [FILE...]
Example: bench/datasheet_mfu.py --gpus 4 qwen25_7b_tp4.jsonl
"""
import argparse
import json
import sys


def objects(stream):
    """The JSON objects of a stream, one a line; text before a line's first `{` is ignored."""
    for line in stream:
        start = line.find("{")
        if start < 0:
            continue
        try:
            obj = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(obj, dict):
            yield obj


def report(name, stream, peak, gpus, out):
    matmul = None
    tensor = None
    for obj in objects(stream):
        if "matmul_bf16_tflops" in obj and "S" not in obj:
            matmul = obj["matmul_bf16_tflops"]
            tensor = obj.get("tensor")
            if tensor and tensor != gpus:
                print(f"datasheet_mfu: {name}: the run's first line says tensor {tensor}, "
                      f"but --gpus is {gpus}", file=sys.stderr)
            line_peak = obj.get("peak_bf16_tflops")
            if isinstance(line_peak, (int, float)) and line_peak > 0 and abs(line_peak - peak) > 0.05:
                print(f"datasheet_mfu: {name}: the run's first line gives the device's peak as "
                      f"{line_peak} TFLOP/s, but --peak-tflops is {peak}", file=sys.stderr)
            continue
        if "S" not in obj or "model_tflops" not in obj:
            continue
        tflops = obj["model_tflops"]
        mfu = tflops / (peak * gpus)
        fields = [name, str(obj["S"]), f"{obj.get('s_per_step', float('nan')):.4g}", f"{tflops:.1f}",
                  f"{100 * mfu:.1f}%"]
        old = obj.get("mfu")
        fields.append(f"{100 * old:.1f}%" if isinstance(old, (int, float)) else "-")
        fields.append(f"{matmul:.0f}" if isinstance(matmul, (int, float)) else "-")
        print("\t".join(fields), file=out)


def main(argv):
    parser = argparse.ArgumentParser(description="bench_train's JSON lines as MFU over the datasheet peak")
    parser.add_argument("--peak-tflops", type=float, default=989.4,
                        help="the device's datasheet dense bf16 peak, TFLOP/s (default 989.4: H100 SXM, H200)")
    parser.add_argument("--gpus", type=int, default=1,
                        help="GPUs in the tensor-parallel group the line's model_tflops covers (default 1)")
    parser.add_argument("files", nargs="*", help="bench_train output; standard input without any")
    args = parser.parse_args(argv)
    if args.peak_tflops <= 0 or args.gpus < 1:
        parser.error("--peak-tflops must be positive and --gpus at least 1")
    out = sys.stdout
    print("file\tS\ts_per_step\tmodel_tflops\tmfu_datasheet\tmfu_in_line\tmatmul_bf16_tflops_measured",
          file=out)
    if not args.files:
        report("-", sys.stdin, args.peak_tflops, args.gpus, out)
    for path in args.files:
        with open(path, encoding="utf-8", errors="replace") as f:
            report(path, f, args.peak_tflops, args.gpus, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
