"""One tolerance table for every op test: relative RMS error with an absolute floor, per dtype.

An op's result ``actual`` (computed in ``dtype``) is compared with ``expected`` (usually the
reference evaluated in float64 on the same inputs):

    rms(actual - expected) <= rtol * rms(expected) + atol        (the main check)
    max|actual - expected| <= max_factor * (rtol * max|expected| + atol)   (catches a few
                                                                  wrong elements the RMS hides)
"""
from typing import NamedTuple

import torch


class Tolerance(NamedTuple):
    rtol: float  # relative RMS error
    atol: float  # absolute floor (for near-zero tensors)
    max_factor: float  # slack of the element-wise check over the RMS one


TOLERANCES = {
    torch.float64: Tolerance(1e-10, 1e-12, 10.),
    torch.float32: Tolerance(1e-5, 1e-7, 20.),
    torch.float16: Tolerance(2e-3, 1e-5, 20.),
    torch.bfloat16: Tolerance(1.6e-2, 1e-4, 20.),
}


def rms(x: torch.Tensor) -> float:
    return x.double().pow(2).mean().sqrt().item()


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype,
                 name: str = 'tensor') -> None:
    """Assert ``actual`` (computed in ``dtype``) matches ``expected`` within the tolerance."""
    tol = TOLERANCES[dtype]
    assert actual.shape == expected.shape, f'{name}: shape {tuple(actual.shape)} != ' \
                                           f'{tuple(expected.shape)}'
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert torch.isfinite(actual).all(), f'{name}: non-finite values'
    err = actual - expected
    err_rms, ref_rms = rms(err), rms(expected)
    limit = tol.rtol * ref_rms + tol.atol
    assert err_rms <= limit, (f'{name} ({dtype}): RMS error {err_rms:.3e} > {limit:.3e} '
                              f'(rtol {tol.rtol:g} x RMS {ref_rms:.3e} + atol {tol.atol:g}); '
                              f'relative {err_rms / max(ref_rms, 1e-300):.3e}')
    err_max, ref_max = err.abs().max().item(), expected.abs().max().item()
    limit_max = tol.max_factor * (tol.rtol * ref_max + tol.atol)
    assert err_max <= limit_max, (f'{name} ({dtype}): max error {err_max:.3e} > {limit_max:.3e} '
                                  f'at index {_argmax_index(err)}')


def _argmax_index(err: torch.Tensor) -> tuple:
    flat = int(err.abs().argmax())
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape))
