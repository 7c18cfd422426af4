"""Names shared by the exporter (which writes a model directory) and the service (which reads it).

Torch-free on purpose: the service imports it.
"""

ONNX_FILENAME = "model.onnx"  # embeddings and attention weights of every layer and head
# Embeddings only, through ONNX's fused Attention op: faster where no weights are wanted.
EMBEDDINGS_ONNX_FILENAME = "model_embeddings.onnx"
# The same two graphs with float16 weights and arithmetic inside, float32 inputs and outputs:
# for the CUDA execution provider (precision="fp16").
FP16_ONNX_FILENAME = "model_fp16.onnx"
EMBEDDINGS_FP16_ONNX_FILENAME = "model_embeddings_fp16.onnx"
PRECISIONS = ("fp32", "fp16")
TOKENIZER_FILENAME = "tokenizer.json"  # a Hugging Face `tokenizers` file, for tokenizer="hf"
REPORT_FILENAME = "export_report.json"  # what export measured (parity, sizes, versions)
CONFIG_METADATA_KEY = "attnserve.config"  # ONNX metadata_props: the ModelConfig JSON
VERSIONS_METADATA_KEY = "attnserve.versions"  # ONNX metadata_props: exporter versions JSON


def graph_filenames(precision: str) -> tuple[str, str]:
    """(full graph, embeddings-only graph) file names for a precision in PRECISIONS."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp16":
        return FP16_ONNX_FILENAME, EMBEDDINGS_FP16_ONNX_FILENAME
    return ONNX_FILENAME, EMBEDDINGS_ONNX_FILENAME
