""" What a user gives a command, parsed and checked where it enters: the commands' parser (:class:`ArgumentParser`,
whose errors are one line through :func:`~mlp_vision.errors.run_cli`), range checks of flag values
(:func:`check_range`), devices (:func:`parse_device`), JSON config files (:func:`read_json_file`), the flags several
commands share (``--allow-regex``, ``--threads``; the size bounds' are :func:`mlp_vision.bounds.add_bound_arguments`),
and ``-c`` yaml recipes merged with the command line (:func:`merge_settings`, the last part of this file).
"""
import argparse
import collections.abc
import importlib.resources
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import yaml
from timm.utils import ParseKwargs as TimmParseKwargs

from mlp_vision.errors import UsageError, short_repr

__all__ = ['ArgumentParser', 'ParseKwargs', 'check_kwargs_flags', 'DefaultsHelpFormatter', 'check_range',
           'parse_device', 'read_json_file', 'CONFIG_MAX_BYTES', 'add_allow_regex_argument', 'RunArgs', 'parse_given',
           'merge_settings', 'load_yaml_config', 'parse_args_with_config', 'args_to_yaml', 'plain_value',
           'check_flag_ranges', 'SEED_MAX', 'find_recipe', 'recipe_names', 'recipe_folder', 'read_yaml_file',
           'MAX_YAML_BYTES', 'usable_cpus', 'THREADS_RANGE', 'add_threads_argument', 'default_threads', 'set_threads',
           'set_run_threads']


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (also a word that is not UTF-8) raise :class:`UsageError`."""

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        for i, word in enumerate(args):  # Python holds the bytes of a word that is not UTF-8 as lone surrogates
            try:
                word.encode('utf-8')
            except UnicodeEncodeError as e:
                shown = re.sub('[\udc80-\udcff]', lambda m: f'\\x{ord(m[0]) - 0xdc00:02x}', word)  # the bytes given
                shown = shown.encode('utf-8', 'backslashreplace').decode()
                before = args[i - 1] if i and not word.startswith('-') else ''
                flag = before.split('=', 1)[0] + ' ' if before.startswith('-') and len(before) > 1 else ''
                raise UsageError(f'{flag}\'{shown}\' is not UTF-8 text (character {e.start}); names and paths given '
                                 f'to a command must be UTF-8: a run writes them into its logs and records') from None
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        raise UsageError(message)


class ParseKwargs(TimmParseKwargs):
    """timm's ``NAME=VALUE`` action, where a word that is not ``NAME=VALUE`` (or an empty or non-identifier name,
    which no model or optimizer takes) is argparse's one-line error, not a ``ValueError`` traceback."""

    def __call__(self, parser, namespace, values, option_string=None):
        for value in values:
            name, equals, _ = value.partition('=')
            if value and not (equals and name.isidentifier()):
                raise argparse.ArgumentError(self, f'{value!r} is not NAME=VALUE; expected e.g. embed_dim=32 '
                                                   f'depths="(1,1,2,1)"')
        super().__call__(parser, namespace, values, option_string)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ``(default: X)`` after each flag's help, unless the help already says its default."""

    def _get_help_string(self, action):
        if 'default' in (action.help or '').lower():
            return action.help
        return super()._get_help_string(action)

def check_range(name: str, value, low=None, high=None, *, low_open: bool = False, high_open: bool = False,
                why: str = '') -> None:
    """A :class:`UsageError` ``<name> must be <range>[ (why)], got <value>`` unless ``value`` is a finite number in
    the range (``low`` / ``high`` None: open-ended; ``low_open`` / ``high_open``: the bound excluded). NaN passes
    every ``<`` test, so it is refused explicitly."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = number and (isinstance(value, int) or math.isfinite(value))  # an int may be too large for a float
    ok = ok and (low is None or (value > low if low_open else value >= low))
    ok = ok and (high is None or (value < high if high_open else value <= high))
    if ok:
        return
    if low is not None and high is not None:
        expected = f'in {"(" if low_open else "["}{low}, {high}{")" if high_open else "]"}'
    elif low == 0 and low_open:
        expected = 'a positive number'
    elif low is not None:
        expected = f'{">" if low_open else ">="} {low}'
    elif high is not None:
        expected = f'{"<" if high_open else "<="} {high}'
    else:
        expected = 'a finite number'
    raise UsageError(f'{name} must be {expected}{f" ({why})" if why else ""}, got {short_repr(value)}')


def check_kwargs_flags(args: argparse.Namespace, *dests: str) -> None:
    """A :class:`UsageError` unless each ``NAME=VALUE`` flag of ``dests`` holds a mapping of Python names to values:
    a ``-c`` yaml file or a resumed run's settings give them without :class:`ParseKwargs`."""
    for dest in dests:
        value = getattr(args, dest, None)
        if value is not None and not (isinstance(value, dict) and all(
                isinstance(name, str) and name.isidentifier() for name in value)):
            raise UsageError(f'--{dest.replace("_", "-")} is {short_repr(value)}; expected a mapping of names to '
                             f'values (in yaml: {dest}: {{embed_dim: 32}}; on the command line NAME=VALUE words)')


def parse_device(device: str, flag: str = '--device') -> torch.device:
    """``device`` as a ``torch.device`` this machine has, else a :class:`UsageError` (not a later traceback)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f'{flag} {device!r} is not a device; expected cpu, cuda or cuda:N') from None
    if parsed.type == 'cuda':
        if not torch.cuda.is_available():
            raise UsageError(f'{flag} {device} asked for CUDA, but no CUDA device is available (use {flag} cpu)')
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise UsageError(f'{flag} {device}: this machine has {torch.cuda.device_count()} CUDA device(s), '
                             f'cuda:0 to cuda:{torch.cuda.device_count() - 1}')
    elif not getattr(getattr(torch, parsed.type, None), 'is_available', lambda: True)():  # torch.mps, torch.xpu
        raise UsageError(f'{flag} {device}: no {parsed.type} device is available here (use {flag} cpu)')
    return parsed


CONFIG_MAX_BYTES = 16 * 2 ** 20  # a config.json is kilobytes (a 21k-class label map is ~1 MB); beyond, it is not one


def read_json_file(path: str):
    """The JSON of the file ``path``; a :class:`UsageError` naming it when it is over :data:`CONFIG_MAX_BYTES`
    (checked before it is read), not UTF-8, not JSON, or nested too deeply."""
    size = os.path.getsize(path)
    if size > CONFIG_MAX_BYTES:
        raise UsageError(f'{path} is {size:,} bytes, more than the {CONFIG_MAX_BYTES:,} a JSON config can need; it is '
                         f'not one, and is not read')
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except UnicodeDecodeError as e:
        raise UsageError(f'{path} is not UTF-8 text (byte {e.object[e.start]:#04x} at {e.start}); expected JSON') \
            from None
    except RecursionError:
        raise UsageError(f'{path} is nested too deeply to be a config (JSON arrays / objects inside each other '
                         f'beyond Python\'s recursion limit)') from None
    except ValueError as e:  # JSONDecodeError
        raise UsageError(f'{path} is not valid JSON ({e}); the file is damaged or truncated') from None


def add_allow_regex_argument(group: argparse._ActionsContainer) -> None:
    """``--allow-regex`` (``args.allow_regex``): the command-line opt-in of the tokenizer readers' ``allow_regex``."""
    group.add_argument('--allow-regex', action='store_true', default=False,
                       help='UNSAFE: read a tokenizer.json whose pre-tokenizer or normalizer has a regular '
                            'expression; a crafted pattern can take minutes per text (backtracking). Only for '
                            'tokenizer files you made or whose maker you trust')


# ------------------------------------------------------------------------------------------------ --threads
# The intra-op threads of every command that computes. Without --threads: one thread, or the count PyTorch took from
# OMP_NUM_THREADS when that is set (torchrun sets 1 per process). The rule is fixed, never the machine's load, so a
# command rounds the same way whenever it runs. Why one: PyTorch's default (a spin-waiting OpenMP thread per CPU)
# stalls whenever another process holds a core (results/threads/README.md); a larger, quiet machine gives a larger
# model more with --threads N. run_cli restores the caller's count.
def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask on Linux, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


THREADS_RANGE = dict(low=1, high=usable_cpus(), why='the CPUs this process may use')


def add_threads_argument(container: argparse._ActionsContainer) -> None:
    container.add_argument(
        '--threads', type=int, default=None, metavar='N',
        help=f'PyTorch intra-op threads for this run, 1 to {THREADS_RANGE["high"]} (default: 1, or OMP_NUM_THREADS '
             f'when set: on a shared CPU more threads spin-wait and slow every step several-fold)')


def default_threads() -> int:
    """The count without ``--threads``: torch's when ``OMP_NUM_THREADS`` is set (it chose that count), else 1."""
    return torch.get_num_threads() if os.environ.get('OMP_NUM_THREADS') else 1


def _set_threads(threads: int, why: str) -> str:
    torch.set_num_threads(threads)
    return f'{threads} compute thread{"s" if threads > 1 else ""} ({why})'


def set_threads(requested: Optional[int]) -> str:
    """Set torch's intra-op threads to ``requested`` (or :func:`default_threads`); returns the line to log."""
    if requested is not None:
        check_range('--threads', requested, **THREADS_RANGE)
        return _set_threads(requested, '--threads')
    return _set_threads(default_threads(), 'OMP_NUM_THREADS; --threads N to choose' if os.environ.get(
        'OMP_NUM_THREADS') else 'the default; --threads N or OMP_NUM_THREADS to choose')


def set_run_threads(requested: Optional[int], resume_ckpt: Optional[dict]) -> str:
    """:func:`set_threads`, except that a resume without ``--threads`` takes its checkpoint's count (capped at the
    CPUs here): the count changes float rounding, so only the same count resumes bit-identically."""
    saved = (resume_ckpt or {}).get('threads')
    if requested is not None or isinstance(saved, bool) or not isinstance(saved, int) or saved < 1:
        return set_threads(requested)
    capped = f', capped from its {saved} at the CPUs here' if saved > usable_cpus() else ''
    return _set_threads(min(saved, usable_cpus()), f'the count of the run it continues{capped}: results are '
                        f'bit-identical to an uninterrupted run only with the same count; --threads N to choose')


# ------------------------------------------------------------------------------------------------ -c yaml settings
# ``-c`` yaml files: keys are a flag's name (``weight-decay``) or destination; an unknown key or a value not of the
# flag's type is an error, as on the command line. Precedence, lowest first: the parser's defaults, base configs
# (train.py's demo recipe), a resumed run's settings, the ``-c`` file, the command line (:func:`merge_settings`).
# Image recipes (``configs/``, shipped as ``mlp_vision/configs``) are found by name: ``-c smlpnet_t``.

# --seed's largest value in both trainers: the seed feeds numpy's generator (seeds < 2**32) after the rank is added
SEED_MAX = 2 ** 31 - 1
MAX_YAML_BYTES = 1 << 20  # a settings file is a few KB (a run's args.yaml about 4 KB); far beyond is no recipe


class _StrictYamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (a 1 KB file of nested ones expands to gigabytes once walked) and
    duplicate mapping keys (yaml lets the last one win silently), each at the node's line."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, 'an alias (*name) is not accepted: write the value out',
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        first = {}
        for key_node, _ in node.value:
            if key_node.tag == 'tag:yaml.org,2002:merge':  # keys a '<<' merge brings may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, collections.abc.Hashable):  # SafeLoader's own error names it
                continue
            if key in first:
                raise yaml.constructor.ConstructorError(None, None, f'duplicate key {short_repr(key)} (first at line '
                                                        f'{first[key]}); expected each key once', key_node.start_mark)
            first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_yaml_file(path: str, what: str = 'config file') -> Any:
    """The yaml of the file ``path`` (:class:`_StrictYamlLoader`), else one :class:`UsageError` line naming ``what``,
    ``path`` and the line (also for a file over :data:`MAX_YAML_BYTES` or not a regular file)."""
    where = f'{what} {path!r}'
    if not os.path.isfile(path):
        raise UsageError(f'{where} ' + ('is not a regular file' if os.path.exists(path) else 'does not exist'))
    if (size := os.path.getsize(path)) > MAX_YAML_BYTES:
        raise UsageError(f'{where} is {size} bytes; expected a yaml file of settings (at most {MAX_YAML_BYTES} bytes)')
    with open(path, 'rb') as f:
        data = f.read(MAX_YAML_BYTES + 1)
    try:
        return yaml.load(data, Loader=_StrictYamlLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise UsageError(f'{where}{f" line {mark.line + 1}" if mark else ""}: '
                         f'{" ".join(str(e.problem or e.context).split())}') from None
    except yaml.YAMLError as e:  # the reader's: bytes that are no text (a binary file, not UTF-8)
        raise UsageError(f'{where} is not yaml text ({" ".join(str(e).split())[:200]}); expected a UTF-8 yaml '
                         f'file') from None
    except RecursionError:
        raise UsageError(f'{where} is nested too deeply to be a settings file') from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise UsageError(f'{where} is not valid yaml: {" ".join(str(e).split())[:200]}') from None


def _actions(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest not in (argparse.SUPPRESS, 'help')}


def _typed(value: Any, action: argparse.Action, where: str) -> Any:
    """``value`` converted as the command line converts it (``action.type``, ``nargs``, ``choices``)."""
    flag = action.option_strings[-1] if action.option_strings else action.dest
    if action.nargs == 0 and isinstance(action.const, bool) and not isinstance(value, bool):  # store_true / false
        raise UsageError(f'{where}: {action.dest} must be true or false (as {flag}), got {short_repr(value)}')
    if value is None or action.type is None and not action.choices:
        return value
    many = action.nargs in ('+', '*') or isinstance(action.nargs, int)
    kind, typed = action.type, []
    expected = {int: 'an integer', float: 'a number', str: 'a string'}.get(kind)
    for v in (value if isinstance(value, (list, tuple)) else [value]) if many else [value]:
        digits = isinstance(v, str) and v.strip().lstrip('+-').isdigit()
        if (kind is int and digits) or (kind is float and isinstance(v, (int, str)) and not isinstance(v, bool)):
            try:
                v = kind(v)
            except (ValueError, OverflowError):  # not a number, or an integer too large for a float
                pass
        if expected and (isinstance(v, bool) or not isinstance(v, kind)):
            raise UsageError(f'{where}: {action.dest} must be {expected} (as {flag}), got {short_repr(v)}')
        if action.choices and v not in action.choices:
            raise UsageError(f'{where}: {action.dest} must be one of {", ".join(map(str, action.choices))}, got '
                             f'{short_repr(v)}')
        typed.append(v)
    return typed if many else typed[0]


def recipe_folder(kind: str = '') -> Optional[Path]:
    """``mlp_vision/configs`` in a built package, else ``configs/`` beside the package folder (a checkout); None
    when neither exists (never both: beside an installed package is site-packages). ``kind='text'``: its ``text/``."""
    package = Path(str(importlib.resources.files('mlp_vision')))
    shipped, checkout = package / 'configs', package.resolve().parent / 'configs'
    folder = next((folder for folder in (shipped, checkout) if folder.is_dir()), None)
    return folder / kind if folder is not None and kind else folder


def recipe_names(kind: str = '') -> List[str]:
    """The names ``-c`` accepts for the recipes of :func:`recipe_folder` ``(kind)`` (sorted, without ``.yaml``)."""
    folder = recipe_folder(kind)
    return sorted(p.stem for p in folder.glob('*.yaml')) if folder else []


def find_recipe(name: str, kind: str = '') -> Path:
    """The file of the recipe ``name`` in :func:`recipe_folder` ``(kind)``; else a :class:`UsageError` listing them."""
    folder = recipe_folder(kind)
    if folder is not None and (folder / f'{name}.yaml').is_file():
        return folder / f'{name}.yaml'
    raise UsageError(f'-c {name}: no such file, and no recipe of that name (recipes: '
                     f'{", ".join(recipe_names(kind)) or "none found"}; or pass the path of a yaml file)')


def load_yaml_config(path: str, parser: argparse.ArgumentParser, notes: Sequence[str] = ()) -> Dict[str, Any]:
    """Read a yaml mapping of flag names to values; return it keyed by argparse destinations. ``notes``: keys that
    are data about the file (a text recipe's ``source``), returned under their own name."""
    cfg = read_yaml_file(path) or {}
    if not isinstance(cfg, dict):
        raise UsageError(f'config file {path!r} must be a mapping of flag names to values, got {type(cfg).__name__}')
    actions, out = _actions(parser), {}
    names = {key: dest for dest, action in actions.items()  # a yaml key is a destination or a flag's name
             for key in [dest] + [opt.lstrip('-').replace('-', '_') for opt in action.option_strings]}
    for key, value in cfg.items():
        if key in notes:
            out[key] = value
            continue
        dest = names.get(str(key).replace('-', '_'))
        if dest is None:
            raise UsageError(f'config file {path!r}: unknown key {short_repr(key)} (keys are the script\'s flag names, '
                             f'e.g. weight_decay for --weight-decay)')
        out[dest] = _typed(value, actions[dest], f'config file {path!r}')
    return out


class RunArgs(argparse.Namespace):
    """The arguments of a run and, kept apart, the values derived from them (:meth:`derive`: a scaled LR, the data's
    class count): a resume takes over :meth:`given` and derives the rest again. ``resumed_settings`` /
    ``resumed_derived``: those of the run being resumed ({} if none)."""
    __slots__ = ('_given', '_derived', 'resumed_settings', 'resumed_derived')  # slots: not in vars(), not settings

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._given, self._derived = {}, {}
        self.resumed_settings, self.resumed_derived = {}, {}

    def derive(self, **values: Any) -> None:
        """Use these values from now on (``args.NAME`` reads them); the given ones stay in :meth:`given`."""
        for name, value in values.items():
            if name not in self._derived:
                self._given[name] = getattr(self, name)  # a name that is no argument is a bug: AttributeError
            self._derived[name] = value
            setattr(self, name, value)

    def given(self) -> Dict[str, Any]:
        """The arguments as given, by destination (the values before any :meth:`derive`)."""
        return {**vars(self), **self._given}

    @property
    def derived(self) -> Dict[str, Any]:
        """The values derived so far, by the name of the argument they stand in for."""
        return dict(self._derived)


_UNSET = object()  # marks a destination the command line did not set


def parse_given(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The values the command line ``argv`` sets, by destination (an optional positional left out is not set).
    ``-h`` / ``--help`` (or an abbreviation, before ``--``) is reported (key ``'help'``): :func:`merge_settings`
    prints the help with the defaults that ``-c`` and ``--resume`` set."""
    argv = list(sys.argv[1:] if argv is None else argv)
    longs = [s for a in parser._actions for s in a.option_strings if s.startswith('--') and s != '--help']
    helps = [t for t in (argv[:argv.index('--')] if '--' in argv else argv) if t == '-h' or (
        len(t) > 2 and '--help'.startswith(t) and not any(s.startswith(t) for s in longs))]
    actions = _actions(parser)
    namespace = argparse.Namespace(**{dest: _UNSET for dest in actions})
    parser.parse_args([a for a in argv if a not in helps], namespace)
    given = {dest: value for dest, value in vars(namespace).items()
             if value is not _UNSET and not (dest in actions and not actions[dest].option_strings
                                             and actions[dest].nargs == '?' and value is actions[dest].default)}
    return {**given, 'help': True} if helps else given


BaseConfigs = Union[Sequence[str], Callable[[Mapping[str, Any]], Sequence[str]]]  # files, or a function giving them


def merge_settings(parser: argparse.ArgumentParser, given: Mapping[str, Any], base_configs: BaseConfigs = (),
                   run_settings: Optional[Mapping[str, Any]] = None, recipes: bool = False) -> Tuple[RunArgs, List[str]]:
    """(the :class:`RunArgs`, the config files used) from the layers, lowest first: the parser's defaults,
    ``base_configs`` (or a function of the layers above giving them), a resumed run's ``run_settings``, the ``-c``
    file (with ``recipes``, it may name an image recipe), ``given``."""
    given = dict(given)
    wants_help = given.pop('help', False)
    known = _actions(parser)
    config = given.get('config') or ''
    # -c: an existing path, or anything that looks like one, is a file; a bare name is a recipe's when `recipes`
    if recipes and config and not os.path.exists(config) and not any(c in config for c in (os.sep, '/', '.')):
        config = str(find_recipe(config))
    # a resumed run's settings come from a file: checked as the command line checks its values
    above = {k: _typed(v, known[k], 'the resumed checkpoint\'s saved settings')
             for k, v in (run_settings or {}).items() if k in known}
    if config:
        above.update(load_yaml_config(config, parser))
    above.update(given)
    bases = list(base_configs(above) if callable(base_configs) else base_configs)
    # every default, a string one converted by the flag's type as argparse converts it
    values = {dest: action.type(v) if isinstance(v := parser.get_default(dest), str) and callable(action.type) else v
              for dest, action in known.items()}
    for path in bases:
        values.update(load_yaml_config(path, parser))
    if wants_help:  # the defaults a run with these -c / --resume has; base configs (the demo's) are not shown
        parser.set_defaults(**above)
        parser.print_help()
        parser.exit()
    values.update(above)
    return RunArgs(**values), bases + ([config] if config else [])


def parse_args_with_config(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None,
                           base_configs: BaseConfigs = (), run_settings: Optional[Mapping[str, Any]] = None,
                           recipes: bool = False) -> Tuple[RunArgs, List[str]]:
    """:func:`merge_settings` of :func:`parse_given` ``(argv)``: (the arguments, the config files used)."""
    return merge_settings(parser, parse_given(parser, argv), base_configs, run_settings, recipes)


def plain_value(v: Any) -> Any:
    """``v`` with every tuple a list, also nested: yaml and ``torch.load`` give lists back."""
    if isinstance(v, (tuple, list)):
        return [plain_value(x) for x in v]
    if isinstance(v, dict):
        return {k: plain_value(x) for k, x in v.items()}
    return v


def args_to_yaml(settings: Mapping[str, Any]) -> str:
    """``settings`` (by destination) as yaml, loadable again with ``-c``."""
    return yaml.safe_dump(plain_value(dict(settings)), default_flow_style=False, sort_keys=False)


def check_flag_ranges(args: argparse.Namespace, ranges: Mapping[str, Dict[str, Any]]) -> None:
    """:func:`check_range` of each flag (by destination) in ``ranges`` with its bounds (``dict(low=0, high=1)``);
    unset (None) flags are not checked, each of several values (``nargs``) is."""
    for dest, bounds in ranges.items():
        value = getattr(args, dest, None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None:
                check_range(f'--{dest.replace("_", "-")}', v, **bounds)
