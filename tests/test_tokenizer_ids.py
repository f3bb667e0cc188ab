""" The tokenizers give the ids they gave before they were ``transformers.PreTrainedTokenizerFast`` objects.

tests/fixtures/tokenizer_ids/ids.json was written by make_fixture.py beside it with the hand-written tokenizers of
commit 7a0705c: ids without special tokens, BERT-template pairs, longest-first truncation, right padding and decodes
for byte, char, WordPiece (a BERT vocab.txt and a trained vocabulary) and byte-level BPE tokenizers, on texts with
non-ASCII characters and special-token strings, and on 600-character slices of the study corpora (those checks skip
when ../shared/data is absent). Each tokenizer is rebuilt three ways: from the folder that code's save_pretrained
wrote, from the checkpoint dict it stored in runs, and (byte, char, BPE, vocab.txt) by building or training it now.
"""
import json
import os
from pathlib import Path

import pytest

import mlp_vision.text as mt
from mlp_vision.text.tokenizer import _longest_first, encode_with_template, tokenizer_from_dict

FIXTURE = Path(__file__).resolve().parent / 'fixtures' / 'tokenizer_ids'
DATA = Path(os.environ.get('MLP_VISION_DATA', Path(__file__).resolve().parents[2] / 'shared' / 'data'))
RECORDED = json.loads((FIXTURE / 'ids.json').read_text(encoding='utf-8'))
PAIRS = [('the movie', 'was good'), ('ab', 'xyz'), ('abcdef', 'xy'), ('abc', 'xyz'), ('naïve café', '東京 é')]
CORPUS_FILES = {'tinyshakespeare': 'tinyshakespeare/input.txt', 'wikitext-2': 'wikitext-2/valid.txt',
                'rt-polarity': 'rt-polarity/dev.tsv'}
CORPUS = [
    'the movie was good and the actors were great .', 'the film was bad , the plot was boring and the ending was worse .',
    'a good film with a great cast and a good story .', 'boring , slow and bad : the worst movie of the year .',
    'unaffable characters in an unremarkable film . Zébra café naïve', ] * 20


def _built_now(name):
    """The tokenizer made today the way make_fixture.py made it (None where training is not reproducible)."""
    chars = ''.join(mt.load_tokenizer(str(FIXTURE / 'char_lm')).get_vocab())
    return {
        'byte_mlm': lambda: mt.byte_tokenizer(),
        'byte_lm': lambda: mt.byte_tokenizer(()),
        'char_lm': lambda: mt.char_tokenizer(chars),
        'char_mlm_unk': lambda: mt.char_tokenizer(chars, ('<pad>', '<cls>', '<sep>', '<mask>'), unk='<unk>'),
        'wordpiece_vocab_txt': lambda: mt.load_tokenizer(str(FIXTURE / 'vocab.txt')),
        'wordpiece_trained': lambda: None,  # WordPiece training is not reproducible run to run (train_tokenizer)
        'bpe_trained': lambda: mt.train_tokenizer(texts=CORPUS, kind='bpe', vocab_size=300),
    }[name]()


def _ways(name):
    recorded = RECORDED['tokenizers'][name]
    ways = {'folder': mt.load_tokenizer(str(FIXTURE / name)),
            'checkpoint dict': tokenizer_from_dict(recorded['checkpoint_dict']), 'built now': _built_now(name)}
    return recorded, {k: v for k, v in ways.items() if v is not None}


def _as_lists(enc):
    return {k: list(v) for k, v in enc.items()}


@pytest.mark.parametrize('name', sorted(RECORDED['tokenizers']))
def test_same_ids_as_the_hand_written_tokenizers(name):
    recorded, ways = _ways(name)
    for way, tok in ways.items():
        texts = recorded['texts']
        assert len(tok) == recorded['vocab_size'], way
        assert [tok.encode(t, add_special_tokens=False) for t in texts] == recorded['encode'], way
        decoded = [tok.decode(tok.encode(t, add_special_tokens=False), skip_special_tokens=True) for t in texts]
        assert decoded == recorded['decode'], way
        if 'pairs' not in recorded:  # no special tokens: the template adds nothing
            assert [_as_lists(tok(t)) for t in texts] == recorded['single'], way
            continue
        assert [_as_lists(tok(a, b)) for a, b in PAIRS] == recorded['pairs'], way
        lengths = [n for _ in PAIRS for n in (5, 6, 7, 8, 9) if n > tok.num_special_tokens_to_add(pair=True)]
        truncated = [encode_with_template(tok, [a], [b], n)[0][0]
                     for a, b in PAIRS for n in (5, 6, 7, 8, 9) if n > tok.num_special_tokens_to_add(pair=True)]
        assert len(truncated) == len(lengths) and truncated == recorded['truncated'], way
        firsts = [a for a, _ in PAIRS]
        ids, types = encode_with_template(tok, firsts, None, 12)
        padded = _as_lists(tok(firsts, max_length=12, truncation=True, padding='max_length'))
        assert padded == recorded['padded'] and ids == [
            [i for i, m in zip(row, mask) if m] for row, mask in zip(padded['input_ids'], padded['attention_mask'])]
        assert _as_lists(tok([b for _, b in PAIRS], padding=True)) == recorded['longest'], way


@pytest.mark.parametrize('name', sorted(RECORDED['tokenizers']))
def test_same_ids_on_the_study_corpora(name):
    missing = [c for c in CORPUS_FILES if not (DATA / CORPUS_FILES[c]).is_file()]
    if missing:
        pytest.skip(f'the study corpora are not under {DATA} (missing {missing})')
    recorded, ways = _ways(name)
    for corpus, expected in recorded['corpora'].items():
        text = (DATA / CORPUS_FILES[corpus]).read_text(encoding='utf-8')[:RECORDED['slice_chars']]
        for way, tok in ways.items():
            assert tok.encode(text, add_special_tokens=False) == expected, (corpus, way)


def test_longest_first_is_the_one_token_at_a_time_rule():
    def one_at_a_time(n_a, n_b, budget):
        while n_a + n_b > budget:
            if n_a > n_b:
                n_a -= 1
            else:
                n_b -= 1
        return n_a, n_b
    for n_a in range(12):
        for n_b in range(12):
            for budget in range(1, 14):
                assert _longest_first(n_a, n_b, budget) == one_at_a_time(n_a, n_b, budget), (n_a, n_b, budget)
