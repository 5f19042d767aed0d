"""A corrupt, truncated or empty checkpoint, wherever it is passed, gives one line naming the file
and what to do; ``--resume`` never silently starts from scratch over an unreadable checkpoint."""
import os
import os.path as osp

import pytest
import torch

from reliability_toys import load_tool, toy_config

pytestmark = pytest.mark.usefixtures('one_thread')


def _truncated(path) -> str:
    torch.save({'meta': {'iter': 2}, 'state_dict': {'w': torch.randn(64, 64)}}, str(path))
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:  # what a kill in the middle of a plain torch.save leaves
        f.truncate(size // 2)
    return str(path)


def _one_line_error(capsys, tool: str, argv) -> str:
    from mmeffattn.engine.runner_setup import run_cli
    module = load_tool(tool)
    with pytest.raises(SystemExit) as exc:
        run_cli(lambda: module.main(argv))
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip()
    assert 'Traceback' not in err and err.count('\n') == 0, err
    assert err.startswith('ERROR: '), err
    return err


def test_load_checkpoint_file_names_the_file(tmp_path):
    from mmeffattn.engine import CheckpointError, load_checkpoint_file
    bad = _truncated(tmp_path / 'bad.pth')
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint_file(bad)
    msg = str(exc.value)
    assert bad in msg and 'truncated or corrupt' in msg and '\n' not in msg
    assert exc.value.__suppress_context__  # no chained PytorchStreamReader traceback

    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    with pytest.raises(CheckpointError, match='is empty'):
        load_checkpoint_file(str(empty))
    junk = tmp_path / 'junk.pth'
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match='junk.pth'):
        load_checkpoint_file(str(junk))
    # text is no pickle: called corrupt, not "objects the safe loader refuses" (which would
    # suggest trusting it with weights_only=False)
    text = tmp_path / 'notes.pth'
    text.write_text('not a checkpoint')
    with pytest.raises(CheckpointError, match=r"notes.pth' is corrupt"):
        load_checkpoint_file(str(text))
    with pytest.raises(FileNotFoundError, match='missing.pth'):
        load_checkpoint_file(str(tmp_path / 'missing.pth'))


def test_test_tool_with_truncated_checkpoint(tmp_path, capsys):
    cfg = toy_config(tmp_path / 'cfg.py')
    bad = _truncated(tmp_path / 'epoch_1.pth')
    err = _one_line_error(capsys, 'test', [cfg, bad, '--work-dir', str(tmp_path / 'w')])
    assert bad in err and 'truncated or corrupt' in err


def test_train_resume_path_with_truncated_checkpoint(tmp_path, capsys):
    cfg = toy_config(tmp_path / 'cfg.py')
    bad = _truncated(tmp_path / 'iter_3.pth')
    err = _one_line_error(capsys, 'train', [cfg, '--work-dir', str(tmp_path / 'w'),
                                            '--resume', bad])
    assert bad in err and '--resume' in err


def test_auto_resume_with_last_checkpoint_pointing_to_truncated_file(tmp_path, capsys):
    cfg = toy_config(tmp_path / 'cfg.py')
    work = tmp_path / 'w'
    work.mkdir()
    bad = _truncated(work / 'iter_3.pth')
    (work / 'last_checkpoint').write_text(bad)
    err = _one_line_error(capsys, 'train', [cfg, '--work-dir', str(work), '--resume'])
    assert 'cannot resume' in err and bad in err and 'last_checkpoint' in err


def test_auto_resume_after_kill_in_first_save(tmp_path, capsys):
    """The issue's case: the first save was killed (a truncated iter_N.pth, no last_checkpoint
    record). main logged 'Auto resumed from the latest checkpoint None.' and started over."""
    cfg = toy_config(tmp_path / 'cfg.py')
    work = tmp_path / 'w'
    work.mkdir()
    bad = _truncated(work / 'iter_3.pth')
    err = _one_line_error(capsys, 'train', [cfg, '--work-dir', str(work), '--resume'])
    assert 'cannot resume' in err and bad in err


def test_auto_resume_without_any_checkpoint_says_so(tmp_path, capsys):
    cfg = toy_config(tmp_path / 'cfg.py', max_steps=2, interval=2)
    work = str(tmp_path / 'w')
    load_tool('train').main([cfg, '--work-dir', work, '--resume'])
    out = capsys.readouterr()
    assert 'no checkpoint to resume from' in out.out + out.err
    assert 'starts from scratch' in out.out + out.err
    assert osp.isfile(osp.join(work, 'iter_2.pth'))


def test_runner_load_from_and_pretrained_name_the_file(tmp_path):
    """After the opt-in, load_from (Runner) and mmengine's CheckpointLoader go through the
    scoped loader: a truncated file raises CheckpointError naming it."""
    from mmengine.config import Config
    from mmengine.runner import CheckpointLoader, Runner

    import mmeffattn.engine.patch_mmengine  # noqa: F401

    from mmeffattn.engine import CheckpointError
    bad = _truncated(tmp_path / 'pretrained.pth')
    with pytest.raises(CheckpointError, match='pretrained.pth'):
        CheckpointLoader.load_checkpoint(bad, map_location='cpu')
    cfg = Config.fromfile(toy_config(tmp_path / 'cfg.py', max_steps=1))
    cfg.work_dir, cfg.load_from = str(tmp_path / 'w'), bad
    with pytest.raises(CheckpointError, match='pretrained.pth'):
        Runner.from_cfg(cfg).train()


def _work_dir_with_checkpoints(work) -> str:
    """A work dir holding iter_2.pth and, newer, iter_3.pth; returns the newer one's path."""
    work.mkdir()
    for i, name in enumerate(['iter_2.pth', 'iter_3.pth']):
        torch.save({'meta': {'iter': i + 2}, 'state_dict': {}}, str(work / name))
        os.utime(work / name, (1000 + i, 1000 + i))
    return str(work / 'iter_3.pth')


def test_test_tool_with_a_folder_as_checkpoint(tmp_path, capsys):
    """A folder passed as the checkpoint was reported as not existing."""
    cfg = toy_config(tmp_path / 'cfg.py')
    work = tmp_path / 'w'
    newest = _work_dir_with_checkpoints(work)
    err = _one_line_error(capsys, 'test', [cfg, str(work), '--work-dir', str(tmp_path / 'out')])
    assert 'does not exist' not in err and f"'{work}' is a directory" in err
    assert 'pass a .pth file' in err and repr(newest) in err


def test_train_resume_with_a_folder(tmp_path, capsys):
    """``--resume DIR`` says to pass a .pth file, or --resume alone for the work dir's latest."""
    cfg = toy_config(tmp_path / 'cfg.py')
    work = tmp_path / 'w'
    newest = _work_dir_with_checkpoints(work)
    err = _one_line_error(capsys, 'train', [cfg, '--work-dir', str(tmp_path / 'out'),
                                            '--resume', str(work)])
    assert 'does not exist' not in err and f"'{work}' is a directory" in err
    assert repr(newest) in err and '--resume with no value' in err
    assert f'--work-dir {work} --resume' in err


def test_folder_errors_of_the_loaders(tmp_path):
    from mmeffattn.engine import CheckpointError, find_resume_checkpoint, load_checkpoint_file
    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"is a directory, not a checkpoint file: pass a "
                                              r"\.pth file \(it holds none\)$"):
        load_checkpoint_file(str(empty))
    work = tmp_path / 'w'
    work.mkdir()
    (work / 'last_checkpoint').write_text(str(empty))  # a record naming a folder
    with pytest.raises(CheckpointError, match='cannot resume .*is a directory'):
        find_resume_checkpoint(str(work))


def test_train_load_from_is_strict(tmp_path, capsys):
    """tools/train.py's ``load_from`` goes through tools/test.py's loader: a checkpoint that
    leaves a parameter at its random init stops the run in one line (mmengine's own load_from
    only logs it); a complete one loads."""
    from reliability_toys import ReliabilityToyModel
    state = ReliabilityToyModel().state_dict()
    path = tmp_path / 'partial.pth'
    torch.save({'state_dict': {k: v for k, v in state.items() if k != 'fc2.bias'}}, str(path))
    # (a config name of its own: a Runner named as an earlier test's reuses its closed logger)
    cfg = toy_config(tmp_path / 'load_from_cfg.py', max_steps=1,
                     extra=f'load_from = {str(path)!r}\n')
    err = _one_line_error(capsys, 'train', [cfg, '--work-dir', str(tmp_path / 'w')])
    assert "1 missing keys ['fc2.bias']" in err and 'partial.pth' in err, err
    torch.save({'state_dict': {k: v + 1 for k, v in state.items()}, 'meta': {}}, str(path))
    load_tool('train').main([cfg, '--work-dir', str(tmp_path / 'w2')])
    assert 'Load checkpoint from' in capsys.readouterr().out
