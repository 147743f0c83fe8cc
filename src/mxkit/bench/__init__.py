"""Benchmarks: one module per op family (``quantize``, ``gemm``, ``moe``, ``overhead``, ``decode``). The kernel benches
share the harness in ``timing.py``; every bench writes its table and files through ``output.py``.

``mxkit bench <op> [options]`` (``python -m mxkit bench`` from source). A bench module exposes ``NAME``,
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` (exit status); adding one is a module plus its
name in :data:`BENCH_MODULES`. Importing a module imports torch only (not transformers).
"""

from __future__ import annotations

import argparse
import functools
import importlib
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

__all__ = ["BENCH_MODULES", "registry", "add_bench_parser"]

BENCH_MODULES = ("quantize", "gemm", "moe", "overhead", "decode")  # in the order --help shows them
TABLE_BENCHES = ("gemm", "moe", "overhead", "decode")  # the benches that take --table (their paths read it)


def registry(modules: Sequence[str] = BENCH_MODULES) -> dict[str, ModuleType]:
    """``{NAME: module}`` of the bench modules."""
    return {m.NAME: m for m in (importlib.import_module(f"{__name__}.{name}") for name in modules)}


def add_bench_parser(subparsers, benchmarks: Optional[dict[str, ModuleType]] = None) -> argparse.ArgumentParser:
    """Register ``bench`` on a CLI's ``subparsers``: one sub-command per benchmark, ``func=<run(args) -> int>``."""
    p = subparsers.add_parser("bench", help="GPU benchmarks: kernels, host overhead per call, end-to-end decode",
                              description="GPU benchmarks: kernels (median after a read and a write L2 flush, against "
                                          "the copy bandwidth and peers of the same run), host overhead per call, "
                                          "end-to-end decode of a real model architecture.")
    ops = p.add_subparsers(dest="bench_op", metavar="OP", required=True)
    for b in (benchmarks or registry()).values():
        sub = ops.add_parser(b.NAME, help=b.HELP, description=b.HELP)
        b.add_arguments(sub)
        if b.NAME in TABLE_BENCHES:
            sub.add_argument("--table", default=None, metavar="JSON",
                             help="run under this GEMM dispatch table (a file `mxkit tune gemm` wrote) instead of "
                                  "the packaged one; its GPU's missing keys take the packaged default's values")
            sub.set_defaults(func=functools.partial(_run_with_table, b.run))
        else:
            sub.set_defaults(func=b.run)
    return p


def _run_with_table(run, args) -> int:
    """``run(args)`` under ``args.table`` (:func:`mxkit.kernels.matmul.gemm_table_override`) when given. Raises
    ValueError naming the file when it cannot be read as a JSON table of ``{GPU name: entry}``."""
    if args.table is None:
        return run(args)
    import json

    from ..kernels.matmul import gemm_table_override

    try:
        table = json.loads(Path(args.table).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--table {args.table!r} cannot be read as a JSON dispatch table: {e}") from None
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ValueError(f"--table {args.table!r} is not a dispatch table ({{GPU name: entry}}, as `mxkit tune gemm` "
                         f"writes)")
    from . import output

    with gemm_table_override(table):
        output.TABLE_SOURCE = str(args.table)
        try:
            return run(args)
        finally:
            output.TABLE_SOURCE = None
