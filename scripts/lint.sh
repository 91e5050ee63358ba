#!/usr/bin/env bash
# Project lints, run by the test command (scripts/test.sh) and as the ctest test `lint`; each
# script's header says exactly what counts (docs/CONVENTIONS.md §6.12):
#   1. clang-format (.clang-format, Google base): every C++/CUDA source is formatted.
#   2. Every CUDA kernel launch (`<<<...>>>`) is followed, within its next two statements, by an
#      error check: cudaGetLastError(), C10_CUDA_KERNEL_LAUNCH_CHECK() or OOMB_CUDA_LAUNCH_CHECK().
#   3. No source (C++, CUDA, Python, shell, proto, CMake; not bench/results/ or tests/data/) cites a
#      file the repository does not have: a name ending in .md must exist relative to the root,
#      docs/ or the citing file's directory; a path that starts with a top-level folder and ends
#      in a source extension (worker/job/executor.h, scripts/setup.sh) must exist relative to the
#      root (scripts/lint_doc_refs.py).
#   4. No C++/CUDA function outside bench/ and tests/data/ is over 80 lines, counted from the line
#      of its name to its closing brace, as the PyPI package lizard finds them
#      (scripts/lint_function_length.py). It runs with the virtual environment's Python
#      ($OOMB_VENV, default ~/.cache/oomb/venv), where scripts/setup.sh installs lizard; without
#      it the lint fails.
#   5. README.md is at most 250 lines (scripts/lint_readme.py): detail goes in docs/.
#   6. No source (as in 3) records history: no ISO date (YYYY-MM-DD, not part of a timestamp) and
#      no path into bench/results naming a run; measurements go in bench/results/<run>/README.md
#      and docs/PERFORMANCE.md (scripts/lint_measurements.py).
#   7. The Python of client/python, scripts/ and tests/python passes `ruff check` with the rules of
#      ruff.toml at the root (pycodestyle E/W at 120 columns, pyflakes F, import order I,
#      flake8-bugbear B); ruff is pinned in scripts/python-requirements.lock and runs from the
#      virtual environment, without which the lint fails, as for 4. With --fix, what ruff can fix
#      safely is fixed in place.
#   8. No header of worker/job/ includes LibTorch (<torch/...>, <ATen/...>, <c10/...>): job/'s
#      headers are what server/ includes (worker/CMakeLists.txt, docs/CONVENTIONS.md §1).
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
venv_python="${OOMB_VENV:-$HOME/.cache/oomb/venv}/bin/python"
if [ -x "$venv_python" ]; then
  "$venv_python" scripts/lint_function_length.py || status=1
else
  echo "lint: function length: no Python at $venv_python, whose environment holds lizard:" \
    "run scripts/setup.sh" >&2
  status=1
fi
venv_ruff="${OOMB_VENV:-$HOME/.cache/oomb/venv}/bin/ruff"
if [ -x "$venv_ruff" ]; then
  ruff_fix=()
  [ "${1:-}" = "--fix" ] && ruff_fix=(--fix)
  "$venv_ruff" check --quiet "${ruff_fix[@]}" client/python scripts tests/python ||
    { echo "lint: ruff: Python sources break ruff.toml's rules (above)" >&2; status=1; }
else
  echo "lint: python: no ruff at $venv_ruff: run scripts/setup.sh" >&2
  status=1
fi
if torch_in_job=$(grep -nE '^#include <(torch|ATen|c10)/' worker/job/*.h); then
  echo "$torch_in_job" >&2
  echo "lint: worker/job/'s headers must be torch-free (move what needs LibTorch into the .cc)" >&2
  status=1
fi
python3 scripts/lint_readme.py || status=1
python3 scripts/lint_measurements.py || status=1
[ $status -eq 0 ] && echo "lint: ok (${#sources[@]} files)" >&2
exit $status
