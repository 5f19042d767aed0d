"""tools/demo.py resumes only a run of its own settings: the work dir's record (demo_run.json),
the decision, the move aside, and main() with tools/train.py and tools/test.py faked (no
training; the real pipeline is run in tests/e2e/test_demo.py)."""
import glob
import json
import os
import os.path as osp

import pytest

from tools import demo

SETTINGS = dict(data_root='/data/shapes', dataset=dict(num_train=8, num_val=4, seed=0),
                dataset_sha256='a' * 64, config='/cfg.py', config_sha256='b' * 64, epochs=1,
                seed=0)


def other(**changes) -> dict:
    settings = json.loads(json.dumps(SETTINGS))
    for key, value in changes.items():
        if key in settings['dataset']:
            settings['dataset'][key] = value
        else:
            settings[key] = value
    return settings


def save_checkpoint(work_dir, epoch: int = 1) -> str:
    """What CheckpointHook leaves: the file and the record naming it by its absolute path."""
    work_dir.mkdir(exist_ok=True)
    path = work_dir / f'epoch_{epoch}.pth'
    path.write_bytes(b'weights')
    (work_dir / 'last_checkpoint').write_text(str(path))
    return str(path)


def moved_dirs(work_dir) -> list:
    return sorted(glob.glob(f'{work_dir}.old-*'))


def test_same_settings_resume(tmp_path):
    """A killed run, rerun with the same command, goes on from its checkpoint."""
    work = tmp_path / 'work'
    assert demo.prepare_work_dir(str(work), SETTINGS).endswith('a new run (no checkpoint in it)')
    ckpt = save_checkpoint(work)
    assert demo.plan_work_dir(str(work), other())[0] == 'resume'
    line = demo.prepare_work_dir(str(work), other())
    assert 'resuming it from its last checkpoint' in line, line
    assert (work / 'last_checkpoint').read_text() == ckpt and osp.isfile(ckpt)
    assert moved_dirs(work) == []


@pytest.mark.parametrize('change, shown', [
    (dict(num_train=12), "dataset.num_train 8 -> 12"),
    (dict(epochs=2), 'epochs 1 -> 2'),
    (dict(seed=1), 'seed 0 -> 1'),
    (dict(data_root='/elsewhere'), "data_root '/data/shapes' -> '/elsewhere'"),
    (dict(config_sha256='c' * 64), 'config_sha256 differs'),  # the config file was edited
    (dict(dataset_sha256='c' * 64), 'dataset_sha256 differs'),  # regenerated, not the same
], ids=['num_train', 'epochs', 'seed', 'data_root', 'config_edited', 'dataset_changed'])
def test_other_settings_move_the_old_run_aside(tmp_path, change, shown):
    work = tmp_path / 'work'
    demo.prepare_work_dir(str(work), SETTINGS)
    ckpt = save_checkpoint(work)
    assert demo.plan_work_dir(str(work), other(**change))[0] == 'move'
    line = demo.prepare_work_dir(str(work), other(**change))
    [old] = moved_dirs(work)
    assert shown in line and old in line and '--work-dir' in line, line
    assert '\n' not in line
    # nothing deleted: the old run is whole, and its record names its own checkpoint
    assert osp.isfile(osp.join(old, 'epoch_1.pth'))
    assert open(osp.join(old, 'last_checkpoint')).read() == osp.join(old, 'epoch_1.pth') != ckpt
    assert demo.read_manifest(old)['settings'] == SETTINGS
    # the new run starts clean, with its own record
    assert sorted(p.name for p in work.iterdir()) == [demo.MANIFEST]
    assert demo.read_manifest(str(work))['settings'] == other(**change)
    # and the old run can still be resumed where it now is
    assert demo.plan_work_dir(old, SETTINGS)[0] == 'resume'


def test_unrecorded_checkpoints_are_moved_aside(tmp_path):
    """Checkpoints from before demo_run.json (or from another tool) cannot be vouched for."""
    work = tmp_path / 'work'
    save_checkpoint(work)
    action, why = demo.plan_work_dir(str(work), SETTINGS)
    assert action == 'move' and demo.MANIFEST in why
    demo.prepare_work_dir(str(work), SETTINGS)
    [old] = moved_dirs(work)
    assert osp.isfile(osp.join(old, 'epoch_1.pth'))
    # a *.pth without the last_checkpoint record (a kill between the two) counts too
    (work / 'epoch_3.pth').write_bytes(b'weights')
    (work / demo.MANIFEST).unlink()
    assert demo.plan_work_dir(str(work), SETTINGS)[0] == 'move'


def test_no_checkpoint_starts_fresh_in_place(tmp_path):
    """A run killed before its first checkpoint left nothing to mix in: no move needed."""
    work = tmp_path / 'work'
    demo.prepare_work_dir(str(work), SETTINGS)
    assert demo.plan_work_dir(str(work), other(num_train=12))[0] == 'fresh'
    demo.prepare_work_dir(str(work), other(num_train=12))
    assert moved_dirs(work) == []
    assert demo.read_manifest(str(work))['settings'] == other(num_train=12)


def test_a_second_move_does_not_overwrite_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(demo.time, 'strftime', lambda fmt: '20260101_000000')
    work = tmp_path / 'work'
    for n in (8, 12, 16):
        demo.prepare_work_dir(str(work), other(num_train=n))
        save_checkpoint(work)
    assert [osp.basename(d) for d in moved_dirs(work)] == [
        'work.old-20260101_000000', 'work.old-20260101_000000-1']


def fake_tools(calls: list):
    """tools/train.py and tools/test.py as far as demo.py sees them: train.py --resume goes on
    from the work dir's last checkpoint, if any, and saves one per epoch up to max_epochs."""
    def run(cmd, what):
        work_dir = cmd[cmd.index('--work-dir') + 1]
        opts = dict(o.split('=', 1) for o in cmd[cmd.index('--cfg-options') + 1:])
        if cmd[1] == 'tools/train.py':
            os.makedirs(work_dir, exist_ok=True)
            record = osp.join(work_dir, 'last_checkpoint')
            resumed = open(record).read() if osp.isfile(record) else None
            start = int(resumed.split('epoch_')[1].split('.')[0]) if resumed else 0
            calls.append(dict(resumed=resumed, epochs=list(range(start + 1, int(opts[
                'train_cfg.max_epochs']) + 1))))
            for epoch in calls[-1]['epochs']:
                path = osp.join(work_dir, f'epoch_{epoch}.pth')
                open(path, 'wb').close()
                with open(record, 'w') as f:
                    f.write(path)
        else:
            with open(cmd[cmd.index('--out-json') + 1], 'w') as f:
                json.dump(dict(metrics={}), f)
    return run


def test_main_resumes_only_its_own_run(tmp_path, monkeypatch, capsys):
    """The reported case: a second run with more images resumed the first run's checkpoint and
    trained only epoch 2. Now it starts fresh, the first run moved aside; the same command,
    rerun after a kill, still resumes."""
    calls = []
    monkeypatch.setattr(demo, 'run', fake_tools(calls))
    monkeypatch.setattr(demo, 'draw_predictions', lambda *a, **k: [])
    work, data = str(tmp_path / 'W'), str(tmp_path / 'D')
    common = ['--work-dir', work, '--data-root', data, '--num-val', '4']

    demo.main(['--epochs', '1', '--num-train', '8', *common])
    assert calls[-1] == dict(resumed=None, epochs=[1])
    demo.main(['--epochs', '2', '--num-train', '12', *common])
    out = capsys.readouterr().out
    assert calls[-1] == dict(resumed=None, epochs=[1, 2]), out
    [old] = moved_dirs(work)
    assert 'dataset.num_train 8 -> 12' in out and 'epochs 1 -> 2' in out
    assert 'dataset_sha256' not in out  # it follows from the parameters: not worth a word
    assert osp.isfile(osp.join(old, 'epoch_1.pth'))

    # killed after epoch 1: the same command goes on from there
    for name in ('epoch_2.pth', 'last_checkpoint'):
        (tmp_path / 'W' / name).unlink()
    (tmp_path / 'W' / 'last_checkpoint').write_text(osp.join(work, 'epoch_1.pth'))
    demo.main(['--epochs', '2', '--num-train', '12', *common])
    assert calls[-1] == dict(resumed=osp.join(work, 'epoch_1.pth'), epochs=[2])
    assert 'resuming it from its last checkpoint' in capsys.readouterr().out
    assert moved_dirs(work) == [old]
