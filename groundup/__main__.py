import sys

from groundup.cli import main

code = main()
if "groundup.train.distributed" in sys.modules:  # a process that trained in a process group leaves at once
    sys.modules["groundup.train.distributed"].exit_process(code)
raise SystemExit(code)
