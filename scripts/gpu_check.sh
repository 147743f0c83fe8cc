#!/usr/bin/env bash
# The one GPU check for the device machine: tests marked gpu, an optional compute-sanitizer pass, the quantize
# benchmark, and a short summary printed LAST. Runs from source (PYTHONPATH=src); installs nothing.
#
#   scripts/gpu_check.sh [--quick] [more `mxkit.bench quantize` options...]
#
# Environment:
#   OUT                    results go to ${OUT:-results/gpu} (flat: at most 7 files, no sub-folders)
#   MXKIT_GPU_FULL         1 (default here): the complete format x mode x rounding x dtype x axis test matrix
#   MXKIT_SANITIZE         1 (default): compute-sanitizer memcheck over the quantize / dequantize gpu tests
#   MXKIT_SANITIZE_K       pytest -k expression for that subset (default: "quantize or dequantize")
#   MXKIT_SANITIZE_TIMEOUT seconds for the sanitizer pass (default 240)
#   MXKIT_PYTEST_TIMEOUT   seconds for `pytest -m gpu` (default 420)
#   MXKIT_PYTEST_SHARDS    pytest processes sharing the gpu tests as a work queue (default 16)
#   MXKIT_PEER_SHAPES      shapes at which torch.compile peers run, compiled per shape (default 8192x8192,16384x16384)
#   MXKIT_COMPILE_BUDGET   seconds of peer compiling before remaining peers become n/a (default 200)
#   MXKIT_BENCH_BUDGET     seconds of benchmarking before remaining cases become n/a (default 240; --quick 120)
#   MXKIT_WALL_BUDGET      seconds the whole check should take (default 560: the device tool stops a call at 600):
#                          the benchmark's time and compile budgets shrink to what the tests left, keeping 50 s
#                          for the read-flush rows and the summary (an H100 once needed 350 s for the tests and
#                          ran past 600 s in the benchmark, with no summary; the read-flush rows take ~20 s, their
#                          kernels already compiled); the benchmark runs the 8192^2 / 16384^2 rows first
#   MXKIT_SKIP_BENCH=1     tests only
#   MXKIT_SKIP_TESTS=1     benchmark only (a rerun after the tests used up the wall budget; no sanitizer either)
#   MXKIT_FLUSH_READ       1 (default): the mxkit rows at 8192^2 / 16384^2 once more after a read flush (a cold,
#                          clean L2; the main run flushes as do_bench, whose dirty lines each run writes back)
#
# Files in the results folder: gpu_check.log (everything printed), pytest_gpu.xml (junit), sanitizer.log
# (only with MXKIT_SANITIZE=1), bench_quantize.{csv,json,png}, bench_quantize_flush_read.json, summary.txt.
# Exit status: 0 when the tests passed and the benchmark ran with every mxkit output matching the reference.

set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
RESULTS="${OUT:-results/gpu}"
mkdir -p "$RESULTS" || exit 2
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
# no background Inductor compile workers while kernels are timed (they took host time from the launches of
# the rows next to a peer's compile: rowwise 8192^2 read 117-124 us instead of 74-88 us in one run)
export TORCHINDUCTOR_COMPILE_THREADS=1
# the full GPU test matrix: about 75 s in 16 processes on an H200 machine (16 cores)
export MXKIT_GPU_FULL="${MXKIT_GPU_FULL:-1}"
LOG="$RESULTS/gpu_check.log"
: >"$LOG"
T0=$(date +%s)
say() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }

QUICK=0
for a in "$@"; do [ "$a" = "--quick" ] && QUICK=1; done
BUDGET="${MXKIT_BENCH_BUDGET:-$([ $QUICK = 1 ] && echo 120 || echo 240)}"
WALL="${MXKIT_WALL_BUDGET:-560}"
# seconds a step may take: min(want, what is left of WALL after keeping `keep` seconds), at least 30
fit() { local left=$((WALL - ($(date +%s) - T0) - $2)); [ "$left" -lt "$1" ] && echo $((left > 30 ? left : 30)) || echo "$1"; }

say "gpu_check: results in $RESULTS; bench args: --out $RESULTS --time-budget-s $BUDGET (or less: MXKIT_WALL_BUDGET $WALL s) $*"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
python3 -c 'import torch, triton; print("torch", torch.__version__, "| cuda", torch.version.cuda, "| triton",
triton.__version__, "| gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' 2>&1 | tee -a "$LOG"

# 1. every test marked gpu, in MXKIT_PYTEST_SHARDS processes that take tests from one work queue (claim files
#    in MXKIT_TEST_CLAIM_DIR, costliest first: tests/conftest.py). The time is Triton compiles, CPU-bound; a
#    static split left some processes with several of the slowest tests. The junit reports merge into one.
if [ "${MXKIT_SKIP_TESTS:-0}" = 1 ]; then
    say "tests skipped (MXKIT_SKIP_TESTS=1)"
    PYTEST_RC=skipped MXKIT_SANITIZE=0
else
SHARDS="${MXKIT_PYTEST_SHARDS:-16}"
SHARD_DIR="$(mktemp -d)"
mkdir -p "$SHARD_DIR/claims"
N_COLLECTED=$(python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider 2>/dev/null | grep -c '::')
say "pytest -m gpu: $N_COLLECTED tests, $SHARDS processes (timeout ${MXKIT_PYTEST_TIMEOUT:-420} s)"
PIDS=()
# one CPU thread per process for torch's CPU work (the references): 16 processes with 16 OpenMP threads
# each left the Triton compiles crawling. SIGINT at the time limit: pytest stops and still writes its junit.
for k in $(seq 1 "$SHARDS"); do
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MXKIT_TEST_CLAIM_DIR="$SHARD_DIR/claims" \
        timeout -s INT -k 20 "${MXKIT_PYTEST_TIMEOUT:-420}" python3 -m pytest -m gpu -q \
        -p no:cacheprovider --durations=3 --junitxml="$SHARD_DIR/junit$k.xml" >"$SHARD_DIR/log$k" 2>&1 &
    PIDS+=($!)
done
PYTEST_RC=0
for p in "${PIDS[@]}"; do
    wait "$p"; rc=$?
    [ $rc = 0 ] || [ $rc = 5 ] || PYTEST_RC=$rc  # 5: this process found every test claimed by others
done
[ "$N_COLLECTED" -gt 0 ] || PYTEST_RC=5  # nothing collected
for log in "$SHARD_DIR"/log*; do echo "---- ${log##*/}" && tail -n 12 "$log"; done 2>&1 | tee -a "$LOG"
python3 - "$SHARD_DIR" "$RESULTS/pytest_gpu.xml" "$N_COLLECTED" <<'PY'
import sys, xml.etree.ElementTree as ET
from pathlib import Path
merged = ET.Element("testsuites", collected=sys.argv[3])
for f in sorted(Path(sys.argv[1]).glob("junit*.xml")):
    root = ET.parse(f).getroot()
    merged.extend([root] if root.tag == "testsuite" else list(root))
ET.ElementTree(merged).write(sys.argv[2])
PY
rm -rf "$SHARD_DIR"
say "pytest rc=$PYTEST_RC"
fi

# 2. compute-sanitizer memcheck over the quantize / dequantize tests (about 25 s) ------------------------
SAN_RC=skipped
if [ "${MXKIT_SANITIZE:-1}" = 1 ]; then
    K="${MXKIT_SANITIZE_K:-quantize or dequantize}"
    say "compute-sanitizer memcheck: pytest -m gpu -k '$K' (caching allocator off so out-of-bounds accesses show)"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${MXKIT_SANITIZE_TIMEOUT:-240}" \
        compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
        python3 -m pytest -m gpu -q -x -p no:cacheprovider -k "$K" >"$RESULTS/sanitizer.log" 2>&1
    SAN_RC=$?
    tail -n 5 "$RESULTS/sanitizer.log" | tee -a "$LOG"
    say "compute-sanitizer rc=$SAN_RC (3 = memcheck found errors; 124 = timeout)"
fi

# 3. the quantize benchmark -----------------------------------------------------------------------------
if [ "${MXKIT_SKIP_BENCH:-0}" = 1 ]; then
    say "benchmark skipped (MXKIT_SKIP_BENCH=1)"
    BENCH_RC=0
else
    B=$(fit "$BUDGET" 50)
    CB=$(fit "${MXKIT_COMPILE_BUDGET:-200}" 50)
    say "python3 -m mxkit.bench quantize (time budget $B s, compile budget $CB s)"
    python3 -m mxkit.bench quantize --out "$RESULTS" --time-budget-s "$B" \
        --compile-static --peer-shapes "${MXKIT_PEER_SHAPES:-8192x8192,16384x16384}" \
        --compile-budget-s "$CB" "$@" 2>&1 | tee -a "$LOG"
    BENCH_RC=$?
fi
say "bench rc=$BENCH_RC (1 = an mxkit output differs from the reference)"
if [ "${MXKIT_SKIP_BENCH:-0}" != 1 ] && [ "${MXKIT_FLUSH_READ:-1}" = 1 ]; then
    # the same rows after a read flush: without the ~5 us per run of writing back the zero-fill's dirty lines
    say "python3 -m mxkit.bench quantize --flush read (mxkit rows only)"
    TMPB="$(mktemp -d)"
    python3 -m mxkit.bench quantize --flush read --peers none --shapes 8192x8192,16384x16384 --out "$TMPB" \
        --time-budget-s "$(fit 90 20)" 2>&1 | tail -3 | tee -a "$LOG"
    cp "$TMPB/bench_quantize.json" "$RESULTS/bench_quantize_flush_read.json" 2>/dev/null
    rm -rf "$TMPB"
fi

# 4. summary, printed last ------------------------------------------------------------------------------
python3 - "$RESULTS" "$PYTEST_RC" "$SAN_RC" "$BENCH_RC" "$(($(date +%s) - T0))" <<'PY' 2>&1 | tee "$RESULTS/summary.txt" | tee -a "$LOG"
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path

res, pytest_rc, san_rc, bench_rc, wall = Path(sys.argv[1]), *sys.argv[2:]
print(f"==== gpu_check summary ({wall} s) ====")
try:
    root = ET.parse(res / "pytest_gpu.xml").getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    # one entry per test (each process also reports the same collection-time skips: counted once, apart)
    cases = {(c.get("classname"), c.get("name")): c for s in suites for c in s.iter("testcase")}
    state = {k: next((t for t in ("failure", "error", "skipped") if c.find(t) is not None), "passed")
             for k, c in cases.items()}
    tests = [k for k in cases if k[0]]
    n = {t: sum(state[k] == t for k in tests) for t in ("passed", "failure", "error", "skipped")}
    collected = int(root.get("collected", len(tests)))
    print(f"tests (-m gpu): {n['passed']} passed, {n['failure']} failed, {n['error']} errors, "
          f"{n['skipped']} skipped, {collected - len(tests)} not run of {collected} (rc {pytest_rc}); "
          f"{len(cases) - len(tests)} module(s) skipped at collection")
    for k, c in cases.items():
        bad = c.find("failure") if c.find("failure") is not None else c.find("error")
        if bad is not None:
            print(f"  FAILED {k[0]}::{k[1]}: {(bad.get('message') or '')[:100]}")
except Exception as e:
    print(f"tests (-m gpu): no junit report ({type(e).__name__}: {e}); rc {pytest_rc}")
print(f"compute-sanitizer: {san_rc}")
try:
    doc = json.loads((res / "bench_quantize.json").read_text())
except Exception as e:
    print(f"bench: no JSON ({type(e).__name__}: {e}); rc {bench_rc}")
    sys.exit(0)
env, rows = doc["env"], doc["rows"]
print(f"bench: rc {bench_rc}; {env.get('gpu')}; torch {env.get('torch')}, triton {env.get('triton')}, "
      f"CUDA {env.get('cuda')}; copy {env.get('copy_gbps')} GB/s; L2 flush {env.get('l2_flush', 'write')}; "
      f"{env.get('date_utc')}")
key = [r for r in rows if r["impl"] == "mxkit" and r["shape"] in ("8192x8192", "16384x16384")]
try:  # the same rows after a read flush (cold, clean L2), when that run happened
    rd = json.loads((res / "bench_quantize_flush_read.json").read_text())
    read_pct = {(r["op"], r["fmt"], r["shape"]): r["pct_copy"] for r in rd["rows"] if r["impl"] == "mxkit"}
    print(f"%copy rd: the same rows after a read flush (clean L2), against that run's copy "
          f"({rd['env'].get('copy_gbps')} GB/s)")
except Exception:
    read_pct = {}
peer = {(r["op"], r["fmt"], r["shape"]): r for r in rows if r["impl"] == "reference-compiled"}
f = lambda v, spec: format(v, spec) if v is not None else "n/a".rjust(int(spec.split(".")[0]))
hdr = (f"{'op':15s} {'format':11s} {'shape':12s} {'us':>9s} {'GB/s':>6s} {'%copy':>6s} {'x ref':>6s} {'ref us':>9s} "
       f"check {'%copy rd':>8s}")
print(hdr)
for r in key:
    p = peer.get((r["op"], r["fmt"], r["shape"]), {})
    line = (f"{r['op']:15s} {r['fmt']:11s} {r['shape']:12s} {f(r['us'], '9.1f')} {f(r['gbps'], '6.0f')} "
            f"{f(r['pct_copy'], '6.1f')} {f(r['vs_ref'], '6.2f')} {f(p.get('us'), '9.1f')} {(r['check'] or '-'):5s} "
            f"{f(read_pct.get((r['op'], r['fmt'], r['shape'])), '8.1f')}")
    if r["status"] != "ok":
        line += f"  [{r['status']}: {r['note'][:60]}]"
    print(line)
if not key:
    print("(no 8192x8192 / 16384x16384 rows in this run)")
na = sum(1 for r in rows if r["impl"] == "mxkit" and r["status"] != "ok")
print(f"mxkit rows: {sum(1 for r in rows if r['impl'] == 'mxkit')} ({na} n/a or error); "
      f"mismatches: {sum(1 for r in rows if r['check'] == 'MISMATCH')}")
PY

[ "$PYTEST_RC" = 0 ] || [ "$PYTEST_RC" = 5 ] || [ "$PYTEST_RC" = skipped ] || exit 1  # 5: no tests collected
case "$SAN_RC" in skipped | 0) ;; *) exit 1 ;; esac
exit "$BENCH_RC"
