"""Benchmarks: one module per op family (``quantize``, ``gemm``, ``moe``, ``overhead``, ``decode``). The kernel benches
share the harness in ``timing.py``; every bench writes its table and files through ``output.py``.

``mxkit bench <op> [options]`` (``python -m mxkit bench`` from source). A bench module exposes ``NAME``,
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` (exit status); adding one is a module plus its
name in :data:`BENCH_MODULES`. Importing a module imports torch only (not transformers).
"""

from __future__ import annotations

import argparse
import importlib
import sys
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
            sub.add_argument("--table", dest="gemm_table", default=None, metavar="JSON",
                             help="run under this GEMM dispatch table (a file `mxkit tune gemm` wrote, or an edited "
                                  "copy of the packaged one), merged field by field into the packaged table "
                                  "(mxkit.kernels.matmul_table.merge_tables)")
        sub.set_defaults(func=b.run)
    return p


def run_with_table(run, args) -> int:
    """``run(args)``, under ``args.gemm_table`` (``--table``) merged into the dispatch table in force (the packaged one)
    (:func:`mxkit.kernels.matmul_table.merge_tables`, :func:`~mxkit.kernels.matmul.gemm_table_override`) when
    given, the file's resolved path recorded as the environment's ``gemm_table``. Raises ValueError naming the
    file when it cannot be read as a dispatch table (:func:`~mxkit.kernels.matmul_table.check_table`), before
    ``run`` starts; warns on stderr where the table has no entry for the GPU in use (nor a ``"default"`` one)."""
    path = getattr(args, "gemm_table", None)
    if path is None:
        return run(args)
    import torch

    from ..kernels.matmul_table import gemm_table, gemm_table_override, load_table, merge_tables
    from . import output

    table = load_table(path, f"--table {str(path)!r}")
    if torch.cuda.is_available():  # (exact names, as the lookups: matmul_table._entry)
        name = torch.cuda.get_device_name()
        if name not in table and "default" not in table:
            gpus = [g for g in table if not str(g).startswith("_")]
            print(f"mxkit: warning: --table {str(path)!r} has no entry for this GPU ({name!r}) nor a 'default' one "
                  f"(its entries: {', '.join(map(repr, gpus)) or 'none'}; names match exactly): it changes nothing "
                  f"here", file=sys.stderr)
    held = output.TABLE_SOURCE
    with gemm_table_override(merge_tables(gemm_table(), table)):
        output.TABLE_SOURCE = str(Path(path).resolve())
        try:
            return run(args)
        finally:
            output.TABLE_SOURCE = held
