"""A Hugging Face checkpoint's config.json as the importer reads it, under both spellings
found in real checkpoints, and the error every import refusal raises."""

from __future__ import annotations

from typing import Any

LAYER_TYPES = ("full_attention", "sliding_attention")


class HFImportError(ValueError):
    """A checkpoint that cannot become this model; the message names the field or tensor."""


class HFConfig:
    """A config.json, read with both spellings found in real checkpoints: transformers 5's
    `rope_parameters` and the older top-level `rope_theta`, `rotary_pct`, `rope_scaling`."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        rope = data.get("rope_parameters") or {}
        self.rope = rope if isinstance(rope, dict) else {}

    def __getitem__(self, key: str) -> Any:
        if self.data.get(key) is None:
            raise HFImportError(f"config.json lacks the field {key!r}")
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def rope_theta(self) -> float:
        return _first_float(
            10000.0,
            self.rope.get("rope_theta"),
            self.data.get("rope_theta"),
            self.data.get("rotary_emb_base"),  # GPT-NeoX before transformers 5
        )

    def rotary_fraction(self) -> float:
        return _first_float(
            1.0,
            self.rope.get("partial_rotary_factor"),
            self.data.get("partial_rotary_factor"),
            self.data.get("rotary_pct"),  # GPT-NeoX before transformers 5
        )

    def rope_parameters(self, layer_type: str = "full_attention") -> tuple[str, dict[str, Any]]:
        """(where they come from, the rope parameters of `layer_type`'s layers): from
        transformers 5's rope_parameters, flat or by layer type, or the older rope_scaling
        with the top-level rope_theta (Gemma 3's local layers: rope_local_base_freq)."""
        if any(t in self.rope for t in LAYER_TYPES):
            params = self.rope.get(layer_type) or {}
            return f"rope_parameters.{layer_type}", dict(params)
        if self.rope:
            return "rope_parameters", dict(self.rope)
        scaling = self.data.get("rope_scaling")
        params = dict(scaling) if isinstance(scaling, dict) else {}
        if layer_type == "sliding_attention":
            params = {"rope_theta": self.data.get("rope_local_base_freq")}
        if params.get("rope_theta") is None:
            params["rope_theta"] = self.rope_theta()
        return "rope_scaling", params


def _first_float(default: float, *values: Any) -> float:
    return next((float(v) for v in values if v is not None), default)
