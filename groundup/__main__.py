from groundup.cli import main

raise SystemExit(main())
