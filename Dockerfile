# llmtrain on a CUDA development image: the same install script as a bare machine, a
# Release build, and llmtrain as the entrypoint. Run: docker run --gpus all IMAGE train CONFIG
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04
WORKDIR /opt/llmtrain
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
 && cmake --build build --target llmtrain \
 && install -m 0755 build/llmtrain /usr/local/bin/llmtrain
ENTRYPOINT ["llmtrain"]
