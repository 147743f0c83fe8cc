"""The short summary scripts/gpu_check.sh prints last, from its results folder: the stages' exit status, the GPU
test counts (junit), mxkit's quantize rows at 8192^2 / 16384^2, its GEMM rows, the host overhead per call and the
end-to-end decode rows.

    python3 scripts/gpu_summary.py results/gpu [wall seconds]
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def f(v, spec: str) -> str:
    width = int(spec.split(".")[0] or 0)
    return "n/a".rjust(width) if v is None else format(v, spec)


def tests_line(res: Path) -> list[str]:
    try:
        root = ET.parse(res / "pytest_gpu.xml").getroot()
    except Exception as e:
        return [f"tests (-m gpu): no junit report ({type(e).__name__})"]
    cases = [c for s in ([root] if root.tag == "testsuite" else list(root)) for c in s.iter("testcase")]
    # (a run stopped by its budget leaves one nameless testcase a worker, the test it was in: not a pass)
    state = [next((t for t in ("failure", "error", "skipped") if c.find(t) is not None),
                  "passed" if c.get("name") else "cut") for c in cases]
    out = [f"tests (-m gpu): {state.count('passed')} passed, {state.count('failure')} failed, "
           f"{state.count('error')} errors, {state.count('skipped')} skipped"
           + (f", {state.count('cut')} cut off while running" if "cut" in state else "")]
    for c, s in zip(cases, state):
        if s in ("failure", "error"):
            msg = (c.find(s).get("message") or "")[:100]
            out.append(f"  FAILED {c.get('classname')}::{c.get('name')}: {msg}")
    return out


def load(res: Path, stem: str):
    try:
        doc = json.loads((res / f"{stem}.json").read_text())
    except Exception as e:
        return None, [f"{stem}: no JSON ({type(e).__name__})"]
    env = doc["env"]
    head = f"{stem}: {env.get('gpu')}; torch {env.get('torch')}, triton {env.get('triton')}; "
    head += (f"copy {env.get('copy_gbps')} GB/s (read flush) / {env.get('copy_gbps_write')} (write flush); "
             if "copy_gbps" in env else "")
    return [r for r in doc["rows"] if r.get("impl", "mxkit") == "mxkit"], [head + str(env.get("date_utc"))]


def section(res: Path, stem: str, head: str, cells, keep=lambda r: True) -> tuple[list, list[str]]:
    """(mxkit rows, lines): the run's header line, ``head``, then ``cells(row)`` for every kept row."""
    rows, out = load(res, stem)
    if rows is None:
        return [], out
    out.append(head)
    out += [cells(r) + ("" if r["status"] == "ok" else f"  [{r['status']}: {r['note'][:50]}]") for r in rows if keep(r)]
    return rows, out


def quantize_lines(res: Path) -> list[str]:
    rows, out = section(
        res, "bench_quantize", f"{'op':15s} {'format':11s} {'shape':12s} {'µs':>8s} {'%copy':>6s} {'µs wr':>8s} "
                               f"{'%copy wr':>8s} {'× ref':>6s} check",
        lambda r: (f"{r['op']:15s} {r['fmt']:11s} {r['shape']:12s} {f(r['us'], '8.1f')} {f(r['pct_copy'], '6.1f')} "
                   f"{f(r.get('us_write'), '8.1f')} {f(r.get('pct_copy_write'), '8.1f')} {f(r['vs_ref'], '6.2f')} "
                   f"{r['check'] or '-'}"),
        keep=lambda r: r["shape"] in ("8192x8192", "16384x16384"))
    if rows:
        out.append(f"quantize: {len(rows)} mxkit rows, {sum(r['status'] != 'ok' for r in rows)} n/a or error, "
                   f"{sum(r['check'] == 'MISMATCH' for r in rows)} byte mismatches")
    return out


def gemm_lines(res: Path) -> list[str]:
    return section(
        res, "bench_gemm", f"{'mode':9s} {'pair':25s} {'M×N×K':17s} {'µs':>9s} {'TFLOP/s':>7s} {'×cuBLAS':>7s} "
                           f"{'path':12s} {'rel.err':>8s} {'bound':>8s} check",
        lambda r: (f"{r['op']:9s} {r['fmt']:25s} {r['shape']:17s} {f(r['us'], '9.1f')} {f(r['tflops'], '7.0f')} "
                   f"{f(r['vs_ref'], '7.2f')} {(r['path'] or '-'):12s} {f(r['err'], '8.1e')} "
                   f"{f(r['err_bound'], '8.1e')} {r['check'] or '-'}"))[1]


def moe_lines(res: Path) -> list[str]:
    return section(
        res, "bench_moe", f"{'mode':6s} {'experts, routing':21s} {'tokens':8s} {'µs':>9s} {'TFLOP/s':>7s} "
                          f"{'GB/s':>6s} {'×GEMMs':>6s} {'rel.err':>8s} {'bound':>8s} check",
        lambda r: (f"{r['op']:6s} {r['fmt']:21s} {r['shape']:8s} {f(r['us'], '9.1f')} {f(r['tflops'], '7.1f')} "
                   f"{f(r['gbps'], '6.0f')} {f(r['vs_ref'], '6.2f')} {f(r['err'], '8.1e')} {f(r['err_bound'], '8.1e')} "
                   f"{r['check'] or '-'}"))[1]


def overhead_lines(res: Path) -> list[str]:
    rows, out = section(
        res, "bench_overhead", f"{'call':30s} {'host µs':>8s} {'p90 µs':>8s} {'GPU µs':>8s} {'× torch':>7s}",
        lambda r: (f"{r['op']:30s} {f(r['host_us'], '8.1f')} {f(r['host_p90_us'], '8.1f')} {f(r['gpu_us'], '8.1f')} "
                   f"{f(r['x_torch'], '7.2f')}"))
    if rows:
        out.append(f"overhead: {sum(bool(r['ok']) for r in rows)} of {len(rows)} calls within 1.5x the torch op, "
                   f"{sum(r['status'] != 'ok' for r in rows)} raised")
    return out


def decode_lines(res: Path) -> list[str]:
    rows, out = section(
        res, "bench_decode", f"{'format':11s} {'batch':>5s} {'mode':6s} {'ms/token':>8s} {'tokens/s':>8s} "
                             f"{'× bf16':>6s} path",
        lambda r: (f"{r['fmt']:11s} {r['batch']:5d} {r['mode']:6s} {f(r['ms_per_token'], '8.2f')} "
                   f"{f(r['tokens_per_s'], '8.0f')} {f(r['x_bf16'], '6.2f')} {r['path'] or '-'}"))
    if rows:
        r0 = rows[0]
        out.insert(1, f"decode: {r0['model']}, {r0['layers']} layers, prompt {r0['prompt']}, {r0['tokens']} tokens")
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    res = Path(argv[0])
    wall = f" ({argv[1]} s)" if len(argv) > 1 else ""
    lines = [f"==== gpu_check summary{wall} ===="]
    status = res / ".status"
    lines += status.read_text().splitlines() if status.exists() else []
    lines += (tests_line(res) + quantize_lines(res) + gemm_lines(res) + moe_lines(res) + overhead_lines(res)
              + decode_lines(res))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
