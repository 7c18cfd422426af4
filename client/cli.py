"""`attnserve {health,info,encode,heatmap}`: call an attnserve server from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from attnserve.client.client import ClientOptions, EncoderClient
from attnserve.client.codec import EncodeOutput, Encoding, LogitAttribution, TokenPredictions
from attnserve.client.heatmap import render_entropy_grid, render_heatmap
from attnserve.v1.wire import ATTRIBUTION_PARTS


def add_commands(commands: argparse._SubParsersAction) -> None:
    connection = argparse.ArgumentParser(add_help=False)
    group = connection.add_argument_group("connection")
    group.add_argument("--target", default="localhost:50051", help="server HOST:PORT")
    group.add_argument("--timeout", type=float, default=30.0, help="seconds per call")
    group.add_argument("--tls-root-cert", type=Path, help="PEM roots: connect with TLS")
    group.add_argument("--token", help="bearer token, if the server asks for one")
    group.add_argument("--model", default="", help="a served model's name (default: the default)")

    def command(name: str, help: str, run) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help, description=help, parents=[connection])
        parser.set_defaults(run=lambda args: _with_client(args, run))
        return parser

    health = command(
        "health", "exit 0 if the standard health service says SERVING (container probes)", _health
    )
    health.add_argument("--service", default="", help="health service name (default: server)")
    command("info", "describe the served model", _info)

    encode = command("encode", "encode texts or token ids", _encode)
    source = encode.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", action="append", help="a text to encode (repeatable)")
    source.add_argument("--ids", action="append", help="comma-separated token ids (repeatable)")
    encode.add_argument("--pooling", choices=["none", "mean", "last"], default="none")
    encode.add_argument("--attention", action="store_true", help="also return attention")
    encode.add_argument("--layers", type=int, nargs="*", default=[], help="attention layers")
    encode.add_argument("--heads", type=int, nargs="*", default=[], help="attention heads")
    encode.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    encode.add_argument("--layout", choices=["full", "causal-packed"], default="full")
    _attention_options(encode)
    encode.add_argument("--top-k", type=int, default=0, help="k largest weights per row")
    encode.add_argument("--entropy", action="store_true", help="each head's mean row entropy")
    readouts = encode.add_argument_group("beyond attention")
    readouts.add_argument("--predict", action="store_true", help="the next-token predictions")
    readouts.add_argument("--lens", action="store_true", help="the logit lens of every layer")
    readouts.add_argument(
        "--lens-norm",
        choices=["frozen", "own"],
        default="frozen",
        help="each state through the final norm with the last state's scale (frozen: "
        "TransformerLens' apply_ln_to_stack) or its own (TransformerLens >= 2.18's "
        "accumulated_resid(apply_ln=True))",
    )
    readouts.add_argument(
        "--hidden-norms", action="store_true", help="the norm of every layer's hidden state"
    )
    readouts.add_argument(
        "--positions",
        type=int,
        nargs="*",
        default=[-1],
        help="positions of those (default: -1, the last token; none given: all)",
    )
    readouts.add_argument("--top-tokens", type=int, default=5, help="most probable tokens")
    readouts.add_argument(
        "--target-ids", type=_ids, default=[], help="comma-separated ids whose probability"
    )
    readouts.add_argument(
        "--target-tokens",
        metavar="TEXT",
        action="append",
        default=[],
        help="a token, by its text (e.g. ' Mary'), whose probability (repeatable)",
    )
    readouts.add_argument(
        "--ablate",
        metavar="LAYER:HEAD",
        type=_head,
        action="append",
        default=[],
        help="remove a head from everything returned, shown beside the run without the "
        "ablation (repeatable)",
    )
    readouts.add_argument(
        "--attribute",
        metavar="TARGET[:CONTRAST]",
        type=_target,
        action="append",
        default=[],
        help="split a token's logit (less the contrast's) into each head's, MLP's and "
        "embedding's part; each an id or a token's text, e.g. ' Mary: John' (repeatable: "
        "all with contrasts or none)",
    )
    encode.add_argument("--truncate", action="store_true", help="cut inputs to max_seq_len")
    encode.add_argument("--tokens", action="store_true", help="show each token's text")
    encode.add_argument("--json", action="store_true", help="machine-readable output")

    heatmap = command(
        "heatmap",
        "attention as a PNG: one head, a layer's heads reduced, rollout, or an entropy grid",
        _heatmap,
    )
    heatmap.add_argument("--text", required=True)
    heatmap.add_argument("--layer", type=int, default=0)
    heatmap.add_argument("--head", type=int, default=0)
    _attention_options(heatmap)
    heatmap.add_argument(
        "--entropy",
        action="store_true",
        help="instead: each layer's and head's mean row entropy as a grid (picks heads to view)",
    )
    heatmap.add_argument("--out", type=Path, default=Path("attention.png"))


def _attention_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows", type=int, nargs="*", default=[], help="query positions (-1: the last token)"
    )
    parser.add_argument(
        "--head-reduction", choices=["none", "mean", "max"], default="none", help="combine heads"
    )
    parser.add_argument("--rollout", action="store_true", help="attention rollout over the layers")


def _ids(value: str) -> list[int]:
    return [int(i) for i in value.split(",") if i.strip()]


def _head(value: str) -> tuple[int, int]:
    try:
        layer, head = (int(part) for part in value.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not LAYER:HEAD") from None
    return layer, head


Token = int | str  # an id, or a token's text (the server's tokenizer finds its id)


def _target(value: str) -> tuple[Token, Token | None]:
    parts: list[Token] = [int(p) if p.isdigit() else p for p in value.split(":")]
    if len(parts) not in (1, 2) or "" in parts:
        raise argparse.ArgumentTypeError(f"{value!r} is not TARGET or TARGET:CONTRAST")
    return parts[0], parts[1] if len(parts) == 2 else None


class _Vocabulary:
    """Token ids from their text and back, as the served model's tokenizer has them."""

    def __init__(self, client: EncoderClient, model: str) -> None:
        self.client, self.model = client, model
        self.bos_id = client.model_info(model=model)["bos_id"]

    def id_of(self, token: Token) -> int:
        """`token`'s id: an id as it is; a text that the tokenizer makes one token."""
        if isinstance(token, int):
            return token
        encoding = self.client.encode(token, return_tokens=True, model=self.model)[0]
        ids, pieces = encoding.token_ids.tolist(), encoding.tokens
        if ids and ids[0] == self.bos_id:  # the tokenizer's own start, not the text's
            ids, pieces = ids[1:], pieces[1:]
        if len(ids) != 1:
            raise ValueError(
                f"{token!r} is {len(ids)} tokens ({', '.join(map(repr, pieces))}), not one: "
                "give a single token's text, or its id"
            )
        return ids[0]

    def texts(self, ids: list[int]) -> dict[int, str]:
        """Each id's text, as the tokenizer shows it."""
        if not ids:
            return {}
        tokens = self.client.encode(ids, return_tokens=True, model=self.model)[0].tokens
        return dict(zip(ids, tokens, strict=True))


def _with_client(args: argparse.Namespace, run) -> int:
    options = ClientOptions(
        timeout_s=args.timeout, tls_root_cert=args.tls_root_cert, token=args.token
    )
    try:
        with EncoderClient(args.target, options) as client:
            return run(client, args)
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1


def _health(client: EncoderClient, args: argparse.Namespace) -> int:
    status = client.health(args.service)
    print(status)
    return 0 if status == "SERVING" else 1


def _info(client: EncoderClient, args: argparse.Namespace) -> int:
    print(json.dumps(client.model_info(model=args.model), indent=2))
    return 0


def _encode(client: EncoderClient, args: argparse.Namespace) -> int:
    inputs = args.text or [_ids(ids) for ids in args.ids]
    vocabulary = _Vocabulary(client, args.model)
    try:
        target_ids = args.target_ids + [vocabulary.id_of(t) for t in args.target_tokens]
        attribute = [
            (vocabulary.id_of(t), None if c is None else vocabulary.id_of(c))
            for t, c in args.attribute
        ]
    except ValueError as exc:
        print(f"attnserve encode: error: {exc}", file=sys.stderr)
        return 2
    predictions = {"positions": args.positions, "top_k": args.top_tokens, "target_ids": target_ids}
    options = dict(
        pooling=args.pooling,
        attention=args.attention,
        layers=args.layers,
        heads=args.heads,
        attention_dtype=args.dtype,
        attention_layout=args.layout,
        rows=args.rows,
        head_reduction=args.head_reduction,
        rollout=args.rollout,
        top_k=args.top_k,
        head_entropy=args.entropy,
        truncate=args.truncate,
        return_tokens=args.tokens,
        predictions=args.predict and predictions,
        logit_lens=args.lens and {**predictions, "lens_norm": args.lens_norm},
        hidden_states=args.hidden_norms
        and {"positions": args.positions, "norms": True, "omit_states": True},
        attribution=_attribution_request(attribute, args.positions),
        model=args.model,
    )
    out = client.encode(inputs, head_mask={head: 0.0 for head in args.ablate} or None, **options)
    if args.json:
        print(json.dumps(_output_json(out)))
        return 0
    unablated = client.encode(inputs, **options) if args.ablate else None
    named = [*target_ids, *(i for pair in attribute for i in pair if i is not None)]
    texts = vocabulary.texts(list(dict.fromkeys(named)))
    print(
        f"model {out.model_version}: {len(out)} result(s), server total "
        f"{out.total_ns / 1e6:.2f} ms (queue {out.queue_ns / 1e6:.2f}, "
        f"inference {out.inference_ns / 1e6:.2f}), {out.wire_bytes:,} bytes"
    )
    for i, e in enumerate(out):
        print(f"[{i}] {len(e.token_ids)} tokens{' (truncated)' if e.truncated else ''}")
        if unablated is None:
            _print_encoding(e, target_ids, texts)
            continue
        print("  without the ablation:")
        _print_encoding(unablated[i], target_ids, texts)
        removed = ", ".join(f"L{layer}H{head}" for layer, head in args.ablate)
        print(f"  with {removed} removed:")
        _print_encoding(e, target_ids, texts)
    return 0


def _output_json(out: EncodeOutput) -> dict:
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
            }
            for e in out
        ],
    }


def _print_encoding(e: Encoding, target_ids: list[int], texts: dict[int, str]) -> None:
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


def _token(token_id: int, texts: dict[int, str]) -> str:
    """An id with its text: "' Mary' (289)"."""
    return f"{texts[token_id]!r} ({token_id})" if token_id in texts else str(token_id)


def _attribution_request(
    targets: list[tuple[int, int | None]], positions: list[int]
) -> dict | None:
    if not targets:
        return None
    contrasts = [c for _, c in targets if c is not None]
    return {
        "target_ids": [t for t, _ in targets],
        "contrast_ids": contrasts,
        "positions": positions,
    }


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


def _heatmap(client: EncoderClient, args: argparse.Namespace) -> int:
    name = client.model_info(model=args.model)["name"]
    if args.entropy:
        out = client.encode(
            args.text, rows=args.rows, head_entropy=True, omit_weights=True, model=args.model
        )
        e = out[0]
        assert e.head_entropy is not None  # asked for
        path = render_entropy_grid(
            e.head_entropy, e.layers, e.heads, args.out, title=f"{name}: head entropy (nats)"
        )
        print(f"wrote {path} ({len(e.layers)} layers x {len(e.heads)} heads)")
        return 0
    what: dict[str, Any]
    if args.rollout:
        what = {"rollout": True}
        title = f"rollout over all layers, heads {args.head_reduction.replace('none', 'mean')}"
    elif args.head_reduction != "none":
        what = {"layers": [args.layer], "head_reduction": args.head_reduction}
        title = f"layer {args.layer}, {args.head_reduction} of its heads"
    else:
        what = {"layers": [args.layer], "heads": [args.head]}
        title = f"layer {args.layer}, head {args.head}"
    if args.rollout and args.head_reduction != "none":
        what["head_reduction"] = args.head_reduction
    out = client.encode(args.text, rows=args.rows, return_tokens=True, model=args.model, **what)
    encoding = out[0]
    assert encoding.attention is not None  # asked for
    tokens = encoding.tokens  # the server's tokenizer says what each token is
    path = render_heatmap(
        encoding.attention[0, 0],
        tokens,
        args.out,
        title=f"{name}: {title}",
        row_tokens=[tokens[r] for r in encoding.rows],
    )
    print(f"wrote {path} ({len(encoding.rows)} x {len(tokens)} tokens, {title})")
    return 0
