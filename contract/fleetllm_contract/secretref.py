"""Secret references in configuration strings: `${env:NAME}`, `${file:/abs/path}`, `${cred:NAME}`.

The same syntax as LLMhop (../shared/spec/llmhop.txt), used by the control plane's config file and
by the box gateway's config. `$$` is a literal `$`; a `$` before anything that is not a name or a
brace stays literal (`a $ b`). Everything else that looks like a variable is an error, never
silently dropped or read from the environment: `$NAME`, `${NAME}`, `${}`, an unclosed `${`, a
relative `file:` path, a `cred:` name with a slash. Standard library only.

Error messages name the reference (`env var "X" not set`), never a secret value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SCHEMES = ("cred", "env", "file")
_NAME_START = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_CHARS = _NAME_START | set("0123456789")
_SPECIAL = set("0123456789*#@!?-")


class SecretRefError(ValueError):
    """One or more bad or unresolvable references; `problems` lists each message."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Reference:
    scheme: str  # "env" | "file" | "cred"
    name: str

    def __str__(self) -> str:
        return f"${{{self.scheme}:{self.name}}}"


Part = str | Reference


def _not_a_reference(name: str) -> str:
    return f'"{name}" is not a cred:, env: or file: reference, write $$ for a literal $'


def _check_reference(scheme: str, name: str) -> str | None:
    if scheme == "env":
        return "empty env: reference ${env:}" if not name else None
    if scheme == "file":
        if not name:
            return "empty file: reference ${file:}"
        if "\0" in name:
            return "secret file name has a NUL byte"
        return None if name.startswith("/") else f'secret file "{name}" must be an absolute path'
    if not name or "/" in name or name in {".", ".."} or "\0" in name:
        return f'invalid credential name "{name}"'
    return None


def parse(value: str) -> tuple[list[Part], list[str]]:
    """Split a string into literal text and references; the second item lists syntax errors."""
    parts: list[Part] = []
    errors: list[str] = []
    literal: list[str] = []
    i, n = 0, len(value)
    while i < n:
        ch = value[i]
        if ch != "$" or i + 1 >= n:
            literal.append(ch)
            i += 1
            continue
        nxt = value[i + 1]
        if nxt == "$":
            literal.append("$")
            i += 2
        elif nxt == "{":
            end = value.find("}", i + 2)
            if end < 0:
                errors.append("unclosed ${ reference: close it with } or write $${ for a literal ${")
                literal.append(value[i:])
                break
            body = value[i + 2:end]
            scheme, colon, name = body.partition(":")
            if not body:
                errors.append("empty reference ${}: write ${env:NAME}, ${file:/path} or ${cred:NAME}")
            elif not colon or scheme not in SCHEMES:
                errors.append(_not_a_reference(body))
            elif (problem := _check_reference(scheme, name)) is not None:
                errors.append(problem)
            else:
                if literal:
                    parts.append("".join(literal))
                    literal = []
                parts.append(Reference(scheme, name))
            i = end + 1
        elif nxt in _NAME_START:
            j = i + 1
            while j < n and value[j] in _NAME_CHARS:
                j += 1
            errors.append(_not_a_reference(value[i + 1:j]))
            i = j
        elif nxt in _SPECIAL:
            errors.append(_not_a_reference(nxt))
            i += 2
        else:
            literal.append("$")
            i += 1
    if literal:
        parts.append("".join(literal))
    return parts, errors


def check(value: str) -> list[str]:
    """Syntax errors only; nothing is read (what `--check` does)."""
    return parse(value)[1]


def references(value: str) -> list[Reference]:
    return [p for p in parse(value)[0] if isinstance(p, Reference)]


def _strip_one_newline(text: str) -> str:
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def resolve(ref: Reference, env: Mapping[str, str] | None = None) -> str:
    """The value behind one reference; raises SecretRefError naming the reference."""
    environ = os.environ if env is None else env
    if ref.scheme == "env":
        if ref.name not in environ:
            raise SecretRefError([f'env var "{ref.name}" not set'])
        return environ[ref.name]
    if ref.scheme == "cred":
        directory = environ.get("CREDENTIALS_DIRECTORY")
        if not directory:
            raise SecretRefError([f'credential "{ref.name}" requested but $CREDENTIALS_DIRECTORY is not set'])
        path = Path(directory) / ref.name
        what = f'credential "{ref.name}"'
    else:
        path = Path(ref.name)
        what = f'secret file "{ref.name}"'
    try:
        return _strip_one_newline(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SecretRefError([f"cannot read {what}: {reason}"]) from None


def expand(value: str, env: Mapping[str, str] | None = None) -> str:
    """Expand every reference in `value`. All problems (syntax and resolution) are raised together."""
    parts, errors = parse(value)
    out: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        try:
            out.append(resolve(part, env))
        except SecretRefError as exc:
            errors.extend(exc.problems)
    if errors:
        raise SecretRefError(errors)
    return "".join(out)
