"""Package modules whose code runs from argv until the first optimizer step of train.py."""
import sys, os, runpy, torch
root = os.path.abspath(sys.argv[1]); sys.argv = [os.path.join(root, 'train.py')] + sys.argv[2:]
sys.path.insert(0, root)
seen = []
class Done(Exception): pass
orig = torch.optim.Optimizer.step if hasattr(torch.optim.Optimizer,'step') else None
def tracer(frame, event, arg):
    if event == 'call':
        f = frame.f_code.co_filename
        if f.startswith(os.path.join(root, 'mlp_vision')) or f == sys.argv[0]:
            rel = os.path.relpath(f, root)
            if not seen or seen[-1] != rel: seen.append(rel)
        if frame.f_code.co_name == 'step' and 'torch/optim' in f:
            raise Done
    return None
sys.setprofile(tracer)
try:
    runpy.run_path(sys.argv[0], run_name='__main__')
except Done:
    pass
except SystemExit:
    pass
finally:
    sys.setprofile(None)
uniq = list(dict.fromkeys(seen))
print(len(uniq), 'modules;', len(seen), 'visits')
for m in uniq: print(' ', m, sum(1 for s in seen if s == m))
