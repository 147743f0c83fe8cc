"""A/B of the C++ fast call's output allocation: ``at::detail::empty_generic`` with the learned allocator (the
default) against ``at::empty`` (``fast_alloc(False)``), in one process, every call of ``mxkit bench overhead``
timed both ways in the same interleaved rounds (the host's speed drifts within minutes on the device machines).

    PYTHONPATH=src python benchmarks/probes/fast_alloc_ab.py [--calls 3000] [--rounds 10]

Prints ``mxkit bench overhead``'s table (host µs, × ``x * 2`` in the same round) with each call twice.
"""

from __future__ import annotations

import argparse

import torch

from mxkit.bench import output
from mxkit.bench.overhead import CALLS, COLUMNS, TARGET, Call, measure_rounds
from mxkit.kernels import fast_call


def toggled(call: Call, flag: bool, mod) -> Call:
    def make(device: str):
        fn, note = call.make(device)

        def run():
            mod.fast_alloc(flag)
            return fn()

        return run, note

    return Call(f"{call.name} [{'empty_generic' if flag else 'at::empty'}]", call.shape, make)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=10)
    a = p.parse_args()
    mod = fast_call.module(wait=True)
    assert mod is not None, "the C++ fast call did not build"
    todo = [CALLS[0]]
    for c in CALLS[1:]:
        if "M=256" not in c.name:  # (prefill calls: their kernels, not the host, take the time)
            todo += [toggled(c, True, mod), toggled(c, False, mod)]
    args = argparse.Namespace(calls=a.calls, rounds=a.rounds, warmup=50, sync_every=64)
    rows = measure_rounds(todo, args)
    mod.fast_alloc(True)
    for r in rows:
        r.ok = None if r.x_torch is None else r.x_torch <= TARGET
    print(output.env_line(output.environment()))
    output.render_table(rows, COLUMNS, plain=True, title=f"fast_alloc A/B, torch op {rows[0].host_us:.1f} us")
    print("outputs made by empty_generic:", mod.fast_alloc_count())


if __name__ == "__main__":
    main()
