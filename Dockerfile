# llmtrain's image, in two stages. The build stage installs what compiling llmtrain needs with
# the same script as a bare machine (scripts/install-deps.sh --build) and builds the binary
# alone, no tests; the runtime stage holds the binary, the packages its shared libraries come
# from (scripts/install-deps.sh --runtime-list, written by the build stage: Open MPI, HDF5,
# zstd, OpenBLAS, ...), mpirun, scripts/ and configs/, runs as an unprivileged user, and has
# `llmtrain` as its entry point (`docker run IMAGE train CONFIG` reads as the command line).
#
# The base images are build arguments: by default the CUDA flavour (CUDA devel image builds,
# CUDA runtime image runs); a plain Debian 12 for both gives the CPU flavour. The labels say
# where the image came from (scripts/container-build-args.sh computes them):
#   docker build -t llmtrain:cuda $(scripts/container-build-args.sh) .
#   docker build -t llmtrain:cpu $(scripts/container-build-args.sh) --build-arg BUILD_IMAGE=debian:12 --build-arg RUNTIME_IMAGE=debian:12 .
# docs/container.md: running it, under Slurm too (Pyxis, Apptainer), and what has been tried.
ARG CUDA_VERSION=13.0.0
ARG BUILD_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
# The build context carries no .git: --version is told the commit.
ARG LLMTRAIN_COMMIT=
WORKDIR /opt/llmtrain
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh --build && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY CMakeLists.txt CMakeLists.txt
COPY cmake/ cmake/
COPY src/ src/
COPY kernels/ kernels/
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DLLMTRAIN_GIT_COMMIT="${LLMTRAIN_COMMIT}" \
 && cmake --build build --target llmtrain \
 && scripts/install-deps.sh --runtime-list build/llmtrain > build/runtime-packages.txt

FROM ${RUNTIME_IMAGE} AS runtime
ARG RUNTIME_IMAGE
ARG LLMTRAIN_VERSION=unknown
ARG LLMTRAIN_COMMIT=unknown
ARG LLMTRAIN_SOURCE=unknown
ARG LLMTRAIN_CREATED=
LABEL org.opencontainers.image.title="llmtrain" \
      org.opencontainers.image.description="Pre-trains GPT-2 and Llama-style language models from raw text to checkpoints, on CPUs or GPUs, under mpirun or Slurm" \
      org.opencontainers.image.version="${LLMTRAIN_VERSION}" \
      org.opencontainers.image.revision="${LLMTRAIN_COMMIT}" \
      org.opencontainers.image.source="${LLMTRAIN_SOURCE}" \
      org.opencontainers.image.created="${LLMTRAIN_CREATED}" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"
WORKDIR /opt/llmtrain
COPY scripts/install-deps.sh scripts/install-deps.sh
COPY --from=build /opt/llmtrain/build/runtime-packages.txt scripts/runtime-packages.txt
# A fixed unprivileged uid (Kubernetes' runAsNonRoot checks a number; Pyxis and Apptainer run
# as the submitting user anyway); runs/ (the default run directory) is its to write.
RUN scripts/install-deps.sh --packages scripts/runtime-packages.txt && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --create-home --shell /bin/bash llmtrain \
 && mkdir runs && chown llmtrain:llmtrain runs
COPY --from=build /opt/llmtrain/build/llmtrain /usr/local/bin/llmtrain
COPY scripts/ scripts/
COPY configs/ configs/
ENV PATH=/opt/llmtrain/scripts:$PATH
USER 10001:10001
ENTRYPOINT ["llmtrain"]
CMD ["--help"]
