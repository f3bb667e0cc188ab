""" The complexity report: counts beside the paper rows, rendered as markdown / CSV / JSON, and its CLI. """
import argparse
import csv
import functools
import io
import json
import os
import shlex
import sys
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..arguments import ArgumentParser, DefaultsHelpFormatter, add_threads_argument, set_threads
from ..errors import UsageError, run_cli
from ..outputs import write_output_file
from .counts import DEFAULT_IMG_SIZE, Count, CountCache, family, resolve_models, text_seq_len
from .paper import PAPER_ROWS, QUANTITIES, STATUSES, Comparison, compare, format_like


PROG = 'python -m mlp_vision.complexity'  # the command's name in messages; the console script passes its own
COMMAND = 'python -m mlp_vision.complexity --output results/complexity.md results/complexity.csv'
FORMATS = ('md', 'csv', 'json')
CSV_FIELDS = ('section', 'source', 'model', 'input', 'quantity', 'unit', 'paper', 'ours', 'rel_diff_pct',
              'tolerance_pct', 'by', 'status', 'note')
CONVENTIONS = [  # the report's opening list: what counts as a MAC, the handles added to fvcore, the PASS rule
    'MACs: fvcore `FlopCountAnalysis` totals (fvcore counts one multiply-accumulate as one flop). sMLPNet '
    'Table 6 "FLOPs" and gMLP Table 2 "MAdds" are MACs; gMLP Table 1 "FLOPs" are 2 × MACs (2.7 / 8.9 / 31.6 B '
    'for the models Table 2 lists at 1.4 / 4.5 / 15.8 MAdds), as are gMLP Table 5 and BiGS Table 6 FLOPs '
    '(`docs/complexity.md`).',
    'Handles added to fvcore\'s: broadcast-aware `aten::matmul`/`aten::mm` (prod(output) × K; the stock one '
    'drops broadcast batch dims), `baddbmm`/`addbmm`/`addmv` (their product), `mv`/`dot`; '
    '`aten::scaled_dot_product_attention` = QKᵀ + AV = batch·heads·L·S·(E + E_v); FFTs (`fft_rfft`, '
    '`fft_irfft`, `fft_fft`, `fft_ifft`) = **2.5·N·log₂N FLOPs per real transform of length N** (5·N·log₂N '
    'complex), i.e. 1.25·N·log₂N MACs, so the FLOPs columns carry 2.5·N·log₂N.',
    'fvcore\'s stock LayerNorm (5 per element) and eval BatchNorm (2 per element) counts are kept. '
    'Element-wise ops and embedding lookups are not MACs and stay uncounted (listed per model).',
    'Vision models: traced on CPU with zero weights and a zero image (the meta-device convolution kernel '
    'cannot run under the JIT tracer); text, BiGS and BERT models: built and traced on `device="meta"`.',
    'Encoder MACs/FLOPs: the backbone only (`.gmlp` / `.bigs` / `.bert`), without the MLM head; the BiGS '
    'and gMLP Table 5 FLOPs are per sequence (batch 1), forward only, inputs padded to full length.',
    'Paper comparison: PASS when within tolerance (params 0.5 %, MACs/FLOPs 3 %) or when ours equals the '
    'paper\'s number at the paper\'s printed precision ("59" M: ours rounds to 59) — the `by` column says '
    'which; KNOWN = cannot match, documented reason in the note; ERROR = the model could not be counted.',
]


@dataclass
class Report:
    img_size: int
    seq_len: Optional[int]
    counts: Dict[str, Optional[Count]] = field(default_factory=dict)  # every selected model, in report order
    problems: Dict[str, Tuple[str, str]] = field(default_factory=dict)  # name -> ('ERROR' or 'SKIPPED', note)
    comparisons: List[Comparison] = field(default_factory=list)


def check_sizes(img_size: int, seq_len: Optional[int]) -> None:
    """A :class:`UsageError` (a ``ValueError``) for an image side that is no positive multiple of 32 or a sequence
    length that is no positive integer."""
    if not isinstance(img_size, int) or img_size < 32 or img_size % 32:
        raise UsageError(f'--img-size must be a positive multiple of 32 (sMLPNet needs H and W divisible by 32, '
                         f'gMLP / Mixer by 16), got {img_size}')
    if seq_len is not None and (not isinstance(seq_len, int) or seq_len < 1):
        raise UsageError(f'--seq-len must be a positive integer, got {seq_len}')


def build_report(models: Optional[Sequence[str]] = None, img_size: int = DEFAULT_IMG_SIZE,
                 seq_len: Optional[int] = None, progress: Callable[[str], None] = lambda line: None) -> Report:
    """Count ``models`` (names or patterns; all when None) and compare the paper rows that concern them.
    ``progress`` gets a line per model (counting one takes seconds to minutes)."""
    check_sizes(img_size, seq_len)
    names = resolve_models(models)
    counter = CountCache()
    report = Report(img_size, seq_len)
    for i, name in enumerate(names, 1):
        progress(f'[{i}/{len(names)}] counting {name}')
        fam = family(name)
        # None = the default size, so that counts are shared with the paper comparisons below
        size = {'vision': None if img_size == DEFAULT_IMG_SIZE else img_size, 'text': seq_len}.get(fam)
        if fam == 'text' and size is not None and size > (max_len := text_seq_len(name)):
            report.counts[name] = None
            report.problems[name] = ('SKIPPED', f'not counted: --seq-len {seq_len} exceeds its maximum {max_len}')
            continue
        report.counts[name] = counter.get(name, size)
        if report.counts[name] is None:
            report.problems[name] = counter.problem(name, size)
    for row in PAPER_ROWS:
        if row.model in names:  # the paper numbers are at the paper settings (224 px, each text model's length)
            report.comparisons.append(compare(row, counter.get(row.model), counter.problem(row.model)))
    return report


def _g(x: Optional[float], unit: float = 1e9) -> str:
    return '–' if x is None else f'{x / unit:.3f}'


def _uncounted_str(count: Count) -> str:
    text = ', '.join(f'{op.replace("aten::", "")}×{n}' for op, n in count.uncounted.items()) or 'none'
    return text + (' — **not element-wise: ' + ', '.join(count.flagged) + '**' if count.flagged else '')


def _md_table(*rows: Sequence) -> str:
    """A markdown table: the first row is the header."""
    return ''.join(f'| {" | ".join(map(str, r))} |\n' for r in (rows[0], ['---'] * len(rows[0]), *rows[1:]))


def render_markdown(report: Report, command: str = COMMAND) -> str:
    import fvcore
    import timm
    text_len = "each model's maximum sequence length" if report.seq_len is None else f'{report.seq_len} tokens'
    out = [f'# Model complexity: parameters and MACs vs the paper tables\n\nGenerated by `{command}`\n\n'
           f'torch {torch.__version__.split("+")[0]}, timm {timm.__version__}, fvcore {fvcore.__version__}; vision '
           f'models at {report.img_size}×{report.img_size}, text models at {text_len}, batch 1.\n\n## Conventions\n\n',
           *(f'- {line}\n' for line in CONVENTIONS), '\n## Paper tables vs ours\n\n']
    if report.comparisons:
        statuses = Counter(c.status for c in report.comparisons)
        out.append('Rows: ' + ', '.join(f'{k} {statuses[k]}' for k in STATUSES if statuses[k]) + '.\n\n')
        units = [QUANTITIES[c.row.quantity][2] for c in report.comparisons]
        out.append(_md_table(('source', 'model', 'quantity', 'paper', 'ours', 'diff', 'by', 'status', 'note'), *(
            (c.row.source, f'`{c.row.model}`', c.row.quantity, c.row.paper + unit,
             ('–' if c.ours is None else format_like(c.ours, c.row.paper)) + unit,
             '–' if c.rel_diff is None else f'{100 * c.rel_diff:+.2f} %', c.how or '–', c.status, c.note)
            for c, unit in zip(report.comparisons, units))))
    else:
        out.append('No paper row concerns the selected models.\n')
    if report.img_size != DEFAULT_IMG_SIZE or report.seq_len is not None:
        out.append('\nPaper rows are always compared at the paper settings (224 px; each text model at its own '
                   'length).\n')
    out.append('\n## Models\n\n' + _md_table(
        ('model', 'input', 'params (M)', 'params w/o head (M)', 'MACs (G)', 'encoder MACs (G)', 'FLOPs (G)',
         'traced on', 'uncounted ops (calls)'),
        *((f'`{name}`', *['–'] * 7, report.problems[name][1]) if c is None else
          (f'`{name}`', c.input, f'{c.params / 1e6:.3f}', _g(c.params_no_head, 1e6), _g(c.macs), _g(c.encoder_macs),
           _g(c.flops), c.traced_on, _uncounted_str(c)) for name, c in report.counts.items())))
    out.append('\n## MACs by operator (G)\n\n' + _md_table(('model', 'by operator'), *(
        (f'`{name}`', ', '.join(f'{op} {v / 1e9:.4g}' for op, v in c.by_operator.items()))
        for name, c in report.counts.items() if c is not None)))
    return ''.join(out)


def render_csv(report: Report) -> str:
    rows = [dict(section='paper', source=c.row.source, model=c.row.model, quantity=c.row.quantity,
                 unit=QUANTITIES[c.row.quantity][2].strip(), paper=c.row.paper,
                 ours='' if c.ours is None else format_like(c.ours, c.row.paper),
                 rel_diff_pct='' if c.rel_diff is None else f'{100 * c.rel_diff:.3f}',
                 tolerance_pct=f'{100 * c.row.tolerance:g}', by=c.how, status=c.status, note=c.note)
            for c in report.comparisons]
    for name, c in report.counts.items():
        if c is None:
            status, note = report.problems[name]
            rows.append(dict(section='model', model=name, status=status, note=note))
            continue
        rows += [dict(section='model', model=name, input=c.input, quantity=q, ours=str(getattr(c, q)),
                      note='uncounted: ' + _uncounted_str(c) if q == 'macs' else '')
                 for q in ('params', 'params_no_head', 'macs', 'encoder_macs') if getattr(c, q) is not None]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator='\n')  # absent fields are empty
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def render_json(report: Report) -> str:
    return json.dumps(dict(
        conventions=CONVENTIONS, img_size=report.img_size, seq_len=report.seq_len,
        models={n: (None if c is None else dict(asdict(c), flops=c.flops, encoder_flops=c.encoder_flops))
                for n, c in report.counts.items()},
        comparisons=[dict(asdict(c.row), ours=c.ours, rel_diff=c.rel_diff, status=c.status, by=c.how, note=c.note)
                     for c in report.comparisons]), indent=1) + '\n'


def parse_args(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> argparse.Namespace:
    """The flags, checked before anything is counted (``--threads`` by ``set_threads``, next); bad input is a
    :class:`UsageError` (``main``: one line, status 2, as every command)."""
    p = ArgumentParser(
        prog=prog, formatter_class=DefaultsHelpFormatter,
        description='Parameters and fvcore MACs of every model beside the paper tables. The report opens with '
                    'its counting conventions (which paper counts FLOPs as MACs, the handles added to fvcore).')
    p.add_argument('--models', nargs='+', metavar='PATTERN',
                   help='shell-style name patterns (default: every model); e.g. "smlpnet_*" "bigs_*"')
    p.add_argument('--img-size', type=int, default=DEFAULT_IMG_SIZE,
                   help='image side for the vision models, a multiple of 32')
    p.add_argument('--seq-len', type=int, default=None,
                   help="text models' sequence length, BiGS included (default: each one's maximum; a model with a "
                        "shorter maximum is listed as not counted); the bert_large_L baselines stay at their L")
    p.add_argument('--format', choices=FORMATS, default=None,
                   help='output format (default: from each --output suffix, else md)')
    p.add_argument('--output', nargs='+', metavar='PATH',
                   help='write here instead of stdout; several paths (.md / .csv / .json) share one count')
    add_threads_argument(p)  # fvcore traces every model: a forward each
    p.add_argument('--debug', action='store_true', help='show the traceback of an error, not its one line')
    args = p.parse_args(argv)
    check_sizes(args.img_size, args.seq_len)
    resolve_models(args.models)  # a pattern that matches nothing stops here, before any counting
    for path in args.output or []:
        folder = os.path.dirname(path) or '.'
        if os.path.isdir(path) or not os.path.isdir(folder):
            raise UsageError(f'--output {path!r}: expected a file path in an existing folder'
                             + (' (it is a folder)' if os.path.isdir(path) else f' ({folder} does not exist)'))
    outputs = args.output or [None]
    if args.format is not None and len(outputs) > 1:
        raise UsageError('--format applies to a single --output; with several, each path\'s suffix sets its format')
    args.targets = []
    for path in outputs:
        fmt = args.format or os.path.splitext(path or '')[1][1:].lower()
        if fmt not in FORMATS and path is not None and len(outputs) > 1:
            raise UsageError(f'--output {path!r}: cannot tell the format, expected a .md, .csv or .json suffix')
        args.targets.append((path, fmt if fmt in FORMATS else 'md'))
    return args


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> int:
    """Exit status: 0; 1 when a paper row FAILs or a model could not be counted (ERROR); bad arguments: one line
    starting with ``prog`` (the name it was run as) and status 2 (``run_cli``)."""
    return run_cli(prog, lambda a: _main(a, prog), argv)


def _main(argv: Sequence[str], prog: str) -> int:
    args = parse_args(argv, prog)
    progress = functools.partial(print, file=sys.stderr, flush=True)  # stdout may be the report itself
    progress(set_threads(args.threads))
    with warnings.catch_warnings():  # fvcore traces with torch.jit, deprecated: a notice per model, nothing to act on
        warnings.filterwarnings('ignore', message='`torch.jit.script` is deprecated', category=FutureWarning)
        report = build_report(args.models, args.img_size, args.seq_len, progress)
    command = ' '.join(['python -m mlp_vision.complexity', *map(shlex.quote, argv)])
    render = dict(md=lambda r: render_markdown(r, command), csv=render_csv, json=render_json)
    for path, fmt in args.targets:
        text = render[fmt](report)
        if path:
            write_output_file(path, text)  # a failed write leaves a previous regular file whole
            progress(f'wrote {path}')
        else:
            sys.stdout.write(text)
    bad = [c for c in report.comparisons if c.status in ('FAIL', 'ERROR')]
    bad_models = [n for n, (status, _) in report.problems.items() if status == 'ERROR']
    if bad or bad_models:
        print(f'{len(bad)} paper rows FAIL/ERROR, {len(bad_models)} models could not be counted', file=sys.stderr)
        return 1
    return 0
