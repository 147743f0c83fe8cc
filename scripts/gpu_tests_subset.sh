#!/usr/bin/env bash
# A subset of the GPU tests on the device machine, in several pytest processes sharing one work queue (as
# gpu_check.sh does, with the full matrix): for checking a kernel change before a full gpu_check.
#   scripts/gpu_tests_subset.sh "<pytest -k expression>" [processes, default 8]
cd "$(dirname "$0")/.." || exit 2
D=$(mktemp -d); mkdir "$D/claims"
for k in $(seq 1 "${2:-8}"); do
  MXKIT_GPU_FULL=1 MXKIT_TEST_CLAIM_DIR="$D/claims" OMP_NUM_THREADS=1 PYTHONPATH=src \
    python3 -m pytest -m gpu -q -p no:cacheprovider -k "$1" >"$D/log$k.txt" 2>&1 &
done
wait
cat "$D"/log*.txt | grep -E "passed|failed|Error|assert" | head -40
! grep -q -E "[0-9]+ failed|[0-9]+ error" "$D"/log*.txt
