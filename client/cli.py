"""`attnserve {health,info,encode,generate,heatmap}`: call an attnserve server from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import grpc

from attnserve.client import generate_command, graph_command
from attnserve.client.client import ClientOptions, EncoderClient
from attnserve.client.display import output_json, print_encoding
from attnserve.client.heatmap import render_entropy_grid, render_heatmap


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

    _encode_arguments(command("encode", "encode texts or token ids", _encode))
    generate_command.add_arguments(
        command(
            "generate", "continue a text, steered by SAE features if asked", generate_command.run
        )
    )

    graph_command.add_arguments(
        command(
            "graph",
            "circuit-tracer's attribution graph of a prompt, with a transcoder set",
            graph_command.run,
        )
    )

    _heatmap_arguments(
        command(
            "heatmap",
            "attention as a PNG: one head, a layer's heads reduced, rollout, or an entropy grid",
            _heatmap,
        )
    )


def _encode_arguments(encode: argparse.ArgumentParser) -> None:
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
    _readout_arguments(encode)
    _patching_arguments(encode)
    _feature_arguments(encode)
    encode.add_argument("--truncate", action="store_true", help="cut inputs to max_seq_len")
    encode.add_argument("--tokens", action="store_true", help="show each token's text")
    encode.add_argument("--json", action="store_true", help="machine-readable output")


def _readout_arguments(encode: argparse.ArgumentParser) -> None:
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


def _patching_arguments(encode: argparse.ArgumentParser) -> None:
    changes = encode.add_argument_group("activation patching")
    changes.add_argument(
        "--patch",
        metavar="CLEAN_TEXT",
        help="run the input (the corrupted one) once per layer and token with that place "
        "taken from this text's run, and print how much of its answer each brings back",
    )
    changes.add_argument("--answer", metavar="TOKEN", help="the clean answer: an id or its text")
    changes.add_argument("--contrast", metavar="TOKEN", help="the corrupted answer, likewise")
    changes.add_argument(
        "--patch-hook",
        choices=["resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post", "z"],
        default="resid_pre",
        help="the kind of site patched (z: each head's output at every position)",
    )
    changes.add_argument(
        "--patch-method",
        choices=["activation", "attribution"],
        default="activation",
        help="attribution: the grid's linear estimate by one backward (and each token's "
        "saliency), where the model directory has gradient graphs (`attnserve gradient`)",
    )


def _feature_arguments(encode: argparse.ArgumentParser) -> None:
    features = encode.add_argument_group("sparse-autoencoder features")
    features.add_argument(
        "--sae",
        metavar="NAME",
        action="append",
        default=[],
        help="an SAE the model serves (`attnserve info` lists them): each token's "
        "strongest features (repeatable)",
    )
    features.add_argument("--top-features", type=int, default=5, help="features per token")
    features.add_argument(
        "--skip-first-token", action="store_true", help="leave the first token's out"
    )


def _heatmap_arguments(heatmap: argparse.ArgumentParser) -> None:
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
        patching = _patching_request(args, vocabulary)
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
        return_tokens=args.tokens or bool(args.sae) or bool(args.patch),
        features={
            "saes": args.sae,
            "top_k": args.top_features,
            "skip_first_token": args.skip_first_token,
        }
        if args.sae
        else None,
        predictions=args.predict and predictions,
        logit_lens=args.lens and {**predictions, "lens_norm": args.lens_norm},
        hidden_states=args.hidden_norms
        and {"positions": args.positions, "norms": True, "omit_states": True},
        attribution=_attribution_request(attribute, args.positions),
        patching=patching,
        model=args.model,
    )
    out = client.encode(inputs, head_mask={head: 0.0 for head in args.ablate} or None, **options)
    if args.json:
        print(json.dumps(output_json(out)))
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
            print_encoding(e, target_ids, texts)
            continue
        print("  without the ablation:")
        print_encoding(unablated[i], target_ids, texts)
        removed = ", ".join(f"L{layer}H{head}" for layer, head in args.ablate)
        print(f"  with {removed} removed:")
        print_encoding(e, target_ids, texts)
    return 0


def _patching_request(args: argparse.Namespace, vocabulary: _Vocabulary) -> dict | None:
    """--patch's request; ValueError where an answer is missing or not one token."""
    if args.patch is None:
        return None
    if args.answer is None or args.contrast is None:
        raise ValueError("--patch needs --answer and --contrast (the clean and corrupted answers)")
    answer, contrast = (
        vocabulary.id_of(int(t) if t.isdigit() else t) for t in (args.answer, args.contrast)
    )
    return {
        "source": args.patch,
        "hook": args.patch_hook,
        "target": answer,
        "contrast": contrast,
        "method": args.patch_method,
    }


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
