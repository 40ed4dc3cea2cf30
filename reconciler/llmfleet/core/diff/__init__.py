"""What a fleet change will do: a report between two valid fleets, classified by lifetime and by box,
and its text, Markdown (pull-request comment) and JSON renderings. Pure: no git, no salt, no network."""

from llmfleet.core.diff.compute import diff_fleets
from llmfleet.core.diff.jsonout import FORMAT_VERSION, render_json, report_json
from llmfleet.core.diff.markdown import DEFAULT_MAX_CHARS, render_markdown
from llmfleet.core.diff.report import Report
from llmfleet.core.diff.sections import Section
from llmfleet.core.diff.text import render_text

__all__ = ["DEFAULT_MAX_CHARS", "FORMAT_VERSION", "Report", "Section", "diff_fleets", "render_json",
           "render_markdown", "render_text", "report_json"]
