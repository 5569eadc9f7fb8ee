from planc.cli import main

raise SystemExit(main())
