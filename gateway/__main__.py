"""`python -m gateway ARGS` = `llmfleet-gateway ARGS`."""

from gateway.cli import main

raise SystemExit(main())
