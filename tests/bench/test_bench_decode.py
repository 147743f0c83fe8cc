"""``mxkit bench decode`` on CPU: the model builder (real configs, the cut to N layers, GPT-OSS with its MoE),
the greedy decode step against a full recompute, the whole command with a tiny Llama in eager mode (table, CSV,
JSON, PNG), and the argument errors. CUDA graphs need a GPU: only their argument checks run here."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import mxkit
from mxkit import bench, cli
from mxkit.bench import decode as bd
from mxkit.nn import MXLinear


def _args(argv=()):
    parser = argparse.ArgumentParser(prog="mxkit")
    bench.add_bench_parser(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(["bench", "decode", *argv])


def test_real_configs_are_written_here():
    """Built on the meta device (shapes, no memory): Llama-3-8B has its published 8,030,261,248 parameters."""
    m = bd.build_model("llama-3-8b", device="meta")
    cfg = m.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (4096, 14336, 32)
    assert cfg.num_attention_heads == 32
    assert (cfg.num_key_value_heads, cfg.vocab_size, cfg.max_position_embeddings) == (8, 128256, 8192)
    assert cfg.rope_parameters["rope_theta"] == 500000.0 and cfg._attn_implementation == "sdpa"
    assert sum(p.numel() for p in m.parameters()) == 8_030_261_248
    m = bd.build_model("gpt-oss-20b", device="meta")  # GPT-OSS-20B's published 20.91B parameters, experts included
    assert sum(p.numel() for p in m.parameters()) == 20_914_757_184
    m = bd.build_model("gpt-oss-20b", device="meta", layers=2)
    cfg = m.config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (2880, 64, 8, 64)
    assert cfg.sliding_window == 128 and cfg.layer_types == ["sliding_attention", "full_attention"]
    assert tuple(m.model.layers[0].self_attn.q_proj.weight.shape) == (4096, 2880) and m.lm_head.out_features == 201088
    experts = m.model.layers[0].mlp.experts
    assert (cfg.num_local_experts, cfg.num_experts_per_tok) == (32, 4)
    assert tuple(experts.gate_up_proj.shape) == (32, 2880, 5760) and tuple(experts.down_proj.shape) == (32, 2880, 2880)
    assert cfg._experts_implementation == "grouped_mm"  # off the CPU: no host sync, so CUDA graphs capture it


def test_build_model_tiny_llama():
    m = bd.build_model("tiny-llama", device="cpu")
    linears = [n for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)]
    assert len(linears) == 2 * 7 + 1 and linears[-1] == "lm_head" and m.config.hidden_size == 64
    assert next(m.parameters()).dtype is torch.bfloat16 and not m.training
    again, other = bd.build_model("tiny-llama", device="cpu"), bd.build_model("tiny-llama", device="cpu", seed=1)
    w = m.model.layers[0].mlp.up_proj.weight
    assert torch.equal(w, again.model.layers[0].mlp.up_proj.weight)  # every format starts from the same weights
    assert not torch.equal(w, other.model.layers[0].mlp.up_proj.weight)
    assert len(bd.build_model("tiny-llama", layers=1, device="cpu").model.layers) == 1
    with pytest.raises(ValueError, match="--layers=3: tiny-llama has 2 decoder layers"):
        bd.build_model("tiny-llama", layers=3, device="cpu")


def test_gpt_oss_formats_convert_the_moe():
    """A GPT-OSS model (tiny) keeps its MoE: an MX format quantizes the attention projections (not lm_head) and
    swaps each MoE block for an MXMoE with the experts in that format; ``+experts`` swaps the MoE blocks only.
    The converted models decode."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    from mxkit.nn import MXMoE

    m = bd.build_model("tiny-gpt-oss", device="cpu")
    assert all(isinstance(layer.mlp, GptOssMLP) for layer in m.model.layers)
    linears = [n.split(".")[-1] for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)]
    assert linears == ["q_proj", "k_proj", "v_proj", "o_proj"] * 2 + ["lm_head"]
    for fmt, mx_attention in (("mxfp4_e2m1", True), ("mxfp4_e2m1+experts", False), ("mxfp8_e4m3", True)):
        m = bd.build_model("tiny-gpt-oss", device="cpu")
        bd.quantize(m, fmt)
        for layer in m.model.layers:
            assert isinstance(layer.mlp, MXMoE) and layer.mlp.gate_up_mx.fmt.name == fmt.split("+")[0]
            assert isinstance(layer.mlp.router, torch.nn.Linear) and not isinstance(layer.mlp.router, MXLinear)
            assert isinstance(layer.self_attn.q_proj, MXLinear) == mx_attention
        assert not isinstance(m.lm_head, MXLinear)
        assert bd.gemm_path(m, 2) == ("reference + MXMoE" if mx_attention else "MXMoE")
        dec = bd.Decoder(m, 2, 4, 3)
        with torch.no_grad():
            dec.prefill()
            dec.step()
        assert dec.ids.shape == (2, 1) and int(dec.pos) == 5


def test_experts_format_needs_a_moe_model(capsys):
    rc = cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "eager", "--tokens", "1",
                   "--batches", "1", "--formats", "mxfp4+experts", "--plain"])
    out, err = capsys.readouterr()  # (a usage error before any model is built)
    assert rc == 2 and out == "" and "--formats mxfp4_e2m1+experts: tiny-llama has no MoE experts" in err
    with pytest.raises(ValueError, match="LlamaForCausalLM has no GptOssMLP to swap"):  # (quantize's own check)
        bd.quantize(bd.build_model("tiny-llama", device="cpu", dtype=torch.float32), "mxfp4_e2m1+experts")
    assert bd._mx_name("MXFP4+experts") == "mxfp4_e2m1+experts" and bd._mx_name("a8w8+fused") == "mxfp8xmxfp8+fused"


def test_decode_step_matches_a_full_recompute():
    """Greedy tokens from the static cache (one step per token, the position a device tensor) equal the argmax of
    the model run on the whole sequence without a cache (float32: no rounding ties between the two paths)."""
    m = bd.build_model("tiny-llama", device="cpu", dtype=torch.float32)
    dec = bd.Decoder(m, 3, 5, 4, seed=2)
    with torch.no_grad():
        dec.prefill()
        got = [dec.ids.clone()]
        for _ in range(4):
            dec.step()
            got.append(dec.ids.clone())
        seq = torch.cat([dec.prompt_ids, *got], 1)
        want = m(input_ids=seq[:, :-1]).logits.argmax(-1)[:, 4:]
        assert torch.equal(torch.cat(got, 1), want) and int(dec.pos) == 9
        dec.prefill()  # a second run starts over: the cache is reset, the first token is the same
        assert torch.equal(dec.ids, got[0]) and int(dec.pos) == 5


def test_gpt_oss_steps_with_their_own_masks_match_a_full_recompute():
    """GPT-OSS (eager attention): the steps pass masks made on the device (transformers' eager mask builder is not
    capturable). The greedy tokens equal the argmax of a full recompute, and each step's logits those of the same
    step with transformers' own masks (float32)."""
    m = bd.build_model("tiny-gpt-oss", device="cpu", dtype=torch.float32)
    ours, theirs = bd.Decoder(m, 2, 5, 4, seed=3), bd.Decoder(m, 2, 5, 4, seed=3)
    assert ours.mask is not None and ours.mask.shape == (2, 1, 1, 5 + 4 + bd.WARMUP_STEPS)
    theirs.mask = None
    logits = {id(ours): [], id(theirs): []}
    def recording(dec):
        def forward(**kw):
            out = m(**kw)
            logits[id(dec)].append(out.logits)
            return out
        return forward

    for dec in (ours, theirs):
        dec.step_forward = recording(dec)
    with torch.no_grad():
        got = []
        for dec in (ours, theirs):
            dec.prefill()
            got.append([dec.ids.clone()])
            for _ in range(4):
                dec.step()
                got[-1].append(dec.ids.clone())
        assert torch.equal(ours.mask[0, 0, 0] == 0, torch.arange(ours.mask.shape[-1]) <= 8)  # the last step's: pos 8
        seq = torch.cat([ours.prompt_ids, *got[0]], 1)
        want = m(input_ids=seq[:, :-1]).logits.argmax(-1)[:, 4:]
    assert torch.equal(torch.cat(got[0], 1), want) and torch.equal(torch.cat(got[1], 1), want)
    assert len(logits[id(ours)]) == 4 and all(torch.allclose(a, b, rtol=1e-5, atol=1e-5)
                                              for a, b in zip(logits[id(ours)], logits[id(theirs)]))
    assert bd.Decoder(bd.build_model("tiny-llama", device="cpu"), 1, 2, 2).mask is None  # sdpa: transformers' masks
    assert bd.Decoder(m, 1, 100, 100).mask is None  # past the sliding window: transformers' masks


def test_time_decode_brackets_the_steps_with_syncs():
    events = []
    dec = type("D", (), {"prefill": lambda self: events.append("prefill")})()
    clock = iter([0.0, 2.0, 10.0, 13.0, 20.0, 21.0])
    gc_on = []
    s = bd.time_decode(dec, lambda: events.append("step") or gc_on.append(bd.gc.isenabled()), 2, 3,
                       lambda: events.append("sync"), clock=lambda: next(clock))
    assert s == 2.0 and events == ["prefill", "sync", "step", "step", "sync"] * 3  # median of 2, 3, 1 s
    assert gc_on == [False] * 6 and bd.gc.isenabled()  # the collector off while timed, back on after


@pytest.mark.parametrize("order", bd.ORDERS)
def test_whole_command_on_cpu(order, tmp_path, capsys, monkeypatch):
    seen = []
    real = mxkit.quantize_model
    monkeypatch.setattr(mxkit, "quantize_model",
                        lambda model, fmt, **kw: seen.append((fmt, kw)) or real(model, fmt, **kw))
    rc = cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "eager", "--tokens", "3",
                   "--batches", "1,2", "--prompt", "4", "--out", str(tmp_path), "--plain", "--order", order])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "× bf16" in out and "tokens/s" in out
    assert "target (" not in out  # (issue #23's targets are judged on a GPU run only)
    assert [f for f, _ in seen] == ["mxfp4_e2m1", "mxfp8_e4m3"] and all(kw["skip"] == "lm_head" for _, kw in seen)
    doc = json.loads((tmp_path / "bench_decode.json").read_text())
    rows = doc["rows"]
    assert [(r["fmt"], r["batch"], r["mode"]) for r in rows] == [
        (f, b, "eager") for f in ("bf16", "mxfp4_e2m1", "mxfp8_e4m3") for b in (1, 2)]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 and r["layers"] == 2 and r["tokens"] == 3 for r in rows)
    for r in rows:  # tokens/s = batch · tokens / time, ms per token = time / tokens
        assert r["tokens_per_s"] * r["ms_per_token"] / 1e3 == pytest.approx(r["batch"])
        base = next(b for b in rows if b["fmt"] == "bf16" and b["batch"] == r["batch"])
        if order == "sequential":  # the ratio of the medians
            assert r["x_bf16"] == pytest.approx(r["tokens_per_s"] / base["tokens_per_s"]) and r["x_bf16_lo"] is None
        else:  # the median of the per-repeat ratios, inside their range
            assert 0 < r["x_bf16_lo"] <= r["x_bf16"] <= r["x_bf16_hi"]
            assert r["fmt"] != "bf16" or r["x_bf16_lo"] == r["x_bf16_hi"] == 1.0
        assert r["path"] == ("" if r["fmt"] == "bf16" else "reference")  # CPU: the reference GEMM
    assert doc["config"]["model"] == "tiny-llama" and doc["config"]["repeats"] == 3
    assert (tmp_path / "bench_decode.csv").read_text().count("\n") == 7
    assert (tmp_path / "bench_decode.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_interleaved_order_and_ratios(monkeypatch, capsys):
    """--order interleaved: every model built first; repeat k of every format before repeat k + 1, the order
    rotated by one a repeat; × bf16 the log-space median of the per-repeat ratios (so a drift that doubles every
    time between repeats divides out); a format whose run fails gets an error row, the others go on."""
    built, timed = {}, []
    real_build = bd._build
    monkeypatch.setattr(bd, "_build", lambda args, fmt: built.setdefault(fmt, real_build(args, fmt)))
    monkeypatch.setattr(bd, "_prepare", lambda dec, mode, args, sync, **kw: dec.step)
    speed = {"bf16": [1.0] * 4, "mxfp4_e2m1": [2.0] * 4, "mxfp8_e4m3": [1.2, 1.5, 1.2, 1.5]}

    def fake_time(dec, step, tokens, repeats, sync):
        assert len(built) == 3 and repeats == 1  # every model held before the first timing
        fmt, batch = next(f for f, m in built.items() if m is dec.model), dec.ids.shape[0]
        k = sum(t == (fmt, batch) for t in timed)
        timed.append((fmt, batch))
        if fmt == "mxfp8_e4m3" and batch == 2 and k == 2:
            raise RuntimeError("lost the GPU")
        return 2.0 ** k / speed[fmt][k]  # the host twice as slow each repeat

    monkeypatch.setattr(bd, "time_decode", fake_time)
    rc = cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "eager", "--tokens", "2",
                   "--batches", "1,2", "--repeats", "4", "--plain"])
    assert rc == 1 and "eager: RuntimeError: lost the GPU" in capsys.readouterr().out
    f = ["bf16", "mxfp4_e2m1", "mxfp8_e4m3"]
    rotated = [f, f[1:] + f[:1], f[2:] + f[:2], f]
    assert timed[:12] == [(f, 1) for f in sum(rotated, [])]
    assert timed[12:] == [(f, 2) for f in sum(rotated[:2], []) + ["mxfp8_e4m3", "bf16", "mxfp4_e2m1", "mxfp4_e2m1",
                                                                   "bf16"]]  # (two left: rotated by 3 % 2)


def test_interleaved_rows(monkeypatch, tmp_path):
    """The rows of an interleaved run: medians of the runs, × bf16 from the per-repeat ratios and their range."""
    built = {}
    real_build = bd._build
    monkeypatch.setattr(bd, "_build", lambda args, fmt: built.setdefault(fmt, real_build(args, fmt)))
    monkeypatch.setattr(bd, "_prepare", lambda dec, mode, args, sync, **kw: dec.step)
    speed = {"bf16": [1.0] * 4, "mxfp4_e2m1": [2.0] * 4, "mxfp8_e4m3": [1.2, 1.5, 1.2, 1.5]}
    count = {}

    def fake_time(dec, step, tokens, repeats, sync):
        fmt = next(f for f, m in built.items() if m is dec.model)
        k = count[fmt] = count.get(fmt, -1) + 1
        return 2.0 ** k / speed[fmt][k]

    monkeypatch.setattr(bd, "time_decode", fake_time)
    assert cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "eager", "--tokens",
                     "2", "--batches", "1", "--repeats", "4", "--plain", "--out", str(tmp_path)]) == 0
    rows = {r["fmt"]: r for r in json.loads((tmp_path / "bench_decode.json").read_text())["rows"]}
    assert rows["bf16"]["ms_per_token"] == pytest.approx(1e3 * 3.0 / 2)  # median of 1, 2, 4, 8 s over 2 tokens
    assert (rows["mxfp4_e2m1"]["x_bf16"], rows["mxfp4_e2m1"]["x_bf16_lo"], rows["mxfp4_e2m1"]["x_bf16_hi"]) == (
        pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0))  # the ratio of the medians would be the same
    assert rows["mxfp8_e4m3"]["x_bf16"] == pytest.approx((1.2 * 1.5) ** 0.5)  # geometric mean of the middle two
    assert (rows["mxfp8_e4m3"]["x_bf16_lo"], rows["mxfp8_e4m3"]["x_bf16_hi"]) == (pytest.approx(1.2),
                                                                                pytest.approx(1.5))


def _decoder_out_of_memory_at_batch_2(monkeypatch) -> None:
    """bd.Decoder raising out of memory at batch 2 for a quantized model (its cache does not fit)."""
    real = bd.Decoder

    def decoder(model, batch, *a, **kw):
        if batch == 2 and isinstance(model.model.layers[0].mlp.up_proj, mxkit.nn.MXLinear):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(model, batch, *a, **kw)

    monkeypatch.setattr(bd, "Decoder", decoder)


def test_interleaved_decoder_failure_is_that_formats_rows(monkeypatch, capsys):
    """A format whose decoder cannot be made at a batch (its cache out of memory) gets error rows there; the other
    formats and batches run."""
    _decoder_out_of_memory_at_batch_2(monkeypatch)
    rc = cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "eager", "--tokens", "1",
                   "--batches", "1,2", "--repeats", "1", "--formats", "bf16,mxfp4", "--plain"])
    captured = capsys.readouterr()
    assert rc == 1 and "decoder: OutOfMemoryError: CUDA out of memory" in captured.out
    assert "mxkit: error: 1 run(s) failed: mxfp4_e2m1/b2/eager" in captured.err


def test_sequential_decoder_failure_is_that_batchs_rows(monkeypatch, capsys, tmp_path):
    """--order sequential (also the fallback where the models do not fit together): a batch whose decoder cannot be
    made (its cache out of memory) gets error rows; the later batches and formats run (the exception ended the whole
    run, with a traceback, before)."""
    _decoder_out_of_memory_at_batch_2(monkeypatch)
    rc = cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "eager", "--tokens", "1",
                   "--batches", "1,2", "--repeats", "1", "--formats", "bf16,mxfp4,mxfp8", "--order", "sequential",
                   "--plain", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 1 and "Traceback" not in captured.err
    assert "2 run(s) failed: mxfp4_e2m1/b2/eager, mxfp8_e4m3/b2/eager" in captured.err
    rows = json.loads((tmp_path / "bench_decode.json").read_text())["rows"]
    got = {(r["fmt"], r["batch"]): r["status"] for r in rows}
    assert got == {("bf16", 1): "ok", ("bf16", 2): "ok", ("mxfp4_e2m1", 1): "ok", ("mxfp4_e2m1", 2): "error",
                   ("mxfp8_e4m3", 1): "ok", ("mxfp8_e4m3", 2): "error"}


def test_interleaved_falls_back_to_sequential_when_the_models_do_not_fit(monkeypatch, capsys, tmp_path):
    real_build, calls = bd._build, []

    def build(args, fmt):
        calls.append(fmt)
        if fmt == "mxfp8_e4m3" and calls.count(fmt) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real_build(args, fmt)

    monkeypatch.setattr(bd, "_build", build)
    assert cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "eager", "--tokens",
                     "1", "--batches", "1", "--repeats", "1", "--plain", "--out", str(tmp_path)]) == 0
    assert "do not fit the GPU together: timing them one at a time" in capsys.readouterr().out
    assert calls == ["bf16", "mxfp4_e2m1", "mxfp8_e4m3"] * 2
    doc = json.loads((tmp_path / "bench_decode.json").read_text())
    assert doc["config"]["order"] == "sequential" and len(doc["rows"]) == 3
    assert all(r["status"] == "ok" and r["x_bf16_lo"] is None for r in doc["rows"])


def test_quantize_head_and_failed_runs(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(mxkit, "quantize_model", lambda model, fmt, **kw: seen.append(kw["skip"]))
    rc = cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "eager", "--tokens", "1",
                   "--batches", "1", "--formats", "mxfp4", "--quantize-head", "--plain"])
    assert rc == 0 and seen == [None]
    monkeypatch.setattr(bd.Decoder, "step", lambda self: (_ for _ in ()).throw(RuntimeError("capture failed\nmore")))
    rc = cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "eager", "--tokens", "1",
                   "--batches", "1", "--formats", "bf16", "--plain"])
    captured = capsys.readouterr()
    assert rc == 1 and "eager: RuntimeError: capture failed" in captured.out and "bf16/b1/eager" in captured.err


@pytest.mark.parametrize("argv, needle", [
    (["--model", "llama-3-70b"], "unknown model 'llama-3-70b'"),
    (["--formats", "bf16,mxfp9"], "unknown MX format 'mxfp9'"),
    (["--batches", "1,0"], "0 is not a positive integer"),
    (["--modes", "fast"], "unknown mode 'fast'"),
    (["--layers", "0"], "invalid positive value"),
    (["--formats", "bf16,mxfp4,mxfp4_e2m1"], "lists 'mxfp4_e2m1' twice"),
    (["--batches", "1,16,1"], "lists 1 twice"),
    # (out of range: accepted, then every row failed and the command exited 1)
    (["--batches", "1,9223372036854775808"], "is too large (at most 2147483647)"),
    (["--prompt", "9223372036854775808"], "invalid positive value"),
    (["--seed", "99999999999999999999"], "invalid seed value"),
    (["--seed", "-1"], "invalid seed value"),
])
def test_bad_options_are_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        _args(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["--layers", "33"], "--layers=33: llama-3-8b has 32 decoder layers"),
    (["--device", "cpu"], "--modes graphs needs --device cuda"),
    (["--model", "gpt-oss-20b", "--tokens", "120"], "must fit the sliding window of 128"),
    # (compiled is captured and replayed on CUDA too: a sliding layer's length frozen at the capture)
    (["--model", "gpt-oss-20b", "--prompt", "100", "--tokens", "30", "--modes", "compiled"],
     "gpt-oss-20b with compiled: --prompt + --tokens + 2 = 132 must fit the sliding window of 128"),
    (["--model", "tiny-llama", "--formats", "bf16,mxfp4+experts"], "--formats mxfp4_e2m1+experts: tiny-llama has "
                                                                   "no MoE experts"),
])
def test_options_that_do_not_go_together(argv, needle, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the checks come before any GPU work
    assert cli.main(["bench", "decode", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxkit: error: ") and err.count("\n") == 1
    assert needle in err and "Traceback" not in err


def test_out_that_is_a_file_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bd, "run_format", lambda *a: pytest.fail("the run started"))
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "eager",
                     "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err == f"mxkit: error: --out '{afile}' is a file; it names the folder the results go into\n"
    assert afile.read_text() == "keep"


def test_quick_defaults_and_no_cuda(monkeypatch, capsys):
    args = _args(["--quick"])
    bd.resolve(args)
    assert (args.layers, args.tokens, args.repeats, args.prompt) == (4, 16, 1, 8)
    args = _args(["--quick", "--tokens", "32"])
    bd.resolve(args)
    assert (args.layers, args.tokens) == (4, 32)
    args = _args(["--quick", "--model", "tiny-llama"])  # a model of fewer than 4 layers keeps them all
    bd.resolve(args)
    assert (args.layers, args.tokens) == (2, 16)
    args = _args([])
    bd.resolve(args)
    assert (args.layers, args.tokens, args.repeats) == (None, 64, 3)
    assert args.formats == ("bf16", "mxfp4_e2m1", "mxfp8_e4m3") and args.batches == (1, 16, 64)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "decode", "--quick"]) == 2
    assert "mxkit bench decode needs a CUDA GPU" in capsys.readouterr().err
    # --list prints the runs without a GPU (it printed the top-level usage: no such option)
    assert cli.main(["bench", "decode", "--quick", "--list", "--formats", "bf16,mxfp4", "--batches", "1,16",
                     "--modes", "graphs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("llama-3-8b, 4 layers, prompt 8, 16 tokens") and len(out) == 5
    assert [ln.split() for ln in out[1:]] == [[f, "batch", b, "graphs"] for f in ("bf16", "mxfp4_e2m1")
                                              for b in ("1", "16")]
    assert cli.main(["bench", "decode", "--list", "--layers", "99"]) == 2  # (options still checked)
    capsys.readouterr()
    # a cache past the model's positions (--prompt 99999999 ran out of memory on CPU, no message)
    for prompt, tokens, ok in ((99999999, 1, False), (8190, 1, False), (8189, 1, True), (8000, 64, True)):
        assert cli.main(["bench", "decode", "--list", "--model", "tiny-llama", "--prompt", str(prompt),
                         "--tokens", str(tokens)]) == (0 if ok else 2), prompt
        err = capsys.readouterr().err
        assert ok or f"= {prompt + tokens + bd.WARMUP_STEPS} is past its max_position_embeddings of 8192" in err


def test_gemm_path_names_the_first_mx_layer():
    m = bd.build_model("tiny-llama", device="cpu")
    assert bd.gemm_path(m, 4) == ""
    mxkit.quantize_model(m, "mxfp4", skip="lm_head", compute_qsnr=False, progress=False)
    assert isinstance(m.model.layers[0].self_attn.q_proj, MXLinear) and isinstance(m.lm_head, torch.nn.Linear)
    assert bd.gemm_path(m, 4) == "reference"


def test_gemm_path_of_an_a8w8_model_plans_mxfp8_activations(monkeypatch):
    """With MXFP8 activations the plan is the one for the quantized x (a8w8-mma on a GPU), not for bf16 x."""
    m = bd.build_model("tiny-llama", device="cpu")
    mxkit.quantize_model(m, "mxfp8", act_format="mxfp8", skip="lm_head", compute_qsnr=False, progress=False)
    seen = []
    real = mxkit.gemm_plan
    monkeypatch.setattr(mxkit, "gemm_plan", lambda a, b: seen.append(a) or real(a, b))
    assert bd.gemm_path(m, 4) == "reference"
    assert isinstance(seen[0], mxkit.MXTensor) and seen[0].fmt.name == "mxfp8_e4m3"


def test_compiled_mode_compiles_the_step_only(monkeypatch, capsys):
    """--modes compiled: the step runs through torch.compile of the model's forward (dynamic=False), the prefill
    and the other modes through the model itself (torch.compile replaced by a recording stand-in: compiling
    takes a minute on CI's CPUs; the GPU run compiles for real)."""
    compiled, calls = [], []

    def fake_compile(fn, **kw):
        compiled.append(kw)

        def run(**a):
            calls.append(tuple(a["input_ids"].shape))
            return fn(**a)
        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    rc = cli.main(["bench", "decode", "--model", "tiny-llama", "--device", "cpu", "--modes", "compiled,eager",
                   "--formats", "bf16", "--tokens", "2", "--repeats", "1", "--batches", "3", "--plain"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert compiled == [{"dynamic": False}]
    assert calls and set(calls) == {(3, 1)}  # decode steps only: the (3, 8) prefill stays eager
    n = len(calls)
    assert "target (compiled, batch 1)" not in out  # (no MXFP4 row)
    assert " compiled " in out and " eager " in out and n == 2 + 2  # untimed run + timed run, none for eager
