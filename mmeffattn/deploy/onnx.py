"""ONNX export of models built with mmeffattn's ops, and the onnxruntime check of a file.

:func:`export_onnx` exports an :class:`ExportWrapper` with torch's dynamo-based exporter (opset 18
by default, optionally with a symbolic height and width), with three of its translations replaced
(:func:`translation_table`); :func:`check_parity` runs the file with onnxruntime beside PyTorch."""
import importlib.util
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmeffattn.analysis.flops import model_kind
from mmeffattn.ops import use_backend

__all__ = ['ExportWrapper', 'export_onnx', 'translation_table', 'cdist_translation',
           'floordiv_translation', 'gelu_translation', 'onnx_session', 'check_parity',
           'check_sizes', 'input_dims', 'preprocess_meta', 'relative_error', 'require_onnx',
           'PARTS', 'MIN_DYNAMIC_SIDE']

PARTS = ('auto', 'backbone')
DEFAULT_OPSET = 18
#: smallest side of a dynamic export of our backbones, see :attr:`ExportWrapper.min_dynamic_side`
MIN_DYNAMIC_SIDE = 64


def require_onnx() -> None:
    """Raise a clear error if the optional export dependencies are missing."""
    missing = [n for n in ('onnx', 'onnxruntime', 'onnxscript') if not importlib.util.find_spec(n)]
    if missing:
        raise ImportError(f'ONNX export needs {", ".join(missing)}: install the optional extra '
                          f'with `pip install -e .[deploy]` (or `pip install {" ".join(missing)}`)')


class ExportWrapper(nn.Module):
    """The tensor-in, tensors-out part of a built model that is exported (``what``).

    With ``part='auto'``: an mmpretrain ``ImageClassifier`` gives its logits
    ``[B, num_classes]``; an mmseg ``EncoderDecoder`` its decode head's logits resized to the
    input (the auxiliary head is a training aid); an mmdet detector its backbone + neck feature
    maps (heads, box decoding and NMS are mmdeploy's job); any other module (a backbone) its
    outputs. ``part='backbone'``: the backbone's outputs alone. The input is the *normalised*
    image ``[B, 3, H, W]``, as the model's data preprocessor makes it.

    Args:
        model: an mmpretrain classifier, an mmseg segmentor, an mmdet detector or a backbone.
        part: ``'auto'`` or ``'backbone'``.
    """

    def __init__(self, model: nn.Module, part: str = 'auto') -> None:
        super().__init__()
        if part not in PARTS:
            raise ValueError(f'part must be one of {PARTS}, got {part!r}')
        self.model = model
        self.kind = model_kind(model)
        neck = 'backbone+neck' if getattr(model, 'with_neck', False) else 'backbone'
        self.what = 'backbone' if part == 'backbone' else {
            'classifier': 'logits', 'segmentor': 'seg_logits', 'detector': neck,
            'module': 'backbone'}[self.kind]

    @property
    def min_dynamic_side(self) -> int:
        """The smallest side a dynamic export can take: twice the coarsest output stride, so
        that no output has a side of 1 (torch.export specialises size 1). 32 for our backbones;
        an FPN's extra levels (mmdet's ``num_outs`` beyond the backbone levels it takes, e.g.
        RetinaNet's P6-P7) double it each."""
        neck = getattr(self.model, 'neck', None) if self.what == 'backbone+neck' else None
        extra = 0
        if neck is not None and hasattr(neck, 'num_outs') and hasattr(neck, 'backbone_end_level'):
            extra = max(0, neck.num_outs - (neck.backbone_end_level - neck.start_level))
        return MIN_DYNAMIC_SIDE * 2 ** extra

    def forward(self, x: torch.Tensor) -> Any:
        """``x``: the normalised image ``[B, 3, H, W]``."""
        m = self.model
        if self.what == 'backbone':
            return m.backbone(x) if self.kind != 'module' else m(x)
        if self.what == 'logits':
            return m(x, mode='tensor')  # [B, num_classes]
        if self.what == 'backbone+neck':
            return m.neck(m.backbone(x))  # tuple of [B, C, H / s, W / s]
        # segmentor: EncoderDecoder.encode_decode without the meta data: logits at the input
        # size (mmseg resizes to the image shape in decode_head.predict the same way)
        logits = m.decode_head(m.extract_feat(x))  # [B, K, H / 4, W / 4]
        return F.interpolate(logits, size=x.shape[2:], mode='bilinear',
                             align_corners=m.decode_head.align_corners)  # [B, K, H, W]


def preprocess_meta(model: nn.Module) -> Dict[str, str]:
    """The data preprocessor's normalisation, for the ONNX metadata (what the graph expects)."""
    pre = getattr(model, 'data_preprocessor', None)
    meta = {}
    for key in ('mean', 'std'):
        value = getattr(pre, key, None)
        if isinstance(value, torch.Tensor):
            meta[key] = ','.join(f'{v:g}' for v in value.flatten().tolist())
    for key in ('_channel_conversion', 'channel_conversion'):
        if hasattr(pre, key):
            meta['bgr_to_rgb'] = str(bool(getattr(pre, key)))
    return meta


#: rows of ``x1`` per step of the p=1 translation's Scan: a ``[64, M, D]`` difference block
#: stays in the cache where the whole ``[N, M, D]`` went through memory (3x faster in ORT)
CDIST_BLOCK_ROWS = 64


def cdist_translation() -> Callable:
    """ONNX translation of ``aten._cdist_forward`` (torch's exporter has none).

    p=1 (LaplacianFormer's kernel) is a ``Scan`` of ``ReduceL1`` over blocks of
    :data:`CDIST_BLOCK_ROWS` rows of ``x1`` (padded, the padding sliced off); p=2 broadcasts."""
    from onnxscript import ir
    from onnxscript import opset18 as op

    def ints(*values: int) -> ir.Value:
        return op.Constant(value_ints=list(values))

    def l1_block(y: ir.Value, dtype: ir.DataType) -> ir.Graph:
        """The Scan body: a block ``[..., R, D]`` of x1 -> its L1 distances to ``y [..., 1, M,
        D]`` (an outer-scope value), ``[..., R, M]``."""
        block = ir.Value(name='cdist_block', type=ir.TensorType(dtype))
        axes = [ir.node('Constant', [], {'value_ints': [a]}) for a in (-2, -1)]
        rows = ir.node('Unsqueeze', [block, axes[0].outputs[0]])  # [..., R, 1, D]
        diff = ir.node('Sub', [rows.outputs[0], y])  # [..., R, M, D]
        dist = ir.node('ReduceL1', [diff.outputs[0], axes[1].outputs[0]], {'keepdims': 0})
        return ir.Graph([block], dist.outputs, nodes=[*axes, rows, diff, dist],
                        name='cdist_l1_block')

    def cdist_forward(x1, x2, p: float = 2.0, compute_mode: Optional[int] = None):
        if p == 1.0:
            rank, R = len(x1.shape), CDIST_BLOCK_ROWS
            n = op.Shape(x1, start=-2, end=-1)  # [1]: N
            pad = op.Mod(op.Sub(ints(R), n), ints(R))  # rows to a multiple of R
            padded = op.Pad(x1, op.Concat(ints(*[0] * (2 * rank - 2)), pad, ints(0), axis=0))
            blocks = op.Reshape(padded, op.Concat(ints(*[0] * (rank - 2), -1, R),
                                                  op.Shape(x1, start=-1), axis=0))
            dist = op.Scan(blocks, body=l1_block(op.Unsqueeze(x2, [-3]), x1.dtype),
                           num_scan_inputs=1, scan_input_axes=[-3], scan_output_axes=[-3])
            dist = op.Reshape(dist, op.Concat(ints(*[0] * (rank - 2), -1),
                                              op.Shape(x2, start=-2, end=-1), axis=0))
            return op.Slice(dist, ints(0), n, ints(-2))  # [..., N, M]
        if p == 2.0:
            diff = op.Sub(op.Unsqueeze(x1, [-2]), op.Unsqueeze(x2, [-3]))  # [..., N, M, D]
            return op.Sqrt(op.ReduceSum(op.Mul(diff, diff), [-1], keepdims=0))
        raise NotImplementedError(f'cdist with p={p}: only p=1 and p=2 are translated to ONNX')

    return cdist_forward


def floordiv_translation() -> Callable:
    """ONNX translation of Python's ``//`` on symbolic sizes (``operator.floordiv``) that floors.

    torch's exporter emits a bare ``Div``, which truncates towards zero: wrong for the negative
    operands of ``ceil(a / b) == -((-a) // b)`` (LaplacianFormer's landmark count), where a
    dynamic file would compute 7 landmark rows instead of 8 on an odd grid. ``Mod`` takes the
    divisor's sign, as Python does, so ``(a - a mod b) / b == floor(a / b)`` exactly."""
    from onnxscript import opset18 as op

    def floordiv(a, b):
        return op.Div(op.Sub(a, op.Mod(a, b)), b)

    return floordiv


def gelu_translation() -> Callable:
    """ONNX translation of ``aten.gelu`` that onnxruntime runs as one ``Gelu`` kernel.

    Opset 18 has no Gelu, and onnxruntime does not fuse torch's ``x * (0.5 * (1 + erf(x /
    sqrt(2))))``: ``(x * (1 + erf(x / sqrt(2)))) * 0.5`` is the pattern it fuses. The tanh
    approximation stays torch's."""
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops.nn import aten_gelu

    def gelu(x, approximate: str = 'none'):
        if approximate != 'none':
            return aten_gelu(x, approximate=approximate)
        erf = op.Erf(op.Div(x, op.CastLike(op.Constant(value_float=2 ** 0.5), x)))
        one, half = (op.CastLike(op.Constant(value_float=v), x) for v in (1., .5))
        return op.Mul(op.Mul(x, op.Add(erf, one)), half)

    return gelu


def translation_table() -> Dict[Any, Callable]:
    """The custom ONNX translations this tool registers with torch's exporter."""
    import operator
    return {torch.ops.aten._cdist_forward.default: cdist_translation(),
            operator.floordiv: floordiv_translation(),
            torch.ops.aten.gelu.default: gelu_translation()}


def dynamic_side_error(wrapper: nn.Module, shape: Sequence[int]) -> str:
    return (f'a dynamic export of the {getattr(wrapper, "what", "model")} needs each side of the '
            f'export size to be at least {getattr(wrapper, "min_dynamic_side", MIN_DYNAMIC_SIDE)} '
            f'(twice its coarsest stride), got {tuple(shape)}; export at a larger size')


def export_onnx(wrapper: nn.Module, shape: Sequence[int], out: str, dynamic: bool = False,
                opset: int = DEFAULT_OPSET, metadata: Optional[Dict[str, str]] = None,
                batch: int = 1) -> str:
    """Export ``wrapper`` (an :class:`ExportWrapper`, or any module taking an image batch) at
    ``shape`` (H, W) and ``batch`` to ``out``, with ``metadata`` in the file; returns ``out``.

    With ``dynamic`` the height and width are symbolic (each at least
    :attr:`ExportWrapper.min_dynamic_side`); a model whose code pins a size (a Python int taken
    from a shape, a branch on it) makes ``torch.export`` raise, naming the guard. The ops run
    their PyTorch backend: a Triton kernel cannot be exported."""
    require_onnx()
    x = torch.randn(batch, 3, *shape)
    if dynamic:
        # the batch stays 1: a dimension exported at size 1 is specialised by torch.export
        # (any module may be exported; our wrapper knows its outputs' coarsest stride)
        side = getattr(wrapper, 'min_dynamic_side', MIN_DYNAMIC_SIDE)
        if min(shape) < side:
            raise ValueError(dynamic_side_error(wrapper, shape))
        dims = {2: torch.export.Dim('height', min=side, max=16384),
                3: torch.export.Dim('width', min=side, max=16384)}
    with torch.no_grad(), use_backend('torch'):
        if dynamic:
            # torch.export first: torch.onnx.export falls back to a static graph when the model
            # pins a size, silently; torch.export raises and names the guard that pins it
            wrapper = torch.export.export(wrapper, (x, ), dynamic_shapes=(dims, ), strict=False)
        program = torch.onnx.export(wrapper, (x, ), dynamo=True, opset_version=opset,
                                    custom_translation_table=translation_table(),
                                    input_names=['image'], verbose=False, optimize=True)
    program.model.metadata_props.update(metadata or {})
    program.save(out)
    return out


def input_dims(path: str) -> List[Any]:
    """The first input's dimensions: ints (static) or names (symbolic)."""
    import onnx
    proto = onnx.load(path, load_external_data=False)
    return [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]


def check_sizes(shape: Sequence[int], dynamic: bool,
                min_side: int = MIN_DYNAMIC_SIDE) -> List[Tuple[int, int]]:
    """The export size, and for a dynamic file two more (each side at least ``min_side``): one
    larger and one with odd sides."""
    h, w = int(shape[0]), int(shape[1])
    odd = (h + 17 - h % 2, w + 9 - w % 2)
    return [(h, w), (h + 64, max(w - 32, min_side)), odd] if dynamic else [(h, w)]


def _flatten(outs: Any) -> List[torch.Tensor]:
    if isinstance(outs, torch.Tensor):
        return [outs]
    return [t for o in outs for t in _flatten(o)]


def relative_error(got: Any, ref: torch.Tensor) -> float:
    """``max|got - ref| / max|ref|`` (max over all elements, not per element)."""
    ref_np = ref.detach().float().numpy()
    scale = max(float(abs(ref_np).max()), 1e-12)
    return float(abs(got - ref_np).max()) / scale


def onnx_session(path: str, threads: Optional[int] = None) -> Any:
    """An onnxruntime session of ``path`` on the CPU execution provider, every graph
    optimization on, ``threads`` intra-op threads (default: torch's current count)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=['CPUExecutionProvider'])


def check_parity(path: str, wrapper: nn.Module, sizes: Sequence[Tuple[int, int]],
                 seed: int = 0) -> List[Dict[str, Any]]:
    """Run the ONNX file with onnxruntime and ``wrapper`` with PyTorch on the same random image
    at each size. Returns one record per size: ``size``, ``rel_err`` (over every output),
    ``shapes``, ``ort_ms``, ``torch_ms``."""
    session = onnx_session(path)
    name = session.get_inputs()[0].name
    gen = torch.Generator().manual_seed(seed)
    records = []
    for hw in sizes:
        x = torch.randn(1, 3, *hw, generator=gen)
        t0 = time.perf_counter()
        got = session.run(None, {name: x.numpy()})
        ort_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        with torch.no_grad(), use_backend('torch'):
            ref = _flatten(wrapper(x))
        torch_ms = (time.perf_counter() - t0) * 1e3
        shapes = [tuple(r.shape) for r in ref]
        if [tuple(g.shape) for g in got] != shapes:
            raise RuntimeError(f'{path}: onnxruntime returned outputs of shapes '
                               f'{[tuple(g.shape) for g in got]} at {hw}, PyTorch {shapes}')
        records.append(dict(size=tuple(hw), shapes=shapes, ort_ms=ort_ms, torch_ms=torch_ms,
                            rel_err=max(relative_error(g, r) for g, r in zip(got, ref))))
    return records
