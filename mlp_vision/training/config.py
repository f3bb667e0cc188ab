""" ``-c/--config`` yaml files for argparse scripts: yaml keys are the flag names; explicit flags win.

Precedence, lowest first: the parser's defaults, then each yaml file in order, then the command line.
Keys may be written as the flag (``weight-decay``) or its destination (``weight_decay``); an unknown key is
an error, so a typo in a recipe cannot be silently ignored.
"""
import argparse
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from .errors import UsageError

__all__ = ['load_yaml_config', 'parse_args_with_config', 'args_to_yaml']


def _dest_names(parser: argparse.ArgumentParser) -> Dict[str, str]:
    names = {}
    for action in parser._actions:
        if action.dest in (argparse.SUPPRESS, 'help'):
            continue
        names[action.dest] = action.dest
        for opt in action.option_strings:
            names[opt.lstrip('-').replace('-', '_')] = action.dest
    return names


def load_yaml_config(path: str, parser: argparse.ArgumentParser) -> Dict[str, Any]:
    """Read a yaml mapping of flag names to values; return it keyed by argparse destinations."""
    if not os.path.isfile(path):
        raise UsageError(f'config file {path!r} does not exist')
    with open(path) as f:
        try:
            cfg = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise UsageError(f'config file {path!r} is not valid yaml: {e}') from e
    if not isinstance(cfg, dict):
        raise UsageError(f'config file {path!r} must be a mapping of flag names to values, got {type(cfg).__name__}')
    names = _dest_names(parser)
    out = {}
    for key, value in cfg.items():
        dest = names.get(str(key).replace('-', '_'))
        if dest is None:
            raise UsageError(f'config file {path!r}: unknown key {key!r} (keys are the script\'s flag names, '
                             f'e.g. weight_decay for --weight-decay)')
        out[dest] = value
    return out


def parse_args_with_config(
        parser: argparse.ArgumentParser,
        argv: Optional[Sequence[str]] = None,
        base_configs: Sequence[str] = (),
) -> Tuple[argparse.Namespace, List[str]]:
    """Parse ``argv`` with ``-c/--config`` support. ``base_configs`` are applied below the user's config.

    Returns the namespace and the list of config files used (base ones first).
    """
    config_parser = argparse.ArgumentParser(add_help=False)
    config_parser.add_argument('-c', '--config', default='', type=str)
    config_args, _ = config_parser.parse_known_args(argv)
    files = list(base_configs) + ([config_args.config] if config_args.config else [])
    defaults = {}
    for path in files:
        defaults.update(load_yaml_config(path, parser))
    if defaults:
        parser.set_defaults(**defaults)
    args = parser.parse_args(argv)
    return args, files


def args_to_yaml(args: argparse.Namespace) -> str:
    """The resolved arguments as yaml, loadable again with ``-c``."""
    def plain(v):
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return yaml.safe_dump({k: plain(v) for k, v in vars(args).items()}, default_flow_style=False, sort_keys=False)
