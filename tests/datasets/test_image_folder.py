"""UnlabeledImageFolder: recursive, sorted, by extension; list files; clear errors."""
import glob
import os
import os.path as osp

import numpy as np
import pytest
from PIL import Image

import mmeffattn  # noqa: F401
from mmeffattn.datasets import UnlabeledImageFolder
from mmeffattn.registry import DATASETS


def _tree(root: str) -> None:
    """b/2.JPG, a/1.png, a/deep/0.jpeg, c.webp (images) and notes.txt, a/x.json (not)."""
    os.makedirs(osp.join(root, 'imgs', 'a', 'deep'))
    os.makedirs(osp.join(root, 'imgs', 'b'))
    img = Image.fromarray(np.full((20, 30, 3), 127, np.uint8))
    for rel, fmt in (('b/2.JPG', 'JPEG'), ('a/1.png', 'PNG'), ('a/deep/0.jpeg', 'JPEG'),
                     ('c.webp', 'WEBP')):
        img.save(osp.join(root, 'imgs', rel), format=fmt)
    for rel in ('notes.txt', 'a/x.json'):
        open(osp.join(root, 'imgs', rel), 'w').close()


def _rel(ds, folder):
    return [osp.relpath(ds.get_data_info(i)['img_path'], folder) for i in range(len(ds))]


def test_scans_recursively_sorted_by_extension(tmp_path):
    _tree(str(tmp_path))
    ds = DATASETS.build(dict(type='mmeffattn.UnlabeledImageFolder', data_root=str(tmp_path),
                             data_prefix=dict(img_path='imgs')))
    assert isinstance(ds, UnlabeledImageFolder)
    assert _rel(ds, tmp_path / 'imgs') == ['a/1.png', 'a/deep/0.jpeg', 'b/2.JPG', 'c.webp']
    only_png = UnlabeledImageFolder(data_root=str(tmp_path / 'imgs'), extensions=('png', ))
    assert _rel(only_png, tmp_path / 'imgs') == ['a/1.png']
    first_two = UnlabeledImageFolder(data_root=str(tmp_path / 'imgs'), max_images=2)
    assert _rel(first_two, tmp_path / 'imgs') == ['a/1.png', 'a/deep/0.jpeg']


def test_pipeline_reads_images(tmp_path):
    _tree(str(tmp_path))
    ds = UnlabeledImageFolder(data_root=str(tmp_path), data_prefix=dict(img_path='imgs'),
                              pipeline=[dict(type='mmpretrain.LoadImageFromFile')])
    sample = ds[3]
    assert sample['img'].shape == (20, 30, 3) and sample['img_path'].endswith('c.webp')


def test_ann_file_lists_images(tmp_path):
    _tree(str(tmp_path))
    (tmp_path / 'list.txt').write_text('b/2.JPG 7\n\na/1.png 3\n')  # a label column is ignored
    ds = UnlabeledImageFolder(data_root=str(tmp_path), ann_file='list.txt',
                              data_prefix=dict(img_path='imgs'))
    assert _rel(ds, tmp_path / 'imgs') == ['b/2.JPG', 'a/1.png']  # listed order kept
    (tmp_path / 'bad.txt').write_text('imgs/b/2.JPG\n')
    with pytest.raises(FileNotFoundError, match=r"imgs/b/2.JPG.*relative to the image folder"):
        UnlabeledImageFolder(data_root=str(tmp_path), ann_file='bad.txt',
                             data_prefix=dict(img_path='imgs'))
    with pytest.raises(FileNotFoundError, match='ann_file .*none.txt'):
        UnlabeledImageFolder(data_root=str(tmp_path), ann_file='none.txt')


def test_missing_or_empty_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"image folder .*nowhere.* does not exist"):
        UnlabeledImageFolder(data_root=str(tmp_path), data_prefix=dict(img_path='nowhere'))
    (tmp_path / 'empty' / 'sub').mkdir(parents=True)
    (tmp_path / 'empty' / 'sub' / 'readme.md').write_text('x')
    with pytest.raises(RuntimeError, match='no images with extensions'):
        UnlabeledImageFolder(data_root=str(tmp_path / 'empty'))
    with pytest.raises(ValueError, match='max_images'):
        UnlabeledImageFolder(data_root=str(tmp_path), max_images=0)
    # lazy_init defers the scan (and its errors) to full_init, as every BaseDataset
    lazy = UnlabeledImageFolder(data_root=str(tmp_path / 'empty'), lazy_init=True)
    with pytest.raises(RuntimeError, match='no images'):
        lazy.full_init()


@pytest.mark.parametrize('tier', ['generated', 'real'])
def test_imagenet_layout(sample_data, tier):
    root = sample_data('imagenet', tier)
    expected = sorted(osp.basename(p) for p in glob.glob(osp.join(root, 'val', '*'))
                      if p.lower().endswith(('.jpeg', '.jpg', '.png')))
    ds = UnlabeledImageFolder(data_root=root, data_prefix=dict(img_path='val'))
    assert len(ds) == len(expected) > 0
    assert [osp.basename(ds.get_data_info(i)['img_path']) for i in range(len(ds))] == expected
    # the ImageNet list file ("FILE LABEL" lines) works as an ann_file
    listed = UnlabeledImageFolder(data_root=root, ann_file='meta/val.txt',
                                  data_prefix=dict(img_path='val'), max_images=5)
    with open(osp.join(root, 'meta', 'val.txt')) as f:
        first = [line.split()[0] for line in f if line.strip()][:5]
    assert [osp.basename(listed.get_data_info(i)['img_path']) for i in range(5)] == first
