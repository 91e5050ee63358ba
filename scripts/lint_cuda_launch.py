#!/usr/bin/env python3
"""Fails when a CUDA kernel launch is not followed by an error check.

A launch `kernel<<<grid, block, smem, stream>>>(args);` must be followed, within its next two
statements, by cudaGetLastError(), C10_CUDA_KERNEL_LAUNCH_CHECK() or OOMB_CUDA_LAUNCH_CHECK().
Files not ending in .cu/.cuh are ignored unless --all is given.
Usage: lint_cuda_launch.py [--all] FILE...
"""
import re
import sys

LAUNCH = re.compile(r"<<<[^;]*?>>>\s*\([^;]*?\);", re.S)
CHECK = re.compile(r"cudaGetLastError\s*\(|C10_CUDA_KERNEL_LAUNCH_CHECK|OOMB_CUDA_LAUNCH_CHECK")


def main(argv):
    check_all = "--all" in argv
    bad = []
    for path in (a for a in argv if a != "--all"):
        if not check_all and not path.endswith((".cu", ".cuh")):
            continue
        text = open(path, encoding="utf-8").read()
        for m in LAUNCH.finditer(text):
            following = ";".join(text[m.end():].split(";")[:2])
            if not CHECK.search(following):
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{path}:{line}: kernel launch without an error check after it")
    for b in bad:
        print("lint:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
