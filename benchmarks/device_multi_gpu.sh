#!/usr/bin/env bash
# The two-GPU tests (tests/test_multi_gpu.py and test_torch.py's test_gpu_second_device: the
# twelve every single-GPU check skips) on a machine with two GPUs (the device tool's
# nvidia-h100-x2 / nvidia-h200-x2), in one call of ~2-3 minutes. Never run on two GPUs before
# the forty-fifth session. Results under $OUT (or ./multi-gpu-out).
#
#     bash benchmarks/device_multi_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-multi-gpu-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$out/gpus.txt"
timeout 400 python3 -m pytest -v -rs -p no:cacheprovider tests/test_multi_gpu.py \
    tests/test_torch.py::test_gpu_second_device > "$out/multi-gpu-tests.txt" 2>&1
echo "rc $?"
grep -E "PASSED|FAILED|SKIPPED|ERROR" "$out/multi-gpu-tests.txt" | tail -20
tail -1 "$out/multi-gpu-tests.txt"
