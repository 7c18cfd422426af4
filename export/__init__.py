"""PyTorch -> ONNX: export the encoder, check it against PyTorch, write a model directory.

Torch is imported by the modules that need it, not here, so that the `attnserve`
command can list `export` on a machine without torch.
"""

# Max abs difference allowed between PyTorch and ONNX Runtime, float32 graphs.
DEFAULT_TOLERANCE = 1e-4
# The logit lens' graph: logits are dot products over d_model (issue 52: within 1e-3).
LOGITS_TOLERANCE = 1e-3
# fp16 keeps ~3 significant digits: the gate of the float16 graphs is looser, and the
# export report says what each graph really reached.
FP16_TOLERANCE = 1e-2
# 8-bit weights (MatMulNBits): the largest attention difference allowed, and the smallest
# cosine of a token's embedding with PyTorch float32's. 8-bit weights move the residual
# stream, and attention with it, as served: 0.016 on Qwen2.5-0.5B's shape, 0.025 and 0.056
# on gemma-2-9b's and Llama-3.1-8B's 2-layer prefixes (research/int8-on-cpu); where int8
# arithmetic misses the gate, float32 arithmetic (`--int8-arithmetic float32`) may not.
INT8_TOLERANCE = 5e-2
INT8_MIN_COSINE = 0.99
# What an int8 graph multiplies its 8-bit weights by (`--int8-arithmetic`, export/int8.py)
INT8_ARITHMETICS = ("int8", "float32")
