"""Parameters and fvcore MACs of every registered vision model at 224x224 (tab-separated, to stdout).

fvcore counts one multiply-accumulate as one flop, which is what both vision papers call FLOPs. Its stock
aten::matmul handle multiplies only the first operand's shape by the last output dim, so it drops broadcast
batch dimensions (sMLP's ``W_h @ x`` over (B, C, H, W)); the handle below counts K MACs per output element.
"""
import datetime
import math
import platform

import torch
import timm
from fvcore.nn import FlopCountAnalysis
from fvcore.nn.jit_handles import get_shape

import mlp_vision


def matmul_macs(inputs, outputs):
    return math.prod(get_shape(outputs[0])) * get_shape(inputs[0])[-1]


def main():
    print(f'# {datetime.date.today()} torch {torch.__version__} timm {timm.__version__} {platform.machine()}')
    print('model\tparams_M\tparams_no_head_M\tmacs_G')
    for name in mlp_vision.VISION_MODELS:
        model = timm.create_model(name).eval()
        params = sum(p.numel() for p in model.parameters())
        head = sum(p.numel() for p in model.get_classifier().parameters())
        fca = FlopCountAnalysis(model, torch.randn(1, 3, 224, 224)).set_op_handle('aten::matmul', matmul_macs)
        fca.unsupported_ops_warnings(False)
        fca.uncalled_modules_warnings(False)
        print(f'{name}\t{params / 1e6:.3f}\t{(params - head) / 1e6:.3f}\t{fca.total() / 1e9:.3f}', flush=True)


if __name__ == '__main__':
    main()
