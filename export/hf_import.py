"""Hugging Face checkpoints -> attnserve's Encoder, for the families in export/hf_families.py.

A source is a local directory or a hub id (`org/name`), the latter through
huggingface_hub's download and cache (so HF_HUB_OFFLINE and HF_HUB_CACHE apply).
Weights come from model.safetensors, sharded safetensors with their index, or a
pytorch_model.bin read with weights_only=True; never an arbitrary pickle. The
config is checked before any tensor is read, so a refusal costs nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from attnserve.export.hf_config import HFConfig, HFImportError
from attnserve.export.hf_families import (
    FAMILIES,
    IGNORED_NAMES,
    IGNORED_SUFFIXES,
    REFUSED_TYPES,
    UNEMBEDDING_NAMES,
    refuse_unsupported,
    unembedding_switches,
)
from attnserve.export.hf_weights import Load, Loads, Take
from attnserve.model.artifacts import TOKENIZER_FILENAME
from attnserve.model.checkpoint import first_shape_mismatch
from attnserve.model.config import ConfigError, ModelConfig
from attnserve.model.encoder import Encoder, encoder_from_weights

__all__ = [
    "CheckpointReader",
    "HFCheckpoint",
    "HFImportError",
    "LazyTensors",
    "config_from_hf",
    "load_hf",
    "read_hf",
    "resolve_source",
]

# Longest sequence an import serves unless asked (--max-seq-len): a checkpoint's own
# limit (32k, 128k) would be a promise the attention maps (T^2 per head) cannot keep.
DEFAULT_MAX_SEQ_LEN = 4096
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
HUB_FILES = ["*.json", "*.safetensors", "*.safetensors.index.json"]
SAFETENSORS, SHARD_INDEX, TORCH_BIN = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
)


def resolve_source(source: str | Path, log: Callable[[str], None] = print) -> Path:
    """The local directory of a checkpoint: `source` itself, or a hub id's cached snapshot."""
    path = Path(source)
    if path.is_dir():
        return path
    if not HUB_ID.match(str(source)):
        raise HFImportError(f"{source} is neither a directory nor a hub id (org/name)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    log(f"fetching {source} through the Hugging Face hub cache (HF_HUB_OFFLINE honoured)...")
    try:
        return Path(snapshot_download(str(source), allow_patterns=HUB_FILES))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise HFImportError(f"cannot fetch {source} from the hub or its cache: {exc}") from exc


def config_from_hf(
    data: dict[str, Any],
    name: str,
    specials: dict[str, int] | None = None,
    max_seq_len: int | None = None,
) -> ModelConfig:
    """The ModelConfig of a config.json, or HFImportError naming what cannot be reproduced.

    max_seq_len: the longest sequence served (at most the checkpoint's); None: the default,
    DEFAULT_MAX_SEQ_LEN, within the original context of a rope that changes past it."""
    model_type = data.get("model_type")
    if model_type in REFUSED_TYPES:
        raise HFImportError(
            f"model_type {model_type!r} is not supported: {REFUSED_TYPES[model_type]}"
        )
    if model_type not in FAMILIES:
        raise HFImportError(
            f"model_type is {model_type!r}; supported: {', '.join(sorted(FAMILIES))}"
        )
    family = FAMILIES[model_type]
    if family.text_config:
        data = data.get("text_config") or {}
    hf = HFConfig(data)
    refuse_unsupported(hf, family)
    switches = family.switches(hf) | unembedding_switches(hf, family)
    specials = specials or {}
    scaling = switches.get("rope_scaling")
    if max_seq_len is None:  # the default: never past what a length-bound rope reproduces
        max_seq_len = DEFAULT_MAX_SEQ_LEN
        if scaling is not None and scaling.length_bound:
            max_seq_len = min(max_seq_len, scaling.original_max_seq_len)
    switches["max_seq_len"] = min(switches["max_seq_len"], max_seq_len)
    try:
        return ModelConfig(
            **switches,
            vocab_size=hf["vocab_size"],
            tokenizer="hf",
            name=name,
            bos_id=specials.get("bos", 0),
            eos_id=specials.get("eos", 0),
            pad_id=specials.get("pad", 0),
        )
    except (ConfigError, TypeError) as exc:
        raise HFImportError(f"config.json maps to an invalid model: {exc}") from exc


def special_ids(directory: Path, data: dict[str, Any]) -> dict[str, int]:
    """bos, eos and pad ids: config.json, then generation_config.json, then the token
    strings of tokenizer_config.json; a missing one falls back to another (GPT-2 has only
    <|endoftext|>), and right padding makes pad's value irrelevant to real tokens."""
    sources = [data, _json(directory / "generation_config.json")]
    tokenizer_config = _json(directory / "tokenizer_config.json")
    ids: dict[str, int] = {}
    for kind in ("bos", "eos", "pad"):
        found: list[int | None] = [
            i for source in sources if (i := _as_id(source.get(f"{kind}_token_id"))) is not None
        ]
        if not found:
            found = [_token_id(directory, tokenizer_config.get(f"{kind}_token"))]
        if found[0] is not None:
            ids[kind] = found[0]
    fallback = ids.get("eos", ids.get("bos", 0))
    return {kind: ids.get(kind, fallback) for kind in ("bos", "eos", "pad")}


class LazyTensors(Mapping[str, torch.Tensor]):
    """The encoder's tensors by name, each read from the checkpoint when looked up and not
    kept: holding the mapping holds no weights."""

    def __init__(self, loads: Loads) -> None:
        self._loads = loads

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._loads[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._loads)

    def __len__(self) -> int:
        return len(self._loads)


@dataclass(frozen=True)
class HFCheckpoint:
    config: ModelConfig
    tensors: Mapping[str, torch.Tensor]  # the encoder's state_dict, read when looked up
    directory: Path
    widened: bool  # the tensors are float32; else in the checkpoint's own dtypes


def load_hf(
    source: str | Path,
    max_seq_len: int | None = None,
    log: Callable[[str], None] = print,
    require_tokenizer: bool = False,
) -> tuple[Encoder, Path]:
    """The checkpoint at `source` as an Encoder in eval mode (float32), and its directory."""
    checkpoint = read_hf(source, max_seq_len, log, require_tokenizer)
    model = encoder_from_weights(checkpoint.config, dict(checkpoint.tensors))
    return model, checkpoint.directory


def read_hf(
    source: str | Path,
    max_seq_len: int | None = None,
    log: Callable[[str], None] = print,
    require_tokenizer: bool = False,
    before_reading: Callable[[ModelConfig], bool] | None = None,
) -> HFCheckpoint:
    """The checkpoint at `source` mapped onto the encoder's tensors, and its directory.

    Only the checkpoint's headers are read here: each tensor is read from disk when looked
    up in the answer's `tensors`. require_tokenizer: refuse a directory without
    tokenizer.json (after the config's own refusals). before_reading: called with the
    config before the headers are read (the import's memory check); it says whether to
    widen the tensors to float32 (else they keep the checkpoint's dtype)."""
    directory = resolve_source(source, log)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise HFImportError(f"{directory} has no config.json")
    data = json.loads(config_file.read_text())
    name = str(source).rstrip("/").split("/")[-1]
    config = config_from_hf(data, name, special_ids(directory, data), max_seq_len)
    if require_tokenizer and not (directory / TOKENIZER_FILENAME).is_file():
        raise HFImportError(f"{source} has no {TOKENIZER_FILENAME}")
    if config.max_seq_len < data.get("max_position_embeddings", data.get("n_positions", 0)):
        log(f"max_seq_len {config.max_seq_len} (the checkpoint allows more: --max-seq-len)")
    family = FAMILIES[data["model_type"]]
    widen = before_reading is None or before_reading(config)
    checkpoint = CheckpointReader(directory, log)
    names = checkpoint.names
    prefix = next(
        (p for p in family.prefixes if any(k.startswith(p) for k in names)), family.prefixes[-1]
    )
    taken: set[str] = set()

    def taking(read: Callable[[str], torch.Tensor]) -> Take:
        def take(name: str) -> Load:
            if prefix + name not in names:
                raise HFImportError(f"missing tensor {prefix + name}")
            taken.add(prefix + name)
            return partial(read, prefix + name)

        return take

    loads = family.weights(taking(partial(checkpoint.read, widen=widen)), config)
    # The same map on PyTorch's meta device: the shapes it makes, nothing read.
    metas = family.weights(taking(checkpoint.meta), config)
    if config.unembedding == "separate":
        head = next((n for n in UNEMBEDDING_NAMES if f"{n}.weight" in names), None)
        if head is None:  # a bare model (LlamaModel...) saved without its LM head
            log("the checkpoint has no LM head: imported without next-token logits")
            config = replace(config, unembedding="none", unembedding_bias=False)
        else:
            for part in ("weight", "bias") if config.unembedding_bias else ("weight",):
                if f"{head}.{part}" not in names:
                    raise HFImportError(f"missing tensor {head}.{part}")
                taken.add(f"{head}.{part}")
                loads[f"lm_head.{part}"] = partial(checkpoint.read, f"{head}.{part}", widen)
                metas[f"lm_head.{part}"] = partial(checkpoint.meta, f"{head}.{part}")
    unknown = sorted(
        k
        for k in names - taken
        if k.removeprefix(prefix) not in IGNORED_NAMES
        and not k.endswith(IGNORED_SUFFIXES)
        and (k.startswith(prefix) or not family.text_config)
    )
    if unknown:
        raise HFImportError(f"unexpected tensor(s) {', '.join(unknown[:5])}")
    with torch.device("meta"):  # the shapes the config needs, nothing allocated
        expected = Encoder(config).state_dict()
    shapes = {name: load() for name, load in metas.items()}
    if mismatch := first_shape_mismatch(expected, shapes):
        raise HFImportError(f"{mismatch} (from config.json)")
    if missing := sorted(set(expected) - set(loads)):
        raise HFImportError(f"the checkpoint has no tensor for {', '.join(missing)}")
    return HFCheckpoint(config, LazyTensors(loads), directory, widen)


class CheckpointReader:
    """A checkpoint's tensors by name, each read from disk when asked for and widened to
    float32 there (bfloat16 and float16 checkpoints): an import holds what it is working
    on, never the checkpoint. model.safetensors, sharded safetensors with their index, or a
    pytorch_model.bin read with weights_only=True (memory-mapped, never unpickled freely)."""

    def __init__(self, directory: Path, log: Callable[[str], None] = print) -> None:
        from safetensors import safe_open

        self._files: dict[str, Path] = {}  # tensor name -> its safetensors file
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._bin: dict[str, torch.Tensor] = {}
        if (directory / SAFETENSORS).is_file():
            shards = [SAFETENSORS]
        elif (directory / SHARD_INDEX).is_file():
            shards = sorted(set(_json(directory / SHARD_INDEX).get("weight_map", {}).values()))
            for shard in shards:
                if not (directory / shard).is_file():
                    raise HFImportError(f"{SHARD_INDEX} names the shard {shard}, which is missing")
        elif (directory / TORCH_BIN).is_file():
            shards = []
            try:  # weights_only: tensors and plain containers only; mmap: read when used
                self._bin = torch.load(
                    directory / TORCH_BIN, map_location="cpu", weights_only=True, mmap=True
                )
            except Exception as exc:
                raise HFImportError(
                    f"{directory / TORCH_BIN} is not a plain tensor file: {exc}"
                ) from exc
        else:
            raise HFImportError(
                f"{directory} has neither {SAFETENSORS}, {SHARD_INDEX} nor {TORCH_BIN}"
            )
        for shard in shards:  # the headers alone
            with safe_open(str(directory / shard), framework="pt") as handle:
                shard_names = handle.keys()  # the handle is not iterable itself
                for name in shard_names:
                    self._files[name] = directory / shard
                    self._shapes[name] = tuple(handle.get_slice(name).get_shape())
        self.names = set(self._files) | set(self._bin)
        self._read: set[str] = set()
        self._progress = _progress(log, len(self.names))

    def read(self, name: str, widen: bool = True) -> torch.Tensor:
        from safetensors import safe_open

        if name in self._files:
            # Opened for this tensor alone: an open file keeps every page read through its
            # memory map resident, and the whole checkpoint would be, tensor by tensor.
            with safe_open(str(self._files[name]), framework="pt") as handle:
                tensor = handle.get_tensor(name)
        else:
            tensor = self._bin[name]
        if name not in self._read:
            self._read.add(name)
            self._progress(len(self._read))
        return tensor.float() if widen and tensor.is_floating_point() else tensor

    def meta(self, name: str) -> torch.Tensor:
        """A tensor of `name`'s shape on the meta device: nothing read."""
        shape = self._shapes[name] if name in self._files else tuple(self._bin[name].shape)
        return torch.empty(shape, device="meta")


def _progress(log: Callable[[str], None], total: int) -> Callable[[int], None]:
    """Logs how many of the checkpoint's tensors were read, every tenth."""
    step = max(total // 10, 1)

    def report(done: int) -> None:
        if done % step == 0 and total >= 100:  # small checkpoints read in a blink
            log(f"reading: {done} of {total} tensors")

    return report


def _as_id(value: Any) -> int | None:
    """A token id as configs give it: an int, or a list whose first is the main one (Llama 3
    lists several eos ids)."""
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_id(directory: Path, token: Any) -> int | None:
    """The id of a special token given as a string or as {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str) or not (directory / TOKENIZER_FILENAME).is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(directory / TOKENIZER_FILENAME)).token_to_id(token)
