"""``python -m mxkit`` = the ``mxkit`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
