"""How `attnserve encode` shows an answer: as text for a person (each id beside its token's
text) or as JSON."""

from __future__ import annotations

import numpy as np

from attnserve.client.codec import (
    ActivationPatching,
    EncodeOutput,
    Encoding,
    LogitAttribution,
    SAEFeatures,
    TokenPredictions,
)
from attnserve.v1.wire import ATTRIBUTION_PARTS


def output_json(out: EncodeOutput) -> dict:
    return {
        "model_version": out.model_version,
        "timings_ns": {"queue": out.queue_ns, "inference": out.inference_ns, "total": out.total_ns},
        "results": [
            {
                "token_ids": e.token_ids.tolist(),
                "embeddings": _list(e.embeddings),
                "pooled": _list(e.pooled),
                "attention": _list(e.attention),
                "attention_layers": e.layers,
                "attention_heads": e.heads,
                "attention_rows": e.rows,
                "attention_indices": _list(e.indices),
                "head_entropy": _list(e.head_entropy),
                "truncated": e.truncated,
                "tokens": e.tokens,
                "hidden_state_norms": _list(e.hidden_state_norms),
                "predictions": _predictions_json(e.predictions),
                "logit_lens": _predictions_json(e.logit_lens),
                "attribution": _attribution_json(e.attribution),
                "features": _features_json(e.features),
                "patching": _patching_json(e.patching),
            }
            for e in out
        ],
    }


def print_encoding(e: Encoding, target_ids: list[int], texts: dict[int, str]) -> None:
    if e.tokens:
        print(f"    tokens {' '.join(e.tokens)}")
    if e.embeddings is not None:
        print(
            f"    embeddings {e.embeddings.shape}, norm of last token "
            f"{np.linalg.norm(e.embeddings[-1]):.4f}"
        )
    if e.pooled is not None:
        print(f"    pooled {e.pooled.shape}, first values {np.round(e.pooled[:4], 4)}")
    if e.attention is not None:
        print(
            f"    attention {e.attention.shape} for layers {e.layers} heads {e.heads} "
            f"rows {e.rows if len(e.rows) < 8 else f'{e.rows[:4]}...'}"
        )
    if e.indices is not None:
        print(f"    top-{e.indices.shape[-1]} key positions, last row {e.indices[..., -1, :]}")
    if e.head_entropy is not None:
        print(f"    head entropy (nats, layers x heads)\n{np.round(e.head_entropy, 3)}")
    if e.hidden_state_norms is not None:
        for position, norms in zip(e.hidden_state_positions, e.hidden_state_norms.T, strict=True):
            print(f"    hidden-state norms at {position}, by layer: {np.round(norms, 2)}")
    if e.predictions is not None:
        _print_predictions("next token", e.predictions, target_ids, texts)
    if e.logit_lens is not None:
        _print_predictions("logit lens", e.logit_lens, target_ids, texts)
    if e.attribution is not None:
        _print_attribution(e.attribution, texts)
    if e.features is not None:
        _print_features(e.features, e.tokens)
    if e.patching is not None:
        _print_patching(e.patching, e.tokens)


def _print_patching(p: ActivationPatching, tokens: list[str]) -> None:
    """The grid, a row per layer and a column per token (z: per head), as the share of the
    clean difference each patched place brings back (0: the corrupted run's, 1: the
    clean run's)."""
    print(
        f"    patching {p.hook}: logit difference clean {p.clean:.4f}, corrupted "
        f"{p.corrupted:.4f}; recovered by each patched place (0 corrupted .. 1 clean):"
    )
    if p.warning:
        print(f"    warning: {p.warning}")
    recovered = p.recovered() if p.clean != p.corrupted else np.zeros_like(p.values)
    if p.hook == "z":
        columns = [f"H{head}" for head in range(p.values.shape[1])]
    else:
        columns = tokens or [str(position) for position in range(p.values.shape[1])]
    width = max(6, *(len(c) for c in columns))
    print("          " + " ".join(c[:width].rjust(width) for c in columns))
    for layer, row in enumerate(recovered):
        print(f"      L{layer:<3}" + " ".join(f"{v:{width}.2f}" for v in row))
    if p.saliency is not None:  # a value per token
        print("      saliency " + " ".join(f"{v:.3g}" for v in p.saliency))


def _patching_json(p: ActivationPatching | None) -> dict | None:
    if p is None:
        return None
    return {
        "hook": p.hook,
        "values": p.values.tolist(),
        "clean": p.clean,
        "corrupted": p.corrupted,
        "warning": p.warning,
        "saliency": None if p.saliency is None else p.saliency.tolist(),
    }


def _print_features(f: SAEFeatures, tokens: list[str]) -> None:
    """Each SAE's strongest features at each position, beside the token's text."""
    for s, sae in enumerate(f.saes):
        print(f"    features of {sae} (id activation, strongest first):")
        for p, position in enumerate(f.positions):
            token = f" {tokens[position]!r}" if position < len(tokens) else ""
            top = ", ".join(
                f"#{i} {a:.3f}"
                for i, a in zip(f.top_ids[s, p], f.top_activations[s, p], strict=True)
                if i >= 0
            )
            error = f", error {f.error_norm[s, p]:.3f}" if f.error_norm is not None else ""
            print(f"      {position:>4}{token}: L0 {f.l0[s, p]}{error}{': ' + top if top else ''}")


def _features_json(f: SAEFeatures | None) -> dict | None:
    if f is None:
        return None
    return {
        "saes": f.saes,
        "positions": f.positions,
        "top_ids": f.top_ids.tolist(),
        "top_activations": f.top_activations.tolist(),
        "l0": f.l0.tolist(),
        "error_norm": _list(f.error_norm),
        "feature_ids": f.feature_ids,
        "feature_activations": _list(f.feature_activations),
        "activations": _list(f.activations),
    }


def _token(token_id: int, texts: dict[int, str]) -> str:
    """An id with its text: "' Mary' (289)"."""
    return f"{texts[token_id]!r} ({token_id})" if token_id in texts else str(token_id)


def _attribution_parts(a: LogitAttribution, i: int, j: int) -> dict[str, float]:
    """Every part of one position's (i) and target's (j) logit, by name."""
    parts = {"embeddings": float(a.embeddings[i, j]), "constant": float(a.constants[i, j])}
    for layer, heads in enumerate(a.heads[i, j]):
        parts |= {f"L{layer}H{head}": float(v) for head, v in enumerate(heads)}
        parts[f"L{layer} bias"] = float(a.attention_biases[i, j, layer])
        parts[f"L{layer} MLP"] = float(a.mlps[i, j, layer])
    return parts


def _print_attribution(a: LogitAttribution, texts: dict[int, str], shown: int = 6) -> None:
    for i, position in enumerate(a.positions):
        for j, target in enumerate(a.target_ids):
            versus = f" - logit {_token(a.contrast_ids[j], texts)}" if a.contrast_ids else ""
            parts = _attribution_parts(a, i, j)
            largest = sorted(parts.items(), key=lambda item: -abs(item[1]))[:shown]
            print(
                f"    logit {_token(target, texts)}{versus} after position {position}: "
                f"{a.total[i, j]:.4f} = "
                + ", ".join(f"{name} {value:+.3f}" for name, value in largest)
                + (" + ..." if len(parts) > shown else "")
            )


def _attribution_json(a: LogitAttribution | None) -> dict | None:
    if a is None:
        return None
    return {
        "positions": a.positions,
        "target_ids": a.target_ids,
        "contrast_ids": a.contrast_ids,
        "total": a.total.tolist(),
        **{name: getattr(a, name).tolist() for name in ATTRIBUTION_PARTS},
    }


def _print_predictions(
    title: str, p: TokenPredictions, target_ids: list[int], texts: dict[int, str]
) -> None:
    for j, position in enumerate(p.positions):
        print(f"    {title} after position {position}:")
        for i, layer in enumerate(p.layers):
            top = ", ".join(
                f"{token!r} {probability:.3f}"
                for token, probability in zip(
                    p.top_tokens[i, j], p.top_probabilities[i, j], strict=True
                )
            )
            targets = ""
            if p.target_probabilities is not None:
                targets = "; targets " + ", ".join(
                    f"{_token(t, texts)} {probability:.4f}"
                    for t, probability in zip(target_ids, p.target_probabilities[i, j], strict=True)
                )
            print(f"      layer {layer:>3}: {top}{targets}")


def _predictions_json(p: TokenPredictions | None) -> dict | None:
    if p is None:
        return None
    return {
        "layers": p.layers,
        "positions": p.positions,
        "top_ids": p.top_ids.tolist(),
        "top_tokens": p.top_tokens.tolist(),
        "top_probabilities": p.top_probabilities.tolist(),
        "target_probabilities": _list(p.target_probabilities),
    }


def _list(array: np.ndarray | None) -> list | None:
    return None if array is None else array.tolist()
