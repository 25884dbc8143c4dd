# llmtrain in two stages: a CUDA development image builds it with the same install script as
# a bare machine; a CUDA runtime image runs it, with the packages the built binary's shared
# libraries come from (scripts/install-deps.sh --runtime-list: Open MPI, HDF5, zstd, ...),
# mpirun, the scripts and the configs.
#   docker build -t llmtrain .
#   docker run --gpus all -v $PWD/data:/opt/llmtrain/data llmtrain train configs/tiny.toml
# Under Slurm: scripts/slurm/llmtrain.sbatch with LLMTRAIN_CONTAINER (Pyxis or Apptainer).
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
WORKDIR /opt/llmtrain
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
 && cmake --build build --target llmtrain \
 && scripts/install-deps.sh --runtime-list build/llmtrain > build/runtime-packages.txt

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
WORKDIR /opt/llmtrain
COPY scripts/install-deps.sh scripts/install-deps.sh
COPY --from=build /opt/llmtrain/build/runtime-packages.txt scripts/runtime-packages.txt
RUN scripts/install-deps.sh --packages scripts/runtime-packages.txt && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/llmtrain/build/llmtrain /usr/local/bin/llmtrain
COPY scripts/ scripts/
COPY configs/ configs/
COPY README.md README.md
ENV PATH=/opt/llmtrain/scripts:$PATH
ENTRYPOINT ["llmtrain"]
