#!/usr/bin/env bash
# GPU check of the TorchTitan integration, for a machine with an NVIDIA GPU and
# the project's test environment (pip install -e '.[dev,torchtitan]'):
#   1. tests/test_loader_cuda.py, tests/test_torchtitan_gpu.py and
#      tests/test_torchtitan_trainer.py: token ids cross from the pinned ring
#      at their stored width on a side stream that overlaps compute, widened
#      on the GPU; TorchTitan's train_step batch handling takes them;
#   2. a real TorchTitan training run (llama3 debug model, 2 steps, checkpoint
#      each step) with ZephonDataLoader(device="cuda") on a dataset written here,
#      then a look at the checkpoint's dataloader entry.
# Prints what it did; exits non-zero on the first failure. About 2-4 minutes.
#
#   tools/gpu_check.sh [WORK_DIR]
#
# PYTHON names the interpreter that has torch with CUDA (default: python).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WORK=${1:-$(mktemp -d -t zephon-gpu-check.XXXXXX)}
mkdir -p "$WORK"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python}

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" - <<'EOF'
import torch, torchtitan, zephon_stream
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, available={torch.cuda.is_available()}), "
      f"torchtitan {torchtitan.__version__}, zephon_stream {zephon_stream.__version__}")
assert torch.cuda.is_available(), "no CUDA device visible"
EOF

echo "== 1/2 CUDA delivery test"
"$PYTHON" -m pytest -q -rA -p no:cacheprovider tests/test_loader_cuda.py tests/test_loader_packing.py tests/test_torchtitan_gpu.py \
    tests/test_torchtitan_trainer.py tests/test_loader_process.py \
    tests/test_torchtitan.py::test_example_job_configs_select_the_zephon_loader

echo "== 2/2 TorchTitan training with ZephonDataLoader (work dir $WORK)"
STDLIB=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
"$PYTHON" examples/torchtitan/make_tokenizer.py "$STDLIB" --output "$WORK/tokenizer" --max-files 150
"$PYTHON" -m zephon_stream write "$STDLIB/*.py" --output "$WORK/dataset" --overwrite --no-progress \
    --tokenizer "hf:$WORK/tokenizer/tokenizer.json" --block-tokens 65537 --blocks-per-shard 8
ZEPHON_DEVICE=cuda ZEPHON_DATASET="$WORK/dataset" ZEPHON_ASSETS="$WORK/tokenizer" PYTHONPATH="$REPO/examples/torchtitan:$PYTHONPATH" \
    "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 1 -m torchtitan.train \
    --module zephon_titan --config llama3_debugmodel_zephon \
    --dump_folder "$WORK/outputs" --training.steps 2 --training.seq_len 512 --training.local_batch_size 8 \
    --checkpoint.interval 1 2>&1 | tee "$WORK/train.log"
grep -E "step: *[0-9]+.*loss" "$WORK/train.log" || { echo "no loss line in $WORK/train.log" >&2; exit 1; }

"$PYTHON" - "$WORK/outputs/checkpoint" <<'EOF'
import json, sys
import torch.distributed.checkpoint as dcp
from pathlib import Path
step = max(Path(sys.argv[1]).glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
keys = sorted(k for k in dcp.FileSystemReader(str(step)).read_metadata().state_dict_metadata if k.startswith("dataloader"))
print(f"{step}: dataloader entries {keys}")
assert keys == ["dataloader.zephon"], keys
state = {"dataloader": {"zephon": ""}}
dcp.load(state, checkpoint_id=str(step), no_dist=True)
print("saved loader state:", json.loads(state["dataloader"]["zephon"]))
EOF
echo "gpu_check: OK"
