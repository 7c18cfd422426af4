"""Attribution graphs (circuit tracing) of a served model with a transcoder set: circuit-tracer
0.5.0's algorithm (attribute.py), its pruning and scores (influence.py) and its graph files
(files.py), on the replacement model's backward graph in ONNX Runtime (core/backend.py
ReplacementModel; service/ort/replacement.py)."""
