"""The rent-box scenario's provider: the simulated RunPod (demo/runpod.py) served beside the demo, in the control
plane's config as `providers.runpod` (its URL and a generated API key), so the shipped reconcile pass rents from
it and terminates there what fleet.yaml's `capacity:` says (fleetllm.job.capacity).

Each pod it creates is a box rented: between two passes (`step`, from Demo.tick) the demo boots a simulated box
for it as RunPod would start the pod: with the pod's id (RUNPOD_POD_ID) and environment (the rental's LLMAO_HOST:
its label, the name it presents itself under), listening on a loopback address of its own (the pod's listing
maps each listen port there), booted by runpod.sh, which runs the installer and becomes supervisord (boxes.py).
Each pod it terminates is stopped. Nothing else: whether the box is approved, serves, retires and is terminated
is the control plane's and the reconciler's doing.
"""

from __future__ import annotations

import queue
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from fleetllm.demo import procs
from fleetllm.demo.boxes import INSTALL_TIMEOUT_S, Provisioned, SimulatedBox
from fleetllm.demo.fleet import DEFAULT_GPU_MEMORY_GB, DemoError, SimBox, Template, addresses
from fleetllm.demo.runpod import FakeRunPod, ProviderThread, runpod_gpu
from fleetllm.demo.stage import Stage

GPU = "NVIDIA H100 80GB HBM3"  # the simulated catalog's one GPU type (RunPod's id)
GPU_NAME = "H100 SXM"
PRICE = 2.69  # USD per hour, its secure-cloud list price
MAX_ADDRESSES = 64  # how far past the demo's boxes a rented box's loopback address is looked for
BOOT_JOIN_S = INSTALL_TIMEOUT_S + 60.0  # a boot ends within the installer's timeout


@dataclass
class Rented:
    """A pod the simulated RunPod created, and the simulated box that runs it."""

    pod: str
    label: str
    name: str  # what the box presents itself as: its environment's LLMAO_HOST, else its pod id
    box: SimulatedBox
    boot: threading.Thread | None = None
    booted: Provisioned | None = None


class Rentals:
    """The simulated RunPod of one demo run and the boxes rented from it (the module's docstring)."""

    def __init__(self, first_address: str) -> None:
        self.first_address = first_address
        self.api_key = "rp-demo-" + secrets.token_urlsafe(24)
        self.fake = FakeRunPod(api_key=self.api_key, catalog=[runpod_gpu(GPU, GPU_NAME, PRICE)],
                               on_create=self._created, on_terminate=self._terminated)
        self.server = ProviderThread(self.fake.app())
        self.url = ""
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()  # (created|terminated, the pod)
        self.rented: dict[str, Rented] = {}  # by pod id
        self.terminated: list[str] = []  # pod ids, once their box is stopped

    def start(self) -> str:
        self.url = self.server.start()
        return self.url

    def stop(self) -> None:
        for rented in self.rented.values():
            if rented.boot is not None:
                rented.boot.join(BOOT_JOIN_S)
        self.server.stop()

    # -- on the provider's event loop: only noted, acted on between passes -------------------------------
    def _created(self, pod: dict[str, Any]) -> None:
        self.events.put(("created", pod))

    def _terminated(self, pod_id: str) -> None:
        self.events.put(("terminated", {"id": pod_id}))

    # -- between passes ------------------------------------------------------------------------------------
    def pods(self) -> list[dict[str, Any]]:
        """The pods the provider lists now (a copy)."""
        found: list[dict[str, Any]] = self.server.call(lambda: [dict(p) for p in self.fake.pods])
        return found

    def by_label(self, label: str) -> Rented | None:
        return next((r for r in self.rented.values() if r.label == label), None)

    def step(self, demo: Stage) -> None:
        """Boot a simulated box for each pod created since the last step, stop the box of each pod terminated,
        and say what a boot ended in."""
        while True:
            try:
                kind, pod = self.events.get_nowait()
            except queue.Empty:
                break
            if kind == "created":
                self._boot(demo, pod)
            else:
                self._stop(demo, str(pod["id"]))
        for rented in self.rented.values():
            if rented.boot is not None and not rented.boot.is_alive():
                rented.boot = None
                booted = rented.booted
                if booted is not None and booted.ok:
                    demo.say(f"rented box {rented.name} (pod {rented.pod}) booted: installer done")
                else:
                    demo.say(f"rented box {rented.name} (pod {rented.pod}) booted, its installer failed (not in "
                             "the placement, it waits on the attention list to be approved):\n"
                             + (booted.log if booted is not None else ""), "yellow")

    def _address(self, demo: Stage) -> str:
        taken = {box.sim.listen for box in demo.boxes.values()}
        assert demo.runner is not None
        assert demo.runner.fleet is not None
        ports = (8000, *demo.runner.fleet.settings.listen_ports)
        for address in addresses(self.first_address, MAX_ADDRESSES)[1:]:
            if address not in taken and all(procs.can_bind(address, p) for p in ports):
                return address
        raise DemoError(f"no free loopback address within {MAX_ADDRESSES} of {self.first_address} for a rented box")

    def _boot(self, demo: Stage, pod: dict[str, Any]) -> None:
        assert demo.workspace is not None
        assert demo.runner is not None
        assert demo.runner.fleet is not None
        fleet = demo.runner.fleet
        ident, label = str(pod["id"]), str(pod["name"])
        env = {str(k): str(v) for k, v in (pod.get("env") or {}).items()}
        name = env.get("LLMAO_HOST") or ident  # runpod.sh: LLMAO_HOST, else RUNPOD_POD_ID
        address = self._address(demo)
        sim = SimBox(name, f"pod {ident} of the simulated RunPod", Template.RUNPOD, 1, DEFAULT_GPU_MEMORY_GB,
                     address=address, provider_id=ident, env=tuple(sorted(env.items())))
        box = SimulatedBox(sim, demo.workspace.boxes / name, demo.workspace.sockets / f"{name}.sock",
                           demo.workspace.tag)
        demo.boxes[name] = box
        demo.owned.add(name)
        box.prepare(fleet)
        ports = {port: port for port in fleet.settings.listen_ports}
        self.server.call(lambda: self.fake.start_pod(ident, ports, address))
        rented = self.rented[ident] = Rented(ident, label, name, box)
        assert demo.control_plane is not None
        url, key = demo.control_plane.url, demo.workspace.secret("fleet-key")

        def boot() -> None:
            try:
                rented.booted = box.provision(url, key)
            except DemoError as exc:
                rented.booted = Provisioned(False, str(exc))

        rented.boot = threading.Thread(target=boot, name=f"boot-{ident}", daemon=True)
        rented.boot.start()
        demo.say(f"the simulated RunPod created pod {ident} ({label}): its box boots (runpod.sh) as {name} on "
                 f"{address}")

    def _stop(self, demo: Stage, pod: str) -> None:
        rented = self.rented.get(pod)
        if rented is not None and rented.boot is not None:
            rented.boot.join(BOOT_JOIN_S)
        box = demo.boxes.pop(rented.name, None) if rented is not None else None
        if box is not None:
            box.stop()
        self.terminated.append(pod)
        demo.say(f"the simulated RunPod terminated pod {pod}: its box is stopped")
