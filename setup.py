"""What pyproject.toml cannot say: the ``mmeffattn/.mim`` folder, the OpenMMLab way.

``configs/``, ``tools/`` and ``model-index.yml`` live at the project root. An installed package
carries them under ``mmeffattn/.mim`` so that ``mim train mmeffattn CONFIG`` finds the config and
``tools/train.py``, and a config elsewhere can inherit ``'mmeffattn::<path>'``:

* a wheel (``pip install .``, ``python -m build``) gets full copies, every subfolder included,
  written into the build folder (the source tree is left as it is);
* an editable install (``pip install -e .``) gets symlinks in the source tree, so edits to
  configs/ and tools/ show at once.

Everything else (name, version, dependencies, extras) is in pyproject.toml.
"""
import os
import os.path as osp
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = osp.dirname(osp.abspath(__file__))
MIM_ITEMS = ('configs', 'tools', 'model-index.yml')
_SKIP = shutil.ignore_patterns('__pycache__', '*.pyc', '*.pyo')


def _remove(path: str) -> None:
    if osp.islink(path) or osp.isfile(path):
        os.remove(path)
    elif osp.isdir(path):
        shutil.rmtree(path)


class BuildPyWithMim(build_py):
    """build_py that also copies configs/, tools/ and model-index.yml, whole, into the built
    package's ``.mim`` folder (package_data globs cannot take a whole folder tree)."""

    def run(self) -> None:
        super().run()
        if getattr(self, 'editable_mode', False):  # editable: the symlinks below serve
            return
        mim = osp.join(self.build_lib, 'mmeffattn', '.mim')
        _remove(mim)
        os.makedirs(mim)
        for name in MIM_ITEMS:
            src = osp.join(HERE, name)
            if not osp.exists(src):
                raise FileNotFoundError(
                    f'{src} is missing, so the wheel would lack mmeffattn/.mim/{name}; build '
                    f'from a full checkout, or from an sdist made with MANIFEST.in')
            if osp.isdir(src):
                shutil.copytree(src, osp.join(mim, name), ignore=_SKIP)
            else:
                shutil.copyfile(src, osp.join(mim, name))


def link_mim_for_editable_install() -> None:
    """Point mmeffattn/.mim/<item> at the project's own folders (editable installs only)."""
    if not any(cmd in sys.argv for cmd in ('develop', 'editable_wheel')):
        return
    mim = osp.join(HERE, 'mmeffattn', '.mim')
    os.makedirs(mim, exist_ok=True)
    for name in MIM_ITEMS:
        src, dst = osp.join(HERE, name), osp.join(mim, name)
        if osp.exists(src):
            _remove(dst)
            os.symlink(osp.relpath(src, mim), dst)


if __name__ == '__main__':
    link_mim_for_editable_install()
    setup(cmdclass={'build_py': BuildPyWithMim})
