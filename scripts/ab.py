"""A/B timings of kernel config variants, taken through the config override (never by patching kernels).

Each ``--variant NAME:field=value,...`` runs its cases inside ``mxkit.kernels.opt_flags.override`` (a context
manager: every config chosen while it is open has those fields replaced; ``table=[]`` empties the per-GPU
tuning table); ``NAME:`` alone, or ``base``, is the default config. Every variant's output is checked against the reference
(bytes for quantize / dequantize, the float64 bound for GEMMs) before it is timed, with the harness of
``mxkit.bench`` (median after a read flush, then after a write flush). ``--rounds N`` repeats the whole
variant list N times, interleaved, and keeps each variant's fastest round. The table is printed last;
``--out DIR`` also writes ``DIR/ab.json``.

    PYTHONPATH=src python3 scripts/ab.py --op rowwise --formats mxfp4 --shapes 8192x8192,16384x16384 \\
        --variant base --variant "1x1024w1:block_r=1,block_c=1024,num_warps=1" --rounds 2
    PYTHONPATH=src python3 scripts/ab.py --op gemm --formats mxfp4 --shapes 8192x8192x8192 \\
        --variant base --variant "tuned:table=results/tune.json"

A GEMM variant takes one field, ``table``: a dispatch table (``mxkit tune gemm``'s JSON file or a mapping, merged
field by field into the packaged table as ``mxkit bench ... --table`` does; ``{}`` for the defaults alone) through
``mxkit.kernels.matmul_table.gemm_table_override``; the GEMM's schedules live there, not in
``opt_flags`` (its fields are the quantize / dequantize kernels').

Values are JSON (``4``, ``true``, ``null``, ``[1, 2]``), anything else a string. Field names are those of the
config dataclasses in ``mxkit.kernels``; the override rejects unknown ones.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
from pathlib import Path

import torch

from mxkit._files import write_text_atomic
from mxkit.bench import gemm, output, quantize, timing
from mxkit.formats import get_format

OPS = (*quantize.OPS, "gemm")


def parse_variant(text: str) -> tuple[str, dict]:
    """``"name:a=1,b=true"`` → ("name", {"a": 1, "b": True}); ``"base"`` → ("base", {})."""
    name, _, body = text.partition(":")
    fields = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"variant {text!r}: {item!r} is not field=value")
        try:
            fields[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            fields[key.strip()] = value.strip()
    return name.strip() or "base", fields


def override(fields: dict, op: str = "rowwise"):
    """The context manager ``mxkit.kernels.opt_flags.override`` with ``fields`` as the config fields of the op's
    family (``quantize=``, ``dequantize=``, or ``gemm=`` once the hook has it); a ``table`` field replaces the
    per-GPU tuning table (``table=[]``: the heuristics alone); a GEMM's ``table`` is merged into the dispatch table
    (``{}``: the packaged defaults alone). Exits with a clear message when the hook, or its
    family, is not in this checkout."""
    if not fields:
        return contextlib.nullcontext()
    if op == "gemm":  # (the GEMM's schedules are its dispatch table's, not opt_flags')
        extra = sorted(set(fields) - {"table"})
        if extra:
            sys.exit(f"scripts/ab.py: a GEMM variant takes one field, table (a dispatch table: mxkit tune gemm's "
                     f"JSON file, or {{}}), got {extra}")
        table = fields["table"]
        if not isinstance(table, (dict, str)):
            sys.exit(f"scripts/ab.py: table= for a GEMM variant is a JSON file or a mapping, got {table!r}")
        from mxkit.kernels.matmul_table import gemm_table, gemm_table_override, load_table, merge_tables

        if isinstance(table, str):
            try:
                table = load_table(table, f"table={table}")
            except ValueError as e:
                sys.exit(f"scripts/ab.py: table= for a GEMM variant: {e}")
        # a table of some keys merged into the one in force field by field (as `mxkit bench --table`); {} alone
        # replaces it: the packaged "default" entry for every GPU
        return gemm_table_override(merge_tables(gemm_table(), table) if table else {})
    try:
        from mxkit.kernels.opt_flags import override as hook
    except ImportError as e:
        sys.exit(f"scripts/ab.py: variants need mxkit.kernels.opt_flags.override, a context manager over the "
                 f"kernel configs; it is not importable here ({type(e).__name__}: {e})")
    fields, kw = dict(fields), {}
    if "table" in fields:
        kw["table"] = tuple(fields.pop("table") or ())
    family = {"dequantize": "dequantize", "gemm": "gemm"}.get(op, "quantize")
    params = inspect.signature(hook).parameters
    if fields:
        if family not in params:
            sys.exit(f"scripts/ab.py: opt_flags.override({', '.join(params)}) has no {family!r} fields to override")
        kw[family] = fields
    return hook(**kw)


def make_cases(args) -> list:
    if args.op == "gemm":
        return gemm.plan_cases(args.formats, ("ready",), args.shapes)
    fmts = [get_format(f).name for f in args.formats]
    return quantize.plan_cases((args.op,), fmts, args.shapes, torch.bfloat16)


def measure(case, fields: dict, ctx: timing.Context) -> dict:
    impls = gemm.IMPLS if isinstance(case, gemm.GemmCase) else quantize.IMPLS
    with override(fields, case.op if isinstance(case, quantize.Case) else "gemm"):
        row = timing.bench_case(case, ctx, {"mxkit": impls["mxkit"]})[0]
    return {"us": row.us, "us_write": row.us_write, "check": row.check, "status": row.status, "note": row.note}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", choices=OPS, required=True)
    p.add_argument("--formats", type=timing.csv_arg(str), required=True,
                   help="MX formats (quantize ops) or gemm pairs (" + ", ".join(gemm.PAIRS) + ")")
    p.add_argument("--shapes", type=timing.csv_arg(timing.parse_shape), required=True)
    p.add_argument("--variant", type=parse_variant, action="append", required=True, dest="variants")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--spin-us", type=float, default=100.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    names = [name for name, _ in args.variants]
    if len(set(names)) != len(names):  # (one name's rows would be merged, the faster shown)
        p.error(f"--variant names must differ (':' alone is 'base'), got {names}")
    try:
        cfg = timing.timing_config(args)  # (--rounds >= 1, finite --rep-ms > 0 and --spin-us >= 0)
        if args.out is not None:
            output.check_out_folder(args.out, ["ab.json"])
    except (ValueError, OSError) as e:
        p.error(str(e))
    if not torch.cuda.is_available():
        print("scripts/ab.py needs a CUDA GPU", file=sys.stderr)
        return 2
    copy_read, copy_write, _ = timing.copy_bandwidth(cfg)
    ctx = timing.Context(device="cuda", time_fn=lambda fn: timing.time_us(fn, cfg), sync=torch.cuda.synchronize,
                         copy_gbps=copy_read, copy_gbps_write=copy_write, compile=False)
    env = timing.environment()
    print(f"{env['gpu']} | torch {env['torch']} | triton {env['triton']} | copy {copy_read:.0f} / {copy_write:.0f} GB/s")
    best: dict[tuple, dict] = {}
    bad: dict[tuple, str] = {}  # a check that failed in any round (the fastest round's row alone would hide it)
    for rnd in range(1, args.rounds + 1):
        for case in make_cases(args):
            for name, fields in args.variants:
                got = measure(case, fields, ctx)
                key = (case.fmt_name, case.label, name)
                timing.progress(f"round {rnd} {case.op} {key}: {got}")
                if got["check"] in timing.BAD_CHECKS:
                    bad.setdefault(key, got["check"])
                if key not in best or (got["us"] or float("inf")) < (best[key]["us"] or float("inf")):
                    best[key] = dict(got, fields=fields)
    for key, check in bad.items():
        best[key]["check"] = check
    print(f"\n{'format':24s} {'shape':18s} {'variant':20s} {'µs':>9s} {'µs write':>9s} check  note")
    for (fmt, shape, name), r in best.items():
        print(f"{fmt:24s} {shape:18s} {name:20s} {timing.fmt_num(r['us'], '9.1f')} "
              f"{timing.fmt_num(r['us_write'], '9.1f')} {r['check'] or '-':6s} {r['note'][:60]}")
    if args.out is not None:
        rows = [dict(r, fmt=k[0], shape=k[1], variant=k[2]) for k, r in best.items()]
        write_text_atomic(args.out / "ab.json", json.dumps({"env": env, "op": args.op, "rows": rows}, indent=1) + "\n")
    return 1 if any(r["check"] in timing.BAD_CHECKS for r in best.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
