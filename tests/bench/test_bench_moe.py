"""``mxkit bench moe`` on the CPU: cases, routing, the listing and the argument errors (the timed run needs a GPU;
scripts/gpu_check.sh runs it)."""

from __future__ import annotations

import argparse

import pytest
import torch

from mxkit.bench import moe


def parse(*argv):
    p = argparse.ArgumentParser()
    moe.add_arguments(p)
    return p.parse_args(list(argv))


def test_routing_is_fixed_per_case_and_zipf_is_skewed():
    tw, ids = moe.routing(4096, 128, "uniform")
    tw2, ids2 = moe.routing(4096, 128, "uniform")
    assert torch.equal(ids, ids2) and torch.equal(tw, tw2) and ids.dtype == torch.int32
    assert torch.allclose(tw.sum(-1), torch.ones(4096))
    assert all(len(set(r)) == moe.TOP_K for r in ids.tolist())  # distinct experts per token
    _, z = moe.routing(4096, 128, "zipf")
    counts = torch.bincount(z.flatten().long(), minlength=128)
    uni = torch.bincount(ids.flatten().long(), minlength=128)
    assert counts[0] == counts.max() and counts[:4].sum() > 4 * uni[:4].sum()


def test_cases_bytes_and_flops():
    c = moe.MoeCase("gpt-oss-120b", 1, "uniform", "w4a16")
    assert c.experts_hit() == 4 and c.E == 128
    assert c.nbytes() == int(4 * 3 * 2880 * 2880 * (0.5 + 1 / 32))
    assert c.flops == 2 * 4 * 3 * 2880 * 2880
    assert moe.MoeCase("gpt-oss-20b", 4096, "uniform", "w4a8").experts_hit() == 32
    cases = moe.cases_from_args(parse())
    assert {c.model for c in cases} == set(moe.MODELS) and {c.T for c in cases} == set(moe.TOKENS)
    assert all(c.routing == "uniform" or c.model == "gpt-oss-120b" for c in cases)
    quick = moe.cases_from_args(parse("--quick"))
    assert [c.T for c in quick] == [1, 1, 64, 64, 4096, 4096]


def test_list_and_errors(capsys):
    assert moe.run(parse("--quick", "--list")) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 6 and "T=4096" in out[-1] and "w4a8" in out[-1]
    assert moe.run(parse("--tokens", "0", "--list")) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "mxkit: error: token counts must be positive, got (0,)\n"
    with pytest.raises(SystemExit):
        parse("--models", "gpt-oss-7b")
