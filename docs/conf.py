"""Sphinx configuration of hvlite's documentation (`make docs`: sphinx-build -W --keep-going).

Pages are MyST Markdown. The API reference is read from the source by sphinx-autoapi (the engine
is never built or imported for it); hvlrun's reference is rendered from its argparse parser by
sphinx-argparse (``hvlite.runner.cli.flags`` imports no engine). The settings reference is
written by ``tools/docs_reference.py`` from ``csrc/core/param.c``'s table, and checked for
staleness by ``tests/test_docs.py``. Conventions for pages: docs/development/docs.md.
"""
import logging
import os
import re
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, ROOT)          # sphinx-argparse imports hvlite.runner.cli.flags from here

with open(os.path.join(ROOT, "hvlite", "__init__.py")) as f:
    release = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
version = release
project = "hvlite"
author = "the hvlite authors"
copyright = "the hvlite authors, Apache License 2.0"

extensions = [
    "myst_parser",
    "sphinx.ext.napoleon",        # the code's docstrings are Google style (Args:, Returns:)
    "autoapi.extension",
    "sphinxarg.ext",
    "sphinx_copybutton",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# Underscore files are fragments that pages include (generated tables).
exclude_patterns = ["_build", "**/_*.md", "requirements.txt"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "hvlite %s" % release
html_show_sourcelink = False
html_static_path = ["_static"]
html_css_files = ["hvlite.css"]
# Quotes and ellipses are typeset, dashes are not: "--flag" in a table or a parser's help must
# read (and copy) as two hyphens, where docutils' default makes it an en dash.
smartquotes_action = "qe"
pygments_style = "friendly"
# Blocks without a language (sphinx-argparse's) are plain text, not guessed at.
highlight_language = "none"

# Copy buttons copy the command, not the prompt or the output.
copybutton_prompt_text = r"\$ |>>> |\.\.\. "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = False

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True          # "Attributes:" as fields, not a second description of each

# --- API reference --------------------------------------------------------------------------
autoapi_type = "python"
autoapi_dirs = [os.path.join(ROOT, "hvlite")]
autoapi_root = "reference/api"
autoapi_add_toctree_entry = False
autoapi_keep_files = False
autoapi_member_order = "bysource"
autoapi_options = ["members", "undoc-members", "show-module-summary", "imported-members"]

# The modules a user imports. Everything else is the implementation: skipped, but its names
# still appear where a public module re-exports them (hvlite.torch's collectives live in
# hvlite/torch/ops.py). A name a public module re-exports from another public module is shown
# once, where it is defined (hvlite.torch.init is hvlite.basics.init).
PUBLIC_MODULES = {
    "hvlite", "hvlite.basics", "hvlite.ops", "hvlite.objects", "hvlite.process_sets",
    "hvlite.timeline", "hvlite.errors", "hvlite.func_job", "hvlite.elastic",
    "hvlite.torch", "hvlite.torch.elastic",
    "hvlite.tensorflow", "hvlite.tensorflow.elastic", "hvlite.tensorflow.keras",
    "hvlite.tensorflow.keras.callbacks", "hvlite.tensorflow.keras.elastic", "hvlite.keras",
    "hvlite.ray", "hvlite.ray.train", "hvlite.spark",
}


def _skip_member(app, what, name, obj, skip, options):
    if what in ("module", "package"):
        return name not in PUBLIC_MODULES
    if getattr(obj, "imported", False):
        defined_in = obj.obj["original_path"].rsplit(".", 1)[0]
        if defined_in in PUBLIC_MODULES:
            return True
    if name.rsplit(".", 1)[-1].startswith("_") and what != "method":
        return True
    return skip


def _module_docstring(app, what, name, obj, options, lines):
    """A module docstring's first part is for users; from a line "Contract:" on it is the
    maintainers' (STYLE.md 13), kept out of the API pages."""
    if what not in ("module", "package"):
        return
    for i, line in enumerate(lines):
        if line.startswith("Contract:"):
            del lines[i:]
            lines.append("")
            return


class _StaticImportLimits(logging.Filter):
    """autoapi reads the source without running it, so it cannot follow names that exist only
    at run time: the compiled engine's ``ffi``/``lib`` (``hvlite/_lib.py``), and the submodules
    ``callbacks`` and ``elastic`` that ``hvlite.tensorflow.keras``'s ``__all__`` names (Horovod's
    module holds them; autoapi takes no submodule as an ``__all__`` member). Those (and only
    those) notes are dropped; any other unresolvable import still fails the build."""
    RUN_TIME_ONLY = re.compile(
        r"Cannot resolve import of hvlite\._lib\.(ffi|lib) in |"
        r"Invalid __all__ entry (callbacks|elastic) in hvlite\.tensorflow\.keras$")

    def filter(self, record):
        return not self.RUN_TIME_ONLY.search(record.getMessage())


def _summary(self):
    """The first sentence of a docstring's first paragraph, for the API's summary tables.

    autoapi takes the first line (PEP 257's one-line summary), but this code's docstrings
    often wrap their first sentence over two lines; the table would show half of it."""
    paragraph = " ".join(self.docstring.strip().split("\n\n")[0].split())
    end = re.search(r"\.(\s|$)", paragraph)
    return paragraph[:end.start() + 1] if end else paragraph


def setup(app):
    from autoapi._objects import PythonObject    # see _summary
    PythonObject.summary = property(_summary)
    app.connect("autoapi-skip-member", _skip_member)
    app.connect("autodoc-process-docstring", _module_docstring, priority=400)
    logging.getLogger("sphinx.autoapi._mapper").addFilter(_StaticImportLimits())
