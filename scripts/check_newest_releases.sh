#!/usr/bin/env bash
# The newest-release check (ctest label `newest`; `OOMB_CHECK_NEWEST=1 scripts/test.sh` includes
# it, the default run does not): the reference-parity and adapter-loading tests against the
# newest releases of transformers and PEFT on PyPI, apart from the pinned stack that setup, CI
# and the demo use (scripts/python-requirements.lock).
#
#   scripts/check_newest_releases.sh TRANSFORMER_TEST_BINARY
#
# In an environment of its own (OOMB_NEWEST_VENV, default ~/.cache/oomb/newest-venv): the lock,
# then transformers and PEFT upgraded to their newest releases (and whatever those need); the
# tiny models and their transformers + PEFT references remade with them (OOMB_NEWEST_DATA,
# default ~/.cache/oomb/newest-data/tiny, remade when the versions change); then
# TinyModelParityTest (logits, loss and LoRA gradients against transformers + PEFT, and every
# adapter oomb saves loaded back in PEFT) over every tiny model. Prints the versions it checked
# and, on failure, each failing model and what differed (GoogleTest's messages); exits non-zero
# then. Needs PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
test_bin="${1:?usage: scripts/check_newest_releases.sh TRANSFORMER_TEST_BINARY}"
venv="${OOMB_NEWEST_VENV:-$HOME/.cache/oomb/newest-venv}"
data="${OOMB_NEWEST_DATA:-$HOME/.cache/oomb/newest-data}"
log() { printf '[newest] %s\n' "$*" >&2; }

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q --require-hashes -r scripts/python-requirements.lock
"$venv/bin/python" -m pip install -q --upgrade transformers peft
"$venv/bin/python" -m pip check >&2
versions=$("$venv/bin/python" -c 'import transformers, peft, torch; print(f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}")')
pinned=$(grep -E '^(transformers|peft)==' scripts/python-requirements.lock | sed 's/ .*//' | tr '\n' ' ')
log "checking $versions (pinned: $pinned)"

stamp="$data/tiny/.versions"
if [ "$(cat "$stamp" 2>/dev/null)" != "$versions" ]; then
  log "making the tiny models with $versions in $data/tiny"
  mkdir -p "$data"
  OMP_NUM_THREADS=1 "$venv/bin/python" tests/python/make_tiny_models.py --out "$data/tiny" --force
  echo "$versions" >"$stamp"
fi

rc=0
OOMB_DATA_DIR="$data" OOMB_VENV="$venv" "$test_bin" --gtest_filter='Tiny/TinyModelParityTest.*:TransformerTest.TinyModelsArePresent' ||
  rc=$?
if ((rc == 0)); then
  echo "newest_releases: ok: $versions"
else
  echo "newest_releases: FAILED with $versions (pinned: $pinned): the failing tests above name each model and what differed"
fi
exit "$rc"
