"""Install the paper's proposer, Claude Code, pinned: its native linux-x64 build from the npm registry.

The harness-search Job runs it as ``spec.harnessSearch.proposer.backend: cli`` (the examples' command) from
``/opt/claude-code/bin/claude``, mounted read-only into the agent's sandbox (``readPaths``). The package's
tarball is checked against its registry integrity (sha512) and the binary against its sha256, so a
re-published or tampered file fails the build.

    python install_claude_code.py [--tarball FILE] [--prefix /opt/claude-code]

``--tarball``: a tarball already fetched (``npm pack @anthropic-ai/claude-code-linux-x64@VERSION``);
without it, the pinned URL is downloaded.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

VERSION = "2.1.332"
URL = f"https://registry.npmjs.org/@anthropic-ai/claude-code-linux-x64/-/claude-code-linux-x64-{VERSION}.tgz"
#: the registry's dist.integrity of that tarball (`npm view @anthropic-ai/claude-code-linux-x64@VERSION dist.integrity`)
INTEGRITY = "sha512-f4JWhzwYutJIHScC7/dYOPX6s28tt7ZADhsOi8zwOHq5fFPEuUeChh2NMfinSg0GrUckYxaeebC4h0DqiKzLcw=="
#: sha256 of package/claude inside it
BINARY_SHA256 = "a2df1f41bb00250992926420d0063f89b127cb81abdd284dbefb80c50ff1d026"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tarball", type=Path)
    ap.add_argument("--prefix", type=Path, default=Path("/opt/claude-code"))
    args = ap.parse_args(argv)
    if args.tarball:
        data = args.tarball.read_bytes()
    else:
        with urllib.request.urlopen(URL, timeout=600) as response:
            data = response.read()
    got = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if got != INTEGRITY:
        print(f"claude-code {VERSION}: tarball integrity {got} != pinned {INTEGRITY}", file=sys.stderr)
        return 1
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("package/claude")
        if member is None:
            print("claude-code tarball has no package/claude", file=sys.stderr)
            return 1
        binary = member.read()
    if hashlib.sha256(binary).hexdigest() != BINARY_SHA256:
        print(f"claude-code {VERSION}: binary sha256 differs from the pinned one", file=sys.stderr)
        return 1
    target = args.prefix / "bin" / "claude"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)  # atomic: a half-written binary is never at the path
    print(f"installed Claude Code {VERSION} at {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
