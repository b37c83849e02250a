# trtcore serve in a container: the OpenAI-compatible server on port 8000, on a GPU.
#
#   docker build -t trtcore:0.1.0 .
#   docker run --gpus all -p 8000:8000 -v /path/to/hf-model:/models/model:ro trtcore:0.1.0 --model /models/model
#
# The engine is built when the server starts (or pass --engine FILE from `trtcore build`);
# generated kernels and downloads are cached under $TRTCORE_CACHE (mount a volume there to keep
# them between runs). Kubernetes: deploy/kubernetes.yaml.
FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/trtcore \
    PATH=/opt/trtcore/bin:$PATH \
    TRTCORE_CACHE=/cache

# Ubuntu 24.04's python3 is 3.12; a venv, since the system interpreter is externally managed (PEP 668)
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/trtcore

WORKDIR /opt/trtcore/src
COPY pyproject.toml README.md ./
COPY trtcore trtcore
COPY models models
COPY plugins plugins
COPY kernels kernels
# GPU extras: TensorRT (trt) and the cuda backend (gpu: CuPy, nvmath-python); NVRTC and the CUDA
# headers for the generated kernels (the runtime image has no headers); the server (serve)
RUN pip install ".[trt,gpu,serve]" nvidia-cuda-nvrtc nvidia-cuda-runtime

# an unprivileged user that owns the cache
RUN useradd --create-home --uid 10001 trtcore && mkdir -p /cache /models && chown trtcore /cache
USER 10001
WORKDIR /home/trtcore

EXPOSE 8000
# /health answers 200 once the engine is ready; building it may take minutes (start period)
HEALTHCHECK --interval=30s --timeout=5s --start-period=15m --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
# listen on every interface of the container; later arguments (--model, --engine, --port ...) add to these.
# An API key for the /v1 routes: docker run -e TRTCORE_API_KEY=... (not --api-key: a command line shows in ps);
# the HEALTHCHECK's /health needs none. The server exits 1 when its engine process dies: docker run --restart on-failure
ENTRYPOINT ["trtcore", "serve", "--host", "0.0.0.0", "--port", "8000"]
