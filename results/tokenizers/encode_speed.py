# Encoding Tiny Shakespeare (1.1 MB) with the byte / char tokenizers before (the hand-written ones of commit 7a0705c,
# saved to /tmp/tokexp/old_tokenizer.py by 'git show 7a0705c:mlp_vision/text/tokenizer.py') and after they became
# PreTrainedTokenizerFast objects. Run from the checkout root: OMP_NUM_THREADS=1 python results/tokenizers/encode_speed.py
import sys, time, importlib.util
sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.dirname(__import__('os').path.dirname(__import__('os').path.abspath(__file__)))))
import mlp_vision.text as mt
spec = importlib.util.spec_from_file_location('old_tokenizer', '/tmp/tokexp/old_tokenizer.py'); old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
text = open(__import__('os').path.join(__import__('os').path.dirname(__import__('os').path.abspath(__file__)), '..', '..', '..', 'shared', 'data', 'tinyshakespeare', 'input.txt')).read()  # ../shared beside the checkout
for name, new, prev in (('byte', mt.byte_tokenizer(), old.ByteTokenizer()), ('char', mt.char_tokenizer(set(text)), old.CharTokenizer(set(text)))):
    t = time.perf_counter(); a = new.encode(text, add_special_tokens=False); tn = time.perf_counter() - t
    t = time.perf_counter(); b = prev.encode(text); to = time.perf_counter() - t
    print(name, len(text), 'new %.2fs old %.2fs equal %s' % (tn, to, a == b))
for name, new in (('byte', mt.byte_tokenizer()), ('char', mt.char_tokenizer(set(text)))):
    b = new.backend_tokenizer; b.encode_special_tokens = True
    t = time.perf_counter(); ids = b.encode(text, add_special_tokens=False).ids; print(name, 'backend.encode %.2f' % (time.perf_counter() - t))
    lines = text.splitlines(keepends=True)
    t = time.perf_counter(); out = [i for e in b.encode_batch(lines, add_special_tokens=False) for i in e.ids]; print(name, 'encode_batch lines %.2f equal %s' % (time.perf_counter() - t, out == ids))
