""" Fill-mask: the most likely tokens, with probabilities, at each mask token of a text.

    python -m mlp_vision.text.fill_mask DIR "the movie was [MASK] ." [--top-k 5] [--device cpu]

``DIR``: a ``save_pretrained`` folder of a masked LM with its tokenizer (a masked-LM run folder or one of its
``checkpoint-N/``), or an official BiGS folder (:meth:`BiGSForMaskedLM.from_official`). The mask token is the
tokenizer's (``[MASK]``, ``<mask>``); the text gets the template ``<cls> text <sep>`` and each mask predicts one
token (BERT arXiv 1810.04805 §3.1). Bad input is one line and exit status 2 (``UsageError`` from Python)::

    model = load_masked_lm('BiGS_512/')
    fill_mask(model, model.tokenizer, 'the movie was [MASK] .', top_k=5)
    # [[{'token_id': 2204, 'token': 'good', 'score': 0.31}, ...]]   one list per mask, best first
"""
import os
import sys
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn as nn

from mlp_vision.arguments import ArgumentParser, DefaultsHelpFormatter, add_allow_regex_argument, check_range, \
    parse_device
from mlp_vision.bounds import add_bound_arguments, size_bounds
from mlp_vision.errors import UsageError, run_cli
from .modeling_utils import check_text_activations, is_saved_folder
from .registry import list_architectures, load_config
from .tokenizer import Tokenizer
from ..threads import add_threads_argument, set_threads

__all__ = ['fill_mask', 'load_masked_lm', 'main']

PROG = 'python -m mlp_vision.text.fill_mask'


def load_masked_lm(directory: str, device: str = 'cpu', allow_regex: bool = False) -> nn.Module:
    """The masked LM in ``directory`` with its tokenizer as ``model.tokenizer`` (our format, else official BiGS).
    ``allow_regex``: a save_pretrained folder's ``tokenizer.json`` may hold a regular expression (refused otherwise).

    Bad input is a :class:`~mlp_vision.errors.UsageError` (a ``ValueError``) naming the file: a missing
    folder, damaged files, a config that does not fit its weights or its tokenizer, a model that is not a masked LM.
    """
    from .bigs import BiGSForMaskedLM, from_official_folder
    if not os.path.isdir(directory):
        raise UsageError(f'{directory} is not a folder; expected a save_pretrained folder of a masked LM (a text '
                         f'run folder) or an official BiGS folder')
    if is_saved_folder(directory):
        cls, _ = load_config(directory)
        if not cls.__name__.endswith('ForMaskedLM'):
            masked = [a for a in list_architectures() if a.endswith('ForMaskedLM')]
            raise UsageError(f'{directory} holds a {cls.__name__}, not a masked LM ({", ".join(masked)})')
        model = cls.from_pretrained(directory, device=device, allow_regex=allow_regex)
    else:
        model = from_official_folder(BiGSForMaskedLM, directory, directory, device=device, allow_regex=allow_regex)
    if model.tokenizer is None:
        raise UsageError(f'{directory} holds no tokenizer (tokenizer_config.json, tokenizer.json or vocab.txt); '
                         f'fill-mask needs the one the model was trained with')
    return model


def _token_string(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False) or tokenizer.convert_ids_to_tokens(token_id)


@torch.no_grad()
def fill_mask(model: nn.Module, tokenizer: Tokenizer, text: str, top_k: int = 5) -> List[List[Dict]]:
    """Top ``top_k`` predictions at each mask token of ``text``: one list per mask (left to right) of
    ``{'token_id', 'token', 'score'}`` dicts, best first (``score`` is the softmax probability)."""
    check_range('top_k', top_k, low=1)
    try:  # a command-line argument of bytes that are not UTF-8 arrives with surrogate escapes (PEP 383)
        text.encode('utf-8')
    except UnicodeEncodeError as e:
        raise UsageError(f'the text is not UTF-8: character {e.start} is {text[e.start]!r} (a byte that is not UTF-8, '
                         f'passed on as an escape); give UTF-8 text') from None
    mask_token, mask_id = tokenizer.mask_token, tokenizer.mask_token_id
    if mask_token is None or mask_id is None:
        raise UsageError(f'{type(tokenizer).__name__} has no mask token; fill-mask needs a masked-LM tokenizer')
    if mask_token not in text:
        raise UsageError(f'the text has no mask token {mask_token}: {text!r}')
    # special-token strings in the text are tokens here (the byte / char tokenizers otherwise read them as text),
    # as in transformers' fill-mask pipeline: the text around each one is encoded on its own
    input_ids = tokenizer(text, split_special_tokens=False)['input_ids']
    max_length = model.config.max_position_embeddings
    if len(input_ids) > max_length:
        raise UsageError(f'the text is {len(input_ids)} tokens long, more than the model\'s maximum {max_length}')
    if max(input_ids) >= model.config.vocab_size:
        raise UsageError(f'the tokenizer produced id {max(input_ids)} but the model has {model.config.vocab_size} '
                         f'tokens: tokenizer and model do not belong together')
    check_text_activations(type(model), model.config, 1, len(input_ids), False, 'fill-mask')
    positions = [i for i, t in enumerate(input_ids) if t == mask_id]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        logits = model(torch.tensor([input_ids], device=device)).logits[0, positions]  # (masks, V)
    finally:
        model.train(was_training)
    scores, top = logits.float().softmax(dim=-1).topk(min(top_k, logits.shape[-1]), dim=-1)
    return [[{'token_id': int(i), 'token': _token_string(tokenizer, int(i)), 'score': float(p)}
             for p, i in zip(row_scores, row_ids)] for row_scores, row_ids in zip(scores, top)]


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> List[List[Dict]]:
    """Print the predictions; returns them. Errors: one line starting with ``prog`` (the name the command was run
    as: ``mlp-vision-fill-mask`` for the console script) and exit status 2 (see ``run_cli``)."""
    return run_cli(prog, lambda a: _main(a, prog), argv)


def _main(argv: Sequence[str], prog: str) -> List[List[Dict]]:
    parser = ArgumentParser(  # the one error path of every command: one line, status 2
        prog=prog, description='Print the most likely tokens and their probabilities at each mask token of a text.',
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument('directory', help='a save_pretrained folder of a masked LM, or an official BiGS folder')
    parser.add_argument('text', help='text with one or more mask tokens ([MASK] for BERT vocabularies)')
    parser.add_argument('--top-k', type=int, default=5, help='predictions per mask')
    parser.add_argument('--device', default='cpu', help='torch device')
    add_threads_argument(parser)
    parser.add_argument('--debug', action='store_true', help='show the traceback of an error, not its one line')
    add_bound_arguments(parser)
    add_allow_regex_argument(parser)
    args = parser.parse_args(argv)
    check_range('--top-k', args.top_k, low=1)
    set_threads(args.threads)  # not printed: stdout is the predictions
    device = parse_device(args.device)
    with size_bounds(args):
        model = load_masked_lm(args.directory, device=str(device), allow_regex=args.allow_regex)
        results = fill_mask(model, model.tokenizer, args.text, top_k=args.top_k)
    print(f'{args.text}   ({type(model).__name__}, {model.config.vocab_size} tokens)')
    for n, predictions in enumerate(results, 1):
        print(f'mask {n}:')
        for rank, p in enumerate(predictions, 1):
            print(f'  {rank:2d}. {p["token"]!r:<20} {p["score"]:.4f}')
    return results


if __name__ == '__main__':
    main(sys.argv[1:])
