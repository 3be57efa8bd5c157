"""sphinx-mathjax-offline (MathJax 3 in _static/mathjax, no CDN), declared safe for parallel builds: its setup only
sets mathjax_path and copies files once the build has finished."""
import importlib

_ext = importlib.import_module("sphinx-mathjax-offline")


def setup(app):
    _ext.setup(app)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
