""" Complexity report: parameters and MACs of every model, beside the paper tables (fvcore).

Usage: ``python -m mlp_vision.complexity --help``; the committed report is :data:`.report.COMMAND`'s output. From
Python: ``model_macs('gmlp_ti')`` (1.344e9, the report's MACs of gMLP-Ti at 224 x 224), ``count_module(model,
(x,))[0]`` (the MACs of any module with the project's fvcore handles). Pieces: :mod:`.counts` (the fvcore handles,
counting each model), :mod:`.paper` (the paper tables and the comparison rule), :mod:`.report` (rendering and the
CLI). What is counted and how each paper counts it: ``docs/complexity.md``.
"""
from .counts import Count, CountCache, count, count_module, count_text, family, fft_macs, known_models, model_macs
from .paper import PAPER_ROWS, PaperRow, compare
from .report import COMMAND, build_report, main, render_csv, render_json, render_markdown
