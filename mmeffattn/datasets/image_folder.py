"""An unlabeled image folder (every image file under a directory, sorted) for feature
distillation, as VECA's pretraining reads bare images."""
import os
import os.path as osp
from typing import List, Optional, Sequence

from mmengine.dataset import BaseDataset

from mmeffattn.registry import DATASETS

__all__ = ['UnlabeledImageFolder', 'IMG_EXTENSIONS', 'scan_images']

# the official index's extensions, plus the netpbm ones PIL also reads
IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff', '.ppm', '.pgm')


def scan_images(folder: str, extensions: Sequence[str] = IMG_EXTENSIONS) -> List[str]:
    """Sorted paths, relative to ``folder``, of the files below it whose extension (any case)
    is in ``extensions``. Symlinked directories are followed, as ``ImageFolder`` does."""
    exts = tuple(e.lower() for e in extensions)
    return sorted(osp.relpath(osp.join(root, name), folder)
                  for root, _, files in os.walk(folder, followlinks=True)
                  for name in files if name.lower().endswith(exts))


@DATASETS.register_module()
class UnlabeledImageFolder(BaseDataset):
    """Every image below ``data_root/data_prefix['img_path']``, each sample ``{'img_path': ...}``.

    Args:
        data_root: dataset root; ``data_prefix`` and ``ann_file`` are relative to it.
        data_prefix: ``dict(img_path=SUBFOLDER)`` (``''``: the root itself).
        ann_file: optional list of images (first column, relative to the image folder).
        extensions: file extensions that count as images when scanning (case-insensitive).
        max_images: keep only the first ``max_images`` images of the sorted list (``None``: all).
        **kwargs: the rest of ``BaseDataset``'s arguments (``pipeline``, ``test_mode``, ...).
    """

    METAINFO = dict(classes=None)

    def __init__(self,
                 data_root: str = '',
                 data_prefix: Optional[dict] = None,
                 ann_file: str = '',
                 extensions: Sequence[str] = IMG_EXTENSIONS,
                 max_images: Optional[int] = None,
                 **kwargs) -> None:
        if max_images is not None and (not isinstance(max_images, int) or max_images < 1):
            raise ValueError(f'max_images must be a positive int or None, got {max_images!r}')
        if not extensions:
            raise ValueError('extensions must name at least one file extension, e.g. (".jpg",)')
        self.extensions = tuple(e if e.startswith('.') else '.' + e for e in extensions)
        self.max_images = max_images
        data_prefix = {'img_path': '', **(data_prefix or {})}
        super().__init__(data_root=data_root, data_prefix=data_prefix, ann_file=ann_file,
                         **kwargs)

    def load_data_list(self) -> List[dict]:
        # BaseDataset has already joined data_root onto ann_file and data_prefix
        folder = self.data_prefix['img_path'] or self.data_root or '.'
        if not osp.isdir(folder):
            raise FileNotFoundError(
                f'{type(self).__name__}: image folder {folder!r} does not exist. Point the '
                f"config at it: dataset data_root=... and data_prefix=dict(img_path='SUBFOLDER').")
        if self.ann_file:
            names = self._read_list(folder)
            where = f'listed in {self.ann_file!r}'
        else:
            names = scan_images(folder, self.extensions)
            where = f'with extensions {self.extensions} under {folder!r}'
        if not names:
            raise RuntimeError(
                f'{type(self).__name__}: no images {where}. Check data_root/data_prefix, or pass '
                f'extensions=(...) for other file types.')
        return [dict(img_path=osp.join(folder, n)) for n in names[:self.max_images]]

    def _read_list(self, folder: str) -> List[str]:
        if not osp.isfile(self.ann_file):
            raise FileNotFoundError(
                f'{type(self).__name__}: ann_file {self.ann_file!r} does not exist (it is '
                f"relative to data_root); give a list of images, or ann_file='' to scan {folder!r}")
        with open(self.ann_file, encoding='utf-8') as f:
            names = [line.split()[0] for line in f if line.strip()]
        # a wrong prefix makes every entry miss: a few spread over the list find it
        probe = names[::max(1, len(names) // 16)]
        absent = [n for n in probe if not osp.isfile(osp.join(folder, n))]
        if absent:
            raise FileNotFoundError(
                f'{type(self).__name__}: images listed in {self.ann_file!r} are not under '
                f'{folder!r}, e.g. {absent[:3]}. List paths relative to the image folder '
                f'(data_prefix img_path).')
        return names
