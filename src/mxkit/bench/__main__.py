"""``python -m mxkit.bench <op> [options]`` (see :func:`mxkit.bench.main`)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
