"""The Open Inference Protocol (KServe V2): Python generated from grpc_service.proto.

Its messages are in the protocol's own package, `inference`, as tritonclient's are; the
generated code registers them in a descriptor pool of its own (protos/generate.py), so
attnserve's and tritonclient's import side by side in one process.
"""
