"""attnserve: a causal self-attention encoder served by ONNX Runtime over gRPC.

Everything installs under this one name; the source folders are in it as committed
relative symlinks (attnserve/service -> ../service, ...), so an import names a file:

    attnserve.model    <- model/     PyTorch encoder; torch-free config and tokenizer
    attnserve.export   <- export/    PyTorch -> ONNX, parity gate, model directory
    attnserve.service  <- service/   backend, batcher, gRPC transport, settings
    attnserve.client   <- client/    EncoderClient, AsyncEncoderClient
    attnserve.bench    <- bench/     latency sweep, load generator, attention and endpoint costs
    attnserve.v1       <- protos/attnserve/v1/   generated protobuf code and the wire format
    attnserve.oip      <- protos/attnserve/oip/  the Open Inference Protocol (KServe V2), generated

Not installed: perf/ (the suite behind docs/BENCHMARKS.md, run from a checkout),
research/ (finished investigations), tests/.
"""
