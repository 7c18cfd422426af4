"""Service settings: CLI flag > ATTNSERVE_* environment variable > default.

Parsed once into a frozen Settings, logged at start and passed down
explicitly; nothing else reads the environment.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from service.runtime import PROVIDERS, RuntimeOptions

ENV_PREFIX = "ATTNSERVE_"


@dataclass(frozen=True)
class Settings:
    model_dir: Path  # exported model directory (python -m export --out DIR)
    provider: str = "auto"  # execution provider: auto, cuda or cpu
    intra_op_threads: int = 0  # ORT threads per inference; 0 = one per core
    intra_op_spinning: bool = False  # ORT workers busy-wait: faster short requests, busy idle cores
    log_level: str = "INFO"  # Python logging level

    def __post_init__(self) -> None:
        self.runtime_options  # noqa: B018  (validates provider and threads)
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError(
                f"log_level must be DEBUG, INFO, WARNING or ERROR, got {self.log_level!r}"
            )

    @property
    def runtime_options(self) -> RuntimeOptions:
        return RuntimeOptions(
            provider=self.provider,
            intra_op_threads=self.intra_op_threads,
            intra_op_spinning=self.intra_op_spinning,
        )


def parse_bool(text: str) -> bool:
    """true/false, yes/no, on/off or 1/0, as flags and environment variables say it."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


parse_bool.__name__ = "bool"  # argparse and our errors name the type by it


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def add_settings_arguments(
    parser: argparse.ArgumentParser, environ: Mapping[str, str]
) -> argparse.ArgumentParser:
    """Add one flag per Settings field; its default comes from ATTNSERVE_<FIELD> if set."""
    specs = {
        "model_dir": dict(flags=("--model",), type=Path),
        "provider": dict(flags=("--provider",), type=str, choices=PROVIDERS),
        "intra_op_threads": dict(flags=("--threads",), type=int),
        "intra_op_spinning": dict(flags=("--intra-op-spinning",), type=parse_bool),
        "log_level": dict(flags=("--log-level",), type=str),
    }
    group = parser.add_argument_group("settings (flag > environment variable > default)")
    for f in fields(Settings):
        spec = dict(specs[f.name])
        flags, kind = spec.pop("flags"), spec["type"]
        env = env_name(f.name)
        if env in environ:
            try:
                default, source = kind(environ[env]), f"from {env}"
            except ValueError:
                parser.error(f"{env}={environ[env]!r} is not a valid {kind.__name__}")
        elif f.default is not MISSING:
            default, source = f.default, "default"
        else:
            default, source = None, f"required unless {env} is set"
        group.add_argument(
            *flags,
            dest=f.name,
            default=default,
            required=default is None,
            help=f"env {env}; {source}: {default}" if default is not None else source,
            **spec,
        )
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(**{f.name: getattr(args, f.name) for f in fields(Settings)})
