"""The single-device model: the Celerity decoder (pre-LN, ALiBi attention, squared-ReLU
FFN) in ``decoder.py``, with the pieces it is made of or measured by beside it: the
attention kernels and ALiBi bias, the KV cache for decoding and the training loss.
Nothing here knows of ranks or strategies (framework/strategies/ applies them), nor of
the families built on it (framework/families/; the FLOP count of any family's blocks is
framework/flops.py, above both). ``from framework.model import Decoder`` is the public name of the decoder.
"""

from framework.model.decoder import Attention, Block, Decoder, FeedForward, StepOutput

__all__ = ["Attention", "Block", "Decoder", "FeedForward", "StepOutput"]
