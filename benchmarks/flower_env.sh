#!/usr/bin/env bash
# Flower's own virtualenv for benchmarks/byom_throughput.py (issue 37): .venv-flower at the repository root,
# with torch 2.13.0 (CPU build) and flwr[simulation] 1.42.0 (Ray 2.55.1).
#
# Why a venv of its own: flwr 1.42 requires protobuf < 7, secureflhv protobuf >= 7.35; the two never share an
# interpreter, and benchmarks/flower_side.py (which imports nothing from secureflhv) runs in this one.
#
#   bash benchmarks/flower_env.sh              # idempotent: a ready venv is left as it is
#   FLOWER_VENV=/tmp/fl bash benchmarks/flower_env.sh
#
# torch is installed first, from the CPU wheel in $PIP_FIND_LINKS (default /opt/wheels), never from PyPI:
# PyPI's Linux torch is a CUDA build of several GB. Where that wheel, Python's venv, or a wheel of
# flwr[simulation] / Ray for this Python is missing, the script prints "Flower not installable here: <why>"
# and exits 0, and the benchmark says "Flower not measured".
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${FLOWER_VENV:-$ROOT/.venv-flower}
PY=${PYTHON:-python3}
FLWR=1.42.0
TORCH=2.13.0

skip() { echo "Flower not installable here: $*"; exit 0; }

ready() {  # the venv imports the pinned flwr, Ray and a CPU torch, and holds no CUDA package
    [ -x "$VENV/bin/python" ] || return 1
    "$VENV/bin/python" - "$FLWR" "$TORCH" <<'EOF' >/dev/null 2>&1 || return 1
import sys
import flwr, ray, torch
assert flwr.__version__ == sys.argv[1], flwr.__version__
assert torch.__version__ == sys.argv[2] + "+cpu", torch.__version__
from flwr.simulation import run_simulation  # noqa: F401  (Ray's simulation runtime)
EOF
    ! "$VENV/bin/pip" list 2>/dev/null | grep -qi '^nvidia'
}

if ready; then
    echo "Flower ready: $VENV (flwr $FLWR, torch $TORCH+cpu)"
    exit 0
fi

tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")' 2>/dev/null) \
    || skip "no $PY"
wheel=$(ls "${PIP_FIND_LINKS:-/opt/wheels}"/torch-"$TORCH"+cpu-"$tag"-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] \
    || skip "no CPU wheel of torch $TORCH for $tag in ${PIP_FIND_LINKS:-/opt/wheels} (PyPI's is a CUDA build)"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV" || skip "$PY -m venv $VENV failed"
"$VENV/bin/pip" install -q "$wheel" || skip "pip could not install $wheel"
"$VENV/bin/pip" install -q "flwr[simulation]==$FLWR" \
    || skip "pip could not install flwr[simulation]==$FLWR (no Ray wheel for $tag on this platform?)"
if "$VENV/bin/pip" list 2>/dev/null | grep -qi '^nvidia'; then
    cuda=$("$VENV/bin/pip" list 2>/dev/null | grep -i '^nvidia' | head -n 1)
    skip "a CUDA package came into $VENV ($cuda); remove it and run again"
fi
ready || skip "$VENV does not import flwr $FLWR, Ray and torch $TORCH+cpu after the install"
ray=$("$VENV/bin/python" -c 'import ray; print(ray.__version__)')
echo "Flower ready: $VENV (flwr $FLWR, ray $ray, torch $TORCH+cpu)"
