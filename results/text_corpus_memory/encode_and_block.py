import sys

from mlp_vision.text.training_data import build_tokenizer, encode_text, lm_blocks
text = open(sys.argv[1] if len(sys.argv) > 1 else '/tmp/mem/corpus.txt').read()
tok = build_tokenizer('char', 'causal', text)
ids = encode_text(tok, text, 'corpus')
blocks = lm_blocks(ids, 128, 'causal', tok, 'corpus')
print(len(blocks))
