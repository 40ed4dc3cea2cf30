"""What a fleet change will do: a report between two valid fleets, classified by lifetime and by box,
and its text, Markdown (pull-request comment) and JSON renderings. Pure: no git, no salt, no network."""

from fleetllm.core.diff.compute import diff_fleets
from fleetllm.core.diff.jsonout import FORMAT_VERSION, render_json, report_json
from fleetllm.core.diff.markdown import DEFAULT_MAX_CHARS, render_markdown
from fleetllm.core.diff.report import Report
from fleetllm.core.diff.sections import Section
from fleetllm.core.diff.text import render_text

__all__ = ["DEFAULT_MAX_CHARS", "FORMAT_VERSION", "Report", "Section", "diff_fleets", "render_json",
           "render_markdown", "render_text", "report_json"]
