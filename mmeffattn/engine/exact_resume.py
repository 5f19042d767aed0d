"""Exact resume: checkpoints carry the Python, numpy and torch random states and the data
position, which mmengine alone does not restore; :class:`ExactResumeHook` restores them where the
uninterrupted run would be (docs/advanced/reliability.md)."""
import random
from typing import Any, Dict, Iterator, Optional

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

__all__ = ['ExactResumeHook', 'get_rng_state', 'set_rng_state', 'RNG_STATE_KEY']

#: The checkpoint key that holds :func:`get_rng_state`'s dict.
RNG_STATE_KEY = 'rng_state'


def get_rng_state() -> Dict[str, Any]:
    """The Python, numpy and torch random states, as types the safe loader reads."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = dict(python=random.getstate(),
                 numpy=dict(kind=kind, keys=torch.from_numpy(keys.astype(np.int64)), pos=int(pos),
                            has_gauss=int(has_gauss), cached_gaussian=float(cached)),
                 torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned."""
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))
    npy = state['numpy']
    np.random.set_state((npy['kind'], npy['keys'].numpy().astype(np.uint32), npy['pos'],
                         npy['has_gauss'], npy['cached_gaussian']))
    torch.set_rng_state(state['torch'])
    if state.get('cuda') is not None and torch.cuda.is_available():
        # (with a different number of GPUs: at least the visible ones that existed)
        for i, s in enumerate(state['cuda'][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)


class _RestoreAfterReplay:
    """An iteration loop's dataloader iterator that restores the random streams after
    mmengine's replay of the ``skip`` trained batches."""

    def __init__(self, loop: Any, inner: Iterator, skip: int, state: Dict[str, Any]):
        self.loop, self.inner, self.skip, self.state = loop, inner, skip, state

    def __iter__(self):
        return self

    def __next__(self):
        if self.skip == 0:  # replayed: restore, and let the loop read the inner iterator on
            set_rng_state(self.state)
            self.loop.dataloader_iterator = self.inner
        self.skip -= 1
        return next(self.inner)

    def __getattr__(self, name):  # e.g. the _InfiniteDataloaderIterator's _epoch
        return getattr(self.inner, name)


@HOOKS.register_module()
class ExactResumeHook(Hook):
    """Store the random streams and the data position in checkpoints and restore them on
    resume: bit for bit on the CPU at epoch or iteration boundaries, given a fixed seed."""

    priority = 'VERY_HIGH'  # restore before any other hook of the epoch draws a random number

    def __init__(self) -> None:
        self._pending: Optional[Dict[str, Any]] = None
        self._val_state: Optional[Dict[str, Any]] = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        meta = checkpoint.get('meta', {})
        # the loop replays this many batches of the seeded sampler on resume
        checkpoint[RNG_STATE_KEY] = dict(get_rng_state(), position=dict(
            epoch=int(meta.get('epoch', runner.epoch)), iter=int(meta.get('iter', runner.iter)),
            seed=runner.seed, world_size=int(runner.world_size)))

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not getattr(runner, '_resume', False):  # load_from: fine-tuning starts fresh streams
            return
        state = checkpoint.get(RNG_STATE_KEY)
        if state is None:
            runner.logger.warning(
                'the resumed checkpoint carries no random state (it was saved without '
                'ExactResumeHook): training continues, but not bit for bit as without the kill')
            return
        pos = state.get('position', {})
        if pos.get('seed') is not None and pos['seed'] != runner.seed:
            runner.logger.warning(
                f'the data loader was built with seed {runner.seed} but the checkpoint was '
                f'trained with seed {pos["seed"]}: the resumed data order differs. Set '
                f'randomness.seed={pos["seed"]} (tools/train.py does this when the config '
                f'leaves the seed None)')
        if pos.get('world_size', runner.world_size) != runner.world_size:
            runner.logger.warning(
                f'the checkpoint was written by {pos["world_size"]} processes, this run has '
                f'{runner.world_size}: the random streams are restored, the data split is not '
                f'the same')
        loader = getattr(runner.train_loop, 'dataloader', None)
        if (not hasattr(runner.train_loop, 'dataloader_iterator')
                and getattr(loader, 'num_workers', 0) > 0
                and getattr(loader, 'persistent_workers', False)):
            runner.logger.warning(
                'resume is not bit for bit: in an epoch-based loop, persistent dataloader '
                'workers carry their random streams from epoch to epoch and those are not in the '
                'checkpoint; set train_dataloader.persistent_workers=False (or num_workers=0) '
                'for an exact resume')
        self._pending = state

    def before_train_epoch(self, runner) -> None:
        if self._pending is None:
            return
        state, self._pending = self._pending, None
        loop = runner.train_loop
        replay = int(getattr(loop, '_iter', 0)) if hasattr(loop, 'dataloader_iterator') else 0
        if replay > 0:  # iteration-based: mmengine replays `replay` batches right after this
            loop.dataloader_iterator = _RestoreAfterReplay(loop, loop.dataloader_iterator,
                                                           replay, state)
        else:
            set_rng_state(state)

    # -- validation inside training must not move the training streams ------------------------
    def before_val(self, runner) -> None:
        self._val_state = get_rng_state()

    def after_val(self, runner) -> None:
        if self._val_state is not None:
            set_rng_state(self._val_state)
            self._val_state = None
