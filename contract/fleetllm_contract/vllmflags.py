"""Which argv tokens vLLM would read as a flag fleetllm manages, however they are spelled.

Standard library only: the installer checks the box JSON with it, and `fleetllm validate` checks the
fleet repository with the very same rule (reconciler/fleetllm/core/fleet/flags.py), so a spelling refused on the box
is refused in the pull request first.

How vLLM reads a long option (vllm/utils/argparse_utils.py, `FlexibleArgumentParser.parse_args`, read
through the project's code search; older releases kept it in vllm/utils.py):
- in every token starting with `--`, the part before the first `=` is taken as the key, and in that
  key every `_` up to the first `.` becomes `-` (`re.sub(r"(?<=--)[^\\.]*", ...)`, once), so
  `--api_key=x` is `--api-key=x`;
- a key holding a `.` is a nested JSON argument: `--api-key.x v` becomes `--api-key '{"x": "v"}'`, so
  the flag is the part before the first `.`;
- the result goes to argparse.ArgumentParser, whose `allow_abbrev` (on by default, and vLLM does not
  turn it off) takes any unambiguous prefix of a long option as that option: `--api-ke`, `--hos`,
  `--served-model`, `--max-model`, `--gpu-memory-util` are the managed flags themselves.
Older vLLMs replaced `_` in the whole token without stopping at `.`; both readings give the same flag
name for the part before the first `.` and `=`.

The rule here is deliberately more conservative than argparse: every non-empty prefix of a managed
flag is refused even where vLLM would find it ambiguous among its other flags (an error there anyway),
the comparison ignores case, and the `--no-` twin of each is refused too.
"""

from __future__ import annotations

# Flags whose value fleetllm decides: where the server listens, what it is called, how much of the
# card and context it takes, and its bearer. A recipe setting one of them would break the contract
# (and --api-key would put the bearer on the command line, readable in /proc/*/cmdline).
MANAGED_FLAGS = ("api-key", "device-memory-utilization", "gpu-memory-utilization", "host", "max-model-len", "port",
                 "served-model-name", "uds")  # device-memory-utilization: vLLM 0.32's other name for the gpu one

# Flags that read other flags from a file on the box: vLLM's `--config FILE` (FlexibleArgumentParser pulls
# every key of the YAML file into argv before argparse runs), so the file could set any managed flag where
# neither validation nor the installer sees it. Refused by the same prefix rule as the managed flags.
FILE_FLAGS = ("config",)

# What to do instead, per managed flag (and per file flag).
INSTEAD = {
    "config": "it reads vLLM's flags from a file on the box, where one could set a flag fleetllm manages; "
              "write each option in the recipe's args or settings instead",
    "api-key": "fleetllm derives each server's bearer and passes it as VLLM_API_KEY; never put a key in args",
    "gpu-memory-utilization": "use the recipe's gpu_memory_utilization field (or leave the box to divide the card)",
    "device-memory-utilization": "vLLM's other name for --gpu-memory-utilization: use the recipe's "
                                 "gpu_memory_utilization field (or leave the box to divide the card)",
    "host": "the installer decides where vLLM listens (FLEETLLM_LISTEN_HOST, or loopback behind a gateway)",
    "max-model-len": "use the recipe's max_model_len field",
    "port": "the port is the placement row's second element",
    "served-model-name": "use the recipe's served_model_name field",
    "uds": "a server listens on its placement port; a Unix socket would hide it from the fleet",
}


def flag_key(token: str) -> str | None:
    """The flag name vLLM would look up for an argv token, normalised (`--Max_Model.x=4` -> `max-model`),
    or None when the token is not a long option (`-tp`, `--`, a value)."""
    if not token.startswith("--") or len(token) == 2:
        return None
    return token[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-").lower()


def managed_flag(token: str) -> str | None:
    """The managed flag (without `--`) that vLLM could read `token` as, or None; a file flag (FILE_FLAGS,
    `--config`) counts as one, since the file it names could set any of them."""
    name = flag_key(token)
    if not name:
        return None
    for candidate in (name, name[3:] if name.startswith("no-") else ""):
        if candidate:
            for flag in (*MANAGED_FLAGS, *FILE_FLAGS):
                if flag.startswith(candidate):
                    return flag
    return None


def spelling(token: str) -> str:
    """The token as written, without its value (`--api-ke=sk-...` -> `--api-ke`): values are never shown,
    one of them may be a key."""
    return token.split("=", 1)[0]


def explain(token: str, flag: str) -> str:
    """Why a token is refused and what to do, without its value."""
    written = spelling(token)
    key = flag_key(token) or ""
    if written == f"--{flag}":
        how = "is"
    elif key.startswith("no-") and flag.startswith(key[3:]):
        how = f"is the --no- form of --{flag} (or of a prefix of it), which is"
    else:
        how = (f"would be read by vLLM as --{flag} (it takes any unambiguous prefix of a flag, `_` for `-` "
               "and `.` for a nested key), which is")
    what = "refused" if flag in FILE_FLAGS else "a flag fleetllm manages"
    return f"{written} {how} {what}: remove it; {INSTEAD[flag]}"


def option_like(value: str) -> bool:
    """Whether vLLM would read a value the installer puts on the command line by itself (the positional
    model, the value of --served-model-name) as an option: `vllm serve --api-key=X` is a flag, not a
    model, and would bypass the managed-flag rule."""
    return value.startswith("-")


def option_like_problem(field: str) -> str:
    """The problem for a field whose value option_like refuses (the value is not shown: it may be a key)."""
    return (f"{field}: starts with '-', so vLLM would read it as an option (e.g. --api-key=...), not as "
            "this field's value: use a model id, an absolute path or a name that starts with a letter or digit "
            "(value not shown)")
