#!/usr/bin/env bash
# The benchmarks that need an accelerator, in one command on a CUDA machine, each under
# its own time limit so that the whole run ends within 10 minutes on one GPU:
# - generation: the transformers engine against transformers' generate (static batches,
#   sorted and not, and its continuous batching), on the uniform, mixed, shared-prompt and
#   JSON-schema workloads; the vLLM engine and vLLM's LLM.generate beside them where the
#   vllm package is importable;
# - precision: bf16 and fp16 against fp32, embeddings and chat;
# - the batch pipeline and the realtime lane under batch load, end to end through a
#   stack (these need the installed project with its packaged models, so they are
#   skipped when the models are twins).
# Each writes its JSON (bench/common.py report); this script copies them into OUT_DIR.
#
#   bash bench/gpu.sh [OUT_DIR]        # default: $OUT, else bench/results/gpu
#
# Needs the project's dependencies (make .venv/.installed, or PYTHON naming an
# interpreter that has them) with a CUDA build of torch. Where the packaged model weights
# are not installed, INFERQ_BENCH_TWINS names a folder of random-weight twins
# (python -m bench.twins): the figures are then speeds only.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-bench/results/gpu}}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT_DIR"

"$PY" - <<'PYEOF' | tee "$OUT_DIR/device.txt"
import importlib.util
import sys

import torch
import transformers

if not torch.cuda.is_available():
    sys.exit("bench/gpu.sh: no CUDA device is visible to torch "
             f"({torch.__version__}); run it on a GPU machine")
p = torch.cuda.get_device_properties(0)
print(f"{p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, transformers {transformers.__version__}, "
      f"{'vllm importable' if importlib.util.find_spec('vllm') else 'no vllm'}")
PYEOF

failed=()
run() {  # run NAME LIMIT_S ARGS...: one benchmark under its limit; the others go on
    local name=$1 limit=$2
    shift 2
    echo "== bench.$name $* (limit ${limit} s)"
    if timeout "$limit" "$PY" -m "bench.$name" "$@"; then
        cp "bench/results/$name.json" "$OUT_DIR/"
    else
        echo "bench.$name did not finish (exit $?)"
        failed+=("$name")
    fi
}

sides="engine;engine, no prefix reuse;generate, static batches;generate, static batches sorted"
sides+=";generate, one at a time;transformers continuous batching"
if "$PY" -c "import vllm" 2>/dev/null; then sides+=";vllm engine;vLLM LLM.generate"; fi
run generation 240 -n 256 --batch 64 --rounds 2 --solo 8 --sides "$sides"
run precision 120 -n 4096 --batch 128 --chat-n 64 --chat-batch 32 --rounds 3
if [ -z "${INFERQ_BENCH_TWINS:-}" ]; then
    run pipeline 150 -n 20000 --rounds 2
    run realtime 150 --rate 2 --window 30 --batch 2000 --batch-window 20
fi

echo "results in $OUT_DIR: $(ls "$OUT_DIR" | tr '\n' ' ')"
[ ${#failed[@]} -eq 0 ] || { echo "did not finish: ${failed[*]}"; exit 1; }
