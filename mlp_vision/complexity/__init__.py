""" Complexity report: parameters and MACs of every model, beside the paper tables (fvcore).

Usage: ``python -m mlp_vision.complexity --help``; the committed report is :data:`.report.COMMAND`'s output. From
Python: ``model_macs('gmlp_ti')`` (1.344e9, the report's MACs of gMLP-Ti at 224 x 224), ``count_module(model,
(x,))[0]`` (the MACs of any module with the project's fvcore handles).

Pieces: :mod:`.counts` (the fvcore handles, building and counting each model), :mod:`.paper` (the paper tables and
the comparison rule), :mod:`.report` (rendering and the CLI). What is counted and
how each paper counts it: ``docs/complexity.md``.
"""
from .counts import (
    BIGS_LENGTHS, DEFAULT_IMG_SIZE, EXTRA_HANDLES, NON_MAC_OPS, Count, CountCache, count, count_bert_large,
    count_module, count_text, count_vision, family, fft_macs, known_models, matmul_macs, model_macs, resolve_models,
    sdpa_macs, text_seq_len,
)
from .paper import PAPER_ROWS, STATUSES, Comparison, PaperRow, compare
from .report import (
    COMMAND, Report, build_report, conventions, main, render_csv, render_json, render_markdown,
)
