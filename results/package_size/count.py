"""Issue 43's size measures for a checkout: package lines (``mlp_vision/**/*.py``, as ``wc -l``), training code
(``mlp_vision/train.py`` and its parts ``image_data``, ``image_model``, ``run_files``; ``mlp_vision/training/`` in
earlier commits), and the package's lines by kind (code, docstring, comment, blank; a line is code if it holds any
token other than a docstring or a comment).

    python results/package_size/count.py [CHECKOUT]      # default: this repository
"""
import io
import sys
import tokenize
from pathlib import Path


def kinds(text: str) -> dict:
    lines = text.splitlines()
    kind = ['blank' if not line.strip() else None for line in lines]
    doc, code, comment = set(), set(), set()
    prev = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        rows = range(tok.start[0], tok.end[0] + 1)
        if tok.type == tokenize.COMMENT:
            comment.update(rows)
        elif tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL):
            doc.update(rows)  # a string standing as a statement: a docstring
        elif tok.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code.update(rows)
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok.type
    for i in range(len(lines)):
        if kind[i] is None:
            n = i + 1
            kind[i] = 'code' if n in code else 'docstring' if n in doc else 'comment' if n in comment else 'code'
    return {k: kind.count(k) for k in ('code', 'docstring', 'comment', 'blank')}


# the image trainer's parts, in mlp_vision/training/ before it was flattened into mlp_vision/
TRAINING_FILES = {f'mlp_vision/{name}.py' for name in ('train', 'image_data', 'image_model', 'run_files')}


def main(root: Path) -> None:
    files = sorted((root / 'mlp_vision').rglob('*.py'))
    total = {'code': 0, 'docstring': 0, 'comment': 0, 'blank': 0}
    training = 0
    for f in files:
        text = f.read_text()
        for k, v in kinds(text).items():
            total[k] += v
        rel = f.relative_to(root).as_posix()
        if rel.startswith('mlp_vision/training/') or rel in TRAINING_FILES:
            training += len(text.splitlines())
    print(f'package lines {sum(total.values()):,} ({len(files)} files): ' +
          ', '.join(f'{k} {v:,}' for k, v in total.items()))
    print(f'training code lines {training:,}')


if __name__ == '__main__':
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]))
