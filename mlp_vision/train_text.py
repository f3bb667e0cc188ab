""" mlp_vision text training command: causal LM, masked LM or sequence classification with the text models of
:mod:`mlp_vision.text`, on ``transformers.Trainer`` (``torchrun`` / ``accelerate launch`` for several processes).

    python -m mlp_vision.train_text --task causal --model gpt_mlp_attention --train-file input.txt --steps 2000

The run folder ``--output/--experiment`` is new (an existing one is refused): Trainer's ``checkpoint-N/`` every
``--eval-interval`` updates (the two latest; classify: the best by dev accuracy and the latest), and at the end the
``save_pretrained`` folder of the final model (classify: the best checkpoint's) with its tokenizer and
``eval_results.json`` (``test_results.json``). ``--resume`` takes a ``checkpoint-N/`` or the run folder.

AdamW (BiGS with its official decay mask, :func:`~mlp_vision.text.bigs.bigs_param_groups`) and a linear warmup, then
``--sched``; the recipes of ``configs/text/`` fill the optimizer flags left unset, per model family.
"""
import argparse
import logging
import math
import os
import pickle
import signal
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch
import torch.distributed as dist

from mlp_vision.arguments import (
    SEED_MAX, THREADS_RANGE, ArgumentParser, DefaultsHelpFormatter, ParseKwargs, add_allow_regex_argument,
    add_threads_argument, check_flag_ranges, check_kwargs_flags, find_recipe, load_yaml_config, merge_settings,
    parse_given, set_threads)
from mlp_vision.bounds import BOUND_RANGES, add_bound_arguments, size_bounds
from mlp_vision.errors import Interrupted, UsageError, run_cli

__all__ = ['main', 'build_parser', 'parse_args', 'check_args', 'PROG', 'TASKS', 'DEFAULT_MODELS']

PROG = 'python -m mlp_vision.train_text'  # the command's name in messages; the console script passes its own
# --task -> the registry task a model must have
TASKS = {'causal': 'causal_lm', 'mlm': 'masked_lm', 'classify': 'sequence_classification'}
# --model when not given: a model of the task (a classifier from scratch needs a family with a classification head)
DEFAULT_MODELS = {'causal': 'gpt_mlp_attention', 'mlm': 'bigs_small', 'classify': 'bigs_small'}
CLASSIFY_FAMILIES = ('gmlp', 'bigs', 'bert')
# --sched -> Trainer's lr_scheduler_type (each after the linear warmup)
SCHEDULES = {'constant': 'constant_with_warmup', 'cosine': 'cosine', 'linear': 'linear'}
# (model family, registry task) -> its recipe in configs/text/; a family without one takes its task's default
RECIPES = {('gmlp', 'masked_lm'): 'gmlp_masked_lm', ('bigs', 'masked_lm'): 'bigs_masked_lm',
           ('gpt', 'causal_lm'): 'gpt_causal_lm', ('gmlp', 'causal_lm'): 'gmlp_causal_lm'}
DEFAULT_RECIPES = {'masked_lm': 'gmlp_masked_lm', 'causal_lm': 'gpt_causal_lm', 'sequence_classification': 'finetune'}
MAX_BATCH = 2 ** 16  # samples per micro-batch per process: beyond, one batch of 16-token blocks alone is gigabytes

_logger = logging.getLogger('mlp_vision.train_text')


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog, formatter_class=DefaultsHelpFormatter,
                            description='Train a mlp_vision.text model (causal LM, masked LM or classifier) with '
                                        'transformers.Trainer.')
    parser.add_argument('-c', '--config', default='', type=str, metavar='FILE',
                        help='yaml file of flag values (keys = flag names); explicit flags override it')
    g = parser.add_argument_group('Task and data')
    g.add_argument('--task', default='causal', choices=sorted(TASKS),
                   help='causal LM, masked LM, or classify (fine-tune on a labelled TSV / CSV)')
    g.add_argument('--train-file', default='', type=str, metavar='PATH',
                   help='UTF-8 training text (classify: TSV / CSV with a header row)')
    g.add_argument('--val-file', default='', type=str, metavar='PATH',
                   help='held-out file (causal / mlm default: the last --val-fraction of --train-file)')
    g.add_argument('--val-fraction', default=0.1, type=float,
                   help='causal / mlm without --val-file: this final fraction of the training text is held out')
    g.add_argument('--test-file', default='', type=str, metavar='PATH',
                   help='classify: a labelled file scored once at the end by the best checkpoint (on --val-file)')
    g.add_argument('--text-columns', default='', type=str, metavar='COL[,COL]',
                   help='classify: the text column or sentence pair (default: sentence, else sentence1,sentence2)')
    g.add_argument('--label-column', default='label', type=str, metavar='COL', help='classify: the label column')
    g.add_argument('--tokenizer', default='char', choices=('char', 'byte', 'wordpiece', 'bpe'),
                   help='char or UTF-8 byte tokens, or a WordPiece / byte-level BPE vocabulary trained on the '
                        'training text')
    g.add_argument('--vocab-size', default=8000, type=int, help='wordpiece / bpe: vocabulary size to train')
    g.add_argument('--tokenizer-from', default='', type=str, metavar='PATH',
                   help="another run's tokenizer (a folder, tokenizer.json or BERT vocab.txt) instead of --tokenizer")
    g.add_argument('--init-from', default='', type=str, metavar='PATH',
                   help="classify: start from this save_pretrained folder (a masked LM run's) or official BiGS "
                        "folder, with its tokenizer; the head is new")
    g.add_argument('--block-size', '--seq-len', type=int, metavar='N',
                   help="tokens per sample, special tokens included (default: the model's max length)")
    g.add_argument('--mask-rate', default=0.15, type=float, help='mlm: fraction of tokens selected')
    g = parser.add_argument_group('Model')
    defaults = ', '.join(f'{name} for --task {task}' for task, name in DEFAULT_MODELS.items())
    g.add_argument('--model', type=str, help=f'name in mlp_vision.text.list_models() (default: {defaults})')
    g.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs,
                   help='config fields k=v, e.g. num_hidden_layers=4 hidden_size=256 (vocab_size: the tokenizer\'s)')
    _add_optimization_and_run(parser)
    return parser


def _add_optimization_and_run(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group('Optimization (defaults: the recipe of the model family, configs/text/)')
    g.add_argument('--steps', default=1000, type=int, help='optimizer updates')
    g.add_argument('-b', '--batch-size', default=32, type=int, help='samples per micro-batch per process')
    g.add_argument('--grad-accum-steps', default=1, type=int, help='micro-batches per optimizer update')
    g.add_argument('--lr', type=float, help='peak learning rate')
    g.add_argument('--opt-betas', type=float, nargs=2, metavar='BETA', help='AdamW betas')
    g.add_argument('--opt-eps', type=float, help='AdamW epsilon')
    g.add_argument('--weight-decay', type=float, help='AdamW weight decay')
    g.add_argument('--sched', choices=sorted(SCHEDULES), help='decay after warmup')
    g.add_argument('--warmup-steps', type=int,
                   help="linear warmup updates (default: min(the recipe's, 10%% of --steps))")
    g.add_argument('--clip-grad', default=1.0, type=float, help='max gradient norm (<= 0: off)')
    g.add_argument('--freeze-embeddings', action='store_true',
                   help='keep the token embedding (a tied MLM decoder too) fixed')
    g = parser.add_argument_group('Evaluation, checkpoints, outputs')
    g.add_argument('--eval-interval', default=100, type=int, help='evaluate + checkpoint every N updates')
    g.add_argument('--eval-batch-size', type=int, help='default: --batch-size')
    g.add_argument('--log-interval', default=10, type=int, help='log the training loss every N updates')
    g.add_argument('--output', default='./output/text', type=str, help='output root')
    g.add_argument('--experiment', default='', type=str, help='run folder name (default: date-model-task)')
    g.add_argument('--resume', default='', type=str, metavar='PATH',
                   help='continue from this checkpoint-N/ folder, or the latest of this run folder (its model and '
                        "tokenizer; give the run's other flags again)")
    g.add_argument('--stop-after-step', type=int, metavar='N',
                   help='checkpoint at update N and exit (continue with --resume); the schedule still spans --steps')
    add_allow_regex_argument(g)
    g.add_argument('--debug', action='store_true',
                   help='show the full traceback of an error instead of its one-line message')
    add_bound_arguments(g)
    g = parser.add_argument_group('Device')
    g.add_argument('--device', choices=('cpu', 'cuda'),
                   help='default: cuda if available (several processes: torchrun / accelerate launch)')
    add_threads_argument(g)
    g.add_argument('--amp', action='store_true', help='mixed precision (bfloat16 on CPU)')
    g.add_argument('--amp-dtype', choices=('float16', 'bfloat16'), help='default: float16 on CUDA, bfloat16 on CPU')
    g.add_argument('--torchcompile', nargs='?', type=str, const='inductor', metavar='BACKEND',
                   help='torch.compile the model with this backend (inductor without a value)')
    g.add_argument('--seed', default=42, type=int, help='seed of the model init, dropout, masking and data order')


def parse_args(argv: Sequence[str], prog: str = PROG):
    """The flags of ``argv`` over the ``-c`` file's values (a recipe of ``configs/text/`` too: its ``source`` is
    a note, not a flag) over the defaults."""
    parser = build_parser(prog)
    given = parse_given(parser, argv)
    config = given.pop('config', '')
    values = load_yaml_config(config, parser, notes=('source',)) if config else {}
    values.pop('source', None)
    args, _ = merge_settings(parser, {**values, **given})
    return args


def check_args(args) -> None:
    """Every flag value that cannot work, as one line, before a file is read; an unset ``--model`` becomes the
    task's default (:data:`DEFAULT_MODELS`)."""
    from mlp_vision.text.tokenizer import SUBWORD_KINDS, check_vocab_size
    if args.model is None:
        args.derive(model=DEFAULT_MODELS[args.task])
    unit_open = dict(low=0, high=1, low_open=True, high_open=True)
    batch = dict(low=1, high=MAX_BATCH, why='samples per micro-batch per process; use --grad-accum-steps for more')
    check_flag_ranges(args, {
        'steps': dict(low=1), 'batch_size': batch, 'eval_batch_size': batch, 'grad_accum_steps': dict(low=1),
        'eval_interval': dict(low=1), 'log_interval': dict(low=1), 'threads': THREADS_RANGE,
        'seed': dict(low=0, high=SEED_MAX), 'vocab_size': dict(low=1), 'mask_rate': unit_open,
        'block_size': dict(low=3 if args.task == 'mlm' else 1, why=f'--task {args.task}'),  # MLM: <cls> token <sep>
        **({} if args.val_file or args.task == 'classify' else {'val_fraction': unit_open}),
        'lr': dict(low=0, low_open=True), 'opt_eps': dict(low=0, low_open=True), 'weight_decay': dict(low=0),
        'warmup_steps': dict(low=0, high=args.steps - 1, why='below --steps: a run all warmup never reaches --lr'),
        'clip_grad': dict(why='<= 0: no clipping'),
        'opt_betas': dict(low=0, high=1, high_open=True), **BOUND_RANGES,
        'stop_after_step': dict(low=1, high=args.steps, why='--steps')})
    check_kwargs_flags(args, 'model_kwargs')
    if args.tokenizer in SUBWORD_KINDS and not (args.tokenizer_from or args.init_from or args.resume):
        check_vocab_size('--vocab-size', args.tokenizer, args.vocab_size)
    if args.task != 'classify':  # these only mean something to classify: ignoring them would hide a mistake
        given = [flag for flag, value in (('--init-from', args.init_from), ('--test-file', args.test_file),
                                          ('--text-columns', args.text_columns)) if value]
        if given:
            raise UsageError(f'{", ".join(given)} {"is" if len(given) == 1 else "are"} for --task classify, not '
                             f'--task {args.task}')
    if args.init_from and args.tokenizer_from:
        raise UsageError("--tokenizer-from is for a model trained from scratch; with --init-from the folder's "
                         "tokenizer is used (give one of the two)")
    if args.amp_dtype == 'float16' and args.device == 'cpu':
        raise UsageError('--amp-dtype float16 needs CUDA; on the CPU use bfloat16 (the default)')
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise UsageError('--device cuda: this machine has no CUDA device; use --device cpu')


def apply_recipe(args, family: str, registry_task: str) -> str:
    """Fill the optimizer flags left unset from ``configs/text/`` (:data:`RECIPES`); returns the recipe's source."""
    name = RECIPES.get((family, registry_task), DEFAULT_RECIPES[registry_task])
    recipe = load_yaml_config(str(find_recipe(name, kind='text')), build_parser(), notes=('source',))
    fills = {k: recipe[k] for k in ('lr', 'opt_betas', 'opt_eps', 'weight_decay', 'sched') if getattr(args, k) is None}
    if args.warmup_steps is None:
        fills['warmup_steps'] = min(recipe.get('warmup_steps', args.steps // 10), args.steps // 10)
    args.derive(**fills)
    return f'{name}: {recipe["source"]}'


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG):
    """Train; returns the final metrics on rank 0 (None on other ranks or after a stop at --stop-after-step).
    Errors: one line starting with ``prog``, see ``run_cli``."""
    return run_cli(prog, lambda a: _main(a, prog), argv)


def _main(argv: Sequence[str], prog: str):
    from mlp_vision.run_files import stop_signals
    args = parse_args(argv, prog)
    check_args(args)
    primary = int(os.environ.get('RANK', 0) or 0) == 0  # torchrun / accelerate launch: rank 0 logs the setup
    logging.basicConfig(level=logging.INFO if primary else logging.WARNING,
                        format='%(asctime)s %(levelname)s %(message)s')
    _logger.info(set_threads(args.threads))
    with size_bounds(args), stop_signals() as stop:
        return _train(args, stop)


def _resume_checkpoint(path: str) -> Optional[str]:
    """``--resume``: a ``checkpoint-N/`` folder (with ``trainer_state.json``), or a run folder's latest one."""
    from transformers.trainer_utils import get_last_checkpoint
    if not path:
        return None
    if not Path(path).is_dir():
        raise UsageError(f'--resume {path} is not a folder; expected a checkpoint-N/ folder of a run, or the run '
                         f'folder (its latest checkpoint)')
    if (Path(path) / 'trainer_state.json').is_file():
        return path
    last = get_last_checkpoint(path)
    if last is None:
        raise UsageError(f'--resume {path} holds no checkpoint-N/ folder with trainer_state.json; expected a '
                         f'checkpoint of mlp_vision.train_text (transformers.Trainer)')
    return last


def _output_dir(args, resume: Optional[str], distributed: bool) -> str:
    """The run folder: the resumed checkpoint's parent, else a new ``--output/--experiment`` (an existing
    non-empty folder is refused: a new run never writes over another's files); every rank takes rank 0's name."""
    if resume:
        return str(Path(resume).resolve().parent)
    if args.experiment and (Path(args.experiment).name != args.experiment or args.experiment in ('.', '..')):
        raise UsageError(f'--experiment {args.experiment!r} is not a folder name; expected a name without "/" (the '
                         f'run folder is made under --output)')
    name = [args.experiment or f'{datetime.now():%Y%m%d-%H%M%S}-{args.model.replace(os.sep, "_")}-{args.task}']
    if distributed:
        dist.broadcast_object_list(name, src=0)
    out = Path(args.output) / name[0]
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f'the run folder {out} exists already; give another --experiment (or --resume {out} to '
                         f'continue that run)')
    return str(out)


def _start_model(args, resume: Optional[str], distributed: bool, needs: Sequence[str], train_text: str,
                 held_out_text: str, **config):
    """The model with ``model.tokenizer``: the resumed checkpoint's, else a new ``--model`` with the vocabulary and
    ``<pad>`` id of the ``--tokenizer-from`` tokenizer (``needs``: the control tokens the task uses) or of one built
    on the training text, on rank 0 and sent to the others (a trained vocabulary is not reproducible run to run)."""
    from mlp_vision.text.registry import create_model, from_pretrained, is_model, list_models, model_entry
    from mlp_vision.text.training_data import build_tokenizer, tokenizer_from_path
    if resume:
        return from_pretrained(resume, allow_regex=args.allow_regex)
    registry_task = TASKS[args.task]
    if not is_model(args.model):
        raise UsageError(f'unknown text model {args.model!r}; known: {", ".join(list_models())}')
    entry = model_entry(args.model)
    if registry_task == 'sequence_classification':
        if entry.family not in CLASSIFY_FAMILIES:
            known = ', '.join(n for n in list_models() if model_entry(n).family in CLASSIFY_FAMILIES)
            raise UsageError(f'model {args.model!r} ({entry.family}) has no sequence classifier; use a gMLP, BiGS '
                             f'or BERT model: {known}')
    elif entry.task != registry_task:
        raise UsageError(f'model {args.model!r} is a {entry.task} model; --task {args.task} needs a {registry_task} '
                         f'model: {", ".join(list_models(task=registry_task))}')
    if args.tokenizer_from:
        tokenizer = tokenizer_from_path(args.tokenizer_from, needs, args.allow_regex)
    else:
        built = [build_tokenizer(args.tokenizer, args.task, train_text, held_out_text, args.vocab_size)
                 if not distributed or dist.get_rank() == 0 else None]
        if distributed:
            dist.broadcast_object_list(built, src=0)
        tokenizer = built[0]
    kwargs = dict(args.model_kwargs)
    if kwargs.get('vocab_size', len(tokenizer)) != len(tokenizer):
        raise UsageError(f'--model-kwargs vocab_size={kwargs["vocab_size"]} differs from the tokenizer\'s '
                         f'{len(tokenizer)}; leave vocab_size out (it is set from the tokenizer)')
    kwargs.update(vocab_size=len(tokenizer), **config)
    if 'pad_token_id' in entry.config_class.text_field_names() and tokenizer.pad_token_id is not None:
        kwargs.setdefault('pad_token_id', tokenizer.pad_token_id)
    try:
        model = create_model(args.model, task=registry_task, **kwargs)
    except (TypeError, ValueError, KeyError) as e:
        if isinstance(e, UsageError):
            raise
        raise UsageError(f'cannot build {args.model} with --model-kwargs {dict(args.model_kwargs)}: {e}') from None
    model.tokenizer = tokenizer
    return model


def _pretrained_classifier(args, num_labels: int, labels: Dict[str, Any]):
    """``--init-from``: a save_pretrained folder through ``AutoModelForSequenceClassification.from_pretrained``
    (a new head), or an official BiGS folder through ``BiGSForSequenceClassification.from_official``."""
    from transformers import AutoModelForSequenceClassification
    from mlp_vision.text.bigs import BiGSForSequenceClassification, from_official_folder
    from mlp_vision.text.modeling_utils import is_saved_folder
    from mlp_vision.text.registry import load_config
    path = args.init_from
    if not Path(path).is_dir():
        raise UsageError(f'--init-from {path} is not a folder; expected the save_pretrained folder of a run (its '
                         f'run folder) or an official BiGS folder')
    overrides = {**dict(args.model_kwargs), 'num_labels': num_labels, **labels}
    if is_saved_folder(path):
        stored, config = load_config(path)  # a damaged config.json: one line naming it
        family = config.model_type.removeprefix('mlp_vision_')
        if family not in CLASSIFY_FAMILIES:
            raise UsageError(f'--init-from {path} holds a {stored.__name__}, whose family ({family}) has no sequence '
                             f'classifier; use a gMLP, BiGS or BERT folder')
        try:
            model = AutoModelForSequenceClassification.from_pretrained(path, allow_regex=args.allow_regex, **overrides)
        except (TypeError, ValueError) as e:  # a --model-kwargs value the config refuses
            if isinstance(e, UsageError):
                raise
            raise UsageError(f'--init-from {path} with --model-kwargs {dict(args.model_kwargs)}: '
                             f'{str(e).splitlines()[0]}') from None
    else:
        model = from_official_folder(BiGSForSequenceClassification, path, f'--init-from {path}',
                                     allow_regex=args.allow_regex, **overrides)
    if model.tokenizer is None:
        raise UsageError(f'--init-from {path} holds no tokenizer (tokenizer.json or vocab.txt); the model cannot '
                         f'be fed without the tokenizer it was trained with')
    return model


def _fit_block_size(args, model) -> None:
    """``--block-size``, by default the model's maximum length, which it may not exceed; then the activations of a
    training batch are checked to fit the bound."""
    from mlp_vision.text.modeling_utils import check_text_activations
    seq_len = model.config.max_position_embeddings
    if args.block_size is None:
        args.derive(block_size=seq_len)
    if args.block_size > seq_len:
        resizable = not (args.init_from or args.resume)  # a new model: its config may say another length
        raise UsageError(f'--block-size {args.block_size} is larger than the model\'s maximum length {seq_len}; use '
                         f'--block-size <= {seq_len}' + (f' or --model-kwargs max_position_embeddings='
                                                          f'{args.block_size}' if resizable else ''))
    check_text_activations(type(model), model.config, args.batch_size, args.block_size, True, f'--model {args.model}')


def _lm_data(args, resume: Optional[str], distributed: bool, stop):
    """(model with ``model.tokenizer``, training blocks, held-out blocks, None: no test set) of --task causal / mlm
    (mlm: :class:`~mlp_vision.text.training_data.MaskedBlocks`)."""
    from mlp_vision.text.training_data import (
        LMBlocks, MaskedBlocks, check_unknown_tokens, encode_text, read_text_file)
    train_text = read_text_file(args.train_file, 'training text file')
    if args.val_file:
        val_text = read_text_file(args.val_file, 'validation text file')
    else:  # the last --val-fraction of the characters
        cut = int(len(train_text) * (1. - args.val_fraction))
        train_text, val_text = train_text[:cut], train_text[cut:]
    mlm = args.task == 'mlm'
    model = _start_model(args, resume, distributed, ('pad', 'cls', 'sep', 'mask') if mlm else (), train_text, val_text)
    tokenizer = model.tokenizer
    _fit_block_size(args, model)
    blocks = []
    for text, what in ((train_text, 'training text'), (val_text, 'validation text')):
        ids = encode_text(tokenizer, text, what, stop=stop)
        check_unknown_tokens(ids, tokenizer, what)
        blocks.append(LMBlocks(ids, args.block_size, args.task, tokenizer, what))
    if mlm:
        blocks = [MaskedBlocks(b, tokenizer, args.mask_rate, args.seed) for b in blocks]
    return model, blocks[0], blocks[1], None


def _classify_data(args, resume: Optional[str], distributed: bool, stop):
    """(classifier with ``model.tokenizer``, training, dev and test examples) of --task classify."""
    import inspect
    from mlp_vision.text.labelled_data import classification_examples, label_ids, read_labelled_file
    columns = [c.strip() for c in args.text_columns.split(',')] if args.text_columns else None
    train = read_labelled_file(args.train_file, columns, args.label_column, '--train-file')
    if not args.val_file:
        raise UsageError('--task classify needs --val-file (the dev file, same columns as --train-file)')
    dev = read_labelled_file(args.val_file, train.text_columns, args.label_column, '--val-file')
    names = label_ids(train.labels, dev.labels)
    test = read_labelled_file(args.test_file, train.text_columns, args.label_column, '--test-file') \
        if args.test_file else None
    if test is not None:
        label_ids(train.labels, test.labels, '--test-file')
    labels = {'id2label': dict(enumerate(names)), 'label2id': {n: i for i, n in enumerate(names)}}
    if args.init_from and not resume:
        model = _pretrained_classifier(args, len(names), labels)
    else:
        texts = train.texts + (train.pairs or [])
        held_out = [t for d in (dev, test) if d is not None for t in d.texts + (d.pairs or [])]
        model = _start_model(args, resume, distributed, ('cls', 'sep', 'pad'), '\n'.join(texts), '\n'.join(held_out),
                             num_labels=len(names), **labels)
        if resume and list(model.config.id2label.values()) != names:
            raise UsageError(f'--resume {resume} was trained with labels {list(model.config.id2label.values())}, '
                             f'the files now have {names}')
    tokenizer = model.tokenizer
    _fit_block_size(args, model)
    pairs = train.pairs is not None  # BERT's template, with room for a token of each segment
    if tokenizer.cls_token_id is None or tokenizer.pad_token_id is None or (pairs and tokenizer.sep_token_id is None):
        raise UsageError(f'the tokenizer has no {"<cls> / <sep> / <pad>" if pairs else "<cls> / <pad>"} token; '
                         f'sequence classification needs {"them" if pairs else "both"} (the BERT template)')
    if args.block_size < tokenizer.num_special_tokens_to_add(pair=pairs) + (2 if pairs else 1):
        raise UsageError(f'--block-size {args.block_size} leaves no room for text after the special tokens')
    with_types = 'token_type_ids' in inspect.signature(model.forward).parameters
    examples = [None if d is None else classification_examples(tokenizer, d, names, args.block_size, with_types, stop)
                for d in (train, dev, test)]
    return (model, *examples)


def _training_arguments(args, output_dir: str, classify: bool):
    """The flags as ``transformers.TrainingArguments``: evaluation and a checkpoint every ``--eval-interval``
    updates, the two latest kept (classify: the best by dev accuracy, loaded at the end, and the latest)."""
    from transformers import TrainingArguments
    cpu = args.device == 'cpu' or not torch.cuda.is_available()
    amp_dtype = (args.amp_dtype or ('bfloat16' if cpu else 'float16')) if args.amp else None
    return TrainingArguments(
        output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.eval_batch_size or args.batch_size,
        gradient_accumulation_steps=args.grad_accum_steps, learning_rate=args.lr, weight_decay=args.weight_decay,
        adam_beta1=args.opt_betas[0], adam_beta2=args.opt_betas[1], adam_epsilon=args.opt_eps,
        lr_scheduler_type=SCHEDULES[args.sched], warmup_steps=args.warmup_steps, max_grad_norm=max(args.clip_grad, 0.),
        eval_strategy='steps', eval_steps=args.eval_interval, save_strategy='steps', save_steps=args.eval_interval,
        save_total_limit=2, load_best_model_at_end=classify, metric_for_best_model='acc' if classify else 'loss',
        greater_is_better=classify, prediction_loss_only=not classify, logging_steps=args.log_interval,
        seed=args.seed, report_to='none', disable_tqdm=True, use_cpu=cpu, remove_unused_columns=False,
        bf16=amp_dtype == 'bfloat16', fp16=amp_dtype == 'float16', torch_compile=args.torchcompile is not None,
        torch_compile_backend=args.torchcompile)


def _train(args, stop) -> Optional[Dict[str, float]]:
    """Data, model and ``Trainer`` from the flags; train, then save and evaluate the final model (rank 0 writes)."""
    from accelerate import PartialState
    from transformers import DataCollatorWithPadding, set_seed
    from mlp_vision.text.bigs import bigs_param_groups
    from mlp_vision.text.callbacks import DatasetEpoch, RunStops, StoppableTrainer
    from mlp_vision.text.labelled_data import classification_metrics
    resume = _resume_checkpoint(args.resume)
    distributed = PartialState(cpu=args.device == 'cpu' or not torch.cuda.is_available()).num_processes > 1
    output_dir = _output_dir(args, resume, distributed)
    classify = args.task == 'classify'
    set_seed(args.seed)  # the model's init (Trainer seeds again before training)
    model, train, val, test = (_classify_data if classify else _lm_data)(args, resume, distributed, stop)
    source = apply_recipe(args, model.config.model_type.removeprefix('mlp_vision_'), TASKS[args.task])
    if args.freeze_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    optimizer = None  # Trainer's AdamW; BiGS: AdamW over the official decay mask
    if model.config.model_type == 'mlp_vision_bigs':
        optimizer = torch.optim.AdamW(bigs_param_groups(model, args.weight_decay), lr=args.lr,
                                      betas=tuple(args.opt_betas), eps=args.opt_eps)
    # no processing_class: Trainer would copy the tokenizer's <pad> id into configs without that field (gMLP's), which
    # then do not load; the model's save_pretrained writes model.tokenizer into every checkpoint and the final folder
    n_labels = len(model.config.id2label) if classify else 0
    stops = RunStops(stop, args.stop_after_step)
    trainer = StoppableTrainer(
        stops=stops, callbacks=[DatasetEpoch(train)] if hasattr(train, 'epoch') else [], model=model,
        args=_training_arguments(args, output_dir, classify), train_dataset=train,
        data_collator=DataCollatorWithPadding(model.tokenizer) if classify else None,  # None: default_data_collator
        eval_dataset=val, optimizers=(optimizer, None),
        compute_metrics=(lambda p: classification_metrics(p.predictions.argmax(-1), p.label_ids, n_labels))
        if classify else None)
    _logger.info(f'Model {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.3f} M params), '
                 f'{len(train):,} training and {len(val):,} held-out {"examples" if classify else "blocks"} of '
                 f'<= {args.block_size} tokens; AdamW lr {args.lr:g} wd {args.weight_decay:g}, {args.warmup_steps} '
                 f'warmup then {args.sched} ({source}); output {output_dir}')
    try:
        trainer.train(resume_from_checkpoint=resume)
    except pickle.UnpicklingError as e:  # Trainer loads checkpoints with torch.load(weights_only=True)
        raise UsageError(f'--resume {resume}: {_unsafe_file(resume)} holds more than tensors and plain values, '
                         f'refused: loading it would run code from the file ({str(e).splitlines()[0]})') from None
    if stops.signum:
        # torchrun ends every rank once one exits: none leaves before rank 0 has written the stop's checkpoint
        trainer.accelerator.wait_for_everyone()
        raise Interrupted(stops.signum, message=f'interrupted by {signal.Signals(stops.signum).name}: checkpoint '
                          f'{stops.checkpoint} saved; continue with --resume {stops.checkpoint}')
    if stops.checkpoint:  # --stop-after-step
        _logger.info(f'stopped after step {args.stop_after_step}: continue with --resume {stops.checkpoint}')
        return None
    # the final model (classify: the best checkpoint's) and the run's whole log at the top of the run folder
    trainer.save_model(output_dir)
    trainer.save_state()
    metrics = trainer.evaluate()
    if not classify:
        metrics['eval_ppl'] = math.exp(min(metrics['eval_loss'], 700.))
    trainer.save_metrics('eval', metrics, combined=False)
    if test is not None:
        test_metrics = trainer.evaluate(test, metric_key_prefix='test')
        trainer.save_metrics('test', test_metrics, combined=False)
        metrics.update(test_metrics)
    return metrics if trainer.is_world_process_zero() else None


def _unsafe_file(checkpoint: str) -> str:
    """The first file of ``checkpoint`` that ``torch.load(weights_only=True)`` refuses, as Trainer loads them."""
    from transformers.trainer_pt_utils import safe_globals
    for path in sorted(Path(checkpoint).glob('*.pt*')):
        try:
            with safe_globals():
                torch.load(path, map_location='cpu', weights_only=True)
        except pickle.UnpicklingError:
            return str(path)
    return 'a file there'


if __name__ == '__main__':
    main(prog='python -m mlp_vision.train_text')
