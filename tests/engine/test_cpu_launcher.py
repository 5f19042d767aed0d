"""``--launcher`` on a machine without CUDA: ``pytorch`` starts gloo from the torchrun
environment; ``slurm`` and ``mpi`` (whose mmengine launchers select a GPU) are refused with a
message that names the launcher passed and says what works on CPUs."""
import pytest
import torch
from mmengine.config import Config

from mmeffattn.engine.runner_setup import setup_launcher

TORCHRUN_ENV = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')


@pytest.fixture
def cpu_only_without_torchrun(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv('LOCAL_RANK', '0')  # (setup_launcher sets it; restored after the test)


@pytest.mark.parametrize('launcher', ['slurm', 'mpi'])
def test_gpu_launchers_on_a_cpu_name_the_launcher(cpu_only_without_torchrun, launcher):
    """The message named "--launcher pytorch" and the torchrun environment, whatever was passed."""
    with pytest.raises(RuntimeError) as exc:
        setup_launcher(Config(dict(model=dict())), launcher)
    msg = str(exc.value)
    assert msg.startswith(f'--launcher {launcher} needs a CUDA GPU'), msg
    assert '--launcher pytorch under torchrun' in msg and 'tools/dist_train.sh' in msg
    assert 'without --launcher' in msg


def test_pytorch_launcher_without_torchrun(cpu_only_without_torchrun):
    with pytest.raises(RuntimeError, match=r"--launcher pytorch needs the torchrun environment, "
                                           r"but \['RANK', 'WORLD_SIZE', 'MASTER_ADDR', "
                                           r"'MASTER_PORT'\] are not set"):
        setup_launcher(Config(dict(model=dict())), 'pytorch')


def test_no_launcher_starts_nothing(cpu_only_without_torchrun):
    cfg = Config(dict(model=dict()))
    setup_launcher(cfg, 'none')
    assert cfg.launcher == 'none' and 'model_wrapper_cfg' not in cfg
