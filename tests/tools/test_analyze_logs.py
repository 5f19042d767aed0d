"""tools/analysis_tools/analyze_logs.py and mmeffattn/analysis/logs.py on work dirs written in
mmengine's ``vis_data/scalars.json`` format (the lines as tools/train.py logs them; a real
killed-and-resumed run is read in tests/reliability/test_exact_resume.py)."""
import json
import os.path as osp

import pytest

from mmeffattn.analysis.logs import find_scalar_files, load_log, read_scalars, train_time

from tools.analysis_tools import analyze_logs

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

ITERS_PER_EPOCH = 20


def train_line(step: int, loss: float, time: float = .5, by_epoch: bool = True) -> dict:
    line = dict(lr=.01, loss=loss, loss_cls=loss / 2, time=time, data_time=.01, iter=step,
                step=step)
    if by_epoch:
        line['epoch'] = (step - 1) // ITERS_PER_EPOCH + 1
    return line


def val_line(step: int, m_ap: float) -> dict:
    return {'coco/bbox_mAP': m_ap, 'coco/bbox_mAP_50': m_ap + .2, 'data_time': .01,
            'time': .2, 'step': step}


def write_run(work_dir, stamp: str, lines, tail: str = '') -> str:
    path = work_dir / stamp / 'vis_data' / 'scalars.json'
    path.parent.mkdir(parents=True)
    path.write_text(''.join(json.dumps(line) + '\n' for line in lines) + tail)
    return str(path)


def one_run(work_dir) -> None:
    """3 epochs of 20 iterations, logged every 10, validated after each epoch."""
    lines = []
    for epoch in (1, 2, 3):
        for step in (epoch * 20 - 10, epoch * 20):
            lines.append(train_line(step, loss=4. - step / 20, time=.4 + .1 * epoch))
        lines.append(val_line(epoch, m_ap=(.1, .3, .2)[epoch - 1]))
    write_run(work_dir, '20261202_100000', lines)


def test_reads_one_run(tmp_path):
    one_run(tmp_path)
    log = load_log(str(tmp_path))
    assert log.by_epoch and len(log.sources) == 1
    assert [line['step'] for line in log.train] == [10, 20, 30, 40, 50, 60]
    x, y, label = log.series('loss')
    assert (x, label) == ([10, 20, 30, 40, 50, 60], 'iteration') and y[0] == 3.5
    assert log.series('coco/bbox_mAP') == ([1, 2, 3], [.1, .3, .2], 'epoch')
    assert log.series('time')[2] == 'iteration'  # logged by both kinds: training's
    assert log.series('time', kind='val') == ([1, 2, 3], [.2, .2, .2], 'epoch')
    assert log.keys()['val'] == ['coco/bbox_mAP', 'coco/bbox_mAP_50', 'data_time', 'time']


def test_train_time_per_epoch(tmp_path):
    one_run(tmp_path)
    t = train_time(load_log(str(tmp_path)))
    assert t['per_epoch'] == pytest.approx({1: .5, 2: .6, 3: .7})
    assert t['slowest'] == (3, pytest.approx(.7)) and t['fastest'] == (1, pytest.approx(.5))
    assert t['mean'] == pytest.approx(.6) and t['std'] == pytest.approx(.0816, abs=1e-4)


def test_a_resumed_run_replaces_what_the_killed_run_logged_after_its_checkpoint(tmp_path):
    # the first run logged into epoch 3 and was killed; the second resumed from epoch 2's
    # checkpoint and logged epoch 3 again (other losses) and epoch 4; a test run came between
    first = [train_line(s, loss=9.) for s in (10, 20, 30, 40, 50)]
    first.insert(2, val_line(1, .1))
    first.insert(5, val_line(2, .2))
    first += [val_line(3, .99)]  # an epoch-3 validation the resumed run redoes
    write_run(tmp_path, '20261202_100000', first, tail='{"loss": 1.0, "it')  # cut off
    write_run(tmp_path, '20261202_103000', [val_line(0, .5)])  # tools/test.py
    second = [train_line(s, loss=1.) for s in (50, 60, 70, 80)]
    second.insert(2, val_line(3, .3))
    second.append(val_line(4, .4))
    write_run(tmp_path, '20261202_110000', second)

    log = load_log(str(tmp_path))
    assert len(log.sources) == 2 and len(log.skipped) == 1 and 'test run' in log.skipped[0][1]
    assert log.series('loss')[:2] == ([10, 20, 30, 40, 50, 60, 70, 80], [9.] * 4 + [1.] * 4)
    assert log.series('coco/bbox_mAP')[:2] == ([1, 2, 3, 4], [.1, .2, .3, .4])


@pytest.mark.parametrize('logged_step', ['zero', 'iteration'])
def test_iteration_based_logs_validate_at_iterations(tmp_path, logged_step):
    # mmengine logs an iteration-based loop's validations at step 0 (the epoch) by default,
    # at the iteration with LoggerHook(log_metric_by_epoch=False)
    lines = [train_line(s, loss=1., by_epoch=False) for s in (10, 20, 30, 40)]
    lines.insert(2, val_line(0 if logged_step == 'zero' else 20, .5))
    lines.append(val_line(0 if logged_step == 'zero' else 40, .6))
    write_run(tmp_path, '20261202_100000', lines)
    log = load_log(str(tmp_path))
    assert not log.by_epoch
    assert log.series('coco/bbox_mAP') == ([20, 40], [.5, .6], 'iteration')
    t = train_time(log)
    assert list(t['per_epoch']) == [0] and t['mean'] == pytest.approx(.5)


def test_runs_that_share_a_folder_are_told_apart(tmp_path):
    # a resumed run started within the second of the killed one appends to its file
    lines = [train_line(s, loss=9.) for s in (10, 20, 30)]
    lines.insert(2, val_line(1, .1))
    lines += [train_line(s, loss=1.) for s in (21, 30, 40)]
    lines.append(val_line(2, .2))
    write_run(tmp_path, '20261202_100000', lines)
    log = load_log(str(tmp_path))
    assert log.series('loss')[:2] == ([10, 20, 21, 30, 40], [9., 9., 1., 1., 1.])
    assert log.series('coco/bbox_mAP')[:2] == ([1, 2], [.1, .2])


def test_paths_and_bad_logs_get_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match='does not exist: give a work dir'):
        find_scalar_files(str(tmp_path / 'missing'))
    with pytest.raises(FileNotFoundError, match='no \\*/vis_data/scalars.json under'):
        find_scalar_files(str(tmp_path))
    bad = write_run(tmp_path, '20261202_100000', [train_line(10, 1.)], tail='oops\n{"step": 2}\n')
    with pytest.raises(ValueError, match='scalars.json, line 2: not JSON'):
        read_scalars(bad)
    only_test = tmp_path / 'only_test'
    write_run(only_test, '20261202_100000', [val_line(0, .5)])
    with pytest.raises(ValueError, match='no training run logged under .*test run'):
        load_log(str(only_test))
    one_run(tmp_path / 'ok')
    with pytest.raises(KeyError, match="'mIoU' is not in the log .* validation keys: "
                                       "coco/bbox_mAP"):
        load_log(str(tmp_path / 'ok')).series('mIoU')


def test_a_run_folder_or_file_is_read_too(tmp_path):
    one_run(tmp_path)
    run = tmp_path / '20261202_100000'
    assert find_scalar_files(str(run)) == [str(run / 'vis_data' / 'scalars.json')]
    assert load_log(str(run / 'vis_data' / 'scalars.json')).series('loss')[1][-1] == 1.


def test_cli_plots_summarizes_and_times(tmp_path, capsys):
    one_run(tmp_path / 'a')
    one_run(tmp_path / 'b')
    out = str(tmp_path / 'plots' / 'curves.png')
    assert analyze_logs.main(['plot_curve', str(tmp_path / 'a'), str(tmp_path / 'b'),
                              '--keys', 'loss', 'coco/bbox_mAP', '--legend', 'a', 'b',
                              '--out', out]) == out
    with open(out, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    with pytest.raises(SystemExit, match='--legend has 1 names for 2 logs'):
        analyze_logs.main(['plot_curve', str(tmp_path / 'a'), str(tmp_path / 'b'),
                           '--legend', 'a', '--out', out])

    (s, ) = analyze_logs.main(['summary', str(tmp_path / 'a')])
    assert s['metrics']['coco/bbox_mAP'] == dict(last=.2, best=.3, best_at=2)
    assert s['losses'] == dict(loss=1., loss_cls=.5)
    (t, ) = analyze_logs.main(['cal_train_time', str(tmp_path / 'a')])
    assert t['slowest'][0] == 3
    printed = capsys.readouterr().out
    assert 'coco/bbox_mAP: last 0.2000, highest 0.3000 at epoch 2' in printed
    assert 'slowest epoch 3 (0.7000 s/iter), fastest epoch 1 (0.5000 s/iter)' in printed


def test_summary_keeps_losses_under_a_head_prefix(tmp_path, capsys):
    """mmseg logs each head's losses under its prefix (decode.loss_ce, aux.loss_ce): the summary
    keeps them, and leaves out what is not a loss (decode.acc_seg, lr, time)."""
    lines = [dict(lr=.01, loss=1.5, **{'decode.loss_ce': 1., 'decode.acc_seg': 40.,
                                       'aux.loss_ce': .5}, time=.5, data_time=.01, iter=s,
                  step=s) for s in (10, 20)]
    write_run(tmp_path, '20261202_100000', lines)
    (s, ) = analyze_logs.main(['summary', str(tmp_path)])
    assert s['losses'] == {'loss': 1.5, 'decode.loss_ce': 1., 'aux.loss_ce': .5}
    assert 'decode.loss_ce 1.0000, aux.loss_ce 0.5000' in capsys.readouterr().out
