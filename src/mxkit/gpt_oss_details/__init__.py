"""The code of :mod:`mxkit.gpt_oss` (the public names are there), one file per concern."""
