""" mlp_vision text training command: causal LM, masked LM or sequence classification with the text models of
:mod:`mlp_vision.text`. Run as ``mlp-vision-text-train`` or ``python -m mlp_vision.train_text``; ``--help`` lists the
flags (:mod:`mlp_vision.training.tasks.text_args`). ``--task causal`` / ``mlm`` is the task of
:mod:`mlp_vision.training.tasks.language_model`, ``--task classify`` the one of
:mod:`mlp_vision.training.tasks.text_classification`; the driver of :mod:`mlp_vision.training.run.driver` runs it.

    python -m mlp_vision.train_text --task causal --model gpt_mlp_attention --train-file input.txt --steps 2000
"""
import logging
from typing import Optional, Sequence

from mlp_vision.training.run.distributed import init_device
from mlp_vision.training.run.driver import drive
from mlp_vision.bounds import size_bounds
from mlp_vision.errors import run_cli
from mlp_vision.training.run.log import setup_logging
from mlp_vision.training.run.training_run import TrainingRun, parse_run_args
from mlp_vision.threads import set_run_threads
from mlp_vision.training.tasks.text_args import PROG, build_parser, check_args
from mlp_vision.training.tasks.text_classification import ClassificationTask
from mlp_vision.training.tasks.language_model import LMTask
from mlp_vision.training.tasks.text_task import command_line

__all__ = ['main']


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG):
    """Train; returns the results dict on rank 0 (None on other ranks). Errors: one line starting with ``prog``, see
    ``run_cli``."""
    return run_cli(prog, lambda a: _main(a, prog), argv)


def _main(argv: Sequence[str], prog: str):
    args, resume_ckpt = parse_run_args(build_parser(prog), argv, kind='text')
    check_args(args)
    threads = set_run_threads(args.threads, resume_ckpt)
    dist_info = init_device(args.device, args.dist_backend, args.dist_url)
    setup_logging(dist_info.primary)
    logging.getLogger('mlp_vision.train_text').info(threads)
    run = TrainingRun(args, dist_info, resume_ckpt, kind='text', key='step', prog=prog,
                      decreasing=args.task != 'classify', max_history=0)  # classify: best = highest dev accuracy
    with run, size_bounds(args):
        task = ClassificationTask if args.task == 'classify' else LMTask
        return drive(run, task(args, run, command_line(prog, argv)))


if __name__ == '__main__':
    main(prog='python -m mlp_vision.train_text')
