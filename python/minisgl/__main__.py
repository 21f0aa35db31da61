"""``python -m minisgl --model PATH``: serve the model over HTTP; with ``--shell``, chat with it in
the terminal instead."""

import sys

from minisgl.server import launch_server, parse_args
from minisgl.shell import run_shell

args = parse_args(sys.argv[1:])
if args.shell:
    run_shell(args)
else:
    launch_server(args)
