"""The documentation site builds with Sphinx, warnings as errors: a broken cross-reference, a
page left out of every toctree or a docstring that does not parse fails here, as in CI."""
import importlib.util
import os
import os.path as osp
import subprocess
import sys

import pytest

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
MISSING = [m for m in ('sphinx', 'myst_parser', 'furo') if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(bool(MISSING), reason=f'docs build needs {MISSING}: pip install -e ".[docs]"')
def test_docs_build_without_warnings(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS='1', MMEFFATTN_OPS_BACKEND='reference')
    res = subprocess.run(
        [sys.executable, '-m', 'sphinx', '-W', '--keep-going', '-q', '-b', 'html',
         '-d', str(tmp_path / 'doctrees'), osp.join(ROOT, 'docs'), str(tmp_path / 'html')],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    warnings = sorted({line for line in (res.stdout + res.stderr).splitlines()
                       if 'WARNING' in line or 'ERROR' in line})
    assert res.returncode == 0, 'docs build failed:\n' + ('\n'.join(warnings) or res.stderr[-3000:])
    for page in ('index', 'get_started', 'api', 'benchmarks', 'user_guides/stock_configs'):
        assert osp.isfile(tmp_path / 'html' / f'{page}.html'), f'{page}.html was not built'
    # the API reference really was generated from the docstrings
    api = (tmp_path / 'html' / 'api.html').read_text()
    assert 'sema_attention' in api and 'LaplacianFormer' in api, 'autodoc generated nothing'
