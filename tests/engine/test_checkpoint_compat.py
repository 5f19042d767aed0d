"""mmengine checkpoints resume under torch's weights_only loader (torch >= 2.6), through the
scoped allow-list that the opt-in import ``mmeffattn.engine.patch_mmengine`` (our tools'
``prepare_runtime``) installs in mmengine's loader."""
import os.path as osp

import pytest
import torch
import torch.nn as nn
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset

from mmeffattn.engine import load_checkpoint_file


class ToyModel(BaseModel):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs, labels=None, mode='tensor'):
        inputs, labels = torch.stack(inputs), torch.stack(labels)
        out = self.linear(inputs)
        if mode == 'loss':
            return dict(loss=((out - labels) ** 2).mean())
        return out


class ToyData(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return dict(inputs=torch.randn(2, generator=g), labels=torch.randn(1, generator=g))


def _runner(work_dir, max_iters, resume=False, load_from=None):
    return Runner(
        model=ToyModel(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=ToyData(), sampler=dict(type='DefaultSampler', shuffle=True),
                              batch_size=2, num_workers=0),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        resume=resume, load_from=load_from, randomness=dict(seed=0))


def test_plain_torch_rejects_mmengine_checkpoints(tmp_path):
    """Without the allow-list, torch's safe loader refuses mmengine's checkpoints: the reason the
    compat layer exists. If this ever loads, the allow-list may be dropped. Neither ``import
    mmeffattn`` nor the opt-in changes that for a plain ``torch.load`` (the allow-list is
    scoped)."""
    import subprocess
    import sys
    _runner(tmp_path, max_iters=2).train()
    code = ('import sys, torch\n'
            'import mmeffattn, mmeffattn.engine.patch_mmengine\n'
            'try:\n'
            '    torch.load(sys.argv[1], map_location="cpu")\n'
            'except Exception as e:\n'
            '    print("REJECTED", type(e).__name__)\n')
    out = subprocess.run([sys.executable, '-c', code, osp.join(tmp_path, 'iter_2.pth')],
                         capture_output=True, text=True, timeout=120)
    assert 'REJECTED' in out.stdout, out.stdout + out.stderr


@pytest.fixture
def opt_in():
    import mmeffattn.engine.patch_mmengine  # noqa: F401


def test_resume_and_load_from(tmp_path, opt_in):
    runner = _runner(tmp_path, max_iters=4)
    runner.train()
    ckpt = osp.join(tmp_path, 'iter_4.pth')
    assert osp.isfile(ckpt)
    # The checkpoint holds mmengine's message hub (HistoryBuffer of numpy arrays): exactly what
    # the safe loader rejects unless allow-listed.
    state = load_checkpoint_file(ckpt)
    assert 'message_hub' in state and state['meta']['iter'] == 4

    resumed = _runner(tmp_path, max_iters=6, resume=True)
    resumed.train()
    assert resumed.iter == 6
    assert osp.isfile(osp.join(tmp_path, 'iter_6.pth'))
    w4 = load_checkpoint_file(ckpt)['state_dict']['linear.weight']
    w6 = load_checkpoint_file(osp.join(tmp_path, 'iter_6.pth'))['state_dict']['linear.weight']
    assert not torch.equal(w4, w6)  # it really trained on after resuming

    loaded = _runner(tmp_path / 'load', max_iters=1, load_from=ckpt)
    loaded.train()  # load_from goes through the same safe loader
