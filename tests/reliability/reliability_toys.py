"""A tiny model, dataset and metric for the reliability tests, with every random stream a real
run has: dropout in the model, and numpy / Python / torch draws in the data pipeline.

Configs import it with ``custom_imports=dict(imports=['reliability_toys'])``; the tests put this
folder on PYTHONPATH for the subprocesses they start.
"""
import os
import os.path as osp
import random
import signal

import numpy as np
import torch
import torch.nn as nn
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS
from torch.utils.data import Dataset

HERE = osp.dirname(osp.abspath(__file__))


@MODELS.register_module()
class ReliabilityToyModel(BaseModel):
    """Linear -> dropout -> linear; the dropout draws from the main process's torch stream."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(dim, 16), nn.Dropout(0.5), nn.Linear(16, 1)

    def forward(self, inputs, labels=None, mode='tensor'):
        x, y = torch.stack(inputs), torch.stack(labels)
        out = self.fc2(self.drop(torch.relu(self.fc1(x))))
        if mode == 'loss':
            return dict(loss=((out - y) ** 2).mean())
        if mode == 'predict':
            return [dict(err=float(((o - t) ** 2).mean())) for o, t in zip(out, y)]
        return out


@DATASETS.register_module()
class ReliabilityToyDataset(Dataset):
    """Fixed samples plus an 'augmentation' that draws from numpy, Python and torch."""

    def __init__(self, size: int = 16, dim: int = 8):
        self.size, self.dim = size, dim

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.dim, generator=g)
        x = x + float(np.random.rand()) + random.random() + torch.rand(self.dim)
        return dict(inputs=x, labels=torch.randn(1, generator=g))


@METRICS.register_module()
class ReliabilityToyMetric(BaseMetric):
    def process(self, data_batch, data_samples):
        self.results += [d['err'] for d in data_samples]

    def compute_metrics(self, results):
        return dict(mse=float(np.mean(results)))


@HOOKS.register_module()
class SigkillAfterCheckpointHook(Hook):
    """Kill the process with SIGKILL right after the checkpoint of iteration ``at_iter`` (or
    epoch ``at_epoch``) is written: the hook runs after mmengine's CheckpointHook."""

    priority = 'LOWEST'

    def __init__(self, at_iter: int = -1, at_epoch: int = -1):
        self.at_iter, self.at_epoch = at_iter, at_epoch

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.at_iter:
            os.kill(os.getpid(), signal.SIGKILL)

    def after_train_epoch(self, runner):
        if runner.epoch + 1 == self.at_epoch:
            os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class DumpRankStateHook(Hook):
    """Write every rank's final parameters to WORK_DIR/rank<r>.pt (DDP tests)."""

    def after_train(self, runner):
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()},
                   osp.join(runner.work_dir, f'rank{runner.rank}.pt'))


def toy_config(path, *, by_epoch: bool = False, max_steps: int = 6, interval: int = 3,
               num_workers: int = 0, val: bool = False, seed=0, persistent: bool = False,
               extra: str = '') -> str:
    """Write a training config for the toy run; ``max_steps`` iterations or epochs."""
    loop = (f"train_cfg = dict(by_epoch=True, max_epochs={max_steps}"
            f"{', val_interval=1' if val else ''})" if by_epoch else
            f"train_cfg = dict(type='IterBasedTrainLoop', max_iters={max_steps}"
            f"{f', val_interval={interval}' if val else ''})")
    sampler = 'DefaultSampler' if by_epoch else 'InfiniteSampler'
    text = f'''
custom_imports = dict(imports=['reliability_toys'], allow_failed_imports=False)
model = dict(type='ReliabilityToyModel')
train_dataloader = dict(batch_size=4, num_workers={num_workers}, persistent_workers={persistent},
                        sampler=dict(type='{sampler}', shuffle=True),
                        dataset=dict(type='ReliabilityToyDataset', size=16))
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9))
{loop}
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval={interval},
                                     by_epoch={by_epoch}),
                     logger=dict(type='LoggerHook', interval=1))
randomness = dict(seed={seed})
log_processor = dict(by_epoch={by_epoch})
'''
    if val:
        text += '''
val_dataloader = dict(batch_size=4, num_workers=0, sampler=dict(type='DefaultSampler',
                      shuffle=True), dataset=dict(type='ReliabilityToyDataset', size=8))
val_evaluator = dict(type='ReliabilityToyMetric')
val_cfg = dict()
'''
    with open(path, 'w') as f:
        f.write(text + extra)
    return str(path)


# ---------------------------------------------------------------------------------------------
# Running the tools
# ---------------------------------------------------------------------------------------------
ROOT = osp.dirname(osp.dirname(HERE))


def load_tool(name: str):
    """``tools.<name>`` (tools/<name>.py), to call its ``main(argv)`` in this process."""
    import importlib
    return importlib.import_module(f'tools.{name}')


def tool_env(**extra) -> dict:
    """The environment for a tool subprocess: this checkout and this folder importable."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1', **extra)
    env['PYTHONPATH'] = os.pathsep.join([ROOT, HERE, env.get('PYTHONPATH', '')]).rstrip(os.pathsep)
    env.pop('TRITON_INTERPRET', None)
    return env


def run_train_subprocess(args, timeout: int = 300):
    """``python tools/train.py ARGS`` from the project root; returns the CompletedProcess."""
    import subprocess
    import sys
    return subprocess.run([sys.executable, osp.join(ROOT, 'tools', 'train.py'), *args], cwd=ROOT,
                          env=tool_env(), capture_output=True, text=True, timeout=timeout)


def checkpoint_state(path: str) -> dict:
    """The model and optimizer state of a Runner checkpoint (a file the test wrote itself, read
    with the full unpickler so that the comparison does not depend on the loader under test)."""
    ckpt = torch.load(path, map_location='cpu', weights_only=False)
    return dict(model=ckpt['state_dict'], optimizer=ckpt['optimizer']['state'])


def assert_states_equal(a: dict, b: dict) -> None:
    """Bit-for-bit equality of nested dicts of tensors, naming the first difference."""
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        if isinstance(a[k], dict):
            assert_states_equal(a[k], b[k])
        elif isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), f'{k} differs: max |diff| = ' \
                f'{(a[k].double() - b[k].double()).abs().max().item():.3g}'
        else:
            assert a[k] == b[k], (k, a[k], b[k])


def logged_losses(checkpoint_path: str) -> list:
    """Every training loss of the run, in order, from the checkpoint's message hub (a resumed
    run restores the hub and appends to it, so this covers the whole run)."""
    hub = torch.load(checkpoint_path, map_location='cpu', weights_only=False)['message_hub']
    return hub['log_scalars']['train/loss'].data[0].tolist()
