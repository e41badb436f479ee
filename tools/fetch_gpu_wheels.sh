#!/usr/bin/env bash
# Download, on a machine with network, the wheels tools/gpu_device_check.sh
# installs on the GPU machine (Python 3.12, x86-64, no network): zstandard, and
# TorchTitan with what its import needs, and torchft with its opentelemetry packages. Versions come from constraints.txt.
# They land in .whl/ (ignored by git); carry that folder with the run.
#
#   bash tools/fetch_gpu_wheels.sh [PYTHON_VERSION]     (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
pip download -q --no-deps --only-binary=:all: --python-version "${1:-3.12}" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -c constraints.txt -d .whl \
    zstandard torchtitan torchdata torch-checkpointing spmd-types tyro typeguard docstring-parser \
    datasets dill multiprocess \
    torchft opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions \
    opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-http-transport \
    opentelemetry-exporter-otlp-common opentelemetry-exporter-otlp-proto-common opentelemetry-proto \
    protobuf googleapis-common-protos
ls -la .whl
