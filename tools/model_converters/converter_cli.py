"""What every official-checkpoint converter here shares: safe loading, the CLI, the save."""
import argparse
import os.path as osp
import pickle
from typing import Iterable, Optional, Sequence, Tuple

import torch


def load_official(path: str, unsafe: bool = False,
                  stand_ins: Iterable[Tuple[type, str]] = ()) -> dict:
    """Read an official checkpoint on the CPU.

    Safe loading (``weights_only=True``) unless ``unsafe``; ``stand_ins`` are (class, pickled
    name) pairs the safe loader may build in place of the originals (e.g. a training config
    class whose package is not installed). ``.safetensors`` files need the safetensors package.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'no checkpoint at {path!r}')
    if path.endswith('.safetensors'):  # (a clear error when the safetensors package is missing)
        from mmeffattn.engine.checkpoint_io import load_checkpoint_file
        return load_checkpoint_file(path)
    if unsafe:
        return torch.load(path, map_location='cpu', weights_only=False)
    try:
        with torch.serialization.safe_globals(list(stand_ins)):
            return torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        from mmeffattn.engine.checkpoint_io import load_error_reason
        if isinstance(e, pickle.UnpicklingError) and 'Unsupported global' in str(e):
            raise RuntimeError(  # an object the safe loader refuses
                f'{path!r} holds objects that torch.load(weights_only=True) refuses '
                f'({load_error_reason(e)}). If you trust the file, rerun with --unsafe-load.'
            ) from e
        # not a torch.save file at all (junk makes torch raise KeyError, IndexError, ...)
        raise RuntimeError(f'{path!r} is not a readable checkpoint ({load_error_reason(e)}); '
                           f'pass the .pth/.pt file the official code saved with torch.save, '
                           f'or a .safetensors file') from e


def parse_converter_args(description: str, src_help: str,
                         argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The OpenMMLab converter CLI: ``SRC DST [--unsafe-load]``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('src', help=src_help)
    parser.add_argument('dst', help='output checkpoint')
    parser.add_argument('--unsafe-load', action='store_true',
                        help='read SRC with torch.load(weights_only=False): only for files you '
                             'trust, when the safe loader refuses one')
    return parser.parse_args(argv)


def check_loads(model: torch.nn.Module, state_dict: dict, prefix: str = 'backbone.') -> None:
    """Check that the ``prefix`` part of a converted ``state_dict`` loads strictly into
    ``model`` (built on the meta device: nothing is copied), with the loader every backbone
    uses; raises ``RuntimeError`` naming the keys otherwise."""
    from mmeffattn.models.utils import load_state_dict_strict
    part = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    load_state_dict_strict(model, part, 'the converted checkpoint', dry_run=True)


def save_converted(state_dict: dict, meta: dict, dst: str) -> None:
    """Write ``{'state_dict', 'meta'}`` to ``dst`` atomically (a temporary file in the same
    folder, fsynced, then renamed: a kill never leaves a truncated ``dst``). Its folder must
    exist: no silent mkdir of a mistyped path."""
    from mmeffattn.engine.checkpoint_io import atomic_save
    dst_dir = osp.dirname(osp.abspath(dst))
    if not osp.isdir(dst_dir):
        raise FileNotFoundError(f'output folder {dst_dir!r} does not exist')
    atomic_save({'state_dict': state_dict, 'meta': meta}, dst)
