# The wdsr image used by k8s/ (image: wdsr). It installs the package the way the README does:
# torch and its torchvision pinned first, then the package with its extras. Two images, each one documented line:
#   CPU (the default, small: torch's CPU-only wheel from its CPU index):
#     docker build -t wdsr:dev .
#   CUDA (a CUDA base, and the CUDA build of torch from PyPI: no CPU index):
#     docker build -t wdsr:cuda --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 --build-arg TORCH_INDEX= .
# Build args: BASE (the base image), TORCH (the torch pin), TORCHVISION (the torchvision built for that torch:
# torch 2.m.p pairs with torchvision 0.(m+15).p; spandrel imports it), TORCH_INDEX (the wheel index of both; empty:
# PyPI's, the CUDA builds), EXTRAS (the package's pip extras). docs/kubernetes.md shows the same two lines.
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG TORCH=torch==2.13.0
ARG TORCHVISION=torchvision==0.28.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# s3: S3 datasets and runs; demo: the local-dev seed photos; video: clips from video files (PyAV);
# tiff: LZW/zstd/JPEG-compressed TIFF slides and scenes (imagecodecs): one image builds every source;
# zoo: spandrel's architectures and model files (wdsr train --model spandrel:NAME, --init, export, upscale)
ARG EXTRAS=s3,demo,video,tiff,zoo
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
WORKDIR /opt/wdsr
COPY pyproject.toml README.md ./
COPY shardmaker shardmaker
COPY wdsr wdsr
# torch and torchvision in one command from one index: spandrel's torchvision is then already there, so PyPI's
# CUDA torchvision (and the CUDA torch it pulls) never lands beside the CPU torch
RUN pip install --no-cache-dir ${TORCH_INDEX:+--extra-index-url $TORCH_INDEX} "$TORCH" "$TORCHVISION" \
 && pip install --no-cache-dir ".[$EXTRAS]" \
 && shardmaker --help >/dev/null && wdsr train --help >/dev/null && torchrun --help >/dev/null \
 && case ",$EXTRAS," in *,zoo,*) python -c "import spandrel" ;; esac
# non-root, as the manifests' securityContext asks (runAsUser 10001)
USER 10001:10001
CMD ["wdsr", "--help"]
