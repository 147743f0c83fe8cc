"""``python -m mxkit`` = the ``mxkit`` command."""

from .cli import main

raise SystemExit(main())
