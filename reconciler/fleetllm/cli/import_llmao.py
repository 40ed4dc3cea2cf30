"""`fleetllm import llmao --config config.yaml --models models.yaml --out DIR [--check]`.

Reads llmao's files (as llmao reads them: PyYAML), maps them with the pure `import_llmao`, writes the
fleet repository (fleet.yaml, models.yaml, placement.yaml), a control-plane config whose secrets are
references and IMPORT-REPORT.md; validates the result with fleetllm's own validation; commits it when
DIR is a new repository; prints what was left out and which variables to export. Never writes or
prints a secret value. `--check` renders every box and compares each server's bearer with llmao's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fleetllm.adapters.git import read_directory
from fleetllm.adapters.llmao import fetched_source
from fleetllm.cli.common import EXIT_INVALID, EXIT_OK, CommandError, eprint
from fleetllm.core.fleet import strictyaml
from fleetllm.core.fleet.bearer import LEGACY_KEY_ENV, SALT_ENV, Salt, SaltError
from fleetllm.core.fleet.diagnostics import format_text
from fleetllm.core.fleet.jsonvalue import JSON, Frozen, freeze_mapping
from fleetllm.core.fleet.model import Fleet
from fleetllm.core.fleet.render import Bearers
from fleetllm.core.fleet.validate import validate_snapshot
from fleetllm.core.importer.check import check_fleet, computed_source
from fleetllm.core.importer.emit import to_yaml
from fleetllm.core.importer.llmao import ENV_FLEET_KEY, SECRET, SECRET_FIELDS, Imported, LlmaoImportError, import_llmao
from fleetllm.errors import SourceError

CONTROL_PLANE_FILE = "control-plane.yaml"
# The strict loader's limits (fleetllm.core.fleet.strictyaml) apply to llmao's files too: an alias bomb or a
# deep nesting is refused before PyYAML's own loader would expand it (its other rules are llmao's business).
LIMIT_RULES = frozenset({"yaml-too-large", "yaml-too-deep", "yaml-number-too-large", "yaml-encoding", "yaml-syntax"})
REPORT_FILE = "IMPORT-REPORT.md"
LLMAO_URL_ENV = "LLMAO_URL"


def _pair(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "import",
        description="Map llmao's placement, catalog, legacy pairs, health knobs and Vast key to a fleet repository "
                    "and a control-plane config whose secrets are references. Every field not carried over is "
                    "listed with the reason. No secret value is written or printed.")
    parser.add_argument("source", choices=("llmao",), help="the system to import from: llmao (config.yaml with "
                                                           "fleet:, and models.yaml)")
    parser.add_argument("--config", required=True, metavar="FILE", help="llmao's config.yaml")
    parser.add_argument("--models", required=True, metavar="FILE", help="llmao's models.yaml")
    parser.add_argument("--out", required=True, metavar="DIR", help="where to write the fleet repository")
    parser.add_argument("--legacy", action="append", type=_pair, default=[], metavar="HOST:PORT",
                       help="one of llmao's LEGACY_SERVERS pairs (they keep fleet.selfhost_api_key); repeat")
    parser.add_argument("--litellm-url", metavar="URL", help="the LiteLLM proxy llmao writes to (for the config)")
    parser.add_argument("--force", action="store_true", help="overwrite fleet files already in DIR")
    parser.add_argument("--check", action="store_true",
                       help="also render every box and compare each server's bearer with llmao's: with "
                            f"--llmao-url (or ${LLMAO_URL_ENV}) and ${ENV_FLEET_KEY}, llmao's own GET /vllm/config; "
                            f"else llmao's derivation with the salt (config.yaml, or ${SALT_ENV})")
    parser.add_argument("--llmao-url", metavar="URL", help=f"llmao's base URL for --check (default: ${LLMAO_URL_ENV})")
    parser.set_defaults(run=run)


def _load(path: str, what: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot read llmao's {what} {path}: {exc.strerror}") from None
    for found in strictyaml.load(text, path).problems:  # its limits first: size, depth, anchors' expansion
        if found.rule in LIMIT_RULES:
            raise CommandError(f"{path}:{found.mark.line}:{found.mark.column}: {found.message}; llmao's "
                               f"{what} is refused before it is read") from None
    try:
        return yaml.safe_load(text)  # what llmao itself reads its files with (YAML 1.1), once bounded
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise CommandError(f"{where}: {problem}; fix llmao's {what} and import again") from None


def _jsonable(value: Any, path: str) -> JSON:
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # a YAML 1.1 date or the like: kept as text


def split_secrets(config: Any) -> tuple[Mapping[str, Frozen], dict[str, str]]:
    """config.yaml with every secret value replaced by SECRET (for the pure mapping), and the secrets
    themselves (only for --check; never written or printed)."""
    if not isinstance(config, dict):
        raise CommandError("llmao's config.yaml is not a mapping")
    data = _jsonable(config, "")
    assert isinstance(data, dict)
    secrets: dict[str, str] = {}
    fleet = data.get("fleet")
    if isinstance(fleet, dict):
        for path in SECRET_FIELDS:
            parent: Any = fleet
            for key in path[:-1]:
                parent = parent.get(key) if isinstance(parent, dict) else None
            if isinstance(parent, dict) and parent.get(path[-1]) is not None:
                secrets[".".join(path)] = str(parent[path[-1]])
                parent[path[-1]] = SECRET
    return freeze_mapping(data), secrets


def _write(out: Path, imported: Imported, force: bool) -> None:
    files = {"fleet.yaml": imported.fleet, "models.yaml": imported.models, "placement.yaml": imported.placement,
             CONTROL_PLANE_FILE: imported.control_plane}
    existing = [name for name in files if (out / name).exists()]
    if existing and not force:
        raise CommandError(f"{out} already has {', '.join(existing)}: choose a new --out DIR or pass --force")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, doc in files.items():
            _put(out / name, to_yaml(doc))
        _put(out / REPORT_FILE, report(imported))
        gitignore = out / ".gitignore"
        if not gitignore.exists() and not gitignore.is_symlink():
            _put(gitignore, ".fleetllm-state/\n")
    except OSError as exc:
        raise CommandError(f"cannot write into {out}: {exc.strerror}") from None


def _put(path: Path, text: str) -> None:
    """Write `path` as a new file renamed over it: a symbolic link there is replaced, never written through
    (--force in a directory someone else can write to must not write a file elsewhere)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def report(imported: Imported) -> str:
    lines = ["# Import from llmao", "", "## Not carried over, or carried over changed", ""]
    if not imported.dropped:
        lines.append("Nothing: every field was carried over as it was.")
    lines.extend(f"- {'CHANGED' if d.changed else 'LEFT OUT'} `{d.where}`: {d.reason}" for d in imported.dropped)
    lines += ["", "## Secrets to provide (references in control-plane.yaml; never written here)", ""]
    lines.extend(f"- `{e.name}`: the value of {e.source}. {e.why}" for e in imported.env)
    return "\n".join(lines) + "\n"


def _commit(out: Path) -> str | None:
    """Make DIR a repository with one commit on main when it is not inside one; None when it is."""
    inside = subprocess.run(["git", "-C", str(out), "rev-parse", "--is-inside-work-tree"], capture_output=True,
                            text=True, check=False)
    if inside.returncode == 0:
        return None
    env = {**os.environ, "GIT_AUTHOR_NAME": os.environ.get("GIT_AUTHOR_NAME", "fleetllm import"),
           "GIT_AUTHOR_EMAIL": os.environ.get("GIT_AUTHOR_EMAIL", "fleetllm-import@localhost"),
           "GIT_COMMITTER_NAME": os.environ.get("GIT_COMMITTER_NAME", "fleetllm import"),
           "GIT_COMMITTER_EMAIL": os.environ.get("GIT_COMMITTER_EMAIL", "fleetllm-import@localhost")}
    for command in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "Import the fleet from llmao"]):
        done = subprocess.run(["git", "-C", str(out), *command], capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise CommandError(f"git {command[0]} in {out} failed: {done.stderr.strip()}")
    return "main"


def run(args: argparse.Namespace) -> int:
    config, secrets = split_secrets(_load(args.config, "config.yaml"))
    catalog_raw = _load(args.models, "models.yaml")
    if not isinstance(catalog_raw, dict):
        raise CommandError(f"{args.models}: not a mapping with models:")
    catalog = freeze_mapping(_jsonable(catalog_raw, ""))
    out = Path(args.out)
    try:
        imported = import_llmao(config, catalog, frozenset(args.legacy), repo_path=".", litellm_url=args.litellm_url)
    except LlmaoImportError as exc:
        raise CommandError(str(exc), EXIT_INVALID) from None
    _write(out, imported, args.force)
    try:
        validation = validate_snapshot(read_directory(out))
    except SourceError as exc:
        raise CommandError(str(exc)) from None
    if validation.diagnostics:
        eprint(format_text(validation.diagnostics))
    if validation.fleet is None:
        raise CommandError(f"the imported fleet in {out} does not validate (see above); please report it with "
                           f"{REPORT_FILE}", EXIT_INVALID)
    branch = _commit(out)
    print(f"wrote {out}: {len(validation.fleet.boxes)} boxes, {validation.fleet.server_count} servers, "
          f"{len(validation.fleet.recipes)} models; the fleet validates")
    print(f"  committed on branch {branch}" if branch else "  inside an existing repository: review and commit it")
    print(f"Not carried over, or changed ({len(imported.dropped)}; also in {out / REPORT_FILE}):")
    for d in imported.dropped:
        print(f"  {'~' if d.changed else '-'} {d.where}: {d.reason}")
    print(f"Provide these before `fleetllm serve --config {out / CONTROL_PLANE_FILE}` (no value was written):")
    for e in imported.env:
        print(f"  {e.name}  <- {e.source}")
    if not args.check:
        return EXIT_OK
    return _check(args, validation.fleet, imported, secrets)


def _check(args: argparse.Namespace, fleet: Fleet, imported: Imported, secrets: dict[str, str]) -> int:
    env_salt = os.environ.get(SALT_ENV)
    llmao_salt = secrets.get("vllm_api_salt")
    if llmao_salt is not None and llmao_salt.strip().startswith("ENC["):
        llmao_salt = None  # an eyaml blob: not the salt
    ours_text = env_salt if env_salt is not None else (llmao_salt.strip() if llmao_salt is not None else None)
    if ours_text is None:
        raise CommandError(f"--check needs the salt: set {SALT_ENV} (the value of llmao's fleet.vllm_api_salt)")
    if env_salt is None:
        eprint(f"fleetllm import: {SALT_ENV} is not set: checking with config.yaml's salt; export it before "
               "`fleetllm serve`")
    try:
        salt = Salt(ours_text)
    except SaltError as exc:
        raise CommandError(f"{SALT_ENV}: {exc}") from None
    if (warning := salt.warning()) is not None:
        eprint(f"fleetllm import: warning: {warning}")
    legacy_key = os.environ.get(LEGACY_KEY_ENV) or secrets.get("selfhost_api_key")
    bearers = Bearers(salt, legacy_key)
    url = args.llmao_url or os.environ.get(LLMAO_URL_ENV)
    if url:
        fleet_key = os.environ.get(ENV_FLEET_KEY) or secrets.get("key")
        if not fleet_key:
            raise CommandError(f"--check against {url} needs the fleet key: set {ENV_FLEET_KEY}")
        try:
            source = fetched_source(url, fleet_key)
        except ValueError as exc:
            raise CommandError(f"--llmao-url: {exc}") from None
        what = f"llmao's GET /vllm/config at {url}"
    else:
        theirs = llmao_salt if llmao_salt is not None else ours_text
        source = computed_source(fleet, theirs, os.environ.get(LEGACY_KEY_ENV) or secrets.get("selfhost_api_key"),
                                 imported.legacy)
        what = ("llmao's derivation (the box contract's formula) with config.yaml's salt" if llmao_salt is not None
                else f"llmao's derivation (the box contract's formula) with {SALT_ENV}")
    lines = check_fleet(fleet, bearers, source)
    print(f"Bearer check against {what}:")
    for line in lines:
        print(line.text())
    bad = sum(1 for line in lines if not line.ok)
    print(f"{len(lines) - bad} of {len(lines)} servers have the same bearer as llmao" if not bad else
          f"{bad} of {len(lines)} server(s) differ: do not switch boxes to fleetllm until this is fixed")
    return EXIT_OK if not bad else EXIT_INVALID
