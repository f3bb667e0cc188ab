""" Complexity report: parameters and MACs of every model, beside the paper tables (fvcore); what is counted and how
each paper counts it: ``docs/complexity.md``. From Python: ``model_macs('gmlp_ti')`` (1.344e9 at 224 x 224),
``count_module(model, (x,))[0]`` (any module, with the project's fvcore handles).
"""
from .counts import Count, CountCache, count, count_module, count_text, family, fft_macs, known_models, model_macs
from .paper import PAPER_ROWS, PaperRow, compare
from .report import COMMAND, build_report, main, render_csv, render_json, render_markdown
