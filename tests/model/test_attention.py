"""The worked example of attention tutorials (X, W_Q, W_K, W_V below) and its numbers."""

import numpy as np
import pytest
import torch

from attnserve.model.attention import scaled_dot_product_attention
from attnserve.model.config import ModelConfig
from attnserve.model.layers import MultiHeadAttention

X = np.array([[-1.0720, -0.5001], [-0.0020, -0.4311], [-0.0020, -0.4311]])
WQ = np.array([[-0.0271, -0.3840], [-0.3940, -0.6610]])
WK = np.array([[-0.4109, 0.5777], [-0.1162, -0.1661]])
WV = np.array([[-0.2045, 0.1210], [-0.1712, -0.4462]])

# Published in the texts for the non-causal case.
TEXT_WEIGHTS = np.array(
    [[0.2809, 0.3595, 0.3595], [0.3182, 0.3409, 0.3409], [0.3182, 0.3409, 0.3409]]
)
TEXT_OUTPUT = np.array([[0.1390, 0.1644], [0.1476, 0.1607], [0.1476, 0.1607]])


def numpy_causal_attention(x, wq, wk, wv):
    """Independent float64 computation, written from the formula, not from the model."""
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = q @ k.T / np.sqrt(q.shape[1])
    t = len(x)
    scores = np.where(np.arange(t)[None, :] > np.arange(t)[:, None], -np.inf, scores)
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    weights = e / e.sum(axis=1, keepdims=True)
    return weights @ v, weights


def qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.tensor(X, dtype=torch.float32)
    return tuple(x @ torch.tensor(w, dtype=torch.float32) for w in (WQ, WK, WV))


def test_function_reproduces_the_published_non_causal_numbers():
    output, weights = scaled_dot_product_attention(*qkv(), causal=False)
    np.testing.assert_allclose(weights.numpy(), TEXT_WEIGHTS, atol=1e-4)
    np.testing.assert_allclose(output.numpy(), TEXT_OUTPUT, atol=1e-4)


def test_function_causal_case_matches_independent_numpy():
    output, weights = scaled_dot_product_attention(*qkv(), causal=True)
    want_output, want_weights = numpy_causal_attention(X, WQ, WK, WV)
    np.testing.assert_allclose(weights.numpy(), want_weights, atol=1e-6)
    np.testing.assert_allclose(output.numpy(), want_output, atol=1e-6)
    # The first token can only see itself; the masked entries are exactly zero.
    assert weights[0].tolist() == [1.0, 0.0, 0.0]
    assert weights[1, 2].item() == 0.0
    np.testing.assert_allclose(weights.sum(-1).numpy(), 1.0, atol=1e-6)


def single_head_layer(causal: bool) -> MultiHeadAttention:
    """The multi-head layer reduced to the texts' setting: one head, no biases, identity Wo."""
    config = ModelConfig(n_heads=1, d_model=2, d_ff=8, bias=False)
    layer = MultiHeadAttention(config, causal=causal)
    with torch.no_grad():
        # nn.Linear computes x @ W^T, so the texts' X @ Wq needs Wq^T as the weight.
        fused = np.concatenate([WQ.T, WK.T, WV.T])
        layer.qkv.weight.copy_(torch.tensor(fused, dtype=torch.float32))
        layer.proj.weight.copy_(torch.eye(2))
    return layer


@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_layer_reduced_to_one_head_reproduces_the_example(causal):
    layer = single_head_layer(causal)
    with torch.no_grad():
        output, weights = layer(torch.tensor(X, dtype=torch.float32)[None])  # batch of 1
    if causal:
        want_output, want_weights = numpy_causal_attention(X, WQ, WK, WV)
    else:
        want_output, want_weights = TEXT_OUTPUT, TEXT_WEIGHTS
    assert weights.shape == (1, 1, 3, 3)  # (B, H, T, T)
    np.testing.assert_allclose(weights[0, 0].numpy(), want_weights, atol=1e-4)
    np.testing.assert_allclose(output[0].numpy(), want_output, atol=1e-4)


def test_heads_are_independent_slices_of_the_projection():
    """Two heads must equal two separate single-head computations on their slices."""
    torch.manual_seed(0)
    config = ModelConfig(n_heads=2, d_model=8, d_ff=16, bias=False)
    layer = MultiHeadAttention(config)
    x = torch.randn(1, 5, 8)
    with torch.no_grad():
        _, weights = layer(x)
        q, k, v = layer.qkv(x).split(8, dim=2)
        for h in range(2):
            cols = slice(4 * h, 4 * (h + 1))
            _, w = scaled_dot_product_attention(q[..., cols], k[..., cols], v[..., cols])
            torch.testing.assert_close(weights[:, h], w)
