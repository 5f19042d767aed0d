"""``run_cli``: a distributed run that succeeded closes its process group itself; a failing one
leaves it to the launcher."""
import pytest
import torch
import torch.distributed as dist

from mmeffattn.engine.runner_setup import close_distributed, run_cli

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason='torch built without gloo')


def _start_gloo(tmp_path) -> None:
    dist.init_process_group('gloo', init_method=f'file://{tmp_path / "store"}', rank=0,
                            world_size=1)


def test_successful_run_destroys_the_process_group(tmp_path):
    ran = []

    def main():
        _start_gloo(tmp_path)
        dist.all_reduce(torch.ones(3), async_op=True)  # work left pending, as DDP may leave it
        ran.append(True)

    try:
        run_cli(main)
        assert ran and not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_failed_run_leaves_the_group_to_the_launcher(tmp_path):
    def main():
        _start_gloo(tmp_path)
        raise RuntimeError('boom')

    try:
        with pytest.raises(RuntimeError, match='boom'):
            run_cli(main)
        # no barrier on the way out: the other ranks may never reach it, and torchrun ends them
        assert dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_close_without_a_group_does_nothing():
    assert not dist.is_initialized()
    close_distributed()
    assert not dist.is_initialized()
