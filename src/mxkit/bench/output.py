"""What every benchmark writes: the environment, a table (rich when installed, :mod:`mxkit._table`), CSV, JSON
and a PNG bar chart (matplotlib). Rows are dataclasses of any kind (:class:`mxkit.bench.timing.Row`, the
overhead and decode rows); a missing number is ``""`` in the CSV, ``null`` in the JSON, ``n/a`` in the table; a
non-finite one (a NaN error, an infinite ratio) is ``nan`` / ``inf`` in the CSV and the table, ``null`` in the JSON
(strict JSON has no NaN). Argument errors are one ``mxkit: error: …`` line on stderr, exit status 2
(:func:`usage_error`); output paths are checked before a run (:func:`check_out_folder`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import io
import json
import math
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from .._files import check_nonempty, check_writable, write_bytes_atomic, write_text_atomic


def progress(msg: str) -> None:
    """A timestamped progress line on stderr (the table goes to stdout)."""
    print(f"[{_dt.datetime.now(_dt.timezone.utc):%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def _git_commit() -> Optional[str]:
    """The mxkit checkout's commit (``+dirty`` with uncommitted changes), or None outside a git checkout (an
    installed wheel, a copied tree without .git, no git)."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    if not (root / "src" / "mxkit").is_dir():  # (an installed copy: git walked up into the repository holding it)
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=5)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


# the dispatch table a bench runs under: None (the packaged one) or the --table file (set by mxkit.bench's runner)
TABLE_SOURCE: Optional[str] = None


def environment() -> dict:
    """GPU (name, capability, SMs, driver), library versions, mxkit's commit, the GEMM dispatch table (``packaged``
    or the ``--table`` file), date (UTC), host: printed above a table and stored in the JSON."""
    import mxkit

    try:
        import triton
    except Exception:
        triton = None
    p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    driver = None
    if p is not None:
        try:
            driver = torch._C._cuda_getDriverVersion()  # (the CUDA driver's API version, e.g. 13000)
        except Exception:
            driver = None
    return {"date_utc": f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ}", "host": platform.node(),
            "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": getattr(triton, "__version__", None), "mxkit": getattr(mxkit, "__version__", None),
            "commit": _git_commit(), "gemm_table": TABLE_SOURCE or "packaged", "driver": driver,
            "gpu": p and p.name, "capability": p and f"{p.major}.{p.minor}", "sm_count": p and p.multi_processor_count}


def reason(e: BaseException) -> str:
    """``"Type: first line of the message"``, at most 160 characters: why a row did not run."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"[:160]


def env_line(env: dict) -> str:
    keys = ("gpu", "capability", "torch", "cuda", "triton", "commit", "date_utc")
    table = env.get("gemm_table")
    return " | ".join([f"{k} {env.get(k)}" for k in keys] + ([f"gemm_table {table}"] if table not in (None,
                                                                                          "packaged") else []))


def usage_error(message: str) -> int:
    """Print ``mxkit: error: message`` on stderr (as the ``mxkit`` CLI does); returns the exit status 2. With
    ``MXKIT_TRACEBACK=1`` raises RuntimeError(message) instead (a traceback and exit status 1, as the CLI's other
    errors then)."""
    if os.environ.get("MXKIT_TRACEBACK") == "1":  # (mxkit.cli.main refuses other values)
        raise RuntimeError(message)
    print(f"mxkit: error: {message}", file=sys.stderr)
    return 2


def fmt_num(v: Optional[float], spec: str) -> str:
    """``v`` formatted with ``spec``; ``n/a`` when it is None (did not run), ``nan`` / ``inf`` / ``-inf`` as such."""
    return "n/a" if v is None else format(v, spec)


@dataclass(frozen=True)
class Column:
    """A table column: ``get(line) -> str`` for each line the table is given."""

    title: str
    get: Callable[[Any], str]
    right: bool = True


def render_table(lines: Sequence[Any], columns: Sequence[Column], *, title: str = "", plain: bool = False,
                 file=None) -> str:
    """Print ``lines`` with ``columns`` (rich when installed and not ``plain``); returns the plain text."""
    from .._table import print_table

    cells = [[c.get(d) for c in columns] for d in lines]
    return print_table([c.title for c in columns], cells, title=title or None, plain=plain, file=file,
                       right=[c.title for c in columns if c.right])


def _folder_made(path) -> Path:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return Path(path)


def out_folder(text: str) -> Path:
    """argparse type of ``--out``: the folder's path; an empty one is refused ("" is the current folder to
    pathlib)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: name the folder the results go into")
    return Path(text)


def check_out_folder(folder, names: Sequence[str]) -> None:
    """Before a run: ``--out`` ``folder`` (made when the results are written) must be a folder in which each of
    ``names`` can be written (:func:`mxkit._files.check_writable`: nothing is left behind). Raises OSError naming
    the path."""
    check_nonempty(folder, "--out")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"--out {str(folder)!r} is a file; it names the folder the results go into")
    if folder.is_symlink() and not folder.exists():
        raise NotADirectoryError(f"--out {str(folder)!r} is a symbolic link to {os.readlink(folder)!r}, which does "
                                 f"not exist; it names the folder the results go into")
    for name in names:
        check_writable(folder / name, "--out")


def _json_safe(v: Any) -> Any:
    """``v`` with every non-finite float (in dicts, lists and tuples) replaced by None."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def write_csv(rows: Sequence[Any], path: Path) -> Path:
    """One line per row, the dataclass fields as columns (in their order); written whole (a temporary file renamed
    over the old one: a run stopped while it saves leaves the last complete table, matching its JSON)."""
    path = _folder_made(path)
    fh = io.StringIO(newline="")
    w = csv.DictWriter(fh, fieldnames=[f.name for f in dataclasses.fields(rows[0])] if rows else [])
    w.writeheader()
    w.writerows({k: ("" if v is None else v) for k, v in dataclasses.asdict(r).items()} for r in rows)
    write_text_atomic(path, fh.getvalue())
    return path


def write_json(rows: Sequence[Any], env: dict, path: Path, *, config=None) -> Path:
    """``{"env": {...}, "config": {...}, "rows": [...]}``, strict JSON: non-finite floats as null; ``config``: a
    dict or the parsed options (their non-JSON values as strings)."""
    path = _folder_made(path)
    config = {k: v for k, v in (vars(config) if isinstance(config, argparse.Namespace) else config or {}).items()
              if k != "func" and not str(k).startswith("_")}  # (the CLI's own: its parser, ...)
    doc = _json_safe({"env": env, "config": config, "rows": [dataclasses.asdict(r) for r in rows]})
    write_text_atomic(path, json.dumps(doc, indent=1, default=str, allow_nan=False) + "\n")
    return path


def save(rows: Sequence[Any], args, stem: str, env: dict) -> list[str]:
    """Rewrite ``stem``.csv and .json in ``args.out`` (nothing when it is None); lines naming the files."""
    if args.out is None:
        return []
    return [f"csv: {write_csv(rows, args.out / f'{stem}.csv')}",
            f"json: {write_json(rows, env, args.out / f'{stem}.json', config=args)}"]


def write_chart(rows: Sequence[Any], path: Path, *, value: str, ylabel: str, title: str = "", panel: str = "op",
                x: str = "shape", colour: str = "fmt", is_main: Callable[[Any], bool] = lambda r: True
                ) -> tuple[Optional[Path], str]:
    """PNG bar chart, one panel per value of the ``panel`` field: bars of ``value`` per ``x`` (ticks) and
    ``colour`` (one colour each) for the rows ``is_main`` keeps; the other rows' values as black ticks over
    the bar of the same place. Rows whose value is None are left out (a panel, tick or colour with no value to
    draw is not drawn). Returns (path or None, note); without
    matplotlib it writes nothing and says so."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # optional dependency
        return None, f"chart skipped: matplotlib not importable ({type(e).__name__}: {e})"
    main = [r for r in rows if is_main(r) and getattr(r, value) is not None]  # (no empty panels, ticks or colours)
    panels, colours = (list(dict.fromkeys(getattr(r, a) for r in main)) for a in (panel, colour))
    if not panels:
        return None, "chart skipped: no rows to draw"
    ncols = min(2, len(panels))
    fig, axes = plt.subplots(math.ceil(len(panels) / 2), ncols, figsize=(7.5 * ncols, 3.6 * math.ceil(len(panels) / 2)),
                             squeeze=False)
    for ax, name in zip(axes.flat, panels):
        xs = list(dict.fromkeys(getattr(r, x) for r in main if getattr(r, panel) == name))
        for r in rows:
            v, j = getattr(r, value), colours.index(getattr(r, colour)) if getattr(r, colour) in colours else None
            if getattr(r, panel) != name or v is None or getattr(r, x) not in xs or j is None:
                continue
            pos, width = xs.index(getattr(r, x)) - 0.4 + 0.8 / len(colours) * (j + 0.5), 0.76 / len(colours)
            if is_main(r):
                ax.bar(pos, v, width=width, color=f"C{j}", label=str(colours[j]))
            else:
                ax.scatter([pos], [v], marker="_", s=120, color="black", zorder=3)
        ax.set_xticks(range(len(xs)), [str(v) for v in xs], fontsize=7, rotation=20)
        peers = any(not is_main(r) for r in rows)  # (not len(main) < len(rows): main rows without a value are no peers)
        ax.set(xlabel=x, ylabel=ylabel, title=f"{name} (ticks: peers)" if peers else str(name))
        handles = dict(zip(*ax.get_legend_handles_labels()[::-1]))
        ax.legend(handles.values(), handles.keys(), fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format=Path(path).suffix.lstrip(".") or "png", dpi=110)
    plt.close(fig)
    write_bytes_atomic(_folder_made(path), png.getvalue())  # (whole or not at all: savefig left a truncated file)
    return Path(path), f"chart: {path}"
