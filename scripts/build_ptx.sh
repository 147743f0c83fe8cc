#!/usr/bin/env bash
# Regenerate the PTX that mxkit ships for its CUDA C++ kernels (src/mxkit/kernels/matmul_details/*.cu), with
# nvcc (CUDA 12 or newer). The PTX targets sm_80 and declares PTX ISA 7.8 (CUDA 11.8 drivers and newer
# load it): the kernels use nothing newer, and ptxas checks that here for sm_80 and sm_90.
#
#   bash scripts/build_ptx.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for cu in src/mxkit/kernels/matmul_details/*.cu; do
    ptx="${cu%.cu}.ptx"
    nvcc -ptx -arch=sm_80 -O3 -o "$ptx.tmp" "$cu"
    {
        echo "// Generated from $(basename "$cu") (sha256 $(sha256sum "$cu" | cut -c1-16)) by scripts/build_ptx.sh; do not edit."
        sed -e 's/^\.version [0-9.]*$/.version 7.8/' "$ptx.tmp"
    } >"$ptx"
    rm -f "$ptx.tmp"
    for arch in sm_80 sm_90; do ptxas -arch="$arch" "$ptx" -o /dev/null; done
    echo "wrote $ptx"
done
