"""fleetllm's version, written here and nowhere else.

Everything else derives from it: the wheel's metadata (pyproject.toml reads this line through hatchling's
`[tool.hatch.version]`), `fleetllm.__version__`, the installer's and the gateway's (this module ships in
the box zipapp, standard library only), the image tag of deploy/kubernetes and docs, and the release
(.github/workflows/release.yml tags v<version> and moves v<major>). tests/test_version.py fails when a
file states another version. To release: change the line below, add its CHANGELOG section, push the tag.
"""

__version__ = "1.0.0"
