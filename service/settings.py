"""Service settings: CLI flag > ATTNSERVE_* environment variable > default.

Parsed once into a frozen Settings, logged at start and passed down
explicitly; nothing else reads the environment. Each setting has one name:
field `max_queue` is flag `--max-queue` and variable `ATTNSERVE_MAX_QUEUE`.
Each field declares its type and help once, in its metadata.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from attnserve.model.artifacts import PRECISIONS
from attnserve.service.core.batching import BatcherOptions
from attnserve.service.ort.options import PROVIDERS, RuntimeOptions

ENV_PREFIX = "ATTNSERVE_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# "last": the last token is the only one a causal model lets see the whole input.
EMBEDDINGS_POOLINGS = ("last", "mean")


def parse_bool(text: str) -> bool:
    """true/false, yes/no, on/off or 1/0, as flags and environment variables say it."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


parse_bool.__name__ = "bool"  # argparse and our errors name the type by it


def _opt(kind: type | object, help: str, **kwargs) -> dict:
    return {"type": kind, "help": help, **kwargs}


@dataclass(frozen=True)
class Settings:
    model: Path | None = field(
        default=None, metadata=_opt(Path, "one model directory (attnserve export) to serve")
    )
    model_repository: Path | None = field(
        default=None,
        metadata=_opt(
            Path,
            "a repository of models, DIR/<name>/<version>/ (Triton's layout): the newest "
            "version of each is served; load, reload and unload through the Open Inference "
            "Protocol's repository API",
        ),
    )
    default_model: str | None = field(
        default=None,
        metadata=_opt(str, "the model of requests that name none (default: the only one)"),
    )
    host: str = field(default="0.0.0.0", metadata=_opt(str, "address to listen on"))
    port: int = field(default=50051, metadata=_opt(int, "gRPC port; 0 picks a free one"))
    metrics_port: int = field(
        default=9464,
        metadata=_opt(int, "Prometheus /metrics port; 0 picks one, -1 is off"),
    )
    http_port: int = field(
        default=8080,
        metadata=_opt(
            int, "HTTP port: OpenAI-compatible API, JSON Encode, explorer; 0 picks one, -1 is off"
        ),
    )
    http_cors_origins: str | None = field(
        default=None,
        metadata=_opt(str, "comma-separated origins that browsers may call the HTTP API from"),
    )
    embeddings_pooling: str = field(
        default="last",
        metadata=_opt(
            str, "the one vector /v1/embeddings returns per input", choices=EMBEDDINGS_POOLINGS
        ),
    )
    provider: str = field(
        default="auto",
        metadata=_opt(str, "ONNX Runtime execution provider", choices=PROVIDERS),
    )
    precision: str = field(
        default="fp32",
        metadata=_opt(
            str,
            "fp16: the float16 graphs (for CUDA), fp32 in/out",
            choices=PRECISIONS,
        ),
    )
    threads: int = field(default=0, metadata=_opt(int, "ORT threads per batch; 0 = one per core"))
    intra_op_spinning: bool = field(
        default=True,
        metadata=_opt(parse_bool, "ORT workers busy-wait between the ops of a run, never after"),
    )
    max_batch_tokens: int = field(
        default=0,
        metadata=_opt(
            int,
            "batch size x longest sequence per ORT call; 0: 4096, or the model's max_seq_len "
            "where that is longer",
        ),
    )
    max_batch_delay_ms: float = field(
        default=0.0,  # 0: run as soon as the model is free; batches form while it is busy
        metadata=_opt(float, "how long a lone request waits for company"),
    )
    max_batch_size: int = field(
        default=0,
        metadata=_opt(int, "sequences per batch; 0: no limit, 1: no batching"),
    )
    max_batched_seq_len: int = field(
        default=32,
        metadata=_opt(int, "longer sequences run alone (batching them saves nothing on a CPU)"),
    )
    max_padding: float = field(
        default=0.25,
        metadata=_opt(float, "a sequence joins a batch only while padding stays this share"),
    )
    inline_max_ms: float = field(
        default=10.0,
        metadata=_opt(
            float, "a lone request expected to run this long or less runs on the event loop"
        ),
    )
    instances: int = field(
        default=0,
        metadata=_opt(
            int,
            "model copies that run batches side by side under load, sharing the threads; "
            "0: one per core on CPU, none on CUDA; 1: every batch on one session",
        ),
    )
    max_queue: int = field(default=256, metadata=_opt(int, "sequences queued before refusing"))
    max_message_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata=_opt(int, "largest gRPC request or response"),
    )
    max_inflight_bytes: int = field(
        default=1024**3,
        metadata=_opt(
            int,
            "memory budget: bytes that admitted requests may hold (answers and attention "
            "weights); more waits in the queue; 0: no budget",
        ),
    )
    memory_limit: int = field(
        default=0,
        metadata=_opt(
            int,
            "bytes the models may hold; 0: what the machine has available as each loads. A model "
            "whose weights do not fit is refused; copies beyond the first (a second graph, "
            "instances) are made only while they take a sixteenth of what is left",
        ),
    )
    release_memory: bool = field(
        default=True,
        metadata=_opt(
            parse_bool,
            "keep freed heap for the next answer; after a burst, give memory back "
            "(ORT arena shrink, malloc_trim)",
        ),
    )
    release_after_idle_s: float = field(
        default=10.0,
        metadata=_opt(
            float,
            "with --release-memory: seconds without a request before a burst's memory goes "
            "back; until then the next answer reuses its pages",
        ),
    )
    http_timeout_s: float = field(
        default=60.0,
        metadata=_opt(
            float,
            "deadline of an HTTP call that names none, like a gRPC call's (a client's "
            "Request-Timeout header, in seconds, sets its own): work past it is dropped, 504",
        ),
    )
    max_http_timeout_s: float = field(
        default=3600.0,
        metadata=_opt(
            float,
            "the longest deadline an HTTP call may ask for with Request-Timeout (an 8,192-token "
            "text's statistics on a 1B model take about 3 minutes on 2 cores)",
        ),
    )
    grace_seconds: float = field(
        default=10.0,
        metadata=_opt(float, "on SIGTERM, time for in-flight requests"),
    )
    tls_cert: Path | None = field(
        default=None, metadata=_opt(Path, "PEM certificate chain: serve TLS")
    )
    tls_key: Path | None = field(default=None, metadata=_opt(Path, "PEM private key of --tls-cert"))
    auth_token: str | None = field(
        default=None,
        repr=False,  # never logged
        metadata=_opt(str, "require 'authorization: Bearer TOKEN' metadata"),
    )
    ready_file: Path | None = field(
        default=None,
        metadata=_opt(Path, "once SERVING, write {pid, port, metrics_port} JSON here"),
    )
    log_level: str = field(default="INFO", metadata=_opt(str, "logging level", choices=LOG_LEVELS))

    def __post_init__(self) -> None:
        if (self.model is None) == (self.model_repository is None):
            raise ValueError("give --model DIR or --model-repository DIR (one of the two)")
        self.runtime_options  # noqa: B018  (validates provider and threads)
        self.batcher_options  # noqa: B018
        if self.embeddings_pooling not in EMBEDDINGS_POOLINGS:
            raise ValueError(
                f"embeddings_pooling must be one of {EMBEDDINGS_POOLINGS}, "
                f"got {self.embeddings_pooling!r}"
            )
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        for name in ("port", "metrics_port", "http_port"):
            if not -1 <= getattr(self, name) <= 65535:
                raise ValueError(f"{name} must be in [-1, 65535], got {getattr(self, name)}")
        if self.port < 0:
            raise ValueError("port must be >= 0")
        if self.http_timeout_s <= 0:
            raise ValueError(f"http_timeout_s must be > 0, got {self.http_timeout_s}")
        if self.max_http_timeout_s < self.http_timeout_s:
            raise ValueError(
                f"max_http_timeout_s ({self.max_http_timeout_s:g}) must be >= http_timeout_s "
                f"({self.http_timeout_s:g})"
            )
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        if self.max_inflight_bytes < 0:
            raise ValueError(f"max_inflight_bytes must be >= 0, got {self.max_inflight_bytes}")
        if self.max_batch_size < 0:
            raise ValueError(f"max_batch_size must be >= 0, got {self.max_batch_size}")
        if self.instances < 0:
            raise ValueError(f"instances must be >= 0, got {self.instances}")
        if self.grace_seconds < 0:
            raise ValueError(f"grace_seconds must be >= 0, got {self.grace_seconds}")
        if self.release_after_idle_s < 0:
            raise ValueError(f"release_after_idle_s must be >= 0, got {self.release_after_idle_s}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both or neither")

    @property
    def cors_origins(self) -> list[str]:
        return [o.strip() for o in (self.http_cors_origins or "").split(",") if o.strip()]

    @property
    def runtime_options(self) -> RuntimeOptions:
        return RuntimeOptions(
            provider=self.provider,
            intra_op_threads=self.threads,
            intra_op_spinning=self.intra_op_spinning,
            precision=self.precision,
        )

    @property
    def batcher_options(self) -> BatcherOptions:
        return BatcherOptions(
            max_batch_tokens=self.max_batch_tokens,
            max_delay_s=self.max_batch_delay_ms / 1e3,
            max_queue=self.max_queue,
            max_batch_size=self.max_batch_size,
            max_batched_seq_len=self.max_batched_seq_len,
            max_padding=self.max_padding,
            inline_max_s=self.inline_max_ms / 1e3,
        )


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_settings_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """One flag per Settings field. Flags left out stay None here; settings_from_args
    fills them from the environment or the default."""
    group = parser.add_argument_group("settings (flag > environment variable > default)")
    for f in fields(Settings):
        spec = dict(f.metadata)
        kind, text = spec.pop("type"), spec.pop("help")
        default = "required" if f.default is MISSING else f"default {f.default}"
        if not f.repr and f.default is not None:
            default = "default hidden"
        group.add_argument(
            flag_name(f.name),
            dest=f.name,
            type=kind,
            default=None,
            help=f"{text} [env {env_name(f.name)}; {default}]",
            **spec,
        )
    return parser


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Flag > ATTNSERVE_* variable > default, validated; ValueError names what is wrong."""
    values = {}
    for f in fields(Settings):
        value = getattr(args, f.name)
        env = env_name(f.name)
        if value is None and environ.get(env):  # empty is unset: Compose can clear a default
            kind = f.metadata["type"]
            try:
                value = kind(environ[env])
            except ValueError:
                raise ValueError(f"{env}={environ[env]!r} is not a valid {kind.__name__}") from None
            choices = f.metadata.get("choices")
            if choices and value not in choices:
                raise ValueError(f"{env}={environ[env]!r} is not one of {list(choices)}")
        if value is None and f.default is MISSING:
            raise ValueError(f"{flag_name(f.name)} (or {env}) is required")
        if value is not None:
            values[f.name] = value
    return Settings(**values)
