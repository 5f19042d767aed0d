"""Install mmeffattn: efficient vision attention backbones for OpenMMLab."""
import os
import os.path as osp
import shutil
import sys

from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))
# Folders shipped inside the package under mmeffattn/.mim, the OpenMMLab way, so that a config
# elsewhere can inherit 'mmeffattn::<path>' and `mim` finds our tools.
MIM_FOLDERS = ('configs', 'tools', 'model-index.yml')


def get_version() -> str:
    scope: dict = {}
    with open(osp.join(HERE, 'mmeffattn', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


def add_mim_extension() -> None:
    """Link (editable install) or copy (regular install) configs/ and tools/ into mmeffattn/.mim."""
    if 'develop' in sys.argv or 'editable_wheel' in sys.argv:
        mode = 'symlink'
    elif any(cmd in sys.argv for cmd in ('install', 'bdist_wheel', 'sdist', 'build')):
        mode = 'copy'
    else:
        return
    mim_path = osp.join(HERE, 'mmeffattn', '.mim')
    os.makedirs(mim_path, exist_ok=True)
    for name in MIM_FOLDERS:
        src, dst = osp.join(HERE, name), osp.join(mim_path, name)
        if not osp.exists(src):
            continue
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if mode == 'symlink':
            os.symlink(osp.relpath(src, mim_path), dst)
        elif osp.isdir(src):
            shutil.copytree(src, dst)
        else:
            shutil.copyfile(src, dst)


def read_requirements(path: str) -> list:
    with open(osp.join(HERE, path)) as f:
        return [ln.split('#')[0].strip() for ln in f if ln.split('#')[0].strip()]


if __name__ == '__main__':
    add_mim_extension()
    setup(
        name='mmeffattn',
        version=get_version(),
        description='Efficient vision attention (SEMA, WeightFormer, VECA, LaplacianFormer) '
        'for OpenMMLab, with Triton kernels',
        long_description=open(osp.join(HERE, 'README.md')).read() if osp.exists(
            osp.join(HERE, 'README.md')) else '',
        long_description_content_type='text/markdown',
        python_requires='>=3.9',
        packages=find_packages(exclude=('configs', 'tools', 'tests', 'scripts')),
        include_package_data=True,
        package_data={'mmeffattn': ['.mim/model-index.yml', '.mim/configs/**/*.py',
                                    '.mim/configs/**/*.yml', '.mim/tools/*']},
        install_requires=['torch', 'mmengine>=0.10', 'mmcv>=2.0,<2.2'],
        extras_require={'all': read_requirements('requirements/runtime.txt'),
                        # ONNX export + onnxruntime check (tools/deployment/export_onnx.py)
                        'deploy': read_requirements('requirements/deploy.txt')},
        zip_safe=False,
    )
