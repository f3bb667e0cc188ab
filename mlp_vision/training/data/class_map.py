""" Class maps (``--class-map``) read as text, never unpickled.

timm's ``load_class_map`` reads ``.pkl`` maps by unpickling them (with a restricted unpickler, still running the
pickle machinery on a file from anywhere), and a ``.txt`` map with a blank line or a name twice silently labels
wrongly. :func:`read_class_map` reads timm's ``.txt`` format only, refuses a pickle before opening it, and says in
one line what is wrong with a map that cannot label uniquely.
"""
import os
from typing import Dict, Union

from mlp_vision.errors import UsageError

__all__ = ['read_class_map']


def read_class_map(class_map: Union[str, Dict[str, int]], root: str = '') -> Dict[str, int]:
    """``--class-map``: ``{class folder name: label}`` from a dict, or from a text file of one class name per line
    in label order (timm's ``.txt`` format), found as given or under ``root``; a :class:`UsageError` says what is
    wrong (a pickle is refused unopened)."""
    if isinstance(class_map, dict):
        return dict(class_map)
    path = class_map if os.path.isfile(class_map) or not root else os.path.join(root, class_map)
    if not os.path.isfile(path):
        raise UsageError(f'--class-map {class_map!r} is not a file; expected a text file with one class folder name '
                         f'per line')
    if os.path.splitext(path)[1].lower() in ('.pkl', '.pickle'):
        raise UsageError(f'--class-map {class_map!r} is a pickle: loading one can run code from the file, so it is '
                         f'never loaded here; write one class folder name per line in a .txt file')
    try:
        with open(path, encoding='utf-8') as f:
            names = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f'cannot read the class map {path}: {e} (expected a UTF-8 text file, one class name a '
                         f'line, in label order)') from e
    while names and not names[-1]:  # a final newline or blank lines at the end name no class
        names.pop()
    if not names or '' in names or len(set(names)) != len(names):
        problem = 'names no class' if not names else 'has a blank line' if '' in names else 'names a class twice'
        raise UsageError(f'the class map {path} {problem}; expected one distinct class folder name per line')
    return {name: i for i, name in enumerate(names)}

