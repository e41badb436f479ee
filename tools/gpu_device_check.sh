#!/usr/bin/env bash
# One run of the loader's GPU checks on a bare GPU machine that has torch with
# CUDA but not this project's other dependencies (the lent H200: Python 3.12,
# torch 2.11, no network). Run from the repository root, with the wheels that
# tools/fetch_gpu_wheels.sh put in .whl/ carried along:
#
#   bash tools/gpu_device_check.sh            (OUT=folder for the results)
#
# Steps, each under `timeout -s ABRT` (faulthandler prints every thread's stack
# on a hang; pytest also dumps them after 100 s in one test) and all within a
# global deadline (BUDGET_S, default 420 s); a failing step does not stop the
# later ones:
#   0 probe   1 wheels into /tmp/site
#   2 tests: the CUDA delivery (pinned ring, side-stream copies, labels copied
#     non_blocking behind a long kernel, close() waiting for them), the
#     delivery's decisions on CPU, the TorchTitan loader on CUDA, TorchTitan's
#     train_step batch lines, TorchTitan's torchft pieces with replica groups
#     as processes (the loader delivering on CUDA, ZephonFTTrainer importing
#     with the triton that CUDA torch brings), the helper process
#   3 benchmarks: bench_handback.py, bench_device.py, bench_train_overhead.py
#     --consumer model, bench_read.py --local-only
# The last lines say which steps failed (and the failing tests), or ALL OK.
# Without a GPU it rehearses: the CUDA tests skip, the CUDA benchmarks exit
# with their message (their steps then read FAIL).
# TorchTitan 0.3.0 does not train on torch 2.11, so no training run is tried
# here (tools/gpu_check.sh does one where TorchTitan can train).
# Results in $OUT: log.txt, summary.txt and each benchmark's JSON line.
set -u -o pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/zephon-gpu-out}
WHL_DIR=${WHL_DIR:-$REPO/.whl}
SITE=/tmp/site
WORK=/tmp/zephon-gpu
BUDGET_S=${BUDGET_S:-420}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export PIP_ROOT_USER_ACTION=ignore HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
DEADLINE=$(( $(date +%s) + BUDGET_S ))
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"

# step NAME CAP_S CMD...: CMD under timeout min(CAP_S, time left); one summary line.
step() {
  local name=$1 cap=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  local limit=$(( cap < left ? cap : left ))
  echo "=== [$name] limit ${limit}s"
  if (( limit < 5 )); then
    printf '%-34s SKIP (deadline)\n' "$name" >> "$SUMMARY"
    return 99
  fi
  local started=$SECONDS
  timeout -s ABRT -k 10 "$limit" "$@"
  local rc=$?
  local took=$(( SECONDS - started ))
  local verdict=ok
  (( rc != 0 )) && verdict=FAIL
  # NOTE: 134 is SIGABRT, timeout's signal, but also any abort: only a step
  # that ran to its limit timed out.
  (( rc == 124 || rc == 137 || (rc == 134 && took >= limit) )) && verdict=TIMEOUT
  printf '%-34s %-7s rc=%-3s %4ss\n' "$name" "$verdict" "$rc" "$took" >> "$SUMMARY"
  echo "=== [$name] rc=$rc $verdict ${took}s"
  return $rc
}

probe() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nproc
  "$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
}

install() {
  ls "$WHL_DIR"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHL_DIR"/*.whl
}

# bench NAME SCRIPT ARGS...: the benchmark's output to the log, its last (JSON) line to $OUT/NAME.json
bench() {
  set -o pipefail
  local name=$1; shift
  "$PYTHON" "$@" 2>&1 | (trap '' ABRT; exec tee "$WORK/$name.out")
  local rc=$?
  tail -n 1 "$WORK/$name.out" | grep '^{' > "$OUT/$name.json" || rm -f "$OUT/$name.json"
  return $rc
}

export -f probe install bench
export PYTHON WHL_DIR SITE WORK OUT

main() {
  cd "$REPO" || exit 1
  echo "tools/gpu_device_check.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'), budget ${BUDGET_S}s"
  step "0 probe" 30 bash -c probe
  if step "1 install wheels" 90 bash -c install; then
    export PYTHONPATH="$SITE:$REPO"
  else
    export PYTHONPATH="$REPO"
  fi
  # NOTE: -rfEs lists failures, errors and skip reasons; separate runs, so a
  # file that fails to import does not hide the others.
  local pytest=("$PYTHON" -m pytest -q -rfEs -p no:cacheprovider -o faulthandler_timeout=100)
  step "2 pytest loader_cuda + device" 150 "${pytest[@]}" tests/test_loader_cuda.py tests/test_loader_device.py \
    "tests/test_loader_packing.py::test_cuda_delivery_gives_the_cpu_outputs_with_host_scalars"
  step "2 pytest torchtitan gpu+trainer" 120 "${pytest[@]}" tests/test_torchtitan_gpu.py tests/test_torchtitan_trainer.py
  # NOTE: needs torchft and its opentelemetry packages among the wheels; without
  # them the file skips (the summary line then reads ok: check the skip reasons).
  step "2 pytest torchtitan torchft" 150 "${pytest[@]}" tests/test_torchtitan_torchft.py
  step "2 pytest loader_process" 90 "${pytest[@]}" tests/test_loader_process.py
  local bench=(bash -c 'bench "$@"' bench)
  step "3 bench_handback" 45 "${bench[@]}" bench_handback benchmarks/bench_handback.py --steps 5000 --repeats 3
  step "3 bench_device" 90 "${bench[@]}" bench_device benchmarks/bench_device.py --data-dir "$WORK/bench" --repeats 2
  step "3 bench_train_overhead model" 150 "${bench[@]}" bench_train_overhead benchmarks/bench_train_overhead.py \
    --consumer model --data-dir "$WORK/bench" --repeats 2 --model-steps 100
  step "3 bench_read local" 90 "${bench[@]}" bench_read benchmarks/bench_read.py --local-only --repeats 2 \
    --data-dir "$WORK/bench"
  echo "=== summary"
  cat "$SUMMARY"
  echo "=== failing tests"
  grep -hE '^(FAILED|ERROR) ' "$OUT/log.txt" | sort -u || echo "none"
  local failed
  failed=$(grep -vE '^\S.* ok ' "$SUMMARY" | awk '{print "  " $0}')
  if [ -n "$failed" ]; then
    printf 'FAILED STEPS:\n%s\n' "$failed"
  else
    echo "ALL OK"
  fi
}

main 2>&1 | tee "$OUT/log.txt"
