"""What the ONNX Runtime backend is asked to be (settings build it; service/ort/runtime.py runs it).

Engine-free, so that the settings, the command line and the health probe load no ORT."""

from __future__ import annotations

from dataclasses import dataclass

from attnserve.model.artifacts import PRECISIONS

PROVIDERS = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class RuntimeOptions:
    provider: str = "auto"  # "auto": CUDA when it really starts, else CPU; "cuda"; "cpu"
    intra_op_threads: int = 0  # threads for one inference; 0 lets ORT use one per core
    # Workers busy-wait between the operators of a run instead of sleeping and being woken
    # for each (a short sequence's operators are too small to pay for that), and stop when
    # the run ends (ORT's default keeps them spinning after it): an idle server burns nothing.
    intra_op_spinning: bool = True
    # "fp16": the float16 graphs export writes beside the float32 ones (float32 in and out);
    # meant for CUDA; on CPU they run, no faster than fp32 and less exact.
    precision: str = "fp32"
    # On CPU in float32, run the full graph through the fused Attention op
    # (model_fused.onnx) when the directory has it; False: always the traced model.onnx.
    fused_attention: bool = True
    # One session serves embeddings and attention (the full graph), so that the weights are
    # held once: each ONNX Runtime session prepacks its own copy of the matrices. The server
    # sets it for models whose second copy would not fit (service/server.py).
    single_session: bool = False
    # The decode graph (generation) with its own packed copy of the weights even in a model
    # served by one session: a step of several texts then reads packed matrices (unpacked,
    # eight texts' step took 2.4x: research/prepacked-decode). None: as the readouts graphs.
    packed_decode: bool | None = None

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider must be one of {PROVIDERS}, got {self.provider!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.intra_op_threads < 0:
            raise ValueError(f"intra_op_threads must be >= 0, got {self.intra_op_threads}")
