"""Names shared by the exporter (which writes a model directory) and the service (which reads it).

Torch-free on purpose: the service imports it.
"""

ONNX_FILENAME = "model.onnx"  # embeddings and attention weights of every layer and head
# Embeddings only, through ONNX's fused Attention op: faster where no weights are wanted.
EMBEDDINGS_ONNX_FILENAME = "model_embeddings.onnx"
TOKENIZER_FILENAME = "tokenizer.json"  # a Hugging Face `tokenizers` file, for tokenizer="hf"
REPORT_FILENAME = "export_report.json"  # what export measured (parity, sizes, versions)
CONFIG_METADATA_KEY = "attnserve.config"  # ONNX metadata_props: the ModelConfig JSON
VERSIONS_METADATA_KEY = "attnserve.versions"  # ONNX metadata_props: exporter versions JSON
