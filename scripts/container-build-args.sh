#!/usr/bin/env bash
# Prints the build arguments that say where an image of this source tree comes from, one
# `--build-arg=NAME=VALUE` a line, for `docker build $(scripts/container-build-args.sh) .`
# (or buildah bud, podman build):
#   LLMTRAIN_VERSION  the project's version (CMakeLists.txt)
#   LLMTRAIN_COMMIT   the commit `llmtrain --version` names: 12 hex digits, "-dirty" when
#                     tracked files differ from it (cmake/git_commit.cmake, as a build here)
#   LLMTRAIN_SOURCE   the repository it was cloned from: git's origin when it is a URL
#                     (without credentials), unknown otherwise; the environment's
#                     LLMTRAIN_SOURCE, where set, instead
#   LLMTRAIN_CREATED  the commit's date (RFC 3339, UTC): an image of one commit says the same
#                     date whenever it is built; a dirty tree's says now
# The Dockerfile writes them into the OCI labels (version, revision, source, created).
set -euo pipefail
source_dir=$(cd "$(dirname "$0")/.." && pwd)

version=$(sed -n 's/^project(llmtrain VERSION \([0-9.]*\).*/\1/p' "$source_dir/CMakeLists.txt")
[ -n "$version" ] || { echo "container-build-args: no 'project(llmtrain VERSION x.y.z' in $source_dir/CMakeLists.txt" >&2; exit 1; }
commit=$(cmake -DSOURCE_DIR="$source_dir" -DGIT_EXECUTABLE="$(command -v git || true)" -P "$source_dir/cmake/git_commit.cmake")
source=unknown
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
if [ "$commit" != unknown ]; then
    origin=$(git -C "$source_dir" remote get-url origin 2>/dev/null || true)
    case $origin in
        *://*) source=$(echo "$origin" | sed -E 's#^([a-z+]+://)[^/@]*@#\1#') ;;
        *@*:*) source=$origin ;;  # scp-like git@host:path
    esac
    [[ $commit == *-dirty ]] || created=$(TZ=UTC git -C "$source_dir" log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ)
fi
source=${LLMTRAIN_SOURCE:-$source}
printf -- '--build-arg=%s\n' "LLMTRAIN_VERSION=$version" "LLMTRAIN_COMMIT=$commit" "LLMTRAIN_SOURCE=$source" "LLMTRAIN_CREATED=$created"
