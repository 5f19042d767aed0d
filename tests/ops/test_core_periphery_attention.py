"""Core-periphery attention (VECA): Triton kernels (interpreted on CPU, compiled on CUDA) vs the
PyTorch reference, reference semantics against the official formulation, gradients (q, k, v and
the rope tables), dispatch and input validation."""
import math
from typing import NamedTuple, Optional

import pytest
import torch
import torch.nn.functional as F

from mmeffattn.ops import _backend, core_periphery_attention, core_periphery_attention_naive
from mmeffattn.ops.core_periphery import op as cp_op
from op_checks import DEVICE, DTYPES, HAS_CUDA, assert_close, needs_triton, rms

pytestmark = pytest.mark.usefixtures('one_thread')


class Case(NamedTuple):
    B: int
    heads: int
    C: int  # cores
    N: int  # patches
    D: int
    dtype: str
    rope: Optional[str] = None  # None, 'batch' ([B, C+N, D] tables) or 'shared' ([1, C+N, D])
    scale: Optional[float] = None
    splits: Optional[int] = None  # force the split count of the core rows' long loops

    @property
    def id(self) -> str:
        s = f'B{self.B}-H{self.heads}-C{self.C}-N{self.N}-D{self.D}-{self.dtype}'
        if self.rope:
            s += f'-rope_{self.rope}'
        if self.scale is not None:
            s += f'-scale{self.scale:g}'
        if self.splits is not None:
            s += f'-split{self.splits}'
        return s


def make_inputs(case: Case, device: str = DEVICE, seed: int = 0, table_dtype=torch.float32):
    """q, k, v ``[B, heads, C+N, D]`` in the case's dtype and the rope tables (or None): cos and
    sin of random angles per token and channel pair, as VECA's ``Rotary2D.cos_sin`` builds them
    (angles repeated for both channels of a pair), in ``table_dtype``."""
    g = torch.Generator().manual_seed(seed)
    L = case.C + case.N
    shape = (case.B, case.heads, L, case.D)
    dtype = DTYPES[case.dtype]
    q, k, v = (torch.randn(shape, generator=g).to(device, dtype) for _ in range(3))
    rope = None
    if case.rope:
        rows = case.B if case.rope == 'batch' else 1
        angles = (torch.rand(rows, L, case.D // 2, generator=g) * 2 * math.pi
                  ).repeat_interleave(2, dim=-1)
        rope = tuple(t.to(device, table_dtype) for t in (angles.cos(), angles.sin()))
    return q, k, v, rope


# Launch sizes: at most ~100 interpreted programs per launch. Together the cases cover one core
# and C in {5, 8, 16}, N in {7, 49, 131} (N < C as well), head dims 24/32/64 (padded and not)
# and 16/128, rope tables per sample and broadcast, forced splits of the long loops (2 and 3,
# uneven), several core blocks (C = 70 and 20 in fp32, 130 in fp16), a custom scale.
TRITON_CASES = [
    Case(2, 2, 1, 49, 24, 'fp32'),
    Case(2, 2, 1, 7, 32, 'fp16', 'batch'),
    Case(1, 2, 5, 131, 32, 'fp16', 'batch'),
    Case(1, 2, 5, 49, 32, 'fp32', scale=0.3),
    Case(1, 2, 8, 7, 64, 'fp32', 'batch'),
    Case(1, 2, 8, 131, 64, 'fp16', splits=2),
    Case(2, 2, 16, 49, 64, 'fp16', 'shared'),
    Case(1, 2, 16, 131, 24, 'fp32', 'shared', splits=3),
    Case(1, 2, 8, 49, 24, 'fp16', 'shared', splits=3),
    Case(1, 1, 70, 20, 40, 'fp32', 'batch'),
    Case(1, 1, 130, 33, 16, 'fp16', splits=2),
    Case(1, 2, 8, 49, 128, 'fp16', 'batch'),
    Case(1, 1, 20, 23, 128, 'fp32', 'shared'),  # 16-row blocks: two core blocks
]


def reference_fp64(q, k, v, rope, case: Case):
    """The reference evaluated in float64 on the same (rounded) inputs, with input gradients.
    The op casts the rope tables to q's dtype, so the reference sees the tables so rounded."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    rope64 = None
    if rope is not None:
        rope64 = [t.detach().to(q.dtype).double().requires_grad_() for t in rope]
        leaves += rope64
    out = core_periphery_attention_naive(*leaves[:3], case.C, rope=rope64, scale=case.scale)
    return out, leaves


def check_against_reference(case: Case, backend: str, device: str = DEVICE,
                            table_dtype=torch.float32) -> None:
    dtype = DTYPES[case.dtype]
    q, k, v, rope = make_inputs(case, device, table_dtype=table_dtype)
    inputs = [x.requires_grad_() for x in (q, k, v) + tuple(rope or ())]
    if case.splits is not None:  # the registered op the dispatch calls, with a forced split
        assert backend == 'triton'
        out = cp_op.core_periphery_attention_triton(q, k, v, case.C, rope=rope,
                                                    scale=case.scale, splits=case.splits)
    else:
        out = core_periphery_attention(q, k, v, case.C, rope=rope, scale=case.scale,
                                       backend=backend)
    assert out.dtype == dtype and out.shape == q.shape
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    out.backward(do)

    ref, leaves = reference_fp64(q, k, v, rope, case)
    ref.backward(do.double())
    assert_close(out, ref, dtype, 'out')
    for name, x, x64 in zip(['dq', 'dk', 'dv', 'dcos', 'dsin'], inputs, leaves):
        assert x.grad is not None, f'{name}: no gradient'
        assert x.grad.dtype == x.dtype, f'{name}: gradient dtype {x.grad.dtype} != {x.dtype}'
        assert_close(x.grad, x64.grad, dtype, name)


# ------------------------------------------------------------------------------------------
# Triton vs reference
# ------------------------------------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize('case', TRITON_CASES, ids=lambda c: c.id)
def test_triton_matches_reference(case: Case) -> None:
    check_against_reference(case, backend='triton')


@needs_triton
def test_triton_fp64_tables_with_fp16_inputs() -> None:
    """Tables of another dtype than q are cast to q's dtype; their gradients come back in their
    own dtype."""
    check_against_reference(Case(1, 2, 8, 49, 32, 'fp16', 'batch'), backend='triton',
                            table_dtype=torch.float64)


@needs_triton
@pytest.mark.parametrize('case', [Case(1, 2, 16, 131, 24, 'fp32', 'shared', splits=3),
                                  Case(1, 2, 8, 49, 64, 'fp16', 'batch'),
                                  Case(1, 1, 20, 23, 128, 'fp32')], ids=lambda c: c.id)
def test_triton_deterministic_backward(case: Case) -> None:
    """Under ``torch.use_deterministic_algorithms`` the backward takes the separate dq and dk/dv
    kernels (no atomics), which match the reference too."""
    from mmeffattn.ops.core_periphery import function
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not function.use_fused_backward()
        check_against_reference(case, backend='triton')
    finally:
        torch.use_deterministic_algorithms(previous)


@pytest.mark.skipif(not _backend.HAS_TRITON, reason='needs Triton')
def test_triton_cases_cover_every_launch() -> None:
    """The cases above issue every launch role of the fused and of the deterministic backward,
    with and without rope, in fp32 and fp16, and reach the split (partials + reduction) path of
    each long loop and several core blocks."""
    from mmeffattn.ops._launch import record_launches
    from mmeffattn.ops.core_periphery import function
    seen = set()
    for case in TRITON_CASES:
        q, k, v, rope = make_inputs(case, 'cpu')
        cos, sin = rope if rope else (None, None)
        with record_launches() as launches:
            o, lse = function.core_periphery_fwd(q, k, v, cos, sin, case.C, 1., splits=case.splits)
            for fused in (True, False):
                function.core_periphery_bwd(o, q, k, v, cos, sin, o, lse, case.C, 1.,
                                            splits=case.splits, fused=fused)
        for launch in launches:
            constexprs = launch.config.constexprs
            seen.add((case.dtype, launch.role, constexprs.get('ROPE')))
            if launch.role.endswith('_cores'):
                args = dict(zip(launch.config.kernel.arg_names, launch.args))
                seen.add((launch.role, 'split' if args['n_splits'] > 1 else 'whole'))
                seen.add((launch.role, 'several core blocks' if args['n_blocks'] > 1 else 'one'))
            if launch.role in ('bwd_keys', 'bwd_dq_cores'):
                seen.add((launch.role, 'acc' if constexprs['ACC_INIT'] else 'no acc'))
            if launch.role == 'bwd_keys':
                args = dict(zip(launch.config.kernel.arg_names, launch.args))
                seen.add((launch.role, 'several core blocks' if args['blocks_per_split'] > 1
                          else 'one'))
    roles = ['fwd_patches', 'fwd_cores', 'bwd_preprocess', 'bwd_patches', 'bwd_keys',
             'bwd_dq_patches', 'bwd_dq_cores', 'bwd_dkdv_patches', 'bwd_dkdv_cores']
    wanted = {(dt, r, rope) for dt in ('fp32', 'fp16') for r in roles if r != 'bwd_preprocess'
              for rope in (True, False)}
    wanted |= {(r, kind) for r in ('fwd_cores', 'bwd_dq_cores', 'bwd_dkdv_cores')
               for kind in ('split', 'whole', 'several core blocks', 'one')}
    wanted |= {('bwd_keys', 'several core blocks'), ('bwd_keys', 'one'), ('bwd_keys', 'acc'),
               ('bwd_dq_cores', 'acc'), ('bwd_dq_cores', 'no acc')}
    assert not wanted - seen, sorted(wanted - seen, key=str)


@pytest.mark.skipif(not (HAS_CUDA and _backend.HAS_TRITON),
                    reason='bf16 tl.dot is wrong in Triton\'s interpreter: bf16 runs on CUDA only')
@pytest.mark.parametrize('case', [Case(2, 3, 8, 196, 64, 'bf16', 'batch'),
                                  Case(2, 6, 64, 196, 64, 'bf16', 'shared'),
                                  Case(1, 2, 64, 1029, 64, 'bf16', 'batch')],
                         ids=lambda c: c.id)
def test_triton_matches_reference_bf16_cuda(case: Case) -> None:
    check_against_reference(case, backend='triton', device='cuda')


@needs_triton
def test_triton_strided_inputs() -> None:
    """q, k, v as views of token-major projections ``[B, C+N, heads, D]``, as the backbone
    passes them, and a strided (non-contiguous) rope table."""
    B, C, N, nh, D = 1, 5, 29, 2, 32
    L = C + N
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(B, L, 3, nh, D, generator=g).to(DEVICE).requires_grad_()
    angles = torch.rand(B, L, 2 * D, generator=g).to(DEVICE)
    table = torch.stack((angles.cos(), angles.sin()))[..., ::2].requires_grad_()  # D stride 2
    cos, sin = table.unbind(0)
    # ... and sin a unit-D-stride view with another token stride than cos
    sin = F.pad(sin, (0, 8))[..., :D]
    assert sin.stride(-1) == 1 and sin.stride(1) == D + 8
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, nh, L, D], token stride 3*nh*D
    assert not q.is_contiguous()
    out = core_periphery_attention(q, k, v, C, rope=(cos, sin), backend='triton')
    do = torch.randn(out.shape, generator=g).to(DEVICE)
    out.backward(do)

    qkv64 = qkv.detach().double().requires_grad_()
    table64 = table.detach().double().requires_grad_()
    q64, k64, v64 = qkv64.permute(2, 0, 3, 1, 4).unbind(0)
    ref = core_periphery_attention_naive(q64, k64, v64, C, rope=tuple(table64.unbind(0)))
    ref.backward(do.double())
    assert_close(out, ref, torch.float32, 'out')
    assert_close(qkv.grad, qkv64.grad, torch.float32, 'dqkv')
    assert_close(table.grad, table64.grad, torch.float32, 'd(cos, sin)')


@needs_triton
def test_triton_no_grad_and_partial_grad() -> None:
    """Inference needs no saved tensors; gradients only for the inputs that require them (here
    only the rope tables, as for VECA's learned core coordinates with a frozen trunk)."""
    case = Case(1, 2, 8, 33, 32, 'fp32', 'batch')
    q, k, v, rope = make_inputs(case)
    with torch.no_grad():
        out = core_periphery_attention(q, k, v, case.C, rope=rope, backend='triton')
    ref, _ = reference_fp64(q, k, v, rope, case)
    assert_close(out, ref, torch.float32, 'out')

    cos, sin = (t.requires_grad_() for t in rope)
    core_periphery_attention(q, k, v, case.C, rope=(cos, sin), backend='triton').sum().backward()
    assert q.grad is None and k.grad is None and v.grad is None
    ref, leaves = reference_fp64(q, k, v, (cos, sin), case)
    ref.sum().backward()
    assert_close(cos.grad, leaves[3].grad, torch.float32, 'dcos')
    assert_close(sin.grad, leaves[4].grad, torch.float32, 'dsin')


@needs_triton
@pytest.mark.parametrize('splits', [None, 2], ids=['whole', 'split2'])
# the interpreter evaluates exp2 of the padded keys before tl.where discards it (as the GPU does)
@pytest.mark.filterwarnings('ignore:overflow encountered in exp2:RuntimeWarning')
def test_triton_very_negative_logits(splits) -> None:
    """Every logit far below zero (log-sum-exp < -128 in log2 units, where exp2(0 - lse)
    overflows fp32) must still give finite, correct results with padded core blocks (C = 5 in a
    16-row block) and padded key blocks. Logits near -100 carry fp32 rounding of ~1e-5
    absolute, which the softmax gradient turns into ~1e-4 relative error: the check is looser
    than the fp32 tolerance. dq is looser still: the keys are nearly equal (|k| ~ 12 along one
    direction, 0.01 noise) and sum_j dS_ij = 0, so dq_i = sum_j dS_ij (k_j - mean k) amplifies
    the logits' rounding about a thousandfold: measured 2.1e-3 on the core rows, and 2.8e-5 or
    1.2e-3 on the patch rows with 32- or 16-row blocks (the interpreter's fp32 matmul rounds
    differently per tile shape; the separate dq kernel and the fused one alike)."""
    case = Case(1, 2, 5, 70, 32, 'fp32', scale=1.)
    q, k, v, _ = make_inputs(case)
    direction = torch.randn(case.D, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    k = direction.div(case.D ** 0.5).mul(12.).expand_as(k) + 0.01 * k
    q = (-k.mean(dim=2, keepdim=True)).expand_as(q).contiguous() + 0.01 * q
    assert (q @ k.transpose(-1, -2)).max() < -100  # logits, with scale 1
    q, k, v = (x.contiguous().requires_grad_() for x in (q, k, v))
    out = cp_op.core_periphery_attention_triton(q, k, v, case.C, scale=1., splits=splits)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out.backward(do)
    ref, leaves = reference_fp64(q, k, v, None, case)
    ref.backward(do.double())
    for name, x, x64 in zip(['out', 'dq', 'dk', 'dv'], (out, q.grad, k.grad, v.grad),
                            (ref, *(t.grad for t in leaves))):
        assert torch.isfinite(x).all(), f'{name}: non-finite values'
        err = rms(x.double().cpu() - x64.detach().cpu()) / rms(x64.detach())
        assert err < (5e-3 if name == 'dq' else 1e-3), f'{name}: relative RMS error {err:.2e}'


# ------------------------------------------------------------------------------------------
# the reference alone
# ------------------------------------------------------------------------------------------
def official_formulation(q, k, v, cos, sin, C):
    """VECA's attention as the official ``MaskedBiDirAttentionSDPA`` + ``Rotary2D`` compute it,
    re-written here: rotate q and k (channel pairs (2i, 2i+1) -> (-x_{2i+1}, x_{2i})), then one
    SDPA call for the cores over all keys and one for the patches over the core keys."""
    def rotate(x):
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((-odd, even), dim=-1).flatten(-2)

    cos, sin = cos.to(q.dtype)[:, None], sin.to(q.dtype)[:, None]
    q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    cores = F.scaled_dot_product_attention(q[:, :, :C], k, v)
    patches = F.scaled_dot_product_attention(q[:, :, C:], k[:, :, :C], v[:, :, :C])
    return torch.cat([cores, patches], dim=2)


def dense_block_masked(q, k, v, C, scale):
    """Softmax attention over all (C+N) x (C+N) pairs, written out, with the block mask: row i
    may see key j when i < C or j < C."""
    L = q.shape[2]
    idx = torch.arange(L)
    allowed = (idx[:, None] < C) | (idx[None, :] < C)  # [L, L]
    logits = (q @ k.transpose(-1, -2)) * scale
    return torch.softmax(logits.masked_fill(~allowed, float('-inf')), dim=-1) @ v


@pytest.mark.parametrize('case', [
    Case(2, 3, 1, 7, 24, 'fp32', 'batch'), Case(1, 2, 5, 49, 32, 'fp32', 'shared'),
    Case(2, 2, 16, 9, 64, 'fp32', 'batch'), Case(1, 1, 8, 131, 16, 'fp32', 'batch'),
], ids=lambda c: c.id)
def test_reference_equals_official_formulation(case: Case) -> None:
    q, k, v, (cos, sin) = make_inputs(case, 'cpu')
    q, k, v = (x.double() for x in (q, k, v))
    expected = official_formulation(q, k, v, cos, sin, case.C)
    out = core_periphery_attention(q, k, v, case.C, rope=(cos, sin), backend='reference')
    assert_close(out, expected, torch.float64, 'out')
    # ... and with fp32 inputs as the model runs them (the tables cast to q's dtype first)
    q32, k32, v32 = (x.float() for x in (q, k, v))
    assert_close(core_periphery_attention_naive(q32, k32, v32, case.C, rope=(cos.double(),
                                                                               sin.double())),
                 official_formulation(q32, k32, v32, cos, sin, case.C), torch.float32, 'fp32')


@pytest.mark.parametrize('case', [
    Case(2, 3, 1, 7, 24, 'fp32'), Case(1, 2, 5, 49, 32, 'fp32', scale=0.4),
    Case(1, 2, 16, 9, 64, 'fp32', 'batch'), Case(1, 1, 12, 30, 16, 'fp32', 'shared'),
], ids=lambda c: c.id)
def test_reference_equals_dense_block_mask(case: Case) -> None:
    q, k, v, rope = make_inputs(case, 'cpu')
    q, k, v = (x.double() for x in (q, k, v))
    scale = case.D ** -0.5 if case.scale is None else case.scale
    qr, kr = q, k
    if rope is not None:  # rotation written out by pairs for this test
        cos, sin = (t.double()[:, None] for t in rope)
        qr = torch.empty_like(q)
        kr = torch.empty_like(k)
        for dst, src in ((qr, q), (kr, k)):
            dst[..., 0::2] = src[..., 0::2] * cos[..., 0::2] - src[..., 1::2] * sin[..., 0::2]
            dst[..., 1::2] = src[..., 1::2] * cos[..., 1::2] + src[..., 0::2] * sin[..., 1::2]
    expected = dense_block_masked(qr, kr, v, case.C, scale)
    out = core_periphery_attention(q, k, v, case.C, rope=rope, scale=case.scale,
                                   backend='reference')
    assert_close(out, expected, torch.float64, 'out')


def test_reference_pattern() -> None:
    """Changing a patch's key/value changes only the cores' outputs; changing a core's changes
    every output."""
    case = Case(1, 2, 4, 12, 16, 'fp32')
    q, k, v, _ = make_inputs(case, 'cpu')
    base = core_periphery_attention_naive(q, k, v, 4)
    v2 = v.clone()
    v2[:, :, 7] += 1.  # a patch
    changed = (core_periphery_attention_naive(q, k, v2, 4) - base).abs().amax(dim=(0, 1, 3)) > 0
    assert changed[:4].all() and not changed[4:].any()
    v3 = v.clone()
    v3[:, :, 2] += 1.  # a core
    assert ((core_periphery_attention_naive(q, k, v3, 4) - base).abs().amax(dim=(0, 1, 3))
            > 0).all()


def test_rotate_pairs_definition() -> None:
    from mmeffattn.ops.core_periphery.naive import rotate_pairs
    x = torch.tensor([1., 2., 3., 4., 5., 6.])
    assert torch.equal(rotate_pairs(x), torch.tensor([-2., 1., -4., 3., -6., 5.]))


def test_reference_shared_table_equals_expanded() -> None:
    """A ``[1, C+N, D]`` table gives the same output as that table expanded to the batch, and
    its gradient is the batch sum of the expanded table's."""
    case = Case(3, 2, 5, 11, 16, 'fp32', 'shared')
    q, k, v, rope = make_inputs(case, 'cpu')
    shared = [t.double().requires_grad_() for t in rope]
    expanded = [t.detach().double().expand(3, -1, -1).clone().requires_grad_() for t in rope]
    q, k, v = (x.double() for x in (q, k, v))
    out_s = core_periphery_attention(q, k, v, 5, rope=shared, backend='reference')
    out_e = core_periphery_attention(q, k, v, 5, rope=expanded, backend='reference')
    assert_close(out_s, out_e, torch.float64, 'out')
    do = torch.randn_like(out_s)
    out_s.backward(do)
    out_e.backward(do)
    for a, b in zip(shared, expanded):
        assert_close(a.grad, b.grad.sum(0, keepdim=True), torch.float64, 'dtable')


@pytest.mark.parametrize('dtype', ['fp16', 'bf16'])
def test_reference_low_precision(dtype: str) -> None:
    """The reference in low precision (the CPU path) stays within the dtype's tolerance of its
    float64 evaluation, forward and backward."""
    check_against_reference(Case(1, 2, 8, 49, 32, dtype, 'batch'), backend='reference',
                            device='cpu')


@pytest.mark.parametrize('backend,splits', [
    ('reference', None), pytest.param('triton', None, marks=needs_triton),
    pytest.param('triton', 2, marks=needs_triton)], ids=['reference', 'triton', 'triton-split2'])
def test_autocast_is_not_followed(backend: str, splits: Optional[int]) -> None:
    """Under ``torch.autocast`` both backends compute and return q's dtype, exactly as without
    it: the kernels cannot follow autocast, so the reference turns it off (it gave bf16), and
    the merge of split core rows stays in fp32 (autocast ran its einsum in bf16)."""
    case = Case(1, 2, 5, 40, 16, 'fp32', 'shared')
    q, k, v, rope = make_inputs(case)

    def run(autocast: bool):
        leaves = [x.clone().requires_grad_() for x in (q, k, v) + rope]
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
            if splits is not None:  # the registered op the dispatch calls, a forced split
                out = cp_op.core_periphery_attention_triton(*leaves[:3], case.C,
                                                            rope=leaves[3:], splits=splits)
            else:
                out = core_periphery_attention(*leaves[:3], case.C, rope=leaves[3:],
                                               backend=backend)
        out.square().sum().backward()  # (outside autocast, as AMP does)
        return [out.detach()] + [x.grad for x in leaves]

    expected, got = run(False), run(True)
    for name, a, b in zip(['out', 'dq', 'dk', 'dv', 'dcos', 'dsin'], got, expected):
        assert a.dtype == torch.float32, name
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize('rope', [None, 'batch', 'shared'])
def test_reference_gradcheck_fp64(rope) -> None:
    # two cores, three patches, two samples (so a shared table sums over the batch)
    case = Case(2, 1, 2, 3, 4, 'fp32', rope, scale=0.7)
    q, k, v, tables = make_inputs(case, 'cpu')
    leaves = [x.double().requires_grad_() for x in (q, k, v) + tuple(tables or ())]

    def fn(q, k, v, *tables):
        return core_periphery_attention_naive(q, k, v, 2, rope=tables or None, scale=0.7)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# the torch backend's fast forms (its odd-shape checks against the reference: test_dispatch.py)
# ------------------------------------------------------------------------------------------
def model_layout(x: torch.Tensor) -> torch.Tensor:
    """x's values as heads split off a ``[B, L, heads * D]`` projection (as VECA passes q, k, v)."""
    B, h, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, h * D).view(B, L, h, D).transpose(1, 2)


@pytest.mark.parametrize('dtype', ['fp32', 'bf16'])
@pytest.mark.parametrize('rope', ['batch', 'shared'])
def test_torch_fast_inference_forms(rope: str, dtype: str) -> None:
    """Without a gradient, on VECA's layout: fp32 rotates q and k as complex numbers (VECA's
    tables hold one angle per channel pair), bf16 takes the fused attention; both match the
    reference, and the output is a view of ``[B, C + N, heads, D]`` (the head merge is a view)."""
    from mmeffattn.ops.core_periphery import pytorch as cp_torch
    case = Case(2, 3, 16, 21, 16, dtype, rope)
    q, k, v, tables = make_inputs(case, 'cpu')
    q, k, v = (model_layout(x) for x in (q, k, v))
    cos, sin = (t.to(q.dtype).unsqueeze(1) for t in tables)
    assert (cp_torch._complex_rotation(cos, sin) is not None) == (dtype == 'fp32')
    with torch.no_grad():
        assert cp_torch._fused_bf16(q, k, v) == (dtype == 'bf16')
        out = core_periphery_attention(q, k, v, case.C, rope=tables, backend='torch')
    assert out.transpose(1, 2).is_contiguous()
    assert_close(out, reference_fp64(q, k, v, tables, case)[0], DTYPES[dtype], 'out')
    # a random table (two angles per pair), a table that needs a gradient, a q whose pairs a
    # complex view cannot take (odd offset): x * cos + swapped * sin, as the reference
    odd = torch.randn(2, 3, 37, 17)[..., 1:].to(q.dtype)
    for c, s, x in ((cos, torch.rand_like(sin), q), (cos.requires_grad_(), sin, q),
                    (cos.detach(), sin, odd)):
        assert x is odd or cp_torch._complex_rotation(c, s) is None
        with torch.no_grad():
            out = core_periphery_attention(x, k, v, case.C, rope=(c[:, 0], s[:, 0]),
                                           backend='torch')
        expected = reference_fp64(x, k, v, (c[:, 0], s[:, 0]), case)[0]
        assert_close(out, expected, DTYPES[dtype], 'out')


def test_torch_complex_rope_gradients() -> None:
    """Tables without a gradient (a frozen position encoding) keep the complex rotation under
    autograd: q, k and v get the reference's gradients through it."""
    case = Case(2, 2, 16, 9, 16, 'fp32', 'batch')
    q, k, v, tables = make_inputs(case, 'cpu')
    leaves = [x.requires_grad_() for x in (q, k, v)]
    out = core_periphery_attention(*leaves, case.C, rope=tables, backend='torch')
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(do)
    ref, leaves64 = reference_fp64(q, k, v, tables, case)
    ref.backward(do.double())
    for name, x, x64 in zip(['dq', 'dk', 'dv'], leaves, leaves64):
        assert_close(x.grad, x64.grad, torch.float32, name)


@pytest.mark.parametrize('value', [math.inf, -math.inf, math.nan])
def test_torch_bf16_fused_path_keeps_ieee_arithmetic(value: float) -> None:
    """torch's fused bf16 attention returns finite rows where an infinite q or k entry gives NaN
    by IEEE arithmetic: the torch backend then takes the plain form, whose non-finite outputs
    are the reference's (a NaN the fused kernel keeps)."""
    from mmeffattn.ops.core_periphery import pytorch as cp_torch
    case = Case(1, 2, 16, 5, 16, 'bf16')
    for name in ('q', 'k'):
        q, k, v, _ = make_inputs(case, 'cpu')
        dict(q=q, k=k)[name][0, 1, 3, 2] = value
        with torch.no_grad():
            assert not cp_torch._fused_bf16(q, k, v)
            out = core_periphery_attention(q, k, v, case.C, backend='torch')
        ref = core_periphery_attention_naive(q.double(), k.double(), v.double(), case.C)
        assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())


# ------------------------------------------------------------------------------------------
# reasons against the kernels
# ------------------------------------------------------------------------------------------
def small_inputs(dtype=torch.float32, device='cpu', D=16):
    q, k, v, rope = make_inputs(Case(1, 2, 3, 9, D, 'fp32', 'batch'), device)
    return tuple(x.to(dtype) for x in (q, k, v)), rope


def test_head_dim_reasons() -> None:
    """Head dims over 128 or under 16 are reasons against the kernels (the op-independent
    dispatch rules are tests/ops/test_dispatch.py's)."""
    for D, reason in ((192, 'head dim 192 > 128'), (8, 'head dim 8 < 16')):
        (q, k, v), rope = small_inputs(D=D)
        assert any(reason in r for r in cp_op.core_periphery_triton_reasons(q, k, v, rope)), D
        with pytest.raises(RuntimeError, match=reason):
            core_periphery_attention(q, k, v, 3, backend='triton')


def test_rope_on_another_device() -> None:
    """A rope table on another device than q is rejected by validation before dispatch."""
    (q, k, v), (cos, sin) = small_inputs()
    with pytest.raises(ValueError, match=r'one device.*rope cos meta.*\.to\(device\)'):
        core_periphery_attention(q, k, v, 3, rope=(cos.to('meta'), sin))


# ------------------------------------------------------------------------------------------
# input validation
# ------------------------------------------------------------------------------------------
def _bad_inputs():
    x = torch.zeros(2, 2, 12, 16)
    t = torch.zeros(2, 12, 16)
    return [
        ('rank', (x[0], x, x, 3), {}, r'q must be \[B, heads, C \+ N, D\] \(4 dims\)'),
        ('shape', (x, x[:, :1], x, 3), {}, r'same shape'),
        ('dtype', (x, x.half(), x, 3), {}, r'same dtype.*cast them'),
        ('int', (x.long(),) * 3 + (3,), {}, r'floating point'),
        ('device', (x, x.to('meta'), x, 3), {}, r'one device'),
        ('empty-heads', (x[:, :0],) * 3 + (3,), {}, r'q, k, v must not be empty, got shape \(2, 0, 12, 16\)'),
        ('cores-0', (x, x, x, 0), {}, r'num_cores=0 is out of range.*1 <= num_cores < C \+ N'),
        ('cores-all', (x, x, x, 12), {}, r'num_cores=12 is out of range for C \+ N = 12'),
        ('cores-float', (x, x, x, 3.0), {}, r'num_cores must be an int'),
        ('cores-bool', (x, x, x, True), {}, r'num_cores must be an int'),
        ('rope-odd-D', (torch.zeros(2, 2, 12, 15),) * 3 + (3,),
         dict(rope=(torch.zeros(2, 12, 15),) * 2), r'head dim must be even, got D=15'),
        ('rope-not-pair', (x, x, x, 3), dict(rope=t), r'rope must be None or a pair'),
        ('rope-one', (x, x, x, 3), dict(rope=(t,)), r'pair of tensors.*length 1'),
        ('rope-heads-dim', (x, x, x, 3), dict(rope=(t[:, None], t[:, None])),
         r'rope cos must be \[B or 1, C \+ N, D\] = \[2 or 1, 12, 16\].*squeeze\(1\)'),
        ('rope-batch-1', (x[:1],) * 3 + (3,), dict(rope=(t[:1, :11], t[:1, :11])),
         r'= \[1, 12, 16\] \(shared'),
        ('rope-tokens', (x, x, x, 3), dict(rope=(t[:, :11], t[:, :11])), r'got \(2, 11, 16\)'),
        ('rope-batch', (x, x, x, 3), dict(rope=(torch.zeros(3, 12, 16),) * 2), r'\[2 or 1'),
        ('rope-sin', (x, x, x, 3), dict(rope=(t, t[:1, :, :8])), r'rope sin must be'),
        ('rope-mismatch', (x, x, x, 3), dict(rope=(t, t[:1])), r'one shape'),
        ('rope-int', (x, x, x, 3), dict(rope=(t.long(), t)), r'rope cos must be floating'),
    ]


@pytest.mark.parametrize('args,kwargs,match', [(a, kw, m) for _, a, kw, m in _bad_inputs()],
                         ids=[name for name, _, _, _ in _bad_inputs()])
def test_invalid_inputs(args, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        core_periphery_attention(*args, **kwargs)

