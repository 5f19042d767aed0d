"""SEMA-T ImageNet config end to end on ../shared/data/imagenet_sample, single and 2-process."""
import json
import os.path as osp
import socket

import pytest

from e2e_helpers import run_tool, write_config

pytestmark = pytest.mark.e2e

SMALL_IN1K = '''
data_root = {root!r}
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, split='val', indices=16))
val_dataloader = dict(batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, split='val', indices=16))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=1, val_interval=1)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=True, begin=0, end=1)]
default_hooks = dict(logger=dict(interval=1))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


# One family in the default suite (SEMA-T is in the detection test and the demo, MILA-T in the
# two-process run below), every family with --run-slow.
@pytest.mark.parametrize('config', [
    pytest.param('configs/sema/sema-t_8xb128_in1k.py', id='sema-t', marks=pytest.mark.slow),
    pytest.param('configs/weightformer/weightformer-t_8xb256_in1k.py', id='weightformer-t'),
    pytest.param('configs/veca/veca-s_8xb128_in1k.py', id='veca-s', marks=pytest.mark.slow),
])
def test_imagenet_config_reports_accuracy(tmp_path, shared_data, config):
    root = shared_data('imagenet_sample') + '/'
    cfg = write_config(tmp_path / 'cfg.py', config, SMALL_IN1K.format(root=root))
    work = str(tmp_path / 'work')
    run_tool(['tools/train.py', cfg, '--work-dir', work, '--amp'])  # bf16 autocast on the CPU
    out_json = str(tmp_path / 'metrics.json')
    run_tool(['tools/test.py', cfg, osp.join(work, 'epoch_1.pth'), '--work-dir', work,
              '--out-json', out_json])
    metrics = json.load(open(out_json))['metrics']
    assert 'accuracy/top1' in metrics and 0.0 <= metrics['accuracy/top1'] <= 100.0


def test_two_process_cpu_training(tmp_path, shared_data):
    root = shared_data('imagenet_sample') + '/'
    cfg = write_config(tmp_path / 'cfg.py', 'configs/mila/mila-t_8xb128_in1k.py',
                       SMALL_IN1K.format(root=root))
    work = str(tmp_path / 'work')
    proc = run_tool(['bash', 'tools/dist_train.sh', cfg, '2', '--work-dir', work],
                    env=dict(PORT=str(_free_port()), OMP_NUM_THREADS='1'))
    log = proc.stdout + proc.stderr
    assert osp.isfile(osp.join(work, 'epoch_1.pth')), log[-3000:]
    # 16 images, batch 4 per process, 2 processes: 2 iterations per epoch
    assert 'Epoch(train) [1][2/2]' in log, log[-3000:]
    # MLLA's MESA term (on from int(0.25 * 1) = epoch 0) with the EMA model, under DDP
    assert 'loss_mesa' in log, log[-3000:]
