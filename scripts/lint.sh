#!/usr/bin/env bash
# Project lints, run by the test command (scripts/test.sh) and as the ctest test `lint`:
#   1. clang-format (.clang-format, Google base): every C++/CUDA source is formatted.
#   2. Every CUDA kernel launch (`<<<...>>>`) is followed, within its next two statements, by an
#      error check: cudaGetLastError(), C10_CUDA_KERNEL_LAUNCH_CHECK() or OOMB_CUDA_LAUNCH_CHECK().
#   3. No source (C++, CUDA, Python, shell, proto, CMake; not bench/results/ or tests/data/) cites a
#      Markdown file the repository does not have: a name ending in .md must exist relative to
#      the root, docs/ or the citing file's directory (scripts/lint_doc_refs.py says what counts).
# Usage: scripts/lint.sh [--fix]   (--fix reformats in place instead of failing)
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t sources < <(git ls-files -co --exclude-standard -- '*.h' '*.cc' '*.cu' '*.cuh' | grep -v '^tests/data/' || true)
status=0
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${sources[@]}"
else
  if ! clang-format --dry-run --Werror "${sources[@]}" 2>/tmp/oomb-clang-format.log; then
    head -40 /tmp/oomb-clang-format.log >&2
    echo "lint: clang-format: sources need formatting (run scripts/lint.sh --fix)" >&2
    status=1
  fi
fi
python3 scripts/lint_cuda_launch.py "${sources[@]}" || status=1
python3 scripts/lint_doc_refs.py || status=1
[ $status -eq 0 ] && echo "lint: ok (${#sources[@]} files)" >&2
exit $status
