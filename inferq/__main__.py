from inferq.cli.main import main

raise SystemExit(main())
