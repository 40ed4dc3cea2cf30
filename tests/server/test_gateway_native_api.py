"""GET /vllm/gateway-native/<tag>: the gateway's compiled builds (server.gateway_native) as boxes fetch them.

One real mypyc build of this checkout per session (tests/support/native.py), served through the real Flask
app and, once, by a real `fleetllm serve` over HTTP; copies of it broken in each way a build can be are
refused at start-up with their reason, and never served."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from fleetllm.adapters.state.records import BoxApi
from fleetllm.errors import ConfigurationError
from fleetllm.server.app import create_app
from fleetllm.server.nativebuilds import load_gateway_builds
from fleetllm.server.runtime import Runtime
from fleetllm.settings import ControlPlaneConfig, default_gateway_native
from fleetllm_contract.gatewaynative import MAX_ARCHIVE_BYTES, MEDIA_TYPE, PATH_PREFIX, SHA256_HEADER
from fleetllm_gateway import native
from fleetllm_installer.zipapp import package_dir
from tests.server.conftest import ENV, FLEET_KEY, KNOWN_BOX, SECRETS, LogCapture, base_config, box_headers
from tests.support.native import SUFFIX, TAG, build_this_checkout, builds_directory
from tests.support.plane import ControlPlane

assert TAG is not None  # this suite runs on CPython on Linux, whose suffix has a tag
PATH = PATH_PREFIX + TAG


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's gateway compiled for this Python (tools/build_gateway_native.py DIR)."""
    return build_this_checkout(tmp_path_factory.mktemp("native"))


@pytest.fixture(scope="module")
def builds(build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A builds directory holding the build as <tag>/, with files of its own beside the build's: not served."""
    target = builds_directory(build, tmp_path_factory.mktemp("builds"))
    (target / TAG / "notes.txt").write_text("left here by an operator\n")
    (target / TAG / native.PACKAGE / "extra.py").write_text("print('not part of the build')\n")
    return target


def build_files(build: Path) -> dict[str, bytes]:
    """The files a build's manifest names, by their name in the archive."""
    manifest = json.loads((build / native.MANIFEST).read_text())
    names = [native.MANIFEST, f"{manifest['runtime']}{SUFFIX}",
             *(f"{native.PACKAGE}/{module}{SUFFIX}" for module in native.COMPILED)]
    return {name: (build / name).read_bytes() for name in names}


def fetch(client: FlaskClient, path: str = PATH, key: str | None = FLEET_KEY, **headers: str) -> Any:
    return client.get(path, headers=box_headers(key=key, **headers), environ_base={"REMOTE_ADDR": "192.0.2.50"})


@pytest.fixture
def served(make_runtime: Callable[..., Runtime], builds: Path, logs: LogCapture) -> Runtime:
    return make_runtime(server={"gateway_native": str(builds)})


def test_the_build_is_served_as_a_gzipped_tar_of_exactly_its_files(served: Runtime, build: Path,
                                                                    tmp_path: Path) -> None:
    response = fetch(create_app(served).test_client())
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.data
    digest = hashlib.sha256(body).hexdigest()
    assert response.headers["Content-Type"] == MEDIA_TYPE
    assert response.headers["ETag"] == f'"{digest}"'
    assert response.headers[SHA256_HEADER] == digest
    assert response.headers["Content-Disposition"] == f"attachment; filename=fleetllm-gateway-native-{TAG}.tar.gz"
    assert response.headers["Cache-Control"] == "no-store"
    assert len(body) <= MAX_ARCHIVE_BYTES
    assert body[:2] == b"\x1f\x8b" and body[4:8] == b"\0\0\0\0"  # gzip, with no time in its header

    files = build_files(build)
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
        entries = archive.getmembers()
        assert [e.name for e in entries] == sorted([native.PACKAGE, *files])  # not notes.txt, not extra.py
        for entry in entries:
            assert (entry.mtime, entry.uid, entry.gid, entry.uname, entry.gname) == (0, 0, 0, "", "")
            if entry.name == native.PACKAGE:
                assert entry.isdir() and entry.mode == 0o755
            else:
                assert entry.isfile() and entry.mode == 0o644
                extracted = archive.extractfile(entry)
                assert extracted is not None
                assert extracted.read() == files[entry.name], entry.name
        archive.extractall(tmp_path / "unpacked", filter="data")
    # What a box unpacks is a build its gateway uses: this Python, these sources.
    where = package_dir(native.PACKAGE)
    assert where is not None
    assert native.check(tmp_path / "unpacked", str(where))["suffix"] == SUFFIX


def test_every_load_of_a_build_gives_the_same_bytes(served: Runtime, builds: Path, tmp_path: Path) -> None:
    """Replicas serve the same archive and ETag: it depends on the build's contents, not on when or where
    its files were copied, their times or their modes."""
    first, again = load_gateway_builds(builds).get(TAG), load_gateway_builds(builds).get(TAG)
    assert first is not None and again is not None
    assert first.body == again.body and first.sha256 == again.sha256
    elsewhere = tmp_path / "replica"
    shutil.copytree(builds, elsewhere)
    for path in (elsewhere / TAG).rglob("*"):
        os.utime(path, (1_234_567_890, 1_234_567_890))
        if path.is_file():
            path.chmod(0o600)
    copied = load_gateway_builds(elsewhere).get(TAG)
    assert copied is not None
    assert copied.body == first.body
    served_build = served.gateway_builds.get(TAG)
    assert served_build is not None and served_build.sha256 == first.sha256


def test_a_box_that_holds_the_build_gets_304(served: Runtime) -> None:
    client = create_app(served).test_client()
    etag = fetch(client).headers["ETag"]
    for sent in (etag, f"W/{etag}", f'"other", {etag}'):
        cached = fetch(client, **{"If-None-Match": sent})
        assert cached.status_code == 304, sent
        assert cached.data == b""
        assert cached.headers["ETag"] == etag
        assert cached.headers[SHA256_HEADER] == etag.strip('"')
        assert cached.headers["Cache-Control"] == "no-store"
    assert fetch(client, **{"If-None-Match": '"another-build"'}).status_code == 200


def test_a_tag_without_a_build_is_a_404_that_says_what_the_box_does(served: Runtime) -> None:
    client = create_app(served).test_client()
    response = fetch(client, PATH_PREFIX + "cpython-399-x86_64-linux-gnu")
    assert response.status_code == 404
    message = response.get_json()["error"]
    assert message.startswith("this control plane has no compiled gateway for cpython-399-x86_64-linux-gnu")
    assert f"(it has {TAG})" in message
    assert "the box runs the gateway's Python modules" in message
    assert "tools/build_gateway_native.py" in message and "server.gateway_native" in message
    assert response.headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize("tag", ["CPython-311", "cpython--311", "cpython.311", "-cpython", "x" * 65, "a" * 5000])
def test_a_malformed_tag_is_a_404_that_quotes_it_capped(served: Runtime, tag: str) -> None:
    response = fetch(create_app(served).test_client(), PATH_PREFIX + tag)
    assert response.status_code == 404
    message = response.get_json()["error"]
    assert "is not a gateway build tag" in message
    assert "such as cpython-311-x86_64-linux-gnu): ask for that tag" in message
    assert tag[:64] in message
    assert len(message) < 400  # never the whole of what a client sent
    assert served.store.recent_fetches(limit=1)[0].status == 404


def test_the_fleet_key_guards_the_builds(served: Runtime, make_runtime: Callable[..., Runtime]) -> None:
    client = create_app(served).test_client()
    for key in (None, "wrong-key", FLEET_KEY[:-1]):
        refused = fetch(client, key=key)
        assert refused.status_code == 403, key
        assert refused.headers["Content-Type"] == "application/json"
        assert SHA256_HEADER not in refused.headers
    keyless = make_runtime(secrets={"fleet_key": None, "vllm_api_salt": "${env:SALT}"},
                           server={"gateway_native": str(served.config.gateway_native)})
    assert keyless.gateway_builds.tags == (TAG,)
    for key in (None, FLEET_KEY):
        assert fetch(create_app(keyless).test_client(), key=key).status_code == 503


def test_each_fetch_is_recorded_and_logged_without_a_secret(served: Runtime, logs: LogCapture) -> None:
    client = create_app(served).test_client()
    assert fetch(client).status_code == 200
    assert fetch(client, key="wrong-key").status_code == 403
    refused, answered = served.store.recent_fetches(limit=2)
    assert (answered.endpoint, answered.status, answered.box, answered.claimed_host, answered.peer) == \
        (BoxApi.GATEWAY_NATIVE, 200, KNOWN_BOX, KNOWN_BOX, "192.0.2.50")
    assert (refused.endpoint, refused.status, refused.box) == (BoxApi.GATEWAY_NATIVE, 403, None)
    lines = logs.events("box request")
    assert [(e["endpoint"], e["status"], e["box"]) for e in lines] == \
        [("gateway-native", 200, KNOWN_BOX), ("gateway-native", 403, None)]  # refused before the box is named
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'fleetllm_box_requests_total{endpoint="gateway-native",status="200"} 1.0' in metrics
    shown = logs.text + repr(served.store.recent_fetches()) + repr(served.gateway_builds.refused)
    for secret in SECRETS:
        assert secret not in shown


def variant(build: Path, target: Path, edit: Callable[[Path], None] | None = None) -> Path:
    shutil.copytree(build, target)
    if edit is not None:
        edit(target)
    return target


def edit_manifest(**changes: Any) -> Callable[[Path], None]:
    def edit(target: Path) -> None:
        manifest = json.loads((target / native.MANIFEST).read_text())
        for key, value in changes.items():
            if key == "app":
                manifest["modules"]["app"] = value
            else:
                manifest[key] = value
        (target / native.MANIFEST).write_text(json.dumps(manifest))

    return edit


def symlinked_module(target: Path) -> None:
    module = target / native.PACKAGE / f"client{SUFFIX}"
    real = target.parent.parent / f"client-elsewhere{SUFFIX}"  # outside the builds directory
    module.rename(real)
    module.symlink_to(real)


def oversized_runtime(target: Path) -> None:
    manifest = json.loads((target / native.MANIFEST).read_text())
    (target / f"{manifest['runtime']}{SUFFIX}").write_bytes(os.urandom(MAX_ARCHIVE_BYTES + 1024))


def test_builds_that_cannot_be_served_are_refused_with_their_reason(make_runtime: Callable[..., Runtime],
                                                                    build: Path, tmp_path: Path,
                                                                    logs: LogCapture) -> None:
    directory = tmp_path / "builds"
    kept = variant(build, directory / "a-served")
    cases = {  # directory -> what its reason says
        variant(build, directory / "b-same-tag"): f"a build for {TAG} too, and {kept} is served for it: remove one",
        variant(build, directory / "c-other-sources", edit_manifest(app="0" * 64)):
            "was built from another fleetllm_gateway/app.py than this one",
        variant(build, directory / "d-missing-module",
                lambda t: (t / native.PACKAGE / f"app{SUFFIX}").unlink()): f"app{SUFFIX}: missing: build it again",
        variant(build, directory / "e-symlinked-module", symlinked_module):
            f"client{SUFFIX}: a symbolic link: copy the file it points to into the build",
        variant(build, directory / "f-bad-manifest", lambda t: (t / native.MANIFEST).write_text("{not json")):
            "MANIFEST.json: not JSON",
        variant(build, directory / "g-no-tag", edit_manifest(suffix="/../../x.so")):
            "its suffix '/../../x.so' is not one a box asks for (.<tag>.so",
        variant(build, directory / "h-too-large", oversized_runtime):
            f"more than a box takes ({MAX_ARCHIVE_BYTES}): build it again",
    }
    (directory / "README").write_text("builds, one a directory\n")
    cases[directory / "README"] = "not a directory: each build is a subdirectory of"
    (directory / ".keep").write_text("")  # hidden: not a build, not a refusal

    runtime = make_runtime(server={"gateway_native": str(directory)})
    assert runtime.gateway_builds.tags == (TAG,)
    served_build = runtime.gateway_builds.get(TAG)
    assert served_build is not None and served_build.directory == kept
    assert served_build.body == load_gateway_builds(directory).builds[0].body
    reasons = {refused.directory: refused.reason for refused in runtime.gateway_builds.refused}
    assert set(reasons) == set(cases)
    for path, expected in cases.items():
        assert expected in reasons[path], reasons[path]
        assert str(path) in reasons[path]  # each names the build it is about
    started = logs.events("gateway native builds")[0]  # start_up's (the test loads the directory again below)
    assert (started["directory"], started["tags"], started["refused"]) == (str(directory), [TAG], len(cases))
    assert 0 < started["bytes"][TAG] <= MAX_ARCHIVE_BYTES
    warned = {e["directory"]: e for e in logs.events("gateway native build refused")[:len(cases)]}
    assert {path: e["reason"] for path, e in warned.items()} == {str(p): r for p, r in reasons.items()}
    assert {e["level"] for e in warned.values()} == {"warning"}
    response = fetch(create_app(runtime).test_client())
    assert response.status_code == 200
    assert response.headers[SHA256_HEADER] == served_build.sha256


def test_no_builds_directory_serves_none_and_says_so(make_runtime: Callable[..., Runtime], logs: LogCapture,
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    runtime = make_runtime()
    assert runtime.config.gateway_native is None
    assert runtime.gateway_builds.builds == () and runtime.gateway_builds.refused == ()
    (started,) = logs.events("gateway native builds")
    assert (started["directory"], started["tags"]) == (None, [])
    message = fetch(create_app(runtime).test_client()).get_json()["error"]
    assert f"no compiled gateway for {TAG} (it has none)" in message


def test_the_default_is_the_images_builds_when_there_are_some(make_config: Callable[..., ControlPlaneConfig],
                                                              make_runtime: Callable[..., Runtime], build: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    assert default_gateway_native() is None
    assert make_config().gateway_native is None
    image = builds_directory(build, tmp_path / "prefix" / "share" / "fleetllm" / "gateway-native")
    assert default_gateway_native() == image
    assert make_config().gateway_native == image
    assert make_config(server={"gateway_native": None}).gateway_native == image  # null as written
    runtime = make_runtime()
    assert runtime.gateway_builds.tags == (TAG,)
    assert fetch(create_app(runtime).test_client()).status_code == 200


def test_a_builds_directory_named_is_checked_when_the_config_is_read(make_config: Callable[..., ControlPlaneConfig],
                                                                     tmp_path: Path) -> None:
    (tmp_path / "relative-builds").mkdir()
    assert make_config(server={"gateway_native": "relative-builds"}).gateway_native == tmp_path / "relative-builds"
    (tmp_path / "a-file").write_text("")
    for given, shown in (("missing-builds", tmp_path / "missing-builds"), (str(tmp_path / "a-file"), tmp_path / "a-file")):
        with pytest.raises(ConfigurationError) as caught:
            make_config(server={"gateway_native": given})
        message = str(caught.value)
        assert "/server/gateway_native" in message and f"{shown}: not a directory" in message
        assert "tools/build_gateway_native.py" in message and "remove the key" in message


def test_a_real_control_plane_serves_the_build_over_http(fleet_git: Path, builds: Path, tmp_path: Path) -> None:
    document = base_config(fleet_git, tmp_path / "state.sqlite3")
    document["server"] = {"gateway_native": str(builds)}
    plane = ControlPlane(tmp_path / "plane", document, ENV)
    expected = load_gateway_builds(builds).get(TAG)  # as another replica loads it
    assert expected is not None
    try:
        plane.start()
        status, headers, body = plane.get(PATH, box_headers())
        assert status == 200, body[:500]
        assert hashlib.sha256(body).hexdigest() == headers[SHA256_HEADER] == expected.sha256
        assert body == expected.body
        assert headers["Content-Type"] == MEDIA_TYPE and headers["ETag"] == expected.etag
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(body))) as archive:
            assert native.MANIFEST in archive.getnames()
        assert plane.get(PATH, box_headers(**{"If-None-Match": expected.etag}))[0] == 304
        assert plane.get(PATH, box_headers(key="wrong-key"))[0] == 403
        assert plane.get(PATH_PREFIX + "cpython-399-x86_64-linux-gnu", box_headers())[0] == 404
    finally:
        stopped = plane.stop()
    assert stopped == 0
    started = plane.log_events("gateway native builds")  # serve's start-up check, then the serving start-up
    assert [(e["tags"], e["refused"], e["bytes"][TAG]) for e in started] == [([TAG], 0, len(body))] * 2
    assert [(e["endpoint"], e["status"]) for e in plane.log_events("box request")] == \
        [("gateway-native", 200), ("gateway-native", 304), ("gateway-native", 403), ("gateway-native", 404)]
    log = plane.log.read_text()
    for secret in SECRETS:
        assert secret not in log
