""" Output paths the user gives (issue 44): a character device, a FIFO or a symbolic link there is written as any
Unix tool writes it, never renamed, replaced or deleted; only a regular file is kept as ``NAME-1``. Every command
that takes an output path, against each kind. The device is made in tmp_path with /dev/null's numbers. """
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mlp_vision import validate
from mlp_vision.complexity import report as cx
from mlp_vision.visualize import main as visualize_main

REPO = Path(__file__).resolve().parents[1]

from _helpers import TINY_VISION, exits_with_one_line  # noqa: E402

KINDS = ('device', 'fifo', 'link', 'link_to_device')


def make_device(path: Path) -> Path:
    """A character device with /dev/null's major/minor (writes vanish) at ``path``; skips without the right."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip('os.mknod of a character device needs root (CAP_MKNOD)')
    return path


class FifoReader:
    """A FIFO at ``path`` and a ``cat`` process draining it (so a writer does not block); :meth:`read` waits for
    the writer to close and returns the bytes, or fails if nothing opened the FIFO for writing."""

    def __init__(self, path: Path):
        os.mkfifo(path)
        self.path = path
        self.proc = subprocess.Popen(['cat', str(path)], stdout=subprocess.PIPE)

    def read(self, timeout: float = 60) -> bytes:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            pytest.fail(f'nothing wrote into the FIFO {self.path}')
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


class Output:
    """An output path of ``kind`` in ``folder``: make it, then check what the command did with it."""

    def __init__(self, folder: Path, name: str, kind: str):
        self.path, self.kind, self.reader = folder / name, kind, None
        self.target = folder / 'real' / name  # a link's target, in a folder of its own
        if kind in ('link', 'link_to_device'):
            self.target.parent.mkdir(exist_ok=True)
            if kind == 'link':
                self.target.write_text('earlier\n')
            else:
                make_device(self.target)
            os.symlink(self.target, self.path)
        elif kind == 'device':
            make_device(self.path)
        else:
            self.reader = FifoReader(self.path)

    def written(self, keep: bool = False) -> bytes:
        """The bytes the command wrote (None where they went into the null device), after checking that every
        path is still what it was and that no ``NAME-1`` appeared beside it."""
        data = self.reader.read() if self.reader else None
        mode = os.lstat(self.path).st_mode
        expected = {'device': stat.S_ISCHR, 'fifo': stat.S_ISFIFO}.get(self.kind, stat.S_ISLNK)
        assert expected(mode), f'{self.path} is no longer a {self.kind}'
        siblings = [p.name for p in self.path.parent.iterdir() if p.name.startswith(self.path.stem + '-')]
        assert siblings == [], f'renamed away: {siblings}'
        if self.kind == 'link_to_device':
            assert stat.S_ISCHR(os.lstat(self.target).st_mode)
            assert os.listdir(self.target.parent) == [self.target.name]
        if self.kind == 'link':
            assert os.readlink(self.path) == str(self.target)
            kept = sorted(p.name for p in self.target.parent.iterdir() if p != self.target)
            assert kept == ([f'{self.target.stem}-1{self.target.suffix}'] if keep else [])
            if keep:
                assert self.target.with_name(kept[0]).read_text() == 'earlier\n'
            data = self.target.read_bytes()
        return data

    def close(self) -> None:
        if self.reader:
            self.reader.close()


@pytest.fixture
def output(tmp_path):
    made = []

    def make(name: str, kind: str) -> Output:
        made.append(Output(tmp_path, name, kind))
        return made[-1]
    yield make
    for out in made:
        out.close()


@pytest.mark.parametrize('kind', KINDS)
def test_validate_results_file(kind, output, images):
    out = output('val.json', kind)
    results = validate.main(TINY_VISION[:7] + ['--num-classes', '2', '--data-dir', str(images), '--split', 'val',
                                               '--workers', '0', '-b', '4', '--results-file', str(out.path)])
    data = out.written(keep=True)
    if data is not None:
        assert json.loads(data)['top1'] == results['top1']


@pytest.mark.parametrize('kind', KINDS)
def test_complexity_output(kind, output):
    out = output('c.csv', kind)
    assert cx.main(['--models', 'gpt_sdpa', '--threads', '1', '--output', str(out.path)]) == 0
    data = out.written()
    if data is not None:
        assert data.decode().startswith('section,') and 'gpt_sdpa' in data.decode()


def test_a_full_device_is_one_line_and_stays(tmp_path, capsys):
    """A device that refuses the bytes (/dev/full's numbers): exit 1, one line naming it; the node stays."""
    full = tmp_path / 'full.csv'
    try:
        os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        pytest.skip('os.mknod of a character device needs root (CAP_MKNOD)')
    with pytest.raises(SystemExit) as e:
        cx.main(['--models', 'gpt_sdpa', '--threads', '1', '--output', str(full)])
    err = capsys.readouterr().err.splitlines()  # progress lines, then the error's one line
    assert e.value.code == 1 and err[-1] == f'python -m mlp_vision.complexity: error: No space left on device: {full}'
    assert not any('Traceback' in line for line in err)
    assert stat.S_ISCHR(os.lstat(full).st_mode) and os.listdir(tmp_path) == ['full.csv']


def test_benchmark_out(output, tmp_path, capsys):
    """One run: PREFIX.csv a device, PREFIX.json a FIFO, PREFIX.md a link to a device, PREFIX_profile.txt a link to
    a file not yet there (created through the link); a link to an earlier run's file is refused before timing."""
    from mlp_vision import benchmark
    outs = [output('b.csv', 'device'), output('b.json', 'fifo'), output('b.md', 'link_to_device')]
    profile = tmp_path / 'b_profile.txt'
    os.symlink(tmp_path / 'elsewhere' / 'p.txt', profile)
    (tmp_path / 'elsewhere').mkdir()
    argv = ['--model', 'smlpnet_t', '--model-kwargs', 'embed_dim=8', 'depths=(1,1,1,1)', '-b', '1', '--img-size',
            '32', '--warmup', '1', '--iters', '1', '--samples', '1', '--threads', '1', '--no-memory', '--no-ceiling',
            '--no-flops', '--profile', '--out', str(tmp_path / 'b')]
    benchmark.main(argv)
    assert json.loads(outs[1].written())['results'][0]['model'] == 'smlpnet_t'
    outs[0].written()
    outs[2].written()
    assert os.path.islink(profile) and (tmp_path / 'elsewhere' / 'p.txt').read_text().startswith('# torch.profiler')
    assert 'b_profile.txt exists' in exits_with_one_line(benchmark.main, argv, capsys)  # p.txt: results of a run
    assert os.path.islink(profile)


@pytest.mark.parametrize('kind', ('device', 'fifo'))
def test_folder_outputs_refuse_a_device_or_fifo(kind, output, images, capsys):
    """The trainers' --output and visualize's --out name folders: a device or FIFO there is refused in one line
    and left as it was."""
    from mlp_vision import train
    out = output('o', kind)
    line = exits_with_one_line(train.main, TINY_VISION + ['--data-dir', str(images), '--output', str(out.path)],
                               capsys)
    assert f'--output {out.path} is not a folder' in line
    line = exits_with_one_line(visualize_main, ['smlpnet_t', '--out', str(out.path)], capsys)
    assert f'--out {out.path} is not a folder' in line
    assert (stat.S_ISCHR if kind == 'device' else stat.S_ISFIFO)(os.lstat(out.path).st_mode)


def test_write_output_file_rules(tmp_path):
    """The one place that decides: a regular file is kept only when asked, a folder or socket is one clear error,
    /dev/stdout (a link through /proc/self/fd) is appended to, whether stdout is a file or a pipe."""
    from mlp_vision.outputs import output_kind, write_output_file
    regular = tmp_path / 'r.txt'
    regular.write_text('one')
    assert write_output_file(regular, 'two') is None and regular.read_text() == 'two'
    assert write_output_file(regular, 'three', keep=True) == tmp_path / 'r-1.txt'
    assert (tmp_path / 'r-1.txt').read_text() == 'two' and regular.read_text() == 'three'
    assert output_kind(tmp_path) == 'folder' and output_kind(tmp_path / 'none') == 'new'
    with pytest.raises(ValueError, match='is a folder; expected a file path'):
        write_output_file(tmp_path, 'x')
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / 's.sock'))
        with pytest.raises(ValueError, match='is a socket; expected a file path'):
            write_output_file(tmp_path / 's.sock', 'x')
    (tmp_path / 's.sock').unlink()
    log = tmp_path / 'stdout.txt'
    code = 'from mlp_vision.outputs import write_output_file as w; w("/dev/stdout", "after\\n")'
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(log, 'w') as f:
        f.write('before\n')
        f.flush()
        subprocess.run([sys.executable, '-c', code], stdout=f, check=True, cwd=REPO, env=env)
    piped = subprocess.run([sys.executable, '-c', code], capture_output=True, check=True, cwd=REPO, env=env)
    assert piped.stdout == b'after\n'
    assert log.read_text() == 'before\nafter\n' and sorted(os.listdir(tmp_path)) == ['r-1.txt', 'r.txt', 'stdout.txt']


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc (a folder no file can be made in)')
def test_a_folder_that_takes_no_new_file_names_the_path_given_not_the_temporary_one():
    from mlp_vision.outputs import write_output_file
    with pytest.raises(OSError) as info:
        write_output_file('/proc/mlp_vision_results.json', 'x')
    assert info.value.filename == '/proc/mlp_vision_results.json' and '.tmp-' not in str(info.value)
