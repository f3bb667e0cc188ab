""" The flags of the text trainer (``python -m mlp_vision.train_text``) and their checks (:func:`check_args`). """
import argparse
from typing import Optional

from timm.utils import ParseKwargs

from mlp_vision.text.registry import is_model, list_models, model_entry
from mlp_vision.text.tokenizer import SUBWORD_KINDS, check_vocab_size
from mlp_vision.training.run.config import SEED_MAX, check_flag_ranges
from mlp_vision.training.run.compile import add_compile_arguments, check_compile_backend
from mlp_vision.arguments import ArgumentParser, DefaultsHelpFormatter, add_allow_regex_argument
from mlp_vision.errors import UsageError
from mlp_vision.training.run.training_run import add_device_arguments, add_run_arguments
from mlp_vision.threads import THREADS_RANGE

__all__ = ['PROG', 'TASKS', 'DEFAULT_MODELS', 'SCHEDULES', 'build_parser', 'check_args', 'task_model_entry']

PROG = 'python -m mlp_vision.train_text'  # the command's name in messages; the console script passes its own
# --task -> the registry task a model must have
TASKS = {'causal': 'causal_lm', 'mlm': 'masked_lm', 'classify': 'sequence_classification'}
# --model when not given: a model of the task (a classifier from scratch needs a family with a classification head)
DEFAULT_MODELS = {'causal': 'gpt_mlp_attention', 'mlm': 'bigs_small', 'classify': 'bigs_small'}
SCHEDULES = ('constant', 'cosine', 'linear')  # --sched: the decay after warmup (recipes.TIMM_SCHED maps them)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=prog,
        description='Train a mlp_vision.text model: char/byte-level causal LM or BERT-style masked LM.',
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument('-c', '--config', default='', type=str, metavar='FILE',
                        help='yaml file of flag values (keys = flag names); explicit flags override it')
    _add_task_data_and_model(parser)
    _add_optimization_and_outputs(parser)
    return parser


def _add_task_data_and_model(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group('Task and data')
    g.add_argument('--task', default='causal', choices=sorted(TASKS),
                   help='causal LM, masked LM, or classify (fine-tune on a labelled TSV / CSV, see '
                        'mlp_vision.training.tasks.text_classification)')
    g.add_argument('--text-columns', default='', type=str, metavar='COL[,COL]',
                   help='classify: the text column or sentence pair (default: sentence, else sentence1,sentence2)')
    g.add_argument('--label-column', default='label', type=str, metavar='COL', help='classify: the label column')
    g.add_argument('--test-file', default='', type=str, metavar='PATH',
                   help='classify: a labelled file scored once, with the best checkpoint (chosen on --val-file), at '
                        'the end; keep the file you report apart from the one you select on')
    g.add_argument('--init-from', default='', type=str, metavar='PATH',
                   help='classify: start from this last.pth / model_best.pth, pretrained/ folder or official BiGS '
                        'folder (its architecture and tokenizer); the log lists the loaded and the new weights')
    g.add_argument('--tokenizer-from', default='', type=str, metavar='PATH',
                   help='the tokenizer of this folder (a pretrained/ folder, tokenizer.json or BERT vocab.txt) '
                        'instead of --tokenizer: several pretraining runs with one vocabulary, or a classifier '
                        'trained from scratch with a pretrained run\'s vocabulary (not with --init-from)')
    g.add_argument('--train-file', default='', type=str, metavar='PATH', help='UTF-8 training text')
    g.add_argument('--val-file', default='', type=str, metavar='PATH',
                   help='held-out UTF-8 text (default: the last --val-fraction of --train-file)')
    g.add_argument('--val-fraction', default=0.1, type=float,
                   help='without --val-file: this final fraction of the training text is held out')
    g.add_argument('--tokenizer', default='char', choices=('char', 'byte', 'wordpiece', 'bpe'),
                   help='char or UTF-8 byte tokens, or a WordPiece / byte-level BPE vocabulary trained on the training '
                        'text (saved with the checkpoint and in pretrained/)')
    g.add_argument('--vocab-size', default=8000, type=int, help='wordpiece / bpe: vocabulary size to train')
    g.add_argument('--block-size', '--seq-len', default=None, type=int, metavar='N',
                   help="tokens per sample (MLM: including <cls> and <sep>); default: the model's max length")
    g.add_argument('--mask-rate', default=0.15, type=float, help='MLM: fraction of tokens selected')
    g = parser.add_argument_group('Model')
    g.add_argument('--model', default=None, type=str,
                   help='name in mlp_vision.text.list_models() (default: ' + ', '.join(
                       f'{name} for --task {task}' for task, name in DEFAULT_MODELS.items()) + ')')
    g.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs,
                   help='config overrides k=v, e.g. num_hidden_layers=4 hidden_size=256 (vocab_size comes from '
                        'the tokenizer)')


def _add_optimization_and_outputs(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group('Optimization (defaults: the recipe of the model family, configs/text/)')
    g.add_argument('--steps', default=1000, type=int, help='optimizer updates')
    g.add_argument('-b', '--batch-size', default=32, type=int, help='samples per micro-batch per process')
    g.add_argument('--grad-accum-steps', default=1, type=int, help='micro-batches per optimizer update')
    g.add_argument('--lr', default=None, type=float, help='peak learning rate')
    g.add_argument('--opt-betas', default=None, type=float, nargs=2, metavar='BETA', help='AdamW betas')
    g.add_argument('--opt-eps', default=None, type=float, help='AdamW epsilon')
    g.add_argument('--weight-decay', default=None, type=float, help='AdamW weight decay (not on 1-D params)')
    g.add_argument('--sched', default=None, choices=SCHEDULES, help='decay after warmup')
    g.add_argument('--warmup-steps', default=None, type=int,
                   help="linear warmup updates (default: min(the recipe's, 10%% of --steps))")
    g.add_argument('--min-lr-ratio', default=0.0, type=float, help='cosine / linear decay ends at this x LR')
    g.add_argument('--clip-grad', default=1.0, type=float, help='max gradient norm (<= 0: off)')
    g.add_argument('--model-ema', action='store_true', default=False,
                   help='classify: an exponential moving average of the weights (timm ModelEmaV3) is evaluated (raw '
                        'weights: raw_val_acc), picks model_best.pth, and is what --test-file and pretrained/ use')
    g.add_argument('--model-ema-decay', default=0.999, type=float,
                   help='EMA decay per update (1 / (1 - decay) updates is its horizon)')
    g.add_argument('--freeze-embeddings', action=argparse.BooleanOptionalAction, default=False,
                   help='keep the token embedding (model.get_input_embeddings(); a tied MLM decoder too) fixed: a '
                        'small labelled set then cannot move its words\' rows away from those of the words it lacks')
    g = parser.add_argument_group('Evaluation, checkpoints, outputs')
    g.add_argument('--eval-interval', default=100, type=int, help='evaluate + checkpoint every N updates')
    g.add_argument('--eval-batches', default=8, type=int,
                   help='validation batches of the periodic evaluation (a fixed subset; <= 0: all)')
    g.add_argument('--final-eval-batches', default=0, type=int, help='validation batches at the end (<= 0: all)')
    g.add_argument('--eval-batch-size', default=None, type=int, help='default: --batch-size')
    g.add_argument('--log-interval', default=10, type=int, help='progress line every N updates')
    g.add_argument('--output', default='', type=str, help='output root (default ./output/text)')
    g.add_argument('--experiment', default='', type=str, help='experiment folder name (default: date-model-task)')
    add_run_arguments(g, 'continue the run of this last.pth in its folder, with its saved settings; flags given '
                         'here override them (e.g. a larger --steps)')
    add_allow_regex_argument(g)
    g.add_argument('--stop-after-step', default=None, type=int, metavar='N',
                   help='checkpoint at update N and exit (continue later with --resume); the schedule still '
                        'spans --steps')
    g.add_argument('--sample-prompt', default=None, type=str,
                   help='causal LM: after training, sample from this prompt into samples.txt')
    g.add_argument('--sample-tokens', default=500, type=int, help='tokens per sample')
    g.add_argument('--num-samples', default=1, type=int, help='samples per prompt')
    g.add_argument('--sample-temperature', default=1.0, type=float, help='sampling temperature (<= 0: greedy)')
    g.add_argument('--sample-top-k', default=None, type=int, help='sample from the k most likely tokens')
    g = parser.add_argument_group('Device')
    add_device_arguments(g)
    add_compile_arguments(g)  # compiles the training forward and backward; evaluation and sampling run eager
    g.add_argument('--seed', default=42, type=int, help='seed of the model init, dropout and data order')


_UNIT_OPEN = dict(low=0, high=1, low_open=True, high_open=True)
MAX_BATCH = 2 ** 16  # samples per micro-batch per process: beyond, one batch of 16-token blocks alone is gigabytes
_BATCH = dict(low=1, high=MAX_BATCH, why='samples per micro-batch per process; use --grad-accum-steps for more')


def check_args(args) -> None:
    """Every flag value that cannot work, as one line, before a file is read or a model built; flags left at None
    (filled later by the recipe or the model) are checked only when given. An unset ``--model`` becomes the task's
    default (:data:`DEFAULT_MODELS`), a derived value."""
    if args.model is None:
        args.derive(model=DEFAULT_MODELS[args.task])
    check_compile_backend(args.torchcompile)
    positive = dict(low=0, low_open=True)
    check_flag_ranges(args, {
        'steps': dict(low=1), 'batch_size': _BATCH, 'grad_accum_steps': dict(low=1), 'eval_interval': dict(low=1),
        'log_interval': dict(low=1), 'eval_batch_size': _BATCH, 'threads': THREADS_RANGE,
        'sample_tokens': dict(low=1), 'num_samples': dict(low=1), 'sample_top_k': dict(low=1),
        'sample_temperature': dict(why='<= 0: greedy'), 'seed': dict(low=0, high=SEED_MAX),
        'block_size': dict(low=3 if args.task == 'mlm' else 1, why=f'--task {args.task}'),  # MLM: <cls> token <sep>
        'vocab_size': dict(low=1), **({} if args.val_file else {'val_fraction': _UNIT_OPEN}), 'mask_rate': _UNIT_OPEN,
        'lr': positive, 'opt_eps': positive,  # --opt-eps 0: a parameter without gradient gets 0 / 0
        'weight_decay': dict(low=0), 'clip_grad': dict(why='<= 0: no clipping'), 'min_lr_ratio': dict(low=0, high=1),
        'warmup_steps': dict(low=0), 'model_ema_decay': dict(low=0, high=1, high_open=True),
        'stop_after_step': dict(low=1, high=args.steps, why='--steps'),
        'opt_betas': dict(low=0, high=1, high_open=True)})
    if args.tokenizer in SUBWORD_KINDS and not args.tokenizer_from:
        check_vocab_size('--vocab-size', args.tokenizer, args.vocab_size)
    if args.task != 'classify':  # these only mean something to classify: ignoring them would hide a mistake
        given = [flag for flag, value in (('--init-from', args.init_from), ('--test-file', args.test_file),
                                          ('--text-columns', args.text_columns)) if value]
        if given:
            raise UsageError(f'{", ".join(given)} {"is" if len(given) == 1 else "are"} for --task classify, not '
                             f'--task {args.task}')
    if args.init_from and args.tokenizer_from:
        raise UsageError('--tokenizer-from is for a model trained from scratch; with --init-from the checkpoint\'s '
                         'tokenizer is used (give one of the two)')
    if args.sample_prompt is not None and args.task != 'causal':
        raise UsageError('--sample-prompt needs --task causal (masked LMs do not generate)')
    if args.sample_prompt == '':
        raise UsageError('--sample-prompt is empty: give at least one character')
    if args.model_ema and args.task != 'classify':
        raise UsageError(f'--model-ema is implemented for --task classify, not --task {args.task}')
    saved = args.resumed_settings
    if saved and bool(saved.get('freeze_embeddings', False)) != args.freeze_embeddings:
        # the optimizer state holds exactly the trained parameters, so the set cannot change mid-run
        raise UsageError(f'--resume {args.resume} was trained with{"" if saved.get("freeze_embeddings") else "out"} '
                         f'--freeze-embeddings; resume it the same way (start a new run to change it)')


def task_model_entry(name: str, task: Optional[str] = None):
    """The registry entry of ``name``; with ``task``, it must be registered for it (its default task)."""
    if not is_model(name):
        raise UsageError(f'unknown text model {name!r}; known: {", ".join(list_models())}')
    entry = model_entry(name)
    if task is not None and entry.task != TASKS[task]:
        raise UsageError(f'model {name!r} is a {entry.task} model; --task {task} needs a {TASKS[task]} model: '
                         f'{", ".join(list_models(task=TASKS[task]))}')
    return entry
