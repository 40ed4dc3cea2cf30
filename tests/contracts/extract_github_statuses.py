"""Extract the commit-status operations from GitHub's published OpenAPI description into
tests/contracts/github-statuses.openapi.json (tests/contracts/README.md says which version).

The description GitHub publishes (https://github.com/github/rest-api-description) is 13 MB; the npm
package @octokit/openapi ships it, with an `x-octokit` extension per operation, as
`generated/api.github.com.json`. This keeps the two operations the forge adapter and its fake speak,
each exactly as published, and every component they refer to (followed through `$ref`s), plus GitHub's
error bodies, which the operations do not list but the API answers with (422 Validation Failed, 401,
404: `validation-error`, `basic-error`). Nothing is edited: a kept object is the published one.

    npm pack @octokit/openapi@VERSION            # into a scratch directory
    tar xzf octokit-openapi-VERSION.tgz
    python tests/contracts/extract_github_statuses.py package/generated/api.github.com.json

Then update the version and digests in tests/contracts/README.md and run tests/contracts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "github-statuses.openapi.json"
OPERATIONS = (("/repos/{owner}/{repo}/statuses/{sha}", "post"),  # repos/create-commit-status
              ("/repos/{owner}/{repo}/commits/{ref}/statuses", "get"))  # repos/list-commit-statuses-for-ref
EXTRA = ("#/components/schemas/validation-error", "#/components/schemas/basic-error")


def refs(node: Any) -> set[str]:
    """Every `$ref` inside `node`."""
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(refs(item) for item in node)) if node else set()
    return set()


def resolve(document: dict[str, Any], ref: str) -> Any:
    node: Any = document
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def extract(document: dict[str, Any], source: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for path, method in OPERATIONS:
        paths.setdefault(path, {})[method] = document["paths"][path][method]
    wanted, seen = refs(paths) | set(EXTRA), set()
    components: dict[str, dict[str, Any]] = {}
    while wanted:
        ref = wanted.pop()
        if ref in seen:
            continue
        seen.add(ref)
        _, section, name = ref.removeprefix("#/").split("/")
        target = resolve(document, ref)
        components.setdefault(section, {})[name] = target
        wanted |= refs(target) - seen
    info = {**document["info"], "x-fleetllm-extracted-from": source}
    return {"openapi": document["openapi"], "info": info, "servers": document.get("servers", []), "paths": paths,
            "components": {section: dict(sorted(items.items())) for section, items in sorted(components.items())}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("description", type=Path, help="generated/api.github.com.json of @octokit/openapi")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    raw = args.description.read_bytes()
    document = json.loads(raw)
    source = (f"@octokit/openapi {document['info']['version']}, generated/api.github.com.json, "
              f"sha256 {hashlib.sha256(raw).hexdigest()}")
    args.out.write_text(json.dumps(extract(document, source), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out} from {source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
