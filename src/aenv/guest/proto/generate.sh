#!/usr/bin/env bash
# Regenerate the committed stubs in ../gen from the .proto files in this directory.
#
# Offline and reproducible: Debian's `protoc` plus the PyPI codegen plugins pinned to the
# versions the e2b SDK itself was generated with (they live in a throwaway venv, never in
# the project venv):
#     python3.11 -m venv /tmp/genvenv
#     /tmp/genvenv/bin/pip install protoc-gen-connectrpc==0.12.1 protoc-gen-py==0.6.0
# Usage: GENVENV=/tmp/genvenv src/aenv/guest/proto/generate.sh
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="$here/../gen"
genvenv="${GENVENV:-/tmp/genvenv}"

for plugin in protoc-gen-py protoc-gen-connectrpc; do
    [ -x "$genvenv/bin/$plugin" ] || { echo "missing $genvenv/bin/$plugin" >&2; exit 1; }
done

rm -f "$out"/*_pb.py "$out"/*_connect.py
protoc \
    --proto_path="$here" \
    --plugin=protoc-gen-py="$genvenv/bin/protoc-gen-py" \
    --plugin=protoc-gen-connectrpc="$genvenv/bin/protoc-gen-connectrpc" \
    --py_out="$out" \
    --connectrpc_out="$out" \
    "$here/process.proto" "$here/filesystem.proto"
echo "generated: $(cd "$out" && ls ./*_pb.py ./*_connect.py | tr '\n' ' ')"
