""" A run's folder is its own (issue 29, items 1, 2, 5): nothing read from a checkpoint names a file to delete or
becomes an attribute, a resume never writes into another run or over a run's later epochs, two processes never
share a run folder, and a failure after the last update still leaves a ``results.json`` that says what happened.

Every run here is tiny (a 1-layer text model for a few updates, or a width-8 sMLPNet on 16 generated PNGs).
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import mlp_vision.train as train  # noqa: E402  (the command's code; train.py at the root runs it)
import mlp_vision.train_text as text_train  # noqa: E402
from mlp_vision.outputs import atomic_save, temp_path  # noqa: E402
from mlp_vision.errors import UsageError  # noqa: E402
from mlp_vision.run_files import CheckpointManager, new_run_folder  # noqa: E402
from _helpers import TINY_GPT, TINY_VISION, crafted_checkpoint, exits_with_one_line  # noqa: E402


@pytest.fixture(scope='module')
def vision_run(images, tmp_path_factory):
    """A finished 2-epoch run keeping its 2 best epoch checkpoints, optimizer state included (the tests resume
    from them): (folder, train.py arguments)."""
    out = tmp_path_factory.mktemp('runs')
    argv = TINY_VISION + ['--data-dir', str(images), '--val-split', 'val', '--epochs', '2', '--checkpoint-hist', '2',
                          '--keep-optimizer-state', '--output', str(out), '--experiment', 'v']  # resumable top-N
    train.main(argv)
    return out / 'v', argv


_fail = exits_with_one_line


def _files(folder: Path):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith('.')}


_crafted = crafted_checkpoint


# ------------------------------------------------------------------------------------------------ item 1
@pytest.mark.parametrize('name', ['absolute', 'relative', 'other_name'])
def test_a_crafted_history_cannot_delete_a_file(vision_run, tmp_path, capsys, name):
    folder, argv = vision_run
    victim = tmp_path / 'victim.txt'
    victim.write_text('precious')
    target = {'absolute': str(victim), 'relative': '../../victim.txt', 'other_name': 'args.yaml'}[name]
    run_copy = tmp_path / 'a' / 'b'
    hist = {'history': [{'epoch': 0, 'metric': 99.0, 'file': target}], 'best': {'epoch': 0, 'metric': 99.0}}
    crafted = _crafted(folder / 'last.pth', run_copy, lambda c: c.update(checkpoint_history=hist))
    before = _files(run_copy)
    msg = _fail(train.main, ['--resume', str(crafted), '--epochs', '4', '--checkpoint-hist', '1'], capsys)
    assert 'checkpoint_history is not one this trainer writes' in msg and 'is not used' in msg
    assert victim.read_text() == 'precious'
    assert _files(run_copy) == before  # nothing written: the check comes before the folder is touched


@pytest.mark.parametrize('entry', [
    {'epoch': -1, 'metric': 1.0, 'file': 'checkpoint--1.pth'},
    {'epoch': True, 'metric': 1.0, 'file': 'checkpoint-True.pth'},
    {'epoch': 1, 'metric': float('nan'), 'file': 'checkpoint-1.pth'},
    {'epoch': 1, 'metric': 1.0, 'file': 'checkpoint-2.pth'},
    {'epoch': 1, 'metric': 1.0, 'file': 'checkpoint-1.pth', 'extra': 1},
    'checkpoint-1.pth',
])
def test_history_entries_are_checked(tmp_path, entry):
    saver = CheckpointManager(tmp_path, max_history=2)
    with pytest.raises(UsageError, match=r"x.pth: .* is not \{epoch: N >= 0, metric: a finite number, file: "):
        saver.load_state_dict({'history': [entry], 'best': None}, source='x.pth')
    good = {'history': [{'epoch': 1, 'metric': 2.0, 'file': 'checkpoint-1.pth'}], 'best': {'epoch': 1, 'metric': 2.0}}
    (tmp_path / 'checkpoint-1.pth').write_bytes(b'x')
    (tmp_path / 'model_best.pth').write_bytes(b'x')
    saver.load_state_dict(good)
    assert saver.history == good['history'] and saver.best == good['best']


def test_eviction_deletes_only_the_runs_own_top_n_file(vision_run, tmp_path):
    # a legitimate resume in a copy of the run: epochs 2 and 3 push epochs out of the top 1 by their own names
    folder, _ = vision_run
    run_copy = tmp_path / 'v'
    run_copy.mkdir()
    for name in ('run.json', 'last.pth', 'checkpoint-0.pth', 'checkpoint-1.pth', 'model_best.pth', 'summary.csv'):
        (run_copy / name).write_bytes((folder / name).read_bytes())
    train.main(['--resume', str(run_copy / 'last.pth'), '--epochs', '4', '--checkpoint-hist', '1'])
    kept = sorted(p.name for p in run_copy.glob('checkpoint-*.pth'))
    assert len(kept) == 1, kept
    best_epoch = torch.load(run_copy / 'last.pth', weights_only=True)['checkpoint_history']['history'][0]['epoch']
    assert kept == [f'checkpoint-{best_epoch}.pth']


# ------------------------------------------------------------------------------------------------ item 2
def test_resuming_an_earlier_checkpoint_keeps_the_later_epochs(vision_run, tmp_path):
    folder, _ = vision_run
    run_copy = tmp_path / 'v'
    run_copy.mkdir()
    for p in folder.iterdir():
        if p.is_file():
            (run_copy / p.name).write_bytes(p.read_bytes())
    before = _files(run_copy)
    res = train.main(['--resume', str(run_copy / 'checkpoint-0.pth')])
    assert _files(run_copy) == before
    branch = tmp_path / 'v-1'
    assert Path(res['experiment_dir']) == branch.resolve()
    assert torch.load(branch / 'last.pth', weights_only=True)['epoch'] == 1
    log = (branch / 'train.log').read_text()
    assert 'has reached epoch 1' in log and 'is left as it is' in log


def test_new_run_folders_have_no_limit_and_experiment_names_stay_inside(tmp_path, text_file, capsys):
    for n in range(101):
        (tmp_path / ('x' if n == 0 else f'x-{n}')).mkdir()
    assert new_run_folder(tmp_path, 'x') == tmp_path / 'x-101'
    for bad in ('../escape', '/tmp/abs', '..'):  # the text trainer refuses them too
        msg = _fail(text_train.main, TINY_GPT + ['--train-file', text_file, '--steps', '2', '--output',
                                                 str(tmp_path), '--experiment', bad], capsys)
        assert 'is not a folder name' in msg
    assert not (tmp_path.parent / 'escape').exists()


# ------------------------------------------------------------------------------------------------ item 5
# ------------------------------------------------------------------------------------------------ run identity
# (issue 33: a run is identified by what it is; resume decisions are made under the lock)
def _copy_run(folder: Path, to: Path, names=None) -> Path:
    to.mkdir()
    for p in folder.iterdir():
        if p.is_file() and not p.name.startswith('.') and (names is None or p.name in names):
            (to / p.name).write_bytes(p.read_bytes())
    return to


def test_a_folder_without_last_pth_keeps_its_later_epochs(vision_run, tmp_path):
    folder, _ = vision_run
    # the run's own folder, last.pth gone: its checkpoint-1.pth and summary rows still say it reached epoch 1
    run_copy = _copy_run(folder, tmp_path / 'v', names={'run.json', 'checkpoint-0.pth', 'checkpoint-1.pth',
                                                        'summary.csv', 'args.yaml'})
    before = _files(run_copy)
    res = train.main(['--resume', str(run_copy / 'checkpoint-0.pth')])
    assert _files(run_copy) == before
    assert Path(res['experiment_dir']) == (tmp_path / 'v-1').resolve()
    assert 'has no last.pth but has reached epoch 1' in (tmp_path / 'v-1' / 'train.log').read_text()


def test_two_resumes_of_one_run_race_and_neither_loses_epochs(vision_run, tmp_path, monkeypatch):
    # B loads last.pth (epoch 1) and is held before taking the lock; meanwhile A resumes the same run in place to
    # epoch 3 and ends. B then takes the lock, looks again, sees epoch 3 and branches off instead of replacing it.
    import mlp_vision.run_files as run_module
    folder, _ = vision_run
    run_copy = _copy_run(folder, tmp_path / 'v')
    real, held = run_module.newer_than, []

    def newer_than_with_a_race(*a):
        reason = real(*a)
        if not held:
            held.append(True)
            train.main(['--resume', str(run_copy / 'last.pth'), '--epochs', '4'])  # A, run to its end meanwhile
        return reason
    monkeypatch.setattr(run_module, 'newer_than', newer_than_with_a_race)
    res = train.main(['--resume', str(run_copy / 'last.pth'), '--epochs', '4'])  # B
    assert held
    assert torch.load(run_copy / 'last.pth', weights_only=True)['epoch'] == 3  # A's epochs kept
    rows = [line.split(',')[0] for line in (run_copy / 'summary.csv').read_text().splitlines()[1:]]
    assert rows == ['0', '1', '2', '3']
    assert Path(res['experiment_dir']) == (tmp_path / 'v-1').resolve()
    assert 'has reached epoch 3' in (tmp_path / 'v-1' / 'train.log').read_text()


def test_checkpoints_of_two_runs_in_one_folder_do_not_resume_into_each_other(vision_run, text_file, tmp_path):
    folder, argv = vision_run
    other = tmp_path / 'other'
    train.main(argv[:argv.index('--output')] + ['--output', str(tmp_path), '--experiment', 'other'])
    run_copy = _copy_run(folder, tmp_path / 'v')
    (run_copy / 'foreign.pth').write_bytes((other / 'last.pth').read_bytes())  # same epoch, another run
    before = _files(run_copy)
    res = train.main(['--resume', str(run_copy / 'foreign.pth'), '--epochs', '3'])
    assert _files(run_copy) == before
    assert Path(res['experiment_dir']) == (tmp_path / 'v-1').resolve()
    assert 'is another run' in (tmp_path / 'v-1' / 'train.log').read_text()


@pytest.mark.parametrize('legacy', [False, True])
def test_a_folder_that_is_not_a_run_is_never_written(vision_run, tmp_path, legacy):
    folder, _ = vision_run
    mine = tmp_path / 'my_results'
    mine.mkdir()
    (mine / 'figure.png').write_bytes(b'my own figure')
    (mine / 'summary.csv').write_text('epoch,note\n0,mine\n5,mine too\n')
    ckpt = torch.load(folder / 'last.pth', weights_only=True)
    if legacy:
        del ckpt['run_id']  # a checkpoint written before runs had an id
    atomic_save(ckpt, mine / 'last.pth')
    before = _files(mine)
    res = train.main(['--resume', str(mine / 'last.pth'), '--epochs', '3'])
    assert _files(mine) == before
    new = Path(res['experiment_dir'])
    assert new == (tmp_path / 'my_results-1').resolve()
    assert 'mine' not in (new / 'summary.csv').read_text()  # the folder's rows are not this run's past
    log = (new / 'train.log').read_text()
    assert ('carries no run id' if legacy else 'is not a run folder') in log


@pytest.mark.parametrize('name', ['.lock', 'train.log', 'summary.csv', 'args.yaml'])
def test_links_in_a_run_folder_are_refused_and_their_targets_untouched(vision_run, tmp_path, capsys, name):
    folder, _ = vision_run
    run_copy = _copy_run(folder, tmp_path / 'v')
    outside = tmp_path / 'precious.txt'
    outside.write_text('not the run\'s\n')
    (run_copy / name).unlink(missing_ok=True)
    (run_copy / name).symlink_to(outside)
    before = _files(run_copy)
    msg = _fail(train.main, ['--resume', str(run_copy / 'last.pth'), '--epochs', '3'], capsys)
    assert 'symbolic link' in msg and name in msg
    assert outside.read_text() == 'not the run\'s\n'
    assert _files(run_copy) == before


def test_a_fifo_in_a_run_folder_is_refused_without_blocking(vision_run, tmp_path, capsys):
    folder, _ = vision_run
    run_copy = _copy_run(folder, tmp_path / 'v')
    (run_copy / 'summary.csv').unlink()
    os.mkfifo(run_copy / 'summary.csv')
    msg = _fail(train.main, ['--resume', str(run_copy / 'last.pth'), '--epochs', '3'], capsys)
    assert 'summary.csv' in msg and 'FIFO' in msg


def test_every_checkpoint_carries_the_folders_run_id(vision_run):
    folder, _ = vision_run
    run_id = json.loads((folder / 'run.json').read_text())['run_id']
    for name in ('last.pth', 'model_best.pth', 'checkpoint-0.pth', 'checkpoint-1.pth'):
        assert torch.load(folder / name, weights_only=True)['run_id'] == run_id


# ------------------------------------------------------------------------------------------------ resume checks
def _misfit_optimizer_state(ckpt):  # the first optimizer state tensor (SGD's momentum buffer) of another shape
    state = next(iter(ckpt['optimizer']['state'].values()))
    state[next(k for k, v in state.items() if isinstance(v, torch.Tensor))] = torch.zeros(3, 3, 3, 3, 3)


@pytest.mark.parametrize('change, problem', [
    (lambda c: c['args'].update(lr='1e-3; rm -rf /'), 'lr must be a number'),
    (lambda c: c['args'].update(amp_dtype='save'), 'amp_dtype must be one of'),
    (lambda c: c['args'].update(amp='yes'), 'amp must be true or false'),
    (lambda c: c.update(epoch=-3), "checkpoint's epoch"),
    (lambda c: c.update(state_dict=['not', 'a', 'dict']), 'state_dict'),
    (lambda c: c['scheduler'].update(optimizer='replaced'), "entry 'optimizer'"),
    (lambda c: c['scheduler'].update(t_initial='long'), "entry 't_initial'"),
    (lambda c: c['optimizer']['param_groups'][0].update(lr='fast'), "setting 'lr'"),
    (_misfit_optimizer_state, 'does not fit'),
    (lambda c: c['rng_states'][0].update(torch='seed'), 'its torch random-number state'),
    (lambda c: c['rng_states'][0]['numpy'].update(pos=10 ** 6), 'its numpy random-number state'),
    (lambda c: c.update(args=['lr', 1.0]), "checkpoint's args is not what this trainer writes"),
    (lambda c: c.update(kind='text'), 'is not a training checkpoint of'),
    (lambda c: [c.pop('optimizer'), c.pop('checkpoint_history')], 'expected the last.pth (or checkpoint-N.pth)'),
])
def test_crafted_saved_values_stop_with_one_line(vision_run, tmp_path, capsys, change, problem):
    # no new flags: the schedule is the checkpoint's, so its scheduler state is checked (and loaded) too
    folder, _ = vision_run
    crafted = _crafted(folder / 'last.pth', tmp_path / 'crafted', change)
    before = _files(crafted.parent)
    msg = _fail(train.main, ['--resume', str(crafted)], capsys)
    assert problem in msg, msg
    assert _files(crafted.parent) == before  # nothing loaded into a run, no folder written


def test_temporary_files_of_a_killed_run_are_removed_at_the_next_start(vision_run, tmp_path):
    folder, _ = vision_run
    run_copy = _copy_run(folder, tmp_path / 'v')
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    live = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
    try:
        killed = run_copy / temp_path('last.pth').name.replace(str(os.getpid()), str(dead.pid))
        running = run_copy / temp_path('summary.csv').name.replace(str(os.getpid()), str(live.pid))
        killed.write_bytes(b'half a checkpoint')
        running.write_bytes(b'another process is writing this')
        res = train.main(['--resume', str(run_copy / 'last.pth'), '--epochs', '3'])
        assert Path(res['experiment_dir']) == run_copy.resolve()  # continued in place
        assert not killed.exists()
        assert running.read_bytes() == b'another process is writing this'
        assert killed.name in (run_copy / 'train.log').read_text()
    finally:
        live.kill()
        live.wait()


def test_a_run_folder_in_use_is_refused(vision_run, tmp_path, capsys):
    folder, _ = vision_run
    run_copy = _copy_run(folder, tmp_path / 'v')
    # another process takes the folder's lock the way lock_folder does (a POSIX record lock, its pid inside)
    holder = subprocess.Popen([sys.executable, '-c', textwrap.dedent(f'''
        import fcntl, os, time
        fd = os.open({str(run_copy / '.lock')!r}, os.O_RDWR | os.O_CREAT)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.write(fd, b'4242')
        print('locked', flush=True)
        time.sleep(60)
        ''')], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'locked'
        before = _files(run_copy)
        msg = _fail(train.main, ['--resume', str(run_copy / 'last.pth'), '--epochs', '3'], capsys)
        assert 'is in use by another training process (pid 4242)' in msg
        assert _files(run_copy) == before
    finally:
        holder.kill()
        holder.wait()
    res = train.main(['--resume', str(run_copy / 'last.pth'), '--epochs', '3'])  # free once the holder is gone
    assert Path(res['experiment_dir']) == run_copy.resolve()
    assert torch.load(run_copy / 'last.pth', weights_only=True)['epoch'] == 2


def test_a_failed_final_stage_leaves_results_and_the_previous_export(vision_run, tmp_path, capsys, monkeypatch):
    folder, _ = vision_run
    run_copy = _copy_run(folder, tmp_path / 'v')
    shutil.copytree(folder / 'pretrained', run_copy / 'pretrained')
    export_before = _files(run_copy / 'pretrained')
    results_before = (run_copy / 'results.json').read_bytes()

    def save_then_fail(model, directory, **kwargs):
        (Path(directory) / 'config.json').write_text('{"partial": true}')
        raise OSError(28, 'No space left on device', str(Path(directory) / 'model.safetensors'))
    monkeypatch.setattr(train, 'save_for_hf', save_then_fail)
    msg = _fail(train.main, ['--resume', str(run_copy / 'last.pth'), '--epochs', '3'], capsys, status=1)
    assert 'No space left on device' in msg
    assert _files(run_copy / 'pretrained') == export_before  # the earlier export, whole
    assert not [p for p in run_copy.iterdir() if p.name.startswith('.pretrained')]
    recorded = json.loads((run_copy / 'results.json').read_text())
    assert 'No space left on device' in recorded['error'] and recorded['epoch'] == 2
    assert (run_copy / 'results-1.json').read_bytes() == results_before
    msg = _fail(train.main, ['--resume', str(run_copy / 'last.pth'), '--epochs', '3'], capsys)
    assert 'its final stage failed' in msg and 'No space left on device' in msg


def test_a_finished_run_without_results_says_so(vision_run, tmp_path, capsys):
    folder, _ = vision_run
    run_copy = _copy_run(folder, tmp_path / 'v')
    (run_copy / 'results.json').unlink()  # as after a kill during the final stage
    msg = _fail(train.main, ['--resume', str(run_copy / 'last.pth')], capsys)
    assert 'its final outputs were never written' in msg and 'results in' not in msg


def test_resuming_a_finished_run_is_refused_and_changes_nothing(vision_run, tmp_path, capsys):
    folder, _ = vision_run
    run_copy = _copy_run(folder, tmp_path / 'v')
    before = _files(run_copy)
    msg = _fail(train.main, ['--resume', str(run_copy / 'last.pth')], capsys)
    assert 'already finished its 2 epochs' in msg and 'pass a larger --epochs' in msg
    assert f'results in {run_copy.resolve() / "results.json"}' in msg
    assert _files(run_copy) == before


def test_a_finished_runs_checkpoint_moved_elsewhere_does_not_speak_for_that_folder(vision_run, tmp_path, capsys):
    folder, _ = vision_run
    moved = tmp_path / 'elsewhere' / 'last.pth'
    moved.parent.mkdir()
    moved.write_bytes((folder / 'last.pth').read_bytes())
    (moved.parent / 'results.json').write_text('{"error": "not this run\'s"}')
    msg = _fail(train.main, ['--resume', str(moved)], capsys)
    assert 'already finished its 2 epochs' in msg and 'lies outside its run\'s folder' in msg and 'not this' not in msg


# ------------------------------------------------------------------------------------------------ issue 44, item 3
class _Killed(BaseException):
    """A SIGKILL at this point: nothing after it runs (no handler, no cleanup of the files written so far)."""


@pytest.mark.parametrize('resume_only', [(), ('optimizer',)])
def test_a_kill_between_the_best_and_last_writes_leaves_record_and_files_agreeing(tmp_path, monkeypatch, caplog,
                                                                                 resume_only):
    """model_best.pth is written before last.pth, whose history names it; killed between the two, last.pth is the
    previous epoch's, and a resume takes the best from model_best.pth itself (said in the log)."""
    import mlp_vision.run_files as run_module

    def state(epoch, metric):
        return {'epoch': epoch, 'metric': metric, 'w': torch.full((2,), float(epoch)), 'optimizer': {'lr': 0.1}}

    def written():
        last, best = (torch.load(tmp_path / name, weights_only=True) for name in ('last.pth', 'model_best.pth'))
        return last['epoch'], last['checkpoint_history']['best'], {'epoch': best['epoch'], 'metric': best['metric']}

    saver = CheckpointManager(tmp_path, max_history=2, resume_only=resume_only)
    saver.save(state(0, 1.0), 0, 1.0)
    real_save, real_link = run_module.atomic_save, run_module.atomic_link

    def kill_at_last(write):
        def wrapped(*args):
            if Path(args[-1]) == tmp_path / 'last.pth':
                raise _Killed
            return write(*args)
        return wrapped
    monkeypatch.setattr(run_module, 'atomic_save', kill_at_last(real_save))
    monkeypatch.setattr(run_module, 'atomic_link', kill_at_last(real_link))
    with pytest.raises(_Killed):
        saver.save(state(1, 2.0), 1, 2.0)  # the new best
    monkeypatch.undo()
    last_epoch, recorded, held = written()
    assert last_epoch == 0 and recorded == {'epoch': 0, 'metric': 1.0} and held == {'epoch': 1, 'metric': 2.0}

    resumed = CheckpointManager(tmp_path, max_history=2, resume_only=resume_only)
    resumed.load_state_dict(torch.load(tmp_path / 'last.pth', weights_only=True)['checkpoint_history'])
    assert resumed.best == held and 'holds epoch 1' in caplog.text and 'stopped between writing' in caplog.text
    resumed.save(state(1, 1.5), 1, 1.5)  # epoch 1 trained again (here to a lower metric): not the best
    last_epoch, recorded, held = written()
    assert last_epoch == 1 and recorded == held == {'epoch': 1, 'metric': 2.0}


def test_a_failed_best_write_leaves_the_previous_epoch_whole(tmp_path, monkeypatch):
    import mlp_vision.run_files as run_module
    saver = CheckpointManager(tmp_path, max_history=0)
    saver.save({'epoch': 0, 'metric': 1.0}, 0, 1.0)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full_disk(obj, path):
        raise OSError(28, 'No space left on device', str(path))
    monkeypatch.setattr(run_module, 'atomic_save', full_disk)
    with pytest.raises(OSError):
        saver.save({'epoch': 1, 'metric': 2.0}, 1, 2.0)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_results_name_what_the_files_hold_after_a_kill_between_writes(vision_run, tmp_path, capsys, monkeypatch,
                                                                      caplog):
    """A resumed run killed after writing epoch 2's model_best.pth, before its last.pth; resumed again to the end:
    results.json's best and pretrained/ are what model_best.pth holds. User files in pretrained/ are kept."""
    import mlp_vision.run_files as run_module
    folder, _ = vision_run
    run_copy = _copy_run(folder, tmp_path / 'v')
    shutil.copytree(folder / 'pretrained', run_copy / 'pretrained')
    (run_copy / 'pretrained' / 'README.md').write_text('# my model card\n')
    (run_copy / 'pretrained' / 'notes').mkdir()
    (run_copy / 'pretrained' / 'notes' / 'data.txt').write_text('where the photos came from\n')
    real_validate, real_link, real_save = train._validate_epoch, run_module.atomic_link, run_module.atomic_save

    def best_ever(*args):  # epoch 2 beats every earlier epoch
        return real_validate(*args) + 1000.

    def killed_at_last(write):
        def wrapped(*args):
            if Path(args[-1]).name == 'last.pth':
                raise _Killed
            return write(*args)
        return wrapped
    monkeypatch.setattr(train, '_validate_epoch', best_ever)
    monkeypatch.setattr(run_module, 'atomic_link', killed_at_last(real_link))
    monkeypatch.setattr(run_module, 'atomic_save', killed_at_last(real_save))
    with pytest.raises(_Killed):
        train.main(['--resume', str(run_copy / 'last.pth'), '--epochs', '3'])
    monkeypatch.undo()
    best_file = torch.load(run_copy / 'model_best.pth', weights_only=True)
    assert best_file['epoch'] == 2 and torch.load(run_copy / 'last.pth', weights_only=True)['epoch'] == 1

    res = train.main(['--resume', str(run_copy / 'last.pth'), '--epochs', '3'])  # epoch 2 again, not a best
    assert 'model_best.pth holds epoch 2' in caplog.text
    held = {'epoch': best_file['epoch'], 'metric': best_file['metric']}
    recorded = json.loads((run_copy / 'results.json').read_text())
    assert res['best'] == recorded['best'] == held
    assert recorded['pretrained_from'] == {'file': 'model_best.pth', **held, 'ema': False}
    assert torch.load(run_copy / 'last.pth', weights_only=True)['checkpoint_history']['best'] == held
    from safetensors.torch import load_file
    exported = load_file(run_copy / 'pretrained' / 'model.safetensors')
    assert exported.keys() == best_file['state_dict'].keys()
    assert all(torch.equal(exported[k], best_file['state_dict'][k]) for k in exported)
    assert (run_copy / 'pretrained' / 'README.md').read_text() == '# my model card\n'
    assert (run_copy / 'pretrained' / 'notes' / 'data.txt').read_text() == 'where the photos came from\n'


def test_a_signal_during_the_final_export_is_said_after_it_completes(vision_run, tmp_path, capsys, monkeypatch):
    """SIGTERM while pretrained/ is written: the export and results.json complete (they agree), then one line and
    exit status 128 + 15."""
    import signal
    folder, _ = vision_run
    run_copy = _copy_run(folder, tmp_path / 'v')
    real_save_for_hf = train.save_for_hf

    def export_with_a_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_save_for_hf(*args, **kwargs)
    monkeypatch.setattr(train, 'save_for_hf', export_with_a_signal)
    msg = _fail(train.main, ['--resume', str(run_copy / 'last.pth'), '--epochs', '3'], capsys, status=128 + 15)
    assert 'SIGTERM arrived after the last update' in msg and 'the run is complete' in msg
    recorded = json.loads((run_copy / 'results.json').read_text())
    assert recorded['final_epoch'] == 2 and 'error' not in recorded
    assert {p.name for p in (run_copy / 'pretrained').iterdir()} >= {'config.json', 'model.safetensors'}
    best_file = torch.load(run_copy / 'model_best.pth', weights_only=True)
    assert recorded['best'] == {'epoch': best_file['epoch'], 'metric': best_file['metric']}


def test_a_kill_between_the_export_renames_loses_no_user_file(tmp_path, monkeypatch, caplog):
    """Killed after the earlier pretrained/ was moved aside, before the new one took its place: the next start
    moves the earlier folder (and the user's files in it) back, where it would have removed a temporary folder."""
    import mlp_vision.outputs as outputs_module
    export = tmp_path / 'pretrained'
    export.mkdir()
    (export / 'README.md').write_text('# my model card\n')
    (export / 'config.json').write_text('{"old": true}')
    real_replace = os.replace

    def killed_after_moving_aside(src, dst):
        real_replace(src, dst)
        if Path(dst).name.startswith('.pretrained.old'):
            raise _Killed
    monkeypatch.setattr(outputs_module.os, 'replace', killed_after_moving_aside)
    with pytest.raises(_Killed):
        with outputs_module.atomic_folder(export) as new:
            (new / 'config.json').write_text('{"new": true}')
    monkeypatch.undo()
    assert not export.exists()
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    for p in tmp_path.glob('.pretrained*'):  # as the killed process's, whose pid is gone
        p.rename(p.with_name(p.name.replace(str(os.getpid()), str(dead.pid))))
    outputs_module.clean_stale_temp_files(tmp_path)
    assert (export / 'README.md').read_text() == '# my model card\n' and 'restored' in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == ['pretrained']
