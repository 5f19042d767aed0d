"""The synthetic COCO shapes dataset: determinism, exact annotations, occlusion, idempotence."""
import json
import os
import os.path as osp
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip('PIL')
pytest.importorskip('pycocotools')

from pycocotools import mask as mask_utils  # noqa: E402
from pycocotools.coco import COCO  # noqa: E402

from mmeffattn.datasets import synthetic_shapes as ss  # noqa: E402
from mmeffattn.datasets import DEFAULT_METAINFO, generate_shapes_coco  # noqa: E402

TINY = dict(num_train=6, num_val=3, img_size=(96, 128), seed=3)


def _files(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = osp.join(dirpath, n)
            with open(p, 'rb') as f:
                out[osp.relpath(p, root)] = f.read()
    return out


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('shapes'))
    # every kind of shape, so rings (RLE with a hole), stars, crosses... are checked too
    res = generate_shapes_coco(root, classes=tuple(ss.SHAPE_KINDS), max_objects=6, **TINY)
    return root, res


def _coco(root, split):
    return COCO(osp.join(root, 'annotations', f'instances_{split}2017.json'))


def test_layout_and_result(tiny):
    root, res = tiny
    assert res['regenerated'] and res['data_root'] == osp.abspath(root)
    assert res['metainfo']['classes'] == tuple(ss.SHAPE_KINDS)
    assert len(res['metainfo']['palette']) == len(ss.SHAPE_KINDS)
    for split, n in (('train', TINY['num_train']), ('val', TINY['num_val'])):
        info = res[split]
        assert info['num_images'] == n
        assert osp.isfile(osp.join(root, info['ann_file']))
        assert sorted(os.listdir(osp.join(root, info['img_prefix']))) == [
            f'{i:06d}.png' for i in range(n)]
        with open(osp.join(root, info['ann_file'])) as f:
            d = json.load(f)
        assert set(d) >= {'info', 'licenses', 'images', 'annotations', 'categories'}
        assert len(d['images']) == n and len(d['annotations']) == info['num_instances']
        assert [c['name'] for c in d['categories']] == list(ss.SHAPE_KINDS)
    meta = ss.load_shapes_meta(root)
    assert meta['params']['version'] == ss.GENERATOR_VERSION
    assert meta['metainfo']['classes'] == list(ss.SHAPE_KINDS)


@pytest.mark.parametrize('split', ['train', 'val'])
def test_annotations_match_pixels(tiny, split):
    from PIL import Image
    root, _ = tiny
    coco = _coco(root, split)
    cat_ids = set(coco.getCatIds())
    kinds = set()
    n_poly = n_rle = 0
    for img_id in coco.getImgIds():
        info = coco.loadImgs(img_id)[0]
        img = np.asarray(Image.open(osp.join(root, f'{split}2017', info['file_name'])))
        assert img.shape == (info['height'], info['width'], 3) == (96, 128, 3)
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
        assert anns, 'every image has at least one object'
        union = np.zeros(img.shape[:2], np.int32)
        for ann in anns:
            assert ann['category_id'] in cat_ids and ann['iscrowd'] == 0
            kinds.add(coco.cats[ann['category_id']]['name'])
            m = coco.annToMask(ann).astype(bool)
            assert m.any(), 'empty mask'
            ys, xs = np.nonzero(m)
            x0, y0 = xs.min(), ys.min()
            assert ann['bbox'] == [x0, y0, xs.max() - x0 + 1, ys.max() - y0 + 1]
            assert ann['area'] == m.sum() == mask_utils.area(coco.annToRLE(ann))
            assert ann['area'] >= round(150 * 96 * 128 / 256 ** 2)
            if isinstance(ann['segmentation'], dict):
                n_rle += 1
                assert isinstance(ann['segmentation']['counts'], str)
            else:
                n_poly += 1
                assert all(len(p) >= 6 and len(p) % 2 == 0 for p in ann['segmentation'])
            union += m
        # occlusion: visible masks of one image never overlap
        assert union.max() == 1
    assert n_poly and (n_rle or split == 'val')
    if split == 'train':
        assert 'ring' in kinds and len(kinds) >= 5


def test_masks_are_the_drawn_pixels():
    # the image is painted through the very masks that are annotated: redraw one image and
    # check each annotated mask is exactly what _draw_image produced, occlusion included
    p = dict(img_size=(96, 128), classes=tuple(ss.SHAPE_KINDS), size_range=(0.09, 0.22),
             min_objects=4, max_objects=6, max_tries=20, min_visible_frac=0.6, min_area=150,
             noise_std=4.0)
    img, objs = ss._draw_image(0, 'train', 0, p)
    assert img.dtype == np.uint8 and img.shape == (96, 128, 3)
    assert len(objs) >= 2
    for k, (cat, polys, vis) in enumerate(objs):
        ann = ss._annotation(k + 1, 1, cat + 1, polys, vis)
        seg = ann['segmentation']
        rle = (mask_utils.merge(mask_utils.frPyObjects(seg, 96, 128)) if isinstance(seg, list)
               else dict(seg, counts=seg['counts'].encode()))
        assert np.array_equal(mask_utils.decode(rle).astype(bool), vis)
        later = np.zeros_like(vis)
        for _, _, v in objs[k + 1:]:
            later |= v
        assert not (vis & later).any()


def test_deterministic(tmp_path, tiny):
    root, _ = tiny
    again = str(tmp_path / 'again')
    generate_shapes_coco(again, classes=tuple(ss.SHAPE_KINDS), max_objects=6, **TINY)
    a, b = _files(root), _files(again)
    assert a.keys() == b.keys()
    assert all(a[k] == b[k] for k in a), [k for k in a if a[k] != b[k]]

    other = str(tmp_path / 'other')
    generate_shapes_coco(other, classes=tuple(ss.SHAPE_KINDS), max_objects=6,
                         **dict(TINY, seed=4))
    c = _files(other)
    for k in ('train2017/000000.png', 'annotations/instances_train2017.json'):
        assert a[k] != c[k]


def test_prefix_stable(tmp_path):
    # image i depends only on (seed, split, i), not on how many images the split has
    small = str(tmp_path / 'small')
    big = str(tmp_path / 'big')
    generate_shapes_coco(small, num_train=2, num_val=1, img_size=(64, 64))
    generate_shapes_coco(big, num_train=4, num_val=1, img_size=(64, 64))
    for name in ('000000.png', '000001.png'):
        with open(osp.join(small, 'train2017', name), 'rb') as f1, \
                open(osp.join(big, 'train2017', name), 'rb') as f2:
            assert f1.read() == f2.read()
    # small images still get objects (min_area scales with the image)
    coco = _coco(big, 'train')
    assert all(coco.getAnnIds(imgIds=i) for i in coco.getImgIds())


def test_idempotent_fast_path(tmp_path):
    root = str(tmp_path / 'd')
    kw = dict(num_train=4, num_val=2, img_size=(64, 80), seed=1)
    first = generate_shapes_coco(root, **kw)
    assert first['regenerated']
    mtimes = {k: os.stat(osp.join(root, k)).st_mtime_ns for k in _files(root)}
    t0 = time.perf_counter()
    second = generate_shapes_coco(root, **kw)
    assert time.perf_counter() - t0 < 0.5
    assert not second['regenerated']
    assert {k: v for k, v in second.items() if k not in ('regenerated', 'seconds')} == \
        {k: v for k, v in first.items() if k not in ('regenerated', 'seconds')}
    assert mtimes == {k: os.stat(osp.join(root, k)).st_mtime_ns for k in _files(root)}

    # other parameters: regenerated, and stale images removed
    third = generate_shapes_coco(root, **dict(kw, num_train=3))
    assert third['regenerated'] and third['train']['num_images'] == 3
    assert sorted(os.listdir(osp.join(root, 'train2017'))) == [f'{i:06d}.png' for i in range(3)]
    # a missing image or an interrupted run (no meta.json) is regenerated too
    os.remove(osp.join(root, 'val2017', '000001.png'))
    assert generate_shapes_coco(root, **dict(kw, num_train=3))['regenerated']
    os.remove(osp.join(root, 'meta.json'))
    assert generate_shapes_coco(root, **dict(kw, num_train=3))['regenerated']
    assert generate_shapes_coco(root, force=True, **dict(kw, num_train=3))['regenerated']
    # switching to JPEG replaces the PNGs
    jpg = generate_shapes_coco(root, img_format='jpg', **dict(kw, num_train=3))
    assert jpg['regenerated']
    assert sorted(os.listdir(osp.join(root, 'train2017'))) == [f'{i:06d}.jpg' for i in range(3)]
    coco = _coco(root, 'train')
    assert coco.loadImgs(1)[0]['file_name'] == '000000.jpg'


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        generate_shapes_coco(str(tmp_path), classes=('circle', 'blob'))
    with pytest.raises(ValueError):
        generate_shapes_coco(str(tmp_path), min_objects=3, max_objects=2)
    with pytest.raises(ValueError):
        generate_shapes_coco(str(tmp_path), img_format='bmp')


def test_metainfo():
    assert DEFAULT_METAINFO == ss.shapes_metainfo(ss.DEFAULT_CLASSES)
    assert DEFAULT_METAINFO['classes'] == ('circle', 'square', 'triangle', 'star')
    assert len(set(DEFAULT_METAINFO['palette'])) == 4


def test_light_import_and_cli(tmp_path):
    # one subprocess (importing mmeffattn takes seconds): importing the datasets package adds no
    # heavy module beyond what `import mmeffattn` loads, then the CLI runs as `python -m`
    root = str(tmp_path / 'cli')
    sheet = str(tmp_path / 'sheet.png')
    code = (
        'import runpy, sys, mmeffattn; before = set(sys.modules); '
        'import mmeffattn.datasets; '
        'new = {m.split(".")[0] for m in set(sys.modules) - before}; '
        'bad = new & {"mmdet", "mmcv", "mmengine", "torch", "pycocotools", "PIL"}; '
        'assert not bad, bad; '
        f'sys.argv = ["x", {root!r}, "--num-train", "2", "--num-val", "1", '
        f'"--img-size", "64", "72", "--seed", "5", "--preview", {sheet!r}]; '
        'runpy.run_module("mmeffattn.datasets.synthetic_shapes", run_name="__main__", '
        'alter_sys=True)')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, '-W', 'error::RuntimeWarning', '-c', code],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert 'generated' in out.stdout
    meta = ss.load_shapes_meta(root)
    assert meta['params']['img_size'] == [64, 72] and meta['params']['seed'] == 5
    from PIL import Image
    with Image.open(sheet) as opened:
        assert opened.size[0] > 2 * 72


def test_mmdet_coco_dataset(tiny):
    pytest.importorskip('mmdet')
    from mmdet.datasets import CocoDataset
    root, res = tiny
    for split in ('train', 'val'):
        ds = CocoDataset(data_root=root, ann_file=res[split]['ann_file'],
                         data_prefix=dict(img=res[split]['img_prefix']),
                         metainfo=res['metainfo'], pipeline=[], test_mode=split == 'val')
        assert len(ds) == res[split]['num_images']
        n = 0
        for i in range(len(ds)):
            item = ds[i]
            assert osp.isfile(item['img_path'])
            assert item['instances'] and all(not x['ignore_flag'] for x in item['instances'])
            n += len(item['instances'])
        assert n == res[split]['num_instances']


def test_mmdet_pipeline_decodes_masks(tiny):
    # LoadAnnotations (poly2mask) turns both polygons and RLE into the annotated masks
    pytest.importorskip('mmdet')
    from mmcv.transforms import LoadImageFromFile
    from mmdet.datasets import CocoDataset
    from mmdet.datasets.transforms import LoadAnnotations
    root, res = tiny
    # transform classes, not names: no default registry scope is set in the tests
    ds = CocoDataset(data_root=root, ann_file=res['train']['ann_file'],
                     data_prefix=dict(img=res['train']['img_prefix']), metainfo=res['metainfo'],
                     pipeline=[dict(type=LoadImageFromFile),
                               dict(type=LoadAnnotations, with_bbox=True, with_mask=True)])
    coco = _coco(root, 'train')
    for i in range(len(ds)):
        out = ds[i]
        anns = coco.loadAnns(coco.getAnnIds(imgIds=out['img_id']))
        masks = out['gt_masks'].to_ndarray().astype(bool)
        assert masks.shape[0] == len(anns) == len(out['gt_bboxes'])
        for m, ann in zip(masks, anns):
            assert np.array_equal(m, coco.annToMask(ann).astype(bool))
        x, y, w, h = np.array([a['bbox'] for a in anns]).T
        assert np.allclose(out['gt_bboxes'].tensor.numpy(),
                           np.stack([x, y, x + w, y + h], 1))


def test_mmdet_coco_metric_on_ground_truth(tiny):
    # mmdet's CocoMetric reads the annotation file; the ground truth as predictions scores AP 1
    pytest.importorskip('mmdet')
    import torch
    from mmdet.evaluation import CocoMetric
    root, res = tiny
    ann_file = osp.join(root, res['val']['ann_file'])
    metric = CocoMetric(ann_file=ann_file, metric=['bbox', 'segm'])
    metric.dataset_meta = res['metainfo']
    coco = _coco(root, 'val')
    samples = []
    for img_id in coco.getImgIds():
        info = coco.loadImgs(img_id)[0]
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
        boxes = np.array([a['bbox'] for a in anns], np.float32)
        boxes[:, 2:] += boxes[:, :2]
        masks = np.stack([coco.annToMask(a) for a in anns]).astype(bool)
        samples.append(dict(img_id=img_id, ori_shape=(info['height'], info['width']),
                            pred_instances=dict(
                                bboxes=torch.from_numpy(boxes), scores=torch.ones(len(anns)),
                                labels=torch.tensor([a['category_id'] - 1 for a in anns]),
                                masks=torch.from_numpy(masks))))
    metric.process({}, samples)
    out = metric.compute_metrics(metric.results)
    assert out['bbox_mAP'] == pytest.approx(1.0) and out['segm_mAP'] == pytest.approx(1.0)


def test_ade20k_layout_labels_are_the_coco_masks(tmp_path):
    """The label maps hold, per pixel, the class (1..K) of the shape that the COCO generator's
    annotations give there for the same drawing (its val split, same seed and parameters)."""
    from PIL import Image
    from mmeffattn.datasets import generate_shapes_ade20k
    size, seed = (64, 80), 5
    root = generate_shapes_ade20k(str(tmp_path / 'ade'), num_images=3, img_size=size, seed=seed)
    generate_shapes_coco(str(tmp_path / 'coco'), num_train=0, num_val=3, img_size=size, seed=seed,
                         size_range=(0.12, 0.3))
    coco = _coco(str(tmp_path / 'coco'), 'val')
    images = sorted(os.listdir(osp.join(root, 'images', 'validation')))
    assert images == [f'shapes_{i:06d}.jpg' for i in range(3)]
    for i, name in enumerate(images):
        label = np.asarray(Image.open(osp.join(root, 'annotations', 'validation',
                                               name.replace('.jpg', '.png'))))
        expected = np.zeros(size, np.uint8)
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=i + 1)):
            expected[coco.annToMask(ann).astype(bool)] = ann['category_id']
        assert label.dtype == np.uint8 and expected.any()
        np.testing.assert_array_equal(label, expected)
        # the same picture, through JPEG
        img = np.asarray(Image.open(osp.join(root, 'images', 'validation', name)), np.float32)
        png = np.asarray(Image.open(osp.join(tmp_path, 'coco', 'val2017', f'{i:06d}.png')))
        assert np.abs(img - png).mean() < 4


def test_imagenet_layout_one_shape_per_image(tmp_path):
    from PIL import Image
    from mmeffattn.datasets import generate_shapes_imagenet
    classes = ('circle', 'star', 'ring')
    root = generate_shapes_imagenet(str(tmp_path / 'a'), num_per_class=2, img_size=(48, 48),
                                    classes=classes)
    with open(osp.join(root, 'meta', 'val.txt')) as f:
        lines = [line.split() for line in f]
    assert [int(label) for _, label in lines] == [0, 1, 2, 0, 1, 2]
    assert sorted(os.listdir(osp.join(root, 'val'))) == [name for name, _ in lines]
    pictures = [np.asarray(Image.open(osp.join(root, 'val', name))) for name, _ in lines]
    assert all(p.shape == (48, 48, 3) for p in pictures)
    assert len({p.tobytes() for p in pictures}) == 6
    # deterministic: the same files again
    again = generate_shapes_imagenet(str(tmp_path / 'b'), num_per_class=2, img_size=(48, 48),
                                     classes=classes)
    assert _files(root) == _files(again)
    with pytest.raises(ValueError, match='unknown shape'):
        generate_shapes_imagenet(str(tmp_path / 'c'), classes=('circle', 'blob'))
