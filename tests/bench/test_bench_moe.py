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


def _parser():
    p = argparse.ArgumentParser()
    moe.add_arguments(p)
    return p


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
    assert c.floor_bytes() == int(4 * 3 * 2880 * 2880 * (0.5 + 1 / 32))
    assert moe.MoeCase("gpt-oss-120b", 1, "uniform", "w8a16").floor_bytes() == int(4 * 3 * 2880 * 2880 * (1 + 1 / 32))
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
    # token counts below 1, past MAX_TOKENS (the listing made a T x E host tensor: 99999999999 tokens asked for
    # 12.8 TB) or given twice are usage errors
    with pytest.raises(SystemExit) as e:
        parse("--graph-tokens", "-5", "--list")
    assert e.value.code == 2 and "-5 is negative" in capsys.readouterr().err
    for bad, needle in (("0", "a token count is 1 to 1048576, got 0"),
                        ("99999999999", "a token count is 1 to 1048576, got 99999999999"), ("4,4", "lists 4 twice")):
        with pytest.raises(SystemExit) as e:
            parse("--tokens", bad, "--list")
        assert e.value.code == 2 and needle in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--models", "gpt-oss-7b")


def test_every_mode_counts_the_mx_bytes():
    """The floor is the touched experts' MX bytes in every mode, the fold modes too (whose kernels read an E4M3 copy
    of ~1.9x the bytes: as in bench gemm, the problem's bytes count); nbytes adds the bf16 tokens in and out."""
    T, H = 1, 2880
    mxfp4 = 4 * 3 * H * H * (0.5 + 1 / 32)  # (4 experts touched by 1 token: gate_up 2I x H and down H x I)
    for mode in ("w4a16", "w4a8", "mxfp4"):
        c = moe.MoeCase("gpt-oss-120b", T, "uniform", mode)
        assert c.experts_hit() == 4 and c.floor_bytes() == int(mxfp4) and c.nbytes() == int(mxfp4) + 4 * T * H
    assert moe.MoeCase("gpt-oss-120b", 1, "uniform", "w8a16").floor_bytes() == 4 * 3 * H * H * 33 // 32
    assert "whatever copy a path reads" in moe.__doc__
    labels = [c.title for c in moe.table_columns(())]
    assert "% of floor" in labels and "% copy" not in labels


def test_peers_are_checked(monkeypatch):
    """The full-layer bf16 peers get a sanity bound's verdict (none in mode mxfp4, checked against MXFP4 tokens);
    the × reference checks its rows against each row's expert alone, and a wrong one raises."""
    assert all(moe.IMPLS[p].checked for p in ("grouped-mm-bf16", "loop-bf16", "dequant-bf16"))
    assert moe._peer_bound(moe.MoeCase("gpt-oss-20b", 1, "uniform", "w4a16")) == moe.PEER_BOUND
    assert moe._peer_bound(moe.MoeCase("gpt-oss-20b", 1, "uniform", "mxfp4")) is False
    E, I, H, P = 3, 64, 64, 12
    monkeypatch.setattr(moe, "INTER", I)
    g = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(E, H, 2 * I, generator=g).bfloat16(), torch.randn(E, I, H, generator=g).bfloat16()
    w = moe.Weights(None, None, None, None, w1, w2)
    xs = torch.randn(P, H, generator=g).bfloat16()
    e = torch.tensor([0] * 5 + [2] * 7)
    h = torch.cat([(xs[:5].float() @ w1[0].float()[:, :I]), xs[5:].float() @ w1[2].float()[:, :I]]).bfloat16()
    y = torch.cat([h[:5].float() @ w2[0].float(), h[5:].float() @ w2[2].float()])
    moe._check_gemms(y, xs, w, e)
    with pytest.raises(RuntimeError, match="from each row's expert alone"):
        moe._check_gemms(y, xs, w, torch.tensor([0] * 6 + [2] * 6))  # (one row on another expert's weights)


def test_quick_fills_in_only_the_options_left_out():
    """--quick is the defaults of the options not given (scripts/gpu_check.sh passes MXKIT_MOE_ARGS after it)."""
    got = moe.cases_from_args(parse("--quick", "--models", "gpt-oss-20b", "--routings", "zipf", "--tokens", "16"))
    assert {(c.model, c.routing, c.T) for c in got} == {("gpt-oss-20b", "zipf", 16)} and len(got) == 2
    got = moe.cases_from_args(parse("--quick", "--tokens", "2,8", "--modes", "mxfp4"))
    assert [(c.model, c.routing, c.T, c.mode) for c in got] == [("gpt-oss-120b", "uniform", 2, "mxfp4"),
                                                                ("gpt-oss-120b", "uniform", 8, "mxfp4")]
    got = moe.cases_from_args(parse("--quick", "--models", "gpt-oss-20b"))
    assert {(c.model, c.routing) for c in got} == {("gpt-oss-20b", "uniform")} and {c.T for c in got} == {1, 64, 4096}
    assert {(c.T, c.routing) for c in moe.cases_from_args(parse("--tokens", "3"))} == {(3, "uniform"), (3, "zipf")}


def test_zipf_for_the_20b_and_no_case_is_an_error(capsys):
    """Routings given apply to every model given (zipf runs on GPT-OSS-20B); a selection of no case exits 2."""
    assert moe.run(parse("--models", "gpt-oss-20b", "--routings", "zipf", "--list")) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(moe.TOKENS) * 2 and all("gpt-oss-20b zipf" in line for line in out)
    zipf = moe.MoeCase("gpt-oss-20b", 64, "zipf", "w4a16")
    assert zipf.E == 32 and 0 < zipf.experts_hit() <= 32
    args = parse("--list")
    args.modes = ()
    assert moe.run(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("mxkit: error: the options select no case") and err.count("\n") == 1
    helps = {a.dest: a.help for a in _parser()._actions}
    assert "each for every model given" in helps["routings"] and "not given" in helps["quick"]


def test_no_backend_option_and_none_in_the_header(monkeypatch, capsys):
    """The MoE kernels take no backend: moe has no --backend (a usage error), and its header names none."""
    with pytest.raises(SystemExit) as e:
        parse("--backend", "reference")
    assert e.value.code == 2 and "--backend" in capsys.readouterr().err
    assert "backend" not in {a.dest for a in _parser()._actions}
    from mxkit.bench import timing

    monkeypatch.setattr(timing, "copy_bandwidth", lambda cfg: (4000.0, 3800.0, 1 << 30))
    with pytest.raises(SystemExit) as e:  # (none with a peer read "unknown peer 'none'", which help lists)
        parse("--peers", "none,cublas-loop")
    assert e.value.code == 2 and "'none' (no peers) goes alone" in capsys.readouterr().err
    args = parse("--peers", "none", "--plain")
    rc = timing.run_benchmark(args, [], moe.IMPLS, what="t", stem="bench_moe", peers=(), columns=moe.table_columns(()),
                              ref_impl=moe.REF_IMPL, title="T", device="cpu")
    out = capsys.readouterr().out
    assert rc == 0 and "0 cases; mxkit + no peers;" in out and "mxkit[" not in out
