"""`python3 -m llmfleet_installer [--dry-run] [--config-file FILE]`: run the box installer."""

from llmfleet_installer.main import main

raise SystemExit(main())
