#!/usr/bin/env bash
# Build (and optionally push) the three images this repository makes, tagged with the package version.
#   images/build.sh [--push] [REGISTRY]      default registry: ghcr.io/whale-dev
set -euo pipefail
cd "$(dirname "$0")/.."
push=false
if [[ "${1:-}" == "--push" ]]; then push=true; shift; fi
registry="${1:-ghcr.io/whale-dev}"
version="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')"
for name in operator worker tools; do
  tag="${registry}/whale-${name}:${version}"
  docker build -f "images/${name}/Dockerfile" -t "${tag}" .
  if $push; then docker push "${tag}"; fi
  # kind: kind load docker-image "${tag}"
done
