#!/usr/bin/env bash
# Fetch the wheels that bench/peers/peers.py needs on the GPU machine (which has no package index)
# into the repo-root folder .whl/ (git-ignored), for Python 3.12 / x86-64 Linux.
#
# The GPU image already has torch 2.11.0+cu130, transformers 5.17.0, peft, accelerate, triton 3.6.0,
# pandas, pyarrow, xxhash, torchvision, httpx, ... (see README.md). Only what is missing is fetched.
#
# unsloth's PyPI wheel is ~28 MiB, mostly its web UI ("studio/") and CLI ("unsloth_cli/"), which
# training never imports. To stay inside the size budget for .whl/, this script repacks it keeping
# only the `unsloth` package and its dist-info (RECORD lines of the kept files are kept verbatim,
# the console-script entry point that names unsloth_cli is dropped). The file name is unchanged.
#
# Usage (from anywhere):  bash bench/peers/fetch_wheels.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WHL="$ROOT/.whl"
mkdir -p "$WHL"

# name==version; the newest versions compatible with torch 2.11 / transformers 5.17 (read from each
# wheel's Requires-Dist when this list was made).
WHEELS=(
  liger-kernel==0.8.5          # needs torch>=2.1.2, triton>=2.3.1; transformers>=5 checked at import
  unsloth==2026.10.9           # pins transformers<=5.17.0, torch<2.15; repacked below
  unsloth-zoo==2026.10.9
  trl==1.15.0                  # unsloth needs trl<=1.15.0; trl needs datasets>=4.7
  datasets==4.8.5              # unsloth needs datasets<5 (not 4.0.*, 4.1.0, 4.4.*, 4.5.0)
  dill==0.4.1                  # datasets: dill<0.4.2
  multiprocess==0.70.19        # datasets: multiprocess<0.70.20
  cut-cross-entropy==25.1.1    # listed by unsloth-zoo; unsloth-zoo itself turns it off on torch>=2.8
  bitsandbytes==0.50.2         # unsloth's Qwen2 loader imports bitsandbytes.nn on a GPU (43 MB)
)

PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for w in "${WHEELS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLAT[@]}" -d "$WHL" "$w"
done

# Repack unsloth: keep unsloth/ and unsloth-*.dist-info/ only.
python3 - "$WHL" <<'EOF'
import glob, os, sys, zipfile
whl_dir = sys.argv[1]
for path in glob.glob(os.path.join(whl_dir, "unsloth-*-py3-none-any.whl")):
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        if not any(n.startswith(("studio/", "unsloth_cli/")) for n in names):
            print(f"{os.path.basename(path)}: already slim")
            continue
        keep = [n for n in names
                if n.startswith("unsloth/") or (".dist-info/" in n and n.split("/")[0].startswith("unsloth-"))]
        keep = [n for n in keep if not n.endswith(".dist-info/entry_points.txt")]
        record_name = next(n for n in keep if n.endswith(".dist-info/RECORD"))
        kept = set(keep)
        record = z.read(record_name).decode().splitlines()
        record = [line for line in record if line and line.split(",")[0] in kept]
        tmp = path + ".tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
            for n in keep:
                if n == record_name:
                    continue
                out.writestr(z.getinfo(n), z.read(n), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            out.writestr(record_name, "\n".join(record) + "\n")
    os.replace(tmp, path)
    print(f"{os.path.basename(path)}: kept {len(keep)} of {len(names)} files, "
          f"{os.path.getsize(path) / 2**20:.2f} MiB")
EOF

ls -l "$WHL"
du -cb "$WHL"/*.whl | tail -1 | awk '{printf "total %.2f MiB\n", $1 / 1048576}'
