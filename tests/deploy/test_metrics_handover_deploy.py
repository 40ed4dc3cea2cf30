"""The shipped batch deployments hand their pass metrics over (issue 18, alerts): the CronJob's config names
a Pushgateway, the systemd unit writes node_exporter's textfile into a directory its sandbox lets it write
and fleetllm.tmpfiles lets its user write."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetllm.job.configfile import load_config as reconcile_config
from tests.conftest import ROOT
from tests.state.test_deploy import cred_names, credentials_dir
from tests.support.integration import missing

KUBE = ROOT / "deploy" / "kubernetes"
SYSTEMD = ROOT / "deploy" / "systemd"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # Debian's prometheus-node-exporter default


def test_the_cronjobs_config_names_a_pushgateway(tmp_path: Path) -> None:
    configmap = yaml.safe_load((KUBE / "configmap.yaml").read_text())
    path = tmp_path / "control-plane.yaml"
    path.write_text(configmap["data"]["control-plane.yaml"])
    names = cred_names(path.read_text())
    config = reconcile_config(path, {"CREDENTIALS_DIRECTORY": str(credentials_dir(tmp_path, names))})
    assert config.pushgateway is not None
    assert config.pushgateway.where == "http://pushgateway.monitoring.svc.cluster.local:9091"
    assert config.pushgateway.instance == "fleetllm"  # stable: not the pod's name
    cronjob = yaml.safe_load((KUBE / "reconciler.yaml").read_text())
    args = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["reconcile", "--once"]  # the pushing mode (the loop serves /metrics instead)


def test_the_timer_unit_writes_the_textfile_where_its_sandbox_lets_it() -> None:
    unit = (SYSTEMD / "fleetllm-reconcile.service").read_text().replace("\\\n", " ")
    (metrics_file,) = re.findall(r"--metrics-file (\S+)", unit)
    assert metrics_file == f"{TEXTFILE_DIR}/fleetllm-reconcile.prom"  # node_exporter reads *.prom only
    assert re.search(r"^ProtectSystem=strict$", unit, re.MULTILINE)
    writable = [p.lstrip("-") for line in re.findall(r"^ReadWritePaths=(.+)$", unit, re.MULTILINE)
                for p in line.split()]
    assert TEXTFILE_DIR in writable  # write_to_textfile renames a temporary file in that directory
    tmpfiles = (SYSTEMD / "fleetllm.tmpfiles").read_text()
    assert re.search(rf"^a\+ {re.escape(TEXTFILE_DIR)} .* u:fleetllm:rwx$", tmpfiles, re.MULTILINE)


@pytest.mark.integration  # .ci/run's machine has systemd (systemd-analyze): this must run there
def test_the_tmpfiles_entry_grants_the_user_write_access(tmp_path: Path) -> None:
    """Applied by the real systemd-tmpfiles under a throwaway root (with `nobody` for the fleetllm user,
    which the host may not have, and the directory left to the user running the test, who may not be
    root), the directory gets a POSIX ACL entry: that user, rwx."""
    tool = shutil.which("systemd-tmpfiles")
    if tool is None:
        missing("systemd-tmpfiles is not installed (Debian's systemd package)")
    conf = tmp_path / "fleetllm.conf"
    entries = (SYSTEMD / "fleetllm.tmpfiles").read_text()
    assert "0755 root root" in entries
    conf.write_text(entries.replace("u:fleetllm:", "u:nobody:").replace("0755 root root", "0755 - -"))
    root = tmp_path / "root"
    root.mkdir()
    done = subprocess.run([tool, "--create", f"--root={root}", str(conf)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    acl = os.getxattr(root / TEXTFILE_DIR.lstrip("/"), "system.posix_acl_access")
    entries = [struct.unpack_from("<HHI", acl, 4 + 8 * i) for i in range((len(acl) - 4) // 8)]
    nobody = int(subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True, check=True).stdout)
    assert (0x02, 0o7, nobody) in entries  # ACL_USER, rwx, the user's uid
