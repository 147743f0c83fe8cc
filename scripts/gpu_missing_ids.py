"""The gpu-marked tests an earlier gpu_check run did not pass: what `MXKIT_TEST_IDS` runs next.

    python3 scripts/gpu_missing_ids.py benchmarks/<run>/pytest_gpu.xml > ids.txt
    MXKIT_TEST_IDS=ids.txt bash scripts/gpu_check.sh

Collects ``pytest -m gpu tests`` in the repository (collection needs no GPU) under the run's ``MXKIT_GPU_FULL``
and prints, one a line, the node ids that the JUnit XML does not record as passed or skipped: those a budget cut
off, and those that failed or errored. Nothing when none is left. The full matrix (1) and the reduced one (0)
name some parametrized tests differently (ids of the other matrix would not be found by pytest), so the run's
matrix is ``MXKIT_GPU_FULL`` where set, else what the run's ``gpu_check.log`` beside the XML says ("stage 1: ...
MXKIT_GPU_FULL=N"), else the matrix holding more of the XML's passed ids; a tie exits 2, asking for it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def passed_ids(xml_path: str) -> set[str]:
    """Node ids (``path/to/test_x.py::name[params]``) the JUnit XML records with no failure or error."""
    done = set()
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        cls, name = case.get("classname"), case.get("name")
        if not cls or not name or case.find("failure") is not None or case.find("error") is not None:
            continue
        done.add(cls.replace(".", "/") + ".py::" + name)
    return done


def logged_matrix(log: Path) -> str | None:
    """The MXKIT_GPU_FULL value gpu_check.sh logged for its test stage, or None (no log, or no such line)."""
    try:
        found = re.findall(r"stage 1: pytest .*MXKIT_GPU_FULL=([01])\b", log.read_text(errors="replace"))
    except OSError:
        return None
    return found[-1] if found else None


def collect(full: str) -> list[str] | None:
    """The gpu-marked node ids collected under ``MXKIT_GPU_FULL=full``; None (with pytest's output) if that fails."""
    env = dict(os.environ, MXKIT_GPU_FULL=full)
    out = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests"], capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1])
    ids = [line.strip() for line in out.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    if out.returncode != 0 or not ids:
        print(out.stdout[-2000:] + out.stderr[-2000:], file=sys.stderr)
        return None
    return ids


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    done = passed_ids(argv[0])
    full = os.environ.get("MXKIT_GPU_FULL") or logged_matrix(Path(argv[0]).with_name("gpu_check.log"))
    choices = []
    for value in [full] if full is not None else ["1", "0"]:
        ids = collect(value)
        if ids is None:
            return 1
        choices.append((len(done.intersection(ids)), value, ids))
    found, value, ids = max(choices, key=lambda c: c[0])
    if len(choices) == 2 and choices[0][0] == choices[1][0]:
        print(f"both matrices hold {found} of the run's passed ids: set MXKIT_GPU_FULL to the run's (0 or 1)",
              file=sys.stderr)
        return 2
    if full is None:
        print(f"MXKIT_GPU_FULL={value}: the matrix holding {found} of the run's {len(done)} passed ids",
              file=sys.stderr)
    missing = [i for i in ids if i not in done]
    if missing:
        print("\n".join(missing))
    print(f"{len(missing)} of {len(ids)} gpu tests to run", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
