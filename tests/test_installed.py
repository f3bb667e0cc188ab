""" The package as users install it (issue 27): a wheel built from this checkout holds every module, the recipes of
``configs/`` (as ``mlp_vision/configs``) and the console scripts; installed non-editably in a throwaway venv, its
commands run from a folder outside the checkout: each ``--help``, ``python -m mlp_vision``, ``-c NAME`` finding the
shipped recipe, and (slow) the demo's first epoch. An editable install (CI's ``pip install -e``) finds the
recipes in the checkout's ``configs/``.

Nothing is downloaded: the wheel is built with ``--no-build-isolation`` (the running interpreter's setuptools) and
installed with ``--no-deps``; the venv sees this interpreter's packages (torch, timm, ...) through a ``.pth`` file,
which also works when this interpreter is itself a venv (``--system-site-packages`` would give the base
interpreter's packages instead).
"""
import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mlp_vision.commands import COMMANDS

REPO = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ('pyproject.toml', 'README.md', 'mlp_vision', 'configs')  # what pyproject.toml packages


def _can_build_offline() -> bool:
    if importlib.util.find_spec('setuptools') is None:
        return False
    import setuptools
    # bdist_wheel is part of setuptools from 70.1; before, it comes with the `wheel` package
    built_in = tuple(int(x) for x in setuptools.__version__.split('.')[:2] if x.isdigit()) >= (70, 1)
    return built_in or importlib.util.find_spec('wheel') is not None


pytestmark = pytest.mark.skipif(not _can_build_offline(),
                                reason='building the wheel offline needs setuptools >= 70.1 (or wheel) installed')


def _run(cmd, cwd, timeout=300, **env):
    """``cmd`` with this checkout off the path (no PYTHONPATH), from ``cwd``; the completed process."""
    environ = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env={**environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


def _source_copy(dest: Path) -> Path:
    """The files the build reads, copied out of the checkout so that building leaves nothing in it."""
    dest.mkdir()
    for name in BUILD_INPUTS:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        else:
            shutil.copy2(src, dest / name)
    return dest


def _venv(path: Path) -> Path:
    """A venv seeing this interpreter's packages; its python."""
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(path)], check=True, timeout=120)
    python = path / 'bin' / 'python'
    venv_site = _run([python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'], cwd=path)
    parents = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    Path(venv_site.stdout.strip(), '_parent_site_packages.pth').write_text('\n'.join(parents) + '\n')
    return python


@pytest.fixture(scope='module')
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp('wheel')
    src = _source_copy(tmp / 'src')
    res = _run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-q', '-w', tmp / 'dist',
                src], cwd=tmp)
    assert res.returncode == 0, res.stderr
    (path,) = (tmp / 'dist').glob('mlp_vision-*.whl')
    return path


@pytest.fixture(scope='module')
def installed(wheel, tmp_path_factory):
    """(bin folder of a venv with the wheel installed, a working folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp('installed')
    python = _venv(tmp / 'venv')
    res = _run([python, '-m', 'pip', 'install', '--no-deps', '-q', wheel], cwd=tmp)
    assert res.returncode == 0, res.stderr
    (tmp / 'work').mkdir()
    return python.parent, tmp / 'work'


def test_wheel_holds_every_module_recipe_and_command(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / 'mlp_vision').rglob('*.py')
               if '__pycache__' not in p.parts}
    assert modules - names == set()  # e.g. a new subpackage missing from pyproject.toml's packages list
    # the image recipes and the text trainer's (configs/text/, package mlp_vision.configs.text)
    recipes = {f'mlp_vision/configs/{p.relative_to(REPO / "configs").as_posix()}'
               for p in (REPO / 'configs').rglob('*.yaml')}
    assert any(r.startswith('mlp_vision/configs/text/') for r in recipes)
    assert recipes and recipes - names == set()
    (entry_points,) = [n for n in names if n.endswith('.dist-info/entry_points.txt')]
    lines = zipfile.ZipFile(wheel).read(entry_points).decode().splitlines()
    scripts = dict(line.split(' = ') for line in lines[lines.index('[console_scripts]') + 1:] if ' = ' in line)
    assert set(scripts) == set(COMMANDS)
    for script, target in scripts.items():
        module, function = target.split(':')
        assert module == 'mlp_vision.commands' and function == script[len('mlp-vision-'):].replace('-', '_')


# Runs ``python -m mlp_vision`` (``runpy.run_module``), then each installed console script file as its interpreter
# does (``runpy.run_path`` as ``__main__``, the script's path as argv[0]) with ``--help``, all in one Python of the
# venv: each in a process of its own is a start of Python and an import of torch more (``-m slow`` runs each
# ``python -m COMMAND --help`` alone). Prints {script or '-m mlp_vision': [exit code, stdout, stderr, shebang,
# executable?]}.
_RUN_SCRIPTS = """
import contextlib, io, json, os, runpy, sys
scripts = sys.argv[1:]


def run(argv, main):
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    sys.argv = argv
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main()
        except SystemExit as e:
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    return [code, stdout.getvalue(), stderr.getvalue()]


out = {'-m mlp_vision': run(['-m'], lambda: runpy.run_module('mlp_vision', run_name='__main__', alter_sys=True))
                        + [None, None]}
for path in scripts:
    with open(path) as f:
        shebang = f.readline().strip()
    out[os.path.basename(path)] = (run([path, '--help'], lambda: runpy.run_path(path, run_name='__main__'))
                                   + [shebang, os.access(path, os.X_OK)])
print(json.dumps(out))
"""


@pytest.fixture(scope='module')
def installed_help(installed):
    """{script: (exit code, stdout, stderr, shebang line, executable?)} of each installed command's ``--help``, and
    {'-m mlp_vision': (exit code, stdout, stderr, None, None)}."""
    bin_dir, work = installed
    res = _run([bin_dir / 'python', '-c', _RUN_SCRIPTS] + [bin_dir / script for script in COMMANDS], cwd=work)
    assert res.returncode == 0, res.stderr
    return {script: tuple(result) for script, result in json.loads(res.stdout.splitlines()[-1]).items()}


@pytest.mark.parametrize('script', list(COMMANDS))
def test_each_command_runs_installed(installed, installed_help, script):
    bin_dir, _ = installed
    returncode, stdout, stderr, shebang, executable = installed_help[script]
    assert shebang == f'#!{bin_dir / "python"}' and executable  # the venv's interpreter starts it
    assert returncode == 0, stderr
    assert stdout.startswith('usage:'), stdout[:300]


def test_the_installed_package_lists_its_commands_and_its_recipes(installed, installed_help):
    bin_dir, work = installed
    returncode, stdout, stderr, _, _ = installed_help['-m mlp_vision']
    assert returncode == 0, stderr
    for script, (module, _) in COMMANDS.items():
        assert script in stdout and f'python -m {module}' in stdout
    # the recipes are the wheel's (site-packages/mlp_vision/configs), not this checkout's
    folder, names = stdout.split('(mlp-vision-train -c smlpnet_t --data-dir DIR), in ')[1].split(':\n')
    folder = Path(folder)
    assert folder.parts[-2:] == ('mlp_vision', 'configs') and folder.resolve().is_relative_to(bin_dir.parent.resolve())
    assert names.replace(',', ' ').split() == sorted(p.stem for p in (REPO / 'configs').glob('*.yaml'))


@pytest.mark.slow  # the same line from a checkout: tests/test_train.py::test_recipes_are_found_by_name
def test_an_unknown_recipe_name_lists_the_shipped_ones(installed):
    bin_dir, work = installed
    res = _run([bin_dir / 'mlp-vision-train', '-c', 'smlpnet_x', '--data-dir', 'x'], cwd=work)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        'mlp-vision-train: error: -c smlpnet_x: no such file, and no recipe of that name (recipes: '
        + ', '.join(sorted(p.stem for p in (REPO / 'configs').glob('*.yaml'))) + '; or pass the path of a yaml file)']


@pytest.mark.slow
@pytest.mark.parametrize('module', [module for module, _ in COMMANDS.values()])
def test_each_python_m_form_runs_installed(installed, module):
    bin_dir, work = installed
    res = _run([bin_dir / 'python', '-m', module, '--help'], cwd=work)
    assert res.returncode == 0 and res.stdout.startswith('usage:'), res.stderr


@pytest.mark.slow
def test_installed_demo_first_epoch(installed, tmp_path):
    """``mlp-vision-train --epochs 1`` with no dataset: the demo (its recipe shipped in the package) trains an
    epoch, validates the best checkpoint and writes under ./output of the working folder."""
    pytest.importorskip('sklearn', reason='the demo images come from scikit-learn')
    bin_dir, work = installed
    res = _run([bin_dir / 'mlp-vision-train', '--epochs', '1'], cwd=work, timeout=600,
               MLP_VISION_CACHE=str(tmp_path / 'cache'))
    assert res.returncode == 0, res.stderr[-2000:]
    assert 'Demo result: validation accuracy' in res.stderr + res.stdout
    (results,) = (work / 'output' / 'train').glob('*-demo_digits-smlpnet_t-32/results.json')
    results = json.loads(results.read_text())
    assert results['command'] == 'mlp-vision-train --epochs 1' and results['final_epoch'] == 0
    assert results['demo_validation']['samples'] == 364


@pytest.mark.slow
def test_editable_install_finds_the_checkout_recipes(tmp_path):
    """``pip install -e`` (as CI installs): the package folder is the checkout's, which has no configs/; the
    recipes are the checkout's ``configs/`` beside it."""
    src = _source_copy(tmp_path / 'src')
    python = _venv(tmp_path / 'venv')
    res = _run([python, '-m', 'pip', 'install', '--no-deps', '--no-build-isolation', '-q', '-e', src], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    code = ('import mlp_vision; from mlp_vision.arguments import find_recipe; '
            'print(mlp_vision.__file__); print(find_recipe("demo_digits"))')
    res = _run([python, '-c', code], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    package, recipe = map(Path, res.stdout.split())
    assert package == src / 'mlp_vision' / '__init__.py' and recipe == src / 'configs' / 'demo_digits.yaml'
    res = _run([python.parent / 'mlp-vision-train', '-c', 'smlpnet_t', '--help'], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert re.search(r'--warmup-epochs N\s+epochs to warm up the LR\s+\(default: 20\)', res.stdout)  # recipe's, not 5
