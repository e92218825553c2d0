"""cunorm: LayerNorm, RMSNorm and BatchNorm kernels for CuPy arrays, compiled at run time by NVRTC."""
from .ops.batch_norm import batch_norm, batch_norm_backward
from .ops.layer_norm import layer_norm, layer_norm_backward
from .ops.rms_norm import rms_norm, rms_norm_backward

__version__ = "0.1.0"
__all__ = ["batch_norm", "batch_norm_backward", "layer_norm", "layer_norm_backward", "rms_norm",
           "rms_norm_backward"]
