"""Sphinx configuration of the offline course website (tools/build_site.py passes the source folder it writes;
project, html_title and copyright come from settings.ini through -D)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))
project = "speclab"

extensions = [
    "myst_nb",                  # notebooks and MyST markdown; outputs are the ones saved in the notebooks
    "mathjax_offline",          # sphinx-mathjax-offline: MathJax 3 copied into _static/, no CDN
    "sphinx.ext.githubpages",   # .nojekyll, so GitHub Pages serves _static/ and _images/
]

# notebooks are never executed here: their saved outputs (plots, tables) are the content
nb_execution_mode = "off"
nb_render_markdown_format = "myst"   # text/markdown outputs get the same math and links as markdown cells
nb_merge_streams = False   # tools/build_site.py joins a stream's chunks exactly (myst-nb adds line breaks)
nb_code_prompt_show = "Show exported source"
nb_code_prompt_hide = "Hide exported source"

myst_enable_extensions = ["dollarmath", "amsmath", "attrs_block", "colon_fence", "html_image"]
myst_dmath_double_inline = True
# links nbdev made to the doc host become site-relative (tools/build_site.py writes them as site:/sitefrag:)
myst_url_schemes = {
    "http": None, "https": None, "mailto": None,
    "site": "{{path}}",
    "sitefrag": "{{path}}#{{fragment}}",
}

exclude_patterns = ["lab*_student_download/**", "**/.ipynb_checkpoints"]
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "misc.highlighting_failure"]

html_theme = "furo"
html_static_path = ["static"]
html_css_files = ["speclab.css"]
html_favicon = "static/favicon.svg"
html_show_sourcelink = False
html_copy_source = False
html_last_updated_fmt = None
html_theme_options = {
    "sidebar_hide_name": False,
    "navigation_with_keys": True,
}
pygments_style = "friendly"
pygments_dark_style = "monokai"

# MathJax 3 (local copy): only elements Sphinx marks as math are typeset
mathjax3_config = {"tex": {"tags": "ams"}, "chtml": {"scale": 1.0}}
