"""The package's shape, read from its source: no import circles, models apart from trainers, no private names
borrowed across modules, functions a reader can hold. Every import counts, including ones inside functions
(a circle hidden in a function is still a circle)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'mlp_vision'
ENTRY_POINTS = [ROOT / name for name in ('train.py', 'validate.py', 'benchmark.py')]
MAX_FUNCTION_LINES = 120


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob('*.py'))}
IMAGE_TRAINER = ('mlp_vision.image_data', 'mlp_vision.image_model', 'mlp_vision.run_files')  # train.py's parts


def _imported(module: str, node) -> list:
    """(target module, imported name or None) of one import statement, for targets inside the package."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if a.name in MODULES]
    is_package = MODULES[module].name == '__init__.py'
    base = module.split('.')
    if node.level:
        base = base[:len(base) - node.level + (1 if is_package else 0)]
        target = '.'.join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ''
    out = []
    for alias in node.names:
        if f'{target}.{alias.name}' in MODULES:  # `from package import module`
            out.append((f'{target}.{alias.name}', None))
        elif target in MODULES:
            out.append((target, alias.name))
    return out


def _imports(module: str) -> list:
    tree = ast.parse(MODULES[module].read_text())
    return [edge for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for edge in _imported(module, node)]


def _graph() -> dict:
    return {m: {t for t, _ in _imports(m) if t != m} for m in MODULES}


def _cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _is_parent_package(target: str, module: str) -> bool:
    # a package importing its own submodules (``__init__`` re-exports) is not a circle with them
    return module.startswith(target + '.')


def test_cycle_finder_finds_a_planted_circle():
    graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}
    assert _cycles(graph) == [['a', 'b', 'c']]
    assert _cycles({'a': {'b'}, 'b': set()}) == []


def test_no_import_circles():
    graph = {m: {t for t in deps if not _is_parent_package(t, m)} for m, deps in _graph().items()}
    assert _cycles(graph) == []


def test_text_models_import_nothing_from_the_trainers():
    text = [m for m in MODULES if m.startswith('mlp_vision.text')]
    assert text, 'mlp_vision/text has no modules'
    bad = {m: sorted(t for t in _graph()[m] if t in IMAGE_TRAINER + ('mlp_vision.train_text',)) for m in text}
    assert {m: t for m, t in bad.items() if t} == {}


def test_training_is_layered_by_job():
    """outputs and run_files (a run's own files) import no image data and no text model; the image data and loaders
    import no text model; the image model imports no command."""
    commands = ('mlp_vision.text', 'mlp_vision.train', 'mlp_vision.validate')
    rules = {
        'mlp_vision.outputs': IMAGE_TRAINER + commands,
        'mlp_vision.run_files': ('mlp_vision.image_model', 'mlp_vision.image_data') + commands,
        'mlp_vision.image_data': ('mlp_vision.image_model',) + commands,
        'mlp_vision.image_model': commands + ('mlp_vision.train_text', 'mlp_vision.benchmark', 'mlp_vision.visualize'),
    }
    graph = _graph()
    for layer, forbidden in rules.items():
        modules = [m for m in MODULES if m == layer or m.startswith(layer + '.')]
        assert modules, f'{layer} has no modules'
        bad = {m: sorted(t for t in graph[m] if any(t == f or t.startswith(f + '.') for f in forbidden))
               for m in modules}
        assert {m: t for m, t in bad.items() if t} == {}, layer


def test_the_image_trainer_runs_its_own_epochs():
    """train.py reads as timm's: ``main``, ``train_one_epoch`` and ``validate`` (the evaluation loop of
    image_model, which validate.py shares), no class, and the run's files are the functions
    of run_files, called from train.py itself (no run object between them)."""
    tree = ast.parse(MODULES['mlp_vision.train'].read_text())
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {'main', 'train', 'train_one_epoch'} <= functions
    assert not [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    assert ('mlp_vision.image_model', 'validate') in _imports('mlp_vision.train')
    run_files = {name for module, name in _imports('mlp_vision.train') if module == 'mlp_vision.run_files'}
    assert {'open_run_folder', 'save_checkpoint', 'restore_training_state', 'restore_rng', 'stop_error',
            'write_results', 'close_run_folder'} <= run_files


def test_no_private_names_imported_from_another_module():
    borrowed = [f'{m} imports {name} from {t}' for m in MODULES for t, name in _imports(m)
                if name and name.startswith('_') and not name.startswith('__') and t != m]
    assert borrowed == []


@pytest.mark.parametrize('path', sorted(MODULES.values()) + ENTRY_POINTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_functions_fit_on_a_screen(path):
    tree = ast.parse(path.read_text())
    long = [f'{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})'
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []
