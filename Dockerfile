# syntax=docker/dockerfile:1
# attnserve images (README "Containers"). Targets:
#   runtime (default)  the gRPC service, the client and the load generator; no torch, no compilers.
#                      --build-arg ORT=cuda makes the GPU variant (onnxruntime-gpu + CUDA 13/cuDNN 9).
#   export             one-shot: torch + the exporter; writes the default model into /models.
# Models are never baked in: /models is a volume.
ARG BASE_IMAGE=python:3.11-slim

# Extra wheels for the export stage, empty unless the build is given
# `--build-context wheels=DIR` (e.g. a local CPU torch wheel where the PyTorch index is unreachable).
FROM scratch AS wheels

# ---- base: a venv and a non-root user on the chosen base image
FROM ${BASE_IMAGE} AS base
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Debian's python refuses system-wide pip installs; a venv works on every base.
RUN python3 -m venv "$VIRTUAL_ENV" \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/attnserve --shell /usr/sbin/nologin attnserve \
 && mkdir /models /reports \
 && chown attnserve:attnserve /models /reports

# ---- build: the project as a wheel (pure Python; this stage's tools stay out of the others)
FROM base AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY model model
COPY export export
COPY service service
COPY client client
COPY bench bench
COPY protos protos
COPY attnserve attnserve
RUN --mount=type=cache,target=/root/.cache/pip \
    pip wheel --no-deps --wheel-dir /dist .

# ---- export: one-shot model export (torch lives only here)
FROM base AS export
# Where torch comes from: PyTorch's CPU index (the default PyPI torch is the multi-GB CUDA
# build). Set it empty to use only PyPI and the `wheels` context.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY --from=build /dist /dist
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,from=wheels,target=/wheels \
    pip install --find-links /wheels ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
        "$(ls /dist/attnserve-*.whl)[cpu,export]"
USER attnserve
ENTRYPOINT ["attnserve", "export"]
CMD ["--out", "/models/default", "--if-missing"]

# ---- runtime: the service (last stage, so the default target)
FROM base AS runtime
# cpu: onnxruntime (CPU execution provider, small). cuda: onnxruntime-gpu with NVIDIA's
# CUDA 13 / cuDNN 9 wheels (several GB; needs a GPU runtime such as nvidia-container-toolkit).
ARG ORT=cpu
COPY --from=build /dist /dist
RUN --mount=type=cache,target=/root/.cache/pip \
    case "$ORT" in cpu|cuda) ;; *) echo "ORT must be cpu or cuda, not '$ORT'" >&2; exit 1;; esac \
 && pip install "$(ls /dist/attnserve-*.whl)[$ORT,load]"
USER attnserve
ENV ATTNSERVE_MODEL=/models/default \
    ATTNSERVE_PORT=50051 \
    ATTNSERVE_HTTP_PORT=8080
# gRPC; HTTP (OpenAI-compatible API, JSON Encode, the explorer at /); Prometheus metrics.
EXPOSE 50051 8080 9464
# Asks the standard grpc.health.v1 service: SERVING only once the model is warm, and no
# longer while draining (README "Containers" for TLS setups).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD attnserve health --target "127.0.0.1:${ATTNSERVE_PORT}" --timeout 4 || exit 1
# Exec form: the server is PID 1 and gets SIGTERM itself, so `docker stop` drains gracefully.
ENTRYPOINT ["attnserve", "serve"]
