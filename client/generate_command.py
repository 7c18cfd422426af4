"""`attnserve generate`: a text continued by the server, streamed to the terminal; steered
by an SAE feature (`--steer FEATURE:STRENGTH`), and with `--compare` beside the plain text."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable

from attnserve.client.client import EncoderClient
from attnserve.client.generation import GeneratedToken


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the prompt")
    source.add_argument("--ids", help="the prompt's comma-separated token ids")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, help="repeatable sampling")
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true", help="go on past end-of-text")
    parser.add_argument(
        "--steer",
        action="append",
        default=[],
        metavar="FEATURE:STRENGTH",
        help="add an SAE feature's decoder direction times STRENGTH at every position; FEATURE "
        "is SAE/ID, or ID where the model serves one SAE (repeatable)",
    )
    parser.add_argument("--compare", action="store_true", help="also the plain text, after")
    parser.add_argument("--json", action="store_true", help="every token as a JSON line")


def run(client: EncoderClient, args: argparse.Namespace) -> int:
    saes = [sae["name"] for sae in client.model_info(model=args.model).get("saes", [])]
    try:
        interventions = [_steering(value, saes) for value in args.steer]
    except ValueError as exc:
        print(f"error: --steer: {exc}", file=sys.stderr)
        return 2
    prompt = args.text if args.text is not None else [int(i) for i in args.ids.split(",")]
    tokens = client.generate(
        prompt,
        model=args.model,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
        interventions=interventions,
        compare=args.compare,
    )
    if args.json:
        for token in tokens:
            print(json.dumps(token.__dict__))
        return 0
    if not args.compare:  # as it comes
        for token in tokens:
            print(token.text, end="", flush=True)
        print()
        return 0
    texts = _texts(tokens)
    print(f"steered:\n{texts[0]}\n\nplain:\n{texts[1]}")
    return 0


def _steering(value: str, saes: list[str]) -> dict:
    feature, _, strength = value.rpartition(":")
    sae, _, feature_id = feature.rpartition("/")
    if not sae:
        if len(saes) != 1:
            raise ValueError(f"name the SAE as SAE/ID; the model serves {saes}")
        sae = saes[0]
    try:
        return {
            "op": "add",
            "feature": {"sae": sae, "feature_id": int(feature_id)},
            "scale": float(strength),
        }
    except ValueError:
        raise ValueError(f"{value!r} is not FEATURE:STRENGTH") from None


def _texts(tokens: Iterable[GeneratedToken]) -> dict[int, str]:
    texts = {0: "", 1: ""}
    for token in tokens:
        texts[token.choice] += token.text
    return texts
