#!/usr/bin/env bash
# Train TorchTitan's llama3 debug model on a zephon_stream dataset in S3, then
# resume the same run on half the GPUs. Needs NVIDIA GPUs, TorchTitan 0.3.0
# (pip install 'zephon-stream[torchtitan]') or TorchTitan main (its source tree
# first on PYTHONPATH, and grain), and S3 credentials in the standard AWS
# variables (AWS_ENDPOINT_URL too, for a non-AWS endpoint).
#
#   BUCKET=s3://my-bucket/zephon NGPU=8 examples/torchtitan/run.sh
set -euo pipefail
cd "$(dirname "$0")"

BUCKET=${BUCKET:?set BUCKET=s3://bucket/prefix}
NGPU=${NGPU:-8}
export ZEPHON_DATASET="$BUCKET/stdlib-bpe2k"
export ZEPHON_ASSETS="$PWD/assets/tokenizer-bpe2k"
STDLIB=$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')

# 1. A tokenizer small enough for the debug model (vocab <= 2048).
python make_tokenizer.py "$STDLIB" --output "$ZEPHON_ASSETS"

# 2. Write the dataset straight to S3 (the standard library's top-level modules).
zephon-stream write "$STDLIB/*.py" --output "$ZEPHON_DATASET" \
    --tokenizer "hf:$ZEPHON_ASSETS/tokenizer.json" --workers 4

# The flag for a rank's rows per microbatch, in the installed TorchTitan's names
# (0.3.0: --training.local_batch_size ROWS; main: tokens, ROWS x 512).
batch() { python -c "from zephon_stream.integrations.torchtitan import TITAN; print(TITAN.batch_flag_value(rows=$1, seq_len=512))"; }

# 3. Train 20 steps on NGPU ranks (8 rows of 512 tokens per rank), checkpointing
#    every 10 steps (the config enables checkpoints, full state at the last step).
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} torchrun --standalone --nproc-per-node "$NGPU" -m torchtitan.train \
    --module zephon_titan --config llama3_debugmodel_zephon \
    --dump_folder "$PWD/outputs/dp$NGPU" --training.steps 20 $(batch 8)

# 4. Resume the step-10 checkpoint on NGPU/2 ranks with the same global batch
#    (twice the rows per rank) and train steps 11-20 again. TorchTitan's
#    checkpoint holds one dataloader entry for all ranks, so steps 11-20 read
#    the same samples as in step 3: compare the two loss logs.
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} torchrun --standalone --nproc-per-node "$((NGPU / 2))" -m torchtitan.train \
    --module zephon_titan --config llama3_debugmodel_zephon \
    --dump_folder "$PWD/outputs/dp$((NGPU / 2))" --training.steps 20 $(batch 16) \
    --checkpoint.initial_load_path "$PWD/outputs/dp$NGPU/checkpoint/step-10" \
    --checkpoint.no-initial_load_model_only
