from llmfleet.cli.main import main

raise SystemExit(main())
