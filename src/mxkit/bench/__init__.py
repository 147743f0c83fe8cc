"""Benchmarks: one module per op (``quantize.py``, ``gemm.py``), timed by the shared harness in ``timing.py``.

``mxkit bench <op> [options]`` (the CLI calls :func:`add_bench_parser`) or ``python -m mxkit.bench <op>``.
An op module exposes ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int`` (exit status);
adding an op is one module plus its name in :data:`BENCH_MODULES`.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Optional, Sequence

__all__ = ["BENCH_MODULES", "Benchmark", "registry", "add_bench_parser", "add_op_parsers", "main"]

BENCH_MODULES = ("quantize", "gemm")  # in the order --help shows them


@dataclass(frozen=True)
class Benchmark:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]

    @classmethod
    def from_module(cls, mod: ModuleType) -> "Benchmark":
        missing = [a for a in ("NAME", "HELP", "add_arguments", "run") if not hasattr(mod, a)]
        if missing:
            raise TypeError(f"benchmark module {mod.__name__} lacks {', '.join(missing)}")
        return cls(mod.NAME, mod.HELP, mod.add_arguments, mod.run)


def registry(modules: Sequence[str] = BENCH_MODULES) -> dict[str, Benchmark]:
    """``{name: Benchmark}`` of the op modules (each imports torch, not Triton)."""
    out: dict[str, Benchmark] = {}
    for b in (Benchmark.from_module(importlib.import_module(f"{__name__}.{m}")) for m in modules):
        if b.name in out:
            raise ValueError(f"two benchmarks named {b.name!r}")
        out[b.name] = b
    return out


def add_op_parsers(subparsers, benchmarks: Optional[dict[str, Benchmark]] = None) -> None:
    """One sub-parser per benchmark, each with ``func=<run(args) -> int>``."""
    for b in (benchmarks or registry()).values():
        p = subparsers.add_parser(b.name, help=b.help, description=b.help)
        b.add_arguments(p)
        p.set_defaults(func=b.run)


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``bench`` on a CLI's ``subparsers``; ``mxkit bench <op> ...`` then parses to ``func(args)``."""
    p = subparsers.add_parser("bench", help="GPU benchmarks (median, L2 flushed, same-run peers)",
                              description="GPU benchmarks: median time after a read and a write L2 flush, against "
                                          "the copy bandwidth and peers measured in the same run.")
    ops = p.add_subparsers(dest="bench_op", metavar="OP", required=True)
    add_op_parsers(ops)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m mxkit.bench <op> [options]``: the same sub-commands without the mxkit CLI."""
    parser = argparse.ArgumentParser(prog="python -m mxkit.bench", description=__doc__.splitlines()[0])
    add_op_parsers(parser.add_subparsers(dest="bench_op", metavar="OP", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))
