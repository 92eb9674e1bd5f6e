import pytest
import torch
import torch.nn.functional as F

from framework.config import ModelConfig
from framework.model.loss import IGNORE_INDEX, chunked_cross_entropy
from framework.model.decoder import Decoder
from tests.helpers.reference_decoder import reference_loss


def head_and_inputs(vocab=97, d=16, rows=(3, 11), seed=0):
    torch.manual_seed(seed)
    norm = torch.nn.LayerNorm(d)
    head = torch.nn.Linear(d, vocab, bias=False)
    hidden = torch.randn(*rows, d, requires_grad=True)
    targets = torch.randint(0, vocab, rows)
    return norm, head, hidden, targets


def reference_and_chunked(chunk, ignore=False):
    norm, head, hidden, targets = head_and_inputs()
    if ignore:
        targets[0, :4] = IGNORE_INDEX

    def logits_fn(x):
        return head(norm(x)) * 0.5

    ref = F.cross_entropy(logits_fn(hidden).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    ref_grads = torch.autograd.grad(ref, [hidden, head.weight, norm.weight, norm.bias])
    got = chunked_cross_entropy(hidden, targets, logits_fn, chunk_tokens=chunk)
    got_grads = torch.autograd.grad(got, [hidden, head.weight, norm.weight, norm.bias])
    return ref, ref_grads, got, got_grads


@pytest.mark.parametrize("chunk", [1, 5, 7, 33, 4096])
@pytest.mark.parametrize("ignore", [False, True])
def test_chunked_loss_and_gradients_equal_plain_cross_entropy(chunk, ignore):
    ref, ref_grads, got, got_grads = reference_and_chunked(chunk, ignore)
    assert torch.allclose(got, ref, atol=1e-6, rtol=0)
    for a, b in zip(got_grads, ref_grads):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_chunked_loss_through_a_decoder_matches_the_reference_forward():
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, max_seq_len=16,
                                logit_multiplier=0.5, residual_multiplier=0.5))
    tokens = torch.randint(0, 64, (2, 9))
    targets = torch.randint(0, 64, (2, 9))
    ref = reference_loss(model, tokens, targets)
    got = chunked_cross_entropy(model.hidden(tokens), targets, model.logits, chunk_tokens=4)
    assert torch.allclose(got, ref, atol=1e-6, rtol=0)
    ref_grad = torch.autograd.grad(ref, model.head.weight)[0]
    got_grad = torch.autograd.grad(got, model.head.weight)[0]
    assert torch.allclose(got_grad, ref_grad, atol=1e-6, rtol=0)


def test_only_one_chunk_of_logits_is_kept_for_backward():
    """Autograd saves no [N, V] tensor: the logits of a chunk are recomputed."""
    norm, head, hidden, targets = head_and_inputs(vocab=1000, rows=(4, 50))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_cross_entropy(hidden, targets, lambda x: head(norm(x)), chunk_tokens=20)
    assert saved and max(saved) < 200 * 1000  # never the full 200 x 1000 logits


@pytest.mark.parametrize("chunk", [0, -1, 1.5, True])
def test_bad_chunk_size_is_rejected(chunk):
    norm, head, hidden, targets = head_and_inputs()
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_cross_entropy(hidden, targets, head, chunk_tokens=chunk)


def test_shape_mismatch_is_rejected():
    norm, head, hidden, targets = head_and_inputs()
    with pytest.raises(ValueError, match="targets"):
        chunked_cross_entropy(hidden, targets[:, :-1], head)
