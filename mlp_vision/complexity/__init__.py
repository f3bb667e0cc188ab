""" Complexity report: parameters and MACs of every model, beside the paper tables (fvcore).

Usage: ``python -m mlp_vision.complexity --help``; the committed report is :data:`.report.COMMAND`'s output.
Exit status: 0, or 1 when a paper row FAILs or a model could not be counted (ERROR), 2 for bad arguments.

From Python::

    from mlp_vision.complexity import model_macs, count_module
    model_macs('gmlp_ti')             # 1.344e9: the MACs the report gives gMLP-Ti at 224 x 224
    count_module(model, (x,))[0]      # MACs of any module with the project's fvcore handles

Pieces: :mod:`.handles` (the fvcore op handles and :func:`count_module`), :mod:`.counts` (building and counting
each model), :mod:`.paper` (the paper tables and the comparison rule), :mod:`.report` (rendering and the CLI),
:mod:`.plot` (the scaling plot). What is counted and how each paper counts it: ``docs/complexity.md``.
"""
from .counts import (
    BIGS_LENGTHS, DEFAULT_IMG_SIZE, Count, CountCache, count, count_bert_large, count_text, count_vision, family,
    known_models, model_macs, resolve_models, text_seq_len,
)
from .handles import EXTRA_HANDLES, NON_MAC_OPS, count_module, fft_flops, fft_macs, matmul_macs, sdpa_macs
from .paper import PAPER_ROWS, STATUSES, Comparison, PaperRow, compare
from .report import (
    COMMAND, COMMAND_PLOT, Report, build_report, conventions, main, render_csv, render_json, render_markdown,
)
