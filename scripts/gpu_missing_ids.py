"""The gpu-marked tests an earlier gpu_check run did not pass: what `MXKIT_TEST_IDS` runs next.

    python3 scripts/gpu_missing_ids.py benchmarks/<run>/pytest_gpu.xml > ids.txt
    MXKIT_TEST_IDS=ids.txt bash scripts/gpu_check.sh

Collects ``pytest -m gpu tests`` in the repository (collection needs no GPU) under the run's ``MXKIT_GPU_FULL``
(gpu_check's default, 1, where unset: the full matrix holds ids the reduced one lacks) and prints, one a line,
the node ids that the JUnit XML does not record as passed or skipped: those a budget cut off, and those that
failed or errored. Nothing when none is left.
"""

from __future__ import annotations

import os
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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    done = passed_ids(argv[0])
    env = dict(os.environ, MXKIT_GPU_FULL=os.environ.get("MXKIT_GPU_FULL", "1"))
    out = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests"], capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1])
    ids = [line.strip() for line in out.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    if out.returncode != 0 or not ids:
        print(out.stdout[-2000:] + out.stderr[-2000:], file=sys.stderr)
        return 1
    missing = [i for i in ids if i not in done]
    if missing:
        print("\n".join(missing))
    print(f"{len(missing)} of {len(ids)} gpu tests to run", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
