"""Counts and the one-line summary every rendering starts with."""

from __future__ import annotations

from fleetllm.core.diff.report import BoxStatus, DeploymentAction, Level, Lifetime, Report


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def counts(report: Report) -> dict[str, int]:
    found = {f"boxes_{s.value}": len(report.boxes_with(s)) for s in BoxStatus}
    found |= {f"servers_{a}": sum(1 for c in report.servers if c.action == a)
              for a in ("add", "remove", "move", "change")}
    found |= {f"deployments_{a.value}": len(report.deployments_with(a)) for a in DeploymentAction}
    found["bearers_changed"] = len(report.bearers)
    found |= {f"alerts_{level.value}": sum(1 for a in report.alerts if a.level is level) for level in Level}
    return found


def reconciler_settings_change(report: Report) -> bool:
    """A live change outside the deployments: reconciler knobs, a paused flag, a loading deadline."""
    fields = [*report.settings, *(f for b in report.boxes for f in b.details),
              *(f for r in report.recipes for f in r.fields if f.path[0] != "litellm")]
    return any(f.lifetime is Lifetime.LIVE for f in fields)


def deployment_counts(report: Report) -> str:
    parts = [f"{len(found)} to {action.value}" for action in DeploymentAction
             if (found := report.deployments_with(action))]
    return ", ".join(parts)


def summary_line(report: Report) -> str:
    if not report.changed:
        return "No changes: nothing to do."
    parts = []
    if restart := report.boxes_with(BoxStatus.RESTART):
        parts.append(f"{plural(len(restart), 'box', 'boxes')} must restart vLLM")
    if new := report.boxes_with(BoxStatus.NEW):
        parts.append(f"{plural(len(new), 'new box', 'new boxes')} to provision")
    if removed := report.boxes_with(BoxStatus.REMOVED):
        parts.append(f"{plural(len(removed), 'box', 'boxes')} removed")
    if report.deployments:
        parts.append(f"LiteLLM: {deployment_counts(report)}")
    if reconciler_settings_change(report):
        parts.append("reconciler settings change")
    if outages := [a for a in report.alerts if a.level is Level.OUTAGE]:
        verb = "loses its" if len(outages) == 1 else "lose their"
        parts.append(f"{plural(len(outages), 'model')} {verb} last server")
    if not parts:
        return "No effect on the running fleet: only the catalog, descriptions, notes or limits change."
    line = "; ".join(parts) + "."
    return line[0].upper() + line[1:]
