"""`attnserve export --out DIR [--checkpoint PATH | --from-hf SOURCE | --seed N [--config JSON]]`

SOURCE is a Hugging Face checkpoint's directory or hub id (docs/model.md).

With no source, the default model: the checkpoint trained by `attnserve train` and
shipped in the package (attnserve/model/pretrained/, README "The model").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from importlib import resources
from pathlib import Path

from attnserve.export import DEFAULT_TOLERANCE, FP16_TOLERANCE, INT8_ARITHMETICS
from attnserve.model.artifacts import ONNX_FILENAME, PRECISIONS
from attnserve.model.config import ConfigError, ModelConfig

# The default model's weights (trained by `attnserve train`), shipped in the package.
DEFAULT_CHECKPOINT = Path(
    str(resources.files("attnserve.model") / "pretrained" / "default.safetensors")
)
# The default model's SAE (`attnserve sae train` made it): exported beside it, named as
# Neuronpedia names SAEs (LAYER-SET: its site is blocks.2.hook_resid_pre).
DEFAULT_SAE = Path(str(resources.files("attnserve.model") / "pretrained" / "default-sae"))
DEFAULT_SAE_NAME = "2-res"
DEFAULT_TRANSCODERS = DEFAULT_SAE.with_name("default-transcoders")
DEFAULT_TRANSCODERS_NAME = "plt"  # its members: 0-plt ... 3-plt
# The lengths of the gradient graphs `attnserve gradient` writes unless told (and the
# default model ships): a short prompt, a paragraph, a page.
DEFAULT_GRADIENT_LENGTHS = (16, 64, 256)


def add_commands(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export",
        help="export the encoder to an ONNX model directory",
        description="Export the encoder to an ONNX model directory, checked against PyTorch.",
    )
    parser.add_argument("--out", required=True, type=Path, help="model directory to write")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", type=Path, help="safetensors checkpoint to export")
    source.add_argument(
        "--from-hf",
        metavar="DIR_OR_HUB_ID",
        help="a Hugging Face checkpoint of a supported family (gpt2, llama, mistral, qwen2, "
        "gpt_neox, gemma, phi3): a local directory (config.json, safetensors, tokenizer.json) "
        "or a hub id through the hub's cache (HF_HUB_OFFLINE honoured); docs/model.md",
    )
    source.add_argument(
        "--seed", type=int, help="random weights from this seed (tests, benchmarks)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="JSON file of ModelConfig fields for a seeded model (others keep their defaults)",
    )
    parser.add_argument(
        "--max-seq-len",
        type=int,
        help="with --from-hf: the longest sequence served (default: the checkpoint's own, "
        "at most 4096)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"max abs diff allowed, PyTorch vs ONNX Runtime (default {DEFAULT_TOLERANCE:g})",
    )
    parser.add_argument(
        "--fp16-tolerance",
        type=float,
        default=FP16_TOLERANCE,
        help=f"the same for the float16 graphs (default {FP16_TOLERANCE:g})",
    )
    parser.add_argument(
        "--precision",
        action="append",
        choices=PRECISIONS,
        help="the graphs the directory holds, repeatable (default: fp32): fp16 for CUDA; "
        "int8 (8-bit matrix weights, int8 arithmetic on CPU) for models that do not fit in "
        "float32; each lower precision's fidelity is checked and recorded",
    )
    parser.add_argument(
        "--int8-arithmetic",
        choices=INT8_ARITHMETICS,
        default="int8",
        help="what the int8 graphs multiply their 8-bit weights by: int8 (default, fastest) or "
        "float32 (attention about twice as close to float32's, 2.4-20x slower on CPU)",
    )
    parser.add_argument(
        "--memory-limit",
        type=int,
        metavar="BYTES",
        help="memory the import may use (default: what the machine has available); an import "
        "expected to need more is refused before any tensor is read",
    )
    parser.add_argument(
        "--if-missing",
        action="store_true",
        help="do nothing if OUT already holds a model (one-shot export containers)",
    )
    parser.set_defaults(run=run_export)
    _add_gradient_command(commands)


def _add_gradient_command(commands: argparse._SubParsersAction) -> None:
    gradient = commands.add_parser(
        "gradient",
        help="write the graphs attribution patching takes its gradients from",
        description="Trace the gradient of a logit difference through the model (nothing "
        "frozen) at every site interventions change and at the token embeddings, one ONNX "
        "graph per prompt length, checked against PyTorch, into MODEL_DIR (a float32 "
        "export). Served as attribution patching (options.patching.method) of inputs up to "
        "the longest length.",
    )
    gradient.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    gradient.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=list(DEFAULT_GRADIENT_LENGTHS),
        help="prompt lengths, a graph each; a prompt is padded to the shortest it fits "
        f"(default {' '.join(map(str, DEFAULT_GRADIENT_LENGTHS))}; over max_seq_len: left out)",
    )
    gradient.set_defaults(run=run_gradient)


def build_source(args: argparse.Namespace, precisions: tuple[str, ...]):
    """What to export, and the files to ship beside it: the float32 model, or (an int8
    import where float32 does not fit) a checkpoint's tensors, read when written."""
    # torch is imported here, not at module level, so `--help` stays instant.
    from attnserve.export.chat_template import read_chat_template
    from attnserve.model.artifacts import CHAT_TEMPLATE_FILENAME, TOKENIZER_FILENAME
    from attnserve.model.checkpoint import load_checkpoint
    from attnserve.model.encoder import build_encoder, encoder_from_weights
    from attnserve.model.footprint import plan_import

    if args.checkpoint:
        return load_checkpoint(args.checkpoint), {}
    if args.seed is None and not args.config and not args.from_hf:
        return load_checkpoint(DEFAULT_CHECKPOINT), {}
    if args.from_hf:
        from attnserve.export.hf_import import read_hf

        def plan(config: ModelConfig) -> bool:
            return plan_import(config, precisions, args.memory_limit)

        checkpoint = read_hf(
            args.from_hf, args.max_seq_len, require_tokenizer=True, before_reading=plan
        )
        extra_files = {TOKENIZER_FILENAME: checkpoint.directory / TOKENIZER_FILENAME}
        chat = read_chat_template(checkpoint.directory)
        if chat is not None:  # shipped beside the tokenizer
            path = Path(tempfile.mkdtemp(prefix="attnserve-chat-")) / CHAT_TEMPLATE_FILENAME
            path.write_text(json.dumps(chat, indent=2) + "\n")
            extra_files[CHAT_TEMPLATE_FILENAME] = path
        if not checkpoint.widened:
            return checkpoint, extra_files
        return encoder_from_weights(checkpoint.config, dict(checkpoint.tensors)), extra_files
    config = ModelConfig()
    if args.config:
        try:
            overrides = json.loads(args.config.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read --config {args.config}: {exc}") from exc
        config = ModelConfig.from_dict({**config.to_dict(), **overrides})
    plan_import(config, ("fp32",), args.memory_limit)
    return build_encoder(config, seed=args.seed or 0), {}


def _default_model(args: argparse.Namespace) -> bool:
    """Whether the export is of the default model (what `make serve` serves)."""
    if args.checkpoint:
        return Path(args.checkpoint).resolve() == DEFAULT_CHECKPOINT.resolve()
    return args.seed is None and not args.config and not args.from_hf


def run_export(args: argparse.Namespace) -> int:
    if args.max_seq_len is not None and (not args.from_hf or args.max_seq_len < 1):
        print("error: --max-seq-len takes a positive integer, with --from-hf", file=sys.stderr)
        return 2
    if args.config and (args.checkpoint or args.from_hf):
        print(
            "error: --config applies to seeded models; checkpoints carry their own config",
            file=sys.stderr,
        )
        return 2
    if args.if_missing and (args.out / ONNX_FILENAME).is_file():
        print(f"{args.out / ONNX_FILENAME} exists; nothing to export (--if-missing)")
        return 0
    from attnserve.export.hf_import import HFCheckpoint, HFImportError
    from attnserve.export.model_dir import write_model_dir, write_streamed_int8
    from attnserve.export.parity import ParityError
    from attnserve.export.scratch import ExportWriteError
    from attnserve.model.checkpoint import CheckpointError
    from attnserve.model.footprint import FootprintError

    precisions = tuple(dict.fromkeys(args.precision or ["fp32"]))
    try:
        default = _default_model(args)
        source, extra_files = build_source(args, precisions)
        if isinstance(source, HFCheckpoint):
            write_streamed_int8(
                source.config,
                source.tensors,
                args.out,
                extra_files=extra_files,
                int8_arithmetic=args.int8_arithmetic,
            )
        else:
            write_model_dir(
                source,
                args.out,
                tolerance=args.tolerance,
                extra_files=extra_files,
                fp16_tolerance=args.fp16_tolerance,
                precisions=precisions,
                release_weights=True,  # not used after: freed before the checks
                int8_arithmetic=args.int8_arithmetic,
            )
        if default:  # served with its SAE (features, steering), transcoders (graphs), gradients
            from attnserve.export.sae import add_sae
            from attnserve.export.transcoder_set import add_transcoder_set

            add_sae(args.out, DEFAULT_SAE, name=DEFAULT_SAE_NAME)
            add_transcoder_set(args.out, DEFAULT_TRANSCODERS, name=DEFAULT_TRANSCODERS_NAME)
            from attnserve.export.gradient import write_gradients

            write_gradients(args.out, DEFAULT_GRADIENT_LENGTHS)  # attribution patching
    except (ConfigError, CheckpointError, HFImportError, FootprintError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ExportWriteError as exc:
        print(f"error: {exc.strerror}", file=sys.stderr)
        return 1
    except ParityError as exc:
        print(f"error: {exc}; nothing was written to {args.out}", file=sys.stderr)
        return 1
    return 0


def run_gradient(args: argparse.Namespace) -> int:
    from attnserve.export.gradient import GradientError, write_gradients
    from attnserve.export.read_back import ReadBackError

    try:
        write_gradients(args.model_dir, args.lengths, log=lambda line: print(line, flush=True))
    except (GradientError, ReadBackError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
