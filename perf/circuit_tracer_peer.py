"""circuit-tracer 0.5.0, unmodified, in an environment of its own (it pins transformers <=
4.57.3, and its nnsight backend, the one that loads a local checkpoint offline, nnsight
0.7): the reference the attribution graphs are held to (tests/service/circuits) and the
peer `python -m perf graphs` times.

    python perf/circuit_tracer_peer.py build --family llama --out DIR [--input-hook H]
        a tiny random checkpoint (DIR/model, by this environment's transformers) whose
        layer 0 MLP writes an outlier dimension in the thousands, as trained models' do,
        and a transcoder set in circuit-tracer's format (DIR/transcoders: config.yaml and
        layer_{i}.safetensors) scaled to the activations it reads (at H, one of
        INPUT_HOOKS) and writes
    python perf/circuit_tracer_peer.py attribute DIR --ids 1,5,9 --out graph.npz [knobs]
        circuit-tracer's attribute(), prune_graph() and compute_graph_scores() on those
        token ids, saved as arrays under its Graph's field names, and its graph file
        (create_graph_files: graph.json beside graph.npz)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # perf.hf_checkpoints

D_TRANSCODER = 192
FAMILIES = {
    # GQA (4 query heads on 2 key/value heads), untied unembedding
    "llama": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    ),
    # sandwich norms, attention and final soft-caps, tied embeddings scaled by sqrt(d)
    "gemma2": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        sliding_window=4,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
    ),
}
# circuit-tracer's feature_input_hook names: the stream before the MLP's norm, that norm's x
# standardized (Gemma Scope's transcoders), its output (what the MLP reads: Llama's)
INPUT_HOOKS = ("hook_resid_mid", "ln2.hook_normalized", "mlp.hook_in")
OUTLIER = 2000.0  # what layer 0's MLP writes on its outlier dimension, about
PROBE = [1, 40, 17, 250, 99, 3, 77, 180, 64, 12, 301, 8]  # ids the scales are measured on


def build(
    family: str,
    out: Path,
    seed: int,
    shape: dict,
    width: int = D_TRANSCODER,
    active: float = 0.3,
    input_hook: str = INPUT_HOOKS[0],
    skip: bool = True,
) -> None:
    """The checkpoint (FAMILIES' shape, `shape`'s fields over it) and its transcoder set
    (`width` features each, about `active` of them on at a position, with a skip connection
    or not) reading `input_hook`."""
    from perf.hf_checkpoints import build_checkpoint

    model = build_checkpoint(family, out / "model", seed=seed, **{**FAMILIES[family], **shape})
    layers = model.model.layers
    ids = torch.tensor([PROBE])
    with torch.no_grad():
        # the outlier: layer 0's MLP writes dimension 5 at ~OUTLIER at every position
        mlp_out = _sites(model, ids, input_hook)[1][0]
        layers[0].mlp.down_proj.weight[5] *= OUTLIER / float(mlp_out[..., 5].abs().mean())
    model.save_pretrained(out / "model")
    # the tokenizer's special tokens by name, as the trained one has them (else a family's
    # own defaults, Gemma's <bos>, would be added past the vocabulary)
    specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    tokenizer = {"tokenizer_class": "PreTrainedTokenizerFast", **specials}
    (out / "model" / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    inputs, outputs = _sites(model, ids, input_hook)
    generator = torch.Generator().manual_seed(seed + 1)
    folder = out / "transcoders"
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "model_kind": "transcoder_set",
        "feature_input_hook": input_hook,
        "feature_output_hook": "hook_mlp_out",
        "scan": f"attnserve-{family}",
    }
    (folder / "config.yaml").write_text(json.dumps(config))  # YAML is a superset of JSON
    from safetensors.torch import save_file

    for layer, (x, y) in enumerate(zip(inputs, outputs, strict=True)):
        tensors = _transcoder(x, y, generator, width, active)
        if not skip:
            del tensors["W_skip"]
        save_file(tensors, folder / f"layer_{layer}.safetensors")


def _sites(
    model, ids: torch.Tensor, input_hook: str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each layer's `input_hook` (T, D) and hook_mlp_out (T, D) on `ids`."""
    inputs, outputs, handles = [], [], []

    def read(norm, args, output) -> None:
        x = args[0][0]  # (T, D) hook_resid_mid
        if input_hook == "mlp.hook_in":
            x = output[0]
        elif input_hook == "ln2.hook_normalized":  # the RMSNorm's x / sqrt(mean x^2 + eps)
            eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        inputs.append(x)

    for layer in model.model.layers:
        mid_norm = getattr(layer, "pre_feedforward_layernorm", None)
        mid_norm = mid_norm if mid_norm is not None else layer.post_attention_layernorm
        out = getattr(layer, "post_feedforward_layernorm", None) or layer.mlp
        handles.append(mid_norm.register_forward_hook(read))
        handles.append(out.register_forward_hook(lambda m, a, o: outputs.append(o[0])))
    with torch.no_grad():
        model(ids)
    for handle in handles:
        handle.remove()
    return inputs, outputs


def _transcoder(
    x: torch.Tensor, y: torch.Tensor, generator: torch.Generator, S: int, active: float
) -> dict:
    """A JumpReLU skip transcoder of trained scale for input x (T, D) and output y (T, D):
    pre-activations of about unit size whatever each dimension's magnitude, about `active`
    of the S features on, a reconstruction of y's size."""
    from statistics import NormalDist

    D = x.shape[1]
    x_scale = x.std(0) + x.abs().mean(0)  # (D,) the outlier dimension's ~1000x the rest
    W_enc = torch.randn(S, D, generator=generator) / (D**0.5 * x_scale)
    y_scale = float(y.std())
    offset = NormalDist().inv_cdf(1 - active) * 0.8  # the pre-activations' spread: ~0.6
    return {
        "W_enc": W_enc.contiguous(),
        "b_enc": torch.randn(S, generator=generator) * 0.3 - offset,
        "W_dec": torch.randn(S, D, generator=generator) * y_scale / (S * active) ** 0.5,
        "b_dec": torch.randn(D, generator=generator) * y_scale * 0.1,
        "activation_function.threshold": torch.rand(S, generator=generator) * 0.2 + 0.05,
        "W_skip": torch.randn(D, D, generator=generator) * 0.1 * y_scale / (D**0.5 * x_scale),
    }


def attribute(folder: Path, ids: list[int], out: Path, knobs: dict) -> None:
    from circuit_tracer import ReplacementModel, attribute
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set
    from circuit_tracer.utils.create_graph_files import create_graph_files

    config = json.loads((folder / "transcoders" / "config.yaml").read_text())
    paths = sorted((folder / "transcoders").glob("layer_*.safetensors"))
    transcoders = load_transcoder_set(
        {int(p.stem.split("_")[1]): str(p) for p in paths},
        scan=config["scan"],
        feature_input_hook=config["feature_input_hook"],
        feature_output_hook=config["feature_output_hook"],
        device=torch.device("cpu"),
        lazy_encoder=False,
        lazy_decoder=False,
    )
    model = ReplacementModel.from_pretrained_and_transcoders(
        str(folder / "model"), transcoders, backend="nnsight", device="cpu"
    )
    prune = {k: knobs.pop(k) for k in ("node_threshold", "edge_threshold") if k in knobs}
    start = time.perf_counter()
    graph = attribute(torch.tensor(ids), model, **knobs)
    seconds = time.perf_counter() - start
    pruned = prune_graph(graph, **prune)
    replacement, completeness = compute_graph_scores(graph)
    # its graph file too (beside the arrays: OUT with .json), as its viewer loads it
    folder_out = out.parent / f"{out.stem}-files"
    create_graph_files(graph, out.stem, folder_out, **prune)
    (folder_out / f"{out.stem}.json").rename(out.with_suffix(".json"))
    np.savez(
        out,
        input_tokens=graph.input_tokens.numpy(),
        logit_targets=np.array([t.vocab_idx for t in graph.logit_targets]),
        logit_probabilities=graph.logit_probabilities.numpy(),
        active_features=graph.active_features.numpy(),
        activation_values=graph.activation_values.numpy(),
        selected_features=graph.selected_features.numpy(),
        adjacency_matrix=graph.adjacency_matrix.numpy(),
        node_mask=pruned.node_mask.numpy(),
        edge_mask=pruned.edge_mask.numpy(),
        cumulative_scores=pruned.cumulative_scores.numpy(),
        scores=np.array([replacement, completeness]),
        seconds=np.array(seconds),
        peak_rss=np.array(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build")
    b.add_argument("--family", choices=sorted(FAMILIES), required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--shape", default="{}", help="config fields over the family's, as JSON")
    b.add_argument("--width", type=int, default=D_TRANSCODER, help="features per transcoder")
    b.add_argument("--active", type=float, default=0.3, help="about this share on")
    b.add_argument("--input-hook", choices=INPUT_HOOKS, default=INPUT_HOOKS[0])
    b.add_argument("--no-skip", action="store_true", help="transcoders without W_skip")
    a = commands.add_parser("attribute")
    a.add_argument("folder", type=Path)
    a.add_argument("--ids", required=True, help="comma-separated token ids")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--knobs", default="{}", help="attribute()'s and prune_graph()'s, as JSON")
    args = parser.parse_args()
    torch.set_grad_enabled(True)
    if args.command == "build":
        shape = json.loads(args.shape)
        build(args.family, args.out, args.seed, shape, args.width, args.active,
              args.input_hook, not args.no_skip)  # fmt: skip
    else:
        ids = [int(i) for i in args.ids.split(",")]
        attribute(args.folder, ids, args.out, json.loads(args.knobs))


if __name__ == "__main__":
    main()
