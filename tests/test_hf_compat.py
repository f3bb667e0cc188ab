""" Hugging Face interoperability (needs ``transformers``, a test-only dependency; skipped without it):
``transformers.Trainer`` fine-tunes our sequence classifiers, our outputs index like its ``ModelOutput``, and
``AutoTokenizer`` reads our saved subword tokenizers with the same ids. Data is made here.
"""
import pytest
import torch

import mlp_vision.text as mt

transformers = pytest.importorskip('transformers', reason='transformers is not installed (test-only dependency)')
pytest.importorskip('accelerate', reason='transformers.Trainer needs accelerate')

WORDS = ['good', 'great', 'fine', 'bad', 'awful', 'poor']


def sentiment_dataset(tokenizer, n=64, seed=0):
    """Sentences whose label is whether they hold more of the first three words than of the last three."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        label = int(torch.randint(2, (1,), generator=g))
        picks = torch.randint(3, (4,), generator=g) + (0 if label else 3)
        noise = torch.randint(6, (2,), generator=g)
        words = [WORDS[i] for i in picks.tolist() + noise.tolist()]
        order = torch.randperm(len(words), generator=g).tolist()
        enc = tokenizer(' '.join(words[i] for i in order), max_length=32, truncation=True, padding='max_length',
                        return_tensors='pt', return_token_type_ids=False)
        rows.append({'input_ids': enc['input_ids'][0], 'attention_mask': enc['attention_mask'][0],
                     'labels': torch.tensor(label)})
    return rows


@pytest.mark.parametrize('name', ['gmlp_base', 'bigs_small'])
def test_transformers_trainer_fine_tunes_our_classifier(name, tmp_path, single_thread):
    torch.manual_seed(0)
    tok = mt.byte_tokenizer()
    small = dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                 max_position_embeddings=32, classifier_dropout=0.0)
    if name == 'bigs_small':
        small.update(pad_token_id=tok.pad_token_id, num_ssm_states=8, hidden_dropout_prob=0.0)
    model = mt.create_model(name, task='sequence_classification', num_labels=2, **small)
    data = sentiment_dataset(tok)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=40, per_device_train_batch_size=16, learning_rate=5e-3,
        warmup_steps=0, weight_decay=0.0, logging_steps=1, save_strategy='no', report_to=[], use_cpu=True,
        seed=0, disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [e['loss'] for e in trainer.state.log_history if 'loss' in e]
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 0.6 and last < 0.5 * first, (first, last)  # from ~ln 2 to well below it
    # the trained model still is ours: predictions through our forward
    preds = trainer.predict(data[:16])
    assert preds.predictions.shape == (16, 2)
    batch = torch.stack([r['input_ids'] for r in data[:16]])
    mask = torch.stack([r['attention_mask'] for r in data[:16]])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(preds.predictions), model(batch, attention_mask=mask).logits,
                                   rtol=1e-4, atol=1e-5)


def test_outputs_are_transformers_output_types():
    from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput, SequenceClassifierOutput
    torch.manual_seed(0)
    small = dict(hidden_size=8, num_hidden_layers=1, intermediate_size=16, max_position_embeddings=8, vocab_size=20)
    x = torch.randint(20, (2, 5))
    for name, task, output_type in (('gmlp_base', None, MaskedLMOutput),
                                    ('gmlp_base', 'sequence_classification', SequenceClassifierOutput),
                                    ('gmlp_causal_char', None, CausalLMOutput)):
        model = mt.create_model(name, task=task, **small).eval()
        out = model(x)
        assert type(out) is output_type and list(out.keys()) == ['logits'] and out[0] is out.logits
        labels = torch.zeros(2, dtype=torch.long) if task else x
        out = model(x, labels=labels)
        assert out[0] is out.loss and model(x, return_dict=False)[0].shape == out.logits.shape


def test_auto_tokenizer_reads_our_saved_subword_tokenizer(tmp_path):
    corpus = ['the movie was good and the actors were great .', 'a bad film , boring and slow .'] * 30
    tok = mt.train_tokenizer(texts=corpus, kind='wordpiece', vocab_size=80)
    tok.save_pretrained(str(tmp_path))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for a, b in (('the movie was good .', None), ('a boring film', 'the actors were great')):
        ours = tok(a, b)
        theirs = hf(a, b)
        assert ours['input_ids'] == theirs['input_ids']
        assert ours['token_type_ids'] == theirs['token_type_ids']
    assert (hf.pad_token_id, hf.mask_token_id, hf.cls_token_id) == (tok.pad_token_id, tok.mask_token_id, tok.cls_token_id)
