"""`python3 -m installer [--dry-run] [--config-file FILE]`: run the box installer."""

from installer.main import main

raise SystemExit(main())
