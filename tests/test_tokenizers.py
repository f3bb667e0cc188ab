""" mlp_vision.text.tokenizer: byte / char / subword tokenizers, each a transformers PreTrainedTokenizerFast.

Covers: byte and char round trips; the BERT template (pairs, token types), longest-first truncation and right
padding, with errors for what cannot be done; a BERT vocab.txt read as WordPiece (greedy longest-match-first, as
BERT's example 'unaffable' -> un ##aff ##able), cased vs uncased detection and tokenizer_config.json's
do_lower_case; offline WordPiece / BPE training (special ids first, frequent words whole, BPE deterministic with an exact round
trip);
save_pretrained / load_tokenizer round trips, a tokenizer.json that makes tokenizers panic, and longest-first
truncation against the one-token-at-a-time rule. All data is made here.
"""
import json

import pytest
import torch

import mlp_vision.text as mt
from mlp_vision.errors import UsageError
from mlp_vision.text.tokenizer import find_tokenizer

CORPUS = [
    'the movie was good and the actors were great .',
    'the film was bad , the plot was boring and the ending was worse .',
    'a good film with a great cast and a good story .',
    'boring , slow and bad : the worst movie of the year .',
    'unaffable characters in an unremarkable film .',
] * 20


def bert_vocab(path, cased=False):
    words = ['the', 'movie', 'was', 'good', 'un', '##aff', '##able', '##s', 'a', '.', ',', 'film', 'great']
    if cased:
        words += ['The', 'Paris']
    specials = ['[PAD]', '[unused0]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
    path.write_text('\n'.join(specials + words) + '\n', encoding='utf-8')
    return specials + words


# ------------------------------------------------------------------------------------------------ byte / char


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_byte_and_char_tokenizers(tmp_path):
    tok = mt.byte_tokenizer()
    text = 'Thou art — naïve, 東京!'
    assert ids(tok, text) == list(text.encode('utf-8')) and tok.decode(ids(tok, text)) == text
    assert len(tok) == 260 and sorted(tok.all_special_ids) == [256, 257, 258, 259]
    assert (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id, tok.unk_token_id) == \
        (256, 257, 258, 259, None)
    assert tok.decode([tok.cls_token_id] + ids(tok, text) + [tok.pad_token_id], skip_special_tokens=True) == text
    assert ids(tok, '<mask>') == list(b'<mask>')  # special strings in text stay text for bytes
    assert tok.encode('<mask>', add_special_tokens=False, split_special_tokens=False) == [259]  # unless asked

    ct = mt.char_tokenizer('hello world', special_tokens=['<pad>', '<mask>'])
    assert len(ct) == 8 + 2 and [ct.convert_ids_to_tokens(i) for i in range(8)] == sorted(set('hello world'))
    assert ct.decode(ids(ct, 'low hello')) == 'low hello'
    with pytest.raises(Exception, match='Missing'):  # tokenizers' error: never dropped
        ids(ct, 'z')
    ct.save_pretrained(str(tmp_path))
    ct2 = mt.load_tokenizer(str(tmp_path))
    assert ct2.get_vocab() == ct.get_vocab() and mt.tokenizer_kind(ct2) == 'char' and ids(ct2, 'low') == ids(ct, 'low')
    cu = mt.char_tokenizer('abc', unk='<unk>')
    assert ids(cu, 'abz') == [0, 1, cu.unk_token_id] and cu.unk_token_id == 3


# ------------------------------------------------------------------------------------------------ template

def test_pairs_truncation_and_padding():
    tok = mt.byte_tokenizer()
    cls, sep, pad = tok.cls_token_id, tok.sep_token_id, tok.pad_token_id
    enc = tok('ab', 'xyz')
    assert enc['input_ids'] == [cls, 97, 98, sep, 120, 121, 122, sep]
    assert enc['token_type_ids'] == [0, 0, 0, 0, 1, 1, 1, 1] and enc['attention_mask'] == [1] * 8
    # longest first (the classifier's examples): 'abcdef' (6) and 'xy' (2) into 9 - 3 specials = 6 -> 4 + 2; ties
    # cut the first segment: 'abc' + 'xyz' into 5 -> 2 + 3
    assert tok('abcdef', 'xy', max_length=9, truncation=True)['input_ids'] == [cls, 97, 98, 99, 100, sep, 120, 121, sep]
    assert tok('abc', 'xyz', max_length=8, truncation=True)['input_ids'] == [cls, 97, 98, sep, 120, 121, 122, sep]
    batch = tok(['a', 'abc'], padding=True, return_tensors='pt')
    assert torch.equal(batch['input_ids'], torch.tensor([[cls, 97, sep, pad, pad], [cls, 97, 98, 99, sep]]))
    assert torch.equal(batch['attention_mask'], torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    fixed = tok('a', max_length=6, padding='max_length', return_tensors='pt', return_token_type_ids=False)
    assert set(fixed) == {'input_ids', 'attention_mask'} and fixed['input_ids'].shape == (1, 6)
    assert tok('ab', add_special_tokens=False)['input_ids'] == [97, 98]


def test_template_errors():
    tok = mt.byte_tokenizer()
    with pytest.raises(ValueError, match='padding=True'):
        tok(['a', 'abc'], return_tensors='pt')
    plain = mt.char_tokenizer('abc')  # a causal LM's tokenizer: no specials at all
    assert plain('abc')['input_ids'] == [0, 1, 2] and plain.num_special_tokens_to_add(pair=True) == 0
    with pytest.raises(ValueError, match='padding token'):
        plain(['a', 'ab'], padding=True)


# ------------------------------------------------------------------------------------------------ vocab.txt

def test_bert_vocab_txt_wordpiece_uncased(tmp_path):
    vocab = bert_vocab(tmp_path / 'vocab.txt')
    tok = mt.load_tokenizer(str(tmp_path))
    assert mt.tokenizer_kind(tok) == 'subword' and tok.init_kwargs['do_lower_case'] is True and len(tok) == len(vocab)
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == \
        (0, 2, 3, 4, 5)
    got = ids(tok, 'The MOVIE was unaffable.')
    assert tok.convert_ids_to_tokens(got) == ['the', 'movie', 'was', 'un', '##aff', '##able', '.']
    assert got == [vocab.index(t) for t in ('the', 'movie', 'was', 'un', '##aff', '##able', '.')]
    assert tok.decode(got) == 'the movie was unaffable.'
    assert tok.convert_ids_to_tokens(ids(tok, 'zebra')[0]) == '[UNK]'
    enc = tok('the movie', 'was good', return_tensors='pt')
    assert enc['input_ids'].tolist() == [[3, 6, 7, 4, 8, 9, 4]] and enc['token_type_ids'].tolist() == [[0] * 4 + [1] * 3]
    assert ids(tok, 'the [MASK] .') == [6, 5, 15]  # special tokens are recognised whole in subword text


def test_vocab_case_detection_and_tokenizer_config(tmp_path):
    bert_vocab(tmp_path / 'vocab.txt', cased=True)
    tok = mt.load_tokenizer(str(tmp_path))
    assert tok.init_kwargs['do_lower_case'] is False
    assert tok.convert_ids_to_tokens(ids(tok, 'The the Paris')) == ['The', 'the', 'Paris']
    (tmp_path / 'tokenizer_config.json').write_text(json.dumps({'do_lower_case': True}))
    lowered = mt.load_tokenizer(str(tmp_path))  # the config overrides what the vocabulary suggests
    assert lowered.init_kwargs['do_lower_case'] is True and lowered.convert_ids_to_tokens(ids(lowered, 'The')) == ['the']


def test_missing_tokenizer_is_reported(tmp_path):
    assert find_tokenizer(str(tmp_path)) is None
    with pytest.raises(FileNotFoundError, match='holds no tokenizer'):
        mt.load_tokenizer(str(tmp_path))
    (tmp_path / 'vocab.txt').write_text('a\nb\n')
    with pytest.raises(ValueError, match='unknown-word token'):
        mt.load_tokenizer(str(tmp_path))


def test_a_tokenizer_file_that_makes_tokenizers_panic_names_the_file(tmp_path):
    """Issue 33: a BPE ``continuing_subword_prefix`` longer than its pieces makes ``tokenizers`` panic while loading
    (``PanicException``, a BaseException); the reader turns it into one line naming the file."""
    tok = mt.train_tokenizer(texts=CORPUS, kind='bpe', vocab_size=300)
    tok.save_pretrained(str(tmp_path))
    spec = json.loads((tmp_path / 'tokenizer.json').read_text())
    spec['model']['continuing_subword_prefix'] = 'abcdefgh'
    (tmp_path / 'tokenizer.json').write_text(json.dumps(spec))
    for path in (tmp_path, tmp_path / 'tokenizer.json'):
        with pytest.raises(UsageError, match=f'{tmp_path / "tokenizer.json"} is not a tokenizer file this package '
                                             f'reads .PanicException: range end index'):
            mt.load_tokenizer(str(path))


# ------------------------------------------------------------------------------------------------ training

@pytest.mark.parametrize('kind', ['wordpiece', 'bpe'])
def test_train_subword_vocabulary(kind, tmp_path):
    size = 120 if kind == 'wordpiece' else 300  # byte-level BPE always holds the 256 bytes
    tok = mt.train_tokenizer(texts=CORPUS, kind=kind, vocab_size=size, min_frequency=2)
    assert len(tok) == size  # this corpus has enough merges to fill it
    assert [tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id] == [0, 1, 2, 3, 4]
    assert sorted(tok.all_special_ids) == [0, 1, 2, 3, 4]
    text = 'the movie was good .'
    got = ids(tok, text)
    assert tok.decode([got[0]]).strip() == 'the' and len(got) <= len(text) / 2  # merged, the most frequent word whole
    assert tok.unk_token_id not in got
    assert tok.decode(got) == (text if kind == 'bpe' else 'the movie was good.')  # BERT's decoder drops ' .'
    corpus = tmp_path / 'corpus.txt'
    corpus.write_text('\n'.join(CORPUS), encoding='utf-8')
    from_file = mt.train_tokenizer(files=[str(corpus)], kind=kind, vocab_size=size, min_frequency=2)
    assert from_file.convert_ids_to_tokens(ids(from_file, text)) == tok.convert_ids_to_tokens(got)
    if kind == 'bpe':
        odd = 'Zébra 東京!'  # byte level: any text, no unknown token, exact round trip
        assert tok.decode(ids(tok, odd)) == odd.lower()
        again = mt.train_tokenizer(texts=CORPUS, kind=kind, vocab_size=size, min_frequency=2)
        assert again.get_vocab() == tok.get_vocab()  # BPE training is deterministic
    # saved beside a checkpoint and reloaded: the same ids
    tok.save_pretrained(str(tmp_path / 'ckpt'))
    loaded = mt.load_tokenizer(str(tmp_path / 'ckpt'))
    assert ids(loaded, text) == got and loaded.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert loaded('the movie', 'was good') == tok('the movie', 'was good')


def test_train_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match='kind must be'):
        mt.train_tokenizer(texts=CORPUS, kind='unigram')
    with pytest.raises(ValueError, match='exactly one'):
        mt.train_tokenizer()
    with pytest.raises(ValueError, match='vocab_size must be >= 6 .room for text tokens'):
        mt.train_tokenizer(texts=CORPUS, vocab_size=5)
    with pytest.raises(ValueError, match='must be >= 262 .byte-level BPE keeps the 256 bytes'):
        mt.train_tokenizer(texts=CORPUS, kind='bpe', vocab_size=200)
    with pytest.raises(FileNotFoundError):
        mt.train_tokenizer(files=[str(tmp_path / 'missing.txt')])
