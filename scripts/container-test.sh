#!/usr/bin/env bash
# container-test.sh [--scratch DIR] [--compare-bin LLMTRAIN] [--tag NAME]: builds llmtrain's
# image (Dockerfile) and runs it, as a cluster administrator would before putting it on nodes.
#
#  1. A Debian 12 base: `debootstrap --variant=minbase bookworm` from the Debian mirror of
#     this machine's apt sources, kept as a tarball in the cache (LLMTRAIN_CONTAINER_CACHE,
#     default ~/.cache/llmtrain-container) and imported (`podman import`) as
#     localhost/debian:bookworm-minbase.
#  2. The CPU flavour, built with `buildah bud --isolation chroot` from a clean cache (no layer
#     reused) with that base for both stages, the source tree as its context, and the labels
#     of scripts/container-build-args.sh.
#  3. Inside the image (`buildah from` + `buildah run --isolation chroot`, as its own
#     unprivileged user, with the data and the checkpoint and run directories mounted from
#     the host as a cluster's shared file system would be):
#       - its labels, entry point and user, and that every layer names the instruction that
#         made it; `llmtrain --version` names the commit it was built from (and that of
#         LLMTRAIN given with --compare-bin);
#       - `podman run IMAGE --version` and `podman run IMAGE` go through the entry point as
#         `docker run` does, where an OCI runtime can start containers here (crun refuses a
#         hybrid cgroup hierarchy, runc takes it); where none can, it says so and why;
#       - it holds no compiler and no build tree;
#       - `mpirun -np 2 llmtrain doctor`: the config, data, storage and MPI checks pass;
#       - `mpirun -np 2 llmtrain train`: a tiny run is stopped by SIGUSR1 to mpirun (a
#         scheduler's preemption: every rank saves a checkpoint and exits 75), resumed with
#         `--resume auto`, and every step after the resume and the final weights and AdamW
#         moments are bit for bit those of an uninterrupted run (compared on the host).
#  4. The CUDA flavour (the Dockerfile's default base images) the same way where both CUDA
#     base images are in this machine's image storage; otherwise it says so.
# It reports the image sizes and how long each part took. The test image is removed at the
# end unless --tag names it. Exits 0 when everything passes, 1 on a failure, 77 (skipped)
# with the tool's own words when the tools cannot run on this machine (not installed, not
# root, no mirror, storage or isolation refused).
#
# No rlimits are imposed on containers (containers.conf: default_ulimits = []): the engines'
# default nofile limit is refused in some sandboxes ("crun: setrlimit `RLIMIT_NOFILE`:
# Operation not permitted"); containers keep the caller's.
set -u
export PATH=$PATH:/usr/sbin:/sbin
source_dir=$(cd "$(dirname "$0")/.." && pwd)
cache=${LLMTRAIN_CONTAINER_CACHE:-${XDG_CACHE_HOME:-${HOME:-/var/tmp}/.cache}/llmtrain-container}
base_image=localhost/debian:bookworm-minbase
scratch="" compare_bin="" keep_tag=""
while [ $# -gt 0 ]; do
    case $1 in
        --scratch) scratch=${2:?--scratch DIR}; shift 2 ;;
        --compare-bin) compare_bin=${2:?--compare-bin LLMTRAIN}; shift 2 ;;
        --tag) keep_tag=${2:?--tag NAME}; shift 2 ;;
        -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "container-test: unknown argument '$1' (--scratch DIR, --compare-bin LLMTRAIN, --tag NAME)" >&2; exit 2 ;;
    esac
done

say() { echo "container-test: $*"; }
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
# The last lines of a tool's log, for a message.
tail_of() { tail -n "${2:-5}" "$1" 2>/dev/null | tr '\n' ' '; }
started=$SECONDS
phase_started=$SECONDS
timings=()
end_phase() { timings+=("$1 $((SECONDS - phase_started)) s"); phase_started=$SECONDS; }

for tool in debootstrap buildah podman; do
    command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh installs debootstrap, buildah and podman)"
done
command -v h5diff >/dev/null || fail "h5diff is not installed (hdf5-tools: scripts/install-deps.sh); it compares the checkpoints"
[ -n "$compare_bin" ] && { [ -x "$compare_bin" ] || fail "--compare-bin $compare_bin: not an executable"; }
[ -r "$source_dir/data/fortunes.txt" ] || fail "no $source_dir/data/fortunes.txt (scripts/make-tiny-corpus.sh makes it)"
if [ -z "$scratch" ]; then
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/llmtrain-container.XXXXXX")
    remove_scratch=1
else
    rm -rf "$scratch"
    mkdir -p "$scratch"
fi
export CONTAINERS_CONF=$scratch/containers.conf
printf '[containers]\ndefault_ulimits = []\n' >"$CONTAINERS_CONF"

containers=() images=() intermediates=()
clean_up() {
    local name
    for name in "${containers[@]}"; do buildah rm "$name" >/dev/null 2>&1; done
    for name in "${images[@]}"; do buildah rmi "$name" >/dev/null 2>&1; done
    local kept=""
    [ -n "$keep_tag" ] && kept=sha256:$(podman image inspect --format '{{.Id}}' "$keep_tag" 2>/dev/null)
    for name in $(podman images -a -q --no-trunc --sort created | tac); do
        [ "$name" != "$kept" ] && [[ " ${intermediates[*]} " == *" $name "* ]] && podman rmi "$name" >/dev/null 2>&1
    done
    [ -n "${remove_scratch:-}" ] && rm -rf "$scratch"
}
trap clean_up EXIT

# ---- 1. The Debian 12 base ----------------------------------------------------------------

# apt_uris SUITE: the URIs this machine's apt sources fetch SUITE's binary packages from, one
# a line (one-line sources.list entries and deb822 .sources stanzas alike).
apt_uris() {
    local suite=$1 file
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$file" ] && awk -v suite="$suite" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while (i <= NF && $(i - 1) !~ /\]$/) i++
                                                             if ($(i + 1) == suite) print $i }' "$file"
    done
    for file in /etc/apt/sources.list.d/*.sources; do
        [ -r "$file" ] && awk -v suite="$suite" 'BEGIN { RS = ""; FS = "\n" }
            { types = ""; uris = ""; suites = ""; enabled = "yes"
              for (i = 1; i <= NF; i++) {
                  if ($i ~ /^#/) continue
                  split($i, kv, ":[ \t]*"); key = tolower(kv[1]); value = substr($i, length(kv[1]) + 2); sub(/^[ \t]+/, "", value)
                  if (key == "types") types = value; else if (key == "uris") uris = value
                  else if (key == "suites") suites = value; else if (key == "enabled") enabled = tolower(value)
              }
              if (enabled == "no" || (" " types " ") !~ / deb /) next
              n = split(suites, s, /[ \t]+/); found = 0
              for (i = 1; i <= n; i++) if (s[i] == suite) found = 1
              if (found) { split(uris, u, /[ \t]+/); print u[1] } }' "$file"
    done
}

# The base's apt sources: bookworm from the machine's Debian mirror (or LLMTRAIN_DEBIAN_MIRROR),
# with its updates and security suites where the machine has them. On another Debian release
# the mirror of its own suite serves bookworm too.
mirror=${LLMTRAIN_DEBIAN_MIRROR:-$(apt_uris bookworm | head -n 1)}
if [ -z "$mirror" ] && [ "$(sed -n 's/^ID=//p' /etc/os-release 2>/dev/null)" = debian ]; then
    mirror=$(apt_uris "$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release)" | head -n 1)
fi
[ -n "$mirror" ] || skip "no Debian 12 (bookworm) mirror in this machine's apt sources: set LLMTRAIN_DEBIAN_MIRROR"
{
    echo "deb $mirror bookworm main"
    for suite in bookworm-updates bookworm-security; do
        uri=$(apt_uris $suite | head -n 1)
        [ -n "$uri" ] && echo "deb $uri $suite main"
    done
} >"$scratch/base.sources.list"

mkdir -p "$cache"
rootfs_tar=$cache/debian-bookworm-minbase.tar
if [ -f "$rootfs_tar" ] && cmp -s "$scratch/base.sources.list" "$cache/debian-bookworm-minbase.sources.list"; then
    say "base: cached $rootfs_tar ($(($(stat -c %s "$rootfs_tar") / 1000000)) MB), apt sources: $(paste -sd';' "$scratch/base.sources.list")"
else
    say "base: debootstrap --variant=minbase bookworm from $mirror"
    rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$scratch/debootstrap.log" 2>&1 ||
        { rm -rf "$rootfs"; skip "debootstrap failed: $(grep -m3 '^E:' "$scratch/debootstrap.log" | tr '\n' ' ' | grep . || tail_of "$scratch/debootstrap.log" 3)"; }
    cp "$scratch/base.sources.list" "$rootfs/etc/apt/sources.list"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    { tar --numeric-owner -C "$rootfs" -cf "$rootfs_tar.tmp" . && mv "$rootfs_tar.tmp" "$rootfs_tar"; } || fail "cannot write $rootfs_tar"
    cp "$scratch/base.sources.list" "$cache/debian-bookworm-minbase.sources.list"
    rm -rf "$rootfs"
    say "base: $rootfs_tar ($(($(stat -c %s "$rootfs_tar") / 1000000)) MB)"
fi
rootfs_sha=$(sha256sum "$rootfs_tar" | cut -c1-64)
if [ "$(podman image inspect --format '{{index .Labels "llmtrain.rootfs.sha256"}}' "$base_image" 2>/dev/null)" != "$rootfs_sha" ]; then
    old_id=$(podman image inspect --format '{{.Id}}' "$base_image" 2>/dev/null)
    podman import --change "LABEL llmtrain.rootfs.sha256=$rootfs_sha" \
        --change "LABEL org.opencontainers.image.description=\"Debian 12 (bookworm) minbase, debootstrap from $mirror\"" \
        "$rootfs_tar" "$base_image" >"$scratch/import.log" 2>&1 || skip "podman import failed: $(tail_of "$scratch/import.log")"
    [ -n "$old_id" ] && podman rmi "$old_id" >/dev/null 2>&1
fi
say "base: $base_image (rootfs sha256 ${rootfs_sha:0:12})"

# Can this machine run a container at all? If not, the tool's words say why.
probe=$(buildah from --pull=never "$base_image" 2>"$scratch/probe.log") || skip "buildah from $base_image failed: $(tail_of "$scratch/probe.log")"
containers+=("$probe")
buildah run --isolation chroot "$probe" true >>"$scratch/probe.log" 2>&1 || skip "buildah run --isolation chroot failed: $(tail_of "$scratch/probe.log")"
# `podman run`: the default OCI runtime, else runc.
podman_run=()
for runtime in "" runc; do
    if podman ${runtime:+--runtime "$runtime"} run --rm --network=none "$base_image" true >>"$scratch/podman-probe.log" 2>&1; then
        podman_run=(podman ${runtime:+--runtime "$runtime"} run --rm --network=none)
        break
    fi
done
[ ${#podman_run[@]} -gt 0 ] || say "podman run: no OCI runtime starts a container here: $(grep -i error "$scratch/podman-probe.log" | sort -u | paste -sd' ')"
end_phase base

# ---- 2. Building ----------------------------------------------------------------------------

build_args_text=$("$source_dir/scripts/container-build-args.sh") || fail "scripts/container-build-args.sh failed"
mapfile -t build_args <<<"$build_args_text"
arg_value() { printf '%s\n' "${build_args[@]}" | sed -n "s/^--build-arg=$1=//p"; }
version=$(arg_value LLMTRAIN_VERSION) commit=$(arg_value LLMTRAIN_COMMIT) source=$(arg_value LLMTRAIN_SOURCE) created=$(arg_value LLMTRAIN_CREATED)
epoch=$(date -u -d "$created" +%s) || fail "LLMTRAIN_CREATED='$created' is not a date"

# build_image TAG LOG [BUILD ARGS...]: a build from a clean cache (no layer reused), one layer
# per instruction as Docker makes them (an image of a new llmtrain differs from the last one
# in its small top layers only). The intermediate images it leaves are removed at the end,
# children first (an image that another still needs refuses, and stays).
build_image() {
    local tag=$1 log=$2 code
    shift 2
    [ "$tag" = "$keep_tag" ] || images+=("$tag")
    podman images -a -q --no-trunc | sort -u >"$scratch/images.before"
    buildah bud --isolation chroot --no-cache --layers --force-rm --pull=never --timestamp "$epoch" \
        "${build_args[@]}" "$@" -t "$tag" -f "$source_dir/Dockerfile" "$source_dir" >"$log" 2>&1
    code=$?
    mapfile -t new_images < <(podman images -a -q --no-trunc | sort -u | comm -13 "$scratch/images.before" -)
    intermediates=("${new_images[@]}" "${intermediates[@]}")
    return $code
}
# size_mb IMAGE: the image's uncompressed size.
size_mb() { echo $(($(podman image inspect --format '{{.Size}}' "$1") / 1000000)); }
# layers IMAGE: each layer that holds files, with the instruction that made it and its size.
layers() {
    podman history --no-trunc --format $'{{.Size}}\t{{.CreatedBy}}' "$1" |
        awk -F'\t' '$1 != "0 B" { sub(/^.*\/bin\/sh -c (#\(nop\) )?/, "", $2); sub(/(file|dir):[0-9a-f]+ /, "", $2)
                                 printf "%s%s (%s)", sep, substr($2, 1, 70), $1; sep = "; " }'
}

cpu_image=${keep_tag:-localhost/llmtrain-container-test:cpu-$$}
say "cpu: buildah bud --build-arg BUILD_IMAGE=$base_image --build-arg RUNTIME_IMAGE=$base_image -t $cpu_image (log: $scratch/build-cpu.log)"
build_image "$cpu_image" "$scratch/build-cpu.log" --build-arg "BUILD_IMAGE=$base_image" --build-arg "RUNTIME_IMAGE=$base_image" ||
    fail "the CPU image did not build: $(tail_of "$scratch/build-cpu.log" 15)"
end_phase "cpu build"

# ---- 3. Inside the image --------------------------------------------------------------------

# check_image IMAGE RUNTIME_BASE NAME: every check of section 3 on IMAGE.
check_image() {
    local image=$1 runtime_base=$2 name=$3 out=$scratch/$3
    mkdir -p "$out"
    # Labels, entry point, user.
    local config
    config=$(podman image inspect --format '{{.Config.User}}|{{json .Config.Entrypoint}}|{{index .Labels "org.opencontainers.image.version"}}|{{index .Labels "org.opencontainers.image.revision"}}|{{index .Labels "org.opencontainers.image.source"}}|{{index .Labels "org.opencontainers.image.created"}}|{{index .Labels "org.opencontainers.image.base.name"}}' "$image") ||
        fail "$name: podman image inspect $image failed"
    local user entrypoint label_version label_revision label_source label_created label_base
    IFS='|' read -r user entrypoint label_version label_revision label_source label_created label_base <<<"$config"
    [ "$entrypoint" = '["llmtrain"]' ] || fail "$name: the entry point is $entrypoint, expected [\"llmtrain\"]"
    case ${user%%:*} in "" | 0 | root) fail "$name: the image runs as '${user:-root}', expected an unprivileged user" ;; esac
    [ "$label_version|$label_revision|$label_source|$label_created|$label_base" = "$version|$commit|$source|$created|$runtime_base" ] ||
        fail "$name: labels version|revision|source|created|base.name are '$label_version|$label_revision|$label_source|$label_created|$label_base', expected '$version|$commit|$source|$created|$runtime_base'"
    say "$name: labels version $label_version, revision $label_revision, source $label_source, created $label_created, base $label_base; entry point llmtrain; user $user"
    podman history --no-trunc --format $'{{.Size}}\t{{.CreatedBy}}' "$image" | grep -qP '^(?!0 B)[^\t]*\t\s*$' &&
        fail "$name: a layer does not say what made it: $(podman history --no-trunc --format '{{.Size}} {{.CreatedBy}}' "$image" | paste -sd' ')"
    say "$name: layers, newest first: $(layers "$image")"

    # The host's directories, writable by the image's user as a cluster's are by the job's.
    local host_dirs=("$out/data" "$out/checkpoints" "$out/runs")
    mkdir -p "${host_dirs[@]}"
    cp "$source_dir/data/fortunes.txt" "$out/data/"
    chmod -R a+rX "$out/data"
    if [ "$(id -u)" -eq 0 ]; then chown "$user" "$out/checkpoints" "$out/runs"; else chmod a+rwx "$out/checkpoints" "$out/runs"; fi
    local ctr
    ctr=$(buildah from --pull=never "$image" 2>"$out/from.log") || fail "$name: buildah from $image failed: $(tail_of "$out/from.log")"
    containers+=("$ctr")
    inside() {
        buildah run --isolation chroot -v "$out/data:/opt/llmtrain/data:ro" -v "$out/checkpoints:/checkpoints" \
            -v "$out/runs:/opt/llmtrain/runs" "$ctr" "$@"
    }

    # The commit, the user.
    local version_line
    version_line=$(inside llmtrain --version 2>&1 | head -n 1)
    [ "$version_line" = "llmtrain $version (commit $commit)" ] || fail "$name: llmtrain --version says '$version_line', expected 'llmtrain $version (commit $commit)'"
    if [ -n "$compare_bin" ]; then
        [ "$("$compare_bin" --version | head -n 1)" = "$version_line" ] ||
            fail "$name: the image's llmtrain says '$version_line', $compare_bin says '$("$compare_bin" --version | head -n 1)'"
    fi
    local uid
    uid=$(inside id -u) || fail "$name: id -u failed inside the image"
    [ "$uid" != 0 ] || fail "$name: commands run as root inside the image"
    say "$name: '$version_line'$([ -n "$compare_bin" ] && echo ", as the build's llmtrain"); runs as uid $uid ($(inside id -un))"

    # The entry point, as `docker run IMAGE ARGS` takes it.
    if [ ${#podman_run[@]} -gt 0 ]; then
        local run_line
        run_line=$("${podman_run[@]}" "$image" --version 2>&1 | head -n 1)
        [ "$run_line" = "$version_line" ] || fail "$name: ${podman_run[*]} $image --version says '$run_line', expected '$version_line'"
        "${podman_run[@]}" "$image" >"$out/podman-run.out" 2>&1 || fail "$name: ${podman_run[*]} $image (no arguments) failed: $(tail_of "$out/podman-run.out")"
        grep -q '^Usage: llmtrain' "$out/podman-run.out" || fail "$name: ${podman_run[*]} $image does not print llmtrain's help: $(tail_of "$out/podman-run.out")"
        [ "$("${podman_run[@]}" --entrypoint id "$image" -u)" = "$uid" ] || fail "$name: podman run does not run as uid $uid"
        say "$name: ${podman_run[*]} IMAGE --version: the same line; with no arguments: llmtrain's help; as uid $uid"
    fi

    # No compiler, no build tree: what the build stage used stays there.
    local leftovers
    # shellcheck disable=SC2016  # expanded inside the image
    leftovers=$(inside sh -c 'for tool in cc c++ gcc g++ cpp clang clang++ nvcc ld as cmake ninja make; do command -v "$tool"; done
        dpkg-query -W -f "\${Package}\n" | grep -E "^(gcc|g\+\+|cpp|clang|binutils|cmake|ninja-build|make|libc6-dev|build-essential|cuda-nvcc)(-[0-9.]+)?$"
        ls -d /opt/llmtrain/build /opt/llmtrain/src /opt/llmtrain/kernels /opt/llmtrain/CMakeLists.txt 2>/dev/null
        find / -xdev \( -name CMakeCache.txt -o -name "*.o" -o -name build.ninja \) -print 2>/dev/null | head -n 5')
    [ -z "$leftovers" ] || fail "$name: the runtime image holds build tools or a build tree: $(echo "$leftovers" | paste -sd' ')"
    say "$name: no compiler, linker, cmake, ninja or make, no build tree"

    # doctor under mpirun: 2 ranks on this node, the storage the host mounted.
    local mpirun=(mpirun --oversubscribe -np 2)
    inside "${mpirun[@]}" llmtrain doctor configs/tiny.toml --io-mb 8 --set checkpoint.dir=\"/checkpoints/doctor\" --json >"$out/doctor.json" 2>"$out/doctor.err" ||
        fail "$name: mpirun -np 2 llmtrain doctor failed: $(cat "$out/doctor.json") $(tail_of "$out/doctor.err")"
    local check
    for check in mpi.world config data host.memory host.cores storage.directory storage.fsync_rename storage.free_space storage.throughput \
                 storage.file_locking mpi.intranode_bandwidth; do
        grep -q "\"check\":\"$check\",[^}]*\"status\":\"PASS\"" "$out/doctor.json" || fail "$name: doctor's $check does not PASS: $(cat "$out/doctor.json")"
    done
    grep -q '"detail":"2 rank(s) on 1 node(s)' "$out/doctor.json" || fail "$name: doctor does not see 2 ranks: $(cat "$out/doctor.json")"
    say "$name: mpirun -np 2 llmtrain doctor: MPI, config, data, host and storage checks PASS; $(grep -o 'rank 0 -> rank 1 on [^"]*GB/s' "$out/doctor.json")"

    # Training: uninterrupted; stopped by SIGUSR1 to mpirun and resumed; compared on the host.
    local train=("${mpirun[@]}" llmtrain train configs/tiny.toml --set model.n_layers=2 --set model.d_model=64 --set train.batch_size=4
                 --set train.seq_len=32 --set train.eval_sequences=4 --set train.threads=1 --set optimizer.warmup_steps=1
                 --set train.steps=2000 --set checkpoint.every_steps=500 --set checkpoint.keep_last=10 --set train.sample_tokens=0
                 --set train.log_every=500 --set metrics.listen=\"127.0.0.1\" --set metrics.port=0)
    inside "${train[@]}" --set checkpoint.dir=\"/checkpoints/reference\" --run-dir runs/reference >"$out/reference.out" 2>&1 ||
        fail "$name: the uninterrupted run failed: $(tail_of "$out/reference.out")"
    # The stop comes from inside the container, from the launcher's parent, as a batch
    # system's does: after step 10, SIGUSR1 to mpirun, which passes it to every rank.
    # shellcheck disable=SC2016  # expanded inside the image
    inside sh -c '"$@" & launcher=$!
                  for _ in $(seq 600); do grep -q "\"step\":10," runs/stopped/log.jsonl 2>/dev/null && break; sleep 0.05; done
                  kill -USR1 $launcher; wait $launcher' sh "${train[@]}" --set checkpoint.dir=\"/checkpoints/stopped\" --run-dir runs/stopped \
        >"$out/stopped.out" 2>&1
    local code=$?
    [ $code -eq 75 ] || fail "$name: the run sent SIGUSR1 exited $code, expected 75 (checkpoint saved, resume me): $(tail_of "$out/stopped.out")"
    inside "${train[@]}" --set checkpoint.dir=\"/checkpoints/stopped\" --run-dir runs/resumed --resume auto >"$out/resumed.out" 2>&1 ||
        fail "$name: the resumed run failed: $(tail_of "$out/resumed.out")"
    local resumed_at
    resumed_at=$(grep -o "resumed from '[^']*' at step [0-9]*" "$out/resumed.out") || fail "$name: the run did not resume: $(tail_of "$out/resumed.out")"
    # "step loss grad_norm" of every step record, as printed (full precision).
    figures() { grep '"event":"step"' "$1" | sed -E 's/.*"grad_norm":([^,]*).*"loss":([^,]*).*"step":([0-9]+),.*/\3 \2 \1/' | sort -n; }
    figures "$out/runs/reference/log.jsonl" >"$out/reference.figures"
    figures "$out/runs/resumed/log.jsonl" >"$out/resumed.figures"
    local resumed_steps
    resumed_steps=$(wc -l <"$out/resumed.figures")
    if [ "$resumed_steps" -lt 2 ] || ! grep -Fxf "$out/resumed.figures" "$out/reference.figures" | cmp -s - "$out/resumed.figures"; then
        fail "$name: the resumed steps differ from the uninterrupted run's (step loss grad_norm): $(diff <(tail -n "$resumed_steps" "$out/reference.figures") "$out/resumed.figures" | head -n 6 | paste -sd' ')"
    fi
    local file
    for file in "$out/checkpoints/reference/step_00002000"/rank_*.h5; do
        [ -f "$file" ] || fail "$name: no final checkpoint in $out/checkpoints/reference/step_00002000"
        h5diff -q "$file" "$out/checkpoints/stopped/step_00002000/$(basename "$file")" ||
            fail "$name: the final weights or AdamW moments of $(basename "$file") differ after the resume"
    done
    say "$name: mpirun -np 2 llmtrain train: stopped by SIGUSR1 (exit 75), $resumed_at; its $resumed_steps steps and the final weights and AdamW moments are bitwise those of the uninterrupted run"
}

check_image "$cpu_image" "$base_image" cpu
end_phase "cpu checks"

# ---- 4. The CUDA flavour --------------------------------------------------------------------

# The Dockerfile's default base images.
cuda_version=$(sed -n 's/^ARG CUDA_VERSION=//p' "$source_dir/Dockerfile")
default_image() { sed -n "s/^ARG $1=//p" "$source_dir/Dockerfile" | sed "s/\${CUDA_VERSION}/$cuda_version/"; }
cuda_build=$(default_image BUILD_IMAGE) cuda_runtime=$(default_image RUNTIME_IMAGE)
missing=$(for image in "$cuda_build" "$cuda_runtime"; do podman image exists "$image" || echo "$image"; done | paste -sd' ')
if [ -z "$missing" ]; then
    cuda_image=localhost/llmtrain-container-test:cuda-$$
    say "cuda: buildah bud (the Dockerfile's default base images) -t $cuda_image (log: $scratch/build-cuda.log)"
    build_image "$cuda_image" "$scratch/build-cuda.log" || fail "the CUDA image did not build: $(tail_of "$scratch/build-cuda.log" 15)"
    end_phase "cuda build"
    check_image "$cuda_image" "$cuda_runtime" cuda
    end_phase "cuda checks"
else
    say "cuda: not built: $missing not in this machine's image storage (pull or load it to build the CUDA flavour here); e2e.dockerfile_stages_copies_and_runtime_packages checks its stages"
fi

# ---- Sizes and time -------------------------------------------------------------------------

say "sizes (uncompressed): $base_image $(size_mb "$base_image") MB; llmtrain cpu $(size_mb "$cpu_image") MB" \
    "(+$(($(size_mb "$cpu_image") - $(size_mb "$base_image"))) MB over its base)$([ -z "$missing" ] && echo "; llmtrain cuda $(size_mb "$cuda_image") MB")"
say "cpu image compressed (podman save | gzip): $(($(podman save "$cpu_image" 2>/dev/null | gzip -c | wc -c) / 1000000)) MB"
say "time: $(printf '%s, ' "${timings[@]}")total $((SECONDS - started)) s"
[ -n "$keep_tag" ] && say "kept: $cpu_image"
echo "PASS: the CPU image builds from a clean cache and every check passes inside it"
