"""The Open Inference Protocol (KServe V2): Python generated from grpc_service.proto.

Its messages are in the protocol's own package, `inference`, as tritonclient's are: the
two cannot be imported into one process (protobuf refuses a symbol defined twice), so
attnserve's client never imports this module; only the server does.
"""
