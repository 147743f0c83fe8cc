"""Benchmarks: one module per op family (``quantize``, ``gemm``, ``moe``, ``overhead``, ``decode``). The kernel benches
share the harness in ``timing.py``; every bench writes its table and files through ``output.py``.

``mxkit bench <op> [options]`` (``python -m mxkit bench`` from source). A bench module exposes ``NAME``,
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` (exit status); adding one is a module plus its
name in :data:`BENCH_MODULES`. Importing a module imports torch only (not transformers).
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType
from typing import Optional, Sequence

__all__ = ["BENCH_MODULES", "registry", "add_bench_parser"]

BENCH_MODULES = ("quantize", "gemm", "moe", "overhead", "decode")  # in the order --help shows them


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
        sub.set_defaults(func=b.run)
    return p
