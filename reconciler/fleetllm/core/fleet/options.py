"""vLLM options that run code or read files on the box: each needs an explicit allow in models.yaml.

A recipe's args and settings are reviewed in a pull request, but some vLLM options turn a one-line change
into code execution or a file read on the box: `--trust-remote-code` runs the weights repository's Python,
plugins and middleware import a module, `--chat-template FILE` and `--allowed-local-media-path` read box
files, an OTLP endpoint sends every request's traces elsewhere. Such an option validates only when the
recipe lists it in `vllm.allow_options` (rule `option-not-allowed`), and the pull-request comment lists
each newly allowed one at its top (fleetllm.core.diff), outside the collapsed sections. `--config FILE`
is not on this list: it can set a managed flag from a file on the box, so no allow admits it
(fleetllm_contract.vllmflags, rule `managed-flag`).

The list was read from vLLM 0.32's `vllm serve --help=all` (every option whose value names a file, a
directory, a module, a class, a plugin or a remote endpoint, or that runs code it did not ship);
tests/realvllm/test_option_policy.py checks each name against the real parser. An option is matched the
way vLLM's parser reads it (fleetllm_contract.vllmflags.flag_key: `_` for `-`, `--flag=value`,
`--flag.key`, any case); an abbreviation of a risky option (vLLM's option parser takes any unambiguous prefix) is
matched as the option itself unless it is the full name of an option that is not risky.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from fleetllm_contract import vllmflags

__all__ = ["NOT_ABBREVIATIONS", "RISKY_OPTIONS", "SHORT_ALIASES", "risky_option", "risky_tokens"]

_CODE = "runs code on the box"
_FILE = "reads files on the box"

# option name (without `--`) -> what it does on the box
RISKY_OPTIONS: Mapping[str, str] = {
    "trust-remote-code": f"{_CODE}: the weights repository's own Python (modeling and tokenizer files)",
    "tool-parser-plugin": f"{_CODE}: imports a tool-parser module from a path",
    "reasoning-parser-plugin": f"{_CODE}: imports a reasoning-parser module from a path",
    "io-processor-plugin": f"{_CODE}: loads an IO-processor plugin",
    "middleware": f"{_CODE}: imports an ASGI middleware class or function by name",
    "logits-processors": f"{_CODE}: imports logits-processor classes by qualified name",
    "worker-cls": f"{_CODE}: imports the worker class by qualified name",
    "worker-extension-cls": f"{_CODE}: imports a worker extension class by qualified name",
    "distributed-executor-backend": f"{_CODE}: may name an executor class to import",
    "kv-transfer-config": f"{_CODE}: may name a KV connector module to import (kv_connector_module_path)",
    "kv-events-config": "publishes KV-cache events to an endpoint it names",
    "ec-transfer-config": f"{_CODE}: may name an encoder-cache connector module to import",
    "model-loader-extra-config": f"{_FILE}: passes paths and options to the weight loader",
    "speculative-config": f"{_FILE}: may name a draft model path (and trust its remote code)",
    "hf-overrides": f"{_CODE}: may override the model config (auto_map, architectures) the loader imports",
    "chat-template": f"{_FILE}: a template file path (or an inline template)",
    "tokenizer": f"{_FILE}: a tokenizer directory or repository other than the weights'",
    "hf-config-path": f"{_FILE}: a model config directory or repository other than the weights'",
    "generation-config": f"{_FILE}: a generation config directory",
    "allowed-local-media-path": f"{_FILE}: lets requests read media files under that directory",
    "allowed-media-domains": "lets requests make the box fetch media from those domains",
    "download-dir": "writes weights to a directory of its choosing on the box",
    "lora-modules": f"{_FILE}: loads LoRA adapters from paths or repositories",
    "enable-lora": "lets callers load LoRA adapters at run time (with VLLM_ALLOW_RUNTIME_LORA_UPDATING)",
    "ssl-keyfile": f"{_FILE}: a TLS key file",
    "ssl-certfile": f"{_FILE}: a TLS certificate file",
    "ssl-ca-certs": f"{_FILE}: a CA bundle file",
    "log-config-file": f"{_CODE}: a logging config whose handlers are classes it imports",
    "otlp-traces-endpoint": "sends every request's traces (prompts' metadata) to that endpoint",
    "collect-detailed-traces": "adds detailed timing to the traces sent to the OTLP endpoint",
    "enable-prompt-embeds": "accepts tensors from callers (deserialised by torch.load)",
    "enable-mm-embeds": "accepts multimodal embedding tensors from callers",
    "trust-request-chat-template": "renders chat templates that callers send",
    "model-class-overrides": f"{_CODE}: imports model classes by `module:class`",
    "scheduler-cls": f"{_CODE}: imports the scheduler class by qualified name",
    "ec-manager-config": f"{_CODE}: may name an encoder-cache manager class to import",
    "compilation-config": f"{_CODE}: may name inductor passes to import and directories to write",
    "logging-config": f"{_CODE}: may name a logging config file whose handlers are classes it imports",
    "profiler-config": "writes profiles to a directory of its choosing on the box",
    "weight-transfer-config": "lets a trainer replace the weights over the network",
    "default-mm-loras": f"{_FILE}: loads LoRA adapters from paths",
    "mm-encoder-fp8-scale-path": f"{_FILE}: a scales JSON file",
    "mm-encoder-fp8-scale-save-path": "writes a file of its choosing on the box",
    "hf-token": "puts a Hugging Face token on the command line (readable in /proc/*/cmdline)",
}

# vLLM's single-dash aliases of risky options (`-sc` is --speculative-config); its parser takes a prefix
# of one too (`-s`), and `-sc.model=x` sets a nested key.
SHORT_ALIASES: Mapping[str, str] = {"sc": "speculative-config", "cc": "compilation-config"}


# Full names of vLLM options that are not risky but are a prefix of one that is: the parser takes an exact
# name as itself, so `--model` is `--model`, not an abbreviation of `--model-loader-extra-config`
# (tests/realvllm/test_option_policy.py checks this list against the real parser).
NOT_ABBREVIATIONS = frozenset({"model", "reasoning-parser"})


def risky_option(token: str) -> str | None:
    """The risky option (without `--`) vLLM could read `token` as, or None. A prefix of more than one risky
    option is matched too (vLLM refuses it as ambiguous; refusing it here first costs nothing)."""
    if token.startswith("-") and not token.startswith("--"):
        short = token[1:].split("=", 1)[0].split(".", 1)[0]
        return next((long for alias, long in SHORT_ALIASES.items() if short and alias.startswith(short)), None)
    name = vllmflags.flag_key(token)
    if not name or name in NOT_ABBREVIATIONS:
        return None
    if name in RISKY_OPTIONS:
        return name
    return next((option for option in RISKY_OPTIONS if option.startswith(name)), None)


def risky_tokens(argv: Iterable[str]) -> Iterator[tuple[int, str, str]]:
    """(index, token, risky option) for every token of argv that sets a risky option."""
    for index, token in enumerate(argv):
        option = risky_option(token)
        if option is not None:
            yield index, token, option
