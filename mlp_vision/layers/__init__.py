""" Shared building blocks: one implementation of each, used by the vision and the text models. """
from .activations import FreshGELU, fresh_gelu, fresh_input_act
from .gating import SPATIAL_MODES, SpatialGatingUnit, TinyAttention, GatedMLPBlock
from .linear import TokenLinear
from .input_checks import check_image_input, check_img_size, check_model_args, record_input_size
from .mixer import MixerBlock
from .resample import TokenAxes, resample_token_axis, resample_token_params_, resample_token_weight
from .sparse_mlp import AxialSparseMLP, SparseMLPBlock, SparseMLPTokenMixer
from .ssm import BidirectionalGatedSSM, S4DKernel, S4DLayer, causal_toeplitz, fast_fft_len, ssm_conv_impl
