"""Attribution patching and saliency from the gradient graphs (`attnserve gradient`), against
the same estimates by torch autograd on transformers' own model: Gemma 2 (sandwich norms,
GQA, soft-caps) and OLMo 2 (norms after each sublayer), each site kind patching has."""

import grpc
import httpx
import numpy as np
import pytest
import torch

from attnserve.client import ClientOptions, EncoderClient
from attnserve.model.artifacts import ModelDirectory
from tests.conftest import ServerThread, run_cli

KINDS = ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post", "z")


def _sites(reference, kind: str) -> list[tuple[torch.nn.Module, bool]]:
    """Each layer's module whose input (True) or output (False) is the site of `kind` in
    transformers' Gemma 2 and OLMo 2 (the same names): the layer's input is resid_pre, its
    output resid_post, what attention writes its post-attention norm's output, the MLP's
    its post-feedforward norm's and hook_z what o_proj reads (the heads side by side).
    hook_resid_mid is no module's: resid_pre + attn_out, changed where attn_out is."""
    layers = reference.model.layers
    return {
        "resid_pre": [(layer, True) for layer in layers],
        "attn_out": [(layer.post_attention_layernorm, False) for layer in layers],
        "mlp_out": [(layer.post_feedforward_layernorm, False) for layer in layers],
        "resid_post": [(layer, False) for layer in layers],
        "z": [(layer.self_attn.o_proj, True) for layer in layers],
    }[kind]


def _run(reference, ids, sites, deltas=None):
    """The model's logits (T, V) with each site's value stored (and `deltas` added)."""
    values, handles = [], []
    for index, (module, at_input) in enumerate(sites):

        def change(x, index=index):
            x = x if deltas is None else x + deltas[index]
            values.append(x)
            return x

        if at_input:
            hook = module.register_forward_pre_hook(lambda _m, args, f=change: (f(args[0]),))
        else:
            hook = module.register_forward_hook(
                lambda _m, _a, out, f=change: (
                    (f(out[0]), *out[1:]) if isinstance(out, tuple) else f(out)
                )
            )
        handles.append(hook)
    try:
        logits = reference(torch.tensor([ids])).logits[0]
    finally:
        for hook in handles:
            hook.remove()
    return logits, values


def _estimate(reference, clean, corrupted, target, contrast, kind, heads):
    """Attribution patching by autograd: at each place, (clean - corrupted) times the
    difference's gradient at the corrupted run; and the saliency at the embeddings."""
    sites = _sites(reference, "attn_out" if kind == "resid_mid" else kind)
    with torch.no_grad():
        _, sources = _run(reference, clean, sites)
        _, inputs = _run(reference, corrupted, sites)
        if kind == "resid_mid":  # attn_out + the stream it is added to
            for values, ids in ((sources, clean), (inputs, corrupted)):
                _, before = _run(reference, ids, _sites(reference, "resid_pre"))
                values[:] = [x + y for x, y in zip(values, before, strict=True)]
    deltas = [torch.zeros_like(x, requires_grad=True) for x in inputs]
    logits, _ = _run(reference, corrupted, sites, deltas)
    metric = logits[-1, target] - logits[-1, contrast]
    grads = torch.autograd.grad(metric, deltas)
    change = torch.stack([((s - i) * g)[0] for s, i, g in zip(sources, inputs, grads, strict=True)])
    if kind == "z":  # (L, T, H * d_k) -> (L, H)
        grid = change.reshape(*change.shape[:2], heads, -1).sum(dim=(1, 3))
    else:
        grid = change.sum(-1)  # (L, T)
    return float(metric.detach()) + grid.detach().numpy()


def _saliency(reference, ids, target, contrast):
    """Input times gradient at what the first layer reads (the scaled token embeddings)."""
    layer = reference.model.layers[0]
    delta = torch.zeros(1, len(ids), reference.config.hidden_size, requires_grad=True)
    logits, (embed,) = _run(reference, ids, [(layer, True)], [delta])
    grad = torch.autograd.grad(logits[-1, target] - logits[-1, contrast], delta)[0]
    return (embed * grad)[0].sum(-1).detach().numpy()


@pytest.mark.parametrize("family", ["gemma2", "olmo2"])
def test_attribution_patching_equals_autograd_on_transformers(families, family):
    directory = families.exported(family)
    result = run_cli("gradient", str(directory), "--lengths", "16")
    assert result.returncode == 0, result.stderr
    assert ModelDirectory(directory).gradient_lengths() == [16]
    _, reference = families.checkpoint(family)
    reference = reference.float().eval()
    generator = torch.Generator().manual_seed(7)
    vocab = reference.config.vocab_size
    corrupted = torch.randint(3, vocab, (11,), generator=generator).tolist()  # padded to 16
    clean = list(corrupted)
    clean[3] = (clean[3] + 1) % vocab
    target, contrast = 5, 9
    heads = reference.config.num_attention_heads
    server = ServerThread(directory)
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=120)) as client:
            assert client.model_info()["gradient_lengths"] == [16]
            asked = {"source": clean, "target": target, "contrast": contrast}
            for kind in KINDS:
                got = client.encode(
                    corrupted, patching=asked | {"hook": kind, "method": "attribution"}
                )[0].patching
                want = _estimate(reference, clean, corrupted, target, contrast, kind, heads)
                assert np.abs(got.values - want).max() <= 1e-4, kind
                # the estimate moves where the places differ: not the corrupted run's alone
                assert np.abs(want - got.corrupted).max() > 1e-3, kind
            np.testing.assert_allclose(
                got.saliency, _saliency(reference, corrupted, target, contrast), atol=1e-4, rtol=0
            )
            with pytest.raises(grpc.RpcError) as excinfo:  # 17 tokens: no graph fits them
                client.encode(
                    list(range(3, 20)),
                    patching=asked
                    | {"source": list(range(4, 21)), "hook": "z", "method": "attribution"},
                )
            assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "this model's: up to 16 tokens" in excinfo.value.details()
            assert client.health() == "SERVING"
            oip_parity(server, client, client.model_info()["name"])
    finally:
        server.stop()


def oip_parity(server, client, model: str) -> None:
    """The Open Inference Protocol's parameter patching_method and output patching_saliency
    carry the same estimate and saliency as attnserve.v1's."""
    corrupted, clean = "The cat sat", "The hat sat"  # 9 tokens each here
    ids = client.encode(corrupted)[0].token_ids.tolist()
    want = client.encode(
        corrupted,
        patching={"source": clean, "hook": "mlp_out", "target": 5, "contrast": 9}
        | {"method": "attribution"},
    )[0].patching
    parameters = {"patching_source": clean, "patching_hook": "mlp_out"}
    parameters |= {"patching_target_id": 5, "patching_contrast_id": 9}
    ask = {
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, len(ids)], "data": ids}],
        "outputs": [{"name": "patching"}, {"name": "patching_saliency"}],
    }
    url = f"{server.http_url}/v2/models/{model}/infer"
    refused = httpx.post(url, json=ask | {"parameters": parameters}, timeout=60)
    assert refused.status_code == 400, refused.text
    assert "patching_saliency comes with parameter patching_method attribution" in refused.text
    parameters["patching_method"] = "attribution"
    answer = httpx.post(url, json=ask | {"parameters": parameters}, timeout=60)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in answer.json()["outputs"]}
    np.testing.assert_allclose(outputs["patching"][0], want.values, atol=1e-6)
    np.testing.assert_allclose(outputs["patching_saliency"][0], want.saliency, atol=1e-6)
