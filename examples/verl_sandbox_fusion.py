"""verl's SandboxFusion reward against aenv: get the run-code URL once, then grade as verl's
`check_correctness` does, one request per test case, with verl 0.9.1's exact body.

    E2B_API_URL=http://127.0.0.1:8000 E2B_API_KEY=... python examples/verl_sandbox_fusion.py

In a verl run, only the URL is needed: `reward.sandbox_fusion.url=<url>` (docs/rl.md)."""

from __future__ import annotations

import json
import os

import httpx

SOLUTION = "a, b = map(int, input().split())\nprint(a + b)\n"
CASES = [("1 2\n", "3"), ("40 2\n", "42"), ("-1 1\n", "0")]


def main() -> None:
    api = os.environ["E2B_API_URL"].rstrip("/")
    url = httpx.get(f"{api}/rl/run_code", headers={"X-API-Key": os.environ["E2B_API_KEY"]},
                    timeout=30).raise_for_status().json()["url"]
    passed = 0
    for stdin, expected in CASES:
        body = {"compile_timeout": 10, "run_timeout": 10, "code": SOLUTION, "stdin": stdin,
                "memory_limit_MB": 1024, "language": "python", "files": {},
                "fetch_files": []}  # what verl sends, and no API key
        r = httpx.post(url, json=body, timeout=30).json()
        out = (r.get("run_result") or {}).get("stdout") or ""
        passed += r["status"] == "Success" and out.rstrip("\n") == expected.rstrip("\n")
    httpx.delete(f"{api}/rl/run_code", headers={"X-API-Key": os.environ["E2B_API_KEY"]},
                 timeout=60)  # the run-code sandboxes go now, not after 15 idle minutes
    print(json.dumps({"score": passed / len(CASES)}))


if __name__ == "__main__":
    main()
