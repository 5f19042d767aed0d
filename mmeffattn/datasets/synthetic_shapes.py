"""A deterministic synthetic COCO-format instance-segmentation dataset of coloured shapes, so
the demo trains with no download; the same shapes also make small sets in ADE20K's layout (label
maps) and ImageNet's (one shape an image). Each image has its own seeded stream, masks are
pycocotools' rasterisation of each shape, visible masks never overlap, and a matching
``meta.json`` (written last) makes generation a no-op.

Command line::

    python -m mmeffattn.datasets.synthetic_shapes data/shapes --num-train 200 --num-val 50
"""
import argparse
import colorsys
import json
import math
import os
import os.path as osp
import time

import numpy as np

__all__ = ['SHAPE_KINDS', 'DEFAULT_CLASSES', 'DEFAULT_METAINFO', 'GENERATOR_VERSION',
           'generate_shapes_coco', 'generate_shapes_ade20k', 'generate_shapes_imagenet',
           'shapes_metainfo', 'load_shapes_meta', 'make_contact_sheet']

#: Bumped whenever the drawing changes, so an existing dataset is regenerated.
GENERATOR_VERSION = 1

#: Every kind of shape this generator can draw, with its visualisation colour (RGB).
SHAPE_KINDS = {
    'circle': (220, 20, 60), 'square': (0, 130, 200), 'triangle': (60, 180, 75),
    'star': (255, 200, 0), 'ring': (145, 30, 180), 'hexagon': (245, 130, 48),
    'ellipse': (70, 240, 240), 'cross': (240, 50, 230),
}

#: The demo's classes: four shapes that differ clearly in outline.
DEFAULT_CLASSES = ('circle', 'square', 'triangle', 'star')

_SPLITS = ('train', 'val')  # index: the split's code in each image's seed
_IMG_EXT = {'png': '.png', 'jpg': '.jpg'}


def shapes_metainfo(classes=DEFAULT_CLASSES):
    """``dict(classes=..., palette=...)`` for mmdet's ``CocoDataset(metainfo=...)``."""
    classes = tuple(classes)
    for name in classes:
        if name not in SHAPE_KINDS:
            raise ValueError(f'unknown shape {name!r}; choose from {sorted(SHAPE_KINDS)}')
    return dict(classes=classes, palette=[tuple(SHAPE_KINDS[c]) for c in classes])


#: metainfo of the default classes, for configs.
DEFAULT_METAINFO = shapes_metainfo(DEFAULT_CLASSES)


# shapes: polygon outlines (image coordinates, x right, y down)
def _regular(cx, cy, r, n, theta):
    # math (libm), not numpy's SIMD loops: coordinates must not depend on the instruction set
    a = [theta + 2 * math.pi * k / n for k in range(n)]
    return np.array([(cx + r * math.cos(t), cy + r * math.sin(t)) for t in a], np.float64)


def _place(pts, cx, cy, theta):
    """(N, 2) offsets, rotated by ``theta`` and moved to ``(cx, cy)``."""
    c, s = math.cos(theta), math.sin(theta)
    return np.stack([cx + c * pts[:, 0] - s * pts[:, 1], cy + s * pts[:, 0] + c * pts[:, 1]], 1)


def _ellipse(cx, cy, rx, ry, theta):
    # dense enough that the polygon is a smooth outline at any size we draw
    n = int(min(max(math.ceil(2 * math.pi * max(rx, ry) / 3.0), 24), 96))
    a = [2 * math.pi * k / n for k in range(n)]
    return _place(np.array([(rx * math.cos(t), ry * math.sin(t)) for t in a]), cx, cy, theta)


def _shape_polygons(kind, cx, cy, r, rng):
    """Outline(s) of one shape of circumradius ``r``: ``(fill, holes)``, lists of (N, 2) arrays."""
    theta = float(rng.uniform(0, 2 * np.pi))
    if kind == 'circle':
        return [_ellipse(cx, cy, r, r, 0.0)], []
    if kind == 'ellipse':
        return [_ellipse(cx, cy, r, r * rng.uniform(0.45, 0.7), theta)], []
    if kind in ('triangle', 'square', 'hexagon'):
        return [_regular(cx, cy, r, dict(triangle=3, square=4, hexagon=6)[kind], theta)], []
    if kind == 'star':
        outer = _regular(cx, cy, r, 5, theta)
        inner = _regular(cx, cy, r * float(rng.uniform(0.38, 0.5)), 5, theta + math.pi / 5)
        return [np.stack([outer, inner], axis=1).reshape(10, 2)], []
    if kind == 'cross':
        w = r * rng.uniform(0.28, 0.38)  # half the arm width; arm tips at distance r
        L = math.sqrt(max(r * r - w * w, w * w))
        pts = np.array([(w, -L), (w, -w), (L, -w), (L, w), (w, w), (w, L), (-w, L), (-w, w),
                        (-L, w), (-L, -w), (-w, -w), (-w, -L)], dtype=np.float64)
        return [_place(pts, cx, cy, theta)], []
    if kind == 'ring':
        rh = r * rng.uniform(0.45, 0.6)
        return [_ellipse(cx, cy, r, r, 0.0)], [_ellipse(cx, cy, rh, rh, 0.0)]
    raise ValueError(f'unknown shape {kind!r}')


def _flat(poly):
    """A polygon as the flat, rounded coordinate list stored in the JSON."""
    return [round(float(v), 2) for v in np.asarray(poly, dtype=np.float64).reshape(-1)]


def _rasterise(flat_polys, h, w):
    """Pixels inside polygons (flat lists), exactly as pycocotools (and so mmdet) decodes them."""
    from pycocotools import mask as mask_utils
    rles = mask_utils.frPyObjects(flat_polys, h, w)
    return mask_utils.decode(mask_utils.merge(rles)).astype(bool)


def _hsv_to_rgb(h, s, v):
    return np.array(colorsys.hsv_to_rgb(h, s, v), dtype=np.float32) * 255.0


def _smooth_noise(rng, h, w, cells):
    """Bilinearly upsampled random grid: values in [0, 1], smooth over ~h/cells pixels."""
    gh, gw = cells + 1, max(2, int(round(cells * w / h)) + 1)
    grid = rng.random((gh, gw)).astype(np.float32)
    ys = np.linspace(0, gh - 1, h, dtype=np.float32)
    xs = np.linspace(0, gw - 1, w, dtype=np.float32)
    y0 = np.minimum(ys.astype(np.int64), gh - 2)
    x0 = np.minimum(xs.astype(np.int64), gw - 2)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    g00, g01 = grid[y0][:, x0], grid[y0][:, x0 + 1]
    g10, g11 = grid[y0 + 1][:, x0], grid[y0 + 1][:, x0 + 1]
    return (g00 * (1 - fy) * (1 - fx) + g01 * (1 - fy) * fx + g10 * fy * (1 - fx)
            + g11 * fy * fx)


def _muted_colour(rng):
    return _hsv_to_rgb(rng.random(), rng.uniform(0.05, 0.45), rng.uniform(0.3, 0.8))


def _background(rng, h, w):
    """A textured background: gradient, smooth noise, stripes or checks, plus fine noise."""
    kind = rng.choice(4, p=(0.3, 0.3, 0.25, 0.15))
    c0, c1 = _muted_colour(rng), _muted_colour(rng)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    if kind == 0:  # linear gradient in a random direction
        a = float(rng.uniform(0, 2 * np.pi))
        t = math.cos(a) * xx / w + math.sin(a) * yy / h
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    elif kind == 1:  # smooth (value) noise at two scales
        t = 0.7 * _smooth_noise(rng, h, w, int(rng.integers(2, 6))) \
            + 0.3 * _smooth_noise(rng, h, w, int(rng.integers(8, 20)))
    elif kind == 2:  # soft stripes at a random angle and period
        a = float(rng.uniform(0, np.pi))
        period = float(rng.uniform(8, 40))
        u = (math.cos(a) * xx + math.sin(a) * yy) / period + float(rng.random())
        tri = 1 - np.abs(2 * (u - np.floor(u)) - 1)  # triangle wave in [0, 1]
        t = tri * tri * (3 - 2 * tri)  # smoothed: sine-like, but only + - * (no libm/SIMD sin)
    else:  # checks, softly blended
        cell = rng.uniform(12, 48)
        t = ((np.floor(xx / cell) + np.floor(yy / cell)) % 2) * rng.uniform(0.5, 1.0)
    img = c0[None, None] * (1 - t[..., None]) + c1[None, None] * t[..., None]
    img += rng.normal(0, rng.uniform(2, 10), size=(h, w, 1)).astype(np.float32)
    return img


def _object_colour(rng, bg_mean, min_contrast=90.0):
    """A saturated colour that stands out from ``bg_mean`` (mean RGB under the object)."""
    best, best_d = None, -1.0
    for _ in range(24):
        c = _hsv_to_rgb(rng.random(), rng.uniform(0.55, 1.0), rng.uniform(0.35, 1.0))
        d = float(np.linalg.norm(c - bg_mean))
        if d >= min_contrast:
            return c
        if d > best_d:
            best, best_d = c, d
    return best


def _object_fill(rng, colour, ys, xs, box):
    """Fill values for the pixels (ys, xs): solid, noisy or a gradient of ``colour``."""
    n = ys.shape[0]
    kind = rng.choice(3, p=(0.4, 0.3, 0.3))
    if kind == 0:
        return np.broadcast_to(colour, (n, 3))
    if kind == 1:
        return colour[None] + rng.normal(0, rng.uniform(8, 22), size=(n, 1)).astype(np.float32)
    x0, y0, x1, y1 = box
    a = float(rng.uniform(0, 2 * np.pi))
    t = (math.cos(a) * (xs - x0) / max(x1 - x0, 1) + math.sin(a) * (ys - y0) / max(y1 - y0, 1))
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    shade = rng.uniform(0.5, 0.75)
    return colour[None] * (shade + (1 - shade) * t[:, None].astype(np.float32))


def _draw_image(seed, split, index, p):
    """Draw one image. Returns (uint8 HxWx3 image, list of (cat index, polygons or None, mask))."""
    h, w = p['img_size']
    rng = np.random.default_rng(np.random.SeedSequence([seed, _SPLITS.index(split), index]))
    img = _background(rng, h, w)
    short = min(h, w)
    rmin, rmax = p['size_range'][0] * short, p['size_range'][1] * short
    n_target = int(rng.integers(p['min_objects'], p['max_objects'] + 1))

    placed = []  # dicts: cat, polys (flat, or None when the shape has a hole), full, vis
    for _ in range(n_target):
        cat = int(rng.integers(len(p['classes'])))
        for _try in range(p['max_tries']):
            r = rng.uniform(rmin, rmax)
            m = 2.0
            if w - 2 * (r + m) <= 0 or h - 2 * (r + m) <= 0:
                r = (short - 2 * m) / 2 - 1
            cx = rng.uniform(r + m, w - r - m)
            cy = rng.uniform(r + m, h - r - m)
            fill, holes = _shape_polygons(p['classes'][cat], cx, cy, r, rng)
            flat_fill = [_flat(q) for q in fill]
            full = _rasterise(flat_fill, h, w)
            if holes:
                full &= ~_rasterise([_flat(q) for q in holes], h, w)
            area = int(full.sum())
            if area < p['min_area']:
                continue
            lefts = (int(np.count_nonzero(o['vis'] & ~full)) for o in placed)
            if any(left < p['min_area'] or left < p['min_visible_frac'] * o['area']
                   for left, o in zip(lefts, placed)):  # it would hide an earlier object
                continue
            for o in placed:
                o['vis'] &= ~full
            placed.append(dict(cat=cat, polys=None if holes else flat_fill, full=full,
                               vis=full.copy(), area=area))
            ys, xs = np.nonzero(full)
            colour = _object_colour(rng, img[ys, xs].mean(axis=0))
            img[ys, xs] = _object_fill(rng, colour, ys.astype(np.float32),
                                       xs.astype(np.float32),
                                       (xs.min(), ys.min(), xs.max(), ys.max()))
            break
    img += rng.normal(0, p['noise_std'], size=img.shape).astype(np.float32)
    img = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    objs = []
    for o in placed:
        exact = o['polys'] is not None and bool(np.array_equal(o['vis'], o['full']))
        objs.append((o['cat'], o['polys'] if exact else None, o['vis']))
    return img, objs


def _annotation(ann_id, img_id, cat_id, polys, mask):
    from pycocotools import mask as mask_utils
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    seg = polys if polys is not None else dict(size=[int(v) for v in rle['size']],
                                               counts=rle['counts'].decode('ascii'))
    return dict(id=ann_id, image_id=img_id, category_id=cat_id, segmentation=seg,
                area=float(mask_utils.area(rle)), bbox=[float(v) for v in mask_utils.toBbox(rle)],
                iscrowd=0)


def _split_paths(out_dir, split):
    return (osp.join(out_dir, f'{split}2017'),
            osp.join(out_dir, 'annotations', f'instances_{split}2017.json'))


def _write_json(path, obj):
    from mmeffattn.engine.checkpoint_io import atomic_write
    atomic_write(path, lambda f: f.write(json.dumps(obj, separators=(',', ':')).encode()))


def _generate_split(out_dir, split, num, p):
    from PIL import Image
    img_dir, ann_path = _split_paths(out_dir, split)
    os.makedirs(img_dir, exist_ok=True)
    ext = _IMG_EXT[p['img_format']]
    wanted = {f'{i:06d}{ext}' for i in range(num)}
    for name in os.listdir(img_dir):  # stale images of an earlier dataset
        if name not in wanted and osp.splitext(name)[1] in ('.png', '.jpg'):
            os.remove(osp.join(img_dir, name))
    h, w = p['img_size']
    save = (dict(format='PNG', compress_level=6) if ext == '.png' else
            dict(format='JPEG', quality=p['jpeg_quality'], subsampling=0))
    images, anns = [], []
    for i in range(num):
        img, objs = _draw_image(p['seed'], split, i, p)
        name = f'{i:06d}{ext}'
        Image.fromarray(img).save(osp.join(img_dir, name), **save)
        images.append(dict(id=i + 1, file_name=name, height=h, width=w, license=1))
        for cat, polys, mask in objs:
            anns.append(_annotation(len(anns) + 1, i + 1, cat + 1, polys, mask))
    _write_json(ann_path, dict(
        info=dict(description=f'mmeffattn synthetic shapes ({split})',
                  version=str(GENERATOR_VERSION), year=2017, contributor='mmeffattn',
                  url='', date_created=''),
        licenses=[dict(id=1, name='generated, public domain', url='')],
        images=images, annotations=anns,
        categories=[dict(id=k + 1, name=c, supercategory='shape')
                    for k, c in enumerate(p['classes'])]))
    return len(anns)


def load_shapes_meta(out_dir):
    """The ``meta.json`` of a generated dataset, or ``None`` when there is none (or it is bad)."""
    try:
        with open(osp.join(out_dir, 'meta.json')) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _is_complete(out_dir, meta, params):
    if meta is None or meta.get('params') != params:
        return False
    ext = _IMG_EXT[params['img_format']]
    for split in _SPLITS:
        img_dir, ann_path = _split_paths(out_dir, split)
        names = (f'{i:06d}{ext}' for i in range(params[f'num_{split}']))
        if split not in meta.get('splits', {}) or not osp.isfile(ann_path) or not \
                osp.isdir(img_dir) or not all(osp.isfile(osp.join(img_dir, n)) for n in names):
            return False
    return True


def _result(out_dir, meta, regenerated, seconds):
    out = dict(data_root=osp.abspath(out_dir), regenerated=regenerated, seconds=seconds,
               metainfo=shapes_metainfo(meta['params']['classes']))
    for split in _SPLITS:  # (num_images and num_instances from the meta)
        out[split] = dict(ann_file=f'annotations/instances_{split}2017.json',
                          img_prefix=f'{split}2017/', **meta['splits'][split])
    return out


def generate_shapes_coco(out_dir, num_train=200, num_val=50, img_size=(256, 256), seed=0,
                         classes=DEFAULT_CLASSES, min_objects=1, max_objects=5,
                         size_range=(0.09, 0.22), min_visible_frac=0.6, min_area=None,
                         noise_std=4.0, img_format='png', jpeg_quality=95, max_tries=20,
                         force=False, verbose=False):
    """Write a synthetic COCO instance-segmentation dataset of shapes to ``out_dir``.

    Args:
        out_dir: the dataset root (created if needed).
        num_train, num_val: images in ``train2017/`` and ``val2017/``.
        img_size: ``(H, W)`` of every image.
        seed: the dataset's seed; the same parameters always give the same files.
        classes: shape kinds (any of :data:`SHAPE_KINDS`), in category order (ids 1..K).
        min_objects, max_objects: objects attempted per image; unplaceable ones are skipped.
        size_range: circumradius of a shape as a fraction of ``min(H, W)``.
        min_visible_frac: least fraction of an object left visible by later shapes.
        min_area: least visible pixels of an object (default scales 150 px at 256x256).
        noise_std: std of the pixel noise over the whole image (0-255 scale).
        img_format: ``'png'`` (lossless) or ``'jpg'`` (with ``jpeg_quality``).
        jpeg_quality: JPEG quality when ``img_format='jpg'``.
        force: regenerate even when ``out_dir`` already holds this dataset.
        verbose: print progress.

    Returns:
        dict with ``data_root``, ``metainfo``, ``train``/``val`` (``ann_file``, ``img_prefix``,
        ``num_images``, ``num_instances``), ``regenerated`` and ``seconds``.
    """
    t0 = time.perf_counter()
    metainfo = shapes_metainfo(classes)
    h, w = (int(img_size), int(img_size)) if np.isscalar(img_size) else map(int, img_size)
    if img_format not in _IMG_EXT:
        raise ValueError(f'img_format must be one of {sorted(_IMG_EXT)}, got {img_format!r}')
    if not 1 <= min_objects <= max_objects:
        raise ValueError('need 1 <= min_objects <= max_objects')
    if not 0 < size_range[0] <= size_range[1] < 0.5:
        raise ValueError('size_range must satisfy 0 < low <= high < 0.5')
    if num_train < 0 or num_val < 0 or h < 16 or w < 16:
        raise ValueError('bad num_train/num_val/img_size')
    if min_area is None:
        min_area = max(16, round(150 * h * w / (256 * 256)))
    params = dict(version=GENERATOR_VERSION, num_train=int(num_train), num_val=int(num_val),
                  img_size=[h, w], seed=int(seed), classes=list(metainfo['classes']),
                  min_objects=int(min_objects), max_objects=int(max_objects),
                  size_range=[float(size_range[0]), float(size_range[1])],
                  min_visible_frac=float(min_visible_frac), min_area=int(min_area),
                  noise_std=float(noise_std), img_format=img_format,
                  jpeg_quality=int(jpeg_quality) if img_format == 'jpg' else None,
                  max_tries=int(max_tries))
    meta_path = osp.join(out_dir, 'meta.json')
    meta = load_shapes_meta(out_dir)
    if not force and _is_complete(out_dir, meta, params):
        return _result(out_dir, meta, False, time.perf_counter() - t0)

    os.makedirs(osp.join(out_dir, 'annotations'), exist_ok=True)
    if osp.exists(meta_path):
        os.remove(meta_path)  # the dataset is incomplete until meta.json is back
    p = dict(params, img_size=(h, w), classes=tuple(params['classes']))
    splits = {}
    for split in _SPLITS:
        ts, num = time.perf_counter(), params[f'num_{split}']
        splits[split] = dict(num_images=num, num_instances=_generate_split(out_dir, split, num, p))
        if verbose:
            print(f'{split}: {num} images, {splits[split]["num_instances"]} instances in '
                  f'{time.perf_counter() - ts:.1f} s -> {_split_paths(out_dir, split)[0]}')
    meta = dict(params=params, splits=splits, metainfo=metainfo)  # (JSON: tuples as lists)
    _write_json(meta_path, meta)
    return _result(out_dir, meta, True, time.perf_counter() - t0)


def _simple_params(img_size, classes, max_objects, size_range):
    """Drawing parameters for the layouts below: the COCO generator's defaults otherwise."""
    h, w = img_size
    shapes_metainfo(classes)  # checks the names
    return dict(img_size=(h, w), classes=tuple(classes), min_objects=1, max_objects=max_objects,
                size_range=size_range, min_visible_frac=0.6, noise_std=4.0, max_tries=20,
                min_area=max(16, round(150 * h * w / (256 * 256))))


def generate_shapes_ade20k(out_dir, num_images=4, img_size=(128, 160), seed=0,
                           classes=DEFAULT_CLASSES, max_objects=5):
    """Write shapes as semantic segmentation in the layout of mmseg's ``ADE20KDataset``:
    ``images/validation/*.jpg`` and ``annotations/validation/*.png``, whose label maps hold 0 for
    the background and ``k`` for the k-th of ``classes`` (class ``k - 1`` under the
    ``reduce_zero_label=True`` of ADE20K's configs). Returns ``out_dir``."""
    from PIL import Image
    p = _simple_params(img_size, classes, max_objects, (0.12, 0.3))
    for sub in ('images', 'annotations'):
        os.makedirs(osp.join(out_dir, sub, 'validation'), exist_ok=True)
    for i in range(num_images):
        img, objs = _draw_image(seed, 'val', i, p)
        label = np.zeros(img.shape[:2], np.uint8)
        for cat, _, visible in objs:
            label[visible] = cat + 1
        name = f'shapes_{i:06d}'
        Image.fromarray(img).save(osp.join(out_dir, 'images', 'validation', name + '.jpg'),
                                  quality=95, subsampling=0)
        Image.fromarray(label).save(osp.join(out_dir, 'annotations', 'validation', name + '.png'))
    return out_dir


def generate_shapes_imagenet(out_dir, num_per_class=1, img_size=(64, 64), seed=0,
                             classes=tuple(SHAPE_KINDS)):
    """Write shapes as image classification in ImageNet's layout (``val/*.png`` and
    ``meta/val.txt`` lines ``FILE LABEL``, as mmpretrain's ``ImageNet(split='val')`` reads it):
    each image holds one large shape on a textured background, and its label is the index of
    that shape's kind in ``classes``. Returns ``out_dir``."""
    from PIL import Image
    p = _simple_params(img_size, classes, 1, (0.3, 0.45))
    os.makedirs(osp.join(out_dir, 'val'), exist_ok=True)
    os.makedirs(osp.join(out_dir, 'meta'), exist_ok=True)
    lines = []
    for i in range(num_per_class * len(classes)):
        label = i % len(classes)
        img, objs = _draw_image(seed, 'val', i, dict(p, classes=(classes[label], )))
        if not objs:  # pragma: no cover  (one shape in an empty image always fits)
            raise RuntimeError(f'no room for a {classes[label]} at img_size={img_size}')
        name = f'shapes_{i:06d}.png'
        Image.fromarray(img).save(osp.join(out_dir, 'val', name))
        lines.append(f'{name} {label}\n')
    with open(osp.join(out_dir, 'meta', 'val.txt'), 'w') as f:
        f.writelines(lines)
    return out_dir


def make_contact_sheet(data_root, out_path, split='train', num_images=8, cols=4, alpha=0.45):
    """Save a grid of ``split`` images, each beside a copy with its masks, boxes and class names
    drawn over it."""
    from PIL import Image, ImageDraw
    from pycocotools.coco import COCO
    img_dir, ann_path = _split_paths(data_root, split)
    coco = COCO(ann_path)
    palette = {cat['id']: np.array(SHAPE_KINDS.get(cat['name'], (255, 255, 255)), np.float32)
               for cat in coco.loadCats(coco.getCatIds())}
    tiles = []
    for img_id in sorted(coco.getImgIds())[:num_images]:
        info = coco.loadImgs(img_id)[0]
        img = np.asarray(Image.open(osp.join(img_dir, info['file_name'])).convert('RGB'))
        over = img.astype(np.float32)
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
        for ann in anns:
            m = coco.annToMask(ann).astype(bool)
            over[m] = (1 - alpha) * over[m] + alpha * palette[ann['category_id']]
            # the mask's outline, so the alignment with the drawn shape is visible
            edge = m & ~(np.roll(m, 1, 0) & np.roll(m, -1, 0) & np.roll(m, 1, 1)
                         & np.roll(m, -1, 1))
            over[edge] = palette[ann['category_id']]
        pil = Image.fromarray(np.clip(over, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(pil)
        for ann in anns:
            x, y, bw, bh = ann['bbox']
            col = tuple(int(v) for v in palette[ann['category_id']])
            draw.rectangle([x, y, x + bw - 1, y + bh - 1], outline=col)
            kind = 'rle' if isinstance(ann['segmentation'], dict) else 'poly'
            label = f"{coco.cats[ann['category_id']]['name']} {kind}"
            draw.rectangle([x, y, x + 6 * len(label) + 2, y + 10], fill=(0, 0, 0))
            draw.text((x + 1, y), label, fill=col)
        pair = Image.new('RGB', (2 * info['width'] + 4, info['height']), (255, 255, 255))
        pair.paste(Image.fromarray(img), (0, 0))
        pair.paste(pil, (info['width'] + 4, 0))
        tiles.append(pair)
    if not tiles:
        raise ValueError(f'no images in {ann_path}')
    cols = max(1, min(cols, len(tiles)))
    rows = (len(tiles) + cols - 1) // cols
    tw, th = max(t.width for t in tiles) + 8, max(t.height for t in tiles) + 8
    sheet = Image.new('RGB', (cols * tw, rows * th), (255, 255, 255))
    for k, t in enumerate(tiles):
        sheet.paste(t, ((k % cols) * tw + 4, (k // cols) * th + 4))
    os.makedirs(osp.dirname(osp.abspath(out_path)), exist_ok=True)
    sheet.save(out_path)
    return out_path


def main(argv=None):
    parser = argparse.ArgumentParser(
        description='Generate the synthetic COCO-format shapes dataset (deterministic).')
    parser.add_argument('out_dir')
    parser.add_argument('--num-train', type=int, default=200)
    parser.add_argument('--num-val', type=int, default=50)
    parser.add_argument('--img-size', type=int, nargs=2, default=(256, 256), metavar=('H', 'W'))
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--classes', nargs='+', default=list(DEFAULT_CLASSES),
                        choices=sorted(SHAPE_KINDS))
    parser.add_argument('--max-objects', type=int, default=5)
    parser.add_argument('--min-objects', type=int, default=1)
    parser.add_argument('--img-format', choices=sorted(_IMG_EXT), default='png')
    parser.add_argument('--force', action='store_true', help='regenerate even if up to date')
    parser.add_argument('--preview', metavar='PNG',
                        help='also save a contact sheet of training images with their masks')
    args = vars(parser.parse_args(argv))
    preview = args.pop('preview')
    res = generate_shapes_coco(**args, verbose=True)
    state = 'generated' if res['regenerated'] else 'already up to date'
    print(f"{res['data_root']}: {state} in {res['seconds']:.1f} s; "
          f"train {res['train']['num_images']} images / {res['train']['num_instances']} "
          f"instances, val {res['val']['num_images']} / {res['val']['num_instances']}")
    print(f"metainfo = {res['metainfo']}")
    if preview:
        print('preview:', make_contact_sheet(res['data_root'], preview))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
