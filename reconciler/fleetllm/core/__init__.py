"""The pure core: fleet model and validation, rendering, verdicts, plan, diff. No I/O."""
