#!/usr/bin/env bash
# The GPU check, one call of well under 10 minutes on an H100 / H200 machine: (1) the tests marked gpu through
# pytest-xdist, (2) optionally compute-sanitizer memcheck, (2b) optionally `mxkit tune gemm`, (3) `mxkit bench quantize` at 8192^2 and 16384^2
# with peers, (4) `mxkit bench gemm --quick`, (4b) `mxkit bench moe --quick`, (5) `mxkit bench overhead`,
# (6) `mxkit bench decode --quick`;
# logs, CSV / JSON / PNG under $OUT, a short summary printed LAST. Runs from source (PYTHONPATH=src); installs
# nothing.
#
#   bash scripts/gpu_check.sh
#
# Each stage runs under `timeout` with its own budget (seconds), cut to what is left of MXKIT_WALL_BUDGET after
# keeping 30 s for every later stage that will run; a benchmark stopped by its budget keeps the rows it measured
# (the files are rewritten after every case or run), and the summary says the stage timed out.
#   OUT                     results folder (default results/gpu)
#   MXKIT_WALL_BUDGET       the whole check (default 550)
#   MXKIT_TESTS_BUDGET      stage 1 (default 280; 520 with MXKIT_SKIP_BENCH=1: the full matrix takes ~440 s on
#                           an H200 with 16 workers; on an H100, 8 workers, run the reduced one, MXKIT_GPU_FULL=0,
#                           ~415-570 s by the host; its full one, ~915 tests, does not fit one call)
#                                                                         MXKIT_SKIP_TESTS=1  skip it
#   MXKIT_SANITIZE=1        run stage 2 (default off); MXKIT_SANITIZE_BUDGET (default 120),
#                           MXKIT_SANITIZE_K: its pytest -k expression (default "quantize or dequantize")
#   MXKIT_TUNE=1            run stage 2b (default off): `mxkit tune gemm --stages $MXKIT_TUNE_STAGES --rep-ms 5`
#                           into gemm_table.json (~1 minute on an H200 for the default stages: every table key but
#                           decode_w4a16, the Triton decode kernel's schedule grid and envelope); MXKIT_TUNE_BUDGET
#                           (default 150; with the tests and benchmarks on, the later stages' reserves leave it
#                           ~100 s: give it MXKIT_SKIP_TESTS=1 or a larger MXKIT_WALL_BUDGET)
#   MXKIT_QUANTIZE_BUDGET   stage 3 (default 150)     MXKIT_SKIP_BENCH=1  skip stages 3 to 6 (4b too)
#                                                     MXKIT_SKIP_QUANTIZE=1  skip stage 3
#   MXKIT_GEMM_BUDGET       stage 4 (default 90)      MXKIT_SKIP_GEMM=1   skip stage 4
#   MXKIT_MOE_BUDGET        stage 4b (default 90)     MXKIT_SKIP_MOE=1       skip stage 4b (bench moe --quick)
#   MXKIT_OVERHEAD_BUDGET   stage 5 (default 45)      MXKIT_SKIP_OVERHEAD=1  skip stage 5
#   MXKIT_DECODE_BUDGET     stage 6 (default 120)     MXKIT_SKIP_DECODE=1    skip stage 6
#   MXKIT_GPU_FULL          1 (default here): the tests' complete format x mode x rounding x dtype x axis matrix
#   MXKIT_TEST_K            a pytest -k expression for stage 1 (default: every gpu test)
#   MXKIT_TEST_IDS          a file of pytest node ids, one a line, for stage 1 in place of tests/ (e.g. what an
#                           earlier run did not pass: `python3 scripts/gpu_missing_ids.py <its pytest_gpu.xml>`)
#   MXKIT_XDIST_N           pytest-xdist workers (default 16; 8 on GPUs under 120 GB, e.g. an 80 GB H100)
#   MXKIT_QUANTIZE_ARGS / MXKIT_GEMM_ARGS / MXKIT_MOE_ARGS / MXKIT_OVERHEAD_ARGS / MXKIT_DECODE_ARGS  extra
#                           options for the benchmarks. The GEMM stage's default, "--peers cublas-bf16,scaled-mm-fp8,dot-scaled,
#                           torchao", leaves out the compiled reference, whose torch.compile per pair and shape
#                           does not fit the stage (the full `mxkit bench gemm` runs it); decode's, "--quick", cuts
#                           Llama-3-8B to 4 layers and 16 tokens
# Files: gpu_check.log, pytest_gpu.xml, sanitizer.log, tune.log, gemm_table.json, bench_quantize.{csv,json,png}, bench_gemm.{csv,json,png},
# bench_moe.{csv,json,png}, bench_overhead.{csv,json}, bench_decode.{csv,json,png}, summary.txt. Exit status 0
# when every stage that ran passed (no test failure, no memcheck error, every mxkit benchmark output checked, every
# overhead call and decode run done, no stage out of time).

set -u -o pipefail
# the budgets are whole seconds (a "5m" went to `timeout` past the wall cap; a "10m" wall gave an empty budget)
for v in MXKIT_WALL_BUDGET MXKIT_TESTS_BUDGET MXKIT_SANITIZE_BUDGET MXKIT_TUNE_BUDGET MXKIT_QUANTIZE_BUDGET \
        MXKIT_GEMM_BUDGET MXKIT_MOE_BUDGET MXKIT_OVERHEAD_BUDGET MXKIT_DECODE_BUDGET MXKIT_XDIST_N; do
    case "${!v:-1}" in
        '' | *[!0-9]* | 0?*) echo "$v=${!v}: expected a whole number (no leading 0)" >&2; exit 2 ;;
    esac
done
# (a relative MXKIT_TEST_IDS names a file from where the script was called)
if [ -n "${MXKIT_TEST_IDS:-}" ]; then
    IDS_FILE=$(realpath "$MXKIT_TEST_IDS") && [ -f "$IDS_FILE" ] || { echo "MXKIT_TEST_IDS: no file $MXKIT_TEST_IDS" >&2; exit 2; }
fi
cd "$(dirname "$0")/.." || exit 2
# how many of the named benchmark stages will run (each stage keeps 30 s for every later one that will)
runs() { local n=0 b v; for b in "$@"; do v="MXKIT_SKIP_$b"; [ "${!v:-0}" = 1 ] || n=$((n + 1)); done; echo "$n"; }
NB=0  # the benchmark stages that will run
if [ "${MXKIT_SKIP_BENCH:-0}" != 1 ]; then
    NB=$(runs QUANTIZE GEMM MOE OVERHEAD DECODE)
fi
RESULTS="${OUT:-results/gpu}"
mkdir -p "$RESULTS" || exit 2
# an earlier run's files go first: the summary reads only what this run's stages wrote (a stage skipped, or one that
# crashed before its first save, had its old JSON summarised as this run's)
rm -f "$RESULTS"/{gpu_check.log,pytest_gpu.xml,sanitizer.log,tune.log,gemm_table.json,summary.txt} \
    "$RESULTS"/bench_{quantize,gemm,moe,overhead,decode}.{csv,json,png}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export MXKIT_GPU_FULL="${MXKIT_GPU_FULL:-1}"
# no background Inductor compile workers while kernels are timed (they took host time from the timed launches)
export TORCHINDUCTOR_COMPILE_THREADS=1
LOG="$RESULTS/gpu_check.log"
: >"$LOG"
T0=$(date +%s)
WALL="${MXKIT_WALL_BUDGET:-550}"
say() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
# budget for a stage: min(want, what is left of WALL after `later` more stages of 30 s and 15 s for the summary)
fit() { local left=$((WALL - ($(date +%s) - T0) - 30 * $2 - 15)); [ "$left" -lt "$1" ] && echo $((left > 20 ? left : 20)) || echo "$1"; }
STATUS=()  # "stage: result" lines for the summary

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
python3 -c 'import torch, triton; print("torch", torch.__version__, "| cuda", torch.version.cuda, "| triton",
triton.__version__, "| gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' 2>&1 | tee -a "$LOG"

# 1. the GPU tests -------------------------------------------------------------------------------------------
if [ "${MXKIT_SKIP_TESTS:-0}" = 1 ]; then
    STATUS+=("tests: skipped (MXKIT_SKIP_TESTS=1)")
else
    if python3 -c "import xdist" 2>/dev/null; then
        # 16 workers on a GPU of 120 GB or more (H200); 8 below it: on an 80 GB H100, 16 workers ran out of memory
        # on 22 of the MoE / wgmma tests (2026-12-05, benchmarks/h100-2026-12-05/), which pass at 6
        MEM_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
        DEF_N=16
        if [ -n "$MEM_MIB" ] && [ "$MEM_MIB" -lt 120000 ] 2>/dev/null; then DEF_N=8; fi
        PAR=(-n "${MXKIT_XDIST_N:-$DEF_N}")
    else
        PAR=(-p no:xdist)
        say "pytest-xdist is not importable here: the GPU tests run serially (-p no:xdist)"
    fi
    # the later stages that will run keep their 30 s each (none when the benchmarks are skipped)
    # (stages reserved behind this one: the sanitizer's and the tune's when on, the five benchmarks' unless skipped)
    SAN=$(($([ "${MXKIT_SANITIZE:-0}" = 1 ] && echo 1 || echo 0) + $([ "${MXKIT_TUNE:-0}" = 1 ] && echo 1 || echo 0)))
    if [ "${MXKIT_SKIP_BENCH:-0}" = 1 ]; then B=$(fit "${MXKIT_TESTS_BUDGET:-520}" "$SAN"); else B=$(fit "${MXKIT_TESTS_BUDGET:-280}" $((NB + SAN))); fi
    # the C++ fast call, built once here (else every worker would build it at its first eager call)
    python3 -c 'from mxkit.kernels import fast_call; print("fast call:", fast_call.build())' 2>&1 | tail -n 3 | tee -a "$LOG"
    WHAT=(tests)
    if [ -n "${MXKIT_TEST_IDS:-}" ]; then  # (a missing or empty file runs nothing: never the whole suite instead)
        mapfile -t WHAT < <(tr -d '\r' < "$IDS_FILE" | grep -v '^ *$')
    fi
    if [ "${#WHAT[@]}" = 0 ]; then  # (an empty MXKIT_TEST_IDS: nothing left to run, never the whole suite)
        STATUS+=("tests: none to run (MXKIT_TEST_IDS=$MXKIT_TEST_IDS holds no ids)")
    else
        say "stage 1: pytest -m gpu ${PAR[*]} (budget $B s, MXKIT_GPU_FULL=$MXKIT_GPU_FULL, ${#WHAT[@]} paths or ids)"
        # one CPU thread per worker for torch's CPU references: the Triton compiles need the cores
        OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout -s INT -k 20 "$B" python3 -m pytest -m gpu "${PAR[@]}" -q \
            -p no:cacheprovider --junitxml="$RESULTS/pytest_gpu.xml" ${MXKIT_TEST_K:+-k "$MXKIT_TEST_K"} "${WHAT[@]}" \
            2>&1 | tail -n 40 | tee -a "$LOG"
        rc=${PIPESTATUS[0]}
        STATUS+=("tests: rc $rc$([ "$rc" = 124 ] || [ "$rc" = 130 ] && echo ' (out of time)')")
        [ "$rc" = 0 ] || FAILED=1
    fi
fi

# 2. compute-sanitizer memcheck (off unless MXKIT_SANITIZE=1) ---------------------------------------------------
if [ "${MXKIT_SANITIZE:-0}" = 1 ]; then  # (its own pytest run: MXKIT_SKIP_TESTS=1 leaves it on)
    TUNE=$([ "${MXKIT_TUNE:-0}" = 1 ] && echo 1 || echo 0)  # (stage 2b, when on, keeps its 30 s too)
    B=$(fit "${MXKIT_SANITIZE_BUDGET:-120}" $((NB + TUNE)))
    K="${MXKIT_SANITIZE_K:-quantize or dequantize}"
    say "stage 2: compute-sanitizer memcheck over pytest -m gpu -k '$K' (budget $B s; caching allocator off)"
    # (--report-api-errors no: the driver-API launch probes a kernel's parameter count by calling cuFuncGetParamInfo
    # past the last one, whose CUDA_ERROR_INVALID_VALUE is expected; reported, it filled the print limit)
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$B" compute-sanitizer --tool memcheck --error-exitcode 3 \
        --report-api-errors no --print-limit 20 python3 -m pytest -m gpu -p no:xdist -q -x -p no:cacheprovider -k "$K" tests \
        >"$RESULTS/sanitizer.log" 2>&1
    rc=$?
    tail -n 5 "$RESULTS/sanitizer.log" | tee -a "$LOG"
    STATUS+=("compute-sanitizer: rc $rc (3 = memcheck errors, 124 = out of time)")
    [ "$rc" = 0 ] || FAILED=1
else
    STATUS+=("compute-sanitizer: not run (MXKIT_SANITIZE=1 runs it)")
fi

# 2b. mxkit tune gemm (off unless MXKIT_TUNE=1): this GPU's dispatch table, to add to the packaged one -----------
if [ "${MXKIT_TUNE:-0}" = 1 ]; then
    B=$(fit "${MXKIT_TUNE_BUDGET:-150}" "$NB")
    ST="${MXKIT_TUNE_STAGES:-decode_mma,a8w8_mma,w8a16_mma,w4a16_wgmma,w8a16_wgmma,moe}"
    say "stage 2b: mxkit tune gemm --stages $ST --rep-ms 5 (budget $B s)"
    timeout -s INT -k 10 "$B" python3 -m mxkit tune gemm --stages "$ST" --rep-ms 5 --out "$RESULTS/gemm_table.json" \
        >"$RESULTS/tune.log" 2>&1
    rc=$?
    grep -iE '^\[|error' "$RESULTS/tune.log" | tail -n 20 | tee -a "$LOG"
    STATUS+=("tune: rc $rc$([ "$rc" = 124 ] || [ "$rc" = 130 ] && echo ' (out of time: gemm_table.json holds the stages finished)')")
    [ "$rc" = 0 ] || FAILED=1
else
    STATUS+=("tune: not run (MXKIT_TUNE=1 runs it)")
fi

# 3. the quantize benchmark --------------------------------------------------------------------------------
bench() {  # bench <stage name> <budget> <mxkit bench args...>
    local name=$1 budget=$2
    shift 2
    say "$name: python3 -m mxkit bench $* (budget $budget s)"
    timeout -s INT -k 20 "$budget" python3 -m mxkit bench "$@" --out "$RESULTS" --plain 2>&1 | tee -a "$LOG" | tail -n 80
    local rc=${PIPESTATUS[0]}
    STATUS+=("$name: rc $rc$([ "$rc" = 124 ] || [ "$rc" = 130 ] && echo ' (out of time: the JSON holds the rows measured)')$([ "$rc" = 1 ] && echo ' (an mxkit output failed its check, or a call / run raised)')")
    [ "$rc" = 0 ] || FAILED=1
}
if [ "${MXKIT_SKIP_BENCH:-0}" = 1 ]; then
    STATUS+=("bench quantize / gemm / moe / overhead / decode: skipped (MXKIT_SKIP_BENCH=1)")
else
    if [ "${MXKIT_SKIP_QUANTIZE:-0}" = 1 ]; then
        STATUS+=("bench quantize: skipped (MXKIT_SKIP_QUANTIZE=1)")
    else
        # shellcheck disable=SC2086
        B=$(fit "${MXKIT_QUANTIZE_BUDGET:-150}" "$(runs GEMM MOE OVERHEAD DECODE)")
        bench "bench quantize" "$B" quantize --shapes 8192x8192,16384x16384 ${MXKIT_QUANTIZE_ARGS:-}
    fi
    # 4. the GEMM benchmark, quick set ---------------------------------------------------------------------
    if [ "${MXKIT_SKIP_GEMM:-0}" = 1 ]; then
        STATUS+=("bench gemm: skipped (MXKIT_SKIP_GEMM=1)")
    else
        # shellcheck disable=SC2086
        bench "bench gemm" "$(fit "${MXKIT_GEMM_BUDGET:-90}" "$(runs MOE OVERHEAD DECODE)")" gemm --quick \
            ${MXKIT_GEMM_ARGS:---peers cublas-bf16,scaled-mm-fp8,dot-scaled,torchao}
    fi
    # 4b. the MoE benchmark, quick set (GPT-OSS-120B experts at 1, 64, 4096 tokens; under 60 s) -----------------
    if [ "${MXKIT_SKIP_MOE:-0}" = 1 ]; then
        STATUS+=("bench moe: skipped (MXKIT_SKIP_MOE=1)")
    else
        # shellcheck disable=SC2086
        bench "bench moe" "$(fit "${MXKIT_MOE_BUDGET:-90}" "$(runs OVERHEAD DECODE)")" moe --quick ${MXKIT_MOE_ARGS:-}
    fi
    # 5. host overhead per eager call (under 30 s) -----------------------------------------------------------
    if [ "${MXKIT_SKIP_OVERHEAD:-0}" = 1 ]; then
        STATUS+=("bench overhead: skipped (MXKIT_SKIP_OVERHEAD=1)")
    else
        # shellcheck disable=SC2086
        B=$(fit "${MXKIT_OVERHEAD_BUDGET:-45}" "$(runs DECODE)")
        bench "bench overhead" "$B" overhead ${MXKIT_OVERHEAD_ARGS:-}
    fi
    # 6. end-to-end decode, cut to 4 layers and 16 tokens (under 90 s on an H200) ----------------------------
    if [ "${MXKIT_SKIP_DECODE:-0}" = 1 ]; then
        STATUS+=("bench decode: skipped (MXKIT_SKIP_DECODE=1)")
    else
        # shellcheck disable=SC2086
        bench "bench decode" "$(fit "${MXKIT_DECODE_BUDGET:-120}" 0)" decode ${MXKIT_DECODE_ARGS:---quick}
    fi
fi

# 7. summary, printed last ---------------------------------------------------------------------------------
printf '%s\n' "${STATUS[@]}" >"$RESULTS/.status"
python3 scripts/gpu_summary.py "$RESULTS" "$(($(date +%s) - T0))" 2>&1 | tee "$RESULTS/summary.txt" | tee -a "$LOG"
rm -f "$RESULTS/.status"
exit "${FAILED:-0}"
