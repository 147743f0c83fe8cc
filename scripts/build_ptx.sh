#!/usr/bin/env bash
# Regenerate the PTX that mxkit ships for its CUDA C++ kernels (src/mxkit/kernels/matmul_details/*.cu), with
# nvcc (CUDA 12.4 or newer). Each file declares the oldest target and PTX ISA its kernels need, so that older
# drivers load it too, and ptxas checks that here for that target and sm_90:
#   mma_decode.cu  sm_80, PTX ISA 7.8 (CUDA 11.8 drivers): mma.sync bf16
#   mma_a8w8.cu    sm_89, PTX ISA 8.4 (CUDA 12.4 drivers): mma.sync e4m3, cvt e4m3x2
#   mma_a8w8_bulk.cu  sm_90, PTX ISA 8.4: mma_a8w8.cu's device code (included) and cp.async.bulk, mbarrier tx counts
#
#   bash scripts/build_ptx.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for cu in src/mxkit/kernels/matmul_details/*.cu; do
    case "$(basename "$cu")" in
        mma_a8w8.cu) arch=sm_89 isa=8.4 deps= ;;
        mma_a8w8_bulk.cu) arch=sm_90 isa=8.4 deps=mma_a8w8.cu ;;
        *) arch=sm_80 isa=7.8 deps= ;;
    esac
    ptx="${cu%.cu}.ptx"
    nvcc -ptx -arch="$arch" -O3 -o "$ptx.tmp" "$cu"
    {
        # the hash covers the .cu, the .cu it includes (deps) and the header every .cu includes (mma_common.cuh)
        d="$(dirname "$cu")"
        echo "// Generated from $(basename "$cu") (sha256 $(cat "$cu" ${deps:+"$d/$deps"} "$d/mma_common.cuh" | sha256sum | cut -c1-16)) by scripts/build_ptx.sh; do not edit."
        sed -e "s/^\.version [0-9.]*\$/.version $isa/" "$ptx.tmp"
    } >"$ptx"
    rm -f "$ptx.tmp"
    for a in "$arch" sm_90; do ptxas -arch="$a" "$ptx" -o /dev/null; done
    echo "wrote $ptx"
done
