"""ALiBi slopes and both attention kernels against a naive reference written here."""

from __future__ import annotations

import math

import pytest
import torch

import framework.model.decoder as model_module
from framework.model.attention import alibi_causal_bias, alibi_slopes, flex_attention, sdpa_attention
from framework.config import ModelConfig
from framework.model.decoder import Decoder

# Eager FlexAttention on CPU warns that it is unfused; that is expected in these tests.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32])
def test_slopes_for_powers_of_two_are_geometric(n):
    expected = torch.tensor([2.0 ** (-8.0 * (i + 1) / n) for i in range(n)])
    torch.testing.assert_close(alibi_slopes(n), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("n", [3, 6, 9, 10, 12, 14, 21])
def test_slopes_for_other_head_counts_follow_the_standard_rule(n):
    # Nearest lower power of two m: its n slopes 2^(-8(i+1)/m), then the odd-numbered
    # slopes of 2m — 2^(-8(2j+1)/(2m)) = 2^(-4(2j+1)/m) — for the remaining n - m heads.
    m = 1 << (n.bit_length() - 1)
    expected = [2.0 ** (-8.0 * (i + 1) / m) for i in range(m)]
    expected += [2.0 ** (-4.0 * (2 * j + 1) / m) for j in range(n - m)]
    torch.testing.assert_close(alibi_slopes(n), torch.tensor(expected), rtol=1e-6, atol=0)


def test_slopes_for_ten_heads_written_out():
    # 8 heads: 1/2 … 1/256; then 16 heads' 1st and 3rd slopes: 2^-0.5, 2^-1.5.
    expected = [2.0 ** -k for k in range(1, 9)] + [2.0 ** -0.5, 2.0 ** -1.5]
    torch.testing.assert_close(alibi_slopes(10), torch.tensor(expected), rtol=1e-6, atol=0)


def reference_attention(q, k, v, slopes):
    """softmax(q·kᵀ/√d + slope·(j - i), causal) · v with explicit loops; queries are the
    last T of the K positions (a KV cache holds the first K - T)."""
    batch, heads, q_len, dim = q.shape
    k_len = k.shape[2]
    out = torch.zeros_like(q, dtype=torch.float64)
    q, k, v = q.double(), k.double(), v.double()
    for b in range(batch):
        for h in range(heads):
            for t in range(q_len):
                i = k_len - q_len + t  # absolute position of this query
                scores = torch.tensor([float(q[b, h, t] @ k[b, h, j]) / math.sqrt(dim)
                                       + float(slopes[h]) * (j - i) for j in range(i + 1)],
                                      dtype=torch.float64)
                weights = torch.softmax(scores, dim=0)
                out[b, h, t] = (weights[:, None] * v[b, h, : i + 1]).sum(0)
    return out.float()


def random_qkv(batch, heads, q_len, k_len, dim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=gen)
    k = torch.randn(batch, heads, k_len, dim, generator=gen)
    v = torch.randn(batch, heads, k_len, dim, generator=gen)
    return q, k, v


@pytest.mark.parametrize("heads, q_len, k_len", [(4, 9, 9), (10, 9, 9), (6, 3, 11), (10, 1, 7)])
def test_sdpa_with_alibi_bias_matches_reference(heads, q_len, k_len):
    q, k, v = random_qkv(2, heads, q_len, k_len, 16)
    slopes = alibi_slopes(heads)
    bias = alibi_causal_bias(slopes, q_len, k_len, dtype=torch.float32, device=torch.device("cpu"))
    torch.testing.assert_close(sdpa_attention(q, k, v, bias), reference_attention(q, k, v, slopes),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads, q_len, k_len", [(4, 9, 9), (10, 9, 9), (6, 3, 11), (10, 1, 7)])
def test_flex_forward_matches_reference(heads, q_len, k_len):
    q, k, v = random_qkv(2, heads, q_len, k_len, 16, seed=1)
    slopes = alibi_slopes(heads)
    with torch.no_grad():  # FlexAttention has no CPU backward
        out = flex_attention(q, k, v, slopes)
    torch.testing.assert_close(out, reference_attention(q, k, v, slopes), rtol=1e-5, atol=1e-5)


def test_flex_on_zero_rows_returns_an_empty_result():
    q, k, v = random_qkv(0, 4, 5, 5, 8)
    with torch.no_grad():
        assert flex_attention(q, k, v, alibi_slopes(4)).shape == (0, 4, 5, 8)


def test_causal_bias_values():
    slopes = torch.tensor([0.5, 0.25])
    bias = alibi_causal_bias(slopes, 2, 4, dtype=torch.float32, device=torch.device("cpu"))
    assert bias.shape == (1, 2, 2, 4)
    # Query t sits at absolute position 2 + t; key j adds slope·(j - i) and is masked if j > i.
    for h, slope in enumerate(slopes.tolist()):
        for t in range(2):
            i = 2 + t
            for j in range(4):
                expected = float("-inf") if j > i else slope * (j - i)
                assert bias[0, h, t, j].item() == expected


def tiny_config(**overrides):
    return ModelConfig(**{"vocab_size": 97, "d_model": 40, "n_layers": 2, "n_heads": 5,
                          "max_seq_len": 32, **overrides})


def count_kernel_calls(monkeypatch):
    calls = {"sdpa": 0, "flex": 0}

    def wrap(name, fn):
        def counted(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return counted

    monkeypatch.setattr(model_module, "sdpa_attention", wrap("sdpa", model_module.sdpa_attention))
    monkeypatch.setattr(model_module, "flex_attention", wrap("flex", model_module.flex_attention))
    return calls


@pytest.mark.parametrize("backend, expected", [("auto", "sdpa"), ("sdpa", "sdpa"), ("flex", "flex")])
def test_backend_selection_on_cpu(monkeypatch, backend, expected):
    torch.manual_seed(0)
    decoder = Decoder(tiny_config(attention=backend))
    calls = count_kernel_calls(monkeypatch)
    with torch.no_grad():
        decoder(torch.randint(0, 97, (2, 6)))
    assert calls[expected] == decoder.config.n_layers
    assert sum(calls.values()) == decoder.config.n_layers
    assert decoder.use_flex(None) == (expected == "flex")


def test_flex_and_sdpa_decoders_agree():
    torch.manual_seed(0)
    sdpa = Decoder(tiny_config(attention="sdpa"))
    flex = Decoder(tiny_config(attention="flex"))
    flex.load_state_dict(sdpa.state_dict())
    tokens = torch.randint(0, 97, (3, 11))
    with torch.no_grad():
        torch.testing.assert_close(flex(tokens), sdpa(tokens), rtol=1e-5, atol=1e-5)


def test_key_padding_masks_padded_keys_with_a_finite_value():
    slopes = alibi_slopes(2)
    padding = torch.tensor([[True, False, False], [False, False, False]])
    plain = alibi_causal_bias(slopes, 2, 3, dtype=torch.float64, device=torch.device("cpu"))
    padded = alibi_causal_bias(slopes, 2, 3, dtype=torch.float64, device=torch.device("cpu"), key_padding=padding)
    assert padded.shape == (2, 2, 2, 3)
    torch.testing.assert_close(padded[1], plain[0])  # a row without padding: the plain bias
    assert (padded[0, :, :, 0] == torch.finfo(torch.float64).min).all()  # no query attends key 0
    torch.testing.assert_close(padded[0, :, :, 1:], plain[0, :, :, 1:])
    # A query whose every key is padding stays finite through the softmax.
    q = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    k = v = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    only_pad = alibi_causal_bias(slopes, 1, 1, dtype=torch.float64, device=torch.device("cpu"),
                                 key_padding=torch.tensor([[True]]))
    assert torch.isfinite(sdpa_attention(q, k, v, only_pad)).all()
