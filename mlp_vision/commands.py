""" The package's commands: the console scripts pip installs (``[project.scripts]`` in pyproject.toml) and their
``python -m`` forms, listed by ``python -m mlp_vision``. Each returns an exit status, not ``main``'s result (a
trainer's results dict, which ``sys.exit`` would print and turn into status 1); a module is imported when run.
"""
import importlib
import textwrap
from typing import Callable

__all__ = ['COMMANDS', 'train', 'validate', 'benchmark', 'complexity', 'text_train', 'visualize']

# console script -> (its python -m module, what it does)
COMMANDS = {
    'mlp-vision-train': ('mlp_vision.train', 'train an image model; with no dataset: the handwritten-digits demo'),
    'mlp-vision-validate': ('mlp_vision.validate', 'top-1 / top-5 accuracy of a checkpoint or pretrained model'),
    'mlp-vision-benchmark': ('mlp_vision.benchmark', 'throughput of models and layers, alone or in pairs'),
    'mlp-vision-complexity': ('mlp_vision.complexity', 'parameters and MACs beside the papers\' tables'),
    'mlp-vision-text-train': ('mlp_vision.train_text', 'train a text model (causal LM, masked LM, classifier)'),
    'mlp-vision-visualize': ('mlp_vision.visualize', 'PNGs of the learned gMLP filters, sMLP weights, BiGS kernels'),
}


def _command(script: str) -> Callable[[], int]:
    """The console script ``script``: ``main(prog=script)`` of its ``python -m`` module."""
    def run() -> int:
        result = importlib.import_module(COMMANDS[script][0]).main(prog=script)
        return result if isinstance(result, int) else 0
    return run


train = _command('mlp-vision-train')
validate = _command('mlp-vision-validate')
benchmark = _command('mlp-vision-benchmark')
complexity = _command('mlp-vision-complexity')
text_train = _command('mlp-vision-text-train')
visualize = _command('mlp-vision-visualize')


def describe() -> str:
    """The list ``python -m mlp_vision`` prints: each command's two forms and what it does."""
    width = max(map(len, COMMANDS))
    lines = ['mlp_vision commands (console script, or python -m MODULE; --help for the flags of each):', '']
    for script, (module, what) in COMMANDS.items():
        lines.append(f'  {script:{width}}  python -m {module}')
        lines.append(f'  {"":{width}}  {what}')
    from mlp_vision.arguments import recipe_folder, recipe_names
    lines += ['', f'Training recipes, found by name (mlp-vision-train -c smlpnet_t --data-dir DIR), in '
                  f'{recipe_folder()}:',
              textwrap.fill(', '.join(recipe_names()), width=100, initial_indent='  ', subsequent_indent='  ')]
    return '\n'.join(lines)
