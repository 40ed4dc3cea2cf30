"""Every semantic rule's diagnostic, exactly: file, line, column, pointer, the whole message and the
severity, and the boundary of each numeric rule. tests/fleet/test_rules.py matches most messages only in
part; mutation testing (docs/testing.md) showed the rest of each message, the keys diagnostics point at
and the comparisons at the limits unpinned."""

from __future__ import annotations

import pytest

from fleetllm.core.fleet.diagnostics import Diagnostic, Severity
from fleetllm.core.fleet.model import Provider
from fleetllm.core.fleet.rules import box_name_problem
from tests.boxgateway.fleets import GATEWAY_PLACEMENT
from tests.fleet.helpers import FLEET, MODELS, PLACEMENT, validate

P, M, F = "placement.yaml", "models.yaml", "fleet.yaml"
WARNING = Severity.WARNING
LEGACY_8000 = FLEET + "legacy_servers:\n  - {host: 203.0.113.10, port: 8000}\n"


def diagnostics(**files: str) -> tuple[Diagnostic, ...]:
    return validate(**files).diagnostics


CASES: dict[str, tuple[dict[str, str], list[Diagnostic]]] = {
    "unknown-model": ({"placement": PLACEMENT + "    - [nope, 8003]\n"}, [
        Diagnostic(P, 5, 8, "/hosts/203.0.113.10/2/0", "unknown model 'nope': not in models.yaml", "unknown-model")]),
    "port-not-listen": ({"placement": PLACEMENT.replace("8002]", "8004]")}, [
        Diagnostic(P, 4, 12, "/hosts/203.0.113.10/1/1",
                   "port 8004 is not a listen port (8001, 8002, 8003) nor a declared legacy pair", "port-not-listen")]),
    "duplicate-port": ({"placement": PLACEMENT + "    - [m1, 8002, m1-b]\n"}, [
        Diagnostic(P, 5, 12, "/hosts/203.0.113.10/2/1", "port 8002 is already used on 203.0.113.10 by 'm2'",
                   "duplicate-port")]),
    "duplicate-name": ({"placement": PLACEMENT + "    - [m2, 8003]\n"}, [
        Diagnostic(P, 5, 8, "/hosts/203.0.113.10/2/0", "process name 'm2' is already used on 203.0.113.10 (row 2); "
                   "give one row a third element to tell them apart", "duplicate-name")]),
    "duplicate-name in a third element": ({"placement": PLACEMENT + "    - [m1, 8003, m2]\n"}, [
        Diagnostic(P, 5, 18, "/hosts/203.0.113.10/2/2", "process name 'm2' is already used on 203.0.113.10 (row 2); "
                   "give one row a third element to tell them apart", "duplicate-name")]),
    "unsafe-name": ({"placement": PLACEMENT + "    - [m1, 8003, 'bad name/x']\n"}, [
        Diagnostic(P, 5, 18, "/hosts/203.0.113.10/2/2", "process name 'bad name/x' is not usable as a file and "
                   "Supervisor program name: 1-64 of letters, digits, '_', '.', '-', starting with a letter or digit",
                   "unsafe-name")]),
    "public-port-deprecated": ({"placement": PLACEMENT.replace("[m2, 8002]", "[m2, 8002, null, 41234]")}, [
        Diagnostic(P, 4, 24, "/hosts/203.0.113.10/1/3", "a hand-written public port is deprecated: the provider's "
                   "listing maps listen ports to public ports; remove the 4th element", "public-port-deprecated",
                   WARNING)]),
    "too-many-servers": ({"fleet": FLEET + "max_servers_per_box: 2\n",
                          "placement": PLACEMENT + "    - [m1, 8003, m1-b]\n"}, [
        Diagnostic(P, 2, 3, "/hosts/203.0.113.10",
                   "box 203.0.113.10 has 3 servers; at most 2 are allowed (max_servers_per_box)", "too-many-servers")]),
    "box-name, Vast": ({"placement": "hosts:\n  k7v2m9x4q1w8e3:\n    provider: vast\n    servers:\n      - [m1, 8001]\n"}, [
        Diagnostic(P, 2, 3, "/hosts/k7v2m9x4q1w8e3", "a Vast box is named by its public IP address (PUBLIC_IPADDR)",
                   "box-name")]),
    "box-name, not a DNS name": ({"placement": "hosts:\n  aa: []\n  'Box_A':\n    - [m1, 8001]\n"}, [
        Diagnostic(P, 3, 3, "/hosts/Box_A", "'Box_A' is neither an IP address nor a provider id or DNS name "
                   "(lowercase letters, digits, '-' and '.')", "box-name")]),
    "vram-exceeds and disk-exceeds": ({"placement": "hosts:\n  203.0.113.10:\n    gpu_memory_gb: 24\n    disk_gb: 50\n"
                                                    "    servers:\n      - [m1, 8001]\n      - [m2, 8002]\n"}, [
        Diagnostic(P, 3, 5, "/hosts/203.0.113.10/gpu_memory_gb", "the servers' weights need 40 GB of GPU memory "
                   "(m1 10 + m2 30) but the box declares 24 GB", "vram-exceeds"),
        Diagnostic(P, 4, 5, "/hosts/203.0.113.10/disk_gb",
                   "the servers' weights need 60 GB of disk but the box declares 50 GB", "disk-exceeds")]),
    "gpu-memory-overcommit": ({"models": MODELS.replace("vram_gb: 30,", "vram_gb: 30, gpu_memory_utilization: 0.6,")
                               .replace("max_model_len: 4096,", "max_model_len: 4096, gpu_memory_utilization: 0.5,"),
                               "placement": "hosts:\n  aa: []\n" + PLACEMENT[len("hosts:\n"):]}, [
        Diagnostic(P, 3, 3, "/hosts/203.0.113.10",
                   "explicit gpu_memory_utilization values on 203.0.113.10 add up to 1.10 of one card",
                   "gpu-memory-overcommit")]),
    "max-model-len, KV cache": ({"models": MODELS.replace("max_model_len: 4096,",
                                                          "max_model_len: 1000000, kv_bytes_per_token: 100000,"),
                                 "placement": "hosts:\n  203.0.113.10:\n    gpu_memory_gb: 48\n    servers:\n"
                                              "      - [m1, 8001]\n"}, [
        Diagnostic(P, 3, 5, "/hosts/203.0.113.10/gpu_memory_gb", "m1: one 1000000-token sequence needs 93.1 GB of "
                   "KV cache but only 38 GB is left on 203.0.113.10 after all weights", "max-model-len")]),
    "max-model-len, context window": ({"models": MODELS.replace(
            "disk_gb: 20}\n", "disk_gb: 20}\n    litellm:\n      model_info: {context_window: 8192}\n")}, [
        Diagnostic(M, 5, 20, "/models/m1/litellm/model_info/context_window",
                   "context_window 8192 promises callers more than max_model_len 4096 serves", "max-model-len")]),
    "managed-flag in args": ({"models": MODELS.replace("{model: org/m2,", "{args: '--dtype half --port=1', model: org/m2,")}, [
        Diagnostic(M, 5, 18, "/models/m2/vllm/args", "args[2]: --port is a flag fleetllm manages: remove it; the port "
                   "is the placement row's second element", "managed-flag")]),
    "managed-flag, a settings key": ({"models": MODELS.replace(
            "{model: org/m2,", "{settings: {dtype: half, port: 9000}, model: org/m2,")}, [
        Diagnostic(M, 5, 36, "/models/m2/vllm/settings/port", "settings key 'port' renders --port: --port is a flag "
                   "fleetllm manages: remove it; the port is the placement row's second element", "managed-flag")]),
    "managed-flag, in a settings value": ({"models": MODELS.replace(
            "{model: org/m2,", "{settings: {ignore-patterns: [a, --port, '1']}, model: org/m2,")}, [
        Diagnostic(M, 5, 23, "/models/m2/vllm/settings/ignore-patterns", "settings key 'ignore-patterns' renders "
                   "--ignore-patterns (in its value '--port'): --port is a flag fleetllm manages: remove it; the port is "
                   "the placement row's second element", "managed-flag")]),
    "unsafe-arg": ({"models": MODELS.replace("{model: org/m2,", '{args: ["--dtype", "a\\nb"], model: org/m2,')}, [
        Diagnostic(M, 5, 11, "/models/m2/vllm", "argument 'a\\nb' holds a control character or line break; the box's "
                   "Supervisor program could not carry it", "unsafe-arg")]),
    "unsafe-arg, cut at 80 characters": ({"models": MODELS.replace(
            "{model: org/m2,", '{args: ["' + "a" * 79 + "\u00e9" + "b" * 20 + '"], model: org/m2,')}, [
        Diagnostic(M, 5, 11, "/models/m2/vllm", f"argument '{'a' * 79}\u00e9' holds a non-ASCII character; the box's "
                   "Supervisor program could not carry it", "unsafe-arg")]),
    "args-syntax": ({"models": MODELS.replace("{model: org/m2,", "{args: \"--x 'unclosed\", model: org/m2,")}, [
        Diagnostic(M, 5, 18, "/models/m2/vllm/args", "args cannot be split shell-style: No closing quotation; use a "
                   "list of strings", "args-syntax")]),
    "reserved-route-field": ({"models": MODELS + "    litellm:\n      params: {api_base: 'http://x', api_key: k}\n"
                                                 "      model_info: {id: fixed, fleetllm_owner: me, managed_by: x}\n"}, [
        Diagnostic(M, 7, 16, "/models/m2/litellm/params/api_base",
                   "api_base is set by fleetllm for each server; remove it", "reserved-route-field"),
        Diagnostic(M, 7, 38, "/models/m2/litellm/params/api_key",
                   "api_key is set by fleetllm for each server; remove it", "reserved-route-field"),
        Diagnostic(M, 8, 20, "/models/m2/litellm/model_info/id",
                   "model_info.id is set by fleetllm (ownership and provenance); remove it", "reserved-route-field"),
        Diagnostic(M, 8, 31, "/models/m2/litellm/model_info/fleetllm_owner",
                   "model_info.fleetllm_owner is set by fleetllm (ownership and provenance); remove it",
                   "reserved-route-field"),
        Diagnostic(M, 8, 51, "/models/m2/litellm/model_info/managed_by",
                   "model_info.managed_by is set by fleetllm (ownership and provenance); remove it",
                   "reserved-route-field")]),
    "empty-placement": ({"placement": "hosts: {}\n"}, [
        Diagnostic(P, 1, 1, "", "the placement has no box: every deployment would be removed. If that is intended, "
                   "set allow_empty_placement: true in fleet.yaml", "empty-placement")]),
    "legacy-unused": ({"fleet": FLEET + "legacy_servers:\n  - {host: 198.51.100.1, port: 8000}\n"}, [
        Diagnostic(F, 3, 3, "/legacy_servers", "legacy pair 198.51.100.1:8000 is declared but no placement row uses it",
                   "legacy-unused", WARNING)]),
    "gateway-not-listen": ({"placement": GATEWAY_PLACEMENT.replace("gateway: 8001", "gateway: 8080")}, [
        Diagnostic(P, 3, 5, "/hosts/203.0.113.10/gateway", "gateway port 8080 is not a listen port (8001, 8002, 8003)",
                   "gateway-not-listen")]),
    "gateway-no-servers": ({"placement": "hosts:\n  203.0.113.10:\n    servers: []\n    gateway: 8001\n"}, [
        Diagnostic(P, 4, 5, "/hosts/203.0.113.10/gateway", "box 203.0.113.10 has a gateway but no server for it to "
                   "route to; remove `gateway:` or place a server", "gateway-no-servers")]),
    "gateway-legacy": ({"fleet": LEGACY_8000, "placement": GATEWAY_PLACEMENT.replace("[m2, 9002]", "[m2, 8000]")}, [
        Diagnostic(P, 6, 14, "/hosts/203.0.113.10/servers/1/1", "203.0.113.10:8000 is a legacy pair (shared legacy "
                   "key, public port) and cannot sit behind the box gateway; move it to a box without `gateway:` or "
                   "retire the pair", "gateway-legacy")]),
    "gateway-port-reused": ({"placement": GATEWAY_PLACEMENT.replace("[m2, 9002]", "[m2, 8001]")}, [
        Diagnostic(P, 6, 14, "/hosts/203.0.113.10/servers/1/1", "port 8001 is the gateway's port on 203.0.113.10; give "
                   "the server another port (behind the gateway any free port from 1024 works)",
                   "gateway-port-reused")]),
    "gateway-backend-port, at the limit": ({"placement": GATEWAY_PLACEMENT.replace("[m1, 9001]", "[m1, 1023]")
                                            .replace("[m2, 9002]", "[m2, 1024]")}, [
        Diagnostic(P, 5, 14, "/hosts/203.0.113.10/servers/0/1", "port 1023 is below 1024: a server behind the gateway "
                   "listens on a loopback port, any free port from 1024 to 65535", "gateway-backend-port")]),
    "gateway-reserved-name": ({"placement": GATEWAY_PLACEMENT.replace("[m2, 9002]", "[m2, 9002, gateway]")}, [
        Diagnostic(P, 6, 20, "/hosts/203.0.113.10/servers/1/2", "process name 'gateway' is the box gateway's own (its "
                   "Supervisor program and log file); give the row another third element", "gateway-reserved-name")]),
    "gateway-reserved-name, a model called gateway": ({
        "models": MODELS + "  gateway:\n    vllm: {model: org/g}\n",
        "placement": GATEWAY_PLACEMENT.replace("[m2, 9002]", "[gateway, 9002]")}, [
        Diagnostic(P, 6, 10, "/hosts/203.0.113.10/servers/1/0", "process name 'gateway' is the box gateway's own (its "
                   "Supervisor program and log file); give the row another third element", "gateway-reserved-name")]),
    "gateway-duplicate-model, after an unknown model": ({
        "placement": GATEWAY_PLACEMENT.replace("[m1, 9001]", "[nope, 9001]") + "      - [m2, 9003, m2-b]\n"}, [
        Diagnostic(P, 5, 10, "/hosts/203.0.113.10/servers/0/0", "unknown model 'nope': not in models.yaml",
                   "unknown-model"),
        Diagnostic(P, 7, 10, "/hosts/203.0.113.10/servers/2/0", "served model name 'm2' is already behind the gateway "
                   "of 203.0.113.10 (server 'm2'); the gateway routes each name to one server, so place the second "
                   "one on another box", "gateway-duplicate-model")]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_rule_exactly(case: str) -> None:
    files, expected = CASES[case]
    assert list(diagnostics(**files)) == expected


def test_the_limits_themselves_are_allowed() -> None:
    """Weights filling the GPU and the disk exactly, fractions adding up to exactly one card, a context
    window equal to max_model_len, max_servers_per_box servers: all valid; one GB less is not."""
    models = """\
models:
  m1:
    vllm: {model: org/m1, vram_gb: 10, disk_gb: 20, gpu_memory_utilization: 0.5, max_model_len: 4096}
    litellm:
      model_info: {context_window: 4096}
  m2:
    vllm: {model: org/m2, vram_gb: 16, disk_gb: 40, gpu_memory_utilization: 0.5}
  m3:
    vllm: {model: org/m3}
"""
    placement = ("hosts:\n  203.0.113.10:\n    gpu_memory_gb: 26\n    disk_gb: 60\n    servers:\n"
                 "      - [m1, 8001]\n      - [m2, 8002]\n      - [m3, 8003]\n")
    result = validate(models=models, placement=placement, fleet=FLEET + "max_servers_per_box: 3\n")
    assert result.valid and result.diagnostics == (), [d.text() for d in result.diagnostics]
    over = placement.replace("gpu_memory_gb: 26", "gpu_memory_gb: 25").replace("disk_gb: 60", "disk_gb: 59")
    assert diagnostics(models=models, placement=over) == (
        Diagnostic(P, 3, 5, "/hosts/203.0.113.10/gpu_memory_gb", "the servers' weights need 26 GB of GPU memory "
                   "(m1 10 + m2 16) but the box declares 25 GB", "vram-exceeds"),
        Diagnostic(P, 4, 5, "/hosts/203.0.113.10/disk_gb",
                   "the servers' weights need 60 GB of disk but the box declares 59 GB", "disk-exceeds"))


def test_the_kv_cache_counts_the_memory_the_weights_leave() -> None:
    """10 GiB of KV cache for one sequence: a 20 GB card leaves exactly 10 after m1's weights (it fits),
    19.5 leaves 9.5 (it does not)."""
    models = MODELS.replace("max_model_len: 4096,", "max_model_len: 1048576, kv_bytes_per_token: 10240,")
    placement = "hosts:\n  203.0.113.10:\n    gpu_memory_gb: {}\n    servers:\n      - [m1, 8001]\n"
    assert diagnostics(models=models, placement=placement.format(20)) == ()
    assert diagnostics(models=models, placement=placement.format(19.5)) == (Diagnostic(
        P, 3, 5, "/hosts/203.0.113.10/gpu_memory_gb", "m1: one 1048576-token sequence needs 10.0 GB of KV cache but "
        "only 9.5 GB is left on 203.0.113.10 after all weights", "max-model-len"),)


def test_fractions_on_a_box_with_several_gpus_are_not_summed() -> None:
    models = MODELS.replace("vram_gb: 30,", "vram_gb: 30, gpu_memory_utilization: 0.9,").replace(
        "max_model_len: 4096,", "max_model_len: 4096, gpu_memory_utilization: 0.9,")
    placement = "hosts:\n  203.0.113.10:\n    gpus: {}\n    servers:\n      - [m1, 8001]\n      - [m2, 8002]\n"
    assert diagnostics(models=models, placement=placement.format(2)) == ()
    assert [d.rule for d in diagnostics(models=models, placement=placement.format(1))] == ["gpu-memory-overcommit"]


def test_a_gateway_box_lists_each_served_name_once() -> None:
    placement = GATEWAY_PLACEMENT + "      - [m1, 9003, m1-b]\n      - [m1, 9004, m1-c]\n"
    message = ("served model name 'm1' is already behind the gateway of 203.0.113.10 (server 'm1'); the gateway "
               "routes each name to one server, so place the second one on another box")
    found = diagnostics(placement=placement, fleet=FLEET + "max_servers_per_box: 4\n")
    assert [(d.line, d.message) for d in found] == [(7, message), (8, message)]


@pytest.mark.parametrize(("name", "problem"), [
    ("::ffff:203.0.113.9", "write the IPv4 address 203.0.113.9 instead of the mapped form ::ffff:203.0.113.9"),
    ("2001:DB8::1", "write the address in its canonical form 2001:db8::1"),
    ("999.1.1.1", "'999.1.1.1' looks like an IPv4 address but is not a valid one"),
    ("-lead", "'-lead' is neither an IP address nor a provider id or DNS name (lowercase letters, digits, '-' and '.')"),
])
def test_box_name_problems_exactly(name: str, problem: str) -> None:
    assert box_name_problem(name, None) == problem


def test_a_dns_name_may_be_253_characters() -> None:
    longest = ".".join(["a" * 63] * 3 + ["b" * 61])
    assert len(longest) == 253
    assert box_name_problem(longest, None) is None
    assert box_name_problem(longest, Provider.VAST) == "a Vast box is named by its public IP address (PUBLIC_IPADDR)"
    assert box_name_problem(longest + "b", None) == (
        f"{longest + 'b'!r} is neither an IP address nor a provider id or DNS name (lowercase letters, digits, '-' "
        "and '.')")
