#!/usr/bin/env bash
# The whole GPU check in one script: install probe from carried wheels, run the tests
# marked `cuda`, time collapse.run against its forwards (float32 and bfloat16, with the
# GPU's idle share and the host's waits), compare the two ways to the top of the spectrum,
# time probe attention's trace against its forwards, run a gpt2-xl bfloat16 command and a
# one-rank torchrun job with nccl.  At most 9.7 minutes of limits (about 6 on one H100);
# every step has its own time limit, so a slow step costs its own figures, not the others'.
#
#   benchmarks/gpu.sh --fetch-wheels [--python-version 3.12]   # here, with a package index
#   benchmarks/gpu.sh [--device cuda|cpu] [--wheels .whl] [--out gpu-check] [--python python3]
#
# --fetch-wheels downloads the wheels of benchmarks/gpu-wheels.txt for the GPU machine's
# Python (3.12 on this workplace's image) into --wheels.  --device cpu runs every step on
# the CPU at tiny sizes: the check of this script on a machine without a GPU.  Everything
# printed also goes to OUT/gpu.log; the step summary ends it.
set -u -o pipefail

DEVICE=cuda
WHEELS=.whl
OUT_DIR=${OUT:-gpu-check}
PY=python3
FETCH=0
PYVER=3.12
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --wheels) WHEELS=$2; shift 2 ;;
        --out) OUT_DIR=$2; shift 2 ;;
        --python) PY=$2; shift 2 ;;
        --fetch-wheels) FETCH=1; shift ;;
        --python-version) PYVER=$2; shift 2 ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu.sh: unknown argument '$1'; see benchmarks/gpu.sh --help" >&2; exit 2 ;;
    esac
done
case "$DEVICE" in
    cuda|cpu) ;;
    *) echo "gpu.sh: --device takes cuda or cpu, not '$DEVICE'" >&2; exit 2 ;;
esac
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT" || exit 2

if [ "$FETCH" = 1 ]; then
    mkdir -p "$WHEELS"
    exec "$PY" -m pip download -q --no-deps --only-binary=:all: \
        --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
        -d "$WHEELS" -r "$HERE/gpu-wheels.txt"
fi

mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu.log"
RUNS=$(mktemp -d)  # the commands' results and reports: only the log is kept
trap 'rm -rf "$RUNS"' EXIT
: >"$LOG"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PROBE_TEST_DEVICE=$DEVICE
SUMMARY=()

# step NAME SECONDS COMMAND...: run it with a time limit, its output in the log.
step() {
    local name=$1 limit=$2 start status
    shift 2
    echo "== $name (limit ${limit}s): $*" | tee -a "$LOG"
    start=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    status=${PIPESTATUS[0]}
    local took=$(($(date +%s) - start))
    case $status in
        0) SUMMARY+=("ok      ${took}s  $name") ;;
        124|137) SUMMARY+=("TIMEOUT ${took}s  $name") ;;
        *) SUMMARY+=("FAILED  ${took}s  $name (exit $status)") ;;
    esac
    echo "== $name: exit $status after ${took}s" | tee -a "$LOG"
    return "$status"
}

if [ "$DEVICE" = cuda ]; then
    SMALL=bert-32x128  # medians of 3, with the profile
    LARGE=bert-128x512,gpt2-32x1024,llama-8x2048  # one run each
    SPECTRUM=(--tokens 128,256 --dtype float32,bfloat16)
    XL=(gpt2-xl --sequences 32 --tokens 1024)
    RUN=(gpt2 --sequences 32 --tokens 128)
    ATTENTION=("--model bert-base-uncased --batch 32 --tokens 128"
        "--model meta-llama/Llama-3.2-1B --batch 4 --tokens 1024")
    REPEATS=3
else  # the same steps at tiny sizes
    SMALL=bert-2x16
    LARGE=gpt2-2x32
    SPECTRUM=(--tokens 16 --dtype float32 --repeats 1)
    XL=(gpt2 --set n_layer=2 --set n_embd=64 --set n_head=4 --sequences 2 --tokens 32)
    RUN=(gpt2 --set n_layer=2 --set n_embd=64 --set n_head=4 --sequences 4 --tokens 16)
    ATTENTION=("--layers 2 --batch 2 --tokens 16")
    REPEATS=1
fi

step environment 20 bash -c "
    $PY -c 'import sys, torch; print(sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nproc; true"

# Install: the wheels the machine lacks (no index), then probe itself from this checkout.
step install 50 bash -c "
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --find-links '$WHEELS' -r '$HERE/gpu-wheels.txt' &&
    $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir -e . &&
    $PY -c 'import probe, probe.cli.app, nnsight, h5netcdf, dask.array, transformers; print(\"probe imports; transformers\", transformers.__version__, \"nnsight\", nnsight.__version__)'" ||
    { printf '%s\n' "${SUMMARY[@]}" | tee -a "$LOG"; exit 1; }
BIN=$(dirname "$(command -v "$PY")")
PROBE="$BIN/probe"
[ -x "$PROBE" ] || PROBE="$($PY -c 'import sys, os; print(os.path.join(os.path.dirname(sys.executable), "probe"))')"

step "tests marked cuda" 120 "$PY" -m pytest -q -m cuda -p no:cacheprovider --tb=line -rf \
    tests/test_cuda.py tests/test_metrics.py

# With 3 repeats and the profile at every size, only three of the eight rows fit in 260 s
# on an H100: the small size gets those, the large ones one run each.
step "collapse.run vs its forwards, $SMALL" 70 "$PY" benchmarks/collapse_e2e.py \
    --device "$DEVICE" --sizes "$SMALL" --dtype float32,bfloat16 --repeats "$REPEATS" --profile

step "collapse.run vs its forwards, $LARGE" 100 "$PY" benchmarks/collapse_e2e.py \
    --device "$DEVICE" --sizes "$LARGE" --dtype float32,bfloat16 --repeats 1

step "the top of the spectrum, Krylov vs dense" 40 "$PY" benchmarks/spectrum_paths.py \
    --device "$DEVICE" "${SPECTRUM[@]}"

# The goal: probe attention's trace at most 1.3x the traced forwards it rides on.
for sizes in "${ATTENTION[@]}"; do
    # shellcheck disable=SC2086  # the sizes are words on purpose
    step "attention vs its forwards, ${sizes}" 45 "$PY" benchmarks/attention.py \
        --device "$DEVICE" --repeats "$REPEATS" $sizes
done

step "probe collapse ${XL[0]} bfloat16" 50 "$PROBE" collapse "${XL[@]}" --init random \
    --dtype bfloat16 --device "$DEVICE" --out "$RUNS/xl"

step "torchrun, one rank" 40 env NCCL_DEBUG=INFO "$PY" -m torch.distributed.run --standalone \
    --nproc-per-node 1 -m probe.cli collapse "${RUN[@]}" --init random --device "$DEVICE" \
    --out "$RUNS/torchrun"

echo "== summary ($DEVICE)" | tee -a "$LOG"
printf '%s\n' "${SUMMARY[@]}" | tee -a "$LOG"
for line in "${SUMMARY[@]}"; do
    case $line in ok*) ;; *) exit 1 ;; esac
done
