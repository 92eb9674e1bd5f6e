"""framework/strategies/deepspeed_zero.py in one process (ZeRO-3 itself runs in tests/distributed)."""

import torch

from framework.config import ModelConfig
from framework.model.decoder import Decoder
from framework.strategies import full_parameters


def test_full_parameters_is_a_no_op_without_zero3_partitioning():
    decoder = Decoder(ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, max_seq_len=32))
    with full_parameters(decoder), torch.no_grad():
        decoder.head.weight.fill_(0.5)
    assert torch.all(decoder.head.weight == 0.5)  # (ZeRO-3 itself: tests/distributed)
