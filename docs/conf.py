"""Sphinx configuration of mmeffattn's documentation (MyST Markdown, as OpenMMLab's docs).

Build:  python -m sphinx -W --keep-going -b html docs docs/_build/html
(tests/docs/test_docs_build.py runs the same with warnings as errors.)
"""
import os
import os.path as osp
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)
# the API pages import mmeffattn; nothing there needs a GPU or the Triton interpreter
os.environ.setdefault('MMEFFATTN_OPS_BACKEND', 'reference')

project = 'mmeffattn'
author = 'mmeffattn contributors'
copyright = 'mmeffattn contributors; Apache-2.0'

extensions = [
    'myst_parser',
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',
]
source_suffix = {'.md': 'markdown', '.rst': 'restructuredtext'}
root_doc = 'index'
exclude_patterns = ['_build', 'Thumbs.db', '.DS_Store', '**/.ipynb_checkpoints']

myst_enable_extensions = ['colon_fence', 'dollarmath', 'deflist']
myst_heading_anchors = 3

# API reference: the package is importable without a GPU; the optional downstream libraries
# are installed in the project's environment, so nothing is mocked unless it is missing.
autodoc_default_options = {'members': True, 'show-inheritance': True}
autodoc_member_order = 'bysource'
autodoc_typehints = 'description'
autodoc_mock_imports = []
for _optional in ('onnx', 'onnxruntime', 'onnxscript', 'safetensors'):
    try:
        __import__(_optional)
    except ImportError:
        autodoc_mock_imports.append(_optional)
napoleon_google_docstring = True
napoleon_numpy_docstring = False

nitpicky = False

html_theme = 'furo'
html_title = 'mmeffattn'
html_static_path = []

# The Markdown tables under docs/perf/ are written by the benchmark tools (``--out-dir
# docs/perf``) and open with their measurement conditions, not a title; they start at H3 where
# they are meant to sit under a heading. Give such a page a title at build time, so the toctree
# can link it, and let its headings start below H1.
suppress_warnings = ['myst.header']
PERF_TITLES = {
    'perf/benchmark': 'Backbones: latency, memory and FLOPs against the input size',
    'perf/benchmark_ops': 'Attention ops alone',
    'perf/dispersion': 'Dispersion of the attention weights',
    'perf/zoo': 'The attention zoo',
    'perf/kernels': 'Compiled kernels and rooflines',
}

# What produced each generated table: the hardware and the command (the tables themselves carry
# the settings). Shown under the title.
CPU = 'an x86_64 CPU, 2 cores, no GPU'
PERF_SOURCES = {
    'perf/benchmark': (CPU, 'python tools/benchmark.py --preset readme --threads 2 '
                            '--out-dir docs/perf'),
    'perf/benchmark_ops': (CPU, 'python tools/benchmark_ops.py --preset readme --threads 2 '
                                '--out-dir docs/perf'),
    'perf/dispersion': (None, 'python tools/analyze_dispersion.py --model SEMA-T '
                              '--sizes 224 512 1024 --out-dir docs/perf'),
    'perf/zoo': (CPU, 'python tools/analysis_tools/zoo_table.py --out-dir docs/perf'),
}


def _title_generated_pages(app, docname, source):
    if not docname.startswith('perf/'):
        return
    text = source[0]
    first = next((line for line in text.splitlines() if line.strip()), '')
    if not first.startswith('# '):
        title = PERF_TITLES.get(docname, docname.split('/')[-1].replace('_', ' ').capitalize())
        hardware, command = PERF_SOURCES.get(docname, (None, None))
        origin = ''
        if command:
            origin = f'Produced by `{command}`' + (f' on {hardware}' if hardware else '') + '.\n\n'
        source[0] = f'# {title}\n\n{origin}{text}'


# The model zoo page gathers the family pages (configs/<family>/README.md), the pages OpenMMLab
# users know from the repository, into the site: each family's page is appended under its own
# heading, its headings one level down, its links to configs made plain text (the site has no
# copy of configs/) and its links to the docs made relative to docs/.
ZOO_FAMILIES = ('sema', 'mila', 'weightformer', 'veca', 'laplacianformer', 'zoo')


def family_page(family: str) -> str:
    """configs/<family>/README.md as a section of the model zoo page."""
    import re
    text = open(osp.join(ROOT, 'configs', family, 'README.md'), encoding='utf-8').read()
    text = re.sub(r'^(#+) ', lambda m: '#' + m.group(1) + ' ', text, flags=re.M)
    text = re.sub(r'\]\(\.\./\.\./docs/([^)]+)\)', r'](\1)', text)

    def link(m):
        label, target = m.group(1), m.group(2)
        if not target.startswith(('../', './')) and '/' in target:
            return m.group(0)  # a docs page (made relative to docs/ above)
        return label if label.startswith('`') else f'`{label}`'

    return re.sub(r'\[([^\]]+)\]\((?!https?://|#)([^)]+\.(?:py|yml|md))\)', link, text)


def _model_zoo_page(app, docname, source):
    if docname == 'model_zoo':
        pages = [family_page(f) for f in ZOO_FAMILIES]
        source[0] = source[0].rstrip() + '\n\n' + '\n\n'.join(pages) + '\n'


def setup(app):
    app.connect('source-read', _title_generated_pages)
    app.connect('source-read', _model_zoo_page)
