""" Fill-mask on an official-BiGS-layout folder and on our saved folders (function and CLI), and from_official
picking up the folder's tokenizer and config.json.

The official folder is made here: a tiny random BiGS written in the official key layout as ``pytorch_model.bin``
(torch pickle of tensors), an official-style ``config.json`` and a BERT ``vocab.txt``.
"""
import json

import pytest
import torch

import mlp_vision.text as mt
import mlp_vision.text.fill_mask as fm
from mlp_vision.text.bigs import _EMBEDDING_KEYS, _LAYER_KEYS, _MLM_KEYS

VOCAB = ['[PAD]', '[unused0]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'movie', 'was', 'good', 'bad', '.',
         'film', 'great', 'boring', 'a', 'un', '##able', 'is', 'and']


def official_state_dict(model: mt.BiGSForMaskedLM) -> dict:
    """Our BiGS masked LM in the official key layout (the inverse of convert_official_bigs_state_dict)."""
    ours = model.state_dict()
    sd = {theirs: ours[mine] for theirs, mine in {**_EMBEDDING_KEYS, **_MLM_KEYS}.items()}
    for i in range(model.config.num_hidden_layers):
        for theirs, mine in _LAYER_KEYS.items():
            sd[f'bigs.encoder.layer.{i}.{theirs}'] = ours[f'bigs.layers.{i}.{mine}']
    sd['cls.predictions.decoder.weight'] = sd['bigs.embeddings.word_embeddings.weight']
    sd['cls.predictions.decoder.bias'] = sd['cls.predictions.bias']
    sd['bigs.embeddings.position_ids'] = torch.arange(model.config.max_position_embeddings)[None]
    return sd


def make_official_folder(path, favourite='good', seed=0):
    """A tiny official-layout BiGS folder whose MLM strongly prefers ``favourite``; returns our equivalent model."""
    torch.manual_seed(seed)
    model = mt.create_model('bigs_small', vocab_size=len(VOCAB), pad_token_id=0, hidden_size=16,
                            intermediate_size=24, num_hidden_layers=2, num_ssm_states=4, max_position_embeddings=32)
    with torch.no_grad():
        model.output_bias[VOCAB.index(favourite)] = 8.0
    path.mkdir(parents=True, exist_ok=True)
    torch.save(official_state_dict(model), path / 'pytorch_model.bin')
    config = {'architectures': ['BiGSForMaskedLM'], 'model_type': 'BiGS', 'vocab_size': len(VOCAB),
              'hidden_size': 16, 'num_hidden_layers': 2, 'intermediate_size': 24, 'max_position_embeddings': 32,
              'type_vocab_size': 2, 'num_ssm': 4, 'hidden_dropout_prob': 0.0, 'layer_norm_eps': 1e-12,
              'pad_token_id': 0, 'initializer_range': 0.02, 'classifier_dropout': None, 'hidden_act': 'gelu',
              'pooler_type': 'non_padding_mean'}
    (path / 'config.json').write_text(json.dumps(config))
    (path / 'vocab.txt').write_text('\n'.join(VOCAB) + '\n')
    return model.eval()


def test_from_official_folder_brings_its_tokenizer(tmp_path):
    ref = make_official_folder(tmp_path / 'BiGS')
    model = mt.BiGSForMaskedLM.from_official(str(tmp_path / 'BiGS')).eval()
    tok = model.tokenizer
    assert mt.tokenizer_kind(tok) == 'subword' and tok.init_kwargs['do_lower_case'] and tok.mask_token_id == 5
    assert model.config.hidden_dropout_prob == 0.0 and model.config.pad_token_id == 0  # from config.json
    enc = tok('The movie was good .', return_tensors='pt')
    assert enc['input_ids'].tolist() == [[3, 6, 7, 8, 9, 11, 4]]
    with torch.no_grad():
        torch.testing.assert_close(model(**enc).logits, ref(**enc).logits, rtol=0, atol=1e-6)
    # a config.json of other weights is refused
    cfg = json.loads((tmp_path / 'BiGS' / 'config.json').read_text())
    (tmp_path / 'BiGS' / 'config.json').write_text(json.dumps({**cfg, 'hidden_size': 1024}))
    with pytest.raises(ValueError, match='hidden_size=1024 but the weights have 16'):
        mt.BiGSForMaskedLM.from_official(str(tmp_path / 'BiGS'))


def test_fill_mask_cli_on_official_folder(tmp_path, capsys):
    ref = make_official_folder(tmp_path / 'BiGS')
    results = fm.main([str(tmp_path / 'BiGS'), 'The movie was [MASK] . A [MASK] film', '--top-k', '3'])
    printed = capsys.readouterr().out
    assert len(results) == 2 and all(len(r) == 3 for r in results)
    # the same numbers computed directly: uncased ids, <cls> ... <sep>, softmax at the mask positions
    ids = torch.tensor([[3, 6, 7, 8, 5, 11, 15, 5, 12, 4]])
    with torch.no_grad():
        probs = ref(ids).logits[0, [4, 7]].softmax(-1)
    for row, p in zip(results, probs):
        top = p.topk(3)
        assert [r['token_id'] for r in row] == top.indices.tolist()
        assert [r['token'] for r in row] == [VOCAB[i] for i in top.indices.tolist()]
        torch.testing.assert_close(torch.tensor([r['score'] for r in row]), top.values, rtol=1e-5, atol=1e-6)
    assert results[0][0]['token'] == 'good' and results[0][0]['score'] > 0.9  # the favourite of make_official_folder
    assert 'mask 1:' in printed and 'mask 2:' in printed and "'good'" in printed


def test_official_folder_tokenizer_regex_needs_the_opt_in(tmp_path, capsys):
    """An official BiGS folder whose tokenizer.json holds a regex: refused (one line naming the file and the flag)
    by fill-mask and --init-from alike, read with --allow-regex (allow_regex=True in Python)."""
    from _helpers import exits_with_one_line
    folder = tmp_path / 'BiGS'
    make_official_folder(folder)
    payload = json.loads(mt.load_tokenizer(str(folder)).backend_tokenizer.to_str())
    payload['pre_tokenizer'] = {'type': 'Sequence', 'pretokenizers': [
        {'type': 'Split', 'pattern': {'Regex': '(a+)+$'}, 'behavior': 'Isolated', 'invert': False},
        payload['pre_tokenizer']]}
    (folder / 'tokenizer.json').write_text(json.dumps(payload))
    msg = exits_with_one_line(fm.main, [str(folder), 'The movie was [MASK] .'], capsys)
    assert f"{folder / 'tokenizer.json'}: pre_tokenizer.pretokenizers[0].pattern is the regular expression" in msg
    assert '--allow-regex' in msg
    with pytest.raises(ValueError, match='regular expression'):
        mt.BiGSForSequenceClassification.from_official(str(folder))
    results = fm.main([str(folder), 'The movie was [MASK] .', '--allow-regex', '--top-k', '1'])
    assert results[0][0]['token'] == 'good'
    model = mt.BiGSForSequenceClassification.from_official(str(folder), allow_regex=True)
    assert model.tokenizer is not None and len(model.tokenizer) == len(VOCAB)


def test_fill_mask_on_our_saved_folder(tmp_path):
    torch.manual_seed(0)
    tok = mt.byte_tokenizer()
    model = mt.create_model('amlp_base', vocab_size=tok.vocab_size, num_hidden_layers=1, hidden_size=16,
                            intermediate_size=32, tiny_attention_size=8, max_position_embeddings=32).eval()
    model.save_pretrained(str(tmp_path / 'ours'), tokenizer=tok)
    results = fm.main([str(tmp_path / 'ours'), 'the movie was g<mask>od', '--top-k', '2'])
    ids = torch.tensor([tok.encode('the movie was g<mask>od', split_special_tokens=False)])
    with torch.no_grad():
        top = model(ids).logits[0, 16].softmax(-1).topk(2)
    assert [r['token_id'] for r in results[0]] == top.indices.tolist()


def _usage_error(argv, capsys) -> str:
    """``fm.main(argv)`` must exit with status 2 and exactly one line on stderr (no traceback); returns it."""
    with pytest.raises(SystemExit) as e:
        fm.main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [e.value.message]
    return e.value.message


def test_fill_mask_errors(tmp_path, capsys):
    make_official_folder(tmp_path / 'BiGS')
    assert 'no mask token [MASK]' in _usage_error([str(tmp_path / 'BiGS'), 'the movie was good .'], capsys)
    assert 'more than the model' in _usage_error([str(tmp_path / 'BiGS'), 'the ' * 40 + '[MASK]'], capsys)
    (tmp_path / 'BiGS' / 'vocab.txt').unlink()
    assert 'holds no tokenizer' in _usage_error([str(tmp_path / 'BiGS'), 'the [MASK]'], capsys)
    gpt = mt.create_model('gpt_sdpa', num_hidden_layers=1, hidden_size=16, num_attention_heads=2)
    gpt.save_pretrained(str(tmp_path / 'gpt'), tokenizer=mt.char_tokenizer('abc'))
    assert 'not a masked LM' in _usage_error([str(tmp_path / 'gpt'), 'a<mask>'], capsys)
    assert 'is not a folder' in _usage_error([str(tmp_path / 'missing'), 'a [MASK]'], capsys)


def test_a_folder_that_is_neither_layout_is_one_line_from_both_commands(tmp_path, capsys):
    """A folder without our config.json whose weights file is not an official checkpoint (random bytes; a pickle that
    would run code): fill-mask and the text trainer's --init-from both stop with the one line naming the folder."""
    import os
    import pickle
    import mlp_vision.train_text as text_train
    from _helpers import exits_with_one_line
    from mlp_vision.errors import UsageError
    from mlp_vision.text.fill_mask import load_masked_lm
    marker = tmp_path / 'payload-ran'

    class Payload:
        def __reduce__(self):  # unpickling it would create the marker file
            return (open, (str(marker), 'w'))

    for name, content in (('random', os.urandom(64)), ('pickle', pickle.dumps(Payload()))):
        folder = tmp_path / name
        folder.mkdir()
        (folder / 'pytorch_model.bin').write_bytes(content)
        with pytest.raises(UsageError, match=f'^{folder} is neither a save_pretrained folder nor an official BiGS'):
            load_masked_lm(str(folder))
        data = tmp_path / 'train.tsv'
        data.write_text('sentence\tlabel\n' + 'a good film\t1\na bad film\t0\n' * 4)
        msg = exits_with_one_line(text_train.main, [
            '--task', 'classify', '--train-file', str(data), '--val-file', str(data), '--init-from', str(folder),
            '--steps', '1', '--output', str(tmp_path / 'out'), '--experiment', name], capsys)
        assert f'--init-from {folder} is neither a save_pretrained folder nor an official BiGS folder' in msg
    assert not marker.exists()
