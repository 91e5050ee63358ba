"""Cross-checks oomb's safetensors writer against the Python `safetensors` package.

Usage: safetensors_roundtrip.py IN OUT

Loads IN (written by oomb's WriteSafetensors in safetensors_test.cc), checks that every tensor
holds arange(numel) cast to its dtype (bool: arange % 2), then writes the same tensors and
metadata to OUT with safetensors.torch.save_file. The C++ test then compares IN and OUT byte by
byte and opens OUT with its own reader. Exits non-zero with a message on any mismatch.
"""
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    tensors = load_file(src)
    with safe_open(src, framework="pt") as f:
        metadata = f.metadata()
    for name, t in tensors.items():
        ref = torch.arange(t.numel(), dtype=torch.float64)
        ref = (ref.to(torch.int64) % 2).to(torch.bool) if t.dtype == torch.bool else ref.to(t.dtype)
        if not torch.equal(t.reshape(-1), ref):
            print(f"{src}: tensor {name!r} ({t.dtype}) differs from arange", file=sys.stderr)
            return 1
    save_file(tensors, dst, metadata=metadata)
    print(f"ok {len(tensors)} tensors, metadata {metadata}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
