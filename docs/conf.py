"""Sphinx configuration: the topo documentation, Markdown pages read by myst-parser.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (the ``docs`` extra installs
the tools). ``reference/spec.md`` and ``reference/cli.md`` are regenerated at build time from the JSON
Schema and from click (``_ext/topo_docs.py``).
"""
import importlib.util
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)  # this checkout's topo, for autodoc and the generated pages
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

from topo import __version__  # noqa: E402

project = "topo"
author = "the topo authors"
copyright = "the topo authors"
release = __version__
version = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "topo_docs"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

myst_heading_anchors = 4  # [text](page.md#a-heading) links, as on GitHub
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"

html_theme = "furo" if importlib.util.find_spec("furo") else "alabaster"
html_title = f"topo {__version__}"
